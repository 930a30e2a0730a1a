"""Running generated JAX source: import it, build the params tree, `jax.jit` each entry.

The source is written to the on-disk cache and imported from there (tracebacks show its
lines and their `# file:line` comments).  The checkpoint's arrays are read once through
`ctx.tensors("flax")` and arranged into the nested tree the functions take; they are passed
to the jitted entry as an argument, not closed over, so XLA does not fold 440 MB of
constants into each compiled program.

What recompiles: `jax.jit` traces and compiles once per distinct input shape and dtype.
Every new (B, S) costs one compilation (seconds for bert-base on a small CPU); calls at a
(B, S) seen before reuse it.  Callers that see many lengths should pad to a few buckets, or
use the "stablehlo" backend, which exports once with symbolic B and S (it still compiles
per shape, but never traces the Python again).

A packed entry (`linnet.middle.packing`, `nest.load(..., packing=True)`) runs its per-token
work on `[Tokens, ...]`, whose length depends on the mask.  The runtime counts the kept
positions before the call (`kept_count`, numpy) and passes a bucket at or above the count
(`token_bucket`: 16, 24, 32, 48, 64, ...; at most B * S) as the static argument
`token_bucket`, so a (B, S) compiles once per bucket it meets, not once per count.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import codes
from ..middle import ir
from ..diagnostics import Diagnostic, LinnetError
from ..middle.packing import kept_count, token_bucket
from . import LoadContext
from .jax_source import BUCKET
from .pysource import import_generated


_GPU_NAMES = ("gpu", "cuda")


def resolve_device(device, backend: str = "jax"):
    """`None`/"cpu" -> the first CPU device; "gpu"/"cuda" (optionally ":N") -> that GPU when
    jax sees one; a `jax.Device` as is.  Anything else is E0801."""
    import jax

    if device is None:
        return jax.devices("cpu")[0]
    if isinstance(device, jax.Device):
        return device
    if not isinstance(device, str):
        raise LinnetError(Diagnostic(codes.BAD_DEVICE, f"unknown device {device!r}: the {backend} backend takes "
                                     "'cpu', 'gpu' or 'cuda' (optionally ':N'), or a jax.Device"))
    kind, _, index = device.lower().partition(":")
    if kind not in ("cpu",) + _GPU_NAMES or (index and not index.isdigit()):
        raise LinnetError(Diagnostic(codes.BAD_DEVICE, f"unknown device {device!r}: the {backend} backend takes "
                                     "'cpu', 'gpu' or 'cuda' (optionally ':N'), or a jax.Device"))
    platform = "gpu" if kind in _GPU_NAMES else "cpu"
    try:
        devices = jax.devices(platform)
    except RuntimeError:  # jax raises when no backend of that platform is installed
        devices = []
    if not devices:
        raise LinnetError(Diagnostic(codes.BAD_DEVICE,
                                     f"device {device!r} asked for, but jax sees no {platform.upper()} "
                                     f"(its devices: {', '.join(str(d) for d in jax.devices())})"))
    n = int(index or 0)
    if n >= len(devices):
        raise LinnetError(Diagnostic(codes.BAD_DEVICE, f"device {device!r} asked for, but jax sees {len(devices)} "
                                     f"{platform.upper()} device(s)"))
    return devices[n]


class JaxRuntime:
    backend = "jax"
    #: jax.jit compiles once per input shape, so generate keeps the cache one length
    #: (linnet/nest/generate.py's WindowSteps) rather than compiling a step per position.
    compiles_per_shape = True

    def __init__(self, program: ir.Program, source_path: Path, module_name: str, tensors: dict, *, device=None,
                 compiler_options: dict | None = None):
        import jax

        from .jax_source import params_tree

        self.program = program
        self.device = resolve_device(device)
        self.module = import_generated(source_path, module_name)
        self.params = jax.device_put(params_tree(program, tensors), self.device)
        self._compiler_options = compiler_options or None
        self._entries = {name: jax.jit(self.module.ENTRIES[name],
                                       static_argnames=(BUCKET,) if e.packed_by else (),
                                       compiler_options=self._compiler_options)
                         for name, e in program.entries.items()}

    def run(self, entry: str, inputs: list[np.ndarray]):
        """The entry's result as a `jax.Array`; the first call per input shape (and, packed, per
        token bucket) compiles."""
        import jax

        extra = {}
        spec = self.program.entries[entry]
        if spec.packed_by:
            named = {name: a for (name, _), a in zip(spec.inputs, inputs)}
            b, s = np.shape(named[spec.packed_by[0]])
            extra[BUCKET] = token_bucket(kept_count(spec, named), b * s)
        # None: a left-out input with a computed default, which the generated function computes.
        arrays = [None if a is None else jax.device_put(a, self.device) for a in inputs]
        return self._entries[entry](self.params, *arrays, **extra)


    # ------------------------------------------------- generate's cache, updated in place

    def cache_buffer_steps(self, total: int):
        """generate's steps on one fixed-size cache updated in place (`JaxRingSteps`), or None
        for a source without the decoder entries."""
        if not all(e in self._entries for e in ("prefill", "decode")):
            return None
        return JaxRingSteps(self, total)

    def ring_step(self):
        """`decode` as one jitted function whose cache argument is donated:
        (params, token, ring, mask, slot) -> (ring with the new position at `slot`, scores)."""
        if getattr(self, "_ring_step", None) is None:
            import jax
            from jax import lax

            decode = self.module.ENTRIES["decode"]

            def step(params, token, ring, mask, slot):
                logits, grown = decode(params, token, ring, mask)  # [..., W + 1, Dh]: only its last
                axis = grown.ndim - 2  # position is kept, so XLA drops the concatenation that grew it
                column = lax.slice_in_dim(grown, grown.shape[axis] - 1, grown.shape[axis], axis=axis)
                return lax.dynamic_update_slice_in_dim(ring, column, slot, axis=axis), logits

            self._ring_step = jax.jit(step, donate_argnums=(2,), compiler_options=self._compiler_options)
        return self._ring_step


class JaxRingSteps:
    """generate's `start`/`step` on JAX with one cache of `total - 1` positions written in place.

    `prefill` runs on the prompt left-padded to `total - 1` positions, as `WindowSteps` runs it
    (linnet/nest/generate.py). Its padding positions, never attended to, are the slots the new
    tokens take: step t runs `decode` on the cache as it is, with the mask over its positions
    plus the new one, keeps only the new position of the result (which lets XLA drop the grown
    cache) and writes it at slot t with `dynamic_update_slice` into the cache passed in, donated,
    so XLA updates that buffer in place; the slot's mask then turns 1. Attention weighs keys by
    the mask, not by where they sit, and `positions(attention_mask)` counts the real tokens, so
    a token's keys may sit anywhere. Each layer still attends over `concat(cache[slot], column)`,
    a copy of that layer's keys and values a step: jit's fixed shapes give the attention no view
    of a prefix."""

    def __init__(self, runtime: JaxRuntime, total: int):
        self.runtime = runtime
        self.width = total - 1
        self.ring = self.mask = None
        self.next = 0
        self._step = runtime.ring_step()

    def start(self, tokens, mask):
        pad = self.width - tokens.shape[1]
        tokens, mask = (np.concatenate([np.zeros((a.shape[0], pad), a.dtype), a], axis=1) for a in (tokens, mask))
        logits, self.ring = self.runtime.run("prefill", [tokens.astype(np.int32), mask.astype(np.int32)])
        self.mask = mask.astype(np.int32)
        self.next = 0
        return np.asarray(logits)

    def step(self, token, mask):
        import jax

        slot = self.next
        if slot >= self.width or self.mask[:, slot].any():
            raise RuntimeError(f"the cache has no free slot for step {slot}")  # generate never asks for one
        full = np.concatenate([self.mask, mask[:, -1:].astype(np.int32)], axis=1)
        arrays = [jax.device_put(a, self.runtime.device) for a in (token.astype(np.int32), full)]
        self.ring, logits = self._step(self.runtime.params, arrays[0], self.ring, arrays[1], np.int32(slot))
        self.mask[:, slot] = full[:, -1]
        self.next += 1
        return np.asarray(logits)


def generated_source(ctx: LoadContext) -> Path:
    """The entry's JAX source, emitted once per cache key."""
    from .jax_source import emit

    title = f"{ctx.name}, JAX"
    return ctx.cached("jax", ".py", lambda path: path.write_text(emit(ctx.program, title=title), encoding="utf-8"))


def xla_choice(device, kernels: str | None, backend: str = "jax"):
    """The XLA compiler options to compile the entries with (`linnet.backends.xla_options`):
    on a CPU device the accurate base, plus what was measured faster with kernels="auto" (the
    default); XLA's defaults on any other device."""
    from . import cache_dir, kernel_choice
    from .xla_options import XlaChoice, base_options, choose

    if resolve_device(device, backend).platform != "cpu":
        return XlaChoice({})
    if kernel_choice(kernels) != "auto":
        return XlaChoice(base_options())
    return choose(cache_dir=cache_dir())


def open_runtime(ctx: LoadContext, *, device=None, kernels: str | None = None) -> JaxRuntime:
    resolve_device(device)  # before reading any weights
    choice = xla_choice(device, kernels)
    source = generated_source(ctx)
    runtime = JaxRuntime(ctx.program, source, f"linnet_generated_jax_{source.stem.replace('-', '_')}",
                         ctx.tensors("flax"), device=device, compiler_options=choice.options)
    runtime.generated = source
    #: The compiler options: the accurate base and what was measured faster (`xla_options`).
    runtime.xla_choice = choice
    return runtime


def build(ctx: LoadContext, out_dir: Path) -> list[Path]:
    from .jax_source import write

    return [write(ctx.program, out_dir, title=f"{ctx.name}, JAX")]
