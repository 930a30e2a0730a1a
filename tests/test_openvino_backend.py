"""The openvino backend: the onnx backend's graphs, compiled by OpenVINO for the CPU, compared
with ONNX Runtime on the same files, with transformers and with sentence-transformers.

f32 is held to the onnx backend's own bounds (1e-5 on the hidden state and on embeddings):
OpenVINO must run an f32 model in f32, and its CPU default on this project's machine (AVX512
with BF16) is bf16 arithmetic, ~1e-2 away; the hint is read back from each compiled model.
"""
from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

from fixtures.parity import random_inputs, reference
from linnet import LinnetError, nest

MINILM_SHAPES = [(1, 1), (2, 33), (3, 128), (1, 512)]


def _ov_type(name: str):
    import openvino as ov

    return {"f32": ov.Type.f32, "bf16": ov.Type.bf16, "f16": ov.Type.f16}[name]


def _cpu_has(capability: str) -> bool:
    import openvino as ov

    return capability in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


@pytest.fixture(scope="module")
def minilm_ov(minilm_checkpoint):
    return nest.load("all-minilm-l6-v2", backend="openvino")


@pytest.fixture(scope="module")
def minilm_ov_padded(minilm_checkpoint):
    return nest.load("all-minilm-l6-v2", backend="openvino", packing=False)


@pytest.fixture(scope="module")
def minilm_ort(minilm_checkpoint):
    return nest.load("all-minilm-l6-v2", backend="onnx", kernels="default")


@pytest.fixture(scope="module")
def minilm_ort_padded(minilm_checkpoint):
    return nest.load("all-minilm-l6-v2", backend="onnx", kernels="default", packing=False)


def _masked(batch: int, seq: int, seed: int):
    """Random ids and a right-padded mask whose rows hold 1..seq real tokens (row 0 all real)."""
    tokens, token_types = random_inputs(batch, seq, seed=seed)
    rng = np.random.default_rng(seed)
    lengths = [seq] + [int(rng.integers(1, seq + 1)) for _ in range(batch - 1)]
    mask = np.array([[1] * n + [0] * (seq - n) for n in lengths], dtype=np.int64)
    return tokens, token_types, mask, lengths


# ------------------------------------------------------------------------ f32 parity


@pytest.mark.parametrize("graph", ["packed", "padded"])
@pytest.mark.parametrize("batch,seq", MINILM_SHAPES)
def test_minilm_matches_onnx_runtime_and_transformers(request, transformers_minilm, graph, batch, seq):
    ov = request.getfixturevalue("minilm_ov" if graph == "packed" else "minilm_ov_padded")
    ort = request.getfixturevalue("minilm_ort" if graph == "packed" else "minilm_ort_padded")
    tokens, token_types = random_inputs(batch, seq, seed=11)
    hidden, pooled = ov(tokens, token_types), ov.pool(tokens, token_types)
    ref_hidden, ref_pooled = reference(transformers_minilm, tokens, token_types)
    to_ort = np.abs(hidden - ort(tokens, token_types)).max()
    to_hf, pooled_diff = np.abs(hidden - ref_hidden).max(), np.abs(pooled - ref_pooled).max()
    print(f"openvino minilm {graph} B={batch} S={seq}: vs ORT {to_ort:.3g}, vs transformers {to_hf:.3g}, "
          f"pooled {pooled_diff:.3g}")
    assert hidden.shape == (batch, seq, 384) and hidden.dtype == np.float32
    assert to_ort <= 1e-5 and to_hf <= 1e-5
    assert pooled_diff <= 1e-6


@pytest.mark.parametrize("graph", ["packed", "padded"])
def test_padded_batches_match_onnx_runtime_at_real_tokens(request, graph):
    ov = request.getfixturevalue("minilm_ov" if graph == "packed" else "minilm_ov_padded")
    ort = request.getfixturevalue("minilm_ort" if graph == "packed" else "minilm_ort_padded")
    for batch, seq, seed in ((4, 40, 1), (8, 97, 2), (2, 7, 3)):
        tokens, token_types, mask, lengths = _masked(batch, seq, seed)
        hidden = ov(tokens, token_types, attention_mask=mask)
        theirs = ort(tokens, token_types, attention_mask=mask)
        worst = max(np.abs(hidden[r, :n] - theirs[r, :n]).max() for r, n in enumerate(lengths))
        embedded = np.abs(ov.embed(tokens, token_types, attention_mask=mask)
                          - ort.embed(tokens, token_types, attention_mask=mask)).max()
        # Each row alone, unpadded: what the padded batch must equal at its real tokens.
        alone = max(np.abs(hidden[r, :n] - ov(tokens[r:r + 1, :n], token_types[r:r + 1, :n])[0]).max()
                    for r, n in enumerate(lengths))
        print(f"openvino {graph} B={batch} S={seq}: vs ORT {worst:.3g}, embed {embedded:.3g}, vs alone {alone:.3g}")
        assert worst <= 1e-5 and embedded <= 1e-5 and alone <= 1e-5
        if graph == "packed":  # padding-free: padded positions of a per-token output hold 0
            assert all(not hidden[r, n:].any() for r, n in enumerate(lengths))


def test_bert_base_matches_onnx_runtime_and_transformers(bert_base_checkpoint, transformers_bert_base):
    ov = nest.load("bert-base-uncased", backend="openvino")
    ort = nest.load("bert-base-uncased", backend="onnx", kernels="default")
    assert ov.info.generated == ort.info.generated  # one export serves both runtimes
    for batch, seq in ((1, 1), (2, 7), (2, 128)):
        tokens, token_types = random_inputs(batch, seq, seed=5)
        hidden, pooled = ov(tokens, token_types), ov.pool(tokens, token_types)
        ref_hidden, ref_pooled = reference(transformers_bert_base, tokens, token_types)
        to_ort, to_hf = np.abs(hidden - ort(tokens, token_types)).max(), np.abs(hidden - ref_hidden).max()
        pooled_diff = np.abs(pooled - ref_pooled).max()
        print(f"openvino bert-base B={batch} S={seq}: vs ORT {to_ort:.3g}, vs transformers {to_hf:.3g}, "
              f"pooled {pooled_diff:.3g}")
        assert hidden.shape == (batch, seq, 768)
        assert to_ort <= 1e-5 and to_hf <= 1e-5
        # The onnx backend's bound for bert-base's random 768-wide pooler (tests/test_onnx_backend.py).
        assert pooled_diff <= 3e-6


def test_encode_matches_sentence_transformers_and_onnx_runtime(minilm_ov, minilm_ort, minilm_checkpoint):
    from sentence_transformers import SentenceTransformer

    from test_encode import corpus

    texts = corpus()
    ours = minilm_ov.encode(texts, batch_size=32, progress=False)
    theirs = SentenceTransformer(str(minilm_checkpoint), device="cpu").encode(texts, batch_size=32,
                                                                              convert_to_numpy=True)
    ort = minilm_ort.encode(texts, batch_size=32, progress=False)
    print(f"openvino encode ({len(texts)} texts): vs sentence-transformers {np.abs(ours - theirs).max():.3g}, "
          f"vs ORT {np.abs(ours - ort).max():.3g}")
    assert ours.shape == theirs.shape == (len(texts), 384) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)
    np.testing.assert_allclose(ours, ort, atol=1e-5, rtol=0)


# ------------------------------------------------------------------------ the precision hint


def test_every_compiled_model_reads_back_f32(minilm_ov):
    import openvino as ov

    tokens, token_types = random_inputs(2, 9)
    minilm_ov.pool(tokens, token_types)
    minilm_ov.embed(tokens, token_types)
    assert {"forward", "pool", "embed"} <= set(minilm_ov.runtime.compiled)
    for entry, compiled in minilm_ov.runtime.compiled.items():
        assert compiled.get_property("INFERENCE_PRECISION_HINT") == ov.Type.f32, entry
        # One compiled model per entry serves every B and S: its token inputs stay [?, ?].
        tokens_port = next(p for p in compiled.inputs if p.get_any_name() == "tokens")
        assert tokens_port.get_partial_shape().is_dynamic and tokens_port.get_partial_shape().rank.get_length() == 2
    # What OpenVINO would have run without the hint, on this CPU (bf16 where it has AVX512_BF16).
    print(f"OpenVINO's own CPU default: {ov.Core().get_property('CPU', 'INFERENCE_PRECISION_HINT')}")


def test_a_bf16_hint_on_an_f32_model_runs_bf16_where_the_cpu_has_it(minilm_checkpoint, minilm_ort, minilm_ov):
    """On a CPU with bf16 arithmetic (OpenVINO's BF16 capability: AVX512_BF16 or AMX) the hint
    runs bf16 and the model says so. On one without (an AVX2 EPYC, say), this is the real case
    of the forced fallback below: the hint runs at f32, with a warning, as the f32 model does."""
    if not _cpu_has("BF16"):
        _assert_the_bf16_hint_runs_at_f32_and_says_so(minilm_ov, random_inputs(2, 64, seed=3))
        return
    bf16 = nest.load("all-minilm-l6-v2", backend="openvino", precision_hint="bf16")
    assert bf16.runtime.compiled["forward"].get_property("INFERENCE_PRECISION_HINT") == _ov_type("bf16")
    tokens, token_types = random_inputs(2, 64, seed=3)
    hidden, exact = bf16(tokens, token_types), minilm_ort(tokens, token_types)
    diff, scale = np.abs(hidden - exact).max(), np.abs(exact).max()
    print(f"openvino precision_hint=bf16 vs ORT f32: {diff:.3g} (max|hidden| {scale:.3g})")
    assert hidden.dtype == np.float32  # the model's dtype stays f32; its arithmetic is bf16
    # bf16 products: further than f32 could be (what the default hint guards against), within
    # the onnx backend's bf16 allowance of four unit roundoffs of max|hidden|.
    assert 1e-4 < diff <= 2 ** -8 * 4 * scale


def test_a_bf16_hint_without_the_instructions_falls_back_to_f32(monkeypatch, minilm_checkpoint, minilm_ov):
    """A CPU without bf16 arithmetic (forced here: its capabilities without BF16) runs the hint at
    f32 and says so, rather than failing or running something else."""
    from linnet.backends import openvino_runtime

    real = openvino_runtime.capabilities
    monkeypatch.setattr(openvino_runtime, "capabilities", lambda core: tuple(c for c in real(core) if c != "BF16"))
    _assert_the_bf16_hint_runs_at_f32_and_says_so(minilm_ov, random_inputs(2, 16, seed=5))


def _assert_the_bf16_hint_runs_at_f32_and_says_so(minilm_ov, inputs):
    """On a CPU without bf16 arithmetic: a warning, an f32 compilation, the f32 model's outputs."""
    with pytest.warns(UserWarning, match="no bf16 arithmetic on this CPU.*running at f32"):
        model = nest.load("all-minilm-l6-v2", backend="openvino", precision_hint="bf16")
    assert model.runtime.precision == "f32"
    assert model.runtime.compiled["forward"].get_property("INFERENCE_PRECISION_HINT") == _ov_type("f32")
    np.testing.assert_array_equal(model(*inputs), minilm_ov(*inputs))


def test_a_compiled_model_at_another_precision_is_refused(monkeypatch, minilm_checkpoint):
    # The config without the hint: OpenVINO's own default, bf16 on a CPU with AVX512_BF16/AMX.
    from linnet.backends import openvino_runtime

    monkeypatch.setattr(openvino_runtime, "compile_config",
                        lambda precision, threads, streams: {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": streams})
    if not _cpu_has("BF16"):  # the default is f32 here, so the f32 model runs as asked
        assert nest.load("all-minilm-l6-v2", backend="openvino").runtime.precision == "f32"
        return
    with pytest.raises(LinnetError) as caught:
        nest.load("all-minilm-l6-v2", backend="openvino")
    assert caught.value.code == "E0834"
    assert "compiled model.forward.onnx to run at bf16, not at the f32 asked for" in str(caught.value)


@pytest.mark.parametrize("dtype, roundoff", [("bf16", 2 ** -8), ("f16", 2 ** -11)])
def test_low_precision_models_run_close_to_f32(minilm_checkpoint, minilm_ort, dtype, roundoff):
    import ml_dtypes

    model = nest.load("all-minilm-l6-v2", backend="openvino", dtype=dtype)
    tokens, token_types = random_inputs(2, 64, seed=3)
    hidden, exact = model(tokens, token_types), minilm_ort(tokens, token_types)
    diff, scale = np.abs(hidden.astype(np.float32) - exact).max(), np.abs(exact).max()
    print(f"openvino {dtype} model (hint {model.runtime.precision}) vs ORT f32: {diff:.3g} (max|hidden| {scale:.3g})")
    assert hidden.dtype == {"bf16": ml_dtypes.bfloat16, "f16": np.float16}[dtype]
    expected = dtype if _cpu_has({"bf16": "BF16", "f16": "FP16"}[dtype]) else "f32"
    assert model.runtime.precision == expected
    assert model.runtime.compiled["forward"].get_property("INFERENCE_PRECISION_HINT") == _ov_type(expected)
    assert diff <= roundoff * 4 * scale


# ------------------------------------------------------------------------ options and errors


def test_missing_openvino_names_the_extra_to_install(monkeypatch, minilm_checkpoint):
    # `import openvino` fails as it does where the package is not installed.
    monkeypatch.setitem(sys.modules, "openvino", None)
    monkeypatch.delitem(sys.modules, "linnet.backends.openvino_runtime", raising=False)
    with pytest.raises(LinnetError) as caught:
        nest.load("all-minilm-l6-v2", backend="openvino")
    assert caught.value.code == "E0808"
    assert "backend 'openvino' needs the Python package `openvino`" in str(caught.value)
    assert "pip install 'linnet[openvino]'" in str(caught.value)


@pytest.mark.parametrize("options, code, phrase", [
    ({"providers": ["CPUExecutionProvider"]}, "E0807",
     "backend 'openvino' has no option providers; it takes precision_hint, num_streams, threads"),
    ({"kernels": "auto"}, "E0807", "has no option kernels"),
    ({"precision_hint": "int8"}, "E0807", "precision_hint must be one of f32, bf16, f16 for the openvino backend"),
    ({"num_streams": "2"}, "E0809", "num_streams must be a int, found '2' (str)"),
    ({"threads": True}, "E0809", "threads must be a int, found True (bool)"),
    ({"num_streams": 0}, "E0807", "num_streams must be a whole number >= 1"),
    ({"device": "cuda"}, "E0801", "runs on the CPU only"),
])
def test_bad_options_are_refused(minilm_checkpoint, options, code, phrase):
    with pytest.raises(LinnetError) as caught:
        nest.load("all-minilm-l6-v2", backend="openvino", **options)
    assert caught.value.code == code and phrase in str(caught.value), str(caught.value)


def test_streams_and_threads_reach_the_compiled_model_and_threads_share_it(minilm_checkpoint, minilm_ort):
    model = nest.load("all-minilm-l6-v2", backend="openvino", num_streams=2, threads=2)
    compiled = model.runtime.compiled["forward"]
    assert compiled.get_property("NUM_STREAMS") == 2 and compiled.get_property("INFERENCE_NUM_THREADS") == 2
    inputs = [random_inputs(2, 20 + i, seed=i) for i in range(4)]
    results: dict[int, np.ndarray] = {}

    def call(i: int) -> None:
        for _ in range(3):
            results[i] = model(*inputs[i])

    workers = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    for i, (tokens, token_types) in enumerate(inputs):
        assert np.abs(results[i] - minilm_ort(tokens, token_types)).max() <= 1e-5, i


def test_linnet_build_backend_openvino_writes_a_model_openvino_compiles(minilm_checkpoint, minilm_ort, tmp_path):
    import openvino as ov

    from linnet.cli import main

    assert main(["build", "all-minilm-l6-v2", "--backend", "openvino", "-o", str(tmp_path)]) == 0
    assert (tmp_path / "model.onnx").is_file()
    core = ov.Core()
    compiled = core.compile_model(core.read_model(str(tmp_path / "model.onnx")), "CPU",
                                  {"INFERENCE_PRECISION_HINT": "f32"})
    tokens, token_types = random_inputs(2, 21, seed=9)
    feeds = {"tokens": tokens.astype(np.int32), "token_types": token_types.astype(np.int32),
             "attention_mask": np.ones_like(tokens, dtype=np.int32)}
    hidden = compiled(feeds)[compiled.output("hidden")]
    # `linnet build` writes the unoptimised program (the checkpoint's own params), so this
    # compares two different graphs of one model: ORT's packed one and this file in OpenVINO.
    assert np.abs(hidden - minilm_ort(tokens, token_types)).max() <= 1e-5
