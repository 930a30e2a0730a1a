"""Running generated PyTorch source: build the modules on the meta device, bind, call.

The generated file is written to the on-disk cache and imported from there, so tracebacks
show its lines and their `# file:line` comments.  Parameters are created on the `meta`
device (no memory), then replaced by the checkpoint's tensors with `load_state_dict(...,
assign=True)`: weights are read once, straight from the memory-mapped safetensors.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import codes
from ..middle import ir
from . import TORCH_MODES, LoadContext, kernel_choice
from ..diagnostics import Diagnostic, LinnetError
from .pysource import import_generated, py_name

#: `mode=`'s words; the options this backend takes (names, types, defaults, choices) are its
#: record's in `linnet.backends.RECORDS`, which `nest.load` checks them against.
MODES = TORCH_MODES


def torch_param_name(path: str) -> str:
    """A Linnet param path (`layers.0.up.weight`) as the generated module's state-dict key."""
    return ".".join(part if part.isdigit() else py_name(part) for part in path.split("."))


def _resolve_device(device):
    import torch

    if device is None:
        return torch.device("cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise LinnetError(Diagnostic(codes.BAD_DEVICE, f"unknown device {device!r}: {exc}")) from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise LinnetError(Diagnostic(codes.BAD_DEVICE, f"device {device!r} asked for, but torch sees no CUDA device"))
    return resolved


class TorchRuntime:
    backend = "torch"

    def __init__(self, program: ir.Program, source_path: Path, module_name: str, tensors: dict,
                 *, device=None, mode: str | None = None, kernels: str | None = None):
        import torch

        from . import cache_dir
        from .torch_kernels import choose_and_apply

        mode = mode or "eager"
        if mode not in MODES:
            raise LinnetError(Diagnostic(codes.BAD_TORCH_MODE,
                                         f"mode must be one of {', '.join(MODES)}, found {mode!r}"))
        self.device = _resolve_device(device)
        if mode == "cudagraphs" and self.device.type != "cuda":
            raise LinnetError(Diagnostic(codes.BAD_TORCH_MODE,
                                         "mode='cudagraphs' captures CUDA graphs and needs device='cuda'"))
        self.program = program
        self.mode = mode
        generated = import_generated(source_path, module_name)
        self.module = generated
        with torch.device("meta"):
            model = getattr(generated, py_name(program.root))()
        # Taken out of `tensors` (the caller's temporary), so the model holds the only
        # reference: a Linear run through a packed weight can then let its dense one go.
        state = {torch_param_name(name): tensors.pop(name) for name in list(tensors)}
        model.load_state_dict(state, strict=True, assign=True)
        del state
        self.model = model.to(self.device).eval()
        #: Shape -> the Linear kernel chosen at load (`torch_kernels`); empty when none was probed.
        self.kernels = {}
        if mode == "eager" and kernel_choice(kernels) == "auto" and self.device.type == "cpu":
            self.kernels = choose_and_apply(self.model, program, cache_dir=cache_dir())
        self._entries = {name: self._prepare(name) for name in program.entries}

    def _prepare(self, entry: str):
        import torch

        method = getattr(self.model, py_name(entry))
        if self.mode == "compile":
            # Inference only, so inductor may freeze the weights into constants: that lets it
            # pre-pack every Linear's weight for oneDNN and fuse the bias and GELU into it.
            # Shapes follow torch's default: the first (B, S) compiles static, a second one
            # recompiles once with symbolic B and S, and later shapes reuse that graph.
            return torch.compile(method, options={"freezing": True})
        if self.mode == "cudagraphs":
            return torch.compile(method, mode="reduce-overhead")
        return method

    def run(self, entry: str, inputs: list[np.ndarray]):
        import torch

        # None: a left-out input with a computed default, which the generated method computes.
        tensors = [None if a is None else torch.from_numpy(a).to(self.device, non_blocking=True) for a in inputs]
        with torch.inference_mode():
            return self._entries[entry](*tensors)


    # ------------------------------------------------- generate's cache, written in place

    def cache_buffer_steps(self, total: int):
        """generate's steps with the cache in one preallocated buffer written in place
        (`torch_cache`), or None where the entries cannot take it: a compiled mode (the
        buffer's checks are Python), or a source whose `decode` appends no input in place."""
        from .torch_source import BUFFERS

        if self.mode != "eager" or not hasattr(self.module, BUFFERS) or "decode" not in self._entries:
            return None
        return TorchBufferSteps(self, total)

    def call(self, entry: str, *tensors):
        """An entry on torch tensors as they are, unvalidated: generate's own loop only."""
        import torch

        with torch.inference_mode():
            return self._entries[entry](*tensors)


class TorchBufferSteps:
    """generate's `start`/`step` on torch with the decode cache in a `CacheBuffer`:
    `[Layers, 2, B, Heads, total - 1, Dh]` allocated once after `prefill`, each `decode` given
    the filled prefix (a view) and writing its new position in place. Registered in the
    generated module's `_BUFFERS` from `start` to `close` only."""

    def __init__(self, runtime: TorchRuntime, total: int):
        self.runtime = runtime
        self.capacity = max(total - 1, 1)  # the last decode's cache: prompt + new - 1 positions
        self.buffer = None
        self.cache = None
        entry = runtime.program.entries["decode"]
        self._types = [dtypes_numpy(t.dtype) for _, t in entry.inputs]
        self._axis = entry.inputs[1][1].rank - 2  # the cache's positions: [..., P, Dh]

    def start(self, tokens, mask):
        import torch

        from .torch_cache import CacheBuffer
        from .torch_source import BUFFERS

        logits, cache = self.runtime.call("prefill", *self._tensors(tokens, mask))
        with torch.inference_mode():
            self.buffer = CacheBuffer(cache, max(self.capacity, cache.shape[self._axis]), self._axis)
            self.cache = self.buffer.view(cache.shape[self._axis])
        del cache
        getattr(self.runtime.module, BUFFERS)[self.buffer.ptr] = self.buffer
        return _numpy(logits)

    def step(self, token, mask):
        token_t, mask_t = self._tensors(token, mask)
        logits, self.cache = self.runtime.call("decode", token_t, self.cache, mask_t)
        return _numpy(logits)

    def close(self):
        from .torch_source import BUFFERS

        if self.buffer is not None:
            getattr(self.runtime.module, BUFFERS).pop(self.buffer.ptr, None)

    def _tensors(self, tokens, mask):
        """The token ids and the mask as the entries take them (prefill's and decode's types
        agree: i32), on the runtime's device."""
        import torch

        numpy_type = self._types[0]
        return [torch.from_numpy(np.ascontiguousarray(a, dtype=numpy_type)).to(self.runtime.device)
                for a in (tokens, mask)]


def _numpy(tensor) -> np.ndarray:
    return tensor.detach().cpu().numpy()


def dtypes_numpy(dtype: str):
    from .. import dtypes

    return dtypes.by_name(dtype).numpy_type()


def generated_source(ctx: LoadContext) -> Path:
    """The entry's PyTorch source, emitted once per cache key."""
    from .torch_source import emit

    title = f"{ctx.name}, PyTorch"
    return ctx.cached("torch", ".py", lambda path: path.write_text(emit(ctx.program, title=title), encoding="utf-8"))


def open_runtime(ctx: LoadContext, *, device=None, mode: str | None = None,
                 kernels: str | None = None) -> TorchRuntime:
    # `mode` and `kernels` were checked against the record by `nest.load`.
    _resolve_device(device)  # before reading any weights
    source = generated_source(ctx)
    runtime = TorchRuntime(ctx.program, source, f"linnet_generated_torch_{source.stem.replace('-', '_')}",
                           ctx.tensors("pt"), device=device, mode=mode, kernels=kernels)
    runtime.generated = source
    return runtime


def build(ctx: LoadContext, out_dir: Path) -> list[Path]:
    from .torch_source import write

    return [write(ctx.program, out_dir)]
