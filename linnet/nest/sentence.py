"""Sentence-transformers pipelines, read from the files their authors saved.

A folder that `SentenceTransformer.save` wrote holds `modules.json`, the modules in order:
a `Transformer` (the encoder, its checkpoint at its `path`, with `sentence_bert_config.json`),
then what turns token vectors into one sentence vector: `Pooling` (`1_Pooling/config.json`),
`Dense` layers (`2_Dense/config.json` and weights), `Normalize`.  Beside them,
`config_sentence_transformers.json` names the prompts and the similarity function.

`read_pipeline` reads and checks all of it into a `Pipeline`; every module or setting Linnet
cannot compute exactly is refused by name (`E1111`), a malformed file names itself (`E1112`).
`client_module` then writes the pipeline as Linnet: a root block holding the family's encoder
(`families.EncoderSpec`) and the Dense layers, whose `embed` entry pools, projects and
normalises with `std.nn.pooling`, so every backend and every exported graph computes the
whole pipeline, not only the encoder.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from .. import codes
from ..diagnostics import LinnetError, Note, error
from ..front.parser import parse_file
from ..diagnostics import SourceMap
from .manifest import MODULES_JSON

if TYPE_CHECKING:
    from .families import EncoderSpec
    from .hf import RepoFiles

SETTINGS_JSON = "config_sentence_transformers.json"
#: The Transformer module's settings, under the names sentence-transformers has written them.
TRANSFORMER_SETTINGS = ("sentence_bert_config.json", "sentence_roberta_config.json",
                        "sentence_distilbert_config.json", "sentence_camembert_config.json",
                        "sentence_albert_config.json", "sentence_xlm-roberta_config.json",
                        "sentence_xlnet_config.json")
TOKENIZER_CONFIG = "tokenizer_config.json"

#: The root block the pipeline's module defines, and the module's name.
ROOT = "SentenceEmbedder"
MODULE = "sentence_pipeline"

#: Pooling modes, in the order sentence-transformers concatenates its legacy flags.
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
_LEGACY_POOLING = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                   "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                   "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}
#: Each mode's std.nn.pooling function.
POOLING_FUNCTIONS = {"cls": "cls_token", "max": "max_tokens", "mean": "mean_tokens",
                     "mean_sqrt_len_tokens": "mean_sqrt_len_tokens", "weightedmean": "weighted_mean_tokens",
                     "lasttoken": "last_token"}
#: Dense activations (the torch.nn class sentence-transformers names) -> a Linnet call on `{}`.
ACTIVATIONS = {"Tanh": "tanh({})", "Identity": "{}", "ReLU": "maximum({}, 0.0)", "Sigmoid": "sigmoid({})",
               "GELU": "gelu_erf({})", "SiLU": "silu({})"}
#: The activation a Dense without `activation_function` applies (sentence-transformers' default).
DEFAULT_ACTIVATION = "torch.nn.modules.activation.Tanh"
SIMILARITIES = ("cosine", "dot", "euclidean", "manhattan")
#: What sentence-transformers calls the vector its modules pass along.
SENTENCE_EMBEDDING = "sentence_embedding"

#: The module classes Linnet runs, by class name (the last part of modules.json's `type`).
KNOWN_MODULES = ("Transformer", "Pooling", "Dense", "Normalize", "Dropout")
_TYPE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


# --------------------------------------------------------------------------- the pipeline


@dataclass(frozen=True)
class Pooling:
    path: str
    modes: tuple[str, ...]
    include_prompt: bool
    #: The width its config states (`embedding_dimension`), checked against the encoder's.
    stated_width: int | None = None


@dataclass(frozen=True)
class Dense:
    index: int
    path: str
    in_features: int
    out_features: int
    bias: bool
    activation: str      # a key of ACTIVATIONS
    residual: bool       # use_residual: the input (projected when the widths differ) added back

    @property
    def sub(self) -> str:
        return f"dense_{self.index}"

    @property
    def weights(self) -> str:
        return f"{self.path}/model.safetensors"


@dataclass(frozen=True)
class Normalize:
    path: str


@dataclass(frozen=True)
class Dropout:
    """Identity at inference, which is all Linnet's pipelines run."""

    path: str


@dataclass(frozen=True)
class Pipeline:
    """A sentence-transformers model as its files describe it, checked."""

    #: The Transformer module's folder in the repo ("" for the top).
    transformer_path: str
    #: Tokens per text, special tokens included (`max_seq_length`); None: the model's positions.
    max_seq_length: int | None
    #: Lower-case texts before tokenising, over what the tokenizer itself does.
    do_lower_case: bool
    modules: tuple[Pooling | Dense | Normalize | Dropout, ...]
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    similarity_fn_name: str = "cosine"
    #: Module descriptions for people, in order ("1 Pooling (mean)").
    summary: tuple[str, ...] = ()

    @property
    def pooling(self) -> Pooling:
        return next(m for m in self.modules if isinstance(m, Pooling))

    @property
    def dense(self) -> tuple[Dense, ...]:
        return tuple(m for m in self.modules if isinstance(m, Dense))

    @property
    def normalizes(self) -> bool:
        """Whether the pipeline's last vector-changing module is Normalize (unit vectors out)."""
        for module in reversed(self.modules):
            if isinstance(module, Normalize):
                return True
            if isinstance(module, (Dense, Pooling)):
                return False
        return False

    def weight_files(self) -> list[str]:
        return [dense.weights for dense in self.dense]

    def bindings(self) -> dict[str, str]:
        """Each Dense param -> its key, under its folder as `read_index` files it."""
        keys = {}
        for dense in self.dense:
            keys[f"{dense.sub}.weight"] = f"{dense.path}/linear.weight"
            if dense.bias:
                keys[f"{dense.sub}.bias"] = f"{dense.path}/linear.bias"
            if dense.residual and dense.in_features != dense.out_features:
                keys[f"{dense.sub}_residual.weight"] = f"{dense.path}/residual.weight"
        return keys


class _Files:
    """One sentence-transformers file read as JSON, with its problems named after it."""

    def __init__(self, repo: "RepoFiles", name: str):
        self.repo = repo
        self.name = name

    def read(self, filename: str, *, required: bool = True) -> Any:
        path = self.repo.find(filename, what="sentence-transformers file")
        if path is None:
            if required:
                raise self.bad(filename, "is missing")
            return None
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise self.bad(filename, f"cannot be read as JSON: {exc}") from None

    def object(self, filename: str, *, required: bool = True) -> dict | None:
        value = self.read(filename, required=required)
        if value is not None and not isinstance(value, dict):
            raise self.bad(filename, f"must hold a JSON object, found {_kind(value)}")
        return value

    def bad(self, filename: str, message: str) -> LinnetError:
        return error(codes.BAD_PIPELINE_FILE, f"{self.name}: {filename} {message}", None,
                     Note(f"in {self.repo.describe(filename)}"))

    def refuse(self, filename: str, message: str, *notes: Note) -> LinnetError:
        return error(codes.UNSUPPORTED_PIPELINE_MODULE, f"{self.name}: {filename} {message}", None,
                     Note(f"in {self.repo.describe(filename)}"), *notes)


def read_pipeline(repo: "RepoFiles", name: str) -> Pipeline | None:
    """The repo's sentence-transformers pipeline, or None when it has no modules.json.

    Only the modules' own files are read here; the encoder's width and positions are checked
    against it by `check_widths` once config.json has been read.
    """
    files = _Files(repo, name)
    listed = files.read(MODULES_JSON, required=False)
    if listed is None:
        return None
    entries = _module_entries(files, listed)
    transformer_path = entries[0][1]
    max_seq_length, do_lower_case = _transformer_settings(files, transformer_path)
    modules, summary = [], [f"0 Transformer ({transformer_path or 'the top folder'})"]
    for index, (kind, path) in enumerate(entries[1:], start=1):
        module = _read_module(files, index, kind, path)
        modules.append(module)
        summary.append(f"{index} {_describe_module(module)}")
    if not any(isinstance(m, Pooling) for m in modules):
        raise files.refuse(MODULES_JSON, "has no Pooling module after its Transformer; without one there is no "
                                         "sentence vector, only token vectors")
    if any(isinstance(m, (Dense, Normalize)) for m in modules[:next(i for i, m in enumerate(modules)
                                                                  if isinstance(m, Pooling))]):
        raise files.refuse(MODULES_JSON, "has a Dense or Normalize module before its Pooling; Linnet runs them "
                                         "on the pooled sentence vector only")
    if sum(isinstance(m, Pooling) for m in modules) > 1:
        raise files.refuse(MODULES_JSON, "has more than one Pooling module")
    prompts, default_prompt, similarity = _settings(files)
    return Pipeline(transformer_path, max_seq_length, do_lower_case, tuple(modules), prompts, default_prompt,
                    similarity, tuple(summary))


def _module_entries(files: _Files, listed: Any) -> list[tuple[str, str]]:
    """(class name, folder) of each module, checked: Linnet's kinds only, the Transformer first."""
    if not (isinstance(listed, list) and listed):
        raise files.bad(MODULES_JSON, f"must hold a non-empty list of modules, found {_kind(listed)}")
    entries = []
    for position, entry in enumerate(listed):
        if not (isinstance(entry, dict) and isinstance(entry.get("type"), str) and _TYPE.fullmatch(entry["type"])
                and isinstance(entry.get("path", ""), str)):
            raise files.bad(MODULES_JSON, f"module {position} must be an object with a `type` (a Python class "
                                          f"path) and a `path` (its folder), found {_kind(entry)}")
        path = entry.get("path", "").strip("/")
        if path.startswith(".") or "\\" in path or ".." in PurePosixPath(path).parts:
            raise files.bad(MODULES_JSON, f"module {position} has path {path!r}, which leaves the model folder")
        kind = entry["type"]
        cls = kind.rsplit(".", 1)[-1]
        if not kind.startswith("sentence_transformers.") or cls not in KNOWN_MODULES:
            raise files.refuse(MODULES_JSON, f"lists module {position} of type {kind}, which Linnet cannot run",
                               Note(f"Linnet runs the sentence-transformers modules {', '.join(KNOWN_MODULES)}; "
                                    f"others (a custom class, CNN, LSTM, WordWeights, WordEmbeddings, BoW, "
                                    f"StaticEmbedding, Router, ...) are refused rather than skipped"))
        entries.append((cls, path))
    if entries[0][0] != "Transformer" or any(cls == "Transformer" for cls, _ in entries[1:]):
        raise files.refuse(MODULES_JSON, "must start with its one Transformer module (the encoder), found "
                                         f"{', '.join(cls for cls, _ in entries)}")
    return entries


def _in(path: str, filename: str) -> str:
    return f"{path}/{filename}" if path else filename


def _transformer_settings(files: _Files, path: str) -> tuple[int | None, bool]:
    """`max_seq_length` and `do_lower_case` of the Transformer module, as sentence-transformers
    reads them: its settings file first; else the tokenizer's own `model_max_length` (capped
    by the model's positions later, in `check_widths`)."""
    settings, found = {}, None
    for candidate in TRANSFORMER_SETTINGS:
        settings = files.object(_in(path, candidate), required=False)
        if settings is not None:
            found = candidate
            break
    settings = settings or {}
    where = _in(path, found or TRANSFORMER_SETTINGS[0])
    task = settings.get("transformer_task", "feature-extraction")
    if task != "feature-extraction":
        raise files.refuse(where, f"sets transformer_task = {task!r}; Linnet pools the encoder's token vectors "
                                  f"(\"feature-extraction\") only")
    text = (settings.get("modality_config") or {}).get("text", {"method": "forward",
                                                                "method_output_name": "last_hidden_state"})
    if not isinstance(text, dict) or text.get("method", "forward") != "forward" or \
            text.get("method_output_name", "last_hidden_state") != "last_hidden_state":
        raise files.refuse(where, f"pools {text!r} of the encoder; Linnet pools its last hidden state only")
    other = sorted(set((settings.get("modality_config") or {})) - {"text"})
    if other:
        raise files.refuse(where, f"takes modalities {', '.join(other)} besides text; Linnet embeds text only")
    if settings.get("module_output_name", "token_embeddings") != "token_embeddings":
        raise files.refuse(where, f"names its output {settings['module_output_name']!r}; Linnet pools "
                                  f"\"token_embeddings\"")
    if settings.get("processing_kwargs"):
        raise files.refuse(where, "sets processing_kwargs, per-call tokenizer settings Linnet does not apply")
    processor = settings.get("processor_kwargs", settings.get("tokenizer_args")) or {}
    length = settings.get("max_seq_length")
    if isinstance(processor, dict) and "model_max_length" in processor:
        length = processor["model_max_length"]
    elif length is None:
        tokenizer = files.object(_in(path, TOKENIZER_CONFIG), required=False) or {}
        length = tokenizer.get("model_max_length")
        length = -length if _is_count(length) else None  # negative: the tokenizer's, still to cap
    if length is not None and not _is_count(abs(length) if isinstance(length, int) else length):
        raise files.bad(where, f"has max_seq_length {length!r}; it must be a positive integer")
    lower = settings.get("do_lower_case", False)
    if not isinstance(lower, bool):
        raise files.bad(where, f"has do_lower_case {lower!r}; it must be true or false")
    return length, lower


def _read_module(files: _Files, index: int, kind: str, path: str):
    config_file = _in(path, "config.json")
    if kind == "Pooling":
        return _pooling(files, config_file, path)
    if kind == "Dense":
        return _dense(files, config_file, index, path)
    config = files.object(config_file, required=False) or {}
    for key in ("module_input_name", "module_output_name"):
        if config.get(key, SENTENCE_EMBEDDING) != SENTENCE_EMBEDDING:
            raise files.refuse(config_file, f"{kind} reads or writes {config[key]!r}; Linnet's pipelines pass "
                                            f"the sentence vector (\"{SENTENCE_EMBEDDING}\") from module to module")
    return Normalize(path) if kind == "Normalize" else Dropout(path)


def _pooling(files: _Files, config_file: str, path: str) -> Pooling:
    config = dict(files.object(config_file))
    known = {"embedding_dimension", "word_embedding_dimension", "pooling_mode", "include_prompt", *_LEGACY_POOLING}
    unknown = sorted(set(config) - known)
    if unknown:
        raise files.refuse(config_file, f"sets {', '.join(unknown)}, which Linnet's Pooling does not know; "
                                        f"refused rather than ignored")
    modes = config.get("pooling_mode")
    if modes is None:  # the legacy form: one flag per mode, mean when none is set
        modes = tuple(mode for key, mode in _LEGACY_POOLING.items() if config.get(key) is True) or ("mean",)
    elif isinstance(modes, str):
        modes = (modes,)
    elif isinstance(modes, list) and modes and all(isinstance(m, str) for m in modes):
        modes = tuple(modes)
    else:
        raise files.bad(config_file, f"has pooling_mode {modes!r}; it must be a mode name or a list of them")
    wrong = [m for m in modes if m not in POOLING_MODES]
    if wrong:
        raise files.refuse(config_file, f"asks for pooling mode {wrong[0]!r}; the modes are "
                                        f"{', '.join(POOLING_MODES)}")
    include = config.get("include_prompt", True)
    if not isinstance(include, bool):
        raise files.bad(config_file, f"has include_prompt {include!r}; it must be true or false")
    width = config.get("embedding_dimension", config.get("word_embedding_dimension"))
    if width is not None and not _is_count(width):
        raise files.bad(config_file, f"has embedding_dimension {width!r}; it must be a positive integer")
    return Pooling(path, modes, include, width)


def _dense(files: _Files, config_file: str, index: int, path: str) -> Dense:
    config = files.object(config_file)
    known = {"in_features", "out_features", "bias", "activation_function", "module_input_name",
             "module_output_name", "use_residual"}
    unknown = sorted(set(config) - known)
    if unknown:
        raise files.refuse(config_file, f"sets {', '.join(unknown)}, which Linnet's Dense does not know; "
                                        f"refused rather than ignored")
    sizes = {key: config.get(key) for key in ("in_features", "out_features")}
    for key, value in sizes.items():
        if not _is_count(value):
            raise files.bad(config_file, f"has {key} {value!r}; it must be a positive integer")
    for key in ("bias", "use_residual"):
        if not isinstance(config.get(key, key == "bias"), bool):
            raise files.bad(config_file, f"has {key} {config[key]!r}; it must be true or false")
    for key in ("module_input_name", "module_output_name"):
        if config.get(key, SENTENCE_EMBEDDING) not in (SENTENCE_EMBEDDING, None):
            raise files.refuse(config_file, f"Dense reads or writes {config[key]!r}; Linnet's pipelines pass the "
                                            f"sentence vector (\"{SENTENCE_EMBEDDING}\") from module to module")
    function = config.get("activation_function") or DEFAULT_ACTIVATION
    cls = function.rsplit(".", 1)[-1] if isinstance(function, str) else None
    if not (isinstance(function, str) and function.startswith("torch.") and cls in ACTIVATIONS):
        raise files.refuse(config_file, f"applies activation_function {function!r}, which Linnet does not compute",
                           Note(f"Linnet's Dense applies torch.nn's {', '.join(ACTIVATIONS)}; sentence-transformers "
                                f"itself replaces a class outside torch with Tanh unless trust_remote_code is set"))
    weights = files.repo.find(f"{path}/model.safetensors", what="Dense weights")
    if weights is None:
        pickled = files.repo.find(f"{path}/pytorch_model.bin", what="Dense weights")
        raise files.bad(f"{path}/model.safetensors",
                        "is missing" + (" (the folder holds only pytorch_model.bin, a pickle, which Linnet never "
                                        "loads: save the model again with safe_serialization)" if pickled else ""))
    return Dense(index, path, sizes["in_features"], sizes["out_features"], config.get("bias", True), cls,
                 config.get("use_residual", False))


def _settings(files: _Files) -> tuple[dict[str, str], str | None, str]:
    config = files.object(SETTINGS_JSON, required=False) or {}
    kind = config.get("model_type", "SentenceTransformer")
    if kind != "SentenceTransformer":
        raise files.refuse(SETTINGS_JSON, f"describes a {kind}, not a SentenceTransformer; Linnet embeds with "
                                          f"dense sentence encoders only")
    prompts = config.get("prompts") or {}
    if not (isinstance(prompts, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items())):
        raise files.bad(SETTINGS_JSON, f"has prompts {_kind(prompts)}; they must map names to strings")
    default = config.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise files.bad(SETTINGS_JSON, f"has default_prompt_name {default!r}, which is not one of its prompts "
                                       f"({', '.join(map(repr, prompts)) or 'none'})")
    similarity = config.get("similarity_fn_name") or "cosine"
    if similarity not in SIMILARITIES:
        raise files.refuse(SETTINGS_JSON, f"names similarity_fn_name {similarity!r}; Linnet computes "
                                          f"{', '.join(SIMILARITIES)}")
    return dict(prompts), default, similarity


def check_widths(pipeline: Pipeline, repo: "RepoFiles", name: str, width: int, positions: int) -> Pipeline:
    """The modules' widths checked against the encoder's (`width`, config.json's hidden size)
    and each other's; the tokenizer's length capped at the model's positions, as
    sentence-transformers caps it."""
    files = _Files(repo, name)
    current, modules = width, []
    for module in pipeline.modules:
        if isinstance(module, Pooling):
            if module.stated_width is not None and module.stated_width != width:
                raise files.bad(_in(module.path, "config.json"),
                                f"has embedding_dimension {module.stated_width}, but the encoder's token vectors "
                                f"are {width} wide")
            current = width * len(module.modes)
        elif isinstance(module, Dense):
            if module.in_features != current:
                raise files.bad(_in(module.path, "config.json"),
                                f"has in_features {module.in_features}, but the vector reaching it is {current} wide")
            current = module.out_features
        modules.append(module)
    length = pipeline.max_seq_length
    if length is not None and length < 0:
        length = min(-length, positions)
    return Pipeline(pipeline.transformer_path, length, pipeline.do_lower_case, tuple(modules), pipeline.prompts,
                    pipeline.default_prompt_name, pipeline.similarity_fn_name, pipeline.summary)


# --------------------------------------------------------------------------- as Linnet


@dataclass(frozen=True)
class BlockHeader:
    """A block's generic parameters and where clauses, as written in its source."""

    generics: tuple[str, ...]       # "D: Dim", "T: Float = f32"
    names: tuple[str, ...]
    where: tuple[str, ...]          # "D % Heads == 0"


_headers: dict[tuple[str, int, int], BlockHeader] = {}


def block_header(source: Path, block: str) -> BlockHeader:
    """The generics and where clauses of `block` in `source`, copied from its text (parsed
    once per file version in a process)."""
    stat = source.stat()
    key = (f"{source.resolve()}#{block}", stat.st_size, stat.st_mtime_ns)
    if key not in _headers:
        text = source.read_text(encoding="utf-8")
        tree = parse_file(source, SourceMap(), str(source))
        found = next((item for item in tree.items if getattr(item, "name", None) == block
                      and hasattr(item, "generics")), None)
        if found is None:
            raise error(codes.BAD_SOURCE, f"{source} defines no block `{block}`, which sentence-transformers "
                                          f"pipelines of this family pool")
        lines = text.splitlines()
        _headers[key] = BlockHeader(tuple(_span_text(lines, g.span) for g in found.generics),
                                    tuple(g.name for g in found.generics),
                                    tuple(_span_text(lines, c.span) for c in found.where))
    return _headers[key]


def _span_text(lines: list[str], span) -> str:
    if span.line == span.end_line:
        return lines[span.line - 1][span.col - 1:span.end_col - 1]
    parts = [lines[span.line - 1][span.col - 1:], *lines[span.line:span.end_line - 1],
             lines[span.end_line - 1][:span.end_col - 1]]
    return " ".join(part.strip() for part in parts)


def client_module(pipeline: Pipeline, encoder: "EncoderSpec", package: str, header: BlockHeader,
                  name: str, width: int) -> str:
    """The pipeline as a Linnet module: `SentenceEmbedder` over the family's encoder block,
    whose token vectors are `width` wide."""
    in_widths, result = _widths(pipeline, encoder, width)
    subs = [f"    sub {encoder.sub}: {encoder.block}<{', '.join(header.names)}>"]
    for dense in pipeline.dense:
        out = _widths(Pipeline("", None, False, (dense,)), encoder, width)[1]
        subs.append(f"    sub {dense.sub}: {_linear(dense)}<{in_widths[dense.index]}, {out}, T>")
        if dense.residual and dense.in_features != dense.out_features:
            subs.append(f"    sub {dense.sub}_residual: LinearNoBias<{in_widths[dense.index]}, {out}, T>")
    inputs = [f"{arg}: Tensor[B, S; i32]" + (f" = {default}" if default else "") for arg, default in encoder.inputs]
    call = ", ".join(arg for arg, _ in encoder.inputs)
    pooling = pipeline.pooling
    embed_inputs = inputs + (["prompt_length: Tensor[B; i32] = zeros"] if not pooling.include_prompt else [])
    uses = sorted({POOLING_FUNCTIONS[m] for m in pooling.modes}
                  | ({"normalize"} if any(isinstance(m, Normalize) for m in pipeline.modules) else set())
                  | ({"without_prompt"} if not pooling.include_prompt else set()))
    activations = sorted({_STD_ACTIVATIONS[d.activation] for d in pipeline.dense if d.activation in _STD_ACTIVATIONS})
    linears = sorted({_linear(d) for d in pipeline.dense}
                     | ({"LinearNoBias"} if any(d.residual and d.in_features != d.out_features
                                                for d in pipeline.dense) else set()))
    lines = [
        f"// The sentence-transformers pipeline of {_comment(name)}, as its modules.json lists it:",
        *(f"//   {_comment(line)}" for line in pipeline.summary),
        "// Written by linnet.nest.sentence on every load; edits here are lost.",
        f"module {MODULE}",
        "",
        f"use {package}::{{{encoder.block}}}",
        *([f"use std.nn.activations::{{{', '.join(activations)}}}"] if activations else []),
        *([f"use std.nn.linear::{{{', '.join(linears)}}}"] if linears else []),
        f"use std.nn.pooling::{{{', '.join(uses)}}}",
        "",
        f"pub block {ROOT}<",
        *(f"    {generic}," for generic in header.generics),
        ">",
        *(["where", ",\n".join(f"    {clause}" for clause in header.where)] if header.where else []),
        "{",
        *subs,
        "",
        # `embed` first: what the model is for, and what an export serves by default.
        f"    // The sentence embedding: modules 1 to {len(pipeline.modules)} over the Transformer's token vectors.",
        "    pub entry embed<B: Dim, S: Dim>(",
        *(f"        {item}," for item in embed_inputs),
        f"    ) -> Tensor[B, {result}; T]",
        f"    where S <= {encoder.positions} {{",
        *(f"        {line}" for line in _embed_body(pipeline, encoder, call)),
        "    }",
        "",
        "    // Module 0, the Transformer: one vector per token.",
        "    pub entry forward<B: Dim, S: Dim>(",
        *(f"        {item}," for item in inputs),
        f"    ) -> Tensor[B, S, {encoder.width}; T]",
        f"    where S <= {encoder.positions} {{",
        f"        return {encoder.sub}.{encoder.function}({call})",
        "    }",
        "}",
    ]
    return "\n".join(lines) + "\n"


#: Dense activations written with a std.nn.activations function, which the module imports.
_STD_ACTIVATIONS = {"GELU": "gelu_erf", "SiLU": "silu"}


def _widths(pipeline: Pipeline, encoder: "EncoderSpec", width: int) -> tuple[dict[int, str], str]:
    """Each Dense's input width as a Linnet dim expression, and the pipeline's result width.

    A width that is a multiple of the encoder's (`width`, the value of the generic
    `encoder.width`) is written through that generic (`D`, `3 * D`), so the checker sees a
    residual add of a [B, D] input to a [B, D] output as the same shape; others are numbers.
    """
    def expression(size: int) -> str:
        if size % width:
            return str(size)
        return encoder.width if size == width else f"{size // width} * {encoder.width}"

    current, inputs = encoder.width, {}
    for module in pipeline.modules:
        if isinstance(module, Pooling):
            current = expression(width * len(module.modes))
        elif isinstance(module, Dense):
            inputs[module.index] = current
            current = expression(module.out_features)
    return inputs, current


def _embed_body(pipeline: Pipeline, encoder: "EncoderSpec", call: str) -> list[str]:
    mask = encoder.mask
    lines = [f"let tokens_out = {encoder.sub}.{encoder.function}({call})"]
    pooled_mask = mask
    if not pipeline.pooling.include_prompt:
        lines.append(f"let pooled_mask = without_prompt({mask}, prompt_length)   // include_prompt = false")
        pooled_mask = "pooled_mask"
    value = "tokens_out"
    for index, module in enumerate(pipeline.modules, start=1):
        target = f"x{index}"
        if isinstance(module, Pooling):
            calls = [f"{POOLING_FUNCTIONS[m]}(tokens_out, {pooled_mask}" + (f", {mask})" if m == "weightedmean" else ")")
                     for m in module.modes]
            expression = calls[0]
            for other in calls[1:]:
                expression = f"concat({expression}, {other}, 1)"
            lines.append(f"let {target} = {expression}   // {index} Pooling ({', '.join(module.modes)})")
        elif isinstance(module, Dense):
            projected = ACTIVATIONS[module.activation].format(f"{module.sub}.forward({value})")
            if module.residual:
                projected += (f" + {value}" if module.in_features == module.out_features
                              else f" + {module.sub}_residual.forward({value})")
            lines.append(f"let {target} = {projected}   // {index} Dense ({module.activation})")
        elif isinstance(module, Normalize):
            lines.append(f"let {target} = normalize({value})   // {index} Normalize")
        else:
            lines.append(f"let {target} = {value}   // {index} Dropout: the identity at inference")
        value = target
    lines.append(f"return {value}")
    return lines


def _linear(dense: Dense) -> str:
    return "Linear" if dense.bias else "LinearNoBias"


def _describe_module(module) -> str:
    if isinstance(module, Pooling):
        return f"Pooling ({', '.join(module.modes)}{'' if module.include_prompt else ', prompt excluded'})"
    if isinstance(module, Dense):
        extra = ("" if module.bias else ", no bias") + (", residual" if module.residual else "")
        return f"Dense ({module.in_features} -> {module.out_features}, {module.activation}{extra})"
    return type(module).__name__


def _comment(text: str) -> str:
    """Text safe inside a `//` comment: one line, printable."""
    return "".join(c if c.isprintable() else "?" for c in text.replace("\n", " "))[:200]


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _kind(value: Any) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return json.dumps(value) if isinstance(value, (str, int, float, bool)) or value is None else type(value).__name__
