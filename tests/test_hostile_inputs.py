"""Hostile run-time inputs, on every backend, with the real all-MiniLM-L6-v2.

Every input a user can hand a loaded model either gets a `LinnetError` that names the
argument (before any framework runs) or, where it is legal, the same result as the plain
int32 form: wrong rank, float/bool/complex/string tokens, negative ids, ids past Vocab,
type ids past TypeVocab, S = 0, S > MaxPositions, disagreeing shapes, non-contiguous and
big-endian arrays, any integer dtype, torch tensors (bf16 ones too), a large batch, and
attention masks holding values other than 0 and 1. The same requests go to a real Triton
server (python runtime), and the onnxruntime layout's config is checked to declare the
types and shapes that make Triton itself refuse what the graph cannot take.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from linnet import LinnetError, nest

MINILM = "all-minilm-l6-v2"
BACKENDS = ["torch", "jax", "stablehlo", "onnx"]
VOCAB, TYPE_VOCAB, MAX_POSITIONS = 30522, 2, 512


def _np(x) -> np.ndarray:
    return x.detach().numpy() if hasattr(x, "detach") else np.asarray(x)


def _tokens(b=2, s=6, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).integers(1000, VOCAB, size=(b, s)).astype(np.int32)


@pytest.fixture(scope="module", params=BACKENDS)
def model(request, minilm_checkpoint):
    return nest.load(MINILM, backend=request.param)


@pytest.fixture(scope="module")
def reference(model):
    tokens = _tokens()
    types = np.zeros_like(tokens)
    types[:, 3:] = 1
    return tokens, types, _np(model(tokens, types))


def _error(call, *args, **kwargs) -> LinnetError:
    with pytest.raises(LinnetError) as caught:
        call(*args, **kwargs)
    return caught.value


BAD = {
    # name: (tokens, token_types, attention_mask, code, words the message must hold)
    "rank 1": (lambda t: t[0], None, None, "E0701", ["`tokens`", "rank 2", "(6,)"]),
    "rank 3": (lambda t: t[..., None], None, None, "E0701", ["`tokens`", "rank 2"]),
    "scalar": (lambda t: 5, None, None, "E0701", ["`tokens`", "rank 2"]),
    "float tokens": (lambda t: t.astype(np.float32), None, None, "E0701", ["`tokens`", "integers", "float32"]),
    "float list": (lambda t: [[1.5, 2.0]], None, None, "E0701", ["`tokens`", "integers"]),
    "bool tokens": (lambda t: t > 5000, None, None, "E0701", ["`tokens`", "integers", "bool"]),
    "complex tokens": (lambda t: t.astype(np.complex64), None, None, "E0701", ["`tokens`", "integers"]),
    "string tokens": (lambda t: t.astype(str), None, None, "E0701", ["`tokens`", "integers"]),
    "bf16 torch tensor": (lambda t: torch.tensor(t, dtype=torch.bfloat16), None, None, "E0701", ["`tokens`"]),
    "ragged": (lambda t: [[1, 2], [3]], None, None, "E0701", ["`tokens`", "rectangular"]),
    "negative id": (lambda t: np.where(np.arange(6) == 4, -1, t), None, None, "E0701",
                    ["`tokens`", "-1", "[0, 30522)"]),
    "id = Vocab": (lambda t: np.where(np.arange(6) == 2, VOCAB, t), None, None, "E0701",
                   ["`tokens`", "30522", "[0, 30522)", "30522 rows"]),
    "id past int32": (lambda t: np.where(np.arange(6) == 2, 2 ** 40, t.astype(np.int64)), None, None, "E0701",
                      ["`tokens`", str(2 ** 40)]),
    "huge uint64 id": (lambda t: t.astype(np.uint64) + np.uint64(2 ** 63), None, None, "E0701", ["`tokens`"]),
    "type = TypeVocab": (lambda t: t, lambda t: np.full_like(t, TYPE_VOCAB), None, "E0701",
                         ["`token_types`", "holds 2", "[0, 2)"]),
    "negative type": (lambda t: t, lambda t: np.full_like(t, -3), None, "E0701", ["`token_types`", "-3"]),
    "S = 0": (lambda t: t[:, :0], None, None, "E0701", ["S = 0"]),
    "B = 0": (lambda t: t[:0], None, None, "E0701", ["B = 0"]),
    "S > MaxPositions": (lambda t: np.ones((1, MAX_POSITIONS + 1), np.int32), None, None, "E0702",
                         ["S <= 512", "S = 513"]),
    "types shorter": (lambda t: t, lambda t: np.zeros((2, 5), np.int32), None, "E0701",
                      ["`token_types`", "S = 5", "`tokens` has S = 6"]),
    "types other batch": (lambda t: t, lambda t: np.zeros((3, 6), np.int32), None, "E0701",
                          ["`token_types`", "B = 3", "`tokens` has B = 2"]),
    "mask shorter": (lambda t: t, None, lambda t: np.ones((2, 7), np.int32), "E0701",
                     ["`attention_mask`", "S = 7", "`tokens` has S = 6"]),
    "mask rank": (lambda t: t, None, lambda t: np.ones((2,), np.int32), "E0701", ["`attention_mask`", "rank 2"]),
    "float mask": (lambda t: t, None, lambda t: np.ones((2, 6), np.float64), "E0701",
                   ["`attention_mask`", "integers"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_inputs_are_named_errors(model, case):
    make_tokens, make_types, make_mask, code, words = BAD[case]
    tokens = _tokens()
    kwargs = {}
    if make_types is not None:
        kwargs["token_types"] = make_types(tokens)
    if make_mask is not None:
        kwargs["attention_mask"] = make_mask(tokens)
    err = _error(model, make_tokens(tokens), **kwargs)
    text = err.render()
    assert err.code == code, text
    for word in words:
        assert word in text, (word, text)


def test_bad_inputs_on_other_entries_and_arguments(model):
    tokens = _tokens()
    assert "`pool` is missing input `tokens`" in _error(model.pool).render()
    assert "no input `mask`" in _error(model.embed, tokens, mask=tokens).render()
    assert "given twice" in _error(model, tokens, tokens=tokens).render()
    assert "takes 3 inputs, got 4" in _error(model, tokens, tokens, tokens, tokens).render()
    assert _error(model.run, "nope", tokens).code == "E0703"


LEGAL = {
    # name: how the reference tokens and types are handed over, each must give the same result
    "int64": lambda t, y: (t.astype(np.int64), y.astype(np.int64)),
    "big-endian int64": lambda t, y: (t.astype(">i8"), y.astype(">i8")),
    "big-endian int32": lambda t, y: (t.astype(">i4"), y.astype(">i4")),
    "uint16": lambda t, y: (t.astype(np.uint16), y.astype(np.uint8)),
    "non-contiguous": lambda t, y: (np.repeat(t, 2, axis=1)[:, ::2], np.asfortranarray(y)),
    "transposed view": lambda t, y: (np.ascontiguousarray(t.T).T, y),
    "read-only": lambda t, y: (_readonly(t), _readonly(y)),
    "lists": lambda t, y: (t.tolist(), y.tolist()),
    "torch int64": lambda t, y: (torch.from_numpy(t.astype(np.int64)), torch.from_numpy(y)),
    "torch non-contiguous": lambda t, y: (torch.from_numpy(np.repeat(t, 2, axis=1))[:, ::2], torch.from_numpy(y)),
}


def _readonly(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a.setflags(write=False)
    return a


@pytest.mark.parametrize("case", list(LEGAL))
def test_legal_inputs_in_any_form_give_the_same_result(model, reference, case):
    tokens, types, expected = reference
    t, y = LEGAL[case](tokens, types)
    got = _np(model(t, y))
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


def test_mask_values_other_than_0_and_1_count_as_real_tokens(model):
    """Any nonzero mask value is a real token (in the attention mask, the positions and embed's
    mean alike), so no mask can move a position off the table: a mask of 1000s once indexed
    position 5999 of the 512-row table (an IndexError in torch, out-of-range gathers elsewhere)."""
    tokens = _tokens(2, 6)
    mask = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], np.int32)
    odd = np.where(mask == 1, np.array([[1000, -7, 2, 1, 0, 0], [3, 1, 1, 2 ** 31 - 1, -2 ** 31, 9]]), 0)
    odd = odd.astype(np.int32)
    want = _np(model(tokens, attention_mask=mask))
    np.testing.assert_array_equal(_np(model(tokens, attention_mask=odd))[mask == 1], want[mask == 1])
    np.testing.assert_array_equal(_np(model.pool(tokens, attention_mask=odd)),
                                  _np(model.pool(tokens, attention_mask=mask)))
    np.testing.assert_array_equal(_np(model.embed(tokens, attention_mask=odd)),
                                  _np(model.embed(tokens, attention_mask=mask)))


def test_a_large_batch_gives_each_row_its_own_result(model):
    tokens = np.random.default_rng(3).integers(0, VOCAB, size=(512, 3)).astype(np.int32)
    pooled = _np(model.pool(tokens))
    assert pooled.shape == (512, 384) and np.isfinite(pooled).all()
    for row in (0, 257, 511):
        np.testing.assert_allclose(pooled[row], _np(model.pool(tokens[row:row + 1]))[0], rtol=1e-5, atol=2e-6)


def test_ids_at_the_edges_of_the_tables_are_legal(model):
    tokens = np.array([[0, VOCAB - 1, 101, 102]], np.int32)
    types = np.array([[0, TYPE_VOCAB - 1, 0, 1]], np.int32)
    assert np.isfinite(_np(model(tokens, types))).all()
    assert _np(model(np.ones((1, MAX_POSITIONS), np.int64))).shape == (1, MAX_POSITIONS, 384)


# --------------------------------------------------------------------------- Triton


def test_onnxruntime_config_declares_what_the_graph_takes(tmp_path, minilm_checkpoint):
    """With runtime="onnxruntime" Triton checks requests against config.pbtxt alone before the
    validating step, so the configs must declare INT32 inputs of shape [-1] (after the batch
    dim) and nothing looser; only inputs with a Linnet default may be left out, and the ONNX
    Runtime models behind the validating step take every input."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from linnet.serving.triton import export_triton

    ctx, _ = nest.prepare(MINILM)
    folder = export_triton(ctx, tmp_path, runtime="onnxruntime", max_batch_size=8)
    config = text_format.Parse((folder / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert config.max_batch_size == 8
    declared = {i.name: (i.data_type, list(i.dims), i.optional) for i in config.input}
    assert declared == {name: (model_config_pb2.TYPE_INT32, [-1], name != "tokens")
                        for name in ("tokens", "token_types", "attention_mask")}
    assert {o.name: o.data_type for o in config.output} == {
        "hidden": model_config_pb2.TYPE_FP32, "pooled": model_config_pb2.TYPE_FP32,
        "embedding": model_config_pb2.TYPE_FP32, "hidden_states": model_config_pb2.TYPE_FP32}
    step = text_format.Parse((tmp_path / f"{MINILM}.hidden" / "config.pbtxt").read_text(),
                             model_config_pb2.ModelConfig())
    assert {i.name: i.optional for i in step.input} == {"tokens": False, "token_types": False,
                                                        "attention_mask": False}


TRITON_BAD = {
    # name: (inputs as {name: array}, Triton datatype override, words the error must hold)
    "rank 1": ({"tokens": np.ones((6,), np.int32)}, None, ["tokens"]),
    "rank 3": ({"tokens": np.ones((1, 6, 2), np.int32)}, None, ["tokens"]),
    "float tokens": ({"tokens": np.ones((1, 6), np.float32)}, None, ["tokens"]),
    "int64 tokens": ({"tokens": np.ones((1, 6), np.int64)}, None, ["tokens"]),
    "bool tokens": ({"tokens": np.ones((1, 6), bool)}, None, ["tokens"]),
    "negative id": ({"tokens": np.array([[101, -1, 102]], np.int32)}, None, ["tokens", "-1"]),
    "id = Vocab": ({"tokens": np.array([[101, VOCAB, 102]], np.int32)}, None, ["tokens", "30522"]),
    "type = TypeVocab": ({"tokens": np.ones((1, 3), np.int32), "token_types": np.full((1, 3), 2, np.int32)}, None,
                         ["token_types", "2"]),
    "S = 0": ({"tokens": np.ones((1, 0), np.int32)}, None, ["S = 0"]),
    "S > MaxPositions": ({"tokens": np.ones((1, 513), np.int32)}, None, ["S <= 512", "S = 513"]),
    "types shorter": ({"tokens": np.ones((1, 4), np.int32), "token_types": np.zeros((1, 3), np.int32)}, None,
                      ["token_types", "S = 3"]),
    "mask longer": ({"tokens": np.ones((1, 4), np.int32), "attention_mask": np.ones((1, 5), np.int32)}, None,
                    ["attention_mask"]),
    "batch past max": ({"tokens": np.ones((9, 4), np.int32)}, None, ["batch"]),
}


@pytest.fixture(scope="module", params=["onnxruntime", "python"])
def triton(request, minilm_checkpoint, tmp_path_factory):
    from linnet.testing.triton_load import ServedModel

    with ServedModel(MINILM, tmp_path_factory.mktemp("hostile-triton"), runtime=request.param) as served:
        yield served


@pytest.mark.parametrize("case", list(TRITON_BAD))
def test_triton_refuses_bad_requests_naming_the_input(triton, case):
    inputs, _, words = TRITON_BAD[case]
    error = triton.request_error(inputs)
    assert error is not None, f"{case}: the server accepted it"
    for word in words:
        assert word.lower() in error.lower(), (word, error)
    assert triton.healthy()


def test_triton_legal_forms_match_the_onnx_backend(triton):
    tokens = _tokens(3, 7, seed=5)
    want = triton.reference(tokens)
    got = triton.infer({"tokens": tokens})
    for name in ("hidden", "pooled", "embedding"):
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-5)
    # A non-contiguous array is serialized by the client in logical order.
    got = triton.infer({"tokens": np.repeat(tokens, 2, axis=1)[:, ::2]})
    np.testing.assert_allclose(got["pooled"], want["pooled"], rtol=0, atol=1e-5)
