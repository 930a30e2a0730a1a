"""BERT (`model_type` "bert"): the source of `nest/bert-base-uncased`, every `BertFor*` head.

config.json's sizes, dropout rates, `hidden_act` and `layer_norm_eps` become the root's
generics; relative positions, decoders and cross-attention are refused, since the source
computes none of them.  Checkpoints carry the encoder under `bert.` (every head class) or
bare (`BertModel`, and what sentence-transformers saves), LayerNorms as `weight`/`bias` or
the TF-era `gamma`/`beta`; a masked-LM decoder must be the word-embedding table.
"""
from __future__ import annotations

import json
import logging

from ... import codes
from ...diagnostics import error
from ..layouts import BERT, LAYER_NORM_SPELLINGS
from ..manifest import TokenizerSpec
from . import ConfigReader, EncoderSpec, Family, FamilyConfig, describe, require_tied

log = logging.getLogger("linnet.nest")

#: BertForSequenceClassification with one label is a regressor (transformers infers
#: problem_type "regression" from num_labels == 1): a root of its own, whose `loss` is MSE.
REGRESSION_ROOT = "SequenceRegression"
#: Roots with a `Labels` generic, whose logits `id2label` names.
LABELLED = frozenset({"SequenceClassification", "TokenClassification"})
#: Roots holding the masked-LM head, whose decoder is the word-embedding table.
MASKED_LM = frozenset({"PreTraining", "MaskedLm"})

#: config.json size fields -> the generics they give, with what each is (for messages).
SIZES = (
    ("vocab_size", "Vocab", "the number of word embeddings"),
    ("max_position_embeddings", "MaxPositions", "the number of position embeddings"),
    ("type_vocab_size", "TypeVocab", "the number of token-type embeddings"),
    ("hidden_size", "D", "the width of the hidden states"),
    ("num_attention_heads", "Heads", "the number of attention heads"),
    ("intermediate_size", "Inner", "the width of the feed-forward layer"),
    ("num_hidden_layers", "Layers", "the number of encoder layers"),
)
#: config.json dropout rates -> the BERT source's Real generics (training only; eval is exact).
DROPOUTS = (("hidden_dropout_prob", "HiddenDropout"), ("attention_probs_dropout_prob", "AttentionDropout"))
#: config.json `hidden_act` -> the member of `Activation` (linnet.types.MEMBER_KINDS) the BERT
#: source's `HiddenAct` generic is set to. "gelu_new" and "gelu_pytorch_tanh" are one formula, GELU's
#: tanh approximation (transformers computes the first by hand, the second with torch's kernel).
HIDDEN_ACTS = {"gelu": "gelu_erf", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu",
               "silu": "silu", "swish": "silu"}
#: transformers' BertConfig default `layer_norm_eps`.
DEFAULT_EPS = 1e-12
#: The heads whose classifier reads a dropped vector (transformers' `classifier_dropout`,
#: falling back to the hidden rate when it is null, as the source's default does too).
CLASSIFIER_DROPOUT = frozenset({"SequenceClassification", REGRESSION_ROOT, "TokenClassification", "MultipleChoice"})

#: TF-era checkpoints spell LayerNorm params `gamma`/`beta`.
_OLD_NORM_NAMES = LAYER_NORM_SPELLINGS["gamma/beta"]
WORD_EMBEDDINGS = "embeddings.word_embeddings.weight"
MLM_DECODER = "cls.predictions.decoder.weight"
VOCAB_TXT, TOKENIZER_CONFIG = "vocab.txt", "tokenizer_config.json"


class BertFamily(Family):
    name = "bert"
    title = "BERT"
    model_types = ("bert",)
    source_entry = "bert-base-uncased"
    layout = BERT
    architectures = {
        "BertModel": "Model",
        "BertForPreTraining": "PreTraining",
        "BertForMaskedLM": "MaskedLm",
        "BertForSequenceClassification": "SequenceClassification",
        "BertForTokenClassification": "TokenClassification",
        "BertForQuestionAnswering": "QuestionAnswering",
        "BertForMultipleChoice": "MultipleChoice",
    }
    root_entries = {
        "Model": "forward", "PreTraining": "forward", "MaskedLm": "mlm",
        "SequenceClassification": "logits", REGRESSION_ROOT: "logits", "TokenClassification": "logits",
        "QuestionAnswering": "logits", "MultipleChoice": "logits",
    }
    outputs = {"forward": "hidden", "pool": "pooled", "embed": "embedding", "hidden_states": "hidden_states",
               "mlm": "mlm_logits", "nsp": "nsp_logits", "logits": "logits"}
    encoder = EncoderSpec(block="Encoder", sub="encoder")
    probe_param = "encoder.embeddings.word_embeddings"

    # ------------------------------------------------------------ config.json

    def read_config(self, reader: ConfigReader, architecture: str, root: str) -> FamilyConfig:
        generics: dict = {}
        reader.sizes(SIZES, generics)
        heads, width = generics.get("Heads"), generics.get("D")
        if heads and width and width % heads:
            reader.unsupported(f"has hidden_size {width}, which {heads} attention heads cannot share "
                               f"equally (hidden_size must be a multiple of num_attention_heads)")
        labels = reader.labels() if root in LABELLED or root == "QuestionAnswering" else None
        if root == "QuestionAnswering":
            if labels is not None and len(labels) != 2:
                reader.unsupported(f"gives {len(labels)} labels, but {architecture} scores exactly two per token "
                                   f"(answer start and end), so num_labels must be 2")
            labels = None
        if root == "SequenceClassification" and labels is not None and _is_regression(reader, len(labels)):
            root = REGRESSION_ROOT  # one output, no Labels generic: its classifier is [1, D]
        elif labels is not None:
            generics["Labels"] = len(labels)
        _dropout_rates(reader, root, generics)
        act = reader.one_of("hidden_act", "gelu", HIDDEN_ACTS, "BERT source")
        if act is not None:
            generics["HiddenAct"] = HIDDEN_ACTS[act]
        reader.epsilon("layer_norm_eps", generics, DEFAULT_EPS)
        reader.dtype(generics)
        for message in _unsupported(reader):
            reader.unsupported(message)
        tied = reader.get("tie_word_embeddings", True)
        return FamilyConfig(architecture, root, generics, labels, settings={"tied_decoder": tied is not False})

    def check_dims(self, config: FamilyConfig) -> dict[str, int]:
        check = super().check_dims(config)
        if config.root == "MultipleChoice":
            check["C"] = 2
        return check

    # ------------------------------------------------------------ the checkpoint

    def spelling_in(self, index, key: str) -> str:
        """`key`, or its TF-era LayerNorm spelling (`gamma`/`beta`) when only that is stored."""
        for new, old in _OLD_NORM_NAMES.items():
            if key.endswith(new) and key not in index and key[: -len(new)] + old in index:
                return key[: -len(new)] + old
        return key

    def check_checkpoint(self, name: str, index, config: FamilyConfig, files: list, prefix: str) -> None:
        if config.root in MASKED_LM:
            _check_tied_decoder(name, index, config, files, prefix)

    # ------------------------------------------------------------ beside the checkpoint

    def tokenizer(self, repo, config: FamilyConfig) -> TokenizerSpec | None:
        """`tokenizer.json` when there is one, else `vocab.txt` with the casing its
        `tokenizer_config.json` gives (`do_lower_case`, transformers' default True)."""
        found = super().tokenizer(repo, config)
        if found is not None or repo.find(VOCAB_TXT, what="tokenizer file") is None:
            return found
        lowercase = True
        settings = repo.find(TOKENIZER_CONFIG, what="tokenizer file")
        if settings is not None:
            try:
                lowercase = bool(json.loads(settings.read_text(encoding="utf-8")).get("do_lower_case", True))
            except (ValueError, OSError, AttributeError):
                log.warning("%s: unreadable %s; assuming a lower-casing tokenizer", repo.label, TOKENIZER_CONFIG)
        return TokenizerSpec((VOCAB_TXT,), lowercase)


def _is_regression(reader: ConfigReader, count: int) -> bool:
    """transformers' choice of loss for one label: MSE unless problem_type says otherwise."""
    return count == 1 and reader.get("problem_type") in (None, "regression")


def _dropout_rates(reader: ConfigReader, root: str, generics: dict) -> None:
    """The config's dropout rates as the generics that apply them; absent keys keep the source's 0.1."""
    fields = DROPOUTS + ((("classifier_dropout", "ClassifierDropout"),) if root in CLASSIFIER_DROPOUT else ())
    for field, generic in fields:
        if reader.get(field) is not None:  # absent, or classifier_dropout: null (the hidden rate applies)
            reader.real(field, generic, generics, 0.0, high=1.0, what="a probability in [0, 1)")


def _unsupported(reader: ConfigReader) -> list[str]:
    """What the config asks for that the BERT source does not compute, as messages."""
    messages = []
    positions = reader.get("position_embedding_type", "absolute")
    if positions != "absolute":
        messages.append(f"sets position_embedding_type = {describe(positions)}; the BERT source adds "
                        f"learned absolute position embeddings (\"absolute\") only")
    for flag, what in (("is_decoder", "a causal decoder"), ("add_cross_attention", "cross-attention layers")):
        if reader.get(flag, False) is not False:
            messages.append(f"sets {flag} = {describe(reader.get(flag))}; the BERT source is a bidirectional "
                            f"encoder without {what}")
    return messages


def _check_tied_decoder(name: str, index, config: FamilyConfig, files: list, prefix: str) -> None:
    """The masked-LM decoder must be the word-embedding table, as the source ties them.

    transformers ties them too unless `tie_word_embeddings` is false; a checkpoint that
    stores a decoder anyway must then hold the very same values (compared byte for byte).
    """
    words = index.get(prefix + WORD_EMBEDDINGS)
    decoder = index.get(MLM_DECODER)
    if decoder is None:
        if not config.settings.get("tied_decoder", True):
            raise error(codes.HF_UNTIED_DECODER,
                        f"{name}: config.json sets tie_word_embeddings = false, but the checkpoint "
                        f"stores no {MLM_DECODER} to decode with; the BERT source's masked-LM head "
                        f"decodes with the word-embedding table")
        return
    if words is None:  # reported by the bindings already
        return
    require_tied(name, decoder, words, files, "the BERT source's masked-LM head decodes with the word-embedding "
                                              "table (tied, as BERT was trained)")
    log.info("%s: %s equals the word embeddings (tied); bound once", name, MLM_DECODER)
