"""Triton Inference Server model repositories from a zoo entry.

    export_triton(ctx, "repo/")    # repo/<entry name>/config.pbtxt, repo/<entry name>/1/model.onnx

One Triton model serves every entry of the Linnet program at once: the ONNX backend writes
a single graph whose inputs are the entries' shared inputs (`tokens`, `token_types`) and
whose outputs are the entries' results under their `[outputs]` names (`hidden`, `pooled`).
The config is derived from the Linnet signatures, not read back from the ONNX file: shapes,
dtypes and the batch dim come from the types the checker proved, and the ONNX graph is then
checked against them, so a disagreement is caught here and not by a client at run time.

Two layouts:

* `runtime="onnxruntime"` (production): `platform: "onnxruntime_onnx"`, Triton's own ONNX
  Runtime backend runs `1/model.onnx`; dynamic batching on.
* `runtime="python"`: the same `1/model.onnx` run by ONNX Runtime inside Triton's Python
  backend (`1/model.py`), for Triton builds without the ONNX Runtime backend.  `model.py`
  validates every request like `linnet.runtime.InputValidator` does (rank, dtype, dims that
  agree, the entry's `where` preconditions, id ranges); the bounds are taken from the Linnet
  program at export time and written to `1/linnet_io.json`, never hard-coded.

The config text is written by a small protobuf-text formatter below, so exporting does not
need tritonclient; the tests parse it with Triton's own `ModelConfig` schema.

Why over 500 lines: both Triton layouts (ONNX Runtime and python) share the I/O description,
the config writer and the bounds file; keeping them together keeps the two configs in step.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from .. import __version__, codes, dtypes
from ..middle import ir
from ..diagnostics import Diagnostic, InternalError, LinnetError
from ..runtime import index_bounds

__all__ = ["RUNTIMES", "TritonIO", "triton_io", "config_text", "export_triton"]

RUNTIMES = ("onnxruntime", "python")

_MODEL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def _error(code: codes.ErrorCode, message: str) -> LinnetError:
    return LinnetError(Diagnostic(code, message))


# ------------------------------------------------------------------ signatures


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str  # Linnet dtype
    dims: tuple[str, ...]  # every dim as Linnet prints it, batch included ("B", "S", "384")


@dataclass(frozen=True)
class Input(Tensor):
    #: The fill value when a request leaves the input out (`= zeros` / `= ones` in Linnet).
    default: int | None = None


@dataclass(frozen=True)
class Output(Tensor):
    entry: str
    preconditions: tuple[tuple[str, str, str], ...]  # ("S", "<=", "512")
    bounds: dict  # input name -> rows of the table it indexes


@dataclass(frozen=True)
class TritonIO:
    """What one Triton model of a zoo entry takes and gives, in Linnet's own terms."""

    name: str
    batch_dim: str | None  # the leading dim every input and output shares, e.g. "B"
    inputs: tuple[Tensor, ...]
    outputs: tuple[Output, ...]
    #: Dims every entry pins to one value by a precondition (`where H == 224`): Triton's config
    #: states them as that number, so a client sees [3, 224, 224] rather than [3, -1, -1].
    fixed: dict = field(default_factory=dict)


def _dims(t: ir.TensorType) -> tuple[str, ...]:
    return tuple(str(d) for d in t.dims)


def triton_io(ctx) -> TritonIO:
    """The inputs and outputs of the Triton model for `ctx` (a `LoadContext`), from its program.

    Every entry becomes one output; the entries must take the same inputs, since they are
    served by one graph.
    """
    program: ir.Program = ctx.program
    entries = list(program.entries.values())
    if not entries:
        raise _error(codes.TRITON_INCOMPATIBLE_ENTRIES, f"{ctx.name} has no entries to serve")
    first = entries[0]
    inputs = tuple(Input(n, t.dtype, _dims(t), first.defaults.get(n)) for n, t in first.inputs)
    outputs = []
    for entry in entries:
        mine = tuple(Input(n, t.dtype, _dims(t), entry.defaults.get(n)) for n, t in entry.inputs)
        if mine != inputs:
            raise _error(codes.TRITON_INCOMPATIBLE_ENTRIES,
                         f"{ctx.name}: entries `{first.name}` and `{entry.name}` take different inputs "
                         f"({', '.join(f'{i.name}: {i.dims}' for i in inputs)} vs "
                         f"{', '.join(f'{i.name}: {i.dims}' for i in mine)}), so one Triton model cannot serve both")
        bounds = {name: b.rows for name, b in index_bounds(program, entry).items()}
        outputs.append(Output(ctx.output_name(entry.name), entry.result.dtype, _dims(entry.result), entry.name,
                              tuple((str(l), op, str(r)) for l, op, r, _ in entry.preconditions), bounds))
    names = [t.name for t in (*inputs, *outputs)]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise _error(codes.TRITON_INCOMPATIBLE_ENTRIES,
                     f"{ctx.name}: the name {', '.join(f'`{c}`' for c in clash)} is used by more than one "
                     "input or output; rename the entry's result in nest.toml [outputs]")
    for t in (*inputs, *outputs):
        if dtypes.by_name(t.dtype).triton is None:
            raise _error(codes.TRITON_BAD_DTYPE,
                         f"{ctx.name}: `{t.name}` has dtype {t.dtype}, which Triton has no type for")
    # The batch dim: the leading dim of the first input, when it is a free dim of the entry.
    lead = inputs[0].dims[0] if inputs and inputs[0].dims else None
    batch = lead if lead in first.dims and all(t.dims and t.dims[0] == lead for t in (*inputs, *outputs)) else None
    fixed = _fixed_dims(entries[0])
    for entry in entries[1:]:
        fixed = {d: v for d, v in _fixed_dims(entry).items() if fixed.get(d) == v}
    return TritonIO(ctx.name, batch, inputs, tuple(outputs), fixed)


def _fixed_dims(entry: ir.Entry) -> dict[str, int]:
    """The entry's dims a precondition `D == n` pins to the number n."""
    fixed = {}
    for left, op, right, _ in entry.preconditions:
        for dim, value in ((left, right), (right, left)):
            if op == "==" and str(dim) in entry.dims and value.as_int() is not None:
                fixed[str(dim)] = value.as_int()
    return fixed


# ---------------------------------------------------------------------- config


class _Enum(str):
    """A protobuf enum value: written bare, not quoted."""


def _scalar(value) -> str:
    if isinstance(value, _Enum):
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(str(value))  # a double-quoted string with escapes protobuf text reads


def _format(fields: list[tuple[str, object]], indent: int = 0) -> list[str]:
    """Protobuf text format of (field, value) pairs; a value is a scalar, a list of scalars,
    a nested list of pairs (a message), or a list of messages (a repeated message field)."""
    pad = "  " * indent
    lines = []
    for key, value in fields:
        if isinstance(value, list) and value and isinstance(value[0], list):  # repeated message
            lines.append(f"{pad}{key} [")
            for i, message in enumerate(value):
                lines.append(f"{pad}  {{")
                lines.extend(_format(message, indent + 2))
                lines.append(f"{pad}  }}" + ("," if i < len(value) - 1 else ""))
            lines.append(f"{pad}]")
        elif isinstance(value, list) and (not value or isinstance(value[0], tuple)):  # message
            lines.append(f"{pad}{key} {{")
            lines.extend(_format(value, indent + 1))
            lines.append(f"{pad}}}")
        elif isinstance(value, tuple):  # repeated scalar
            lines.append(f"{pad}{key}: [ {', '.join(_scalar(v) for v in value)} ]")
        else:
            lines.append(f"{pad}{key}: {_scalar(value)}")
    return lines


def _config_dims(t: Tensor, batched: bool, fixed: dict | None = None) -> tuple[int, ...]:
    # Triton's dims leave out the batch dim when max_batch_size > 0; a dim pinned by a
    # precondition is its number; any other dim that is not a number (S, or an expression of
    # the entry's dims) is variable: -1.
    dims = t.dims[1:] if batched else t.dims
    fixed = fixed or {}
    return tuple(int(d) if d.isdigit() else fixed.get(d, -1) for d in dims)


def config_text(io: TritonIO, *, max_batch_size: int = 8, runtime: str = "onnxruntime") -> str:
    """config.pbtxt for `io` (see `triton_io`)."""
    _check_options(io, max_batch_size, runtime)
    batched = max_batch_size > 0
    fields: list[tuple[str, object]] = [("name", io.name)]
    if runtime == "onnxruntime":
        fields += [("platform", "onnxruntime_onnx"), ("default_model_filename", "model.onnx")]
    else:
        fields += [("backend", "python")]
    fields.append(("max_batch_size", max_batch_size))
    fields.append(("input", [_input_fields(t, batched, runtime, io.fixed) for t in io.inputs]))
    fields.append(("output", [[("name", t.name), ("data_type", _Enum(dtypes.by_name(t.dtype).triton)),
                               ("dims", _config_dims(t, batched, io.fixed))] for t in io.outputs]))
    if batched:
        # Requests of the same shape are merged into one run; no delay is set, so a lone
        # request is not held back waiting for company.
        fields.append(("dynamic_batching", []))
    return "\n".join(_format(fields)) + "\n"


def _input_fields(t: Input, batched: bool, runtime: str, fixed: dict | None = None) -> list:
    fields = [("name", t.name), ("data_type", _Enum(dtypes.by_name(t.dtype).triton)),
              ("dims", _config_dims(t, batched, fixed))]
    # The python runtime fills a left-out input with its Linnet default; ONNX Runtime needs
    # every graph input, so in the onnxruntime layout the client sends them all.
    if runtime == "python" and t.default is not None:
        fields.append(("optional", True))
    return fields


def _check_options(io: TritonIO, max_batch_size: int, runtime: str) -> None:
    if runtime not in RUNTIMES:
        raise _error(codes.TRITON_BAD_OPTION,
                     f"unknown Triton runtime {runtime!r}; choose one of {', '.join(RUNTIMES)}")
    if not isinstance(max_batch_size, int) or isinstance(max_batch_size, bool) or max_batch_size < 0:
        raise _error(codes.TRITON_BAD_OPTION, f"max_batch_size must be a whole number >= 0 (0: Triton does not batch), "
                     f"got {max_batch_size!r}")
    if max_batch_size > 0 and io.batch_dim is None:
        raise _error(codes.TRITON_NO_BATCH_DIM,
                     f"{io.name}: not every input and output starts with the same batch dim, so Triton "
                     "cannot batch it; export with max_batch_size=0")
    if runtime == "python":
        for t in (*io.inputs, *io.outputs):
            if not dtypes.by_name(t.dtype).in_numpy:
                raise _error(codes.TRITON_BAD_DTYPE,
                             f"{io.name}: `{t.name}` is {t.dtype}, which the Python backend cannot "
                             "pass as a numpy array; use runtime='onnxruntime' or another dtype")


# ---------------------------------------------------------------------- export


def _spec(io: TritonIO, max_batch_size: int) -> dict:
    """What model.py checks requests against (written to 1/linnet_io.json)."""
    return {
        "model": io.name,
        "linnet_version": __version__,
        "max_batch_size": max_batch_size,
        "inputs": [{"name": t.name, "dtype": t.dtype, "numpy": dtypes.by_name(t.dtype).numpy, "dims": list(t.dims),
                    "default": t.default} for t in io.inputs],
        "outputs": [{"name": t.name, "entry": t.entry, "dtype": t.dtype, "dims": list(t.dims),
                     "preconditions": [list(p) for p in t.preconditions], "bounds": t.bounds}
                    for t in io.outputs],
    }


def _build_onnx(ctx, out_dir: Path, dtype: str | None) -> list[Path]:
    """The ONNX backend's `build`: model.onnx first (and any external-data files after it)."""
    from ..backends import integration

    module = integration("onnx")
    return module.build(ctx, out_dir) if dtype is None else module.build(ctx, out_dir, dtype=dtype)


def _check_onnx(io: TritonIO, model: Path) -> None:
    """The built graph must have exactly the inputs and outputs the config promises."""
    try:
        import onnx
    except ModuleNotFoundError:  # nothing to check with; the server will check at load time
        return
    graph = onnx.load(str(model), load_external_data=False).graph
    found = {v.name: (v.type.tensor_type.elem_type, len(v.type.tensor_type.shape.dim))
             for v in [*graph.input, *graph.output]}
    initializers = {i.name for i in graph.initializer}
    graph_inputs = [v.name for v in graph.input if v.name not in initializers]
    for t in (*io.inputs, *io.outputs):
        if found.get(t.name) != (dtypes.by_name(t.dtype).onnx, len(t.dims)):
            raise InternalError(f"the ONNX backend's {model.name} has {t.name!r} as {found.get(t.name)} (elem type, "
                                f"rank), but the Linnet signature says {t.dtype} of rank {len(t.dims)}")
    if sorted(graph_inputs) != sorted(t.name for t in io.inputs):
        raise InternalError(f"the ONNX backend's {model.name} takes {graph_inputs}, "
                            f"the Linnet signature {[t.name for t in io.inputs]}")


def export_triton(ctx, repo_dir: str | Path, *, dtype: str | None = None, max_batch_size: int = 8,
                  runtime: str = "onnxruntime") -> Path:
    """Write `repo_dir/<entry name>/` (config.pbtxt and version 1) for Triton; return that folder.

    ctx: a `LoadContext` with weights (`linnet.nest.prepare(..., need_weights=True)`).
    dtype: the float dtype; it must be the one `ctx` was prepared with (None: that one).
    max_batch_size: Triton's largest batch (0: no batching, dims then include the batch dim).
    runtime: "onnxruntime" (Triton's ONNX Runtime backend) or "python" (ONNX Runtime inside
    Triton's Python backend, with request validation).

    A model folder already there is replaced as a whole, so a repository never mixes files
    of two exports; other models in the repository are left alone.
    """
    io = triton_io(ctx)
    _check_options(io, max_batch_size, runtime)
    float_dtypes = {t.dtype for t in io.outputs if dtypes.by_name(t.dtype).is_float}
    if dtype is not None and float_dtypes and float_dtypes != {dtype}:
        raise _error(codes.TRITON_BAD_DTYPE,
                     f"{ctx.name} was compiled for {', '.join(sorted(float_dtypes))}, not {dtype}; "
                     f"prepare it with dtype={dtype!r} (linnet export-triton --dtype {dtype})")
    if not _MODEL_NAME.fullmatch(ctx.name):
        raise _error(codes.TRITON_BAD_MODEL_NAME,
                     f"{ctx.name!r} cannot name a Triton model folder: use letters, digits, '_', '.' "
                     "and '-', not starting with '.' or '-'")
    repo = Path(repo_dir)
    if repo.exists() and not repo.is_dir():
        raise _error(codes.TRITON_BAD_REPOSITORY, f"{repo} is a file, not a model repository folder")
    target = repo / ctx.name
    if target.exists() and not (target / "config.pbtxt").is_file():
        raise _error(codes.TRITON_BAD_REPOSITORY,
                     f"{target} exists and is not a Triton model folder (no config.pbtxt); "
                     "refusing to replace it")
    repo.mkdir(parents=True, exist_ok=True)
    # Everything is written beside the final folder and renamed into place, so Triton (or a
    # concurrent export) never sees a half-written model.
    staging = repo / f".{ctx.name}.tmp{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        version = staging / "1"
        version.mkdir(parents=True)
        built = [Path(p) for p in _build_onnx(ctx, staging / "build", dtype)]
        if not built or not built[0].is_file():
            raise InternalError(f"the ONNX backend's build returned no model file ({built})")
        for i, path in enumerate(built):
            shutil.move(str(path), version / ("model.onnx" if i == 0 else path.name))
        shutil.rmtree(staging / "build", ignore_errors=True)
        _check_onnx(io, version / "model.onnx")
        if runtime == "python":
            _write_output_models(version, [t.name for t in io.outputs])
            (version / "model.py").write_text(MODEL_PY, encoding="utf-8")
            (version / "linnet_io.json").write_text(json.dumps(_spec(io, max_batch_size), indent=2) + "\n",
                                                    encoding="utf-8")
        (staging / "config.pbtxt").write_text(config_text(io, max_batch_size=max_batch_size, runtime=runtime),
                                              encoding="utf-8")
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _write_output_models(version: Path, outputs: list[str]) -> None:
    """For the python runtime: `model.<output>.onnx` per output, the graph cut down to what
    that output needs, all reading the weights from `weights.bin` with `model.onnx`.

    ONNX Runtime runs every node of a graph whatever outputs are requested, so a request for
    bert-base's `hidden` would otherwise pay for the masked-LM head too.  model.py runs the
    cut model when a request asks for one output, and model.onnx when it asks for several.
    """
    import onnx

    from ..backends.onnx_runtime import cut_to_output

    model = onnx.load(str(version / "model.onnx"))  # with any external data it had
    old_data = {version / t.external_data[0].value for t in model.graph.initializer
                if t.data_location == onnx.TensorProto.EXTERNAL and t.external_data}
    onnx.save(model, str(version / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location=WEIGHTS, size_threshold=1024)
    for path in old_data - {version / WEIGHTS}:
        path.unlink(missing_ok=True)
    for name in outputs:
        onnx.save(cut_to_output(model, name), str(version / f"model.{name}.onnx"))


#: The python runtime's weights file, shared by model.onnx and the per-output models.
WEIGHTS = "weights.bin"


# ---------------------------------------------------------------------- model.py

#: Triton Python-backend model: ONNX Runtime on 1/model.onnx, every request validated
#: against 1/linnet_io.json first.  It never raises out of `execute`: a bad request gets an
#: error response naming the input, and the other requests of the batch are still answered.
MODEL_PY = r'''"""Triton Python-backend model written by `linnet export-triton --runtime python`.

Runs the model with ONNX Runtime.  Each request is checked against linnet_io.json (taken
from the Linnet program at export time) before it reaches the graph: rank, dtype, dims that
agree across inputs, the entry's `where` preconditions (e.g. S <= 512) and the id ranges of
inputs that index embedding tables.  ONNX Runtime runs every node of a graph whatever
outputs are asked for, so a request for one output runs model.<output>.onnx, the graph cut
down to that output; a request for several runs model.onnx once.  Sessions open on first use.
"""
import ast
import json
import operator
import os

import numpy as np

try:  # only inside Triton; the validation below is plain Python and testable without it
    import triton_python_backend_utils as pb_utils
except ImportError:  # pragma: no cover
    pb_utils = None

_COMPARE = {"<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt, "==": operator.eq,
            "!=": operator.ne}
# Linnet's `/` on dims is floor division.
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.floordiv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}


def dim_value(text, dims):
    """Evaluate a Linnet dim expression ("S", "512", "S / 2 + 1") with the request's dims."""
    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            return dims[node.id]  # KeyError: a dim this request does not bind
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return _BINARY[type(node.op)](walk(node.left), walk(node.right))
        raise ValueError("unsupported dim expression: " + text)
    return walk(ast.parse(text, mode="eval"))


def dim_names(text):
    return {n.id for n in ast.walk(ast.parse(text, mode="eval")) if isinstance(n, ast.Name)}


def validate(spec, arrays, requested):
    """None when the request is fine, else a message naming the offending input."""
    dims = {}
    for inp in spec["inputs"]:
        name = inp["name"]
        if name not in arrays and inp.get("default") is not None:
            continue  # filled below, once the other inputs have told the dims
        if name not in arrays:
            return "input '%s' is missing" % name
        array = arrays[name]
        if array.ndim != len(inp["dims"]):
            return "input '%s' must have rank %d [%s], found shape %s" % (
                name, len(inp["dims"]), ", ".join(inp["dims"]), list(array.shape))
        if array.dtype != np.dtype(inp["numpy"]):
            return "input '%s' must be %s, found %s" % (name, inp["dtype"], array.dtype)
        for axis, (want, got) in enumerate(zip(inp["dims"], array.shape)):
            if want.isdigit():
                if int(want) != got:
                    return "input '%s' axis %d must be %s, found %d" % (name, axis, want, got)
            elif want.isidentifier():
                if want in dims and dims[want][0] != got:
                    return "input '%s' has %s = %d on axis %d, but input '%s' has %s = %d: they must agree" % (
                        name, want, got, axis, dims[want][1], want, dims[want][0])
                dims.setdefault(want, (got, name))
    values = {d: v for d, (v, _) in dims.items()}
    for d, (v, name) in dims.items():
        if v == 0:
            return "input '%s' has %s = 0: at least one element is needed along %s" % (name, d, d)
    for inp in spec["inputs"]:
        if inp["name"] not in arrays:
            shape = [int(d) if d.isdigit() else dim_value(d, values) for d in inp["dims"]]
            arrays[inp["name"]] = np.full(shape, inp["default"], dtype=np.dtype(inp["numpy"]))
    outputs = [o for o in spec["outputs"] if o["name"] in requested]
    for out in outputs:
        for left, op, right in out["preconditions"]:
            try:
                lv, rv = dim_value(left, values), dim_value(right, values)
            except KeyError:
                continue
            if not _COMPARE[op](lv, rv):
                used = dim_names(left) | dim_names(right)
                named = [n for d, (v, n) in dims.items() if d in used]
                bound = ", ".join("%s = %d" % (d, v) for d, v in values.items() if d in used)
                return "input '%s': `%s` requires %s %s %s, but %s (the model's limit)" % (
                    named[0] if named else "?", out["entry"], left, op, right, bound)
    limits = {}
    for out in outputs:
        for name, rows in out["bounds"].items():
            limits[name] = min(rows, limits.get(name, rows))
    for name, rows in limits.items():
        array = arrays[name]
        bad = (array < 0) | (array >= rows)
        if bad.any():
            where = [int(i) for i in np.argwhere(bad)[0]]
            return "input '%s' holds %d at %s, but values must be in [0, %d)" % (
                name, int(array[tuple(where)]), where, rows)
    return None


class TritonPythonModel:
    def initialize(self, args):
        import onnxruntime as ort

        here = os.path.join(args["model_repository"], args["model_version"])
        with open(os.path.join(here, "linnet_io.json"), encoding="utf-8") as f:
            self.spec = json.load(f)
        self.output_names = [o["name"] for o in self.spec["outputs"]]
        providers = ["CPUExecutionProvider"]
        if args.get("model_instance_kind") == "GPU" and "CUDAExecutionProvider" in ort.get_available_providers():
            providers = [("CUDAExecutionProvider", {"device_id": int(args["model_instance_device_id"])}),
                         "CPUExecutionProvider"]
        self.here, self.providers, self.sessions = here, providers, {}

    def _session(self, requested):
        import onnxruntime as ort

        name = "model.%s.onnx" % requested[0] if len(requested) == 1 else "model.onnx"
        if name not in self.sessions:
            self.sessions[name] = ort.InferenceSession(os.path.join(self.here, name), providers=self.providers)
        return self.sessions[name]

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(self._answer(request))
            except Exception as exc:  # a bug or an ONNX Runtime failure: an error response, not a crash
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[], error=pb_utils.TritonError("%s: %s" % (type(exc).__name__, exc))))
        return responses

    def _answer(self, request):
        arrays = {}
        for inp in self.spec["inputs"]:
            tensor = pb_utils.get_input_tensor_by_name(request, inp["name"])
            if tensor is not None:
                arrays[inp["name"]] = tensor.as_numpy()
        requested = [n for n in request.requested_output_names() if n in self.output_names] or self.output_names
        problem = validate(self.spec, arrays, requested)
        if problem is not None:
            # INVALID_ARG makes it a client error (HTTP 400) where this Triton has error codes.
            code = getattr(pb_utils.TritonError, "INVALID_ARG", None)
            error = pb_utils.TritonError(problem) if code is None else pb_utils.TritonError(problem, code)
            return pb_utils.InferenceResponse(output_tensors=[], error=error)
        results = self._session(requested).run(requested, {k: np.ascontiguousarray(v) for k, v in arrays.items()})
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, r) for n, r in zip(requested, results)])

    def finalize(self):
        self.sessions = {}
'''
