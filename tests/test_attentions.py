"""transformers' `output_attentions` as the `attentions` entry of the BERT source's `Model`
and `PreTraining` roots: `[B, Layers, Heads, S, S]` probabilities, softmax over the keys
after the padding mask and before dropout.

Small random checkpoints written by transformers' own `save_pretrained` (a BertModel, and a
BertForPreTraining whose entries run its `bert`) are loaded through toy zoo entries over the
zoo's BERT source and by transformers with eager attention; transformers' `attentions`
tuple, stacked on dim 1, is the reference. Batches are right-padded. Rows of padded queries
are left out of the comparison: transformers numbers padding positions on where the source
counts real tokens, so the padding tokens' own hidden states (and so their queries) differ;
every key of a real query row is compared. One entry runs with 4 heads (Dh = 8: the scale
1 / sqrt(8) stays a multiply), the other with 2 (Dh = 16: the optimiser folds 0.25 into the
query rows, for `forward` and for these probabilities alike). torch, ONNX Runtime, JAX and
StableHLO, f32 on CPU, within 1e-5.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fixtures.parity import max_diff
from linnet import nest
from linnet.backends import RECORDS
from test_heads import TINY_CONFIG, _right_padded, write_tiny_entry

BACKENDS = ["torch", "onnx", "jax", "stablehlo", "openvino"]
BOUND = 1e-5
LAYERS = TINY_CONFIG["num_hidden_layers"]

#: (root block, the transformers class whose checkpoint it reads, attention heads).
CASES = {"Model": ("BertModel", 4), "PreTraining": ("BertForPreTraining", 2)}


def _np(x) -> np.ndarray:
    return x.detach().numpy() if hasattr(x, "detach") else np.asarray(x)


def _save_checkpoint(cls_name: str, heads: int, folder, seed: int):
    """test_heads' random checkpoint, with `heads` attention heads."""
    import transformers

    torch.manual_seed(seed)
    config = transformers.BertConfig(**{**TINY_CONFIG, "num_attention_heads": heads})
    model = getattr(transformers, cls_name)(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(torch.randn_like(param) * 0.3 + (1.0 if "LayerNorm.weight" in name else 0.0))
    model.save_pretrained(folder, safe_serialization=True)
    return folder


@pytest.fixture(scope="module", params=list(CASES))
def tiny_model(request, tmp_path_factory):
    root = request.param
    cls_name, heads = CASES[root]
    base = tmp_path_factory.mktemp(f"attentions-{root.lower()}")
    entry = write_tiny_entry(base / "entry", root, "forward", name=f"tiny-{root.lower()}-attentions")
    toml = (entry / "nest.toml").read_text()
    assert "Heads = 4\n" in toml
    (entry / "nest.toml").write_text(toml.replace("Heads = 4\n", f"Heads = {heads}\n"))
    if root == "Model":  # BertModel's save_pretrained writes its keys without the heads' `bert.` prefix.
        bindings = json.loads((entry / "bindings.json").read_text())
        (entry / "bindings.json").write_text(json.dumps({k: v.removeprefix("bert.") for k, v in bindings.items()}))
    return entry, _save_checkpoint(cls_name, heads, base / "hf", seed=43), root, heads


@pytest.fixture(scope="module")
def reference(tiny_model):
    import transformers

    _, checkpoint, root, _ = tiny_model
    model = getattr(transformers, CASES[root][0]).from_pretrained(checkpoint, attn_implementation="eager")
    return model.eval()


@pytest.fixture(scope="module", params=BACKENDS)
def model(request, tiny_model):
    return nest.load(tiny_model[0], backend=request.param, weights=tiny_model[1] / "model.safetensors")


def _batch(seed: int = 5):
    return _right_padded([10, 4, 7], TINY_CONFIG["vocab_size"], seed)


def _transformers_attentions(reference, tokens, types, mask) -> np.ndarray:
    with torch.no_grad():
        out = reference(input_ids=torch.from_numpy(tokens), token_type_ids=torch.from_numpy(types),
                        attention_mask=torch.from_numpy(mask), output_attentions=True)
    return torch.stack(out.attentions, dim=1).numpy()


def test_attentions_match_transformers(model, reference, tiny_model):
    tokens, types, mask = _batch()
    expected = _transformers_attentions(reference, tokens, types, mask)
    ours = _np(model.attentions(input_ids=tokens, token_type_ids=types, attention_mask=mask))
    batch, width = tokens.shape
    assert ours.shape == expected.shape == (batch, LAYERS, tiny_model[3], width, width)
    real = mask.astype(bool)
    diffs = [max_diff(ours[b][:, :, real[b], :], expected[b][:, :, real[b], :]) for b in range(batch)]
    print(f"attentions {tiny_model[2]} {model.backend}: {max(diffs):.2e}")
    assert max(diffs) <= BOUND
    # Not trivially equal: the probabilities differ between layers and heads.
    assert max_diff(ours[:, 0], ours[:, 1]) > 1e-2


def test_probabilities_sum_to_one_and_padded_keys_get_zero(model):
    """Every query row, padded ones included, is a distribution over the real keys only."""
    tokens, types, mask = _batch(seed=6)
    ours = _np(model.attentions(tokens, types, attention_mask=mask)).astype(np.float64)
    assert np.abs(ours.sum(axis=-1) - 1.0).max() <= 1e-5
    padded_keys = ~mask.astype(bool)
    assert padded_keys.any()
    assert np.all(ours.transpose(0, 4, 1, 2, 3)[padded_keys] == 0.0)
    assert np.all(ours >= 0.0)


def test_unpadded_batch_defaults(model, reference):
    """Left-out segments and mask (`= zeros`, `= ones`): every row is real and compared."""
    tokens = np.random.default_rng(7).integers(1, TINY_CONFIG["vocab_size"], size=(2, 6))
    expected = _transformers_attentions(reference, tokens, np.zeros_like(tokens), np.ones_like(tokens))
    assert max_diff(_np(model.attentions(tokens)), expected) <= BOUND


def test_optimiser_keeps_fusing_and_folds_the_probabilities_too(tiny_model):
    """The probabilities read the query and key projections a second time: on torch those
    reads become rows of the fused Q/K/V matmul, and with 2 heads (scale 0.25) the scale is
    folded for both attention paths, once into the weights."""
    entry, checkpoint, root, heads = tiny_model
    ctx, _ = nest.prepare(entry, weights=checkpoint / "model.safetensors", optimize=RECORDS["torch"].passes)
    applied = ctx.optimized.applied
    assert "Attention.context: fused query, key, value into one Linear<32, 96> `query_key_value`" in applied
    assert "Attention.probabilities: query, key read as rows of the fused `query_key_value`" in applied
    folds = [line for line in applied if "folded the attention scale" in line]
    plan = ctx.optimized.plan[f"{'bert.' if root == 'PreTraining' else ''}encoder.layers.1.attention.query_key_value.weight"]
    if heads == 2:
        assert folds == [f"Attention.{fn}: folded the attention scale 0.25 into `query_key_value` rows [0, 32)"
                         for fn in ("context", "probabilities")]
        assert plan.row_scales == ((0, 32, 0.25),)  # once, though two calls read those rows
    else:
        assert folds == [] and plan.row_scales == ()


def test_packing_refuses_the_entry_and_keeps_the_others(tiny_model):
    """Packing would hand padded queries zeros; the pass refuses `attentions` and says why,
    while `forward` still runs packed."""
    entry, checkpoint, _, heads = tiny_model
    ctx, _ = nest.prepare(entry, weights=checkpoint / "model.safetensors", optimize=RECORDS["onnx"].passes)
    notes = [n for n in ctx.optimized.notes if n.startswith("attentions: not packed")]
    assert len(notes) == 1 and "attention_probabilities" in notes[0]
    assert ctx.program.entries["forward"].packed_by is not None
    assert ctx.program.entries["attentions"].packed_by is None
    # ONNX Runtime's passes do not fuse: the scale folds into `query`, called at two places.
    folds = [line for line in ctx.optimized.applied if "folded the attention scale" in line]
    assert folds == ([f"Attention.{fn}: folded the attention scale 0.25 into `query` rows [0, 32)"
                      for fn in ("context", "probabilities")] if heads == 2 else [])
