"""`nest.load("hf:owner/name")` and `nest.load("./folder")`: a zoo entry made on the spot from a
model saved by transformers or sentence-transformers.

What a zoo entry writes down by hand, this module reads from the repo (a Hub repo through the
Hugging Face cache, or a local folder laid out the same way), as transformers'
`from_pretrained` and sentence-transformers' constructor do:

1. `modules.json`, when there is one, is a sentence-transformers pipeline
   (`linnet.nest.sentence`): its Transformer module says where the encoder lives, and the
   modules after it become a Linnet root block of their own, compiled with the family's source.
2. `config.json` names the family (`model_type`, `linnet.nest.families`), which transformers
   class the checkpoint is for (`architectures[0]`, the root block) and its sizes (the
   root's generics).  What the family's source cannot compute exactly is refused by name.
3. The checkpoint (`model.safetensors`, or the shards its index names, plus each Dense
   module's weights) is indexed from its headers, and each Linnet param bound to its key in
   the family's layout, in whichever spelling the checkpoint uses.
4. The result is an `HfManifest` over the family's zoo source, with the generated bindings
   written once to the Linnet cache; `nest.load` treats it like any other entry, so every
   backend runs it and `verify_bindings` still checks every shape.
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

from .. import codes, dtypes
from ..backends import cache_dir
from ..diagnostics import InternalError, LinnetError, Note, error
from ..middle.params import ParamSpec
from . import sentence
from .families import CONFIG_JSON, ConfigReader, Family, FamilyConfig, describe, family_for
from .manifest import (COMMIT_ID, FOLDER_MARKERS, Manifest, SourceSpec, TokenizerSpec, WeightsSpec, holds_saved_model,
                       load_manifest)
from .sentence import Pipeline
from .hub import CHECKPOINT_INSTEAD
from .weights import TensorInfo, checkpoint_files, fetch_file, read_index

#: The codes of the hf stage, with what they mean (a view of the registry in linnet/codes.py).
CODES = codes.summaries("hf")

log = logging.getLogger("linnet.nest")

PREFIX = "hf:"
SINGLE_FILE = "model.safetensors"
SHARD_INDEX = "model.safetensors.index.json"
PICKLE_FILES = ("pytorch_model.bin", "model.pt", "pytorch_model.bin.index.json")

_REPO_ID = re.compile(r"(?:[A-Za-z0-9][A-Za-z0-9._-]*/)?[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class HfManifest(Manifest):
    """A manifest made from a Hugging Face repo or a folder rather than read from a nest.toml."""

    repo: str = ""
    commit: str = ""          # the revision's commit when the cache tells it, else the revision
    architecture: str = ""    # config.json's architectures[0]
    #: What each logit means, by index (config.json `id2label`); None for roots without labels.
    labels: tuple[str, ...] | None = None
    config_file: Path | None = None
    #: The sentence-transformers pipeline the root block computes, when the repo has one.
    pipeline: Pipeline | None = None
    #: The local folder the config and tokenizer files were read from.
    local_files: Path | None = None


# --------------------------------------------------------------------------- the repo's files


class RepoFiles:
    """The files of one saved model: a Hub repo at a revision, or a local folder."""

    label: str

    def find(self, name: str, *, what: str = "file") -> Path | None:
        """The local path of `name` (a path inside the repo), or None when there is none."""
        raise NotImplementedError

    def require(self, name: str, *, what: str, instead: str) -> Path:
        raise NotImplementedError

    def describe(self, name: str) -> str:
        """Where `name` is, for messages."""
        raise NotImplementedError


class HubFiles(RepoFiles):
    def __init__(self, repo: str, revision: str):
        self.repo, self.revision, self.label = repo, revision, f"{PREFIX}{repo}"

    def find(self, name: str, *, what: str = "file") -> Path | None:
        try:
            return fetch_file(self.repo, name, self.revision, what=what)
        except LinnetError:
            return None

    def require(self, name: str, *, what: str, instead: str) -> Path:
        return fetch_file(self.repo, name, self.revision, what=what, instead=instead)

    def describe(self, name: str) -> str:
        return f"{self.repo}/{name} at {self.revision[:12]}"


class FolderFiles(RepoFiles):
    def __init__(self, folder: Path):
        self.folder, self.label = folder, str(folder)

    def find(self, name: str, *, what: str = "file") -> Path | None:
        path = self.folder / name
        return path if path.is_file() else None

    def require(self, name: str, *, what: str, instead: str) -> Path:
        path = self.find(name)
        if path is None:
            raise error(codes.NOT_A_MODEL_FOLDER, f"folder {self.folder} has no {name} ({what})", None, Note(instead))
        return path

    def describe(self, name: str) -> str:
        return str(self.folder / name)


# --------------------------------------------------------------------------- entry points


def hf_manifest(name: str, *, revision: str | None = None, weights: str | Path | None = None) -> HfManifest:
    """The entry `nest.load(name)` runs for `name` = "hf:owner/repo", its bindings generated.

    weights: local .safetensors file(s) to bind instead of the repo's checkpoint (the config
    still comes from the repo).
    """
    repo = _repo_id(name)
    files = HubFiles(repo, revision or "main")
    return _build(files, name, weights=weights, repo=repo)


def folder_manifest(folder: str | Path, *, weights: str | Path | None = None) -> HfManifest:
    """The entry `nest.load(folder)` runs for a folder that transformers' `save_pretrained` or
    sentence-transformers' `save` wrote (or `nest.save`): read exactly as `hf:` reads a repo."""
    folder = Path(folder).resolve()
    if not holds_saved_model(folder):
        raise not_a_model_folder(folder)
    return _build(FolderFiles(folder), str(folder), weights=weights, repo="")


def not_a_model_folder(folder: Path) -> LinnetError:
    return error(codes.NOT_A_MODEL_FOLDER,
                 f"folder {folder} is not a model: it holds none of {', '.join(FOLDER_MARKERS)}", None,
                 Note("nest.toml makes a folder a zoo entry; config.json (transformers' save_pretrained) or "
                      "modules.json (sentence-transformers' save) makes it a saved model"))


def _build(files: RepoFiles, name: str, *, weights: str | Path | None, repo: str) -> HfManifest:
    pipeline = sentence.read_pipeline(files, name)
    base = pipeline.transformer_path if pipeline else ""
    instead = (f"the model is built from its {CONFIG_JSON}, so it must be in the Hugging Face cache or "
               f"downloadable" if isinstance(files, HubFiles) else
               f"a folder saved by transformers' save_pretrained holds {CONFIG_JSON} beside the weights")
    config_file = files.require(_join(base, CONFIG_JSON), what="config file", instead=instead)
    if isinstance(files, HubFiles):
        files.revision = commit = _snapshot_commit(config_file, files.revision, base)
    else:
        commit = _folder_digest(files.folder)
    config = _config_object(config_file, name)
    note = Note(f"the file is {config_file}")
    if "model_type" not in config:
        raise error(codes.HF_CONFIG_FIELD, f"{name}: {CONFIG_JSON} has no `model_type`, which names the model "
                                           f"family", None, note)
    family = family_for(config["model_type"], name, note)
    architecture, root = _architecture(config, family, name, note)
    reader = ConfigReader(config, name, config_file, family)
    found = family.read_config(reader, architecture, root)
    reader.finish()
    source = load_manifest(family.source_entry)
    client = None
    if pipeline is not None:
        pipeline, found, client = _pipeline_root(pipeline, family, found, files, name, source)
    manifest = _skeleton(name, files, repo, commit, family, found, config_file, source, client)
    checkpoint, stored_names = _checkpoint(manifest, files, base, weights)
    if pipeline is not None and weights is None:
        checkpoint += [files.require(dense_file, what="Dense weights", instead="")
                       for dense_file in pipeline.weight_files()]
        stored_names += pipeline.weight_files()
    index = read_index(checkpoint, stored_names)
    if "T" not in found.generics:
        manifest = replace(manifest, generics={**manifest.generics, "T": _stored_float(index)})
    params, entries = _compiled_params(manifest)
    prefix = family.key_prefix(index, architecture, namespace=_join(base, "") if base else "")
    bindings = bind(params, index, family, prefix, name=name, architecture=architecture,
                    extra=pipeline.bindings() if pipeline else None)
    family.check_checkpoint(name, index, found, checkpoint, prefix)
    bindings_file = _write_bindings(manifest.name, commit, bindings)
    spec = WeightsSpec(repo=repo, revision=commit, files=tuple(stored_names), bindings=bindings_file, sha256={})
    local = config_file.parent
    tokenizer = _tokenizer_spec(family.tokenizer(_Scoped(files, base), found), pipeline)
    outputs = {**family.outputs, "embed": "embedding"} if pipeline else family.outputs
    return replace(manifest, dir=bindings_file.parent, weights=spec, tokenizer=tokenizer,
                   image=family.image(_Scoped(files, base), found), generation=found.generation,
                   outputs={entry: outputs[entry] for entry in entries if entry in outputs},
                   pipeline=pipeline, local_files=local)


class _Scoped(RepoFiles):
    """The files below one folder of a repo (a sentence-transformers Transformer module's)."""

    def __init__(self, files: RepoFiles, base: str):
        self.files, self.base, self.label = files, base, files.label

    def find(self, name: str, *, what: str = "file") -> Path | None:
        return self.files.find(_join(self.base, name), what=what)

    def require(self, name: str, *, what: str, instead: str) -> Path:
        return self.files.require(_join(self.base, name), what=what, instead=instead)

    def describe(self, name: str) -> str:
        return self.files.describe(_join(self.base, name))


def _join(base: str, name: str) -> str:
    return f"{base}/{name}" if base else name


def _tokenizer_spec(found: TokenizerSpec | None, pipeline: Pipeline | None) -> TokenizerSpec | None:
    """The family's tokenizer with the pipeline's length and casing (sentence_bert_config.json)."""
    if found is None or pipeline is None:
        return found
    lowercase = True if pipeline.do_lower_case else found.lowercase
    return replace(found, lowercase=lowercase, max_length=pipeline.max_seq_length)


def _pipeline_root(pipeline: Pipeline, family: Family, found: FamilyConfig, files: RepoFiles, name: str,
                   source: Manifest):
    """The pipeline checked against the encoder, and the Linnet module computing it."""
    if family.encoder is None:
        raise error(codes.UNSUPPORTED_PIPELINE_MODULE,
                    f"{name}: {sentence.MODULES_JSON} pools a {family.title} model, whose Linnet source has no "
                    f"text encoder for a sentence-transformers pipeline", None,
                    Note(f"in {files.describe(sentence.MODULES_JSON)}"))
    encoder = family.encoder
    pipeline = sentence.check_widths(pipeline, files, name, int(found.generics[encoder.width]),
                                     int(found.generics[encoder.positions]))
    header = sentence.block_header(source.source_file(), encoder.block)
    generics = {k: v for k, v in found.generics.items() if k in header.names}
    text = sentence.client_module(pipeline, encoder, source.package.name, header, name,
                                  int(found.generics[encoder.width]))
    client = _write_generated(_entry_name(files), "sentence_pipeline.linnet", text)
    return pipeline, replace(found, root=sentence.ROOT, generics=generics, labels=None), client


# --------------------------------------------------------------------------- names and files


def _repo_id(name: str) -> str:
    repo = name[len(PREFIX):]
    if not _REPO_ID.fullmatch(repo) or ".." in repo or len(repo) > 96:
        raise error(codes.BAD_HF_NAME, f"{name!r} is not a Hugging Face model name: expected \"hf:owner/name\", "
                                       f"such as \"hf:google-bert/bert-base-uncased\"")
    return repo


def _entry_name(files: RepoFiles) -> str:
    """A plain name for cache files, like the Hub cache's own `models--owner--name`."""
    if isinstance(files, HubFiles):
        return "hf--" + files.repo.replace("/", "--")
    folder = files.folder
    stem = re.sub(r"[^A-Za-z0-9._-]", "-", folder.name)[:60] or "folder"
    return f"folder--{stem}--{hashlib.sha256(str(folder).encode()).hexdigest()[:8]}"


def _snapshot_commit(file: Path, revision: str, base: str) -> str:
    """The commit the cache filed `file` under (`.../snapshots/<commit>/config.json`)."""
    folder = file.parent
    for _ in range(len(Path(base).parts) if base else 0):
        folder = folder.parent
    return folder.name if COMMIT_ID.fullmatch(folder.name) else revision


def _folder_digest(folder: Path) -> str:
    """A name for one state of a local folder: its path and its files' sizes and times."""
    digest = hashlib.sha256(str(folder).encode())
    for file in sorted(folder.rglob("*")):
        if file.is_file():
            stat = file.stat()
            digest.update(f"{file.relative_to(folder)}:{stat.st_size}:{stat.st_mtime_ns}\0".encode())
    return digest.hexdigest()[:16]


def _checkpoint(manifest: HfManifest, files: RepoFiles, base: str,
                weights: str | Path | None) -> tuple[list[Path], list[str]]:
    """The encoder checkpoint's local files, and their names in the repo (or in the weights= folder)."""
    if weights is not None:
        found = checkpoint_files(manifest, weights=weights)
        return found, [file.name for file in found]
    try:
        return [files.require(_join(base, SINGLE_FILE), what="checkpoint", instead=CHECKPOINT_INSTEAD)], \
            [_join(base, SINGLE_FILE)]
    except LinnetError as single:
        index_file = files.find(_join(base, SHARD_INDEX), what="checkpoint")
        if index_file is None:
            pickles = [name for name in PICKLE_FILES if files.find(_join(base, name), what="checkpoint")]
            first = single.diagnostics[0]
            raise LinnetError(first.with_note(
                f"nor is {SHARD_INDEX} (a sharded checkpoint); Linnet reads safetensors only, never pickle "
                f"files such as pytorch_model.bin" + (f" (this model has {', '.join(pickles)})" if pickles else "")
            )) from None
    names = [_join(base, shard) for shard in _shard_names(index_file, manifest.name)]
    return [files.require(shard, what="checkpoint shard", instead="") for shard in names], names


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


def _config_object(path: Path, name: str) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise error(codes.HF_CONFIG_NOT_OBJECT, f"{name}: {CONFIG_JSON} cannot be read as JSON: {exc}", None,
                    Note(f"the file is {path}")) from None
    if not isinstance(config, dict):
        raise error(codes.HF_CONFIG_NOT_OBJECT,
                    f"{name}: {CONFIG_JSON} must hold a JSON object, found {describe(config)}",
                    None, Note(f"the file is {path}"))
    return config


def _architecture(config: dict[str, Any], family: Family, name: str, note: Note) -> tuple[str, str]:
    supported = Note(f"supported {family.title} architectures: {', '.join(family.architectures)}")
    found = config.get("architectures")
    if found is None:
        raise error(codes.HF_CONFIG_FIELD,
                    f"{name}: {CONFIG_JSON} has no `architectures`, which names the "
                    f"transformers class (and so the head) the checkpoint is for", None, note, supported)
    if not (isinstance(found, list) and found and isinstance(found[0], str)):
        raise error(codes.HF_CONFIG_FIELD, f"{name}: {CONFIG_JSON} `architectures` must be a non-empty list of class "
                                           f"names, found {describe(found)}", None, note, supported)
    if found[0] not in family.architectures:
        raise error(codes.HF_ARCHITECTURE, f"{name}: {CONFIG_JSON} names architecture \"{found[0]}\", which hf: cannot "
                                           f"build", None, note, supported)
    return found[0], family.architectures[found[0]]


# --------------------------------------------------------------------------- the entry


def _skeleton(name: str, files: RepoFiles, repo: str, commit: str, family: Family, config: FamilyConfig,
              config_file: Path, source: Manifest, client: Path | None) -> HfManifest:
    """The manifest before its checkpoint is bound (no weights, no outputs yet)."""
    entry = _entry_name(files)
    where = f"{repo}'s {CONFIG_JSON} at {commit[:12]}" if repo else f"{files.describe(CONFIG_JSON)}"
    root_entry = "embed" if client is not None else family.root_entries[config.root]
    links = {"huggingface": f"https://huggingface.co/{repo}"} if repo else {}
    return HfManifest(
        dir=cache_dir() / "hf" / entry, name=entry,
        title=f"{repo or files.label} ({config.architecture}{', sentence-transformers' if client else ''})",
        summary=f"Built from {where}.",
        license="unknown", family=family.name, tags=(), links=links,
        source=SourceSpec(path=None, zoo=family.source_entry, root=config.root, entry=root_entry, client=client),
        generics=dict(config.generics), check=family.check_dims(config), weights=None, package=source.package,
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


def bind(params: list[ParamSpec], index: dict[str, TensorInfo], family: Family, prefix: str, *, name: str,
         architecture: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Linnet param -> checkpoint key for each param, in the spelling the checkpoint uses.

    extra: params bound outside the family's layout (a pipeline's Dense layers).  A key the
    checkpoint lacks is an error here, naming every missing one, rather than a bindings.json
    complaint about a file the user never wrote.
    """
    extra = extra or {}
    bindings, missing = {}, []
    for param in params:
        key = extra.get(param.name) or family.key(param.name, prefix)
        if key is None:
            raise InternalError(f"hf: has no key for the {family.title} source's param {param.name}")
        key = family.spelling_in(index, key)
        if key not in index:
            missing.append((param.name, key))
        bindings[param.name] = key
    if missing:
        raise _missing_keys(name, architecture, missing, index)
    return bindings


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


def _write_bindings(entry: str, commit: str, bindings: dict[str, str]) -> Path:
    """The generated bindings as a file (the loaders read bindings.json files)."""
    return _write_generated(entry, "bindings.json", json.dumps(bindings, indent=2) + "\n", commit)


def _write_generated(entry: str, filename: str, text: str, commit: str = "generated") -> Path:
    """A file this module generates, named by its content so loads of different checkpoints
    never overwrite each other's, in the Linnet cache (or the temporary folder)."""
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    stem, dot, suffix = filename.partition(".")
    # A branch name may hold "/": only a commit names a folder as it is.
    folder = commit if COMMIT_ID.fullmatch(commit) or commit == "generated" else \
        hashlib.sha256(commit.encode()).hexdigest()[:16]
    for root in (cache_dir() / "hf", Path(tempfile.gettempdir()) / "linnet-hf"):
        path = root / entry / folder / f"{stem}-{digest}{dot}{suffix}"
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
                f"cannot write the generated {filename} of {entry} to {cache_dir() / 'hf'} or the "
                f"temporary folder")
