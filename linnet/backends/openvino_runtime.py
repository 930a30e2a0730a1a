"""The "openvino" backend: the onnx backend's graphs, run by OpenVINO's CPU plugin.

The graphs are the onnx backend's own, from the same export (`onnx_runtime.export_folder`:
one cut-down `model.<entry>.onnx` per entry, every dtype, packed or padded as `nest.load`'s
passes made the program), so a model loaded on both backends is exported once.  OpenVINO
reads each entry's file (`Core().read_model`, its ONNX front end), keeps the free dims (B, S,
the packed token count) dynamic, and compiles it for the CPU on the entry's first call; the
root entry compiles at load, so a graph OpenVINO cannot take fails there.

Precision is never OpenVINO's to choose.  Its CPU plugin runs an f32 model in bf16 by default
on a CPU with AVX512_BF16 or AMX (this project's AMD EPYC among them: `INFERENCE_PRECISION_HINT`
reads `bf16` on a fresh `Core()`), which moves MiniLM's hidden state by ~1e-2, so every
compile sets the hint (`precision_hint`, default: the model's float dtype, f32 for an f32
model) and reads it back from the compiled model: a compiled model that does not run at the
precision asked for is refused (E0834), as is a hint the CPU has no arithmetic for.

`build` is the onnx backend's (`linnet build --backend openvino` writes the same model.onnx).
"""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

# At the top, not in `open_runtime`: a missing package is then E0808 from
# `linnet.backends.integration`, naming the extra to install (the record's `extra`), before
# anything is compiled.
import openvino  # noqa: F401

from .. import codes, dtypes
from ..middle import ir
from ..diagnostics import Diagnostic, LinnetError
from . import OPENVINO_PRECISIONS as PRECISIONS, LoadContext
from .onnx_files import default_file, entry_file
from .onnx_runtime import (BUILD_NEEDS_WEIGHTS, _float_dtype, bf16_compute_for, build,  # noqa: F401
                           export_folder, graph_io, physical_cores)

#: Linnet's name -> the word OpenVINO's `INFERENCE_PRECISION_HINT` takes (and `openvino.Type.<word>`
#: is what a compiled model reads back).
_HINT = {"f32": "f32", "bf16": "bf16", "f16": "f16"}
#: Linnet's name -> what the CPU plugin lists in OPTIMIZATION_CAPABILITIES when it has it.
_CAPABILITY = {"f32": "FP32", "bf16": "BF16", "f16": "FP16"}


def capabilities(core) -> tuple[str, ...]:
    return tuple(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"))


def default_precision(dtype: str, caps: tuple[str, ...]) -> str:
    """The hint when none is given: the model's float dtype where the CPU has arithmetic for it,
    else f32 (a bf16 or f16 model then computes in f32 between its bf16/f16 tensors, as the onnx
    backend's CPU export does: more exact, never less)."""
    return dtype if dtype in _CAPABILITY and _CAPABILITY[dtype] in caps else "f32"


def compile_config(precision: str, threads: int, num_streams: int) -> dict:
    """What `compile_model(model, "CPU", config)` is given: the precision (the one setting that
    changes results), threads and streams, always explicit; the rest are OpenVINO's defaults."""
    return {"INFERENCE_PRECISION_HINT": _HINT[precision], "INFERENCE_NUM_THREADS": int(threads),
            "NUM_STREAMS": int(num_streams)}


def hint_of(compiled) -> str:
    """The compiled model's inference precision, as Linnet names it ("f32", "bf16", "f16"; any
    other element type by OpenVINO's own name, which then matches no precision asked for)."""
    value = compiled.get_property("INFERENCE_PRECISION_HINT")
    return next((name for name in PRECISIONS if value == getattr(openvino.Type, name)), str(value))


class OpenVinoRuntime:
    """One compiled model per entry, compiled on the entry's first call (threads calling at once
    share one), and one infer request per entry and calling thread (an infer request runs one
    call at a time)."""

    backend = "openvino"

    def __init__(self, ctx: LoadContext, folder: Path, precision: str, threads: int, num_streams: int):
        from .onnx_graph import layout

        self.core = openvino.Core()
        self.program = ctx.program
        self.folder = folder
        self.precision = precision
        self.config = compile_config(precision, threads, num_streams)
        self.outputs = {entry: ctx.output_name(entry) for entry in ctx.program.entries}
        root = ctx.manifest.source.entry if ctx.manifest is not None else next(iter(ctx.program.entries))
        self.generated = folder / layout(ctx.program, root)[0].file
        self.compiled: dict[str, object] = {}
        self._lock = threading.Lock()
        self._requests = threading.local()
        self.compiled_model(root)

    def compiled_model(self, entry: str, file: str | None = None):
        """The compiled graph of `entry` (or of the export's `file`, a computed default's), kept
        under the entry's name (or the file's)."""
        key = file or entry
        file = file or entry_file(entry)
        compiled = self.compiled.get(key)
        if compiled is None:
            with self._lock:
                compiled = self.compiled.get(key)
                if compiled is None:
                    model = self.core.read_model(str(self.folder / file))
                    compiled = self.core.compile_model(model, "CPU", self.config)
                    ran = hint_of(compiled)
                    if ran != self.precision:
                        raise LinnetError(Diagnostic(codes.OPENVINO_PRECISION, (
                            f"OpenVINO compiled {file} to run at {ran}, not at the {self.precision} "
                            f"asked for (INFERENCE_PRECISION_HINT={self.config.get('INFERENCE_PRECISION_HINT')}); "
                            "Linnet runs no model at a precision other than the one asked for")))
                    self.compiled[key] = compiled
        return compiled

    def _request(self, entry: str, file: str | None = None):
        requests = getattr(self._requests, "by_file", None)
        if requests is None:
            requests = self._requests.by_file = {}
        key = file or entry_file(entry)
        request = requests.get(key)
        if request is None:
            request = requests[key] = self.compiled_model(entry, file).create_infer_request()
        return request

    def run(self, entry: str, inputs: list[np.ndarray]) -> np.ndarray:
        spec = self.program.entries[entry]
        names = [n for n, _ in spec.inputs]
        feeds = dict(zip(names, inputs))
        for name in names:  # a left-out input with a computed default: its own graph first
            if feeds[name] is None:

                computing = self._request(entry, default_file(entry, name))
                computing.infer({a: feeds[a] for a in spec.computed[name].args})
                feeds[name] = computing.get_output_tensor(0).data.copy()
        request = self._request(entry)
        request.infer(feeds)
        # One output per result, in the graph's order (onnx_graph writes them so).
        values = tuple(_output(request.get_output_tensor(i).data, t)
                       for i, t in enumerate(ir.result_types(spec.result)))
        return values if isinstance(spec.result, ir.TupleType) else values[0]


def _output(result, t) -> np.ndarray:
    if t.dtype == "bf16":
        # OpenVINO's Python API hands bf16 bits out as a float16 array: reinterpret them.
        return result.view(np.uint16).view(dtypes.by_name("bf16").numpy_type()).copy()
    return result.copy()  # the request's own buffer: the next call overwrites it


def _check_count(name: str, value: int) -> int:
    if value < 1:
        raise LinnetError(Diagnostic(codes.UNKNOWN_BACKEND_OPTION,
                                     f"{name} must be a whole number >= 1 for the openvino backend, found {value}"))
    return value


def open_runtime(ctx: LoadContext, *, device=None, precision_hint: str | None = None,
                 num_streams: int | None = None, threads: int | None = None) -> OpenVinoRuntime:
    # The options were checked against the record (types, precision words) by `nest.load`.
    if device is not None and str(device) != "cpu":
        raise LinnetError(Diagnostic(codes.BAD_DEVICE, f"the openvino backend runs on the CPU only (device='cpu' or "
                                     f"none), found device={device!r}"))
    streams = _check_count("num_streams", 1 if num_streams is None else num_streams)
    count = _check_count("threads", physical_cores() if threads is None else threads)
    caps = capabilities(openvino.Core())
    dtype = _float_dtype(ctx)
    precision = default_precision(dtype, caps) if precision_hint is None else precision_hint
    if _CAPABILITY[precision] not in caps:
        raise LinnetError(Diagnostic(codes.OPENVINO_PRECISION,
                                     f"precision_hint={precision!r}: OpenVINO's CPU plugin has no {precision} "
                                     f"arithmetic on this CPU (its capabilities: {', '.join(caps)})"))
    # The graphs ORT's CPU provider runs (bf16 models: f32 nodes between bf16 tensors) unless the
    # model's bf16 is to be computed in bf16, where OpenVINO takes the native bf16 nodes.
    bf16_compute = "native" if precision == "bf16" else bf16_compute_for(dtype, cpu=True)
    folder = export_folder(ctx, bf16_compute)
    runtime = OpenVinoRuntime(ctx, folder, precision, count, streams)
    runtime.bf16_compute = bf16_compute
    return runtime
