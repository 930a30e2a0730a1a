"""Triton Inference Server model repositories from a zoo entry.

    export_triton(ctx, "repo/")    # repo/<entry name>/ and its companion models

The models serve every entry of the Linnet program (or the entries chosen): their inputs are
the entries' shared inputs (`tokens`, `token_types`, `attention_mask`) and their outputs the
entries' results under their `[outputs]` names (`hidden`, `pooled`, ...).  The configs are
derived from the Linnet signatures, not read back from the ONNX file: shapes, dtypes and the
batch dim come from the types the checker proved, and each ONNX graph is then checked
against them, so a disagreement is caught here and not by a client at run time.  The graph
is the ONNX backend's for the `ctx` given; `linnet export-triton` prepares it with the passes
`nest.load(..., backend="onnx")` runs (`export_passes`), padding-free execution among them
unless `--no-packing`: the packed graph takes the same `[B, S]` inputs and packs inside.

Two layouts, both validating every request like `linnet.runtime.InputValidator` does (rank,
dtype, dims that agree, the entry's `where` preconditions, id ranges; the bounds are taken
from the Linnet program at export time and written to `linnet_io.json`, never hard-coded),
and both computing only the outputs a request asks for:

* `runtime="onnxruntime"` (production): `<name>` is an ensemble.  Its first step
  `<name>.validate` is a Python-backend model (`linnet/serving/triton_model.py` as model.py) that
  checks the request and fills left-out inputs; then `<name>.<output>`, one model per output
  on Triton's own ONNX Runtime backend, each the graph cut down to that output, all sharing
  one weights file (hard links).  Triton prunes the steps whose outputs nobody asked for.
* `runtime="python"`: one Python-backend model that validates and runs ONNX Runtime itself,
  for Triton builds without the ONNX Runtime backend.

The config text is written by a small protobuf-text formatter below, so exporting does not
need tritonclient; the tests parse it with Triton's own `ModelConfig` schema.  What the models take and give
(`TritonIO`, read from the Linnet program) is `linnet.serving.triton_io`; this module writes
the configs and the export of both layouts from it.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from .. import __version__, codes, dtypes
from ..diagnostics import Diagnostic, InternalError, LinnetError
from ..backends.onnx_files import WEIGHTS_FILE
from .triton_io import RAGGED_ENDS, RAGGED_MASK, Input, Output, Tensor, TritonIO, per_token, ragged_io, triton_io
from .triton_model import CHECKED

__all__ = ["RUNTIMES", "ServingOptions", "TritonIO", "triton_io", "layout_configs", "config_text",
           "export_passes", "export_triton"]

RUNTIMES = ("onnxruntime", "python")

_MODEL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def _error(code: codes.ErrorCode, message: str) -> LinnetError:
    return LinnetError(Diagnostic(code, message))


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



@dataclass(frozen=True)
class ServingOptions:
    """How Triton schedules the served models: what a deployment tunes (`export-triton` flags)."""

    max_batch_size: int = 8  # Triton's largest batch; 0: no batching, dims then keep the batch dim
    preferred_batch_sizes: tuple[int, ...] = ()  # batch sizes the dynamic batcher aims for
    max_queue_delay_us: int = 0  # how long a request may wait for others to batch with (0: never)
    #: Model instances per device (one per GPU, or on the CPU).  1, not Triton's default: on
    #: CPU that is two ONNX Runtime instances at a thread per core each, twice the threads there
    #: are cores.  None: leave instance_group out (Triton's default).
    instances: int | None = 1
    #: ONNX Runtime's intra-op threads per instance (`intra_op_thread_count`); None: ONNX Runtime's
    #: default, one per core.  Instances x threads above the cores oversubscribe them (see docs/triton.md).
    threads: int | None = None
    #: Ragged only: a bound on the tokens of one batch (TEI's max_batch_tokens).  Triton's batcher
    #: counts requests, not tokens, so it becomes max_batch_size = max_batch_tokens // the
    #: longest request the validating step lets through (the entry's `S <= n`).
    max_batch_tokens: int | None = None


def _serving(io: TritonIO, options: dict) -> ServingOptions:
    """The options with max_batch_tokens turned into the max_batch_size that guarantees it."""
    opts = ServingOptions(**options)
    if opts.max_batch_tokens is None:
        return opts
    tokens = opts.max_batch_tokens
    if not io.ragged:
        raise _error(codes.TRITON_BAD_OPTION, "max_batch_tokens needs ragged serving (--ragged): padded batches "
                     "are bounded by max_batch_size x their longest row")
    longest = _longest_request(io)
    if not _whole(tokens) or longest is None or tokens < longest:
        raise _error(codes.TRITON_BAD_OPTION,
                     f"max_batch_tokens must be a whole number >= the longest request the model takes "
                     f"({longest if longest is not None else 'unbounded: no `S <= n` precondition'}), got {tokens!r}")
    return dataclasses.replace(opts, max_batch_size=tokens // longest)


def _longest_request(io: TritonIO) -> int | None:
    """The most tokens one request may hold: the served entries' tightest `S <= n` / `S < n`."""
    seq = next(t.dims[1] for t in io.inputs if len(t.dims) == 2)
    bounds = []
    for out in io.outputs:
        for left, op, right in out.preconditions:
            if left == seq and right.isdigit() and op in ("<=", "<"):
                bounds.append(int(right) - (op == "<"))
    return min(bounds) if bounds else None


#: Companion models of the onnxruntime layout are named `<model><suffix>`.
VALIDATE_SUFFIX = ".validate"


def output_model_name(io: TritonIO, output: str) -> str:
    """The onnxruntime layout's model that computes `output` alone."""
    return f"{io.name}.{output}"


#: A ragged model's per-token output (`per_token`) leaves its ONNX Runtime step as the batch's
#: rows, [S_max, D] per request, under this prefix; the `.rows` step cuts each to [S_i, D].
ROWS = "linnet_rows_"
ROWS_SUFFIX = ".rows"


def _config_dims(t: Tensor, batched: bool, fixed: dict | None = None) -> tuple[int, ...]:
    # Triton's dims leave out the batch dim when max_batch_size > 0; a dim pinned by a
    # precondition is its number; any other dim that is not a number (S, or an expression of
    # the entry's dims) is variable: -1.
    dims = t.dims[1:] if batched else t.dims
    fixed = fixed or {}
    return tuple(int(d) if d.isdigit() else fixed.get(d, -1) for d in dims)


def _tensor_fields(t: Tensor, batched: bool, name: str | None = None, optional: bool = False,
                   fixed: dict | None = None, reshape: bool = True) -> list:
    dims = _config_dims(t, batched, fixed)
    fields = [("name", name or t.name), ("data_type", _Enum(dtypes.by_name(t.dtype).triton))]
    if batched and not dims:
        # One number per batch row ([B], a pipeline's `prompt_length`): Triton wants some
        # dims, so clients send [B, 1], which `reshape` hands a model that runs as the [B]
        # it takes.  An ensemble runs nothing itself and keeps [B, 1] (`reshape=False`):
        # Triton infers its tensors' shapes from its steps' declared dims.
        fields.append(("dims", (1,)))
        if reshape:
            fields.append(("reshape", [("shape", ())]))
    else:
        fields.append(("dims", dims))
    if optional:
        fields.append(("optional", True))
    return fields


def _scheduling_fields(options: ServingOptions) -> list:
    """dynamic_batching and instance_group of a model that runs work (not of an ensemble)."""
    fields: list = []
    if options.max_batch_size > 0:
        # Requests of the same shape are merged into one run.  With no delay set a lone
        # request is not held back waiting for company.
        batching: list = []
        if options.preferred_batch_sizes:
            batching.append(("preferred_batch_size", tuple(options.preferred_batch_sizes)))
        if options.max_queue_delay_us:
            batching.append(("max_queue_delay_microseconds", options.max_queue_delay_us))
        fields.append(("dynamic_batching", batching))
    if options.instances is not None:
        fields.append(("instance_group", [[("count", options.instances)]]))
    return fields


def _onnxruntime_parameters(options: ServingOptions) -> list:
    """The ONNX Runtime backend's `parameters` (string values, as Triton's config wants them)."""
    if options.threads is None:
        return []
    return [("parameters", [[("key", "intra_op_thread_count"), ("value", [("string_value", str(options.threads))])]])]


def _optional(t: Input) -> bool:
    # A left-out input with a Linnet default is filled by model.py (either layout's python
    # model); ONNX Runtime itself needs every graph input.
    return t.default is not None


def _python_config(io: TritonIO, options: ServingOptions, name: str, outputs: list) -> str:
    batched = options.max_batch_size > 0
    fields: list = [("name", name), ("backend", "python"), ("max_batch_size", options.max_batch_size),
                    ("input", [_tensor_fields(t, batched, optional=_optional(t), fixed=io.fixed) for t in io.inputs]),
                    ("output", outputs), *_scheduling_fields(options)]
    return "\n".join(_format(fields)) + "\n"


def _onnx_config(io: TritonIO, options: ServingOptions, output: Output) -> str:
    """One output's model in the onnxruntime layout: Triton's ONNX Runtime backend runs it."""
    batched = options.max_batch_size > 0
    inputs = [_tensor_fields(t, batched, fixed=io.fixed) for t in io.inputs]
    ragged: list = []
    if io.ragged:
        # The batcher concatenates requests of any length ([1, S_i] each) into one [T] tensor per
        # input, and gives the graph where each request ends (the adapter in `ragged_graph`).
        inputs = [[*fields, ("allow_ragged_batch", True)] for fields in inputs]
        ragged = [("batch_input", [[("kind", _Enum("BATCH_ACCUMULATED_ELEMENT_COUNT")),
                                    ("target_name", (RAGGED_ENDS,)), ("data_type", _Enum("TYPE_INT32")),
                                    ("source_input", (io.inputs[0].name,))]])]
    fields: list = [("name", output_model_name(io, output.name)), ("platform", "onnxruntime_onnx"),
                    ("default_model_filename", "model.onnx"), ("max_batch_size", options.max_batch_size),
                    ("input", inputs), *ragged,
                    ("output", [_tensor_fields(output, batched, fixed=io.fixed)]), *_scheduling_fields(options),
                    *_onnxruntime_parameters(options)]
    return "\n".join(_format(fields)) + "\n"


def _ensemble_config(io: TritonIO, options: ServingOptions) -> str:
    """The model clients call in the onnxruntime layout: validate, then one step per output.

    Triton prunes the steps whose outputs a request does not ask for, so a request for
    `embedding` runs the validating step and `<model>.embedding` only.
    """
    batched = options.max_batch_size > 0
    checked = [("input_map", [[("key", t.name), ("value", t.name)] for t in io.inputs]),
               ("output_map", [[("key", CHECKED + t.name), ("value", CHECKED + t.name)] for t in io.inputs])]
    steps = [[("model_name", io.name + VALIDATE_SUFFIX), ("model_version", -1), *checked]]
    for output in io.outputs:
        rows = per_token(io, output)
        steps.append([("model_name", output_model_name(io, output.name)), ("model_version", -1),
                      ("input_map", [[("key", t.name), ("value", CHECKED + t.name)] for t in io.inputs]),
                      ("output_map", [[("key", output.name), ("value", ROWS * rows + output.name)]])])
        if rows:
            tokens = io.inputs[0].name
            steps.append([("model_name", output_model_name(io, output.name) + ROWS_SUFFIX), ("model_version", -1),
                          ("input_map", [[("key", ROWS + output.name), ("value", ROWS + output.name)],
                                         [("key", tokens), ("value", CHECKED + tokens)]]),
                          ("output_map", [[("key", output.name), ("value", output.name)]])])
    fields: list = [("name", io.name), ("platform", "ensemble"), ("max_batch_size", options.max_batch_size),
                    ("input", [_tensor_fields(t, batched, optional=_optional(t), fixed=io.fixed, reshape=False)
                               for t in io.inputs]),
                    ("output", [_tensor_fields(t, batched, fixed=io.fixed, reshape=False) for t in io.outputs]),
                    ("ensemble_scheduling", [("step", steps)])]
    return "\n".join(_format(fields)) + "\n"


def layout_configs(io: TritonIO, *, runtime: str = "onnxruntime", **options) -> dict[str, str]:
    """Model name -> config.pbtxt of every Triton model of the layout; the first is the one
    clients call (named after the zoo entry).  `options`: the fields of `ServingOptions`."""
    opts = _serving(io, options)
    _check_options(io, opts, runtime)
    batched = opts.max_batch_size > 0
    if runtime == "python":
        return {io.name: _python_config(io, opts, io.name, [_tensor_fields(t, batched, fixed=io.fixed) for t in io.outputs])}
    checked_outputs = [_tensor_fields(t, batched, name=CHECKED + t.name, fixed=io.fixed) for t in io.inputs]
    configs = {io.name: _ensemble_config(io, opts),
               io.name + VALIDATE_SUFFIX: _python_config(io, opts, io.name + VALIDATE_SUFFIX, checked_outputs)}
    for output in io.outputs:
        configs[output_model_name(io, output.name)] = _onnx_config(io, opts, output)
        if per_token(io, output):
            configs[output_model_name(io, output.name) + ROWS_SUFFIX] = _rows_config(io, opts, output)
    return configs


def _rows_config(io: TritonIO, options: ServingOptions, output: Output) -> str:
    """The step after a ragged per-token output: each request's [S_max, ...] rows of the batch
    cut to its own S_i ([S_i, ...]).  No dynamic batcher, so every request runs alone, and the
    ensemble's max_batch_size, which Triton wants no larger than any step's."""
    tokens = io.inputs[0]
    fields: list = [("name", output_model_name(io, output.name) + ROWS_SUFFIX), ("platform", "onnxruntime_onnx"),
                    ("max_batch_size", options.max_batch_size),
                    ("input", [_tensor_fields(output, True, name=ROWS + output.name, fixed=io.fixed),
                               _tensor_fields(tokens, True, fixed=io.fixed)]),
                    ("output", [_tensor_fields(output, True, fixed=io.fixed)])]
    return "\n".join(_format(fields)) + "\n"


def rows_graph(io: TritonIO, output: Output):
    """The `.rows` step's graph: `ROWS + output` [1, S_max, ...] and the request's tokens
    [1, S_i] in, the first S_i rows out."""
    from onnx import TensorProto, helper

    from ..backends.onnx_files import IR_VERSION, OPSET

    tokens, rows = io.inputs[0].name, ROWS + output.name
    elem, token_elem = dtypes.by_name(output.dtype).onnx, dtypes.by_name(io.inputs[0].dtype).onnx
    rest = [int(d) for d in output.dims[2:]]  # numbers: Triton checks them against the config
    nodes = [helper.make_node("Shape", [tokens], ["length"], start=1, end=2),
             helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("zero", TensorProto.INT64, [1], [0])),
             helper.make_node("Constant", [], ["axis"], value=helper.make_tensor("axis", TensorProto.INT64, [1], [1])),
             helper.make_node("Slice", [rows, "zero", "length", "axis"], [output.name])]
    graph = helper.make_graph(
        nodes, f"{output_model_name(io, output.name)}{ROWS_SUFFIX}",
        [helper.make_tensor_value_info(rows, elem, ["B", "S_max", *rest]),
         helper.make_tensor_value_info(tokens, token_elem, ["B", "S"])],
        [helper.make_tensor_value_info(output.name, elem, ["B", "S", *rest])],
        doc_string=f"each request's own rows of `{output.name}`, cut from its ragged batch's")
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION,
                             producer_name="linnet")


def config_text(io: TritonIO, *, runtime: str = "onnxruntime", **options) -> str:
    """config.pbtxt of the model clients call (see `layout_configs`)."""
    return layout_configs(io, runtime=runtime, **options)[io.name]


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_options(io: TritonIO, options: ServingOptions, runtime: str) -> None:
    if runtime not in RUNTIMES:
        raise _error(codes.TRITON_BAD_OPTION,
                     f"unknown Triton runtime {runtime!r}; choose one of {', '.join(RUNTIMES)}")
    size = options.max_batch_size
    if not _whole(size) or size < 0:
        raise _error(codes.TRITON_BAD_OPTION,
                     f"max_batch_size must be a whole number >= 0 (0: Triton does not batch), got {size!r}")
    preferred = options.preferred_batch_sizes
    if preferred and (size == 0 or not all(_whole(p) and 1 <= p <= size for p in preferred)):
        raise _error(codes.TRITON_BAD_OPTION,
                     f"preferred batch sizes must be whole numbers in [1, max_batch_size = {size}], "
                     f"got {list(preferred)}" + (" (batching is off)" if size == 0 else ""))
    if not _whole(options.max_queue_delay_us) or options.max_queue_delay_us < 0 or (
            options.max_queue_delay_us and size == 0):
        raise _error(codes.TRITON_BAD_OPTION,
                     f"max_queue_delay_us must be a whole number of microseconds >= 0, and needs "
                     f"max_batch_size > 0; got {options.max_queue_delay_us!r} with max_batch_size = {size}")
    for option in ("instances", "threads"):
        value = getattr(options, option)
        if value is not None and (not _whole(value) or value < 1):
            raise _error(codes.TRITON_BAD_OPTION, f"{option} must be a whole number >= 1, got {value!r}")
    if io.ragged and (runtime != "onnxruntime" or size == 0):
        raise _error(codes.TRITON_RAGGED_UNSUPPORTED,
                     f"{io.name}: ragged serving is Triton's dynamic batcher feeding its ONNX Runtime backend; it "
                     f"needs runtime='onnxruntime' and max_batch_size > 0 (got {runtime!r}, {size})")
    if size > 0 and io.batch_dim is None:
        raise _error(codes.TRITON_NO_BATCH_DIM,
                     f"{io.name}: not every input and output starts with the same batch dim, so Triton "
                     "cannot batch it; export with max_batch_size=0")
    # Both layouts pass the inputs through a Python-backend model, and the python one the outputs too.
    tensors = (*io.inputs, *io.outputs) if runtime == "python" else io.inputs
    for t in tensors:
        if not dtypes.by_name(t.dtype).in_numpy:
            raise _error(codes.TRITON_BAD_DTYPE, f"{io.name}: `{t.name}` is {t.dtype}, which the Python backend cannot "
                         "pass as a numpy array" + ("; use runtime='onnxruntime' or another dtype"
                                                    if runtime == "python" else ""))


# ---------------------------------------------------------------------- export


def _spec(io: TritonIO, options: ServingOptions, role: str) -> dict:
    """What model.py checks requests against (written to 1/linnet_io.json), and the ONNX
    Runtime threads of its sessions (role "serve")."""
    return {
        "model": io.name,
        "role": role,
        "linnet_version": __version__,
        "max_batch_size": options.max_batch_size,
        "threads": options.threads,
        "ragged": io.ragged,  # one sequence per request: the batch axis must be 1
        "inputs": [{"name": t.name, "dtype": t.dtype, "numpy": dtypes.by_name(t.dtype).numpy, "dims": list(t.dims),
                    "default": t.default} for t in io.inputs],
        "outputs": [{"name": t.name, "entry": t.entry, "dtype": t.dtype, "dims": list(t.dims),
                     "preconditions": [list(p) for p in t.preconditions], "bounds": t.bounds}
                    for t in io.outputs],
    }


def export_passes(packing: bool | None = None) -> tuple[str, ...]:
    """The optimisation passes to prepare an export's `ctx` with: those `nest.load(...,
    backend="onnx", packing=packing)` runs, so Triton serves the graph the ONNX backend runs,
    packed (padding-free) by default.  The packed graph keeps the `[B, S]` interface and packs
    inside (NonZero, Gather), so the configs are the same either way."""
    from ..backends import integration
    from ..nest import backend_passes

    return backend_passes("onnx", integration("onnx"), packing=packing)


def _build_onnx(ctx, out_dir: Path, dtype: str | None, entries: set[str]) -> list[Path]:
    """The ONNX backend's `build` of model.onnx and the served entries' files: model.onnx
    first (and any external-data files after it).  The others (GPT-2's cache steps, the
    losses) are not written at all: each is another full copy of the weights."""
    from ..backends import integration

    return integration("onnx").build(ctx, out_dir, dtype=dtype, entries=entries)


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
    if [v.name for v in graph.output] != [t.name for t in io.outputs]:
        raise InternalError(f"the ONNX backend's {model.name} gives {[v.name for v in graph.output]}, "
                            f"the config {[t.name for t in io.outputs]}")


def export_triton(ctx, repo_dir: str | Path, *, dtype: str | None = None, runtime: str = "onnxruntime",
                  entries=None, ragged: bool = False, **options) -> Path:
    """Write the Triton models of `ctx` into `repo_dir`; return the folder of the one clients call.

    ctx: a `LoadContext` with weights (`linnet.nest.prepare(..., need_weights=True)`), prepared
    with `optimize=export_passes()` to serve the packed graph `linnet export-triton` writes.
    dtype: the float dtype; it must be the one `ctx` was prepared with (None: that one).
    runtime: "onnxruntime" (an ensemble: a validating Python-backend step, then Triton's ONNX
    Runtime backend, one model per output) or "python" (ONNX Runtime inside Triton's Python
    backend, one model).  Both validate every request.
    entries: the entries (or their output names) to serve; None: those that take the first
    entry's inputs and give a batch-led result (not the losses, not a decoder's cache steps).
    options: the fields of `ServingOptions` (max_batch_size, preferred_batch_sizes,
    max_queue_delay_us, instances, threads, max_batch_tokens).
    ragged: serve one unpadded sequence per request, batched by concatenation (`ragged_io`).

    Model folders already there are replaced as a whole, and the companions of an earlier
    export that this one no longer has are removed, so a repository never mixes files of two
    exports; other models in the repository are left alone.
    """
    io = plain = triton_io(ctx, entries)
    if ragged:
        io = ragged_io(io, named=entries is not None)
    configs = layout_configs(io, runtime=runtime, **options)
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
    stale = _earlier_companions(repo / ctx.name)
    for name in [*configs, *stale]:
        target = repo / name
        if target.exists() and not (target / "config.pbtxt").is_file():
            raise _error(codes.TRITON_BAD_REPOSITORY,
                         f"{target} exists and is not a Triton model folder (no config.pbtxt); "
                         "refusing to replace it")
    repo.mkdir(parents=True, exist_ok=True)
    # Everything is written beside the final folders and renamed into place, so Triton (or a
    # concurrent export) never sees a half-written model.
    staging = repo / f".{ctx.name}.tmp{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        graphs = staging / "graphs"
        served = {o.entry for o in io.outputs}
        built = [Path(p) for p in _build_onnx(ctx, staging / "build", dtype, served)]
        if not built or not built[0].is_file():
            raise InternalError(f"the ONNX backend's build returned no model file ({built})")
        graphs.mkdir()
        # The build wrote no graph of an entry this model does not serve (losses, other
        # inputs, and their computed-default graphs `default.<entry>.<param>.onnx`).
        for i, path in enumerate(built):
            shutil.move(str(path), graphs / ("model.onnx" if i == 0 else path.name))
        shutil.rmtree(staging / "build", ignore_errors=True)
        _write_graphs(graphs, io)
        _check_onnx(dataclasses.replace(io, inputs=plain.inputs), graphs / "model.onnx")
        serving = _serving(io, options)
        if runtime == "python":
            _python_layout(staging, graphs, io, serving)
        else:
            _onnxruntime_layout(staging, graphs, io, serving)
        shutil.rmtree(graphs)
        for name, text in configs.items():
            (staging / name / "config.pbtxt").write_text(text, encoding="utf-8")
        record = {"linnet_version": __version__, "runtime": runtime, "companions": list(configs)[1:]}
        (staging / ctx.name / EXPORT_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        # The model clients call goes last, once every step it names is in place.
        for name in [*list(configs)[1:], ctx.name]:
            _replace(staging / name, repo / name)
        for name in set(stale) - set(configs):
            shutil.rmtree(repo / name, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return repo / ctx.name


#: In the folder clients call: which runtime wrote it and its companion model folders.
EXPORT_RECORD = "linnet_export.json"


def _earlier_companions(folder: Path) -> list[str]:
    try:
        return list(json.loads((folder / EXPORT_RECORD).read_text(encoding="utf-8")).get("companions", []))
    except (OSError, ValueError, AttributeError):
        return []


def _replace(source: Path, target: Path) -> None:
    if target.exists():
        shutil.rmtree(target)
    os.replace(source, target)


def _write_graphs(graphs: Path, io: TritonIO) -> None:
    """model.onnx (the served outputs only) and `model.<output>.onnx` per output, the graph
    cut down to what that output needs, all reading the weights from `weights.bin`.

    ONNX Runtime runs every node of a graph whatever outputs are requested, so a request for
    bert-base's `hidden` would otherwise pay for the masked-LM head too.
    """
    import onnx

    from ..backends.onnx_runtime import cut_to_output

    model = onnx.load(str(graphs / "model.onnx"))  # with any external data it had
    old_data = {graphs / t.external_data[0].value for t in model.graph.initializer
                if t.data_location == onnx.TensorProto.EXTERNAL and t.external_data}
    served = [t.name for t in io.outputs]
    if [o.name for o in model.graph.output] != served:  # an entry set was chosen
        model = cut_to_output(model, served)
    onnx.save(model, str(graphs / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location=WEIGHTS_FILE, size_threshold=1024)
    for path in old_data - {graphs / WEIGHTS_FILE}:
        path.unlink(missing_ok=True)
    for name in served:
        cut = cut_to_output(model, name)
        if io.ragged:
            cut = ragged_graph(cut, io)
        onnx.save(cut, str(graphs / f"model.{name}.onnx"))


def ragged_graph(model, io: TritonIO):
    """`model` (inputs `[B, S]`) behind an adapter taking a ragged batch: each token input flat
    `[T]` (the requests one after another) and `RAGGED_ENDS` `[B]` int32, where each request
    ends (Triton's BATCH_ACCUMULATED_ELEMENT_COUNT).  The adapter lays the rows out `[B, S_max]`
    with `attention_mask` marking the real tokens, the form the packed graph takes: its own
    packing (NonZero on the mask, Gather) then runs the encoder on the T real tokens only, so
    nothing is computed for the layout's filler.  Results keep their `[B, ...]` shape."""
    import onnx
    from onnx import TensorProto, helper

    graph = model.graph
    initializers = {i.name for i in graph.initializer}
    old_inputs = {v.name: v for v in graph.input if v.name not in initializers}
    rename = {name: f"linnet_ragged/{name}" for name in old_inputs}
    for node in graph.node:
        if node.op_type in ("If", "Loop", "Scan"):
            raise InternalError(f"ragged_graph: {node.op_type} subgraphs are not renamed; the graph has {node.name}")
        for i, name in enumerate(node.input):
            if name in rename:
                node.input[i] = rename[name]
    for name in graph.output:
        if name.name in rename:
            raise InternalError(f"ragged_graph: input {name.name} is also an output")
    nodes = []

    def node(op, inputs, output, **attrs):
        out = f"linnet_ragged/{output}"
        nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def const(name, values):
        return node("Constant", [], name, value=helper.make_tensor(name, TensorProto.INT64, [len(values)], values))

    ends = node("Cast", [RAGGED_ENDS], "ends", to=TensorProto.INT64)
    zero, last = const("zero", [0]), const("minus_one", [-1])
    starts = node("Concat", [zero, node("Slice", [ends, zero, last], "ends_but_last")], "starts", axis=0)
    lengths = node("Sub", [ends, starts], "lengths")
    longest = node("ReduceMax", [lengths], "longest", keepdims=0)
    positions = node("Range", [node("Constant", [], "zero_scalar", value=helper.make_tensor("z", TensorProto.INT64, [], [0])),
                               longest, node("Constant", [], "one_scalar", value=helper.make_tensor("o", TensorProto.INT64, [], [1]))],
                     "positions")
    row = node("Unsqueeze", [positions, zero], "positions_row")  # [1, S]
    one = const("one", [1])
    real = node("Less", [row, node("Unsqueeze", [lengths, one], "lengths_column")], "real")  # [B, S]
    flat_index = node("Add", [node("Unsqueeze", [starts, one], "starts_column"), row], "flat_index")
    index = node("Where", [real, flat_index, node("Constant", [], "zero_index",
                                                    value=helper.make_tensor("zi", TensorProto.INT64, [], [0]))], "index")
    new_inputs = []
    by_name = {t.name: t for t in io.inputs}
    for name, value in old_inputs.items():
        elem = value.type.tensor_type.elem_type
        if name == RAGGED_MASK:
            nodes.append(helper.make_node("Cast", [real], [rename[name]], name=rename[name], to=elem))
            continue
        if name not in by_name:
            raise InternalError(f"ragged_graph: graph input {name} is not a served input ({list(by_name)})")
        new_inputs.append(helper.make_tensor_value_info(name, elem, ["T"]))
        gathered = node("Gather", [name, index], f"{name}_rows", axis=0)
        filler = node("Cast", [node("Constant", [], f"{name}_zero",
                                    value=helper.make_tensor(f"{name}_z", TensorProto.INT64, [], [0]))],
                      f"{name}_filler", to=elem)
        nodes.append(helper.make_node("Where", [real, gathered, filler], [rename[name]], name=rename[name]))
    new_inputs.append(helper.make_tensor_value_info(RAGGED_ENDS, TensorProto.INT32, ["B"]))
    rest = list(graph.node)
    del graph.node[:]
    graph.node.extend([*nodes, *rest])
    kept = [v for v in graph.input if v.name in initializers]
    del graph.input[:]
    graph.input.extend([*new_inputs, *kept])
    del graph.value_info[:]  # shapes of the [B, S] inputs no longer hold; ORT infers them again

    return model


def _check_ragged_onnx(io: TritonIO, output: Output, model: Path) -> None:
    """A ragged step's graph takes each served input flat [T] and RAGGED_ENDS [B] int32."""
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    initializers = {i.name for i in graph.initializer}
    found = {v.name: (v.type.tensor_type.elem_type, len(v.type.tensor_type.shape.dim))
             for v in graph.input if v.name not in initializers}
    want = {t.name: (dtypes.by_name(t.dtype).onnx, 1) for t in io.inputs}
    want[RAGGED_ENDS] = (onnx.TensorProto.INT32, 1)
    if found != want or [v.name for v in graph.output] != [output.name]:
        raise InternalError(f"the ragged {model} takes {found} and gives {[v.name for v in graph.output]}; "
                            f"expected {want} and [{output.name!r}]")


def _share(source: Path, target: Path) -> None:
    """A hard link where the file system allows one (the weights are written once), else a copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _python_layout(staging: Path, graphs: Path, io: TritonIO, options: ServingOptions) -> None:
    """One Python-backend model: model.py runs model.onnx or a per-output model itself."""
    version = staging / io.name / "1"
    version.mkdir(parents=True)
    for path in graphs.iterdir():
        shutil.move(str(path), version / path.name)
    _write_model_py(version, _spec(io, options, "serve"))


def _onnxruntime_layout(staging: Path, graphs: Path, io: TritonIO, options: ServingOptions) -> None:
    """The ensemble's (empty) folder, its validating step, and one ONNX Runtime model per output."""
    (staging / io.name / "1").mkdir(parents=True)  # Triton wants a version folder, even an ensemble's
    checker = staging / (io.name + VALIDATE_SUFFIX) / "1"
    checker.mkdir(parents=True)
    _write_model_py(checker, _spec(io, options, "validate"))
    for output in io.outputs:
        version = staging / output_model_name(io, output.name) / "1"
        version.mkdir(parents=True)
        shutil.move(str(graphs / f"model.{output.name}.onnx"), version / "model.onnx")
        if (graphs / WEIGHTS_FILE).exists():  # none where every tensor is small enough to stay inline
            _share(graphs / WEIGHTS_FILE, version / WEIGHTS_FILE)
        if io.ragged:
            _check_ragged_onnx(io, output, version / "model.onnx")
            if per_token(io, output):
                import onnx

                rows = staging / (output_model_name(io, output.name) + ROWS_SUFFIX) / "1"
                rows.mkdir(parents=True)
                onnx.save(rows_graph(io, output), str(rows / "model.onnx"))
        else:
            _check_onnx(dataclasses.replace(io, outputs=(output,)), version / "model.onnx")


def _write_model_py(version: Path, spec: dict) -> None:
    from . import triton_model

    shutil.copyfile(triton_model.__file__, version / "model.py")
    (version / "linnet_io.json").write_text(json.dumps(spec, indent=2) + "\n", encoding="utf-8")
