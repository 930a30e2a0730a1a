"""Backends: one emitter module and one integration module per target.

A backend is plugged in here by name, as one `Backend` record (which passes run for it),
and nothing else in the tree changes.  Its integration module (`linnet.backends.<x>_runtime`) provides:

* `open_runtime(ctx: LoadContext, *, device=None, **options)` — returns an object with a
  `backend` name and `run(entry, inputs: list[np.ndarray])`, the inputs already validated;
  `options` are the ones its record declares (`Backend.options`), checked by `check_options`
  and left out when not given;
* `build(ctx: LoadContext, out_dir: Path, **options) -> list[Path]` — what
  `linnet build --backend <x>` writes.

`LoadContext` carries the compiled and lowered program and reads the checkpoint lazily,
so a backend that only writes source (torch, JAX) never touches the weights.
"""
from __future__ import annotations

import hashlib
import importlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .. import __version__, codes
from ..middle import ir
from ..diagnostics import Diagnostic, LinnetError

@dataclass(frozen=True)
class Option:
    """One keyword a backend's runtime takes from `nest.load(..., **backend_options)`: the
    types a value may have, its default (what the runtime does when it is not given), what it
    does, and, when it takes one of a few words, those words (`choices`).  A value outside the
    choices is `bad_value` (the code the runtime has always used for it)."""

    name: str
    types: tuple[type, ...]
    default: Any
    doc: str
    choices: tuple[str, ...] | None = None
    bad_value: Any = codes.UNKNOWN_BACKEND_OPTION

    def type_names(self) -> str:
        """The accepted types for people: "True or False" for a flag, else the type names."""
        if self.types == (bool,):
            return "True or False"
        return " or ".join(f"a {t.__name__}" for t in self.types)


#: `kernels=`, which every backend takes: "auto" measures the machine's fastest exact choice once
#: and caches it (`linnet.backends.measured`); "default" measures nothing.
KERNEL_CHOICES = ("auto", "default")
#: torch's `mode=`.
TORCH_MODES = ("eager", "compile", "cudagraphs")
#: openvino's `precision_hint=`: the inference precisions Linnet lets OpenVINO run, by Linnet dtype name.
OPENVINO_PRECISIONS = ("f32", "bf16", "f16")
#: onnx's and openvino's `precision=` (`linnet.backends.onnx_int8`).
ONNX_PRECISIONS = ("f32", "int8")
#: Its int8 budget's defaults: mean cosine loss to f32 on the calibration texts, and the lowest cosine of any one.
INT8_MAX_COSINE_LOSS = 0.005
INT8_MIN_COSINE = 0.98


#: The environment variable that sets `kernels=` for loads that do not pass it: "default" lets a
#: CI job or a fleet of short-lived workers skip every per-machine measurement.
KERNELS_ENV = "LINNET_KERNELS"


def kernel_choice(kernels: str | None) -> str:
    """`kernels=` as a load runs it: the caller's value, else $LINNET_KERNELS, else "auto"."""
    if kernels is not None:
        return kernels
    chosen = os.environ.get(KERNELS_ENV) or "auto"
    if chosen not in KERNEL_CHOICES:
        raise LinnetError(Diagnostic(codes.UNKNOWN_BACKEND_OPTION,
                                     f"${KERNELS_ENV} is {chosen!r}; expected one of "
                                     + ", ".join(repr(c) for c in KERNEL_CHOICES)))
    return chosen


def _int8_options(kind: str) -> tuple[Option, ...]:
    """`precision="int8"` and its budget, as the onnx and openvino backends take them
    (`linnet.backends.onnx_int8.plan` measures it)."""
    return (Option("precision", (str,), "f32", f'"int8": dense matrices in {kind}, '
                   "as many as keep the `embed` entry's output within the cosine budget of f32 on the "
                   "calibration texts (measured at load, cached per machine; model.info.precision); "
                   "E0835 when none can", ONNX_PRECISIONS),
            Option("calibration", (list, tuple), None, "precision='int8': the texts the plan is measured on "
                   "(default: 64 stdlib docstring paragraphs)"),
            Option("max_cosine_loss", (float, int), INT8_MAX_COSINE_LOSS, "precision='int8': the largest mean cosine "
                   "loss (1 - mean cosine to f32) a plan may have"),
            Option("min_cosine", (float, int), INT8_MIN_COSINE, "precision='int8': the lowest cosine to f32 any "
                   "calibration text may have"))


def _kernels(what: str, bad_value=codes.UNKNOWN_BACKEND_OPTION) -> Option:
    return Option("kernels", (str,), "auto",
                  f'"auto" measures {what} once per machine and takes the fastest within 1e-5 of the default\'s '
                  'result (cached in $LINNET_CACHE/kernels/); "default" measures nothing',
                  KERNEL_CHOICES, bad_value)


@dataclass(frozen=True)
class Backend:
    """One target, as `nest.load`, `linnet build` and the Triton export see it: its integration
    module (imported only when used), the passes of `linnet.middle.optimize` run for it,
    whether its runtime runs a packed program (`pack_tokens`: a token count that depends on the
    mask), and the keyword options its runtime takes (`options`)."""

    name: str
    module: str
    passes: tuple[str, ...]
    packing: bool = False
    options: tuple[Option, ...] = ()
    #: The `pip install 'linnet[<extra>]'` extra holding its Python packages (E0808 names it).
    extra: str | None = None

    def option(self, name: str) -> Option:
        return next(o for o in self.options if o.name == name)

    def option_names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.options)

    def passes_for(self, optimize: bool = True, packing: bool | None = None) -> tuple[str, ...]:
        """The passes to run: `passes`, with `pack_tokens` added or removed by `packing` (None:
        as `passes` say); `packing=True` on a backend that cannot run packed is refused (E0807)."""
        passes = self.passes if optimize else ()
        if packing is False:
            return tuple(p for p in passes if p != "pack_tokens")
        if packing is True and "pack_tokens" not in passes:
            if not self.packing:
                raise LinnetError(Diagnostic(codes.UNKNOWN_BACKEND_OPTION,
                                             f"backend {self.name!r} cannot run a packed program (packing=True): "
                                             "its runtime takes no token count that depends on the mask "
                                             "(use packing=None or False)"))
            passes += ("pack_tokens",)
        return passes


#: Every backend by name.
RECORDS: dict[str, Backend] = {b.name: b for b in (
    # Not `pack_tokens` by default: on the 2-core CPU a packed MiniLM batch measured no faster in
    # eager torch (the gathers and scatters around each attention cost what the smaller GEMMs
    # save); `packing=True` runs it.
    Backend("torch", "linnet.backends.torch_runtime", ("fuse_linears", "fold_attention_scale", "dead_rows"),
            packing=True, extra="torch", options=(
                Option("mode", (str,), "eager", '"eager" runs the generated module as it is; "compile" through '
                       'torch.compile (inductor); "cudagraphs" captures CUDA graphs (needs device="cuda")',
                       TORCH_MODES, codes.BAD_TORCH_MODE),
                _kernels("each Linear shape's kernel (eager, CPU: oneDNN with a packed weight, or torch's matmul; "
                         "a decoder's one-row products also one matrix-vector product per thread)",
                         codes.BAD_TORCH_MODE))),
    # `pack_tokens` among them: measured faster on padded batches and no slower without padding
    # (docs/backends.md, "Padding-free execution"); the token count is bucketed.
    Backend("jax", "linnet.backends.jax_runtime", ("fuse_linears", "fold_attention_scale", "dead_rows", "pack_tokens"),
            packing=True, extra="jax", options=(_kernels("XLA:CPU compiler options (never one XLA_FLAGS sets)"),)),
    # `pack_tokens` only.  The exported artifact is a deliverable of its own, and its
    # signature.json maps each param to its checkpoint key, so its params must be exactly the
    # checkpoint's (unfused, unscaled); packing leaves the params alone.  Packed by default, as on
    # the jax backend (the same XLA program): one export with a symbolic token count, bucketed per call.
    Backend("stablehlo", "linnet.backends.stablehlo_runtime", ("pack_tokens",), packing=True, extra="jax",
            options=(_kernels("XLA:CPU compiler options (never one XLA_FLAGS sets)"),)),
    # Not `fuse_linears`: ONNX Runtime prepacks every constant MatMul weight, and one [768, 2304]
    # MatMul measured no faster than three [768, 768] ones (bit-identical, within run-to-run noise
    # on bert-base, 2-core CPU), so the graph keeps one node per checkpoint matrix
    # (`layers.3.attention.query.forward/MatMul`), which is what Netron users look for.
    Backend("onnx", "linnet.backends.onnx_runtime", ("fold_attention_scale", "dead_rows", "pack_tokens"),
            packing=True, extra="onnx", options=(
                Option("providers", (list, tuple, str), None, "ONNX Runtime execution providers, best first: names, or "
                       "(name, options) pairs; one alone may be given bare (default: CUDA where onnxruntime-gpu "
                       "has it, then CPU); not together with device="),
                _kernels("ONNX Runtime session options (CPU provider)"),
                Option("share_weights", (bool,), False, "one memory-mapped copy of each weight for all of the "
                       "model's sessions, ORT's weight pre-packing off: less memory, slower MatMuls"),
                *_int8_options("dynamic int8 (per-channel weights, a scale per call for activations)"))),
    # The onnx backend's graphs (its passes, so one export serves both), run by OpenVINO.
    Backend("openvino", "linnet.backends.openvino_runtime", ("fold_attention_scale", "dead_rows", "pack_tokens"),
            packing=True, extra="openvino", options=(
                Option("precision_hint", (str,), None, "OpenVINO's INFERENCE_PRECISION_HINT, always set and read back "
                       "from the compiled model (default: the model's dtype where the CPU has its arithmetic, else "
                       "'f32'; never OpenVINO's own bf16 default for an f32 model)", OPENVINO_PRECISIONS),
                Option("num_streams", (int,), 1, "OpenVINO CPU streams (NUM_STREAMS): infer requests that run at "
                       "once, for calls from several threads; 1 gives one call every thread"),
                Option("threads", (int,), None, "OpenVINO's INFERENCE_NUM_THREADS (default: one per physical "
                       "core, as the onnx backend's sessions)"),
                *_int8_options("static int8 (per-channel weights, activation scales calibrated on the texts "
                               "after SmoothQuant; precision_hint is the rest's)"))),
)}
#: backend name -> integration module.
BACKENDS: dict[str, str] = {name: b.module for name, b in RECORDS.items()}


def available() -> tuple[str, ...]:
    return tuple(BACKENDS)


def record(backend: str) -> Backend:
    """The backend's record; an unknown name is a user error (E0804)."""
    if backend not in RECORDS:
        raise LinnetError(Diagnostic(codes.UNKNOWN_BACKEND,
                                     f"unknown backend {backend!r}; available: {', '.join(BACKENDS)}"))
    return RECORDS[backend]


def integration(backend: str):
    """The backend's integration module; an unknown name is a user error (E0804)."""
    if backend not in BACKENDS:
        raise LinnetError(Diagnostic(codes.UNKNOWN_BACKEND,
                                     f"unknown backend {backend!r}; available: {', '.join(BACKENDS)}"))
    try:
        return importlib.import_module(BACKENDS[backend])
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("linnet"):
            raise
        extra = RECORDS[backend].extra
        install = f": pip install 'linnet[{extra}]'" if extra else ""
        raise LinnetError(Diagnostic(codes.MISSING_PACKAGE,
                                     f"backend {backend!r} needs the Python package `{exc.name}`, "
                                     f"which is not installed{install}")) from None


def check_options(backend: str, options: dict[str, Any]) -> dict[str, Any]:
    """`options` checked against the backend's record, with those left at None dropped: a name
    it does not declare is E0807 (listing the ones it does), a value of another type E0809, a
    word outside an option's choices the option's `bad_value` code."""
    declared = record(backend)
    given = {k: v for k, v in options.items() if v is not None}
    unknown = sorted(set(given) - set(declared.option_names()))
    if unknown:
        takes = f"it takes {', '.join(declared.option_names())}" if declared.options else "it takes none"
        raise LinnetError(Diagnostic(codes.UNKNOWN_BACKEND_OPTION,
                                     f"backend {backend!r} has no option {', '.join(unknown)}; {takes}"))
    for name, value in given.items():
        _check_value(backend, declared.option(name), value)
    return given


def _check_value(backend: str, option: Option, value: Any) -> None:
    # bool is an int in Python: an option of type int must still refuse True.
    if not isinstance(value, option.types) or (isinstance(value, bool) and bool not in option.types):
        raise LinnetError(Diagnostic(codes.BAD_BACKEND_OPTION_TYPE,
                                     f"backend {backend!r}: {option.name} must be {option.type_names()}, "
                                     f"found {value!r} ({type(value).__name__})"))
    if option.choices is not None and value not in option.choices:
        raise LinnetError(Diagnostic(option.bad_value,
                                     f"{option.name} must be one of {', '.join(option.choices)} for the {backend} "
                                     f"backend, found {value!r}"))


def options_table() -> str:
    """Every backend's options as a markdown table (docs/backends.md holds it; tests/test_docs.py
    compares the two)."""
    rows = ["| backend | option | type | default | what it does |", "|---|---|---|---|---|"]
    for b in RECORDS.values():
        for o in b.options:
            choices = f" ({', '.join(repr(c) for c in o.choices)})" if o.choices else ""
            rows.append(f"| {b.name} | `{o.name}` | {o.type_names()}{choices} | `{o.default!r}` | {o.doc} |")
    return "\n".join(rows)


def cache_dir() -> Path:
    """Where generated sources and exports are kept: $LINNET_CACHE, else ~/.cache/linnet."""
    root = os.environ.get("LINNET_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "linnet")
    return Path(root)


def _code_stamp() -> str:
    """The compiler's and emitters' own files by size and mtime: a cached artifact made by an
    older checkout of Linnet (same version number, different emitter) is not reused."""
    root = Path(__file__).resolve().parent.parent
    parts = []
    for module in sorted(m for stage in ("", "front/", "check/", "middle/", "backends/") for m in root.glob(stage + "*.py")):
        try:
            stat = module.stat()
        except OSError:
            continue
        parts.append(f"{module.relative_to(root)}:{stat.st_size}:{stat.st_mtime_ns}")
    return "|".join(parts)


@dataclass(frozen=True)
class FrontEndResult:
    """What loading and the backends need from the checked, instantiated program: the
    generics it was instantiated with, its params, and its source files (for cache keys).

    Much smaller than `linnet.compiler.Compiled`, which holds every checked AST node: the
    compile cache stores this, and a warm load unpickles it in a few milliseconds.
    """

    generics: dict
    params: tuple  # linnet.middle.params.ParamSpec, in the instance's order
    module_paths: dict  # module name -> Path of its .linnet file

    @classmethod
    def of(cls, compiled) -> "FrontEndResult":
        modules = compiled.checked.program.modules.values()
        return cls(dict(compiled.generics), tuple(compiled.instance.params), {m.name: m.path for m in modules
                                                                                 if m.expanded_from is None})


@dataclass
class LoadContext:
    """Everything a backend needs to build or run one instantiated zoo entry."""

    name: str  # the zoo entry's name, for file names and titles
    compiled: FrontEndResult
    program: ir.Program
    dtype: str | None = None  # the float dtype asked for, None when the manifest's own
    manifest: Any = None  # linnet.nest.manifest.Manifest
    #: (framework, dtype) -> {param path: array}; set by whoever knows where the weights are.
    tensor_loader: Callable[[str, str | None], dict[str, Any]] | None = None
    #: The optimisation stage's result (`linnet.middle.optimize.Optimized`) when `program` is the
    #: optimised program; `tensors()` then returns its params, built by the bind-time plan.
    optimized: Any = None
    #: A digest naming the checkpoint files (path, size, mtime) and the bindings the tensors
    #: come from; a backend whose cached artifact holds the weights (ONNX) keys it by this.
    weights_identity: str | None = None
    #: () -> {param path: checkpoint key} from the entry's bindings, reading no weights; set by
    #: the zoo loader (the StableHLO artifact records the keys), None when there are none.
    key_loader: Callable[[], dict[str, str]] | None = None
    _sources: dict[str, str] | None = field(default=None, repr=False)

    def checkpoint_keys(self) -> dict[str, str]:
        """Param path -> checkpoint key, or {} when the entry binds no checkpoint."""
        return self.key_loader() if self.key_loader is not None else {}

    def tensors(self, framework: str = "numpy", dtype: str | None = None) -> dict[str, Any]:
        """Every param by path (`encoder.layers.0.attn.q.weight`), verified against the bindings.

        framework: "numpy", "pt" or "flax" (JAX arrays).  dtype: cast floats to it (default:
        the dtype asked for at load time, else as declared).
        """
        if self.tensor_loader is None:
            raise LinnetError(Diagnostic(codes.WEIGHTS_NOT_GIVEN,
                                         f"{self.name}: this step needs the model's weights, and none "
                                         "were given (the entry declares no [weights], or pass weights=)"))
        return self.tensor_loader(framework, dtype if dtype is not None else self.dtype)

    @property
    def root_entry(self) -> str:
        """The entry a load opens first: nest.toml's `[source] entry`, else the program's first."""
        return self.manifest.source.entry if self.manifest is not None else next(iter(self.program.entries))

    def output_name(self, entry: str) -> str:
        """The name of an entry's result in exported graphs: nest.toml `[outputs]`, else the entry's."""
        return self.manifest.output_name(entry) if self.manifest is not None else entry

    @property
    def sources(self) -> dict[str, str]:
        if self._sources is None:
            self._sources = {name: path.read_text(encoding="utf-8")
                             for name, path in self.compiled.module_paths.items()}
        return self._sources

    def cache_key(self, backend: str, options: dict | None = None) -> str:
        """A digest of everything the generated artifact depends on."""
        digest = hashlib.sha256()
        for module in sorted(self.sources):
            digest.update(module.encode() + b"\0" + self.sources[module].encode() + b"\0")
        digest.update(repr(sorted(self.compiled.generics.items())).encode())
        if self.optimized is not None:  # the optimised program is a different program
            digest.update(("optimized:" + "; ".join(self.optimized.applied)).encode())
        digest.update(f"{backend}:{sorted((options or {}).items())}:{__version__}".encode())
        digest.update(_code_stamp().encode())
        return digest.hexdigest()[:24]

    def cached(self, backend: str, suffix: str, write: Callable[[Path], None], options: dict | None = None) -> Path:
        """`write(path)` once per cache key; later loads reuse the file.

        The file is written under a temporary name and renamed, so a concurrent load never
        reads half of it.  `suffix` may name a folder (e.g. "" with `write` making a dir).
        """
        path = cache_dir() / "generated" / backend / f"{self.name}-{self.cache_key(backend, options)}{suffix}"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + f".tmp{os.getpid()}")
            write(tmp)
            try:
                os.replace(tmp, path)
            except OSError:  # another process finished the same folder first
                if not path.exists():
                    raise
                import shutil
                shutil.rmtree(tmp, ignore_errors=True)
        return path
