"""Checkpoints for zoo entries: fetch them, index their headers, check bindings, load tensors.

The steps run in this order, and nothing reads tensor data before the last one:

1. `locate_checkpoint` finds the `.safetensors` files: a local file/folder the user passes
   as `weights=`, or the manifest's pinned revision from the Hugging Face cache, from a
   packaged copy nest.toml declares, or from the Hub (`linnet.nest.hub`), verifying any
   sha256 pins.
2. `read_index` parses only the safetensors headers (key, dtype, shape, byte range), and
   rejects truncated or inconsistent files before anyone memory-maps them.
3. `verify_bindings` matches the compiled model's `ParamSpec`s against that index through
   the entry's bindings (`entry_bindings`: its declared layout, or a bindings.json) and
   reports every problem in one error.
4. `load_tensors` memory-maps the files with `safetensors.safe_open` and materialises each
   parameter for numpy or PyTorch; for JAX it maps each tensor's bytes itself and copies
   them once into a JAX buffer (`mapped_reader`).

Pickle checkpoints (`pytorch_model.bin`, `.pt`, ...) are refused, never opened: unpickling
runs arbitrary code.  Frameworks and huggingface_hub are imported lazily, inside the
functions that need them, so importing this module stays cheap.

Why over 500 lines: the four steps above share the header index and its diagnostics (which
name the param, the key and both shapes); each step is a section of its own below.
"""
from __future__ import annotations

import difflib
import hashlib
import json
import logging
import os
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterable, Iterator

from .. import codes, dtypes
from ..arrays import Framework, framework as framework_named
from ..diagnostics import Diagnostic, InternalError, LinnetError, Note, Span, error
from ..middle.params import ParamSpec
from .hub import CHECKPOINT_INSTEAD, Located, cached_files, fetch_file, hub_cache_dir, packaged_files, packaged_folder
from .layouts import LayoutBindings
from .manifest import Manifest, WeightsSpec

#: The codes of the weights stage, with what they mean (a view of the registry in linnet/codes.py).
CODES = codes.summaries("weights")

log = logging.getLogger("linnet.nest")

#: Linnet float dtypes `load_tensors(dtype=...)` may cast to.
CAST_TARGETS = dtypes.names("float", widest_first=True)

#: Suffixes of pickle-based checkpoints, which are refused rather than opened.
PICKLE_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle"})

# safetensors itself refuses headers over 100 MB; a larger length prefix means corruption.
_MAX_HEADER_BYTES = 100_000_000


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as a checkpoint header describes it; `dtype` uses safetensors names ("F32")."""

    key: str
    file: Path
    dtype: str
    shape: tuple[int, ...]
    #: The key inside `file`, where the index files it under another (`read_index`'s
    #: namespaces: "linear.weight" of 2_Dense/model.safetensors is "2_Dense/linear.weight").
    stored_key: str | None = None

    @property
    def file_key(self) -> str:
        """The name to read the tensor by from its file."""
        return self.stored_key or self.key

    @property
    def nbytes(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count * dtypes.from_safetensors(self.dtype).itemsize

    @property
    def is_float(self) -> bool:
        return dtypes.from_safetensors(self.dtype).is_float

    def describe(self) -> str:
        return f"[{', '.join(map(str, self.shape))}] {self.dtype}"


@dataclass(frozen=True)
class Cast:
    """A float parameter whose checkpoint tensor has another width, converted on load."""

    param: str
    key: str
    stored: str    # safetensors dtype, e.g. "F16"
    declared: str  # Linnet dtype, e.g. "f32"


@dataclass(frozen=True)
class Alias:
    """A binding whose key the checkpoint spells with the other LayerNorm names."""

    param: str
    written: str  # the key bindings.json gives, e.g. "...LayerNorm.gamma"
    found: str    # the key the checkpoint has, e.g. "...LayerNorm.weight"


@dataclass
class BindingReport:
    """What `verify_bindings` established: the tensor behind each param, and what was left over."""

    bound: dict[str, TensorInfo]
    unused_keys: list[str]
    casts: list[Cast] = field(default_factory=list)
    #: Bindings satisfied through the LayerNorm naming fallback (see `LAYER_NORM_ALIASES`).
    aliases: list[Alias] = field(default_factory=list)


# --------------------------------------------------------------------------- finding files


def checkpoint_files(manifest: Manifest, *, revision: str | None = None,
                     weights: str | Path | None = None) -> list[Path]:
    """The entry's `.safetensors` files (see `locate_checkpoint`, which also says where from)."""
    return locate_checkpoint(manifest, revision=revision, weights=weights).files


def locate_checkpoint(manifest: Manifest, *, revision: str | None = None,
                      weights: str | Path | None = None) -> Located:
    """The entry's `.safetensors` files and where they were found.

    `weights=` wins; otherwise the pinned revision comes from the Hugging Face cache, then
    from a `[weights.package]` copy, then from the Hub (`linnet.nest.hub`).  sha256 pins are
    checked only for the manifest's own revision: they describe those files, not another
    revision's and not a user's own checkpoint.
    """
    if weights is not None:
        files = _local_files(Path(weights), manifest.weights)
        names = tuple(file.relative_to(weights).as_posix() for file in files) if Path(weights).is_dir() else None
        return Located(files, "weights=", f"weights={weights}", names)
    spec = _declared_weights(manifest)
    wanted = revision or spec.revision
    pinned = wanted == spec.revision
    located = _from_cache(spec, wanted) or (_from_package(manifest, spec) if pinned else None)
    if located is None:
        instead = CHECKPOINT_INSTEAD
        if pinned and spec.package is not None and packaged_folder(spec.package) is None:
            instead += (f"; or install the Python distribution {spec.package.distribution}, which ships "
                        f"{spec.package.gguf or 'them'} ([weights.package] in {manifest.dir / 'nest.toml'}): "
                        "it is not installed")
        located = Located([fetch_file(spec.repo, name, wanted, instead=instead) for name in spec.files], "hub",
                          f"the Hub ({spec.repo}@{wanted[:12]}), through the Hugging Face cache ({hub_cache_dir()})",
                          spec.files)
    if pinned and located.origin != "package":  # a packaged copy was verified as it was chosen
        _verify_pins(spec, located.files, f"{spec.repo}@{wanted[:12]}")
    return located


def _from_cache(spec: WeightsSpec, revision: str) -> Located | None:
    files = cached_files(spec, revision)
    if files is None:
        return None
    return Located(files, "cache", f"the Hugging Face cache ({hub_cache_dir()})", spec.files)


def _from_package(manifest: Manifest, spec: WeightsSpec) -> Located | None:
    if spec.package is not None and spec.package.gguf is not None:
        return _from_packaged_gguf(manifest, spec)
    found = packaged_files(spec)
    if found is None:
        return None
    files, description = found
    _verify_pins(spec, files, description, damaged=f"reinstall {spec.package.distribution}")
    log.info("the Hugging Face cache lacks %s@%s; using %s (sha256 verified)", spec.repo,
             spec.revision[:12], description)
    return Located(files, "package", description, spec.files)


def _from_packaged_gguf(manifest: Manifest, spec: WeightsSpec) -> Located | None:
    """`[weights.package]` with `gguf`: the installed distribution's GGUF file, sha256-checked,
    converted once into a transformers-style folder (`linnet.nest.gguf`), whose metadata must
    give the entry's own generics (a GGUF of another size or RoPE base is refused, E1113)."""
    from importlib.metadata import version

    from .gguf import gguf_folder

    copy = spec.package
    folder = packaged_folder(copy)
    if folder is None:
        log.debug("packaged copy %s is not installed", copy.distribution)
        return None
    file = folder / copy.gguf
    if not file.is_file():
        log.info("the installed %s lacks %s in %s; not using it", copy.distribution, copy.gguf, folder)
        return None
    description = (f"the installed package {copy.distribution} {version(copy.distribution)} ({file}, "
                   "dequantised to f32)")
    _verify_sha256(file, copy.sha256, description, f"reinstall {copy.distribution}")
    converted = gguf_folder(file)
    check_gguf_generics(manifest, converted, file, "[weights.package] names")
    log.info("the Hugging Face cache lacks %s@%s; using %s (sha256 verified)", spec.repo, spec.revision[:12],
             description)
    return Located([converted / "model.safetensors"], "package", description, ("model.safetensors",))


def check_gguf_generics(manifest: Manifest, converted: Path, file: Path, how: str) -> None:
    """The generics the GGUF's metadata gives (read as `nest.load(folder)` reads them) equal the
    entry's: the binding checks see shapes only, not RoPE's base or the norms' epsilon. `how`:
    how the file was named ("weights=", "[weights.package] names")."""
    from .hf import folder_manifest

    found = folder_manifest(converted).generics
    differ = []
    for name, declared in manifest.generics.items():
        if name not in found or isinstance(declared, str):
            continue
        given = found[name]
        same = (given == declared if isinstance(declared, int) and isinstance(given, int)
                else abs(float(given) - float(declared)) <= 1e-6 * max(abs(float(declared)), 1e-30))
        if not same:
            differ.append(f"{name} = {given} (the entry's is {declared})")
    if differ:
        raise error(codes.BAD_GGUF, f"the GGUF file {file.name} that {how} does not describe "
                                    f"zoo entry {manifest.name!r}: its metadata gives {', '.join(differ)}",
                    None, Note(f"the file is {file}; the entry is {manifest.dir / 'nest.toml'}"))


def _verify_pins(spec: WeightsSpec, files: list[Path], what: str,
                 damaged: str = "delete it and download it again") -> None:
    for name, path in zip(spec.files, files):
        if name in spec.sha256:
            _verify_sha256(path, spec.sha256[name], what, damaged)


def _declared_weights(manifest: Manifest) -> WeightsSpec:
    if manifest.weights is None:
        raise error(codes.WEIGHTS_NOT_GIVEN, f"zoo entry {manifest.name!r} declares no [weights]; pass weights= "
                                             f"a .safetensors file or a folder of them",
                    None, Note(f"in {manifest.dir / 'nest.toml'}"))
    return manifest.weights


def _local_files(path: Path, declared: WeightsSpec | None) -> list[Path]:
    """`weights=`: one `.safetensors` file, or a folder's (the declared files when all present)."""
    if path.is_file():
        if path.suffix == ".safetensors":
            return [path]
        if path.suffix in PICKLE_SUFFIXES:
            raise _pickle_refused(path, [path])
        raise error(codes.NOT_SAFETENSORS, f"weights={path} is not a .safetensors file")
    if not path.is_dir():
        raise error(codes.NOT_SAFETENSORS, f"weights={path} does not exist")
    if declared is not None and all((path / name).is_file() for name in declared.files):
        return [path / name for name in declared.files]
    found = sorted(path.glob("*.safetensors"))
    if found:
        return found
    pickles = sorted(p for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise _pickle_refused(path, pickles)
    raise error(codes.NOT_SAFETENSORS, f"weights={path} holds no .safetensors files")


def _pickle_refused(path: Path, pickles: list[Path]) -> LinnetError:
    names = ", ".join(p.name for p in pickles)
    return error(codes.NOT_SAFETENSORS, f"weights={path} holds only pickle checkpoints ({names}); Linnet never "
                                        f"loads pickles, since unpickling can run arbitrary code",
                 None, Note("convert it to safetensors once, e.g. safetensors.torch.save_file("
                            "torch.load(path, weights_only=True), 'model.safetensors')"))


# --------------------------------------------------------------------------- sha256 pins

# Hashing a multi-GB checkpoint takes seconds; within one process, a file that has not
# changed (same inode, size and mtime) is hashed once.
_digests: dict[tuple[str, int, int, int], str] = {}


def sha256_of(path: Path) -> str:
    """The file's sha256, hashed in chunks (never read whole into memory)."""
    stat = path.stat()
    identity = (os.path.realpath(path), stat.st_ino, stat.st_size, stat.st_mtime_ns)
    if identity not in _digests:
        with open(path, "rb") as f:
            _digests[identity] = hashlib.file_digest(f, "sha256").hexdigest()
    return _digests[identity]


def _verify_sha256(path: Path, expected: str, what: str,
                   damaged: str = "delete it and download it again") -> None:
    found = sha256_of(path)
    if found != expected:
        raise error(codes.SHA256_MISMATCH, f"sha256 of {path.name} ({what}) does not match the pin in nest.toml: "
                                           f"expected {expected}, found {found}",
                    None, Note(f"the file is {path}; if this copy is damaged, {damaged}"))


# --------------------------------------------------------------------------- headers


def read_index(files: Iterable[str | Path], names: Iterable[str] | None = None) -> dict[str, TensorInfo]:
    """Every tensor in the files, from their headers alone; a key in two files is an error.

    names: each file's name in its repo or folder.  The keys of a file in a sub-folder are
    filed under that folder (`key_namespace`): a sentence-transformers `2_Dense/model.safetensors`
    holds `linear.weight`, indexed as `2_Dense/linear.weight`.
    """
    index: dict[str, TensorInfo] = {}
    files = [Path(file) for file in files]
    spaces = [key_namespace(name) for name in names] if names is not None else [""] * len(files)
    for file, space in zip(files, spaces, strict=True):
        for info in read_header(file):
            if space:
                info = replace(info, key=space + info.key, stored_key=info.key)
            if info.key in index:
                raise error(codes.DUPLICATE_TENSOR_KEY, f"tensor {info.key!r} appears in both {index[info.key].file} "
                                                        f"and {file}")
            index[info.key] = info
    return index


def key_namespace(name: str) -> str:
    """The prefix `read_index` gives the keys of a file named `name` in its repo: its folder
    and a slash ("2_Dense/"), or nothing for a file at the top."""
    folder = PurePosixPath(name).parent.as_posix()
    return "" if folder in ("", ".") else folder + "/"


def read_header(file: Path) -> list[TensorInfo]:
    """Parse one safetensors header: an 8-byte little-endian length, then that much JSON."""
    with open(file, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        prefix = f.read(8)
        if len(prefix) < 8:
            raise _corrupt(file, f"the file is {size} bytes, too short for the 8-byte header length")
        length = int.from_bytes(prefix, "little")
        if length > min(size - 8, _MAX_HEADER_BYTES):
            raise _corrupt(file, f"the header claims {length} bytes but the file has {size - 8} "
                                 f"after the length prefix (truncated, or not safetensors)")
        raw = f.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _corrupt(file, f"the header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise _corrupt(file, "the header is not a JSON object")
    data_size = size - 8 - length
    metadata = header.get("__metadata__", {})
    if not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise _corrupt(file, "__metadata__ is not an object of strings")
    infos = [_tensor_info(file, key, entry, data_size) for key, entry in header.items() if key != "__metadata__"]
    # What safetensors itself demands when the file is opened: the tensors tile the data
    # exactly, in order, without overlaps or gaps (else the load would fail after checking).
    covered = 0
    for key, start, end in sorted(((k, *e["data_offsets"]) for k, e in header.items() if k != "__metadata__"),
                                  key=lambda t: (t[1], t[2])):
        if start != covered:
            raise _corrupt(file, f"tensor {key!r}: data_offsets start at {start}, but the tensors before it "
                                 f"end at {covered} (overlapping or gapped data)")
        covered = end
    if covered != data_size:
        raise _corrupt(file, f"the tensors cover {covered} of the {data_size} data bytes")
    return infos


def _tensor_info(file: Path, key: str, entry: Any, data_size: int) -> TensorInfo:
    if not isinstance(entry, dict):
        raise _corrupt(file, f"tensor {key!r}: header entry is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtypes.lookup("safetensors", dtype) is None:
        raise _corrupt(file, f"tensor {key!r}: unknown dtype {dtype!r}")
    if not (isinstance(shape, list) and all(_is_count(d) for d in shape)):
        raise _corrupt(file, f"tensor {key!r}: shape {shape!r} is not a list of sizes")
    elements = 1
    for d in shape:  # safetensors multiplies in 64 bits, left to right
        elements *= d
        if elements >= 2 ** 64:
            raise _corrupt(file, f"tensor {key!r}: shape {shape!r} overflows 64-bit sizes")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_count, offsets))
            and offsets[0] <= offsets[1] <= data_size):
        raise _corrupt(file, f"tensor {key!r}: data_offsets {offsets!r} lie outside the "
                             f"{data_size} data bytes of the file")
    info = TensorInfo(key, file, dtype, tuple(shape))
    if offsets[1] - offsets[0] != info.nbytes:
        raise _corrupt(file, f"tensor {key!r}: data_offsets span {offsets[1] - offsets[0]} bytes "
                             f"but {info.describe()} needs {info.nbytes}")
    return info


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _corrupt(file: Path, reason: str) -> LinnetError:
    return error(codes.CORRUPT_SAFETENSORS, f"{file.name} is not a valid safetensors file: {reason}", None,
                 Note(f"the file is {file}"))


# --------------------------------------------------------------------------- bindings


def entry_bindings(spec: WeightsSpec, param_names: Iterable[str]) -> tuple[dict[str, str], str]:
    """An entry's bindings (param -> checkpoint key) and the name diagnostics give their source.

    `[weights].bindings` either names a declared layout, whose table maps the compiled
    params' names, or is a bindings.json of the entry's own, read as it is (the file's
    absolute path is then the name, so diagnostics point at its lines).
    """
    if isinstance(spec.bindings, LayoutBindings):
        return spec.bindings.bindings(param_names), spec.bindings.label
    return load_bindings(spec.bindings), str(spec.bindings)


def load_bindings(path: str | Path) -> dict[str, str]:
    """A bindings file: one JSON object, Linnet param name -> checkpoint key."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise error(codes.BAD_BINDINGS_FILE, f"{path.name}: cannot read bindings file {path}: {exc}") from None
    try:
        pairs = json.loads(text, object_pairs_hook=_Pairs)
    except json.JSONDecodeError as exc:
        span = Span(str(path), exc.lineno, exc.colno, exc.lineno, exc.colno + 1)
        raise error(codes.BAD_BINDINGS_FILE, f"{path.name}: invalid JSON: {exc.msg}", span) from None
    if not isinstance(pairs, _Pairs):
        raise error(codes.BAD_BINDINGS_FILE, f"{path.name}: must hold a JSON object mapping Linnet param names to "
                                             f"checkpoint keys, found {_json_kind(pairs)}", None,
                    Note(f"the file is {path}"))
    return _checked_pairs(path, text, pairs)


class _Pairs(list):
    """A JSON object as its (key, value) pairs in order, so a key written twice is seen."""


def _checked_pairs(path: Path, text: str, pairs: _Pairs) -> dict[str, str]:
    problems, bindings = [], {}
    for name, key in pairs:
        span = _json_key_span(path, text, name)
        if not isinstance(key, str):
            problems.append(Diagnostic(codes.BAD_BINDINGS_FILE,
                                       f"{path.name}: the binding of {name!r} must be a "
                                       f"checkpoint key string, found {_json_kind(key)}", span))
        elif name in bindings:
            problems.append(Diagnostic(codes.BAD_BINDINGS_FILE, f"{path.name}: param {name!r} is bound twice", span))
        else:
            bindings[name] = key
    if problems:
        raise LinnetError(problems)
    return bindings


def _json_kind(value: Any) -> str:
    kinds = {_Pairs: "an object", list: "an array", str: "a string", bool: "a boolean",
             int: "a number", float: "a number", type(None): "null"}
    return kinds.get(type(value), type(value).__name__)


def _json_key_span(path: Path, text: str, key: str) -> Span | None:
    """The line where `"key":` is written, found by text search (a readable pointer, no more)."""
    needle = json.dumps(key)
    for number, line in enumerate(text.splitlines(), start=1):
        col = line.find(needle)
        if col >= 0 and line[col + len(needle):].lstrip().startswith(":"):
            return Span(str(path), number, col + 1, number, col + 1 + len(needle))
    return None


def verify_bindings(params: list[ParamSpec], bindings: dict[str, str],
                    index: dict[str, TensorInfo], *, bindings_file: str = "bindings.json",
                    cast_floats: bool = False) -> BindingReport:
    """Check every param against its checkpoint tensor from headers alone; raise one error.

    Problems found: a param without a binding, a binding for a param the model lacks, a
    key the checkpoint lacks, a shape or dtype that differs.  Floats of another width pass
    only with `cast_floats=True` and are listed in `BindingReport.casts`.  Several params
    may share one key (tied weights) if each matches it.  A LayerNorm key the checkpoint
    spells the other way (`gamma`/`beta` vs `weight`/`bias`) is bound under its spelling,
    listed in `BindingReport.aliases` and logged at INFO.  Keys nothing binds are returned
    in `unused_keys` and logged at INFO.  Pass the bindings file's absolute path as
    `bindings_file` for diagnostics that point at its lines.
    """
    report, problems = _match(params, bindings, index, bindings_file, cast_floats)
    if problems:
        raise LinnetError(problems)
    _log_report(report, bindings_file)
    return report


def _match(params: list[ParamSpec], bindings: dict[str, str], index: dict[str, TensorInfo],
           bindings_file: str, cast_floats: bool) -> tuple[BindingReport, list[Diagnostic]]:
    """The checks behind `verify_bindings`, returning problems instead of raising."""
    locate = _binding_locator(bindings_file)
    problems: list[Diagnostic] = []
    report = BindingReport(bound={}, unused_keys=[])
    sharing = _params_by_key(params, bindings)
    for param in params:
        key = bindings.get(param.name)
        if key is None:
            problems.append(Diagnostic(codes.UNBOUND_PARAM, f"param {param.name}: {_linnet_type(param)} has no "
                                                            f"binding in {bindings_file}"))
            continue
        info = index.get(key)
        if info is None:
            info = _layer_norm_alias(key, index)
            if info is None:
                problems.append(_absent_key(param, key, index, bindings_file, locate(param.name)))
                continue
            report.aliases.append(Alias(param.name, key, info.key))
        found = _compare(param, info, cast_floats, locate(param.name), report)
        problems.extend(_note_tied(d, param, info, sharing) for d in found)
        if not found:
            report.bound[param.name] = info
    problems.extend(_unknown_params(params, bindings, bindings_file, locate))
    referenced = set(bindings.values()) | {alias.found for alias in report.aliases}
    report.unused_keys = sorted(key for key in index if key not in referenced)
    return report, problems


#: LayerNorm parameter names: TF-era checkpoints (the original google-bert conversions)
#: write `gamma`/`beta`, torch's `nn.LayerNorm` writes `weight`/`bias`.  A bound key
#: ending in one spelling that the checkpoint lacks is looked up in the other.
LAYER_NORM_ALIASES = {".gamma": ".weight", ".beta": ".bias", ".weight": ".gamma", ".bias": ".beta"}


def _layer_norm_alias(key: str, index: dict[str, TensorInfo]) -> TensorInfo | None:
    """The tensor `key` names under the other LayerNorm spelling, if the checkpoint has it.

    Only the name is substituted: the tensor found still goes through the same shape and
    dtype checks as any other, so a differently shaped tensor is never bound.
    """
    for suffix, other in LAYER_NORM_ALIASES.items():
        if key.endswith(suffix):
            return index.get(key[: -len(suffix)] + other)
    return None


def _compare(param: ParamSpec, info: TensorInfo, cast_floats: bool, span: Span | None,
             report: BindingReport) -> list[Diagnostic]:
    """Shape and dtype problems of one bound param (both, if both differ)."""
    problems = []
    mismatch = (f"param {param.name}: {_linnet_type(param)} but checkpoint key {info.key} is "
                f"{info.describe()}")
    if tuple(param.shape) != info.shape:
        problems.append(Diagnostic(codes.PARAM_SHAPE_MISMATCH, mismatch, span))
    declared = _declared_dtype(param)
    if declared.safetensors == info.dtype:
        return problems
    both_float = declared.is_float and info.is_float
    if both_float and cast_floats:
        report.casts.append(Cast(param.name, info.key, info.dtype, param.dtype))
    elif both_float:
        problems.append(Diagnostic(codes.PARAM_DTYPE_MISMATCH, mismatch, span,
                                   (Note("to convert float widths on load, pass dtype= to nest.load "
                                         "(cast_floats=True to verify_bindings)"),)))
    else:
        problems.append(Diagnostic(codes.PARAM_DTYPE_MISMATCH, mismatch, span,
                                   (Note("integer dtypes are never converted: only float widths "
                                         "are, with cast_floats=True"),)))
    return problems


def _note_tied(diagnostic: Diagnostic, param: ParamSpec, info: TensorInfo,
               sharing: dict[str, list[ParamSpec]]) -> Diagnostic:
    # Tied weights: when one of several params bound to a key mismatches, name the others,
    # since the fix may be in how the tie is declared rather than in the bindings.
    for other in sharing[info.key]:
        if other.name != param.name:
            agrees = "agrees with it" if tuple(other.shape) == info.shape else "differs too"
            diagnostic = diagnostic.with_note(f"key {info.key} is also bound to param {other.name}: "
                                              f"{_linnet_type(other)}, which {agrees}")
    return diagnostic


def _params_by_key(params: list[ParamSpec], bindings: dict[str, str]) -> dict[str, list[ParamSpec]]:
    sharing: dict[str, list[ParamSpec]] = defaultdict(list)
    for param in params:
        if param.name in bindings:
            sharing[bindings[param.name]].append(param)
    return sharing


def _absent_key(param: ParamSpec, key: str, index: dict[str, TensorInfo], bindings_file: str,
                span: Span | None) -> Diagnostic:
    notes = ()
    close = difflib.get_close_matches(key, list(index), n=3, cutoff=0.6)
    if close:
        notes = (Note(f"close keys in the checkpoint: {', '.join(close)}"),)
    return Diagnostic(codes.BINDING_MISSING_KEY, f"param {param.name}: {bindings_file} binds it to checkpoint key "
                                                 f"{key}, which the checkpoint does not have", span, notes)


def _unknown_params(params: list[ParamSpec], bindings: dict[str, str], bindings_file: str,
                    locate) -> list[Diagnostic]:
    names = [p.name for p in params]
    known = set(names)
    problems = []
    for name, key in bindings.items():
        if name in known:
            continue
        close = difflib.get_close_matches(name, names, n=1)
        notes = (Note(f"did you mean {close[0]}?"),) if close else ()
        problems.append(Diagnostic(codes.BINDING_UNKNOWN_PARAM,
                                   f"{bindings_file} binds {name} (to {key}), but the model "
                                   f"has no param {name}", locate(name), notes))
    return problems


def _binding_locator(bindings_file: str):
    """name -> Span of its line in the bindings file, when given as an absolute path.

    A bare name like the default "bindings.json" only labels messages: reading it relative
    to the working directory could quote some unrelated file.
    """
    if not Path(bindings_file).is_absolute():
        return lambda name: None
    try:
        text = Path(bindings_file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return lambda name: None
    return lambda name: _json_key_span(Path(bindings_file), text, name)


def _linnet_type(param: ParamSpec) -> str:
    return f"Tensor[{', '.join(map(str, param.shape))}; {param.dtype}]"


def _declared_dtype(param: ParamSpec) -> dtypes.DType:
    try:
        return dtypes.by_name(param.dtype)
    except dtypes.UnknownDType:
        raise InternalError(f"ParamSpec {param.name} has unknown dtype {param.dtype!r}") from None


def _log_report(report: BindingReport, bindings_file: str) -> None:
    if report.aliases:
        first = report.aliases[0]
        log.info("%s: %d keys bound under the other LayerNorm spelling (gamma/beta <-> weight/bias), "
                 "e.g. %s as %s", bindings_file, len(report.aliases), first.written, first.found)
    if report.unused_keys:
        shown = ", ".join(report.unused_keys[:8])
        more = f" and {len(report.unused_keys) - 8} more" if len(report.unused_keys) > 8 else ""
        log.info("%s: %d checkpoint keys unused: %s%s", bindings_file, len(report.unused_keys),
                 shown, more)
    if report.casts:
        kinds = sorted({f"{c.stored}->{c.declared}" for c in report.casts})
        log.info("%s: %d float tensors converted on load (%s)", bindings_file, len(report.casts),
                 ", ".join(kinds))


# --------------------------------------------------------------------------- loading


def load_tensors(params: list[ParamSpec], bindings: dict[str, str], index: dict[str, TensorInfo],
                 *, framework: str = "numpy", dtype: str | None = None) -> dict[str, Any]:
    """Each param's array by Linnet name, read through memory-mapped `safe_open`.

    Float tensors become `dtype` when given, else the param's declared dtype.  A key bound to
    several params (tied weights) is read once and the same array returned for each.  The
    bindings are re-checked from headers first, so a mismatch can never be half-loaded.
    """
    backend = framework_named(framework)
    if dtype is not None and dtype not in CAST_TARGETS:
        raise error(codes.BAD_WEIGHTS_DTYPE, f"cannot load weights as dtype {dtype!r}: choose one of "
                                             f"{', '.join(CAST_TARGETS)}")
    report, problems = _match(params, bindings, index, "bindings.json", cast_floats=True)
    if problems:
        raise LinnetError(problems)
    arrays: dict[str, Any] = {}
    for file, members in _group_by_file(params, report).items():
        arrays.update(_read_file(file, members, backend, dtype))
    return arrays


def _group_by_file(params: list[ParamSpec], report: BindingReport
                   ) -> dict[Path, list[tuple[ParamSpec, TensorInfo]]]:
    groups: dict[Path, list[tuple[ParamSpec, TensorInfo]]] = defaultdict(list)
    for param in params:
        info = report.bound[param.name]
        groups[info.file].append((param, info))
    return groups


def _read_file(file: Path, members: list[tuple[ParamSpec, TensorInfo]], backend: Framework,
               dtype: str | None) -> dict[str, Any]:
    with tensor_reader(file, backend) as read:
        return _read_members(members, read, backend, dtype)


@contextmanager
def tensor_reader(file: Path, backend: Framework) -> Iterator[Callable[[str], Any]]:
    """A function key -> that tensor of `file` as an array of `backend`, read the way that
    backend's arrays cost least memory: copied once from a per-tensor map (`mapped_reader`),
    through a handle per tensor (`read_tensor`), or as views through one open handle."""
    from safetensors import safe_open

    if backend.reads_mapped:
        yield mapped_reader(file, backend)
    elif backend.copies_on_read:
        yield lambda key: read_tensor(file, key, backend)
    else:
        with safe_open(str(file), framework=backend.safetensors_name) as handle:
            yield handle.get_tensor


def mapped_reader(file: Path, backend: Framework) -> Callable[[str], Any]:
    """A function key -> that tensor of `file` as `backend.from_mapped` copies it from a
    numpy view of the file's bytes, mapped for that one tensor and unmapped after: one copy,
    and no bytes object in between (safetensors' own flax reader makes one)."""
    import numpy as np

    with open(file, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(length).decode("utf-8"))  # read_index checked it already
    data_start = 8 + length

    def read(key: str):
        entry = header[key]
        start, end = entry["data_offsets"]
        try:
            dtype = dtypes.from_safetensors(entry["dtype"]).numpy_type()
        except dtypes.UnknownDType:  # a stored-only dtype numpy lacks: safetensors' own reader
            return read_tensor(file, key, backend)
        if end == start:  # mmap cannot map zero bytes
            return backend.from_mapped(np.zeros(entry["shape"], dtype))
        raw = np.memmap(file, dtype=np.uint8, mode="r", offset=data_start + start, shape=(end - start,))
        return backend.from_mapped(raw.view(dtype).reshape(entry["shape"]))

    return read


def read_tensor(file: Path, key: str, backend: Framework) -> Any:
    """One tensor of `file` as an array of `backend` (one that `copies_on_read`), through a
    handle of its own.

    numpy's and JAX's get_tensor copy out of the file's memory map, and the pages a copy
    read count in the process's RSS as long as the map is open: read through one handle, a
    checkpoint peaked at twice its size (bert-base: +854 MiB for 420 MiB of numpy arrays,
    +927 MiB of JAX arrays).  A handle per tensor unmaps each one's pages once copied
    (+438 MiB, +482 MiB).  torch's tensors are views of the map itself, so one handle
    serves them.
    """
    from safetensors import safe_open

    with safe_open(str(file), framework=backend.safetensors_name) as own:
        return own.get_tensor(key)


def _read_members(members: list[tuple[ParamSpec, TensorInfo]], read, backend: Framework,
                  dtype: str | None) -> dict[str, Any]:
    arrays: dict[str, Any] = {}
    converted: dict[tuple[str, str], Any] = {}  # (key, dtype) -> array, so ties share one read
    for param, info in members:
        target = _target_dtype(param, info, dtype)
        if (info.key, target) not in converted:
            array = read(info.file_key)
            if target != _linnet_dtype(info.dtype):
                array = backend.cast(array, dtypes.by_name(target))
            converted[(info.key, target)] = array
        arrays[param.name] = converted[(info.key, target)]
    return arrays


def _target_dtype(param: ParamSpec, info: TensorInfo, requested: str | None) -> str:
    if not info.is_float:
        return _linnet_dtype(info.dtype)
    return requested or param.dtype


def _linnet_dtype(safetensors_dtype: str) -> str:
    # Stored-only dtypes (F8 variants) have names no Linnet type has: never a cast target.
    return dtypes.from_safetensors(safetensors_dtype).name
