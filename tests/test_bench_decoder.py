"""The decoder bench (`bench/decoder.py`) runs and writes what it promises, on the tests' tiny GPT-2.

Wall-clock numbers are never asserted: only that they are there, positive, with the ratios
against transformers and the token comparison the bench reports.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # `bench` lives at the top of the repository, beside linnet/

from bench import decoder  # noqa: E402
from fixtures.gpt2 import save_gpt2  # noqa: E402

METHOD_KEYS = {"load_s", "prefill_ms", "generate_s", "decode_tokens_per_s", "error", "same_tokens", "decode_speedup",
               "prefill_ratio"}


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory, monkeypatch_module):
    base = tmp_path_factory.mktemp("bench-decoder")
    monkeypatch_module.setenv("LINNET_BENCH_CACHE", str(base / "cache"))
    save_gpt2(base / "hf")
    out = base / "decoder.json"
    assert decoder.main(["--weights", str(base / "hf"), "--quick", "--seq", "6", "--new-tokens", "5",
                         "--methods", "linnet-torch,linnet-onnx,linnet-jax", "--out", str(out)]) == 0
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_every_method_reports_its_numbers_and_ratios(quick_run):
    methods = quick_run["methods"]
    assert list(methods) == ["transformers-generate", "linnet-torch", "linnet-onnx", "linnet-jax"]
    for key, m in methods.items():
        assert m["error"] is None, (key, m["error"])
        assert set(m) == METHOD_KEYS, key
        for metric in ("load_s", "prefill_ms", "generate_s", "decode_tokens_per_s", "decode_speedup", "prefill_ratio"):
            assert isinstance(m[metric], float) and m[metric] > 0, (key, metric)
        assert m["same_tokens"] is True, key  # greedy, same files: the same continuation
    reference = methods["transformers-generate"]
    assert reference["decode_speedup"] == reference["prefill_ratio"] == 1.0


def test_the_workload_is_recorded(quick_run):
    workload = quick_run["workload"]
    assert (workload["batch"], workload["seq"], workload["new_tokens"], workload["rounds"]) == (1, 6, 5, 1)
    assert workload["synthetic"] is False and quick_run["reference"] == decoder.REFERENCE


def test_an_unknown_method_is_named(capsys):
    with pytest.raises(SystemExit):
        decoder.main(["--methods", "linnet-tpu"])
    assert "linnet-tpu" in capsys.readouterr().err
