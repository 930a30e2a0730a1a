"""ModernBERT (nest/modernbert-base, linnet/nest/families/modernbert.py) against transformers.

* `linnet check modernbert-base` and `linnet check modernbert-large` prove the entries at
  answerdotai/ModernBERT-base's and -large's sizes, with transformers' parameter counts.
* A tiny random ModernBertForMaskedLM and its bare ModernBertModel, saved by transformers' own
  `save_pretrained` and loaded as folders: 4 layers with full attention at layers 0 and 3 and a
  sliding window of 2 positions either side (narrower than the 10-token batch) in layers 1 and 2,
  a right-padded batch. Last hidden states, every layer's hidden state (`hidden_states`) and masked-LM logits at
  real tokens match
  transformers' eager attention within 1e-5 on torch, JAX, StableHLO and ONNX.
* The batch is one the window and the two RoPE thetas change (checked against transformers
  itself), so matching it means computing them.
* Settings the source cannot compute are refused by name from config.json alone.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from fixtures.parity import max_diff
from linnet import nest
from linnet.diagnostics import LinnetError

BACKENDS = ["torch", "jax", "stablehlo", "onnx"]
TOLERANCE = 1e-5
#: transformers' ModernBertConfig for the tiny model; global_attn_every_n_layers = 3 writes
#: layer_types full, sliding, sliding, full.
TINY = dict(vocab_size=99, hidden_size=32, intermediate_size=40, num_hidden_layers=4, num_attention_heads=4,
            max_position_embeddings=64, local_attention=4, global_attn_every_n_layers=3, pad_token_id=0,
            bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
BATCH, SEQ, REAL = 2, 10, (10, 6)


def _config(**overrides):
    from transformers import ModernBertConfig

    config = ModernBertConfig(**{**TINY, **overrides})
    config._attn_implementation = "eager"
    return config


def _inputs():
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, TINY["vocab_size"], size=(BATCH, SEQ)).astype(np.int64)
    mask = np.zeros((BATCH, SEQ), np.int64)
    for row, n in enumerate(REAL):
        mask[row, :n] = 1
    tokens[mask == 0] = TINY["pad_token_id"]
    return tokens, mask


def _reference(model, tokens, mask):
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(tokens), attention_mask=torch.from_numpy(mask))
    return (out.logits if hasattr(out, "logits") else out.last_hidden_state).numpy()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The masked LM and its encoder saved as folders, and transformers' outputs on the batch."""
    import torch
    from transformers import ModernBertForMaskedLM

    torch.manual_seed(0)
    model = ModernBertForMaskedLM(_config()).eval()
    assert model.config.layer_types == ["full_attention", "sliding_attention", "sliding_attention",
                                        "full_attention"]
    with torch.no_grad():  # norms of weight 1 and a zero decoder bias would hide a wrong binding
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(0.1 * torch.randn_like(param))
            if "Wqkv" in name:  # sharper attention than the 0.02-std init, so which keys it sees counts
                param.mul_(10.0)
        model.decoder.bias.normal_()
    root = tmp_path_factory.mktemp("modernbert")
    model.save_pretrained(root / "mlm")
    model.model.save_pretrained(root / "bare")
    tokens, mask = _inputs()
    with torch.no_grad():
        out = model.model(input_ids=torch.from_numpy(tokens), attention_mask=torch.from_numpy(mask),
                          output_hidden_states=True)
    return {"root": root, "model": model, "tokens": tokens, "mask": mask, "logits": _reference(model, tokens, mask),
            "hidden": out.last_hidden_state.numpy(),
            # [B, S, Layers + 1, D], so a [B, S] mask picks real tokens
            "states": torch.stack(out.hidden_states, dim=2).numpy()}


@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_lm_and_hidden_states_match_transformers(saved, backend):
    tokens, mask = saved["tokens"].astype(np.int32), saved["mask"].astype(np.int32)
    real = saved["mask"].astype(bool)
    mlm = nest.load(str(saved["root"] / "mlm"), backend=backend)
    assert mlm.manifest.family == "modernbert"
    bare = nest.load(str(saved["root"] / "bare"), backend=backend)
    pairs = {
        "mlm logits": (mlm(tokens, mask), saved["logits"]),
        "mlm root's forward": (mlm.forward(tokens, mask), saved["hidden"]),
        "bare forward": (bare(tokens, mask), saved["hidden"]),
        "hidden states": (np.asarray(mlm.hidden_states(tokens, mask)).transpose(0, 2, 1, 3), saved["states"]),
    }
    for what, (got, want) in pairs.items():
        diff = max_diff(np.asarray(got)[real], want[real])
        print(f"modernbert {what} {backend}: max |diff| {diff:.2e}")  # shown with -s
        assert diff <= TOLERANCE, f"{what} on {backend}: max |diff| {diff:.3g}"


#: One setting changed at a time: the window as wide as the batch, every layer full, and the
#: two thetas swapped (global 10000 and local 160000, where the model has them the other way).
CHANGES = {
    "window": {"local_attention": 64},
    "pattern": {"layer_types": ["full_attention"] * 4},
    "thetas-swapped": {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                           "sliding_attention": {"rope_type": "default", "rope_theta": 160000.0}}},
}


@pytest.mark.parametrize("change", list(CHANGES.values()), ids=list(CHANGES))
def test_the_batch_depends_on_the_window_the_pattern_and_the_thetas(saved, change):
    """transformers itself, with the same weights and one setting changed, is more than 50 times
    the tolerance away from the outputs the parity test matches (measured: window 7.7e-3, pattern
    7.8e-3, thetas swapped 8.5e-4), so a source that got any of them wrong would fail it."""
    from transformers import ModernBertForMaskedLM

    other = ModernBertForMaskedLM(_config(**change)).eval()
    other.load_state_dict(saved["model"].state_dict())
    real = saved["mask"].astype(bool)
    diff = max_diff(_reference(other, saved["tokens"], saved["mask"])[real], saved["logits"][real])
    print(f"modernbert changed {change}: max |diff| {diff:.2e}")  # shown with -s
    assert diff > 50 * TOLERANCE


def test_check_proves_the_entry_at_modernbert_bases_sizes(capsys):
    from linnet.cli import main

    assert main(["check", "modernbert-base"]) == 0
    out = capsys.readouterr().out
    # answerdotai/ModernBERT-base: 149,655,232 params with the decoder tied to the token table
    # (transformers' ModernBertForMaskedLM, counting decoder.weight once).
    from transformers import ModernBertConfig, ModernBertForMaskedLM

    with __import__("torch").device("meta"):
        reference = ModernBertForMaskedLM(ModernBertConfig())
    count = sum(p.numel() for p in reference.parameters())
    assert f"params: {count:,} in" in out
    assert "-> Tensor[B, S, 50368; f32] where S <= 8192" in out


def test_check_proves_the_entry_at_modernbert_larges_sizes(capsys):
    """nest/modernbert-large: answerdotai/ModernBERT-large's config (28 layers of width 1024, 16
    heads, intermediate 2624, vocab 50368) on the base entry's source; its parameter count is
    transformers' ModernBertForMaskedLM built on the meta device from that config."""
    import torch
    from transformers import ModernBertConfig, ModernBertForMaskedLM

    from linnet.cli import main

    assert main(["check", "modernbert-large"]) == 0
    out = capsys.readouterr().out
    with torch.device("meta"):
        reference = ModernBertForMaskedLM(ModernBertConfig(hidden_size=1024, num_attention_heads=16,
                                                           intermediate_size=2624, num_hidden_layers=28,
                                                           vocab_size=50368))
    count = sum(p.numel() for p in reference.parameters())
    assert count == 395_881_664
    assert f"params: {count:,} in" in out
    assert "-> Tensor[B, S, 1024; f32] where S <= 8192" in out


def _raises(code: str, call, *args) -> str:
    with pytest.raises(LinnetError) as caught:
        call(*args)
    assert caught.value.code == code, caught.value.render()
    return caught.value.render()


REFUSALS = [
    ("pattern", {"layer_types": ["full_attention", "sliding_attention", "full_attention", "full_attention"]},
     "E1106", "full attention at layers [0, 2, 3]"),
    ("starts-sliding", {"layer_types": ["sliding_attention", "full_attention", "sliding_attention",
                                        "full_attention"]}, "E1106", "full attention at layers [1, 3]"),
    ("attention-bias", {"attention_bias": True}, "E1106", "sets attention_bias = true"),
    ("mlp-bias", {"mlp_bias": True}, "E1106", "sets mlp_bias = true"),
    ("norm-bias", {"norm_bias": True}, "E1106", "sets norm_bias = true"),
    ("activation", {"hidden_activation": "tanh"}, "E1106", 'sets hidden_activation = "tanh"'),
    ("rope-scaling", {"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0,
                                                             "rope_theta": 160000.0},
                                          "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
     "E1106", 'rope_parameters["full_attention"]'),
    ("no-decoder-bias", {"decoder_bias": False}, "E1106", "sets decoder_bias = false"),
    ("untied", {"tie_word_embeddings": False}, "E1108", "sets tie_word_embeddings = false"),
    ("heads", {"num_attention_heads": 5}, "E1106", "which 5 attention heads of even width cannot share"),
]


@pytest.mark.parametrize("case, change, code, says", REFUSALS, ids=[case for case, *_ in REFUSALS])
def test_what_the_source_cannot_compute_is_refused_by_name(saved, tmp_path, case, change, code, says):
    config = json.loads((saved["root"] / "mlm" / "config.json").read_text())
    config.update(change)
    (tmp_path / "config.json").write_text(json.dumps(config))
    text = _raises(code, nest.load, str(tmp_path))
    assert says in text and "config.json" in text
