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


def test_only_the_methods_that_run_on_torch_import_it_for_their_peak_rss():
    """`--rss` charges a method for what its own process loads: torch's libraries only where
    it computes with torch (transformers, Linnet's torch backend), not on ONNX or JAX."""
    assert decoder.runs_on_torch(decoder.REFERENCE)
    assert decoder.runs_on_torch("linnet-torch-auto-structural") and decoder.runs_on_torch("linnet-torch")
    assert not any(decoder.runs_on_torch(k) for k in ("linnet-onnx", "linnet-onnx-shared-weights", "linnet-jax"))


def test_an_unknown_method_is_named(capsys):
    with pytest.raises(SystemExit):
        decoder.main(["--methods", "linnet-tpu"])
    assert "linnet-tpu" in capsys.readouterr().err


def test_the_reference_generates_every_token_though_its_end_of_text_id_comes(tmp_path):
    """transformers' generate fills a None eos_token_id from the model's generation_config, so
    the bench must clear that one too: here the end-of-text id is the first token greedy
    decoding picks, and the reference still returns all the new tokens, as Linnet's does."""
    import numpy as np

    save_gpt2(tmp_path)
    tokens = decoder.prompt(6, 64, seed=1)
    first = int(decoder.Transformers(tmp_path).generate(tokens, 1)[0, -1])
    for name in ("config.json", "generation_config.json"):
        config = json.loads((tmp_path / name).read_text())
        config["eos_token_id"] = first
        (tmp_path / name).write_text(json.dumps(config))
    reference = decoder.Transformers(tmp_path)
    assert reference.model.config.eos_token_id == first
    out = reference.generate(tokens, 5)
    assert out.shape == (1, 11) and out[0, 6] == first
    assert np.array_equal(out[:, :6], tokens)


def test_a_qwen2_folder_runs_as_its_own_entry_with_the_same_tokens(tmp_path, monkeypatch):
    """`--model qwen2`'s path on a tiny Qwen2 (biased q/k/v) written by transformers: the folder
    is loaded through the hf: family, and greedy tokens equal transformers' on torch."""
    import transformers

    from fixtures.hf_families import jitter

    monkeypatch.setenv("LINNET_BENCH_CACHE", str(tmp_path / "cache"))
    sizes = dict(decoder.QWEN2_CONFIG, vocab_size=101, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    config = transformers.Qwen2Config(**sizes)
    config.architectures = ["Qwen2ForCausalLM"]
    jitter(transformers.Qwen2ForCausalLM(config), 0, scale=0.2).save_pretrained(tmp_path / "hf")
    assert decoder.linnet_entry(tmp_path / "hf") == tmp_path / "hf"
    out = tmp_path / "decoder.json"
    assert decoder.main(["--weights", str(tmp_path / "hf"), "--quick", "--seq", "6", "--new-tokens", "5",
                         "--methods", "linnet-torch,linnet-torch-auto-structural,linnet-torch-auto-packed-steps",
                         "--out", str(out)]) == 0
    methods = json.loads(out.read_text())["methods"]
    for key in ("linnet-torch", "linnet-torch-auto-structural", "linnet-torch-auto-packed-steps"):
        assert methods[key]["error"] is None and methods[key]["same_tokens"] is True, (key, methods[key])


def test_llama_cpp_names_what_it_needs_rather_than_failing_later(tmp_path, monkeypatch):
    """The `llama-cpp` method runs SmolLM2's GGUF file only, and says so for another checkpoint;
    without llama-cpp-python it names the package (here made unimportable)."""
    import types

    save_gpt2(tmp_path)
    monkeypatch.setitem(sys.modules, "llama_cpp", types.SimpleNamespace(Llama=object))
    with pytest.raises(RuntimeError, match="runs SmolLM2's GGUF file only"):
        decoder.LlamaCpp(tmp_path)
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    with pytest.raises(RuntimeError, match=r"needs the llama-cpp-python package \(pip install llama-cpp-python\)"):
        decoder.LlamaCpp(tmp_path)
