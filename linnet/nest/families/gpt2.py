"""GPT-2 (`model_type` "gpt2"): the source of `nest/gpt2`, for GPT2LMHeadModel and GPT2Model.

Both classes run the source's `Model` root, a pre-norm decoder whose LM head scores against
the token table `wte` (tied, as every GPT-2 was trained); a bare GPT2Model checkpoint holds
exactly the params that root needs.  config.json's sizes and `layer_norm_epsilon` become the
root's generics; what the source does not compute is refused by name: another activation
than GELU's tanh approximation, other attention scalings, cross-attention, an untied head.
The dropout rates are not read: the source has no dropout, which changes nothing in eval.

Keys carry `transformer.` (GPT2LMHeadModel) or no prefix (GPT2Model and the original OpenAI
checkpoints, whatever class their config names); the prefix is found from the keys stored.
Prompts are padded on the left with the end-of-text id, as transformers' `generate` needs.
"""
from __future__ import annotations

import json
import logging
from dataclasses import replace

from ... import codes
from ..layouts import GPT2
from ..manifest import GenerateSpec, TokenizerSpec
from . import ConfigReader, Family, FamilyConfig, describe, is_count, require_tied

log = logging.getLogger("linnet.nest")

#: config.json size fields -> the generics they give, with what each is (for messages).
SIZES = (
    ("vocab_size", "Vocab", "the number of token embeddings"),
    ("n_positions", "MaxPositions", "the number of position embeddings"),
    ("n_embd", "D", "the width of the hidden states"),
    ("n_head", "Heads", "the number of attention heads"),
    ("n_layer", "Layers", "the number of decoder layers"),
)
#: `activation_function`s the source's MLP computes: GELU's tanh approximation, which
#: transformers computes by hand ("gelu_new", GPT-2's own) or with torch's kernel.
ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh")
#: transformers' GPT2Config default `layer_norm_epsilon`, the source's `Eps` default.
DEFAULT_EPS = 1e-5
#: Settings that change the attention the source computes, with the value it computes
#: (transformers' default) and what another value would mean.
ATTENTION_FLAGS = (
    ("scale_attn_weights", True, "scores not divided by sqrt(head width)"),
    ("scale_attn_by_inverse_layer_idx", False, "scores divided by the layer's index too"),
    ("reorder_and_upcast_attn", False, "scores computed in float32 in another order"),
    ("add_cross_attention", False, "cross-attention layers"),
)
LM_HEAD = "lm_head.weight"
WORD_EMBEDDINGS = "wte.weight"


class Gpt2Family(Family):
    name = "gpt2"
    title = "GPT-2"
    model_types = ("gpt2",)
    source_entry = "gpt2"
    layout = GPT2
    architectures = {"GPT2LMHeadModel": "Model", "GPT2Model": "Model"}
    root_entries = {"Model": "forward"}
    outputs = {"forward": "logits", "hidden_states": "hidden_states"}
    probe_param = "wte"

    # ------------------------------------------------------------ config.json

    def read_config(self, reader: ConfigReader, architecture: str, root: str) -> FamilyConfig:
        generics: dict = {}
        reader.sizes(SIZES, generics)
        _inner(reader, generics)
        heads, width = generics.get("Heads"), generics.get("D")
        if heads and width and width % heads:
            reader.unsupported(f"has n_embd {width}, which {heads} attention heads cannot share equally "
                               f"(n_embd must be a multiple of n_head)")
        reader.epsilon("layer_norm_epsilon", generics, DEFAULT_EPS)
        reader.dtype(generics)
        for message in _unsupported(reader):
            reader.unsupported(message)
        if reader.get("tie_word_embeddings", True) is False:
            reader.problem(codes.HF_UNTIED_DECODER,
                           "sets tie_word_embeddings = false; the GPT-2 source's LM head scores against the "
                           "token table wte (tied), so it cannot run a separate lm_head")
        return FamilyConfig(architecture, root, generics, None, _generation(reader, generics.get("Vocab")))

    def check_dims(self, config: FamilyConfig) -> dict[str, int]:
        """B and S for the prompt entries, P (cached positions) for `decode`,
        which needs P + 1 <= MaxPositions."""
        positions = int(config.generics.get("MaxPositions", 9))
        return {"B": 1, "S": min(8, positions), "P": max(1, min(8, positions - 1))}

    # ------------------------------------------------------------ the checkpoint

    def check_checkpoint(self, name: str, index, config: FamilyConfig, files: list, prefix: str) -> None:
        """A stored `lm_head.weight` must be `wte` byte for byte: the source ties them."""
        head, words = index.get(LM_HEAD), index.get(prefix + WORD_EMBEDDINGS)
        if head is None or words is None:  # tied (save_pretrained stores wte once), or reported already
            return
        require_tied(name, head, words, files, "the GPT-2 source's LM head scores against the token table wte "
                                               "(tied, as GPT-2 was trained)")
        log.info("%s: %s equals the token embeddings (tied); bound once", name, LM_HEAD)

    # ------------------------------------------------------------ beside the checkpoint

    def tokenizer(self, repo, config: FamilyConfig) -> TokenizerSpec | None:
        """The repo's `tokenizer.json`, padding on the left: `generate` continues every row
        from its last position, so a short prompt's padding goes before it."""
        found = super().tokenizer(repo, config)
        return replace(found, padding_side="left") if found is not None else None


def _inner(reader: ConfigReader, generics: dict) -> None:
    """`n_inner`, the feed-forward width: null (transformers' default) means 4 * n_embd."""
    inner = reader.get("n_inner")
    if inner is None:
        if "D" in generics:
            generics["Inner"] = 4 * generics["D"]
    elif not is_count(inner):
        reader.problem(codes.HF_CONFIG_FIELD, f"`n_inner` must be a positive integer (the width of the "
                                              f"feed-forward layer) or null (4 * n_embd), found {describe(inner)}")
    else:
        generics["Inner"] = inner


def _generation(reader: ConfigReader, vocab: int | None) -> GenerateSpec | None:
    """`eos_token_id`: where `generate` stops, and what it pads finished rows with."""
    eos = reader.get("eos_token_id")
    if eos is None:
        return None
    if not (isinstance(eos, int) and not isinstance(eos, bool) and eos >= 0) or (vocab and eos >= vocab):
        reader.problem(codes.HF_CONFIG_FIELD,
                       f"`eos_token_id` must be one token id (0 <= id < vocab_size = {vocab}), found {describe(eos)}")
        return None
    return GenerateSpec(eos)


def _unsupported(reader: ConfigReader) -> list[str]:
    """What the config asks for that the GPT-2 source does not compute, as messages."""
    messages = []
    reader.one_of("activation_function", "gelu_new", ACTIVATIONS, "GPT-2 source (GELU's tanh approximation)")
    for flag, computed, meaning in ATTENTION_FLAGS:
        value = reader.get(flag, computed)
        if value is not computed:
            messages.append(f"sets {flag} = {describe(value)} ({meaning}); the GPT-2 source computes "
                            f"{flag} = {json.dumps(computed)} only")
    return messages
