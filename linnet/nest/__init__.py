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

import hashlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from .. import __version__, ir
from ..compiler import Target, compile_target
from ..diagnostics import Diagnostic, LinnetError
from ..lower import lower
from ..runtime import InputValidator
from .manifest import Manifest, known_entries, load_manifest
from .weights import BindingReport, checkpoint_files, load_bindings, load_tensors, read_index, verify_bindings

__all__ = ["load", "list_entries", "Model", "cache_dir"]

log = logging.getLogger("linnet.nest")

BACKENDS = ("torch",)


def cache_dir() -> Path:
    """Where generated sources are kept: $LINNET_CACHE, else ~/.cache/linnet."""
    root = os.environ.get("LINNET_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "linnet")
    return Path(root)


def list_entries() -> list[Manifest]:
    return [load_manifest(name) for name in known_entries()]


@dataclass
class LoadInfo:
    files: list[Path]
    report: BindingReport
    generated: Path
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


def _float_generic(compiled_checked, manifest: Manifest) -> str | None:
    block = compiled_checked.find_block(manifest.source.root)
    return next((g.name for g in block.generics if g.kind == "Float"), None)


def _cache_key(sources: dict[str, str], generics: dict, backend: str, options: dict) -> str:
    digest = hashlib.sha256()
    for name in sorted(sources):
        digest.update(name.encode() + b"\0" + sources[name].encode() + b"\0")
    digest.update(repr(sorted(generics.items())).encode())
    digest.update(f"{backend}:{sorted(options.items())}:{__version__}".encode())
    return digest.hexdigest()[:24]


def _generated_source(compiled, program: ir.Program, backend: str, options: dict) -> tuple[Path, str]:
    """Emit (or reuse from the cache) the backend's source for this program."""
    sources = {m.name: m.path.read_text(encoding="utf-8") for m in compiled.checked.program.modules.values()}
    key = _cache_key(sources, compiled.generics, backend, options)
    path = cache_dir() / "generated" / backend / f"{compiled.target.manifest.name}-{key}.py"
    if not path.is_file():
        from ..backends.pytorch import emit

        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(emit(program, title=f"{compiled.target.manifest.name}, PyTorch"), encoding="utf-8")
        tmp.replace(path)  # atomic: a concurrent load never imports half a file
    return path, f"linnet_generated_{backend}_{key}"


def load(name_or_path: str | Path, backend: str = "torch", *, device=None, dtype: str | None = None,
         revision: str | None = None, weights: str | Path | None = None, mode: str | None = None) -> Model:
    """Load a zoo entry (by name or folder) with its pinned checkpoint, ready to call.

    backend: "torch".  device: e.g. "cpu", "cuda".  dtype: the model's float dtype ("f32"
    default; "bf16"/"f16" on GPU).  revision: another revision of the weights repo.
    weights: a local .safetensors file or folder instead of the manifest's checkpoint.
    mode (torch): "eager" (default), "compile" (torch.compile) or "cudagraphs".
    """
    started = time.perf_counter()
    if backend not in BACKENDS:
        raise LinnetError(Diagnostic("E0804", f"unknown backend {backend!r}; available: {', '.join(BACKENDS)}"))
    manifest = load_manifest(name_or_path)
    if manifest.weights is None:
        raise LinnetError(Diagnostic("E0805", f"{manifest.name} declares no [weights] in nest.toml, so there is "
                                     "no bindings.json to bind a checkpoint with"))
    target = Target("entry", manifest.dir, manifest)
    overrides = {}
    if dtype is not None:
        from ..compiler import load_program
        from ..check import check

        float_generic = _float_generic(check(load_program(target)), manifest)
        if float_generic is None:
            raise LinnetError(Diagnostic("E0806", f"{manifest.name} has no Float generic to set dtype={dtype!r} on"))
        overrides[float_generic] = dtype
    compiled = compile_target(target, overrides)
    program = lower(compiled.instance)
    params = compiled.instance.params
    files = checkpoint_files(manifest, revision=revision, weights=weights)
    index = read_index(files)
    bindings = load_bindings(manifest.weights.bindings)
    report = verify_bindings(params, bindings, index, bindings_file=str(manifest.weights.bindings),
                             cast_floats=dtype is not None)
    source_path, module_name = _generated_source(compiled, program, backend, {})
    tensors = load_tensors(params, bindings, index, framework="pt", dtype=dtype)
    from ..backends.torch_runtime import TorchRuntime

    runtime = TorchRuntime(program, source_path, module_name, tensors, device=device, mode=mode)
    info = LoadInfo(files, report, source_path, time.perf_counter() - started)
    log.info("loaded %s (%s) in %.2f s", manifest.name, backend, info.seconds)
    return Model(manifest, program, runtime, info)
