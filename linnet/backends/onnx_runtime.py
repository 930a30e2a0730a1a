"""The "onnx" backend: export the lowered program to ONNX, run it with ONNX Runtime.

`build(ctx, out_dir)` writes `model.onnx` (and, past 2 GiB, `model.onnx.data`); the first
path returned is always the root entry's `model.onnx`, so other exporters (Triton) can call
it and take `paths[0]`.  `graph_io(ctx)` describes that file's inputs and outputs from the
lowered program alone, without weights.  `open_runtime` exports once per cache key into
`$LINNET_CACHE/generated/onnx/`, one model per entry sharing one weights file, and opens
an `onnxruntime.InferenceSession` per entry on first use (see `OnnxRuntime`).
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from .. import codes
from . import LoadContext, cache_dir, kernel_choice
from .. import dtypes
from ..middle import ir
from ..diagnostics import Diagnostic, LinnetError
from .measured import proc_cpuinfo
from .onnx_files import PREFILL_FILE, STEP_FILE, WEIGHTS_FILE, default_file, entry_file, node_reads

#: The export embeds the weights, so `linnet build --backend onnx` reads the checkpoint.
BUILD_NEEDS_WEIGHTS = True

#: Providers tried by default, best first.  TensorRT is not among them: with dynamic B and S
#: it builds an engine per new shape profile (minutes); name it in providers= to use it.
DEFAULT_PROVIDERS = ("CUDAExecutionProvider", "CPUExecutionProvider")


def _emit_each(ctx: LoadContext, tensors: dict, bf16_compute: str, params_in_place: bool = False,
               entries=None):
    """The entry's ONNX models one at a time (`onnx_graph.emit_each`), their weights deferred:
    each graph's initializers name the arrays of `tensors` and hold no bytes yet.  entries:
    only model.onnx and the files answering these (None: all)."""
    from .onnx_graph import emit_each

    manifest = ctx.manifest
    root = manifest.source.entry if manifest is not None else None
    source = ctx.name if manifest is None else f"{ctx.name} ({manifest.source.root}, entries {', '.join(ctx.program.entries)})"
    return emit_each(ctx.program, tensors, name=ctx.name,
                     outputs={e: ctx.output_name(e) for e in ctx.program.entries}, root_entry=root,
                     generics=ctx.compiled.generics, bf16_compute=bf16_compute, source=source,
                     params_in_place=params_in_place, defer_weights=True, entries=entries)


def _export(ctx: LoadContext, out_dir: Path, bf16_compute: str = "native", entries=None) -> list[Path]:
    """Emit, save and validate every file of the entry's layout; model.onnx first.  Each file
    is self-contained (weights inline up to 2 GiB), emitted, written and dropped before the
    next, so one graph's copy of the weights is in memory at a time.  entries: write only
    model.onnx and the files (and computed defaults) of these entries (None: all)."""
    import onnx

    from .onnx_graph import inline_weights, save

    paths: list[Path] = []
    for model_file in _emit_each(ctx, ctx.tensors("numpy"), bf16_compute, entries=entries):
        inline_weights(model_file)
        written = save(model_file, out_dir)
        model_file.model = None  # the weights are on disk now; let the copy in memory go
        # The saved file is what users get, so that is what is checked (full shape inference).
        onnx.checker.check_model(str(written[0]), full_check=True)
        paths += written
    # Graph inputs cannot be computed when left out: each computed default is a graph of its own.
    return paths + _write_default_models(ctx, ctx.tensors("numpy"), out_dir, bf16_compute, entries)


def build(ctx: LoadContext, out_dir: Path, dtype: str | None = None, entries=None) -> list[Path]:
    """Write the ONNX model(s) to out_dir; the first path is the root entry's model.onnx.

    dtype is the load-time float dtype and must agree with the one `ctx` was prepared with
    (`linnet build --dtype` prepares it), since the lowered program's types carry it.
    entries: write only model.onnx and the files of these entries, each file a full copy of
    the weights it reads (a Triton export serves GPT-2's forward, not its cache steps).
    """
    _check_dtype(ctx, dtype)
    return _export(ctx, Path(out_dir), entries=entries)


def graph_io(ctx: LoadContext) -> tuple[list[tuple[str, str, list]], list[tuple[str, str, list]]]:
    """model.onnx's inputs and outputs: (name, ONNX element type name, dims), dims being ints
    for fixed sizes and dim names ("B", "S") for the free ones — what a Triton config needs."""
    from onnx import TensorProto

    from .onnx_graph import elem_type, layout, value_dims

    program = ctx.program
    first = layout(program, ctx.manifest.source.entry if ctx.manifest is not None else None)[0]
    entry = program.entries[first.entries[0]]
    inputs = [(n, TensorProto.DataType.Name(elem_type(t.dtype)), value_dims(t)) for n, t in entry.inputs]
    outputs = [(name, TensorProto.DataType.Name(elem_type(t.dtype)), value_dims(t)) for e in first.entries
               for name, t in zip(ir.output_names(program.entries[e], ctx.output_name(e)),
                                  ir.result_types(program.entries[e].result))]
    return inputs, outputs


def _check_dtype(ctx: LoadContext, dtype: str | None) -> None:
    if dtype is not None and ctx.dtype is not None and dtype != ctx.dtype:
        raise LinnetError(Diagnostic(codes.BUILD_DTYPE_MISMATCH,
                                     f"build(dtype={dtype!r}) disagrees with the dtype the program "
                                     f"was prepared with ({ctx.dtype!r}); prepare it with dtype={dtype!r}"))


def _float_dtype(ctx: LoadContext) -> str:
    """The model's float dtype: the one asked for, else the first float among its params."""
    if ctx.dtype is not None:
        return ctx.dtype
    floats = [t.dtype for _, t in ctx.program.param_paths() if dtypes.by_name(t.dtype).is_float]
    return floats[0] if floats else "f32"


# ------------------------------------------------------------------------ providers


def physical_cores(cpuinfo: str | None = None) -> int:
    """Physical cores (ONNX Runtime runs best with one intra-op thread per core).

    On Linux the distinct (physical id, core id) pairs of /proc/cpuinfo, which the process has
    read already (`measured`); psutil, whose import took 12-15 ms of a 0.3 s warm load, only
    where that file does not name cores (some ARM kernels, other systems).  `cpuinfo`: that
    file's text instead of this machine's."""
    cores, package = set(), "0"
    for line in (proc_cpuinfo() if cpuinfo is None else cpuinfo).splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "physical id":
            package = value.strip()
        elif key.strip() == "core id":
            cores.add((package, value.strip()))
    if cores:
        return len(cores)
    try:
        import psutil

        count = psutil.cpu_count(logical=False)
        if count:
            return count
    except ImportError:
        pass
    return os.cpu_count() or 1


def resolve_providers(providers=None, device=None) -> list:
    """The providers to open the session with; unknown ones are an error naming the available."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    if providers is not None and device is not None:
        raise LinnetError(Diagnostic(codes.ONNX_BAD_DEVICE, "give device= or providers= to the onnx backend, not both "
                                     f"(device={device!r}, providers={providers!r})"))
    if providers is None:
        if device is None:
            return [p for p in DEFAULT_PROVIDERS if p in available]
        kind, _, index = str(device).partition(":")
        if kind == "cpu":
            return ["CPUExecutionProvider"]
        if kind == "cuda":
            if "CUDAExecutionProvider" not in available:
                raise LinnetError(Diagnostic(codes.ONNX_BAD_DEVICE,
                                             f"device {device!r} asked for, but this onnxruntime has no "
                                             f"CUDAExecutionProvider (available: {', '.join(available)}); "
                                             "install onnxruntime-gpu"))
            options = {"device_id": int(index)} if index.isdigit() else {}
            return [("CUDAExecutionProvider", options), "CPUExecutionProvider"]
        raise LinnetError(Diagnostic(codes.ONNX_BAD_DEVICE,
                                     f"unknown device {device!r} for the onnx backend: use 'cpu', "
                                     "'cuda' or 'cuda:N', or name ONNX Runtime providers with providers="))
    if isinstance(providers, (str, tuple)):
        providers = [providers]
    resolved = []
    for p in providers:
        name = p[0] if isinstance(p, tuple) else p
        if name not in available:
            raise LinnetError(Diagnostic(codes.ONNX_PROVIDER_UNAVAILABLE,
                                         f"ONNX Runtime provider {name!r} is not available here; "
                                         f"available: {', '.join(available)}"))
        resolved.append(p)
    return resolved


def _provider_name(p) -> str:
    return p[0] if isinstance(p, tuple) else p


# -------------------------------------------------------------------------- runtime


class OnnxRuntime:
    """One ONNX Runtime session per entry, opened on the entry's first call.

    ONNX Runtime runs every node of a graph whatever outputs are asked for, so an entry
    sharing a file with bert-base's masked-LM head would pay for its [S, 30522] matmul on
    every call.  The runtime therefore opens `model.<entry>.onnx`, the graph cut down to
    what the entry's output needs (`_write_entry_models`); those files share one weights
    file.  The root entry's session opens at load, so a broken export fails there; for a
    decoder it is the first graph `generate` runs instead (opening `forward` too would hold
    another copy of the weights that generate never reads): the step graph where it takes the
    prompt (the Llama source's `extend`; then generate opens no other), else the prefill graph.

    `share_weights=True` gives every session one memory-mapped copy of each weight
    (`onnx_weights.SharedWeights`), with ORT's per-session pre-packing off.
    """

    backend = "onnx"

    def __init__(self, ctx: LoadContext, folder: Path, providers: list, kernels: str = "auto",
                 share_weights: bool = False):
        import threading

        from .onnx_files import layout
        from .onnx_options import SessionChoice, choose, default_settings, session_options

        self.program = ctx.program
        self.folder = folder
        root = ctx.root_entry
        threads = physical_cores()
        #: The session options measured for this machine and model (`onnx_options`); the
        #: default session's when not measured (kernels="default", a provider other than CPU).
        self.session_choice = SessionChoice({})
        measured_here = kernels == "auto" and _provider_name(providers[0]) == "CPUExecutionProvider" \
            and all(t.dtype != "bf16" for t in ir.result_types(ctx.program.entries[root].result))
        if measured_here:
            self.session_choice = choose(folder / entry_file(root), providers, threads, cache_dir=cache_dir(),
                                         model_key=f"{folder.name}/{entry_file(root)}")
        self.settings = {**default_settings(threads), **self.session_choice.settings}
        self.options = session_options(self.settings)
        #: The one copy of the weights every session reads, when loaded with share_weights=True.
        self.shared_weights = None
        if share_weights:
            from .onnx_weights import SharedWeights

            self.shared_weights = SharedWeights(folder)
        self._providers = providers
        self._lock = threading.Lock()
        self.root = root
        #: The int8 plan every session runs by (`plan_int8`), None at f32.
        self.int8_plan = None
        self.sessions: dict[str, object] = {}
        #: Each entry's graph outputs: one name, or one per result of an entry with several.
        self.outputs = {entry: ir.output_names(e, ctx.output_name(entry)) for entry, e in ctx.program.entries.items()}
        self.generated = folder / layout(ctx.program, root)[0].file
        first = _first_session(folder, root, ctx.program)
        #: The graph file whose session opens from this machine's saved pre-packed copy
        #: (`onnx_prepacked`): the one a load opens, with kernels="auto", its weights packed.
        self._prepacked_file = None
        #: How that session got its packed weights: "loaded" (the saved copy), "saved" (packed
        #: at load, the copy written for the next), "not saved", or None (not this load's case).
        self.prepacked = None
        if measured_here and not share_weights:
            from .onnx_prepacked import worth_saving

            if worth_saving(folder):
                self._prepacked_file = _graph_file(first)
        self.providers = self.session(first).get_providers()

    def session(self, entry: str):
        """The entry's session (or a file's, named with its `.onnx`), opened once (threads
        calling at once share one)."""
        session = self.sessions.get(entry)
        if session is None:
            with self._lock:
                session = self.sessions.get(entry)
                if session is None:
                    file = _graph_file(entry)
                    if self.int8_plan is not None:
                        from .onnx_int8 import quantised_file

                        file = quantised_file(self.folder, file, tuple(self.int8_plan.kept_f32)).name
                    session = self.open_file(file)
                    self.sessions[entry] = session
        return session

    def open_file(self, file: str):
        """A new session on one graph file of the export folder, with the runtime's options."""
        import onnxruntime as ort

        if file == self._prepacked_file and self.int8_plan is None:
            session = self._open_prepacked(file)
            if session is not None:
                return session
        return ort.InferenceSession(str(self.folder / file), sess_options=self._options_for(file),
                                    providers=self._providers)

    def _open_prepacked(self, file: str):
        """The session on `file` from (or saving) this machine's pre-packed copy; None when
        that did not work out (`onnx_prepacked` logs why)."""
        from .onnx_options import session_options
        from .onnx_prepacked import open_session, saved_folder

        def options_for(graph_optimization: bool):
            settings = self.settings if graph_optimization else {**self.settings, "graph_optimization_level": "off"}
            return session_options(settings)

        saved = saved_folder(cache_dir(), self.folder, file, self.settings)
        session, self.prepacked = open_session(self.folder / file, saved, options_for, self._providers)
        return session

    @contextmanager
    def use_graph(self, entry: str, file: str):
        """Run `entry` on another graph file of the export while the block runs (the int8 plan
        measures its candidates so)."""
        session = self.open_file(file)
        previous = self.sessions.get(entry)
        self.sessions[entry] = session
        try:
            yield
        finally:
            if previous is None:
                self.sessions.pop(entry, None)
            else:
                self.sessions[entry] = previous

    def plan_int8(self, model, calibration=None, max_cosine_loss=None, min_cosine=None) -> dict:
        """Measure (or read back) the int8 plan on the loaded f32 model (`onnx_int8.plan`) and run
        every entry by it from now on; what it measured, for `model.info.precision`."""
        from . import onnx_int8

        # `plan` fills in the default texts and budget.
        chosen = onnx_int8.plan(model, self, calibration, max_cosine_loss, min_cosine, cache_dir())
        with self._lock:
            self.int8_plan = chosen
            self.sessions.clear()
        self.session(_first_session(self.folder, self.root, self.program))
        return chosen.info()

    def _options_for(self, file: str):
        """The session options for one graph file: the shared ones, unless the weights are
        shared (add_initializer binds names, and each file has its own, so its own options)."""
        if self.shared_weights is None:
            return self.options
        from .onnx_options import session_options

        options = session_options(self.settings)
        self.shared_weights.register(options, file)
        return options

    def decoder_steps(self):
        """generate's prefill and step on the per-layer past-key-value graphs (IOBinding), or
        None where the export has none (not a decoder; bf16 on the CPU provider)."""
        from .onnx_decoder import PastKeyValueSteps, cache_layers, prompt_on_step

        if not (self.folder / STEP_FILE).exists():
            return None
        step = self.session(STEP_FILE)
        # A step graph that takes the prompt runs it too: no prefill session, no second copy of the weights.
        prefill = None if prompt_on_step(self.program, step) else self.session(PREFILL_FILE)
        layers = cache_layers(self.program)
        device = "cuda" if self.providers[0] == "CUDAExecutionProvider" else "cpu"
        return PastKeyValueSteps(prefill, step, layers, device)

    def run(self, entry: str, inputs: list[np.ndarray]) -> np.ndarray:
        session = self.session(entry)
        spec = self.program.entries[entry]
        names = [n for n, _ in spec.inputs]
        feeds = dict(zip(names, inputs))
        for name in names:  # a left-out input with a computed default: its own graph first
            if feeds[name] is None:

                args = {a: feeds[a] for a in spec.computed[name].args}
                feeds[name] = self.session(default_file(entry, name)).run([name], args)[0]
        outputs = self.outputs[entry]
        if any(t.dtype == "bf16" for t in ir.result_types(spec.result)):
            values = [_run_bf16(session, feeds, output) for output in outputs]
        else:
            values = session.run(outputs, feeds)
        return tuple(values) if isinstance(spec.result, ir.TupleType) else values[0]


def _graph_file(entry: str) -> str:
    """The export's graph file a session name stands for: an entry's, or a file named as such."""
    return entry if entry.endswith(".onnx") else entry_file(entry)


def _first_session(folder: Path, root: str, program) -> str:
    """The session opened at load: where the export has decoder graphs, the first one generate
    runs (the step graph where it takes the prompt, `onnx_decoder.takes_prompt`, else the
    prefill graph), so a loaded decoder that only generates holds no `forward` session; else
    the root entry's."""
    if not (folder / STEP_FILE).exists():
        return root
    from .onnx_decoder import takes_prompt  # a decoder's export only: an encoder's load does without it

    return STEP_FILE if takes_prompt(program) else PREFILL_FILE


def _write_entry_models(ctx: LoadContext, out_dir: Path, bf16_compute: str, params_in_place: bool = False) -> None:
    """The runtime's export: one model per entry, cut to its output, all reading one weights
    file.  Only initializers of 1 KB and more go to that file; small constants stay inline.
    params_in_place: the variant for `share_weights=True` (`GraphEmitter.params_in_place`).

    One graph is in memory at a time, without its weights' bytes: `onnx_external` copies each
    weight from the checkpoint's array to the weights file as the graph is saved (bert-base's
    seven graphs held 4.7 GB when emitted together with their weights inline)."""
    import onnx

    from .onnx_external import ExternalWeights

    tensors = ctx.tensors("numpy")
    weights = ExternalWeights(out_dir)
    for index, model_file in enumerate(_emit_each(ctx, tensors, bf16_compute, params_in_place)):
        model = model_file.model
        data = WEIGHTS_FILE if index == 0 else f"{WEIGHTS_FILE}.{index}"
        path = weights.save(model, model_file.weights, model_file.file, data)
        onnx.checker.check_model(str(path), full_check=True)
        for entry in model_file.entries:
            outputs = ir.output_names(ctx.program.entries[entry], ctx.output_name(entry))
            onnx.save(cut_to_output(model, outputs), str(out_dir / entry_file(entry)))
        model_file.model = model = None
    _write_default_models(ctx, tensors, out_dir, bf16_compute)
    if has_decoder_entries(ctx.program) and bf16_compute == "native":
        from .onnx_decoder import write_decoder_models

        def share(model_file, path: Path, data: str) -> Path:
            weights.save(model_file.model, model_file.weights, path.name, data)
            onnx.checker.check_model(str(path), full_check=True)
            return path

        write_decoder_models(ctx.program, tensors, ctx.name, out_dir, share, params_in_place)


def _write_default_models(ctx: LoadContext, tensors: dict, out_dir: Path, bf16_compute: str,
                          entries=None) -> list[Path]:
    """One graph per computed default (`onnx_graph.default_model`), which `run` runs first
    when the caller leaves that input out; entries: only those of these entries (None: all)."""
    import onnx

    from .onnx_graph import default_model

    paths = []
    for entry in ctx.program.entries.values():
        if entries is not None and entry.name not in entries:
            continue
        for param in entry.computed:
            path = out_dir / default_file(entry.name, param)
            onnx.save(default_model(ctx.program, tensors, entry, param, bf16_compute=bf16_compute), str(path))
            onnx.checker.check_model(str(path), full_check=True)
            paths.append(path)
    return paths


def has_decoder_entries(program) -> bool:
    """Whether the program generates (prefill, decode), so the runtime's export
    also holds the optimum-style graphs of linnet/backends/onnx_decoder.py."""
    return all(e in program.entries for e in ("prefill", "decode"))


def cut_to_output(model, output):
    """A copy of `model` holding only the nodes and initializers `output` (a name, or a list
    of names) depends on (the graph inputs stay, so callers feed every entry alike)."""
    import onnx

    graph = model.graph
    outputs = [output] if isinstance(output, str) else list(output)
    producer = {name: node for node in graph.node for name in node.output}
    needed, pending = set(), list(outputs)
    while pending:
        name = pending.pop()
        if name in needed:
            continue
        needed.add(name)
        node = producer.get(name)
        if node is not None:
            pending.extend(node_reads(node))  # a Loop's body reads outer values by name
    cut = onnx.ModelProto()
    cut.CopyFrom(model)  # cheap: the initializers hold references, not data
    for field, keep in (("node", lambda n: any(o in needed for o in n.output)),
                        ("initializer", lambda t: t.name in needed),
                        ("value_info", lambda v: v.name in needed),
                        ("output", lambda v: v.name in outputs)):
        kept = [item for item in getattr(graph, field) if keep(item)]
        del getattr(cut.graph, field)[:]
        getattr(cut.graph, field).extend(kept)
    return cut


def _run_bf16(session, feeds: dict, output: str) -> np.ndarray:
    """ORT's Python API has no numpy type for bf16 results: bind the output, copy its bytes."""
    import ctypes

    binding = session.io_binding()
    for name, array in feeds.items():
        binding.bind_cpu_input(name, array)
    binding.bind_output(output, "cpu")
    session.run_with_iobinding(binding)
    value = binding.get_outputs()[0]
    shape = tuple(value.shape())
    result = np.empty(shape, dtype=np.uint16)
    ctypes.memmove(result.ctypes.data, value.data_ptr(), result.nbytes)
    return result.view(dtypes.by_name("bf16").numpy_type())


def bf16_compute_for(dtype: str, cpu: bool) -> str:
    """Which bf16 variant of the export to write: ORT's CPU provider has no bf16 arithmetic
    kernels, so where it runs the graph, the variant that computes each node in f32 between
    bf16 tensors ("f32"); else bf16 nodes ("native")."""
    return "f32" if dtype == "bf16" and cpu else "native"


def export_folder(ctx: LoadContext, bf16_compute: str, share_weights: bool = False) -> Path:
    """The runtime's export (`_write_entry_models`) in the cache, written on first use: one
    model per entry, all reading one weights file.  Every runtime of these graphs (ONNX
    Runtime here, OpenVINO in `openvino_runtime`) opens this folder, so loading a model on both
    exports it once.  The files hold the weights, so the folder is keyed by the checkpoint
    (and bindings) too: another `weights=` file must never reuse a graph built from the first."""
    options = {"dtype": _float_dtype(ctx), "bf16_compute": bf16_compute, "weights": ctx.weights_identity}
    if share_weights:  # its own export: tied heads read the shared weight in place (onnx_weights)
        options["params_in_place"] = True

    def write(folder: Path) -> None:
        _write_entry_models(ctx, folder, bf16_compute, params_in_place=share_weights)

    return ctx.cached("onnx", "", write, options=options)


def open_runtime(ctx: LoadContext, *, device=None, providers=None, kernels: str | None = None,
                 share_weights: bool | None = None, precision: str | None = None, calibration=None,
                 max_cosine_loss: float | None = None, min_cosine: float | None = None) -> OnnxRuntime:
    # The options were checked against the record by `nest.load`.  precision="int8" is planned by
    # `finish_load` once the model (its tokenizer, `encode`) exists; the graphs are exported f32.
    int8 = False
    if any(option is not None for option in (precision, calibration, max_cosine_loss, min_cosine)):
        from .onnx_int8 import check_options  # imported only when asked: a plain load does without it

        int8 = check_options(precision, calibration, max_cosine_loss, min_cosine)
    if int8 and share_weights:
        raise LinnetError(Diagnostic(codes.UNKNOWN_BACKEND_OPTION, "precision='int8' and share_weights=True do not "
                                     "go together: the int8 graphs hold their own (int8) weights"))
    chosen = resolve_providers(providers, device)  # before reading any weights
    bf16_compute = bf16_compute_for(_float_dtype(ctx), _provider_name(chosen[0]) == "CPUExecutionProvider")
    folder = export_folder(ctx, bf16_compute, share_weights=bool(share_weights))
    runtime = OnnxRuntime(ctx, folder, chosen, kernel_choice(kernels), share_weights=bool(share_weights))
    runtime.bf16_compute = bf16_compute
    if int8:
        runtime.finish_load = lambda model: runtime.plan_int8(model, calibration, max_cosine_loss, min_cosine)
    return runtime
