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
precision asked for is refused (E0834).  A hint the CPU has no arithmetic for (bf16 without
AVX512_BF16 or AMX) runs at f32 with a warning: exact, only slower.

`build` is the onnx backend's (`linnet build --backend openvino` writes the same model.onnx).
"""
from __future__ import annotations

import threading
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np

# At the top, not in `open_runtime`: a missing package is then E0808 from
# `linnet.backends.integration`, naming the extra to install (the record's `extra`), before
# anything is compiled.
import openvino  # noqa: F401

from .. import codes, dtypes
from ..middle import ir
from ..diagnostics import Diagnostic, LinnetError
from . import OPENVINO_PRECISIONS as PRECISIONS, LoadContext, cache_dir
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
        root = ctx.root_entry
        self.generated = folder / layout(ctx.program, root)[0].file
        self.root = root
        #: Compiled graphs by entry (a computed default's by file name).
        self.compiled: dict[str, object] = {}
        #: Graph files entries run on instead of their own: the int8 plan's, or a candidate's.
        self.files: dict[str, str] = {}
        #: The int8 plan (`plan_int8`), None at f32; the quantiser that writes its graphs, and
        #: the entries that run it.
        self.int8_plan = None
        self._int8_quantiser = None
        self._int8_entries: set[str] = set()
        self._lock = threading.Lock()
        self._requests = threading.local()
        self.compiled_model(root)

    def compiled_model(self, entry: str, file: str | None = None):
        """The compiled graph of `entry` (or of the export's `file`, a computed default's), kept
        under the entry's name (or the file's)."""
        key = file or entry
        compiled = self.compiled.get(key)
        if compiled is None:
            with self._lock:
                compiled = self.compiled.get(key)
                if compiled is None:
                    file = file or self._file(entry)
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
        key = file or entry
        compiled = self.compiled_model(entry, file)
        request = requests.get(key)
        if request is None or request[0] is not compiled:  # none yet, or its graph was swapped
            request = requests[key] = compiled, compiled.create_infer_request()
        return request[1]

    @contextmanager
    def use_graph(self, entry: str, file: str):
        """Run `entry` on another graph file of the export while the block runs (the int8 plan
        measures its candidates so); the candidate's compiled model is dropped after."""
        previous = self.files.get(entry), self.compiled.pop(entry, None)
        self.files[entry] = file
        try:
            yield
        finally:
            self.files.pop(entry, None)
            self.compiled.pop(entry, None)
            if previous[0] is not None:
                self.files[entry] = previous[0]
            if previous[1] is not None:
                self.compiled[entry] = previous[1]

    def plan_int8(self, model, calibration=None, max_cosine_loss=None, min_cosine=None) -> dict:
        """Measure (or read back) the static int8 plan on the loaded f32 model (`onnx_int8.plan`
        over `int8_static.StaticInt8`), and run every entry whose graph the calibration texts
        can feed by it from now on; what it measured, for `model.info.precision`."""
        from . import onnx_int8
        from .int8_static import StaticInt8, calibration_feeds

        texts = onnx_int8.calibration_texts(calibration)
        names = tuple(n for n, _ in self.program.entries[onnx_int8.ENTRY].inputs) \
            if onnx_int8.ENTRY in self.program.entries else ()
        quantiser = StaticInt8(calibration_feeds(model, texts, names) if names else [{}], onnx_int8.texts_digest(texts))
        chosen = onnx_int8.plan(model, self, texts, max_cosine_loss, min_cosine, cache_dir(), quantiser)
        fed = set().union(*(feed.keys() for feed in quantiser.feeds))
        runs_int8 = [e for e, spec in self.program.entries.items() if {n for n, _ in spec.inputs} <= fed]
        with self._lock:
            self.int8_plan = chosen
            self._int8_quantiser, self._int8_entries = quantiser, set(runs_int8)
            self.compiled.clear()
            self._requests = threading.local()
        self.compiled_model(self.root)
        return {**chosen.info(), "entries": runs_int8}

    def _file(self, entry: str) -> str:
        """The graph file `entry` runs: a candidate's while one is measured, else the int8
        plan's (written at the entry's first call), else the export's own."""
        if entry in self.files:
            return self.files[entry]
        if self.int8_plan is not None and entry in self._int8_entries:
            file = self._int8_quantiser.file(self.folder, entry_file(entry), tuple(self.int8_plan.kept_f32)).name
            self.files[entry] = file
            return file
        return entry_file(entry)

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


def _warn_without(asked: str, arithmetic: str, caps: tuple[str, ...]) -> None:
    warnings.warn(f"{asked}: OpenVINO's CPU plugin has no {arithmetic} arithmetic on this CPU (its "
                  f"capabilities: {', '.join(caps)}); running at f32, exact but without the speed-up", stacklevel=3)


def open_runtime(ctx: LoadContext, *, device=None, precision_hint: str | None = None,
                 num_streams: int | None = None, threads: int | None = None, precision: str | None = None,
                 calibration=None, max_cosine_loss: float | None = None,
                 min_cosine: float | None = None) -> OpenVinoRuntime:
    # The options were checked against the record (types, precision words) by `nest.load`.
    # precision="int8" is planned by `finish_load` once the model (its tokenizer) exists.
    from .onnx_int8 import check_options

    int8 = check_options(precision, calibration, max_cosine_loss, min_cosine)
    if device is not None and str(device) != "cpu":
        raise LinnetError(Diagnostic(codes.BAD_DEVICE, f"the openvino backend runs on the CPU only (device='cpu' or "
                                     f"none), found device={device!r}"))
    streams = _check_count("num_streams", 1 if num_streams is None else num_streams)
    count = _check_count("threads", physical_cores() if threads is None else threads)
    caps = capabilities(openvino.Core())
    dtype = _float_dtype(ctx)
    hint = default_precision(dtype, caps) if precision_hint is None else precision_hint
    # A CPU without the instructions runs f32, which is never less exact: a bf16 hint would
    # gain nothing, and int8 would run its quantisation emulated, slower than f32.
    if _CAPABILITY[hint] not in caps:
        _warn_without(f"precision_hint={hint!r}", hint, caps)
        hint = "f32"
    if int8 and "INT8" not in caps:
        _warn_without("precision='int8'", "int8", caps)
        int8 = False
    # The graphs ORT's CPU provider runs (bf16 models: f32 nodes between bf16 tensors) unless the
    # model's bf16 is to be computed in bf16, where OpenVINO takes the native bf16 nodes.
    bf16_compute = "native" if hint == "bf16" else bf16_compute_for(dtype, cpu=True)
    folder = export_folder(ctx, bf16_compute)
    runtime = OpenVinoRuntime(ctx, folder, hint, count, streams)
    runtime.bf16_compute = bf16_compute
    if int8:
        runtime.finish_load = lambda model: runtime.plan_int8(model, calibration, max_cosine_loss, min_cosine)
    return runtime
