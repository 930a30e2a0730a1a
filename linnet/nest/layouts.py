"""Checkpoint layouts: how one architecture's Linnet param paths map to the keys transformers stores.

Every checkpoint of one architecture stores its tensors under the same names, up to two
spellings: whether the encoder's keys carry the head class's prefix (`bert.` in every
`BertFor*` checkpoint, none in a bare `BertModel` one) and how LayerNorms are named
(`weight`/`bias` as torch writes them today, `gamma`/`beta` in the TF-era conversions of the
original google-bert checkpoints).  So the mapping is declared once per architecture, here,
and a zoo entry names it in its nest.toml instead of carrying a copy as a bindings.json:

    [weights]
    bindings = { layout = "bert", prefix = "bert.", layer_norm = "gamma/beta" }

`hf:` loading (`linnet.nest.hf`) binds with the same table, choosing the spellings from the
checkpoint it finds; `linnet.nest.weights.entry_bindings` turns either form of
`[weights].bindings` (a declared layout, or a bindings.json of the entry's own) into the
param -> key dict that `verify_bindings` checks against the checkpoint's headers.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class Layout:
    """One architecture's key table: a rule per group of params, `{P}` standing for the prefix."""

    name: str
    #: What the layout maps, for messages.
    summary: str
    rules: tuple[tuple[re.Pattern, str], ...]
    #: The prefixes its checkpoints use, each with the transformers classes that write it.
    prefixes: dict[str, str]

    def key(self, param: str, prefix: str) -> str | None:
        """The key a param is stored under (LayerNorms as `weight`/`bias`), or None if unmapped.
        `{next:N}` in an expanded key is the number N + 1 (ModernBERT's array of layers
        starts at checkpoint layer 1)."""
        for pattern, key in self.rules:
            found = pattern.fullmatch(param)
            if found:
                return _NEXT.sub(lambda m: str(int(m.group(1)) + 1), found.expand(key.replace("{P}", prefix)))
        return None


_NEXT = re.compile(r"\{next:(\d+)\}")


def _rules(*pairs: tuple[str, str]) -> tuple[tuple[re.Pattern, str], ...]:
    return tuple((re.compile(pattern), key) for pattern, key in pairs)


#: The BERT source (`nest/bert-base-uncased/src/lib.linnet`) against transformers' Bert* classes.
#: The `bert.` a Linnet path may start with is that of the heads' `bert: Model` sub-block.
BERT = Layout(
    name="bert",
    summary="the BERT source's params as transformers' Bert* classes store them",
    rules=_rules(
        (r"(?:bert\.)?encoder\.embeddings\.(word|position|token_type)_embeddings", r"{P}embeddings.\1_embeddings.weight"),
        (r"(?:bert\.)?encoder\.embeddings\.norm\.(weight|bias)", r"{P}embeddings.LayerNorm.\1"),
        (r"(?:bert\.)?encoder\.layers\.(\d+)\.attention\.(query|key|value)\.(weight|bias)",
         r"{P}encoder.layer.\1.attention.self.\2.\3"),
        (r"(?:bert\.)?encoder\.layers\.(\d+)\.attention\.out\.(weight|bias)",
         r"{P}encoder.layer.\1.attention.output.dense.\2"),
        (r"(?:bert\.)?encoder\.layers\.(\d+)\.attention_norm\.(weight|bias)",
         r"{P}encoder.layer.\1.attention.output.LayerNorm.\2"),
        (r"(?:bert\.)?encoder\.layers\.(\d+)\.up\.(weight|bias)", r"{P}encoder.layer.\1.intermediate.dense.\2"),
        (r"(?:bert\.)?encoder\.layers\.(\d+)\.down\.(weight|bias)", r"{P}encoder.layer.\1.output.dense.\2"),
        (r"(?:bert\.)?encoder\.layers\.(\d+)\.output_norm\.(weight|bias)", r"{P}encoder.layer.\1.output.LayerNorm.\2"),
        (r"(?:bert\.)?pooler\.dense\.(weight|bias)", r"{P}pooler.dense.\1"),
        (r"mlm\.transform\.(weight|bias)", r"cls.predictions.transform.dense.\1"),
        (r"mlm\.norm\.(weight|bias)", r"cls.predictions.transform.LayerNorm.\1"),
        (r"mlm\.bias", "cls.predictions.bias"),
        (r"nsp\.(weight|bias)", r"cls.seq_relationship.\1"),
        (r"(classifier|qa_outputs)\.(weight|bias)", r"\1.\2"),
    ),
    prefixes={"bert.": "every BertFor* class", "": "BertModel"},
)

#: The ViT source (`nest/vit-base-patch16-224/src/lib.linnet`) against transformers'
#: ViTForImageClassification: the trunk under `vit.` (the source's `vit: Model` sub-block),
#: the classifier beside it.  Its LayerNorms are named after their place in the layer
#: (`layernorm_before`), never `LayerNorm`, so no TF-era spelling applies.
VIT = Layout(
    name="vit",
    summary="the ViT source's params as transformers' ViTForImageClassification stores them",
    rules=_rules(
        (r"vit\.embeddings\.(cls_token|position_embeddings)", r"{P}embeddings.\1"),
        (r"vit\.embeddings\.patch_embeddings\.(weight|bias)", r"{P}embeddings.patch_embeddings.projection.\1"),
        (r"vit\.layers\.(\d+)\.(layernorm_before|layernorm_after)\.(weight|bias)", r"{P}encoder.layer.\1.\2.\3"),
        (r"vit\.layers\.(\d+)\.attention\.(query|key|value)\.(weight|bias)",
         r"{P}encoder.layer.\1.attention.attention.\2.\3"),
        (r"vit\.layers\.(\d+)\.attention\.out\.(weight|bias)", r"{P}encoder.layer.\1.attention.output.dense.\2"),
        (r"vit\.layers\.(\d+)\.up\.(weight|bias)", r"{P}encoder.layer.\1.intermediate.dense.\2"),
        (r"vit\.layers\.(\d+)\.down\.(weight|bias)", r"{P}encoder.layer.\1.output.dense.\2"),
        (r"vit\.layernorm\.(weight|bias)", r"{P}layernorm.\1"),
        (r"classifier\.(weight|bias)", r"classifier.\1"),
    ),
    prefixes={"vit.": "ViTForImageClassification"},
)


#: The GPT-2 source (`nest/gpt2/src/lib.linnet`) against the original OpenAI checkpoints and
#: transformers' GPT2* classes. The source's blocks are named as the checkpoint's modules, so
#: every key is the param path itself (Conv1D weights stored [In, Out], Q/K/V in one `c_attn`),
#: except the two tables, which are `Embedding` modules upstream. The causal-mask buffers some
#: checkpoints carry (`h.N.attn.bias`, `h.N.attn.masked_bias`) match no rule: reported unused.
#: The LM head is tied to `wte`, so `lm_head.weight`, where a checkpoint stores it, is unused too.
GPT2 = Layout(
    name="gpt2",
    summary="the GPT-2 source's params as the original checkpoints and transformers' GPT2* classes store them",
    rules=_rules(
        (r"(wte|wpe)", r"{P}\1.weight"),
        (r"(h\.\d+\.(?:ln_1|ln_2|attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.(?:weight|bias))", r"{P}\1"),
        (r"ln_f\.(weight|bias)", r"{P}ln_f.\1"),
    ),
    prefixes={"": "the original openai-community checkpoints and GPT2Model",
              "transformer.": "GPT2LMHeadModel and the other GPT2* head classes"},
)

#: The Llama source (`nest/smollm2-135m-instruct/src/lib.linnet`) against transformers'
#: LlamaForCausalLM. The source's blocks are named as transformers' modules (`model.` is its
#: `Decoder` sub), so every key is the param path itself with `.weight` on the token table. A
#: tied checkpoint stores `model.embed_tokens.weight` once (no `lm_head.weight`); the untied
#: root binds its `lm_head`.
LLAMA = Layout(
    name="llama",
    summary="the Llama source's params as transformers' LlamaForCausalLM stores them",
    rules=_rules(
        (r"model\.embed_tokens", r"{P}model.embed_tokens.weight"),
        (r"(model\.(?:layers\.\d+\.(?:self_attn\.[qkvo]_proj|mlp\.(?:gate|up|down)_proj|input_layernorm"
         r"|post_attention_layernorm)|norm)\.weight)", r"{P}\1"),
        (r"lm_head\.weight", r"{P}lm_head.weight"),
    ),
    prefixes={"": "LlamaForCausalLM"},
)

#: The same Llama source with `QkvBias = 1` against transformers' Qwen2ForCausalLM: the Llama
#: keys plus the q/k/v projections' biases (o_proj and the MLP have none). The source's
#: `MaybeBiasLinear` keeps its bias in an array of one `Bias` block (`q_proj.bias.0.bias`),
#: which the checkpoint stores as `q_proj.bias`.
QWEN2 = Layout(
    name="qwen2",
    summary="the Llama source's params (with q/k/v biases) as transformers' Qwen2ForCausalLM stores them",
    rules=LLAMA.rules + _rules(
        (r"(model\.layers\.\d+\.self_attn\.[qkv]_proj)\.bias\.0\.bias", r"{P}\1.bias"),
    ),
    prefixes={"": "Qwen2ForCausalLM"},
)

#: The ModernBERT source (`nest/modernbert-base/src/lib.linnet`) against transformers'
#: ModernBertModel (no prefix) and ModernBertForMaskedLM (`model.`). The source's layer 0 is
#: its own block `first` (it has no `attn_norm`), and its array `layers.N` is checkpoint layer
#: N + 1. The masked-LM decoder is tied to the token table, so `decoder.weight`, where a
#: checkpoint stores it, is unused; its bias binds. The classification heads
#: (ModernBertFor{Sequence,Token}Classification, `model.` too) add `head` and `classifier`.
MODERNBERT = Layout(
    name="modernbert",
    summary="the ModernBERT source's params as transformers' ModernBert* classes store them",
    rules=_rules(
        (r"(?:model\.)?tok_embeddings", r"{P}embeddings.tok_embeddings.weight"),
        (r"(?:model\.)?embedding_norm\.weight", r"{P}embeddings.norm.weight"),
        (r"(?:model\.)?first\.attn\.wqkv\.weight", r"{P}layers.0.attn.Wqkv.weight"),
        (r"(?:model\.)?first\.attn\.wo\.weight", r"{P}layers.0.attn.Wo.weight"),
        (r"(?:model\.)?first\.mlp_norm\.weight", r"{P}layers.0.mlp_norm.weight"),
        (r"(?:model\.)?first\.mlp\.wi\.weight", r"{P}layers.0.mlp.Wi.weight"),
        (r"(?:model\.)?first\.mlp\.wo\.weight", r"{P}layers.0.mlp.Wo.weight"),
        (r"(?:model\.)?layers\.(\d+)\.(attn_norm|mlp_norm)\.weight", r"{P}layers.{next:\1}.\2.weight"),
        (r"(?:model\.)?layers\.(\d+)\.attn\.wqkv\.weight", r"{P}layers.{next:\1}.attn.Wqkv.weight"),
        (r"(?:model\.)?layers\.(\d+)\.attn\.wo\.weight", r"{P}layers.{next:\1}.attn.Wo.weight"),
        (r"(?:model\.)?layers\.(\d+)\.mlp\.wi\.weight", r"{P}layers.{next:\1}.mlp.Wi.weight"),
        (r"(?:model\.)?layers\.(\d+)\.mlp\.wo\.weight", r"{P}layers.{next:\1}.mlp.Wo.weight"),
        (r"(?:model\.)?final_norm\.weight", r"{P}final_norm.weight"),
        (r"head\.(dense|norm)\.weight", r"head.\1.weight"),
        (r"decoder_bias", "decoder.bias"),
        (r"classifier\.(weight|bias)", r"classifier.\1"),
    ),
    prefixes={"model.": "ModernBertForMaskedLM and the other ModernBertFor* classes", "": "ModernBertModel"},
)

#: Every declared layout by the name nest.toml gives it.
LAYOUTS = {layout.name: layout for layout in (BERT, GPT2, LLAMA, QWEN2, VIT, MODERNBERT)}

#: The two LayerNorm spellings, by the name nest.toml gives them: the suffixes the table
#: writes (torch's), and what each becomes.
LAYER_NORM_SPELLINGS = {
    "weight/bias": {},
    "gamma/beta": {".LayerNorm.weight": ".LayerNorm.gamma", ".LayerNorm.bias": ".LayerNorm.beta"},
}
DEFAULT_LAYER_NORM = "weight/bias"


def _respell(key: str, suffixes: dict[str, str]) -> str:
    for new, old in suffixes.items():
        if key.endswith(new):
            return key[: -len(new)] + old
    return key


@dataclass(frozen=True)
class LayoutBindings:
    """`[weights].bindings` given as a declared layout and the spellings its checkpoint uses."""

    layout: str
    prefix: str
    layer_norm: str = DEFAULT_LAYER_NORM

    @property
    def label(self) -> str:
        """How binding diagnostics name where the bindings came from."""
        return f'the "{self.layout}" layout ([weights].bindings in nest.toml)'

    def fingerprint(self) -> bytes:
        """What the bindings depend on (this declaration and the layout's table), for cache keys."""
        layout = LAYOUTS[self.layout]
        return repr((self, [(pattern.pattern, key) for pattern, key in layout.rules])).encode()

    def bindings(self, param_names: Iterable[str]) -> dict[str, str]:
        """param -> checkpoint key, in order; a param the layout does not map is left out, so
        `verify_bindings` reports it as unbound (E1006)."""
        layout, suffixes = LAYOUTS[self.layout], LAYER_NORM_SPELLINGS[self.layer_norm]
        bindings = {}
        for name in param_names:
            key = layout.key(name, self.prefix)
            if key is not None:
                bindings[name] = _respell(key, suffixes)
        return bindings
