"""The rest of transformers' BertModel forward signature, as entries of the BERT source's
`Model` and `PreTraining` roots: `position_ids` (`forward_positioned`), `inputs_embeds`
(`forward_embeds`), and `head_mask` (`forward_head_masked`).

A small random BertModel written by transformers' own `save_pretrained` is loaded through a
toy zoo entry over the zoo's BERT source (the helpers of test_heads.py) and by transformers
(eager attention; for `head_mask`, which transformers 5 dropped, its 4.x rule as a registered
attention function). Batches are
right-padded, and only real positions are compared: transformers numbers padding positions
on where the source counts real tokens, and ONNX Runtime runs packed (0 at padding). torch, ONNX Runtime, JAX and StableHLO,
f32 on CPU, within 1e-5.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fixtures.parity import max_diff
from linnet import nest
from test_heads import TINY_CONFIG, _right_padded, save_transformers_model, write_tiny_entry

BACKENDS = ["torch", "onnx", "jax", "stablehlo", "openvino"]
BOUND = 1e-5
LAYERS, HEADS, WIDTH = TINY_CONFIG["num_hidden_layers"], TINY_CONFIG["num_attention_heads"], TINY_CONFIG["hidden_size"]


def _np(x) -> np.ndarray:
    return x.detach().numpy() if hasattr(x, "detach") else np.asarray(x)


#: Root block -> the transformers class whose checkpoint it reads. `PreTraining` is the root
#: of bert-base-uncased and the other google-bert entries; its entries run its `bert` sub.
ROOTS = {"Model": "BertModel", "PreTraining": "BertForPreTraining"}


@pytest.fixture(scope="module", params=list(ROOTS))
def tiny_model(request, tmp_path_factory):
    import json

    root = request.param
    base = tmp_path_factory.mktemp(f"signature-{root.lower()}")
    entry = write_tiny_entry(base / "entry", root, "forward", name=f"tiny-{root.lower()}-signature")
    if root == "Model":  # BertModel's save_pretrained writes its keys without the heads' `bert.` prefix.
        bindings = json.loads((entry / "bindings.json").read_text())
        (entry / "bindings.json").write_text(json.dumps({k: v.removeprefix("bert.") for k, v in bindings.items()}))
    return entry, save_transformers_model(ROOTS[root], base / "hf", seed=41), root


@pytest.fixture(scope="module")
def reference(tiny_model):
    """The transformers BertModel the entries mirror (a BertForPreTraining's `bert`)."""
    import transformers

    model = getattr(transformers, ROOTS[tiny_model[2]]).from_pretrained(tiny_model[1], attn_implementation="eager")
    return (model.bert if tiny_model[2] == "PreTraining" else model).eval()


@pytest.fixture(scope="module", params=BACKENDS)
def model(request, tiny_model):
    entry, checkpoint, _ = tiny_model
    return nest.load(entry, backend=request.param, weights=checkpoint / "model.safetensors")


def _batch(seed: int = 6):
    return _right_padded([11, 6, 9], TINY_CONFIG["vocab_size"], seed)


def _transformers(reference, **inputs):
    with torch.no_grad():
        return reference(**{k: torch.from_numpy(np.asarray(v)) for k, v in inputs.items()})


def test_explicit_position_ids(model, reference):
    """Given positions, real positions agree (padding ones too on backends that compute
    them; ONNX Runtime runs packed, padding-free, and returns 0 there)."""
    tokens, types, mask = _batch()
    rng = np.random.default_rng(1)
    positions = rng.integers(0, TINY_CONFIG["max_position_embeddings"], size=tokens.shape)
    expected = _transformers(reference, input_ids=tokens, token_type_ids=types, attention_mask=mask,
                             position_ids=positions).last_hidden_state.numpy()
    ours = _np(model.forward_positioned(input_ids=tokens, token_type_ids=types, attention_mask=mask,
                                        position_ids=positions))
    real = mask.astype(bool)
    diff = max_diff(ours[real], expected[real])
    print(f"position_ids {model.backend}: {diff:.2e}")
    assert diff <= BOUND
    # they are used: the counted positions give other vectors
    counted = _np(model.forward(tokens, types, attention_mask=mask))
    assert max_diff(counted[real], ours[real]) > 1e-3


def test_inputs_embeds(model, reference):
    tokens, types, mask = _batch(seed=7)
    embeds = np.random.default_rng(2).standard_normal((*tokens.shape, WIDTH)).astype(np.float32)
    expected = _transformers(reference, inputs_embeds=embeds, token_type_ids=types,
                             attention_mask=mask).last_hidden_state.numpy()
    ours = _np(model.forward_embeds(embeds, token_type_ids=types, attention_mask=mask))
    real = mask.astype(bool)
    diff = max_diff(ours[real], expected[real])
    print(f"inputs_embeds {model.backend}: {diff:.2e}")
    assert diff <= BOUND
    # the word table's own rows as embeddings give `forward` of the ids
    table = reference.embeddings.word_embeddings.weight.detach().numpy()
    assert max_diff(_np(model.forward_embeds(table[tokens], types, attention_mask=mask)),
                    _np(model.forward(tokens, types, attention_mask=mask))) <= BOUND


#: The transformers 4.x head-mask rule, as a registered attention function: transformers 5
#: (installed here) dropped `head_mask` from BERT, so the reference is its eager attention
#: with 4.x's one extra step, the probabilities after dropout times the layer's mask row.
HEAD_MASKED = "linnet_test_head_masked"
_HEAD_ROWS: dict[int, np.ndarray] = {}


def _head_masked_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        weights = weights + attention_mask
    weights = torch.nn.functional.dropout(torch.softmax(weights, dim=-1), p=dropout, training=module.training)
    weights = weights * torch.from_numpy(_HEAD_ROWS[module.layer_idx])[None, :, None, None]
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


@pytest.fixture(scope="module")
def head_masked_reference(tiny_model, reference):
    from transformers import AttentionInterface, BertModel
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(HEAD_MASKED, _head_masked_attention)
    AttentionMaskInterface.register(HEAD_MASKED, ALL_MASK_ATTENTION_FUNCTIONS["eager"])  # the additive mask
    masked = BertModel.from_pretrained(tiny_model[1], attn_implementation=HEAD_MASKED).eval()

    def run(head_mask: np.ndarray, **inputs) -> np.ndarray:
        rows = np.broadcast_to(head_mask, (LAYERS, HEADS)).astype(np.float32)  # [Heads]: every layer
        _HEAD_ROWS.update({i: rows[i].copy() for i in range(LAYERS)})
        return _transformers(masked, **inputs).last_hidden_state.numpy()

    # The reference is transformers' own eager attention when nothing is masked.
    tokens, types, mask = _batch(seed=10)
    plain = _transformers(reference, input_ids=tokens, token_type_ids=types, attention_mask=mask)
    assert max_diff(run(np.ones(HEADS), input_ids=tokens, token_type_ids=types, attention_mask=mask),
                    plain.last_hidden_state.numpy()) <= 1e-6
    return run


def test_head_mask(model, head_masked_reference):
    """A [Layers, Heads] mask of zeros, ones and fractions; a [Heads] mask, which transformers
    applied to every layer, is the same as that row repeated."""
    tokens, types, mask = _batch(seed=8)
    inputs = dict(input_ids=tokens, token_type_ids=types, attention_mask=mask)
    real = mask.astype(bool)
    head_mask = np.random.default_rng(3).choice([0.0, 0.5, 1.0], size=(LAYERS, HEADS)).astype(np.float32)
    head_mask[0, 0], head_mask[1, 1] = 0.0, 1.0
    ours = _np(model.forward_head_masked(tokens, types, mask, head_mask))
    diff = max_diff(ours[real], head_masked_reference(head_mask, **inputs)[real])
    print(f"head_mask {model.backend}: {diff:.2e}")
    assert diff <= BOUND
    one_row = head_mask[0]
    repeated = _np(model.forward_head_masked(tokens, types, mask, np.broadcast_to(one_row, (LAYERS, HEADS)).copy()))
    assert max_diff(repeated[real], head_masked_reference(one_row, **inputs)[real]) <= BOUND
    unmasked = _np(model.forward(tokens, types, attention_mask=mask))
    ones = _np(model.forward_head_masked(tokens, types, mask, np.ones((LAYERS, HEADS), np.float32)))
    assert max_diff(ones[real], unmasked[real]) <= BOUND and max_diff(ours[real], unmasked[real]) > 1e-3


def test_forward_full_leaves_out_position_ids_and_head_mask(model, reference, head_masked_reference):
    """`forward_full`: `position_ids = positions(attention_mask)` and `head_mask = ones` as
    computed defaults (docs/language.md). Left out, it is `forward`; given, it is transformers
    with them; leaving one out equals passing its default's value."""
    from linnet.diagnostics import LinnetError

    tokens, types, mask = _batch(seed=12)
    real = mask.astype(bool)
    rng = np.random.default_rng(4)
    positions = rng.integers(0, TINY_CONFIG["max_position_embeddings"], size=tokens.shape)
    head_mask = rng.choice([0.0, 0.5, 1.0], size=(LAYERS, HEADS)).astype(np.float32)
    counted = np.maximum(np.cumsum(mask != 0, axis=1) - 1, 0)  # std.nn.masks::positions by hand
    ones = np.ones((LAYERS, HEADS), np.float32)
    inputs = dict(input_ids=tokens, token_type_ids=types, attention_mask=mask)
    both = _np(model.forward_full(tokens, types, mask, positions, head_mask))
    expected = head_masked_reference(head_mask, **inputs, position_ids=positions)
    assert max_diff(both[real], expected[real]) <= BOUND
    explicit = _np(model.forward_full(tokens, types, mask, counted, ones))
    plain = _transformers(reference, **inputs).last_hidden_state.numpy()
    assert max_diff(explicit[real], plain[real]) <= BOUND
    if model.backend == "stablehlo":  # the exported graph takes every input
        with pytest.raises(LinnetError, match="`position_ids` left out"):
            model.forward_full(tokens, types, mask)
        return
    left_out = _np(model.forward_full(tokens, types, attention_mask=mask))
    np.testing.assert_allclose(left_out, explicit, rtol=0, atol=1e-6)
    assert max_diff(left_out[real], _np(model.forward(tokens, types, attention_mask=mask))[real]) <= BOUND
    only_heads = _np(model.forward_full(tokens, types, mask, head_mask=head_mask))
    assert max_diff(only_heads[real], head_masked_reference(head_mask, **inputs)[real]) <= BOUND
    only_positions = _np(model.forward_full(tokens, types, mask, positions))
    assert max_diff(only_positions[real], _np(model.forward_positioned(tokens, types, mask, positions))[real]) <= BOUND
