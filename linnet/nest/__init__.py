"""Nest, Linnet's model zoo: `nest.load(name, backend=...)` returns a callable model.

    from linnet import nest
    model = nest.load("bert-base-uncased", backend="torch")
    hidden = model(tokens, token_types)        # the manifest's root entry, `forward`
    pooled = model.pool(tokens, token_types)   # any other entry by name

Loading is: manifest -> compile (check, instantiate, lower, emit; cached on disk) ->
checkpoint files through huggingface_hub -> header-only binding verification -> tensors.
Nothing is read from the checkpoint until every binding has been verified.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from .. import ir
from ..backends import LoadContext, available, cache_dir, check_options, integration
from ..compiler import Target, compile_target
from ..diagnostics import Diagnostic, LinnetError
from ..lower import lower
from ..runtime import InputValidator
from .manifest import Manifest, known_entries, load_manifest
from .weights import BindingReport, checkpoint_files, load_bindings, load_tensors, read_index, verify_bindings

__all__ = ["load", "list_entries", "Model", "cache_dir"]

log = logging.getLogger("linnet.nest")

BACKENDS = available()


def list_entries() -> list[Manifest]:
    return [load_manifest(name) for name in known_entries()]


@dataclass
class LoadInfo:
    files: list[Path]
    report: BindingReport | None
    generated: Path | None  # the backend's generated source or artifact, where it has one
    seconds: float


class Model:
    """A loaded zoo entry: call it to run the root entry, or call `model.<entry>(...)`."""

    def __init__(self, manifest: Manifest, program: ir.Program, runtime, info: LoadInfo):
        self.manifest = manifest
        self.program = program
        self.runtime = runtime
        self.info = info
        self.backend = runtime.backend
        self.entries = tuple(program.entries)
        self._validators = {name: InputValidator(program, e) for name, e in program.entries.items()}

    def run(self, entry: str, *args, **kwargs):
        if entry not in self._validators:
            raise LinnetError(Diagnostic("E0703", f"{self.manifest.name} has no entry `{entry}`; "
                                         f"entries: {', '.join(self.entries)}"))
        inputs, _ = self._validators[entry](args, kwargs)
        return self.runtime.run(entry, inputs)

    def __call__(self, *args, **kwargs):
        return self.run(self.manifest.source.entry, *args, **kwargs)

    def __getattr__(self, name: str):
        entries = self.__dict__.get("_validators", {})
        if name in entries:
            return lambda *args, **kwargs: self.run(name, *args, **kwargs)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}"
                             + (f" (entries: {', '.join(entries)})" if entries else ""))

    def signature(self, entry: str | None = None) -> str:
        e = self.program.entries[entry or self.manifest.source.entry]
        params = ", ".join(f"{n}: {t}" for n, t in e.inputs)
        where = ", ".join(f"{l} {op} {r}" for l, op, r, _ in e.preconditions)
        return f"{e.name}<{', '.join(e.dims)}>({params}) -> {e.result}" + (f" where {where}" if where else "")

    def __repr__(self) -> str:
        return (f"<linnet Model {self.manifest.name} backend={self.backend} "
                f"entries={', '.join(self.signature(e) for e in self.entries)}>")


def _float_generic(checked, manifest: Manifest) -> str | None:
    block = checked.find_block(manifest.source.root)
    return next((g.name for g in block.generics if g.kind == "Float"), None)


def _dtype_overrides(target: Target, manifest: Manifest, dtype: str | None) -> dict[str, str]:
    if dtype is None:
        return {}
    from ..check import check
    from ..compiler import load_program

    float_generic = _float_generic(check(load_program(target)), manifest)
    if float_generic is None:
        raise LinnetError(Diagnostic("E0806", f"{manifest.name} has no Float generic to set dtype={dtype!r} on"))
    return {float_generic: dtype}


def _check_outputs(manifest: Manifest, program: ir.Program) -> None:
    """nest.toml `[outputs]` must name real entries, and give each a distinct name."""
    unknown = sorted(set(manifest.outputs) - set(program.entries))
    if unknown:
        raise LinnetError(Diagnostic("E0913", f"{manifest.dir / 'nest.toml'}: [outputs] names "
                                     f"{', '.join(unknown)}, which {'is not an entry' if len(unknown) == 1 else 'are not entries'} "
                                     f"of `{manifest.source.root}`; its entries are {', '.join(program.entries)}"))
    names = [manifest.output_name(e) for e in program.entries]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise LinnetError(Diagnostic("E0913", f"{manifest.dir / 'nest.toml'}: several entries' results would be "
                                     f"named {', '.join(clashes)} in exported graphs; give each its own name in [outputs]"))


def prepare(name_or_path: str | Path, *, dtype: str | None = None, revision: str | None = None,
            weights: str | Path | None = None, need_weights: bool = True,
            overrides: dict[str, int | str] | None = None) -> tuple[LoadContext, LoadInfo]:
    """Compile a zoo entry and verify its checkpoint's bindings (headers only): what every
    backend's load and build start from.  Tensors are read later, by the backend, on demand.
    """
    started = time.perf_counter()
    manifest = load_manifest(name_or_path)
    if manifest.weights is None and need_weights:
        raise LinnetError(Diagnostic("E0805", f"{manifest.name} declares no [weights] in nest.toml, so there is "
                                     "no bindings.json to bind a checkpoint with"))
    target = Target("entry", manifest.dir, manifest)
    if overrides:
        compiled = compile_target(target, {**overrides, **_dtype_overrides(target, manifest, dtype)})
    else:
        compiled = compile_target(target, _dtype_overrides(target, manifest, dtype), override_source="dtype=")
    program = lower(compiled.instance)
    _check_outputs(manifest, program)
    ctx = LoadContext(manifest.name, compiled, program, dtype, manifest)
    info = LoadInfo([], None, None, 0.0)
    if need_weights:
        params = compiled.instance.params
        files = checkpoint_files(manifest, revision=revision, weights=weights)
        index = read_index(files)
        bindings = load_bindings(manifest.weights.bindings)
        info.files = files
        info.report = verify_bindings(params, bindings, index, bindings_file=str(manifest.weights.bindings),
                                      cast_floats=dtype is not None)
        ctx.tensor_loader = lambda framework, cast: load_tensors(params, bindings, index, framework=framework,
                                                                 dtype=cast)
    info.seconds = time.perf_counter() - started
    return ctx, info


def load(name_or_path: str | Path, backend: str = "torch", *, device=None, dtype: str | None = None,
         revision: str | None = None, weights: str | Path | None = None, mode: str | None = None,
         providers: list | None = None) -> Model:
    """Load a zoo entry (by name or folder) with its pinned checkpoint, ready to call.

    backend: "torch", "jax", "stablehlo" or "onnx".  device: e.g. "cpu", "cuda".
    dtype: the model's float dtype ("f32" default; "bf16"/"f16" on GPU).  revision: another
    revision of the weights repo.  weights: a local .safetensors file or folder instead of
    the manifest's checkpoint.  mode (torch): "eager" (default), "compile" or "cudagraphs".
    providers (onnx): ONNX Runtime execution providers, default the best available.
    """
    started = time.perf_counter()
    module = integration(backend)
    options = check_options(backend, module, {"mode": mode, "providers": providers})
    manifest = load_manifest(name_or_path)
    ctx, info = prepare(manifest.dir, dtype=dtype, revision=revision, weights=weights)
    runtime = module.open_runtime(ctx, device=device, **options)
    info.generated = getattr(runtime, "generated", None)
    info.seconds = time.perf_counter() - started
    log.info("loaded %s (%s) in %.2f s", manifest.name, backend, info.seconds)
    return Model(manifest, ctx.program, runtime, info)
