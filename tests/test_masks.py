"""Padded batches: the typed attention mask, default inputs and the `embed` entry (torch).

A sequence must give the same vectors at its real positions whether it runs alone or
inside a padded batch, padded on the right or on the left; with the same mask (and, for
left padding, the same position ids) transformers must agree with us; `embed` must equal
sentence-transformers' encode of a padded batch.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from linnet import LinnetError, nest

LENGTHS = [5, 17, 1, 40]
SENTENCES = ["A man is playing a guitar.", "Stock markets fell sharply on Monday after the report.",
             "Hi!", "The quick brown fox jumps over the lazy dog near the old river bank at dawn."]


def _sequences(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.integers(1000, 30000, size=n), rng.integers(0, 2, size=n)) for n in lengths]


def _padded(seqs, side: str):
    """tokens, token_types, mask, and each sequence's slice of real positions."""
    width = max(len(t) for t, _ in seqs)
    tokens = np.zeros((len(seqs), width), np.int64)
    types = np.zeros_like(tokens)
    mask = np.zeros_like(tokens)
    where = []
    for row, (t, tt) in enumerate(seqs):
        cols = slice(0, len(t)) if side == "right" else slice(width - len(t), width)
        tokens[row, cols], types[row, cols], mask[row, cols] = t, tt, 1
        where.append(cols)
    return tokens, types, mask, where


def _np(x):
    return x.detach().numpy() if hasattr(x, "detach") else np.asarray(x)


BACKENDS = ["torch", "jax", "stablehlo", "onnx", "openvino"]


@pytest.fixture(scope="module")
def minilm(minilm_checkpoint):
    return nest.load("all-minilm-l6-v2", backend="torch")


@pytest.fixture(scope="module")
def bert(bert_base_checkpoint):
    # torch's own matmul, as transformers runs it: the 1e-6 pooled bound below is for that
    # (the per-machine kernels are held to 1e-5 in test_torch_backend.py).
    return nest.load("bert-base-uncased", backend="torch", kernels="default")


@pytest.fixture(scope="module", params=BACKENDS)
def minilm_any(request, minilm_checkpoint):
    return nest.load("all-minilm-l6-v2", backend=request.param)


@pytest.mark.parametrize("side", ["right", "left"])
def test_every_backend_pads_exactly(minilm_any, side):
    model = minilm_any
    seqs = _sequences(LENGTHS, seed=3)
    tokens, types, mask, where = _padded(seqs, side)
    hidden = _np(model(tokens, types, attention_mask=mask))
    pooled = _np(model.pool(tokens, types, attention_mask=mask))
    embedded = _np(model.embed(tokens, types, attention_mask=mask))
    worst = {"hidden": 0.0, "pooled": 0.0, "embed": 0.0}
    for row, ((t, tt), cols) in enumerate(zip(seqs, where)):
        alone = (t[None], tt[None])
        worst["hidden"] = max(worst["hidden"], np.abs(hidden[row, cols] - _np(model(*alone))[0]).max())
        if side == "right":  # the pooler reads position 0, which is padding on the left
            worst["pooled"] = max(worst["pooled"], np.abs(pooled[row] - _np(model.pool(*alone))[0]).max())
        worst["embed"] = max(worst["embed"], np.abs(embedded[row] - _np(model.embed(*alone))[0]).max())
    print(f"minilm {model.backend} {side}-padded vs alone: {worst}")
    assert max(worst.values()) <= 1e-5


@pytest.mark.parametrize("side", ["right", "left"])
def test_every_backend_matches_transformers_on_a_padded_batch(minilm_any, transformers_minilm, side):
    seqs = _sequences(LENGTHS, seed=5)
    tokens, types, mask, where = _padded(seqs, side)
    # transformers' BERT numbers positions 0..S-1 whatever the mask; ours count real tokens,
    # so give it the same position ids to compare like with like.
    positions = np.maximum(np.cumsum(mask, 1) - 1, 0)
    with torch.no_grad():
        ref = transformers_minilm(input_ids=torch.from_numpy(tokens), token_type_ids=torch.from_numpy(types),
                                  attention_mask=torch.from_numpy(mask),
                                  position_ids=torch.from_numpy(positions)).last_hidden_state.numpy()
    hidden = _np(minilm_any(tokens, types, attention_mask=mask))
    diff = max(np.abs(hidden[row, cols] - ref[row, cols]).max() for row, cols in enumerate(where))
    print(f"minilm {minilm_any.backend} {side}-padded vs transformers: {diff:.3g}")
    assert diff <= 1e-5


def test_every_backend_embeds_like_sentence_transformers(minilm_any, minilm_checkpoint):
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(minilm_checkpoint), device="cpu")
    expected = st.encode(SENTENCES, convert_to_numpy=True, batch_size=len(SENTENCES))
    batch = st.tokenizer(SENTENCES, padding=True, return_tensors="np")
    assert batch["attention_mask"].min() == 0, "the batch should hold padding"
    got = _np(minilm_any.embed(batch["input_ids"], batch["token_type_ids"], attention_mask=batch["attention_mask"]))
    diff = np.abs(got - expected).max()
    print(f"embed {minilm_any.backend} vs sentence-transformers (padded batch of {len(SENTENCES)}): {diff:.3g}")
    assert diff <= 1e-5


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("model_name", ["minilm", "bert"])
def test_padded_batch_equals_each_sequence_alone(model_name, side, request):
    model = request.getfixturevalue(model_name)
    seqs = _sequences(LENGTHS, seed=3)
    tokens, types, mask, where = _padded(seqs, side)
    hidden = _np(model(tokens, types, attention_mask=mask))
    pooled = _np(model.pool(tokens, types, attention_mask=mask))
    embedded = _np(model.embed(tokens, types, attention_mask=mask))
    worst = {"hidden": 0.0, "pooled": 0.0, "embed": 0.0}
    for row, ((t, tt), cols) in enumerate(zip(seqs, where)):
        alone = (t[None], tt[None])
        worst["hidden"] = max(worst["hidden"], np.abs(hidden[row, cols] - _np(model(*alone))[0]).max())
        if side == "right":  # the pooler reads position 0, which is padding on the left
            worst["pooled"] = max(worst["pooled"], np.abs(pooled[row] - _np(model.pool(*alone))[0]).max())
        worst["embed"] = max(worst["embed"], np.abs(embedded[row] - _np(model.embed(*alone))[0]).max())
    print(f"{model_name} {side}-padded vs alone: {worst}")
    assert worst["hidden"] <= 1e-5 and worst["pooled"] <= 1e-5 and worst["embed"] <= 1e-5


def test_bert_base_masked_matches_transformers(bert, transformers_bert_base):
    seqs = _sequences([9, 64, 30], seed=11)
    tokens, types, mask, where = _padded(seqs, "right")
    with torch.no_grad():
        out = transformers_bert_base(input_ids=torch.from_numpy(tokens), token_type_ids=torch.from_numpy(types),
                                     attention_mask=torch.from_numpy(mask))
    hidden = _np(bert(tokens, types, attention_mask=mask))
    pooled = _np(bert.pool(tokens, types, attention_mask=mask))
    diff = max(np.abs(hidden[row, cols] - out.last_hidden_state.numpy()[row, cols]).max()
               for row, cols in enumerate(where))
    pooled_diff = np.abs(pooled - out.pooler_output.numpy()).max()
    print(f"bert-base right-padded vs transformers: hidden {diff:.3g} pooled {pooled_diff:.3g}")
    assert diff <= 1e-5 and pooled_diff <= 1e-6


def test_left_out_inputs_default_to_zeros_and_ones(minilm):
    tokens = np.random.default_rng(0).integers(1000, 30000, size=(2, 9))
    full = _np(minilm(tokens, np.zeros_like(tokens), attention_mask=np.ones_like(tokens)))
    assert np.array_equal(_np(minilm(tokens)), full)
    assert np.array_equal(_np(minilm(tokens, token_types=None, attention_mask=None)), full)


@pytest.mark.parametrize("mask,needle", [
    (np.ones((2, 8), np.int64), "agree"),  # S mismatch with tokens' 9
    (np.ones((2, 9, 1), np.int64), "rank"),
    (np.ones((2, 9), np.float32) * 0.5, "integers"),
])
def test_bad_masks_are_input_errors(minilm, mask, needle):
    tokens = np.ones((2, 9), np.int64)
    with pytest.raises(LinnetError) as info:
        minilm(tokens, attention_mask=mask)
    assert needle in str(info.value) and "attention_mask" in str(info.value)
