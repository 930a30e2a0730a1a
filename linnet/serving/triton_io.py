"""What a Triton model of a zoo entry takes and gives, read from the Linnet program.

`triton_io` turns a loaded entry's program into `TritonIO`: the shared inputs of the entries
it serves, one output per entry with the preconditions and id bounds a request is checked
against, the batch dim and the dims a `where` clause pins to a number.  `ragged_io` is the
same model served ragged.  `linnet.serving.triton` writes the configs and graphs from it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .. import codes, dtypes
from ..diagnostics import Diagnostic, LinnetError, Note
from ..middle import ir
from ..runtime import index_bounds


def _error(code: codes.ErrorCode, message: str, note: str | None = None) -> LinnetError:
    return LinnetError(Diagnostic(code, message, None, (Note(note),) if note else ()))


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
    #: Served ragged (`ragged_io`): one sequence per request, `[-1]` token inputs that Triton's
    #: dynamic batcher concatenates, and the mask implied (every token of a request is real).
    ragged: bool = False


def _dims(t: ir.TensorType) -> tuple[str, ...]:
    return tuple(str(d) for d in t.dims)


def triton_io(ctx, entries=None) -> TritonIO:
    """The inputs and outputs of the Triton model for `ctx` (a `LoadContext`), from its program.

    Every entry becomes one output (one per result where it has several, named as its ONNX
    graph names them); the entries must take the same inputs, since they are
    served by one graph.  `entries` (names of entries or of their outputs) keeps only those;
    without it, those `_served_by_default`: the losses (whose labels an inference client does
    not have), the entries for transformers' other inputs (`position_ids`, `inputs_embeds`,
    `head_mask`), `attentions` (a result per pair of positions) and a decoder's cache steps
    are left out.
    """
    program: ir.Program = ctx.program
    chosen = _chosen_entries(ctx, program, entries)
    if not chosen:
        raise _error(codes.TRITON_INCOMPATIBLE_ENTRIES, f"{ctx.name} has no entries to serve")
    first = chosen[0]
    inputs = tuple(Input(n, t.dtype, _dims(t), first.defaults.get(n)) for n, t in first.inputs)
    outputs = []
    for entry in chosen:
        mine = tuple(Input(n, t.dtype, _dims(t), entry.defaults.get(n)) for n, t in entry.inputs)
        if mine != inputs:
            raise _error(codes.TRITON_INCOMPATIBLE_ENTRIES,
                         f"{ctx.name}: entries `{first.name}` and `{entry.name}` take different inputs "
                         f"({', '.join(f'{i.name}: {i.dims}' for i in inputs)} vs "
                         f"{', '.join(f'{i.name}: {i.dims}' for i in mine)}), so one Triton model cannot serve both")
        bounds = {name: b.rows for name, b in index_bounds(program, entry).items()}
        checks = tuple((str(l), op, str(r)) for l, op, r, _ in entry.preconditions)
        # Several results: an output each, named as the ONNX graph names them (`ir.output_names`).
        for name, t in zip(ir.output_names(entry, ctx.output_name(entry.name)), ir.result_types(entry.result)):
            outputs.append(Output(name, t.dtype, _dims(t), entry.name, checks, bounds))
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
    # Dims every served entry pins to one number (`where H == 224`) are that number in the config.
    fixed = _fixed_dims(chosen[0])
    for entry in chosen[1:]:
        fixed = {d: v for d, v in _fixed_dims(entry).items() if fixed.get(d) == v}
    return TritonIO(ctx.name, batch, inputs, tuple(outputs), fixed)


#: The batch input Triton gives the ONNX Runtime step of a ragged model: the cumulative token
#: count at the end of each request of the batch (BATCH_ACCUMULATED_ELEMENT_COUNT), [B] int32.
RAGGED_ENDS = "linnet_ragged_ends"
#: The input a ragged model leaves out: with one unpadded sequence per request it is all ones.
RAGGED_MASK = "attention_mask"


def ragged_io(io: TritonIO, named: bool = False) -> TritonIO:
    """`io` served ragged (`export-triton --ragged`): token inputs `[B, S]` become Triton's
    `[-1]` per request, concatenated by the batcher into `[T]`; `attention_mask` is left out.

    Outputs with one row per request (`embedding` [B, D]) come back as they are. Outputs with
    one row per token (`hidden` [B, S, D], `per_token`) come back per request as `[S_i, D]`
    through a step that cuts each request's rows out of the batch's `[S_max, D]` (Triton's ONNX
    Runtime backend splits a batch's outputs along B only). Other outputs (`hidden_states`
    [B, L, S, D], `attentions`) are left out, or refused when `named`."""
    if io.batch_dim is None:
        raise _error(codes.TRITON_RAGGED_UNSUPPORTED,
                     f"{io.name}: ragged serving needs a batch dim shared by every input and output")
    inputs = tuple(t for t in io.inputs if t.name != RAGGED_MASK)
    seq = {t.dims[1] for t in inputs if len(t.dims) == 2}
    flat = [t for t in inputs if len(t.dims) != 2 or t.dims[0] != io.batch_dim or t.dims[1].isdigit()]
    if flat or len(seq) != 1 or not inputs:
        raise _error(codes.TRITON_RAGGED_UNSUPPORTED,
                     f"{io.name}: ragged serving needs token inputs [{io.batch_dim}, S] sharing one sequence dim, "
                     f"found {', '.join(f'{t.name}: [{chr(44).join(t.dims)}]' for t in io.inputs)}")
    ragged = dataclasses.replace(io, inputs=inputs, ragged=True)
    served = [o for o in io.outputs if all(d.isdigit() for d in o.dims[1:]) or per_token(ragged, o)]
    other = [o for o in io.outputs if o not in served]
    if other and named:
        raise _error(codes.TRITON_RAGGED_UNSUPPORTED,
                     f"{io.name}: {', '.join(f'`{o.name}` [{chr(44).join(o.dims)}]' for o in other)} has neither one "
                     "row per request nor one per token, so it cannot be split back per request of a ragged batch; "
                     "serve it without --ragged")
    if not served:
        raise _error(codes.TRITON_RAGGED_UNSUPPORTED,
                     f"{io.name}: no output with one row per request or per token to serve ragged")
    return dataclasses.replace(ragged, outputs=tuple(served))


def per_token(io: TritonIO, output: Output) -> bool:
    """An output of a ragged model with one row per token of its request: [B, S, fixed...]."""
    seq = io.inputs[0].dims[1]
    return (io.ragged and len(output.dims) >= 2 and output.dims[1] == seq
            and all(d.isdigit() for d in output.dims[2:]))


def _fixed_dims(entry: ir.Entry) -> dict[str, int]:
    """The entry's dims a precondition `D == n` pins to the number n."""
    fixed = {}
    for left, op, right, _ in entry.preconditions:
        for dim, value in ((left, right), (right, left)):
            if op == "==" and str(dim) in entry.dims and value.as_int() is not None:
                fixed[str(dim)] = value.as_int()
    return fixed


def _chosen_entries(ctx, program: ir.Program, entries) -> list:
    """The program's entries, or those `entries` names (entry or output names), in the order of
    the ONNX export's `model.onnx` outputs: the manifest's root entry first, then program order."""
    every = list(program.entries.values())
    root = ctx.manifest.source.entry if ctx.manifest is not None else None
    every.sort(key=lambda e: e.name != root)  # stable: the rest keep program order
    if entries is None:
        return [e for e in every if _served_by_default(e, every[0])]
    by_name = {}
    for entry in every:
        by_name[entry.name] = by_name[ctx.output_name(entry.name)] = entry
    wanted = [entries] if isinstance(entries, str) else list(entries)
    unknown = [n for n in wanted if n not in by_name]
    if unknown or not wanted:
        known = ", ".join(f"{e.name} ({ctx.output_name(e.name)})" for e in every)
        raise _error(codes.TRITON_BAD_OPTION,
                     f"{ctx.name} has no entry {', '.join(repr(n) for n in unknown) or '(none chosen)'} "
                     f"to serve; its entries (outputs) are: {known}")
    keep = {id(by_name[n]) for n in wanted}
    return [e for e in every if id(e) in keep]


def _served_by_default(entry: ir.Entry, first: ir.Entry) -> bool:
    """An entry of the default set: it takes the first entry's inputs and its result starts
    with their batch dim, so one batched model serves it beside the first.  Left out: training
    losses (they take labels too, which an inference client does not have) and a decoder's
    generation steps (GPT-2's `prefill` gives its cache with the layer dim first; `decode`
    takes a cache), and an entry with a result per pair of positions (`ir.pairwise_result`:
    BERT's `attentions`, [B, Layers, Heads, S, S], 150 MB per bert-base sequence at S = 512),
    which batches along B like the others but is a diagnostic no client should pay for by
    default.  Any entry is served when `entries` names it."""
    lead = first.inputs[0][1].dims[0] if first.inputs and first.inputs[0][1].dims else None
    led = all(t.dims and str(t.dims[0]) == str(lead) for t in ir.result_types(entry.result))
    return entry.inputs == first.inputs and lead is not None and led and not ir.pairwise_result(entry)
