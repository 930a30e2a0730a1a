"""`nest.load("hf:owner/name")`: a zoo entry made on the spot from a Hugging Face BERT repo.

What a zoo entry writes down by hand, this module reads from the repo, the way transformers'
`BertFor*.from_pretrained` does:

1. `config.json` (at the revision asked for, "main" by default) says which head the
   checkpoint carries (`architectures[0]` picks the root block of the BERT source) and its
   sizes (the root's generics).  Settings the source cannot compute exactly (an
   activation it lacks, relative positions, another LayerNorm epsilon, a decoder) are refused.
2. The checkpoint (`model.safetensors`, or the shards a `model.safetensors.index.json`
   names) is indexed from its headers, and each Linnet param is bound to the key transformers
   stores it under (`HF_KEYS`, the BERT table of `linnet.nest.layouts`), in whichever spelling the checkpoint uses (`bert.` prefix or
   none, LayerNorm `weight`/`bias` or `gamma`/`beta`).
3. The result is an `HfManifest` over the bert-base-uncased entry's source, with the
   generated bindings written once to the Linnet cache; `nest.load` then treats it like any
   other entry, so every backend runs it and `verify_bindings` still checks every shape.

Files come through `weights.fetch_file`, with its cache, offline switch and messages.

Why over 500 lines: reading a transformers config.json means one check per field it may
hold, each with its own message; they are listed here together so the supported subset of
BERT configs can be read in one place.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .. import codes, dtypes, ops
from ..backends import cache_dir
from ..diagnostics import Diagnostic, InternalError, LinnetError, Note, error
from ..middle.params import ParamSpec
from .layouts import BERT, LAYER_NORM_SPELLINGS
from .manifest import COMMIT_ID, Manifest, SourceSpec, TokenizerSpec, WeightsSpec, load_manifest
from .weights import TensorInfo, checkpoint_files, fetch_file, read_index

#: The codes of the hf stage, with what they mean (a view of the registry in linnet/codes.py).
CODES = codes.summaries("hf")

log = logging.getLogger("linnet.nest")

PREFIX = "hf:"
#: The zoo entry whose Linnet source every hf: model runs.
SOURCE_ENTRY = "bert-base-uncased"
CONFIG_JSON = "config.json"
SINGLE_FILE = "model.safetensors"
#: Tokenizer files, in the order they are looked for.
TOKENIZER_JSON, VOCAB_TXT, TOKENIZER_CONFIG = "tokenizer.json", "vocab.txt", "tokenizer_config.json"
SHARD_INDEX = "model.safetensors.index.json"

#: transformers class (`architectures[0]`) -> root block of the BERT source.
ARCHITECTURES = {
    "BertModel": "Model",
    "BertForPreTraining": "PreTraining",
    "BertForMaskedLM": "MaskedLm",
    "BertForSequenceClassification": "SequenceClassification",
    "BertForTokenClassification": "TokenClassification",
    "BertForQuestionAnswering": "QuestionAnswering",
    "BertForMultipleChoice": "MultipleChoice",
}
#: BertForSequenceClassification with one label is a regressor (transformers infers
#: problem_type "regression" from num_labels == 1): a root of its own, whose `loss` is MSE.
REGRESSION_ROOT = "SequenceRegression"
#: The entry `model(...)` runs for each root: what the transformers class is for.
ROOT_ENTRY = {
    "Model": "forward", "PreTraining": "forward", "MaskedLm": "mlm",
    "SequenceClassification": "logits", REGRESSION_ROOT: "logits", "TokenClassification": "logits",
    "QuestionAnswering": "logits", "MultipleChoice": "logits",
}
#: Roots with a `Labels` generic, whose logits `id2label` names.
LABELLED = frozenset({"SequenceClassification", "TokenClassification"})
#: Roots holding the masked-LM head, whose decoder is the word-embedding table.
MASKED_LM = frozenset({"PreTraining", "MaskedLm"})
#: Names of the entries' results in exported graphs (as the zoo entries name them).
OUTPUTS = {"forward": "hidden", "pool": "pooled", "embed": "embedding", "hidden_states": "hidden_states",
           "mlm": "mlm_logits", "nsp": "nsp_logits", "logits": "logits"}

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
#: config.json `hidden_act` -> the `activation` kind (linnet.ops.ACTIVATIONS) the BERT source's
#: `HiddenAct` generic selects. "gelu_new" and "gelu_pytorch_tanh" are one formula, GELU's
#: tanh approximation (transformers computes the first by hand, the second with torch's kernel).
HIDDEN_ACTS = {"gelu": "gelu_erf", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu",
               "silu": "silu", "swish": "silu"}
#: The heads whose classifier reads a dropped vector (transformers' `classifier_dropout`,
#: falling back to the hidden rate when it is null, as the source's default does too).
CLASSIFIER_DROPOUT = frozenset({"SequenceClassification", REGRESSION_ROOT, "TokenClassification", "MultipleChoice"})

#: Linnet param path -> Hugging Face key: the BERT layout's table, the one zoo entries name too.
HF_KEYS = BERT.rules
#: TF-era checkpoints spell LayerNorm params `gamma`/`beta`.
_OLD_NORM_NAMES = LAYER_NORM_SPELLINGS["gamma/beta"]
WORD_EMBEDDINGS = "embeddings.word_embeddings.weight"
MLM_DECODER = "cls.predictions.decoder.weight"

_REPO_ID = re.compile(r"(?:[A-Za-z0-9][A-Za-z0-9._-]*/)?[A-Za-z0-9][A-Za-z0-9._-]*")
_EPS = re.compile(r"\bconst\s+EPS\s*:\s*\w+\s*=\s*([0-9.eE+-]+)")


@dataclass(frozen=True)
class HfManifest(Manifest):
    """A manifest made from a Hugging Face repo rather than read from a nest.toml."""

    repo: str = ""
    commit: str = ""          # the revision's commit when the cache tells it, else the revision
    architecture: str = ""    # config.json's architectures[0]
    #: What each logit means, by index (config.json `id2label`); None for roots without labels.
    labels: tuple[str, ...] | None = None
    config_file: Path | None = None


@dataclass(frozen=True)
class _Config:
    """What config.json says, checked: the root block, its generics and the labels."""

    architecture: str
    root: str
    generics: dict[str, int | str]
    labels: tuple[str, ...] | None
    tied_decoder: bool    # tie_word_embeddings, transformers' default True


def hf_manifest(name: str, *, revision: str | None = None, weights: str | Path | None = None) -> HfManifest:
    """The entry `nest.load(name)` runs for `name` = "hf:owner/repo", its bindings generated.

    weights: local .safetensors file(s) to bind instead of the repo's checkpoint (the config
    still comes from the repo).
    """
    repo = _repo_id(name)
    wanted = revision or "main"
    config_file = fetch_file(repo, CONFIG_JSON, wanted, what="config file",
                            instead=f"hf: builds the model from the repo's {CONFIG_JSON}, so it must be "
                                    f"in the Hugging Face cache or downloadable")
    commit = _snapshot_commit(config_file, wanted)
    source = load_manifest(SOURCE_ENTRY)
    config = read_config(config_file, name, eps=source_eps(source))
    manifest = _skeleton(name, repo, commit, config, config_file, source)
    files, stored_names = _checkpoint(manifest, repo, commit, weights)
    index = read_index(files)
    if "T" not in config.generics:
        manifest = replace(manifest, generics={**manifest.generics, "T": _stored_float(index)})
    params, entries = _compiled_params(manifest)
    bindings = bind(params, index, name=name, architecture=config.architecture)
    if config.root in MASKED_LM:
        _check_tied_decoder(name, index, config, files)
    bindings_file = _write_bindings(manifest.name, commit, bindings)
    spec = WeightsSpec(repo=repo, revision=commit, files=tuple(stored_names), bindings=bindings_file, sha256={})
    return replace(manifest, dir=bindings_file.parent, weights=spec, tokenizer=_tokenizer_spec(repo, commit),
                   outputs={entry: OUTPUTS[entry] for entry in entries if entry in OUTPUTS})


def _tokenizer_spec(repo: str, commit: str) -> TokenizerSpec | None:
    """The repo's tokenizer, as a zoo entry's `[tokenizer]` would name it, or None if it
    ships none: `tokenizer.json` when there is one, else `vocab.txt` with the casing its
    `tokenizer_config.json` gives (`do_lower_case`, transformers' default True).

    The files are fetched now, while the checkpoint is, so `model.tokenizer` later needs no
    network; a repo without them still loads as a model.
    """
    def fetch(filename: str) -> Path | None:
        try:
            return fetch_file(repo, filename, commit, what="tokenizer file")
        except LinnetError:
            return None

    if fetch(TOKENIZER_JSON) is not None:
        return TokenizerSpec((TOKENIZER_JSON,), None)
    if fetch(VOCAB_TXT) is None:
        return None
    lowercase = True
    settings = fetch(TOKENIZER_CONFIG)
    if settings is not None:
        try:
            lowercase = bool(json.loads(settings.read_text(encoding="utf-8")).get("do_lower_case", True))
        except (ValueError, OSError, AttributeError):
            log.warning("%s: unreadable %s; assuming a lower-casing tokenizer", repo, TOKENIZER_CONFIG)
    return TokenizerSpec((VOCAB_TXT,), lowercase)


# --------------------------------------------------------------------------- names and files


def _repo_id(name: str) -> str:
    repo = name[len(PREFIX):]
    if not _REPO_ID.fullmatch(repo) or ".." in repo or len(repo) > 96:
        raise error(codes.BAD_HF_NAME, f"{name!r} is not a Hugging Face model name: expected \"hf:owner/name\", "
                                       f"such as \"hf:google-bert/bert-base-uncased\"")
    return repo


def _entry_name(repo: str) -> str:
    """A plain name for cache files, like the Hub cache's own `models--owner--name`."""
    return "hf--" + repo.replace("/", "--")


def _snapshot_commit(file: Path, revision: str) -> str:
    """The commit the cache filed `file` under (`.../snapshots/<commit>/config.json`)."""
    folder = file.parent.name
    return folder if COMMIT_ID.fullmatch(folder) else revision


def _checkpoint(manifest: HfManifest, repo: str, commit: str,
                weights: str | Path | None) -> tuple[list[Path], list[str]]:
    """The checkpoint's local files, and their names in the repo (or in the weights= folder)."""
    if weights is not None:
        files = checkpoint_files(manifest, weights=weights)
        return files, [file.name for file in files]
    try:
        return [fetch_file(repo, SINGLE_FILE, commit)], [SINGLE_FILE]
    except LinnetError as single:
        try:
            index_file = fetch_file(repo, SHARD_INDEX, commit)
        except LinnetError:
            first = single.diagnostics[0]
            raise LinnetError(first.with_note(f"nor is {SHARD_INDEX} (a sharded checkpoint); hf: reads "
                                              f"safetensors only, never pickle files such as "
                                              f"pytorch_model.bin")) from None
    names = _shard_names(index_file, manifest.name)
    return [fetch_file(repo, shard, commit) for shard in names], names


def _shard_names(index_file: Path, name: str) -> list[str]:
    """The shard files a `model.safetensors.index.json` maps its tensors to, in order."""
    try:
        index = json.loads(index_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise error(codes.HF_BAD_SHARD_INDEX, f"{name}: {SHARD_INDEX} cannot be read as JSON: {exc}", None,
                    Note(f"the file is {index_file}")) from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not (isinstance(weight_map, dict) and weight_map
            and all(isinstance(v, str) and v.endswith(".safetensors") and "/" not in v and ".." not in v
                    for v in weight_map.values())):
        raise error(codes.HF_BAD_SHARD_INDEX,
                    f"{name}: {SHARD_INDEX} must hold a `weight_map` object from tensor keys "
                    f"to .safetensors file names in the repo", None, Note(f"the file is {index_file}"))
    return sorted(set(weight_map.values()))


# --------------------------------------------------------------------------- config.json


def source_eps(source: Manifest) -> float:
    """The LayerNorm epsilon the BERT source is written with (its `EPS` constant)."""
    found = _EPS.search(source.source_file().read_text(encoding="utf-8"))
    if found is None:
        raise InternalError(f"{source.source_file()} declares no `const EPS`, which hf: compares "
                            f"config.json's layer_norm_eps with")
    return float(found.group(1))


def read_config(path: Path, name: str, *, eps: float) -> _Config:
    """config.json checked for what the BERT source can compute; every problem in one error."""
    config = _config_object(path, name)
    note = Note(f"the file is {path}")
    _check_model_type(config, name, note)
    architecture, root = _architecture(config, name, note)
    problems: list[Diagnostic] = []

    def problem(code: codes.ErrorCode, message: str) -> None:
        problems.append(Diagnostic(code, f"{name}: {CONFIG_JSON} {message}", None, (note,)))

    generics: dict[str, int | str] = {}
    for field, generic, meaning in SIZES:
        value = config.get(field)
        if field not in config:
            problem(codes.HF_CONFIG_FIELD, f"has no `{field}` ({meaning}); a BERT config must give it")
        elif not _is_count(value):
            problem(codes.HF_CONFIG_FIELD,
                    f"`{field}` must be a positive integer ({meaning}), found {_describe(value)}")
        else:
            generics[generic] = value
    heads, width = generics.get("Heads"), generics.get("D")
    if heads and width and width % heads:
        problem(codes.HF_UNSUPPORTED_CONFIG, f"has hidden_size {width}, which {heads} attention heads cannot share "
                                             f"equally (hidden_size must be a multiple of num_attention_heads)")
    labels = _labels(config, problem) if root in LABELLED or root == "QuestionAnswering" else None
    if root == "QuestionAnswering":
        if labels is not None and len(labels) != 2:
            problem(codes.HF_UNSUPPORTED_CONFIG,
                    f"gives {len(labels)} labels, but {architecture} scores exactly two per token "
                    f"(answer start and end), so num_labels must be 2")
        labels = None
    if root == "SequenceClassification" and labels is not None and _is_regression(config, len(labels)):
        root = REGRESSION_ROOT  # one output, no Labels generic: its classifier is [1, D]
    elif labels is not None:
        generics["Labels"] = len(labels)
    _dropout_rates(config, root, generics, problem)
    act = config.get("hidden_act", "gelu")
    if isinstance(act, str) and act in HIDDEN_ACTS:
        generics["HiddenAct"] = ops.ACTIVATIONS.index(HIDDEN_ACTS[act])
    # transformers names the dtype as torch does ("float32"): `dtype`, `torch_dtype` before v5.
    dtype = dtypes.lookup("torch", config.get("dtype", config.get("torch_dtype")))
    if dtype is not None and dtype.linnet and dtype.is_float:
        generics["T"] = dtype.name
    for message in _unsupported(config, eps):
        problem(codes.HF_UNSUPPORTED_CONFIG, message)
    tied = config.get("tie_word_embeddings", True)
    if problems:
        raise LinnetError(problems)
    return _Config(architecture, root, generics, labels, tied is not False)


def _config_object(path: Path, name: str) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise error(codes.HF_CONFIG_NOT_OBJECT, f"{name}: {CONFIG_JSON} cannot be read as JSON: {exc}", None,
                    Note(f"the file is {path}")) from None
    if not isinstance(config, dict):
        raise error(codes.HF_CONFIG_NOT_OBJECT,
                    f"{name}: {CONFIG_JSON} must hold a JSON object, found {_describe(config)}",
                    None, Note(f"the file is {path}"))
    return config


def _check_model_type(config: dict[str, Any], name: str, note: Note) -> None:
    if "model_type" not in config:
        raise error(codes.HF_CONFIG_FIELD, f"{name}: {CONFIG_JSON} has no `model_type`; hf: needs it to be \"bert\"",
                    None, note)
    if config["model_type"] != "bert":
        raise error(codes.HF_MODEL_TYPE, f"{name}: {CONFIG_JSON} has model_type {_describe(config['model_type'])}, "
                                         f"but hf: builds BERT models only (model_type \"bert\")", None, note)


def _architecture(config: dict[str, Any], name: str, note: Note) -> tuple[str, str]:
    supported = Note(f"supported architectures: {', '.join(ARCHITECTURES)}")
    found = config.get("architectures")
    if found is None:
        raise error(codes.HF_CONFIG_FIELD,
                    f"{name}: {CONFIG_JSON} has no `architectures`, which names the "
                    f"transformers class (and so the head) the checkpoint is for", None, note, supported)
    if not (isinstance(found, list) and found and isinstance(found[0], str)):
        raise error(codes.HF_CONFIG_FIELD, f"{name}: {CONFIG_JSON} `architectures` must be a non-empty list of class "
                                           f"names, found {_describe(found)}", None, note, supported)
    if found[0] not in ARCHITECTURES:
        raise error(codes.HF_ARCHITECTURE, f"{name}: {CONFIG_JSON} names architecture \"{found[0]}\", which hf: cannot "
                                           f"build", None, note, supported)
    return found[0], ARCHITECTURES[found[0]]


def _labels(config: dict[str, Any], problem) -> tuple[str, ...] | None:
    """Label names by logit index: `id2label`, else `num_labels` generic names, else two
    (transformers' defaults)."""
    id2label = config.get("id2label")
    if id2label is None:
        count = config.get("num_labels", 2)
        if not _is_count(count):
            problem(codes.HF_CONFIG_FIELD, f"`num_labels` must be a positive integer, found {_describe(count)}")
            return None
        return tuple(f"LABEL_{i}" for i in range(count))
    keys = list(id2label) if isinstance(id2label, dict) else []
    wanted = [str(i) for i in range(len(keys))]
    if not keys or sorted(keys, key=lambda k: (len(k), k)) != wanted:
        problem(codes.HF_CONFIG_FIELD, "`id2label` must map the label ids 0, 1, ..., N-1 to names, found "
                                       f"{_describe(id2label) if not keys else 'ids ' + ', '.join(keys)}")
        return None
    return tuple(str(id2label[key]) for key in wanted)


def _is_regression(config: dict[str, Any], count: int) -> bool:
    """transformers' choice of loss for one label: MSE unless problem_type says otherwise."""
    return count == 1 and config.get("problem_type") in (None, "regression")


def _dropout_rates(config: dict[str, Any], root: str, generics: dict, problem) -> None:
    """The config's dropout rates as the generics that apply them; absent keys keep the source's 0.1."""
    fields = DROPOUTS + ((("classifier_dropout", "ClassifierDropout"),) if root in CLASSIFIER_DROPOUT else ())
    for field, generic in fields:
        value = config.get(field)
        if value is None:  # absent, or classifier_dropout: null (the hidden rate applies)
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
            problem(codes.HF_CONFIG_FIELD, f"`{field}` must be a probability in [0, 1), found {_describe(value)}")
        else:
            generics[generic] = float(value)


def _unsupported(config: dict[str, Any], eps: float) -> list[str]:
    """What the config asks for that the BERT source does not compute, as messages."""
    messages = []
    act = config.get("hidden_act", "gelu")
    if not (isinstance(act, str) and act in HIDDEN_ACTS):
        messages.append(f"sets hidden_act = {_describe(act)}; the BERT source computes "
                        f"{', '.join(map(json.dumps, HIDDEN_ACTS))} only")
    positions = config.get("position_embedding_type", "absolute")
    if positions != "absolute":
        messages.append(f"sets position_embedding_type = {_describe(positions)}; the BERT source adds "
                        f"learned absolute position embeddings (\"absolute\") only")
    found_eps = config.get("layer_norm_eps", 1e-12)
    if not isinstance(found_eps, (int, float)) or isinstance(found_eps, bool) or float(found_eps) != eps:
        messages.append(f"sets layer_norm_eps = {_describe(found_eps)}; the BERT source's LayerNorm uses "
                        f"{eps:g} (its EPS constant), so the outputs would differ")
    for flag, what in (("is_decoder", "a causal decoder"), ("add_cross_attention", "cross-attention layers")):
        if config.get(flag, False) is not False:
            messages.append(f"sets {flag} = {_describe(config[flag])}; the BERT source is a bidirectional "
                            f"encoder without {what}")
    return messages


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _describe(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return repr(value)
    return "a list" if isinstance(value, list) else "an object" if isinstance(value, dict) else type(value).__name__


# --------------------------------------------------------------------------- the entry


def _skeleton(name: str, repo: str, commit: str, config: _Config, config_file: Path,
              source: Manifest) -> HfManifest:
    """The manifest before its checkpoint is bound (no weights, no outputs yet)."""
    check = {"B": 1, "S": min(8, int(config.generics["MaxPositions"]))}
    if config.root == "MultipleChoice":
        check["C"] = 2
    return HfManifest(
        dir=cache_dir() / "hf" / _entry_name(repo), name=_entry_name(repo),
        title=f"{repo} ({config.architecture})",
        summary=f"Built by hf: from {repo}'s {CONFIG_JSON} at {commit[:12]}.",
        license="unknown", family="bert", tags=(), links={"huggingface": f"https://huggingface.co/{repo}"},
        source=SourceSpec(path=None, zoo=SOURCE_ENTRY, root=config.root, entry=ROOT_ENTRY[config.root]),
        generics=dict(config.generics), check=check, weights=None, package=source.package,
        repo=repo, commit=commit, architecture=config.architecture, labels=config.labels,
        config_file=config_file)


def _stored_float(index: dict[str, TensorInfo]) -> str:
    """The Linnet dtype the checkpoint stores its floats in, when config.json does not say."""
    stored = {info.dtype for info in index.values() if info.is_float}
    only = dtypes.from_safetensors(stored.pop()) if len(stored) == 1 else None
    return only.name if only is not None and only.linnet else "f32"


def _compiled_params(manifest: HfManifest) -> tuple[list[ParamSpec], tuple[str, ...]]:
    """The root's params and entries, through nest's compile cache (a warm load reads a pickle)."""
    from . import _compile, _compile_key

    compiled, program, _ = _compile(manifest, None, None, (), _compile_key(manifest, None, None, ()))
    return list(compiled.params), tuple(program.entries)


# --------------------------------------------------------------------------- bindings


def hf_key(param: str, prefix: str) -> str | None:
    """The key transformers stores a Linnet param under (new-style LayerNorm names)."""
    return BERT.key(param, prefix)


def checkpoint_prefix(index: dict[str, TensorInfo], architecture: str) -> str:
    """"bert." when the checkpoint's encoder keys carry it (every `BertFor*`), else ""."""
    if "bert." + WORD_EMBEDDINGS in index:
        return "bert."
    if WORD_EMBEDDINGS in index:
        return ""
    return "" if architecture == "BertModel" else "bert."


def bind(params: list[ParamSpec], index: dict[str, TensorInfo], *, name: str, architecture: str) -> dict[str, str]:
    """Linnet param -> checkpoint key for each param, in the spelling the checkpoint uses.

    A key the checkpoint lacks is an error here, naming every missing one, rather than a
    bindings.json complaint about a file the user never wrote.
    """
    prefix = checkpoint_prefix(index, architecture)
    bindings, missing = {}, []
    for param in params:
        key = hf_key(param.name, prefix)
        if key is None:
            raise InternalError(f"hf: has no Hugging Face key for the BERT source's param {param.name}")
        key = _spelling_in(index, key)
        if key not in index:
            missing.append((param.name, key))
        bindings[param.name] = key
    if missing:
        raise _missing_keys(name, architecture, missing, index)
    return bindings


def _spelling_in(index: dict[str, TensorInfo], key: str) -> str:
    """`key`, or its TF-era LayerNorm spelling (`gamma`/`beta`) when only that is stored."""
    for new, old in _OLD_NORM_NAMES.items():
        if key.endswith(new) and key not in index and key[: -len(new)] + old in index:
            return key[: -len(new)] + old
    return key


def _missing_keys(name: str, architecture: str, missing: list[tuple[str, str]],
                  index: dict[str, TensorInfo]) -> LinnetError:
    import difflib

    shown = ", ".join(key for _, key in missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
    notes = [Note(f"{architecture} stores param {param} as {key}") for param, key in missing[:3]]
    close = difflib.get_close_matches(missing[0][1], list(index), n=3, cutoff=0.6)
    if close:
        notes.append(Note(f"close keys in the checkpoint: {', '.join(close)}"))
    files = sorted({str(info.file) for info in index.values()})
    notes.append(Note(f"the checkpoint is {', '.join(files)}"))
    return error(codes.BINDING_MISSING_KEY,
                 f"{name}: the checkpoint lacks {len(missing)} tensor{'s' if len(missing) > 1 else ''} "
                 f"that {architecture} needs: {shown}", None, *notes)


def _check_tied_decoder(name: str, index: dict[str, TensorInfo], config: _Config, files: list[Path]) -> None:
    """The masked-LM decoder must be the word-embedding table, as the source ties them.

    transformers ties them too unless `tie_word_embeddings` is false; a checkpoint that
    stores a decoder anyway must then hold the very same values (compared byte for byte).
    """
    words = index.get(checkpoint_prefix(index, config.architecture) + WORD_EMBEDDINGS)
    decoder = index.get(MLM_DECODER)
    if decoder is None:
        if not config.tied_decoder:
            raise error(codes.HF_UNTIED_DECODER,
                        f"{name}: {CONFIG_JSON} sets tie_word_embeddings = false, but the checkpoint "
                        f"stores no {MLM_DECODER} to decode with; the BERT source's masked-LM head "
                        f"decodes with the word-embedding table")
        return
    if words is None:  # reported by the bindings already
        return
    if (decoder.shape, decoder.dtype) != (words.shape, words.dtype) or _tensor_bytes(decoder) != _tensor_bytes(words):
        raise error(codes.HF_UNTIED_DECODER,
                    f"{name}: the checkpoint's {MLM_DECODER} differs from its word embeddings "
                    f"{words.key}; the BERT source's masked-LM head decodes with the word-embedding "
                    f"table (tied, as BERT was trained), so it cannot run this checkpoint exactly",
                    None, Note(f"the checkpoint is {', '.join(map(str, files))}"))
    log.info("%s: %s equals the word embeddings (tied); bound once", name, MLM_DECODER)


def _tensor_bytes(info: TensorInfo) -> bytes:
    """One tensor's raw bytes, found through the file's header (already validated)."""
    with open(info.file, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        start, end = json.loads(f.read(length))[info.key]["data_offsets"]
        f.seek(8 + length + start)
        return f.read(end - start)


def _write_bindings(entry: str, commit: str, bindings: dict[str, str]) -> Path:
    """The generated bindings as a file (the loaders read bindings.json files), named by
    their content, so loads of different checkpoints never overwrite each other's."""
    text = json.dumps(bindings, indent=2) + "\n"
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    # A branch name may hold "/": only a commit names a folder as it is.
    folder = commit if COMMIT_ID.fullmatch(commit) else hashlib.sha256(commit.encode()).hexdigest()[:16]
    for root in (cache_dir() / "hf", Path(tempfile.gettempdir()) / "linnet-hf"):
        path = root / entry / folder / f"bindings-{digest}.json"
        try:
            if not (path.is_file() and path.read_text(encoding="utf-8") == text):
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
                tmp.write_text(text, encoding="utf-8")
                os.replace(tmp, path)
            return path
        except OSError:
            log.debug("cannot write %s", path, exc_info=True)
    raise error(codes.HF_BINDINGS_UNWRITABLE,
                f"cannot write the generated bindings of {entry} to {cache_dir() / 'hf'} or the "
                f"temporary folder")
