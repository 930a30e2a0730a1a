"""ModernBERT (`model_type` "modernbert"): the source of `nest/modernbert-base`, for
ModernBertModel, ModernBertForMaskedLM, ModernBertForSequenceClassification and
ModernBertForTokenClassification.

config.json's sizes, `norm_eps`, the two RoPE thetas, the activations and the layer pattern
become the root's generics.  The source computes one pattern of attention layers, a full
layer every `GlobalEvery`-th one starting at layer 0 (what `global_attn_every_n_layers`
writes into `layer_types`) and a bidirectional sliding window of `local_attention // 2`
positions either side in the others; any other `layer_types` is refused by name, as are
biases (the source has none), RoPE scaling, activations it does not compute, and an
untied or bias-less decoder.  The encoder's dropout rates are not read: it has no dropout,
which changes nothing in eval; the heads' `classifier_dropout` is.

`classifier_pooling` ("cls" or "mean") becomes `MeanPooling`, what every root but the masked
LM pools with (`pool`, and the sequence classifier's logits).  A sequence classifier with one
label and `problem_type` null or "regression" is the `SequenceRegression` root, as transformers
infers regression from `num_labels == 1`; its other problem types are entries of the
`SequenceClassification` root (`loss`, `multi_label_loss`, `regression_loss`).

Keys carry `model.` (ModernBertForMaskedLM) or no prefix (ModernBertModel); the prefix is
found from the keys stored.

A sentence-transformers folder over ModernBERT (gte-modernbert, modernbert-embed: modules.json
-> Transformer -> Pooling -> Normalize) pools `Model.forward`'s token vectors (`ENCODER`); the
pipeline's own Pooling module decides how, not `classifier_pooling`.
"""
from __future__ import annotations

import json
import logging

from ... import codes
from ..layouts import MODERNBERT
from . import ConfigReader, EncoderSpec, Family, FamilyConfig, describe, is_count, require_tied

log = logging.getLogger("linnet.nest")

SIZES = (
    ("vocab_size", "Vocab", "the number of token embeddings"),
    ("max_position_embeddings", "MaxPositions", "the longest input"),
    ("hidden_size", "D", "the width of the hidden states"),
    ("num_attention_heads", "Heads", "the number of attention heads"),
    ("intermediate_size", "Inner", "the width of the gated feed-forward layer"),
    ("num_hidden_layers", "Layers", "the number of encoder layers"),
)
#: `hidden_activation` / `classifier_activation` -> the `Activation` member computing it
#: (transformers' ACT2FN: "gelu" is the exact, erf form).
ACTIVATIONS = {"gelu": "gelu_erf", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu",
               "silu": "silu", "swish": "silu"}
#: transformers' ModernBertConfig default `norm_eps`.
DEFAULT_EPS = 1e-5
#: Bias switches the source computes only off, with what each one would add.
BIASES = (
    ("attention_bias", "biases on Wqkv and the attention's Wo"),
    ("mlp_bias", "biases on the feed-forward layer's Wi and Wo"),
    ("norm_bias", "a bias on every LayerNorm"),
    ("classifier_bias", "a bias on the head's dense layer, before the masked-LM decoder or the classifier"),
)
FULL, SLIDING = "full_attention", "sliding_attention"
#: Roots holding the masked-LM head.
MASKED_LM = frozenset({"MaskedLm"})
#: Roots with `head` and `classifier` (transformers' ModernBertPredictionHead and a Linear).
CLASSIFIERS = frozenset({"SequenceClassification", "SequenceRegression", "TokenClassification"})
#: Roots with a `Labels` generic, whose logits `id2label` names.
LABELLED = frozenset({"SequenceClassification", "TokenClassification"})
#: `classifier_pooling` -> `MeanPooling`.
POOLINGS = {"cls": 0, "mean": 1}
#: transformers' `problem_type`s (null: inferred from num_labels and the labels' dtype).
PROBLEM_TYPES = (None, "regression", "single_label_classification", "multi_label_classification")
DECODER = "decoder.weight"
#: What a sentence-transformers pipeline pools: the encoder as the sub `model` (the layout's
#: optional `model.` path prefix), whose `forward` takes no token types.
ENCODER = EncoderSpec(block="Model", sub="model", inputs=(("tokens", None), ("attention_mask", "ones")))
WORD_EMBEDDINGS = "embeddings.tok_embeddings.weight"


class ModernBertFamily(Family):
    name = "modernbert"
    title = "ModernBERT"
    model_types = ("modernbert",)
    source_entry = "modernbert-base"
    layout = MODERNBERT
    architectures = {"ModernBertModel": "Model", "ModernBertForMaskedLM": "MaskedLm",
                     "ModernBertForSequenceClassification": "SequenceClassification",
                     "ModernBertForTokenClassification": "TokenClassification"}
    root_entries = {"Model": "forward", "MaskedLm": "mlm", "SequenceClassification": "logits",
                    "SequenceRegression": "logits", "TokenClassification": "logits"}
    outputs = {"forward": "hidden", "hidden_states": "hidden_states", "mlm": "mlm_logits", "pool": "pooled",
               "embed": "embedding", "logits": "logits"}
    encoder = ENCODER
    probe_param = "tok_embeddings"

    # ------------------------------------------------------------ config.json

    def read_config(self, reader: ConfigReader, architecture: str, root: str) -> FamilyConfig:
        generics: dict = {}
        reader.sizes(SIZES, generics)
        heads, width = generics.get("Heads"), generics.get("D")
        if heads and width and width % (2 * heads):
            reader.unsupported(f"has hidden_size {width}, which {heads} attention heads of even width cannot share "
                               f"(hidden_size must be a multiple of 2 * num_attention_heads, since RoPE rotates "
                               f"pairs of channels)")
        if reader.get("head_dim") not in (None, width // heads if heads and width else None):
            reader.unsupported(f"sets head_dim = {describe(reader.get('head_dim'))}; the ModernBERT source's heads "
                               f"are hidden_size / num_attention_heads wide")
        _layer_pattern(reader, generics)
        _window(reader, generics)
        _rope(reader, generics)
        labels = None
        if root in LABELLED:
            labels, root = _labels(reader, root, generics)
        if root not in MASKED_LM:
            _pooling(reader, generics)
        if root in CLASSIFIERS:
            reader.real("classifier_dropout", "ClassifierDropout", generics, 0.0, high=1.0,
                        what="a probability in [0, 1)")
        for field, generic in (("hidden_activation", "HiddenAct"), ("classifier_activation", "HeadAct")):
            if generic == "HeadAct" and root not in MASKED_LM | CLASSIFIERS:
                continue
            act = reader.one_of(field, "gelu", ACTIVATIONS, "ModernBERT source")
            if act is not None:
                generics[generic] = ACTIVATIONS[act]
        reader.epsilon("norm_eps", generics, DEFAULT_EPS)
        reader.dtype(generics)
        for field, meaning in BIASES:
            if reader.get(field, False) is not False:
                reader.unsupported(f"sets {field} = {describe(reader.get(field))} ({meaning}); the ModernBERT "
                                   f"source has no biases there")
        if root in MASKED_LM:
            if reader.get("decoder_bias", True) is not True:
                reader.unsupported(f"sets decoder_bias = {describe(reader.get('decoder_bias'))}; the ModernBERT "
                                   f"source's decoder adds a bias per word")
            if reader.get("tie_word_embeddings", True) is False:
                reader.problem(codes.HF_UNTIED_DECODER,
                               "sets tie_word_embeddings = false; the ModernBERT source's decoder scores against "
                               "the token table (tied), so it cannot run a separate decoder.weight")
        return FamilyConfig(architecture, root, generics, labels)

    # ------------------------------------------------------------ the checkpoint

    def check_checkpoint(self, name: str, index, config: FamilyConfig, files: list, prefix: str) -> None:
        """A stored `decoder.weight` must be the token table byte for byte: the source ties them."""
        decoder, words = index.get(DECODER), index.get(prefix + WORD_EMBEDDINGS)
        if config.root not in MASKED_LM or decoder is None or words is None:
            return
        require_tied(name, decoder, words, files, "the ModernBERT source's decoder scores against the token "
                                                  "table (tied, as ModernBERT was trained)")
        log.info("%s: %s equals the token embeddings (tied); bound once", name, DECODER)


def _labels(reader: ConfigReader, root: str, generics: dict) -> tuple[tuple[str, ...] | None, str]:
    """`id2label` / `num_labels` -> `Labels`, and the root: one label with `problem_type` null or
    "regression" is transformers' regression (MSE on one score), the `SequenceRegression` root."""
    labels = reader.labels()
    problem = reader.get("problem_type")
    if problem not in PROBLEM_TYPES:
        reader.unsupported(f"sets problem_type = {describe(problem)}; transformers and the ModernBERT source know "
                           f"{', '.join(json.dumps(p) for p in PROBLEM_TYPES[1:])} (or null) only")
    if labels is None:
        return None, root
    if root == "SequenceClassification" and len(labels) == 1 and problem in (None, "regression"):
        return labels, "SequenceRegression"
    generics["Labels"] = len(labels)
    return labels, root


def _pooling(reader: ConfigReader, generics: dict) -> None:
    """`classifier_pooling` -> `MeanPooling`: what `pool` and the sequence heads pool with."""
    pooling = reader.one_of("classifier_pooling", "cls", POOLINGS, "ModernBERT source")
    if pooling is not None:
        generics["MeanPooling"] = POOLINGS[pooling]


def _layer_pattern(reader: ConfigReader, generics: dict) -> None:
    """`layer_types` -> `GlobalEvery`: layer i full exactly when i % GlobalEvery == 0."""
    layers = generics.get("Layers")
    types = reader.get("layer_types")
    if types is None:  # written before layer_types existed: transformers builds it from this field
        every = reader.get("global_attn_every_n_layers", 3)
        if not is_count(every):
            reader.problem(codes.HF_CONFIG_FIELD, f"`global_attn_every_n_layers` must be a positive integer, "
                                                  f"found {describe(every)}")
        elif layers:
            generics["GlobalEvery"] = every
        return
    if not isinstance(types, list) or any(t not in (FULL, SLIDING) for t in types):
        reader.unsupported(f"has layer_types {describe(types) if not isinstance(types, list) else types!r}; the "
                           f"ModernBERT source computes {json.dumps(FULL)} and {json.dumps(SLIDING)} layers only")
        return
    if layers and len(types) != layers:
        reader.problem(codes.HF_CONFIG_FIELD, f"lists {len(types)} layer_types for num_hidden_layers = {layers}")
        return
    full = [i for i, t in enumerate(types) if t == FULL]
    # The smallest period the list can have: the second full layer, or past the end.
    every = full[1] if len(full) > 1 else len(types)
    if not full or full[0] != 0 or full != list(range(0, len(types), every)):
        reader.unsupported(f"has layer_types with full attention at layers {full}; the ModernBERT source computes "
                           f"full attention at layer 0 and every N-th layer after it (global_attn_every_n_layers), "
                           f"sliding-window attention in the others, only")
        return
    generics["GlobalEvery"] = every


def _window(reader: ConfigReader, generics: dict) -> None:
    """`local_attention`, the whole window -> `Window`, how far a sliding layer sees either side."""
    local = reader.get("local_attention", 128)
    if not is_count(local) or local < 2:
        reader.problem(codes.HF_CONFIG_FIELD, f"`local_attention` must be an integer of at least 2 (the sliding "
                                              f"window's width), found {describe(local)}")
        return
    generics["Window"] = local // 2


def _rope(reader: ConfigReader, generics: dict) -> None:
    """`rope_parameters` per layer type -> `GlobalTheta` and `LocalTheta`; default RoPE only."""
    if reader.get("rope_scaling") is not None:
        reader.unsupported("sets rope_scaling; the ModernBERT source computes RoPE without scaling only")
    params = reader.get("rope_parameters")
    older = {FULL: ("global_rope_theta", 160000.0), SLIDING: ("local_rope_theta", 10000.0)}
    for kind, generic in ((FULL, "GlobalTheta"), (SLIDING, "LocalTheta")):
        field, default = older[kind]
        if params is None:  # written before rope_parameters existed
            reader.real(field, generic, generics, default)
            continue
        entry = params.get(kind) if isinstance(params, dict) else None
        if not isinstance(entry, dict):
            reader.problem(codes.HF_CONFIG_FIELD, f"`rope_parameters` must give an object for {json.dumps(kind)}, "
                                                  f"found {describe(entry)}")
            continue
        rope_type = entry.get("rope_type", "default")
        extra = sorted(set(entry) - {"rope_type", "rope_theta"})
        if rope_type != "default" or extra:
            reader.unsupported(f"sets rope_parameters[{json.dumps(kind)}] = {json.dumps(entry)}; the ModernBERT "
                               f"source computes the default RoPE (rope_type \"default\", rope_theta only)")
            continue
        theta = entry.get("rope_theta", default)
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 0:
            reader.problem(codes.HF_CONFIG_FIELD, f"rope_parameters[{json.dumps(kind)}][\"rope_theta\"] must be a "
                                                  f"positive number, found {describe(theta)}")
            continue
        generics[generic] = float(theta)
