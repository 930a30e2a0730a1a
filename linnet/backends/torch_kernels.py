"""The machine's fastest exact matmul for each Linear of a loaded torch model, chosen by measuring.

torch's default CPU matmul (MKL's sgemm) does not use AVX-512 on every CPU that has it;
oneDNN does, and runs a Linear with a weight packed once into its blocked layout about twice
as fast on such a machine (AMD Zen 5 here). Which is faster depends on the CPU, the thread
count and the shape, so nothing is assumed: at load, each distinct Linear shape is timed
both ways on the model's own weights (a few milliseconds), and oneDNN is taken only when it
is faster and its result is within `TOLERANCE` of the default kernel's (relative to the
output's magnitude). Decisions are cached per machine (CPU model, thread count, torch
version) and shape under `$LINNET_CACHE/kernels/`, so later loads do not time again.

A chosen Linear keeps its parameters as they are (the checkpoint's tensors, so saving,
`state_dict()` and gradients are unchanged); the packed copy is used only while autograd is
off (`nest.load` runs entries under `torch.inference_mode`). Anything else, or
`kernels="default"`, runs the generated `F.linear`.
"""
from __future__ import annotations

import json
import logging
import os
import platform
import time
import types
from dataclasses import dataclass
from pathlib import Path

from .. import kernels

log = logging.getLogger("linnet.torch")

#: `nest.load(..., kernels=...)`: "auto" measures and picks; "default" keeps F.linear.
KERNEL_CHOICES = ("auto", "default")
#: Largest accepted |oneDNN - default| per element, relative to max(1, max|default|).
TOLERANCE = 1e-5
#: Rows of the probe input: one sequence of 128 tokens, BERT's usual serving shape.
PROBE_ROWS = 128
#: oneDNN must beat the default by this factor to be taken (noise margin).
MIN_SPEEDUP = 1.05


@dataclass(frozen=True)
class Choice:
    kernel: str        # "onednn" or "default"
    speedup: float     # default's time / oneDNN's time in the probe
    max_error: float   # relative max |difference| in the probe


def choose_and_apply(model, program, *, cache_dir: Path | None) -> dict[str, Choice]:
    """Measure each Linear shape of `model` (once per machine), install the faster kernel.

    Returns shape key ("768x3072:float32") -> Choice, for `model.info` and the logs.
    """
    import torch

    if not torch.backends.mkldnn.is_available():
        return {}
    linears = [_submodule(model, prefix) for block_id, prefix in program.instances()
               if program.blocks[block_id].source == kernels.LINEAR_BLOCK]
    cached = _read_cache(cache_dir)
    choices: dict[str, Choice] = {}
    for module in linears:
        if module.weight.device.type != "cpu" or module.weight.dtype != torch.float32:
            continue
        key = shape_key(module.weight)
        if key not in choices:
            choices[key] = cached.get(key) or probe(module.weight, module.bias)
        if choices[key].kernel == "onednn":
            install_onednn(module)
    if cache_dir is not None and any(k not in cached for k in choices):
        _write_cache(cache_dir, {**cached, **choices})
    used = sum(c.kernel == "onednn" for c in choices.values())
    log.info("torch Linear kernels: oneDNN for %d of %d shapes (%s)", used, len(choices),
             ", ".join(f"{k} x{c.speedup:.2f}" for k, c in choices.items()))
    return choices


def _submodule(model, prefix: str):
    """The module at a Linnet instance prefix ("layers.0.up."), through `_modules`: a sub may
    share its name with an entry method (`mlm`), which hides it from `getattr`."""
    from .torch_runtime import torch_param_name

    module = model
    path = prefix.rstrip(".")
    for part in torch_param_name(path).split(".") if path else ():
        module = module._modules[part]
    return module


def shape_key(weight) -> str:
    out_features, in_features = weight.shape
    return f"{in_features}x{out_features}:{str(weight.dtype).removeprefix('torch.')}"


def probe(weight, bias, rounds: int = 7) -> Choice:
    """Time the default kernel and a packed oneDNN kernel on `weight`, interleaved."""
    import torch
    import torch.nn.functional as F

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(PROBE_ROWS, weight.shape[1], generator=generator, dtype=weight.dtype)
    with torch.inference_mode():
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, PROBE_ROWS)
        reference = F.linear(x, weight, bias)
        candidate = _onednn_linear(x, packed, bias)
        scale = max(1.0, float(reference.abs().max()))
        error = float((candidate - reference).abs().max()) / scale
        default_times, onednn_times = [], []
        for _ in range(rounds):
            default_times.append(_seconds(lambda: F.linear(x, weight, bias)))
            onednn_times.append(_seconds(lambda: _onednn_linear(x, packed, bias)))
    speedup = _median(default_times) / _median(onednn_times)
    kernel = "onednn" if error <= TOLERANCE and speedup >= MIN_SPEEDUP else "default"
    return Choice(kernel, round(speedup, 3), error)


def install_onednn(module) -> None:
    """Run `module` through a packed oneDNN weight whenever autograd is off.

    Every method of a generated Linear is the same `F.linear` over the last axis (`forward`,
    and `forward_packed*`, the padding-free pass's copies for `[Tokens, In]` rows), so each is
    rerouted alike."""
    import torch

    packed = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), PROBE_ROWS)

    def rerouted(generated):
        def forward(self, x):
            if torch.is_grad_enabled() or x.dtype != torch.float32 or x.device.type != "cpu":
                return generated(x)
            return _onednn_linear(x, packed, self.bias)
        return forward

    for name in _linear_methods(module):
        setattr(module, name, types.MethodType(rerouted(getattr(module, name)), module))
    module.linnet_kernel = "onednn"


def _linear_methods(module) -> list[str]:
    """`forward` and the packed variants the generated Linear class defines."""
    return [name for name in vars(type(module)) if name == "forward" or name.startswith("forward_packed")]


def _onednn_linear(x, packed, bias):
    import torch

    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def _seconds(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


# --------------------------------------------------------------------------- the per-machine cache


def machine_key() -> str:
    """What a timing depends on besides the shape: CPU model, threads, torch version."""
    import torch

    return f"{_cpu_model()}|threads={torch.get_num_threads()}|torch={torch.__version__}"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cache_file(cache_dir: Path) -> Path:
    return cache_dir / "kernels" / "torch-linear.json"


def _read_cache(cache_dir: Path | None) -> dict[str, Choice]:
    if cache_dir is None:
        return {}
    try:
        data = json.loads(_cache_file(cache_dir).read_text())
        entries = data.get(machine_key(), {})
        return {k: Choice(**v) for k, v in entries.items()}
    except (OSError, ValueError, TypeError):
        return {}


def _write_cache(cache_dir: Path, choices: dict[str, Choice]) -> None:
    path = _cache_file(cache_dir)
    try:
        data = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        data = {}
    data[machine_key()] = {k: vars(c) for k, c in choices.items()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(temporary, path)
    except OSError:
        log.debug("could not write the kernel cache %s", path, exc_info=True)
