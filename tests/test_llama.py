"""Llama-style decoders (`model_type` "llama", the source of `nest/smollm2-135m-instruct`).

Small random LlamaForCausalLMs written by transformers' own `save_pretrained` into a folder
and loaded with `nest.load(folder)` (the hf: adapter, linnet/nest/families/llama.py): tied
and untied LM heads, grouped-query attention (fewer key/value heads than query heads) and
a RoPE base other than the default. The tied one is also a revision in the offline test hub
cache, loaded as `nest.load("hf:...")` on torch and JAX (the folder on StableHLO and ONNX).
Compared with transformers itself:

* logits and hidden states on a left-padded batch within 1e-5 (f32) on torch, JAX,
  StableHLO and ONNX, transformers given the positions its generate counts;
* the cache: `decode` after `prefill` equals a full recompute at every step, and `extend`
  after a prefix equals `prefill` over the whole prompt;
* ONNX's generate runs the prompt and every step on one session (the `extend` graph);
* greedy `generate` token-identical to transformers' `generate(do_sample=False)`;
* what the source does not compute refused by name (E1106) before anything is built.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fixtures.hf_families import add_snapshot
from linnet import nest
from linnet.diagnostics import LinnetError

BACKENDS = ["torch", "jax", "stablehlo", "onnx"]
#: f32 parity bound.
BOUND = 1e-5
#: Small enough to build and run in a fraction of a second; GQA (4 query heads, 2 kv heads).
TINY = dict(vocab_size=101, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, bos_token_id=1,
            eos_token_id=2, pad_token_id=0)


def save_llama(folder, seed=0, **overrides):
    """A random LlamaForCausalLM saved by `save_pretrained`; every param moved off its tidy
    initial value (norms 1) so a param bound to the wrong tensor shows. Returns it (eval)."""
    import transformers

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(**{**TINY, **overrides})
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            one = 1.0 if name.endswith("norm.weight") else 0.0
            param.copy_(torch.randn_like(param) * 0.2 + one)
    model.save_pretrained(folder, safe_serialization=True)
    return model.eval()


#: The tied model's repo in the test hub cache, read through `hf:` on HUB_BACKENDS.
TIED_REPO = "linnet-tests/llama-tied"
HUB_BACKENDS = ("torch", "jax")


@pytest.fixture(scope="module")
def tied(tmp_path_factory, hf_cache):
    folder = tmp_path_factory.mktemp("llama-tied")
    model = save_llama(folder, tie_word_embeddings=True, rope_theta=500.0)
    add_snapshot(hf_cache, folder, TIED_REPO, tag="tied")
    return folder, model


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama-untied")
    return folder, save_llama(folder, seed=1, tie_word_embeddings=False, num_key_value_heads=1)


def left_padded(lengths, seed=0, vocab=TINY["vocab_size"], pad=TINY["pad_token_id"]):
    """Random tokens left-padded to the longest, the mask, and the positions generate counts."""
    rng = np.random.default_rng(seed)
    width = max(lengths)
    tokens = rng.integers(3, vocab, (len(lengths), width))
    mask = np.zeros((len(lengths), width), np.int64)
    for row, n in enumerate(lengths):
        mask[row, width - n:] = 1
    tokens[mask == 0] = pad
    positions = np.maximum(np.cumsum(mask, 1) - 1, 0)
    return tokens, mask, positions


def reference(model, tokens, mask, positions):
    with torch.no_grad():
        out = model(torch.tensor(tokens), attention_mask=torch.tensor(mask), position_ids=torch.tensor(positions),
                    output_hidden_states=True)
    return out.logits.numpy(), torch.stack(out.hidden_states, 1).numpy()


_loaded: dict = {}


def source(case, backend) -> str:
    """Where `case` loads from on `backend`: the tied model from the hub on HUB_BACKENDS."""
    if case[1].config.tie_word_embeddings and backend in HUB_BACKENDS:
        return f"hf:{TIED_REPO}"
    return str(case[0])


def load(case, backend):
    key = (source(case, backend), backend)
    if key not in _loaded:
        _loaded[key] = nest.load(key[0], backend=backend)
    return _loaded[key]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("which", ["tied", "untied"])
def test_logits_and_hidden_states_match_transformers_on_a_left_padded_batch(request, which, backend):
    case = request.getfixturevalue(which)
    model = load(case, backend)
    assert model.info.report.unused_keys == []
    assert model.manifest.source.root == ("Model" if which == "tied" else "UntiedModel")
    # The hub loads read the snapshot in the test cache, not the folder it was copied from.
    assert (model.info.origin == "cache") == source(case, backend).startswith("hf:"), model.info.source
    tokens, mask, positions = left_padded([11, 7, 3], seed=2)
    logits, hidden = reference(case[1], tokens, mask, positions)
    real = mask.astype(bool)
    ours = np.asarray(model(tokens, attention_mask=mask))
    assert ours.shape == logits.shape
    diff = np.abs(ours - logits)[real].max()
    print(f"{which} {backend}: logits max diff {diff:.3g}")
    assert diff < BOUND
    states = np.asarray(model.hidden_states(tokens, attention_mask=mask))
    assert states.shape == hidden.shape
    assert np.abs(states - hidden).transpose(0, 2, 1, 3)[real].max() < BOUND
    # Last-token pooling: left-padded, every row's last real token is its last position.
    assert np.abs(np.asarray(model.embed(tokens, attention_mask=mask)) - hidden[:, -1, -1]).max() < BOUND


@pytest.mark.parametrize("which", ["tied", "untied"])
def test_decode_after_prefill_equals_a_full_recompute_at_every_step(request, which):
    case = request.getfixturevalue(which)
    model = load(case, "torch")
    config = case[1].config
    tokens, mask, _ = left_padded([6, 2], seed=4)
    rng = np.random.default_rng(5)
    logits, cache = model.prefill(tokens, attention_mask=mask)
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    dh = config.hidden_size // heads
    assert tuple(cache.shape) == (config.num_hidden_layers, 2, 2, kv, 6, dh)
    for step in range(6):
        full = np.asarray(model(tokens, attention_mask=mask))[:, -1]
        assert np.abs(np.asarray(logits) - full).max() < BOUND, step
        token = rng.integers(3, TINY["vocab_size"], (2, 1))
        tokens, mask = np.concatenate([tokens, token], 1), np.concatenate([mask, np.ones_like(token)], 1)
        logits, cache = model.decode(token, cache, attention_mask=mask)


def test_extend_after_a_prefix_equals_prefill_at_the_real_positions(tied):
    """`extend` (S tokens after P cached ones) gives the cache `prefill` gives over the whole
    prompt, at every real position (padding positions are never attended to, and differ)."""
    model = load(tied, "torch")
    tokens, mask, _ = left_padded([7, 3], seed=9)
    scores, whole = (np.asarray(r) for r in model.prefill(tokens, attention_mask=mask))
    real = mask.astype(bool)
    for cut in (2, 6):  # S = 5 new tokens, then S = 1 (decode's case)
        _, prefix = model.prefill(tokens[:, :cut], attention_mask=mask[:, :cut])
        logits, extended = (np.asarray(r) for r in model.extend(tokens[:, cut:], prefix, attention_mask=mask))
        assert extended.shape == whole.shape
        assert np.abs(extended - whole).transpose(2, 4, 0, 1, 3, 5)[real].max() < BOUND, cut
        assert np.abs(logits - scores).max() < BOUND, cut


def test_onnx_generate_runs_on_the_step_session_alone(tied):
    """The step graph, emitted from `extend`, takes the prompt over an empty cache: loading
    opens it and generate opens no other session (one pre-packed copy of the weights)."""
    from linnet.backends.onnx_decoder import STEP_FILE

    model = nest.load(tied[0], backend="onnx")
    assert set(model.runtime.sessions) == {STEP_FILE}
    tokens, mask, _ = left_padded([5, 2], seed=8)
    model.generate(tokens, 3, attention_mask=mask)
    assert set(model.runtime.sessions) == {STEP_FILE}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("which", ["tied", "untied"])
def test_greedy_generate_is_token_identical_to_transformers(request, which, backend):
    case = request.getfixturevalue(which)
    tokens, mask, _ = left_padded([7, 4, 1], seed=6)
    with torch.no_grad():
        theirs = case[1].generate(torch.tensor(tokens), attention_mask=torch.tensor(mask), max_new_tokens=24,
                                  do_sample=False, pad_token_id=TINY["pad_token_id"], eos_token_id=None).numpy()
    ours = load(case, backend).generate(tokens, 24, attention_mask=mask)
    assert ours.shape == theirs.shape == (3, 31)
    assert (ours == theirs).all(), np.argwhere(ours != theirs)[:5]


# ------------------------------------------------------------------ what the source refuses


@pytest.mark.parametrize("field, value, says", [
    ("rope_scaling", {"rope_type": "linear", "factor": 2.0}, "rope_scaling"),
    ("rope_parameters", {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0}, "rope_type = \"llama3\""),
    ("attention_bias", True, "attention_bias = true"),
    ("mlp_bias", True, "mlp_bias = true"),
    ("hidden_act", "gelu", "hidden_act = \"gelu\""),
    ("head_dim", 16, "head_dim = 16"),
    ("num_key_value_heads", 3, "3 key/value heads"),
])
def test_settings_the_source_does_not_compute_are_refused_by_name(tmp_path, field, value, says):
    (tmp_path / "config.json").write_text(json.dumps({
        **TINY, "model_type": "llama", "architectures": ["LlamaForCausalLM"], field: value}))
    with pytest.raises(LinnetError) as caught:
        nest.load(tmp_path)
    assert caught.value.code == "E1106", caught.value.render()
    assert says in caught.value.render()


# ------------------------------------------------------------------ the zoo entry and bad input


def test_linnet_check_counts_smollm2s_parameters():
    """SmolLM2-135M's shapes (nest/smollm2-135m-instruct's generics), counted by LlamaForCausalLM's
    modules: the token table (tied, stored once), per layer q/o [D, D], k/v [KvHeads * Dh, D],
    gate/up/down [Inner, D] and two norms, then the final norm."""
    from linnet.cli.targets import locate
    from linnet.compiler import compile_target

    params = compile_target(locate("smollm2-135m-instruct")).instance.params
    vocab, d, kv_width, inner, layers = 49152, 576, 3 * 64, 1536, 30
    expected = vocab * d + layers * (2 * d * d + 2 * kv_width * d + 3 * inner * d + 2 * d) + d
    assert sum(int(np.prod(p.shape)) for p in params) == expected == 134_515_008


#: SmolLM2-135M-Instruct's config.json: the zoo entry's generics, as transformers names them.
SMOLLM2 = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
               num_key_value_heads=3, max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0,
               tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)


def test_a_full_size_synthetic_smollm2_through_the_zoo_entry_matches_transformers(tmp_path):
    """The zoo entry's own nest.toml (sizes, Theta, Eps, the llama layout, tied head) over a
    random checkpoint of SmolLM2's shapes written by `save_pretrained` (the token table stored
    once, as the real one is), given as `weights=` the folder: every key bound, logits equal
    transformers' on one short prompt. Every param is jittered (norms off 1), so two swapped
    tensors of one shape would show; torch only, the 30 layers cost time and memory."""
    import transformers

    from fixtures.hf_families import jitter

    torch.manual_seed(3)
    config = transformers.LlamaConfig(**SMOLLM2)
    config.architectures = ["LlamaForCausalLM"]
    reference_model = jitter(transformers.LlamaForCausalLM(config), 3, scale=0.02)
    reference_model.save_pretrained(tmp_path, safe_serialization=True)
    model = nest.load("smollm2-135m-instruct", backend="torch", kernels="default", weights=tmp_path)
    assert model.info.origin == "weights=" and model.info.report.unused_keys == []
    assert len(model.info.report.bound) == len(reference_model.state_dict()) - 1  # lm_head is the token table
    tokens = np.random.default_rng(7).integers(3, SMOLLM2["vocab_size"], (1, 8))
    with torch.no_grad():
        want = reference_model(torch.tensor(tokens)).logits.numpy()
    got = np.asarray(model(tokens))
    assert got.shape == want.shape == (1, 8, SMOLLM2["vocab_size"])
    diff = float(np.abs(got - want).max())
    print(f"full-size synthetic SmolLM2 (torch): logits max diff {diff:.3g}, largest |logit| {np.abs(want).max():.3g}")
    assert diff < BOUND


def test_a_prompt_past_the_positions_and_ids_past_the_vocabulary_are_refused_before_compute(tied, monkeypatch):
    model = load(tied, "torch")
    monkeypatch.setattr(model.runtime, "run", lambda *a: pytest.fail("ran before refusing"))
    with pytest.raises(LinnetError) as caught:
        model.generate(np.zeros((1, 60), np.int64), 5)
    assert caught.value.code == "E0702" and "needs 65 positions" in caught.value.render()
    for call in (lambda: model(np.array([[1, 101]])), lambda: model.generate(np.array([[1, 101]]), 3)):
        with pytest.raises(LinnetError) as caught:
            call()
        assert caught.value.code == "E0701" and "101 rows" in caught.value.render()
