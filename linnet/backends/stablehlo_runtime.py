"""Running the StableHLO artifact: export once (cached on disk), deserialize, call.

`open_runtime` exports the root entry into a cache folder keyed by the Linnet sources, the
generics, the Linnet version and the jax version, and any other entry into the same folder on
its first call (bert-base has 14 entries, and a load that calls one of them should not wait
for the rest); later loads only deserialize what is there.  Calls go
through `jax.export.Exported.call(params, *inputs)`, which never traces the Python again;
it is wrapped in `jax.jit` so each concrete (B, S) is compiled once and reused.  A packed
entry gets, after its inputs, an unread array as long as the token bucket at or above the
kept count (`packing.token_bucket`, as the jax backend passes it), so it compiles once per
(B, S) and bucket.

The artifact checks the entry's `where` preconditions itself (see `stablehlo.py`), but
jax reports a failed check as "Error refining shapes", with the useful text two causes
down.  So `run` checks the preconditions first and names the `where` clause (E0702, as
the Model API does), and turns any other shape assertion from the artifact into E0820
quoting jax's own explanation.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np

from .. import codes
from ..middle import ir
from ..diagnostics import Diagnostic, LinnetError, Note
from ..dims import DimError
from ..middle.packing import kept_count, token_bucket
from . import LoadContext
from .jax_runtime import resolve_device, xla_choice

log = logging.getLogger("linnet.backends.stablehlo_export")


_COMPARE = {"<=": np.less_equal, "<": np.less, ">=": np.greater_equal, ">": np.greater, "==": np.equal,
            "!=": np.not_equal}


class StableHloRuntime:
    backend = "stablehlo"
    #: each exported StableHLO program compiles once per input shape, so generate keeps the cache one length
    #: (linnet/nest/generate.py's WindowSteps) rather than compiling a step per position.
    compiles_per_shape = True

    def __init__(self, program: ir.Program, folder: Path, tensors: dict, *, device=None,
                 compiler_options: dict | None = None, name: str | None = None):
        import threading

        import jax

        from .jax_source import params_tree

        self.program = program
        self.folder = folder
        self.name = name or folder.name
        self.device = resolve_device(device, "stablehlo")
        self.signature = json.loads((folder / "signature.json").read_text(encoding="utf-8"))
        #: Each entry's `jax.export.Exported`, read (or exported) on its first use (`exported_entry`).
        self.exported: dict = {}
        self._compiler_options = compiler_options or None
        self._calls: dict = {}
        self._module = None
        self._lock = threading.Lock()
        self.params = jax.device_put(params_tree(program, tensors), self.device)

    def exported_entry(self, name: str):
        """The entry's exported program: deserialised from the artifact folder, exported into it
        first when the folder does not hold it yet (threads calling at once share one)."""
        exported = self.exported.get(name)
        if exported is None:
            with self._lock:
                exported = self.exported.get(name)
                if exported is None:
                    import jax

                    exported = self._read_or_export(name)
                    self._calls[name] = jax.jit(exported.call, compiler_options=self._compiler_options)
                    self.exported[name] = exported
        return exported

    def _read_or_export(self, name: str):
        from jax import export as jax_export

        blob = self.folder / f"{name}.jax_export"
        if not blob.exists():
            from .pysource import import_generated
            from .stablehlo_export import export_to, generated_module_name

            if self._module is None:
                self._module = import_generated(self.folder / "model.py", generated_module_name(self.folder))
            seconds, _ = export_to(self.folder, self.program, self._module, name, self.name)
            log.info("exported `%s` of %s to StableHLO in %.1f s", name, self.name, seconds)
        exported = jax_export.deserialize(bytearray(blob.read_bytes()))
        platform = "cuda" if self.device.platform == "gpu" else self.device.platform
        if platform not in exported.platforms:
            raise LinnetError(Diagnostic(codes.BAD_DEVICE, f"the StableHLO artifact of `{name}` was exported for "
                                         f"{', '.join(exported.platforms)}, not for {platform}"))
        return exported

    def run(self, entry: str, inputs: list[np.ndarray]):
        """The entry's result as a `jax.Array`; the first call per input shape (and, packed, per
        token bucket) compiles."""
        import jax

        spec = self.program.entries[entry]
        left_out = [name for (name, _), a in zip(spec.inputs, inputs) if a is None]
        if left_out:  # the exported calls take every input; computing a default is not exported
            name = left_out[0]
            raise LinnetError(Diagnostic(codes.BAD_INPUT, f"`{name}` left out: the stablehlo backend runs the "
                                         f"exported graph, which takes every input; pass `{name}` "
                                         f"(its default is `{spec.computed[name].text}`), or load with "
                                         "backend='jax', 'torch' or 'onnx'"))
        self._check_preconditions(entry, inputs)
        arrays = [jax.device_put(a, self.device) for a in inputs + self._token_rows(entry, inputs)]
        self.exported_entry(entry)
        try:
            return self._calls[entry](self.params, *arrays)
        except Exception as exc:  # noqa: BLE001 - only shape assertions are translated
            reason = shape_assertion_message(exc)
            if reason is None:
                raise
            raise LinnetError(Diagnostic(codes.STABLEHLO_REFUSED_INPUTS,
                                         f"the StableHLO artifact of `{entry}` refused inputs of shapes "
                                         f"{', '.join(str(tuple(a.shape)) for a in inputs)}: {reason}")) from None

    def _token_rows(self, entry_name: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """A packed entry's last argument: an unread array as long as the token bucket at or above
        the kept count (see `stablehlo_export`); nothing for an entry that is not packed."""
        spec = self.program.entries[entry_name]
        if not spec.packed_by:
            return []
        named = {name: a for (name, _), a in zip(spec.inputs, inputs)}
        b, s = np.shape(named[spec.packed_by[0]])
        return [np.zeros(token_bucket(kept_count(spec, named), b * s), np.bool_)]

    def _check_preconditions(self, entry_name: str, inputs: list[np.ndarray]) -> None:
        entry = self.program.entries[entry_name]
        names = [n for n, _ in entry.inputs]
        dims = {}
        for dim, (param, axis) in entry.dim_sources.items():
            array = inputs[names.index(param)]
            if axis < array.ndim:
                dims[dim] = int(array.shape[axis])
        for left, op, right, span in entry.preconditions:
            try:
                ok = _COMPARE[op](left.evaluate(dims), right.evaluate(dims))
            except DimError:
                continue  # a dim missing from a malformed input: the artifact's own check reports it
            if not ok:
                values = ", ".join(f"{d} = {dims[d]}" for d in sorted(left.free_symbols() | right.free_symbols()))
                raise LinnetError(Diagnostic(codes.PRECONDITION_FAILED,
                                             f"`{entry_name}` requires {left} {op} {right}, but {values}",
                                             span, (Note("declared by this `where` clause; the exported artifact "
                                                         "carries the same check"),)))


def shape_assertion_message(exc: BaseException) -> str | None:
    """jax's explanation of a failed shape assertion, found along the exception's causes."""
    seen = 0
    while exc is not None and seen < 8:
        text = str(exc)
        marker = text.find("Input shapes do not match")
        if marker >= 0:
            explanation = text[marker:].split(" Using the following", 1)[0].split("\n", 1)[0]
            return explanation.strip()
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def artifact(ctx: LoadContext, root: str) -> tuple[Path, float | None]:
    """The entry's artifact folder, created once per cache key with the root entry exported
    (the others are exported into it on first use); and the export's seconds when this call
    did it (None when it came from the cache)."""
    import jax

    from .stablehlo_export import PLATFORMS, write_artifact

    spent: list[float] = []

    def write(path: Path) -> None:
        started = time.perf_counter()
        write_artifact(ctx, path, entries=(root,))
        spent.append(time.perf_counter() - started)
        log.info("exported %s (`%s`) to StableHLO in %.1f s", ctx.name, root, spent[-1])

    folder = ctx.cached("stablehlo", "", write, options={"jax": jax.__version__, "platforms": PLATFORMS})
    return folder, (spent[0] if spent else None)


def open_runtime(ctx: LoadContext, *, device=None, kernels: str | None = None) -> StableHloRuntime:
    resolve_device(device, "stablehlo")  # before exporting or reading any weights
    choice = xla_choice(device, kernels, "stablehlo")
    root = ctx.root_entry
    folder, seconds = artifact(ctx, root)
    runtime = StableHloRuntime(ctx.program, folder, ctx.tensors("flax"), device=device,
                               compiler_options=choice.options, name=ctx.name)
    runtime.exported_entry(root)  # the artifact's platforms checked at load, as before
    #: The compiler options: the accurate base and what was measured faster (`xla_options`).
    runtime.xla_choice = choice
    runtime.generated = folder
    runtime.export_seconds = seconds
    return runtime


def build(ctx: LoadContext, out_dir: Path) -> list[Path]:
    from .stablehlo_export import write_artifact

    return write_artifact(ctx, Path(out_dir))
