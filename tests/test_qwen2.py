"""Qwen2 (`model_type` "qwen2"): the Llama source with biases on q/k/v (`QkvBias = 1`).

Small random Qwen2ForCausalLMs written by transformers' own `save_pretrained`, every param
(the q/k/v biases included) moved off its initial value, each saved once as a folder and once
as a revision in the offline test hub cache (tests/fixtures/hf_families.py `save_both`), and
loaded with `nest.load(folder)` and `nest.load("hf:...")`. Compared with transformers itself:

* logits, hidden states and last-token embeddings on a left-padded batch within 1e-5 (f32) on
  torch, JAX, StableHLO and ONNX (from the hub on two, from the folder on the other two),
  transformers given the positions its generate counts; untied with GQA, and tied;
* greedy `generate` token-identical to transformers' `generate(do_sample=False)`;
* a sliding window that masks nothing (window >= max positions) is accepted and matches;
  one that would mask keys, unknown layer types and scaled RoPE are refused by name (E1106);
* the zoo entry `qwen2.5-0.5b-instruct` has Qwen2.5-0.5B's parameter count, and a copy of it at
  tiny sizes runs a transformers-written tied checkpoint given as `weights=` (its nest.toml's
  bindings, end to end).
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from fixtures.hf_families import jitter, save_both
from linnet import nest
from test_llama import left_padded, reference  # the same tiny vocab (101) and pad id (0)
from linnet.diagnostics import LinnetError
from linnet.nest.families import FAMILIES

ZOO = Path(__file__).resolve().parent.parent / "nest"
#: f32 parity bound.
BOUND = 1e-5
#: GQA (4 query heads, 2 key/value heads), a RoPE base that rotates visibly at these positions.
TINY = dict(vocab_size=101, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=500.0,
            bos_token_id=1, eos_token_id=2, pad_token_id=0)
#: (backend, where): every backend once, each source on two of them.
PARITY = [("torch", "hub"), ("onnx", "folder"), ("jax", "hub"), ("stablehlo", "folder")]


def qwen2_model(seed: int, **overrides):
    """A random Qwen2ForCausalLM, every param (biases too) jittered off its initial value."""
    import transformers

    config = transformers.Qwen2Config(**{**TINY, **overrides})
    config.architectures = ["Qwen2ForCausalLM"]
    torch.manual_seed(seed)
    return jitter(transformers.Qwen2ForCausalLM(config), seed, scale=0.2)


@pytest.fixture(scope="module")
def saved(hf_cache, tmp_path_factory):
    def save(name, model):
        return save_both(hf_cache, tmp_path_factory.mktemp(f"qwen2-{name}"), f"linnet-tests/qwen2-{name}", model,
                         tag=name)

    return {"untied": save("untied", qwen2_model(0, tie_word_embeddings=False)),
            "tied": save("tied", qwen2_model(1, tie_word_embeddings=True, num_key_value_heads=1))}


_loaded: dict = {}


def load(saved, name, where, backend):
    key = (name, where, backend)
    if key not in _loaded:
        _loaded[key] = nest.load(saved[name].source(where), backend=backend)
    return _loaded[key]


def assert_matches(model, reference_model):
    tokens, mask, positions = left_padded([11, 7, 3], seed=2)
    logits, hidden = reference(reference_model, tokens, mask, positions)
    real = mask.astype(bool)
    ours = np.asarray(model(tokens, attention_mask=mask))
    assert ours.shape == logits.shape
    diff = np.abs(ours - logits)[real].max()
    assert diff < BOUND, diff
    states = np.asarray(model.hidden_states(tokens, attention_mask=mask))
    assert states.shape == hidden.shape
    assert np.abs(states - hidden).transpose(0, 2, 1, 3)[real].max() < BOUND
    assert np.abs(np.asarray(model.embed(tokens, attention_mask=mask)) - hidden[:, -1, -1]).max() < BOUND
    return diff


def test_the_checkpoints_biases_are_nonzero_and_bound(saved):
    """The fixture is a real test of the biases: transformers' Qwen2 has them on q/k/v only, the
    jitter moved them off 0, and the loaded model binds every stored key, the biases included."""
    reference_model = saved["untied"].model
    attention = reference_model.model.layers[0].self_attn
    assert attention.o_proj.bias is None and reference_model.model.layers[0].mlp.up_proj.bias is None
    for projection in (attention.q_proj, attention.k_proj, attention.v_proj):
        assert projection.bias.abs().min() > 0
    model = load(saved, "untied", "folder", "torch")
    assert model.manifest.family == "qwen2" and model.manifest.source.zoo == FAMILIES["qwen2"].source_entry
    assert model.manifest.generics["QkvBias"] == 1 and model.manifest.source.root == "UntiedModel"
    assert model.info.report.unused_keys == []
    bound = set(model.info.report.bound)
    assert {f"model.layers.{i}.self_attn.{p}_proj.bias.0.bias" for i in range(2) for p in "qkv"} <= bound


@pytest.mark.parametrize("backend, where", PARITY, ids=["-".join(case) for case in PARITY])
def test_untied_logits_match_transformers_on_a_left_padded_batch(saved, backend, where):
    diff = assert_matches(load(saved, "untied", where, backend), saved["untied"].model)
    print(f"qwen2 untied {backend} {where}: logits max diff {diff:.3g}")


def test_tied_logits_match_transformers(saved):
    model = load(saved, "tied", "hub", "torch")
    assert model.manifest.source.root == "Model"
    assert_matches(model, saved["tied"].model)


@pytest.mark.parametrize("backend, where", PARITY, ids=["-".join(case) for case in PARITY])
def test_greedy_generate_is_token_identical_to_transformers(saved, backend, where):
    tokens, mask, _ = left_padded([7, 4, 1], seed=6)
    with torch.no_grad():
        theirs = saved["untied"].model.generate(torch.tensor(tokens), attention_mask=torch.tensor(mask),
                                                max_new_tokens=24, do_sample=False,
                                                pad_token_id=TINY["pad_token_id"], eos_token_id=None).numpy()
    ours = load(saved, "untied", where, backend).generate(tokens, 24, attention_mask=mask)
    assert ours.shape == theirs.shape == (3, 31)
    assert (ours == theirs).all(), np.argwhere(ours != theirs)[:5]


def test_a_sliding_window_that_masks_nothing_is_accepted_and_matches(tmp_path):
    """use_sliding_window with a window as long as max_position_embeddings, on every layer:
    transformers' sliding mask keeps every earlier key, so full attention is exact."""
    reference_model = qwen2_model(3, use_sliding_window=True, sliding_window=TINY["max_position_embeddings"],
                                  max_window_layers=0)
    assert "sliding_attention" in reference_model.config.layer_types
    reference_model.save_pretrained(tmp_path, safe_serialization=True)
    assert_matches(nest.load(tmp_path, backend="torch"), reference_model)


def test_biased_and_bias_free_projections_run_on_onednn_and_still_match(saved):
    """q/k/v are std's `MaybeBiasLinear` (a bias array of one element here, none in Llama):
    recognised as dense layers by structure, so `fuse_linears` fuses q, k and v and the
    per-machine kernel choice may run them on a packed oneDNN weight with their bias. Every dense layer of a `kernels="default"` load is
    put on oneDNN here (whatever this CPU's timing would say), and the logits still match."""
    from linnet.backends import torch_kernels
    from linnet.backends.torch_runtime import torch_param_name

    if not torch.backends.mkldnn.is_available():
        pytest.fail("this test needs torch built with oneDNN (mkldnn)")
    model = nest.load(saved["untied"].folder, backend="torch", kernels="default")
    runtime = model.runtime
    forms = dict(torch_kernels.dense_instances(runtime.program))
    for i in range(TINY["num_hidden_layers"]):
        # q, k and v fused into one GEMM in `project`, whose two statements read the same
        # argument; the fused bias is the three concatenated.
        attention = f"model.layers.{i}.self_attn."
        assert forms[f"{attention}q_proj_k_proj_v_proj."].bias == "bias", i
        assert not {f"{attention}{name}_proj." for name in "qkv"} & set(forms)
        assert forms[f"{attention}o_proj."].bias is None
    for prefix, form in forms.items():
        torch_kernels.install_onednn(torch_kernels._submodule(runtime.model, prefix), form)
    qkv = runtime.model.get_submodule(torch_param_name("model.layers.0.self_attn.q_proj_k_proj_v_proj"))
    assert qkv.linnet_kernel == "onednn"
    assert_matches(model, saved["untied"].model)


# ------------------------------------------------------------------ what the source refuses


def refused(tmp_path, **fields) -> str:
    (tmp_path / "config.json").write_text(json.dumps({
        **TINY, "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], **fields}))
    with pytest.raises(LinnetError) as caught:
        nest.load(tmp_path)
    assert caught.value.code == "E1106", caught.value.render()
    return caught.value.render()


def test_a_sliding_window_shorter_than_the_positions_is_refused_by_name(tmp_path):
    says = refused(tmp_path, use_sliding_window=True, sliding_window=16, max_window_layers=1)
    assert "use_sliding_window = true with sliding_window = 16" in says
    assert "max_position_embeddings = 64" in says and "from layer 1" in says


def test_a_transformers_written_sliding_config_is_refused(tmp_path):
    """The config.json transformers itself writes for a sliding model (its `layer_types`)."""
    import transformers

    config = transformers.Qwen2Config(**TINY, use_sliding_window=True, sliding_window=8, max_window_layers=0)
    config.architectures = ["Qwen2ForCausalLM"]
    config.save_pretrained(tmp_path)
    with pytest.raises(LinnetError) as caught:
        nest.load(tmp_path)
    assert caught.value.code == "E1106" and "sliding_window = 8" in caught.value.render()


@pytest.mark.parametrize("fields, says", [
    ({"layer_types": ["full_attention", "chunked_attention"]}, 'layer_types with "chunked_attention"'),
    ({"layer_types": ["full_attention", "sliding_attention"], "use_sliding_window": False},
     "but use_sliding_window = false"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling"),
    ({"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e6, "factor": 2.0}}, 'rope_type = "dynamic"'),
    ({"hidden_act": "gelu"}, 'hidden_act = "gelu"'),
    ({"head_dim": 16}, "head_dim = 16"),
])
def test_other_settings_the_source_does_not_compute_are_refused_by_name(tmp_path, fields, says):
    assert says in refused(tmp_path, **fields)


# ------------------------------------------------------------------ the zoo entry


def test_the_zoo_entry_has_qwen2_5_0_5bs_parameter_count():
    """Qwen2.5-0.5B's shapes (nest/qwen2.5-0.5b-instruct's generics), counted by
    Qwen2ForCausalLM's modules: the token table (tied, stored once), per layer q [D, D] + bias
    [D], k/v [KvHeads * Dh, D] + bias, o [D, D], gate/up/down [Inner, D] and two norms, then
    the final norm; the model card's 0.49B."""
    from linnet.cli.targets import locate
    from linnet.compiler import compile_target

    params = compile_target(locate("qwen2.5-0.5b-instruct")).instance.params
    vocab, d, kv_width, inner, layers = 151936, 896, 2 * 64, 4864, 24
    per_layer = 2 * d * d + d + 2 * (kv_width * d + kv_width) + 3 * inner * d + 2 * d
    expected = vocab * d + layers * per_layer + d
    assert sum(int(np.prod(p.shape)) for p in params) == expected == 494_032_768


def test_the_zoo_entry_at_tiny_sizes_runs_a_transformers_checkpoint_given_as_weights(tmp_path):
    """The entry's own nest.toml (source, root, qwen2 layout, QkvBias) with only the sizes
    changed: a tied Qwen2 saved by transformers binds completely and gives its logits."""
    entry = tmp_path / "qwen2.5-0.5b-instruct"
    shutil.copytree(ZOO / "qwen2.5-0.5b-instruct", entry)
    toml = entry / "nest.toml"
    text = toml.read_text()
    sizes = dict(Vocab=101, MaxPositions=64, D=32, Heads=4, KvHeads=2, Inner=48, Layers=2, Theta=500.0)
    for name, value in sizes.items():
        text, count = re.subn(rf"^{name} = .*$", f"{name} = {value}", text, flags=re.M)
        assert count == 1, name
    toml.write_text(text.replace("eos_token_id = 151645", "eos_token_id = 2"))
    reference_model = qwen2_model(7, tie_word_embeddings=True)
    reference_model.save_pretrained(tmp_path / "checkpoint", safe_serialization=True)
    model = nest.load(entry, weights=tmp_path / "checkpoint" / "model.safetensors")
    assert model.info.report.unused_keys == [] and model.manifest.generics["QkvBias"] == 1
    assert_matches(model, reference_model)
