"""Llama (`model_type` "llama"): the source of `nest/smollm2-135m-instruct`, for LlamaForCausalLM.

A pre-norm decoder with RoPE, RMSNorm, SwiGLU and grouped-query attention. Tied embeddings
(`tie_word_embeddings`, SmolLM2's) run the source's `Model` root, whose LM head scores against
`model.embed_tokens`; untied ones (Llama 2's) run `UntiedModel`, which binds `lm_head.weight`.
config.json's sizes, `rms_norm_eps` and RoPE's base become the root's generics; what the source
does not compute is refused by name (E1106): scaled RoPE variants (`rope_scaling`, a
`rope_parameters` type other than "default"), biases on the attention or MLP projections, a gate
activation other than SiLU, and a head width other than hidden_size / num_attention_heads.
The dropout rates are not read: the source has no dropout, which changes nothing in eval.
Prompts are padded on the left, as transformers' `generate` needs.

Qwen2 (`model_type` "qwen2", Qwen2ForCausalLM) is the same source with `QkvBias = 1`: biases on
q_proj/k_proj/v_proj (always, as transformers' Qwen2Attention has them; o_proj and the MLP have
none), bound by the qwen2 layout. Its sliding-window attention is refused by name (E1106)
where it would change a result: `use_sliding_window` true with a window shorter than
`max_position_embeddings` on any layer (`layer_types`, or layers from `max_window_layers` on).
"""
from __future__ import annotations

from dataclasses import replace

from ... import codes
from ..layouts import LLAMA, QWEN2
from ..manifest import TokenizerSpec
from . import ConfigReader, Family, FamilyConfig, describe, is_count
from .gpt2 import _generation

#: config.json size fields -> the generics they give, with what each is (for messages).
SIZES = (
    ("vocab_size", "Vocab", "the number of token embeddings"),
    ("max_position_embeddings", "MaxPositions", "the longest sequence"),
    ("hidden_size", "D", "the width of the hidden states"),
    ("num_attention_heads", "Heads", "the number of query heads"),
    ("intermediate_size", "Inner", "the width of the gated MLP"),
    ("num_hidden_layers", "Layers", "the number of decoder layers"),
)
#: transformers' LlamaConfig defaults for the fields the source reads.
DEFAULT_EPS = 1e-6
DEFAULT_THETA = 10000.0
#: Projection biases the source does not have, with what a true value would add.
BIASES = (("attention_bias", "biases on the q/k/v/o projections"),
          ("mlp_bias", "biases on the gate/up/down projections"))


class LlamaFamily(Family):
    name = "llama"
    title = "Llama"
    model_types = ("llama",)
    source_entry = "smollm2-135m-instruct"
    layout = LLAMA
    architectures = {"LlamaForCausalLM": "Model"}
    root_entries = {"Model": "forward", "UntiedModel": "forward"}
    outputs = {"forward": "logits", "hidden_states": "hidden_states", "embed": "embedding"}
    probe_param = "model.embed_tokens"

    def read_config(self, reader: ConfigReader, architecture: str, root: str) -> FamilyConfig:
        generics: dict = {}
        self._projections(reader, generics)
        reader.sizes(SIZES, generics)
        _kv_heads(reader, generics)
        _head_width(reader, generics)
        reader.real("rms_norm_eps", "Eps", generics, DEFAULT_EPS, what="a positive number (RMSNorm's epsilon)")
        _rope(reader, generics)
        reader.dtype(generics)
        reader.one_of("hidden_act", "silu", ("silu",), "Llama source's gated MLP (SwiGLU)")
        if reader.get("tie_word_embeddings", False) is not True:
            root = "UntiedModel"
        return FamilyConfig(architecture, root, generics, None, _generation(reader, generics.get("Vocab")))

    def _projections(self, reader: ConfigReader, generics: dict) -> None:
        """Llama's projections have no bias: `attention_bias` / `mlp_bias` set are refused."""
        for flag, meaning in BIASES:
            if reader.get(flag, False) is not False:
                reader.unsupported(f"sets {flag} = {describe(reader.get(flag))} ({meaning}); the Llama source's "
                                   f"projections have no bias")

    def check_dims(self, config: FamilyConfig) -> dict[str, int]:
        """B and S for the prompt entries, P (cached positions) for `decode`."""
        positions = int(config.generics.get("MaxPositions", 9))
        return {"B": 1, "S": min(8, positions), "P": max(1, min(8, positions - 1))}

    def tokenizer(self, repo, config: FamilyConfig) -> TokenizerSpec | None:
        """The repo's `tokenizer.json`, padding on the left (generate continues every row from
        its last position)."""
        found = super().tokenizer(repo, config)
        return replace(found, padding_side="left") if found is not None else None


def _kv_heads(reader: ConfigReader, generics: dict) -> None:
    """`num_key_value_heads` (absent or null: one per query head), which must divide the heads."""
    heads = generics.get("Heads")
    kv = reader.get("num_key_value_heads")
    if kv is None:
        kv = heads
    elif not is_count(kv):
        reader.problem(codes.HF_CONFIG_FIELD, f"`num_key_value_heads` must be a positive integer (the number of "
                                              f"key/value heads), found {describe(kv)}")
        return
    if heads and kv and heads % kv:
        reader.unsupported(f"has {kv} key/value heads, which {heads} query heads cannot share in equal groups "
                           f"(num_attention_heads must be a multiple of num_key_value_heads)")
    if kv:
        generics["KvHeads"] = kv


def _head_width(reader: ConfigReader, generics: dict) -> None:
    """The source's heads are hidden_size / num_attention_heads wide, an even number (RoPE pairs)."""
    heads, width = generics.get("Heads"), generics.get("D")
    if not (heads and width):
        return
    if width % heads or (width // heads) % 2:
        reader.unsupported(f"has hidden_size {width} and {heads} heads; the Llama source needs heads of an even "
                           f"width hidden_size / num_attention_heads")
        return
    head_dim = reader.get("head_dim")
    if head_dim is not None and head_dim != width // heads:
        reader.unsupported(f"sets head_dim = {describe(head_dim)}; the Llama source computes heads of width "
                           f"hidden_size / num_attention_heads = {width // heads} only")


def _rope(reader: ConfigReader, generics: dict) -> None:
    """RoPE's base: `rope_parameters.rope_theta` (transformers 5) or `rope_theta`; any scaling
    (`rope_scaling`, a `rope_type` other than "default") is refused."""
    scaling = reader.get("rope_scaling")
    parameters = reader.get("rope_parameters")
    if isinstance(parameters, dict):
        kind = parameters.get("rope_type", parameters.get("type", "default"))
        if kind != "default":
            reader.unsupported(f"sets rope_parameters.rope_type = {describe(kind)}; the Llama source computes "
                               f"the default RoPE only (no scaling)")
        theta = parameters.get("rope_theta", reader.get("rope_theta", DEFAULT_THETA))
    else:
        theta = reader.get("rope_theta", DEFAULT_THETA)
    if scaling is not None and not (isinstance(scaling, dict) and
                                    scaling.get("rope_type", scaling.get("type")) == "default"):
        reader.unsupported(f"sets rope_scaling = {describe(scaling)}; the Llama source computes the default RoPE "
                           f"only (no scaling)")
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
        reader.problem(codes.HF_CONFIG_FIELD, f"`rope_theta` must be a positive number (RoPE's base), found "
                                              f"{describe(theta)}")
    else:
        generics["Theta"] = float(theta)


class Qwen2Family(LlamaFamily):
    """Qwen2: the Llama source with biases on q/k/v (`QkvBias = 1`) and full causal attention."""

    name = "qwen2"
    title = "Qwen2"
    model_types = ("qwen2",)
    layout = QWEN2
    architectures = {"Qwen2ForCausalLM": "Model"}

    def _projections(self, reader: ConfigReader, generics: dict) -> None:
        """transformers' Qwen2 always has q/k/v biases and none elsewhere (it reads no
        `attention_bias`); its sliding window is refused where it would mask a key."""
        generics["QkvBias"] = 1
        _sliding_window(reader)


#: What a Qwen2 layer's attention may be (`layer_types`); only full causal attention is computed.
LAYER_TYPES = ("full_attention", "sliding_attention")


def _sliding_window(reader: ConfigReader) -> None:
    """Qwen2Config's rule: `sliding_window` applies only with `use_sliding_window` true, on the
    layers `layer_types` marks "sliding_attention" (absent: layers from `max_window_layers` on).
    A window at least `max_position_embeddings` long masks nothing, so it is accepted."""
    use = reader.get("use_sliding_window", False)
    if not isinstance(use, bool):
        reader.problem(codes.HF_CONFIG_FIELD, f"`use_sliding_window` must be true or false, found {describe(use)}")
        return
    layers = reader.get("num_hidden_layers")
    types = reader.get("layer_types")
    if types is not None:
        if not (isinstance(types, list) and all(isinstance(t, str) for t in types)):
            reader.problem(codes.HF_CONFIG_FIELD, f"`layer_types` must be a list of strings (one per layer), found "
                                                  f"{describe(types)}")
            return
        unknown = sorted({t for t in types if t not in LAYER_TYPES})
        if unknown:
            reader.unsupported(f"sets layer_types with {', '.join(map(describe, unknown))}; the Qwen2 source "
                               f"computes \"full_attention\" layers only")
            return
        sliding = [i for i, t in enumerate(types) if t == "sliding_attention"]
        where = "in layer_types"
    else:
        first = reader.get("max_window_layers", 28)
        if not (isinstance(first, int) and not isinstance(first, bool)):
            first = 0  # not a layer index: every layer may slide
        sliding = [i for i in range(layers if is_count(layers) else 0) if i >= first] if use else []
        where = f"(max_window_layers = {describe(reader.get('max_window_layers', 28))})"
    if not sliding:
        return
    window, positions = reader.get("sliding_window", 4096), reader.get("max_position_embeddings")
    if not use:  # Qwen2Config then drops the window, and its sliding layers' mask has none to apply
        reader.unsupported(f"has {len(sliding)} \"sliding_attention\" layer(s) {where} but use_sliding_window = "
                           f"false, which leaves them no window; the Qwen2 source computes full causal attention "
                           f"only")
    elif not is_count(window):
        reader.problem(codes.HF_CONFIG_FIELD, f"`sliding_window` must be a positive integer (the attention "
                                              f"window), found {describe(window)}")
    elif not (is_count(positions) and window >= positions):
        reader.unsupported(f"sets use_sliding_window = true with sliding_window = {window}, shorter than "
                           f"max_position_embeddings = {describe(positions)}, on {len(sliding)} layer(s) {where} "
                           f"from layer {sliding[0]} on; the Qwen2 source computes full causal attention only, "
                           f"which differs from a {window}-token window on longer sequences")
