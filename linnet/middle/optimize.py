"""The optimisation stage: `ir.Program` -> `ir.Program` plus a plan for binding the weights.

Lowering keeps the program as written; this stage rewrites it for speed where the result is
provably the same, and records what the weights need so that the rewritten program binds the
*original* checkpoint (bindings.json is untouched).  The plan is applied once, when the
weights are bound at load time (`bind_params`), never at call time.  Every backend reads the
optimised program through the same `LoadContext`, so emitters stay simple: they see ordinary
blocks, calls and ops.

Passes, in order:

Dense layers are found by what their body computes (`linnet.middle.linears.dense_form`), not
by the block's name: std's `Linear`, a bias-free one and GPT-2's `Conv1D` ([In, Out] weight)
alike.

* `fuse_linears` — sibling dense sub-blocks (one layout, all with a bias or none) applied to
  the same input in one statement, or to an argument the method never reassigns across its
  statements (the Llama source's q and k in one `let`, v in another: one fused call before
  the first serves all three)
  (BERT's query, key and value projections) become one `Linear` over the concatenated
  weights, `[3 D, D]`, whose output is sliced back into the three results.  One GEMM of
  N = 3 D instead of three of N = D: the input is read once and the kernel's blocking is
  better.  Each output element is still the same dot product over the same `In` values, so
  the rounding is unchanged (measured bit-identical on MKL, MLAS and XLA:CPU).  The group is
  the largest one any statement of the block has; the subs may be called elsewhere too
  (BERT's `attentions` reads the query and key projections again), and each of those calls
  becomes a slice of the fused call on its own input, so the fusion never depends on which
  entries a program has (a site that needs only some rows computes all of them: `attentions`
  runs the fused matmul a second time per layer, V's rows unused there; `forward` pays
  nothing).  A call inside a loop, or on an
  input with calls in it, keeps the subs unfused.
* `fold_attention_scale` — `attention(q, k, v, scale, mask)` where `q` comes from a `Linear`
  through data movement only (`split_heads`: reshape and permute) and `scale` is a power of
  two (BERT's 1 / sqrt(64) = 0.125): the scale is folded into that `Linear`'s weight and bias
  at bind time and the call gets `scale = 1`.  Multiplying by a power of two is exact in
  binary floating point (barring underflow into subnormals), so `(x W^T + b) * s` and
  `x (s W)^T + s b` are the same numbers; the per-call multiply over Q disappears.  The
  scaled rows must be read by attention queries only, all with the same scale (both BERT's
  `attention` and its `attention_probabilities` take them): any other read would see the
  scale, so then nothing is folded.  A scale that is not a power of two is folded only with
  `exact=False`.  In f16 the fold is off by
  default: f16's subnormal range starts at 6e-5, where real weights live.

* `dead_rows` (`linnet.middle.rows`) — an entry that reads fixed rows (`hidden[:, 0, :]`)
  computes the ops before the index that act per position on those rows only, back to
  attention's query; keys and values keep every row.  No params change.
* `pack_tokens` (`linnet.middle.packing`) — per-token work on the real tokens only.

`optimize(program)` returns an `Optimized` with the new program, the `plan` (one
`ParamTransform` per new or changed param) and `applied`, a line per rewrite for logs and
tests.  The input program is not modified.
"""
from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from . import ir
from .. import ops
from ..arrays import framework_of
from ..dims import const
from ..kernels import ATTENTION, ATTENTION_DROPOUT, ATTENTION_PROBABILITIES
from .linears import DenseForm, dense_form
from .packing import pack_tokens
from .rows import dead_rows

#: Passes `optimize` runs by default, in order (each a `REGISTRY` record, which says why).
PASSES = ("fuse_linears", "fold_attention_scale", "dead_rows", "pack_tokens")


@dataclass(frozen=True)
class ParamTransform:
    """`target = concatenate([sources[i] * scales[i]], axis)` over the original params.

    A single source with scale 1 is a plain rename; `scales` may also be given per row range
    of the result (`row_scales`: (start, stop, factor) along axis 0), which is how a fold
    into one part of an already fused weight is recorded.
    """

    target: str
    sources: tuple[str, ...]
    axis: int = 0
    row_scales: tuple[tuple[int, int, float], ...] = ()


@dataclass
class Optimized:
    program: ir.Program
    plan: dict[str, ParamTransform] = field(default_factory=dict)  # target path -> transform
    applied: list[str] = field(default_factory=list)
    #: What a pass considered and did not do, and why (an entry the packing pass refused).
    notes: list[str] = field(default_factory=list)


def optimize(program: ir.Program, *, passes: tuple[str, ...] = PASSES, exact: bool = True,
             verify_each: bool | None = None) -> Optimized:
    """Run the passes (by name, from `REGISTRY`) over a copy of `program`; `exact=False` also
    allows rewrites that change rounding (a scale fold that is not a power of two).
    `verify_each` runs `ir.verify` after every pass (default: when LINNET_VERIFY_PASSES=1,
    which the tests set); the result is verified either way."""
    if verify_each is None:
        verify_each = os.environ.get("LINNET_VERIFY_PASSES") == "1"
    unknown = [name for name in passes if name not in REGISTRY]
    if unknown:
        raise ValueError(f"no optimisation pass {', '.join(map(repr, unknown))}; the passes are {', '.join(REGISTRY)}")
    out = Optimized(copy.deepcopy(program))
    ir.run_passes(out, [REGISTRY[name] for name in passes], exact=exact, verify_each=verify_each)
    ir.verify(out.program)
    return out


# ------------------------------------------------------------------ helpers


def _is_pure(expr: ir.Expr) -> bool:
    """No calls inside: evaluating it twice in one statement gives the same value."""
    return not any(isinstance(e, ir.Call) for e in ir.walk(expr))


def _block_paths(program: ir.Program, block_id: str) -> list[str]:
    """Every param-path prefix at which `block_id` is instantiated (`layers.3.attention.`)."""
    return [prefix for bid, prefix in program.instances() if bid == block_id]


def _dense(program: ir.Program, call: ir.Call) -> DenseForm | None:
    """The dense layer a call runs (`linnet.middle.linears`), by what its body computes."""
    return dense_form(program, program.functions[call.function])


def _block_functions(program: ir.Program, block_id: str) -> list[ir.Function]:
    """Every function of a block, each specialisation included.

    Lowering makes one copy of a method per set of dims it is called with, and a block's
    `methods` table names only the first; a rewrite that removes a sub must rewrite every copy.
    """
    return [f for f in program.functions.values() if f.block == block_id]


# ------------------------------------------------------------- fuse_linears


def _fuse_linears(out: Optimized, exact: bool) -> None:
    program = out.program
    for block_id in list(program.blocks):
        block = program.blocks[block_id]
        while (anchor := _linear_group(program, block)) is not None:
            _fuse_group(out, block, *anchor)


def _linear_calls(program: ir.Program, block: ir.Block, stmt) -> list[ir.Call]:
    """The calls in `stmt` of the block's single (not arrayed) std Linear subs."""
    subs = {s.name: s for s in block.subs}
    return [e for e in ir.walk(stmt.value)
            if isinstance(e, ir.Call) and e.receiver in subs and subs[e.receiver].count is None
            and _dense(program, e) is not None]


def _linear_group(program: ir.Program, block: ir.Block) -> tuple[ir.Function, object, list[ir.Call]] | None:
    """The statement that calls the most distinct Linear subs on one pure input, and those
    calls (at least two), among the subs that `_rewritable` everywhere; None when there is none.

    A sub may be called at other places too (BERT's attention probabilities read the query and
    key projections again): each of those is rewritten as a slice of the fused call on its own
    input, so every call of the fused subs must be one `_fuse_group` can rewrite.
    """
    best = None
    for fn in _block_functions(program, block.id):
        stable = _stable_params(fn)
        # Calls on an argument the method never reassigns group across its statements (the
        # Llama source's `let k = ...k_proj.forward(x)` and `let v = ...v_proj.forward(x)`).
        across: dict[tuple, tuple[object, list[ir.Call]]] = {}
        for stmt in fn.body:
            if isinstance(stmt, ir.Loop):
                continue
            by_input: dict[tuple, list[ir.Call]] = {}
            for e in _linear_calls(program, block, stmt):
                if not _is_pure(e.args[0]) or not _rewritable(program, block, e.receiver):
                    continue
                form = _dense(program, e)
                key = (e.args[0], form.in_dim, form.dtype, form.out_in, form.bias is None)
                group = by_input.setdefault(key, [])
                if all(c.receiver != e.receiver for c in group):
                    group.append(e)
                if isinstance(e.args[0], ir.Ref) and e.args[0].name in stable:
                    first, calls = across.setdefault(key, (stmt, []))
                    if all(c.receiver != e.receiver for c in calls):
                        calls.append(e)
            for group in by_input.values():
                if len(group) >= 2 and (best is None or len(group) > len(best[2])):
                    best = (fn, stmt, group)
        for first, group in across.values():
            if len(group) >= 2 and (best is None or len(group) > len(best[2])):
                best = (fn, first, group)
    return best


def _stable_params(fn: ir.Function) -> set[str]:
    """The method's arguments that no statement (in a loop body either) assigns: a dense call
    on one of them gives the same value in every statement."""
    assigned: set[str] = set()

    def visit(stmts) -> None:
        for stmt in stmts:
            if isinstance(stmt, ir.Loop):
                visit(stmt.body)
            elif isinstance(stmt, (ir.Assign, ir.Let)):
                assigned.add(stmt.name)
            elif isinstance(stmt, ir.Unpack):
                assigned.update(stmt.names)

    visit(fn.body)
    return {name for name, t in fn.params if t is not None and name not in assigned}


def _rewritable(program: ir.Program, block: ir.Block, member: str) -> bool:
    """Every call of sub `member`, in every method of the block, is a Linear call on a pure
    input in a statement outside any loop, so each can become a slice of a fused call."""
    for fn in _block_functions(program, block.id):
        for stmt in fn.body:
            calls = [e for e in (ir.exprs([stmt]) if isinstance(stmt, ir.Loop) else ir.walk(stmt.value))
                     if isinstance(e, ir.Call) and e.receiver == member]
            if not calls:
                continue
            if isinstance(stmt, ir.Loop) or not all(
                    _dense(program, e) is not None and _is_pure(e.args[0]) for e in calls):
                return False
    return True


def _fuse_group(out: Optimized, block: ir.Block, fn: ir.Function, anchor, group: list[ir.Call]) -> None:
    """Replace the `group`'s subs by one Linear over their concatenated weights, anchored at
    statement `anchor` of `fn`, and rewrite every call of them (`_linear_group` proved each
    rewritable)."""
    program = out.program
    first = program.functions[group[0].function]
    forms = [_dense(program, c) for c in group]
    widths = [f.out_dim.as_int() for f in forms]
    total = sum(widths)
    in_dim, dtype, out_in, has_bias = forms[0].in_dim, forms[0].dtype, forms[0].out_in, forms[0].bias is not None
    # The fused sub-block keeps the group's layout ([Out, In] read transposed, or [In, Out])
    # and its bias or lack of one, so every emitter writes it as it writes the originals.
    fused_block_id = ir.fresh(f"{program.blocks[first.block].name}_{in_dim}_{total}", program.blocks)
    member = ir.fresh("_".join(c.receiver for c in group),
                     {s.name for s in block.subs} | {n for n, _ in block.params})
    wt = ir.TensorType((const(total), in_dim) if out_in else (in_dim, const(total)), dtype)
    bt = ir.TensorType((const(total),), dtype)
    fused_fn_id = f"{fused_block_id}.{first.name}"
    x_name = first.params[0][0]
    result = ir.TensorType(group[0].type.dims[:-1] + (const(total),), dtype)
    body_line = first.body[0].line
    weight = ir.ParamRef("weight", wt)
    if out_in:
        weight = ir.Op("transpose", (weight,), ir.TensorType((in_dim, const(total)), dtype), body_line)
    body = ir.Op("matmul", (ir.Ref(x_name, group[0].args[0].type), weight), result, body_line)
    if has_bias:
        body = ir.Op("add", (body, ir.ParamRef("bias", bt)), result, body_line)
    program.functions[fused_fn_id] = ir.Function(
        fused_fn_id, first.name, first.source, fused_block_id, [(x_name, group[0].args[0].type)],
        [ir.Return(body, body_line)], result, first.span,
        {**first.generics, "Out": total}, dict(first.dim_sources))
    source_block = program.blocks[first.block]
    fused_params = [("weight", wt)] + ([("bias", bt)] if has_bias else [])
    program.blocks[fused_block_id] = ir.Block(fused_block_id, source_block.name, source_block.source,
                                              {**source_block.generics, "Out": total}, fused_params,
                                              [], {first.name: fused_fn_id}, source_block.span)
    block.subs = [s for s in block.subs if s.name not in {c.receiver for c in group}]
    block.subs.insert(0, ir.Sub(member, fused_block_id, None))
    # The plan: the fused weight and bias are the originals concatenated along Out.
    for prefix in _block_paths(program, block.id):
        out.plan[f"{prefix}{member}.weight"] = ParamTransform(
            f"{prefix}{member}.weight", tuple(f"{prefix}{c.receiver}.{f.weight}" for c, f in zip(group, forms)),
            forms[0].out_axis)
        if has_bias:
            out.plan[f"{prefix}{member}.bias"] = ParamTransform(
                f"{prefix}{member}.bias", tuple(f"{prefix}{c.receiver}.{f.bias}" for c, f in zip(group, forms)), 0)
    rows, start = {}, 0
    for call, width in zip(group, widths):
        rows[call.receiver], start = (start, start + width), start + width
    for method in _block_functions(program, block.id):
        for stmt, read in _calls_as_slices(method, rows, member, fused_fn_id, total, dtype):
            if method is fn and stmt is anchor:
                out.applied.append(f"{block.id}.{fn.name}: fused {', '.join(c.receiver for c in group)} into one "
                                   f"Linear<{in_dim}, {total}> `{member}`")
            else:
                out.applied.append(f"{block.id}.{method.name}: {', '.join(read)} read as rows of the fused `{member}`")


def _calls_as_slices(method: ir.Function, rows: dict[str, tuple[int, int]], member: str, fused_fn_id: str,
                     total: int, dtype: str) -> list[tuple[object, list[str]]]:
    """Rewrite every call of the subs in `rows` in `method` as a slice of the fused call on
    its input: one `let <member> = <member>.forward(x)` before the statement per distinct
    input.  Returns each rewritten statement as it was, with the subs it called."""
    taken = {n for n, _ in method.params} | ir.bound_names(method.body)
    stable = _stable_params(method)
    # One fused call per argument of the method for all its statements (it has one value
    # throughout); any other input gets its own per statement.
    shared: dict[ir.Expr, ir.Ref] = {}
    new_body, rewritten = [], []
    for stmt in method.body:
        calls = [] if isinstance(stmt, ir.Loop) else [
            e for e in ir.walk(stmt.value) if isinstance(e, ir.Call) and e.receiver in rows]
        if not calls:
            new_body.append(stmt)
            continue
        locals_by_input: dict[ir.Expr, ir.Ref] = {
            k: v for k, v in shared.items() if any(c.args[0] == k for c in calls)}
        for call in calls:
            if call.args[0] not in locals_by_input:
                fused = ir.TensorType(call.type.dims[:-1] + (const(total),), dtype)
                local = ir.fresh(member, taken)
                taken.add(local)
                new_body.append(ir.Let(local, ir.Call(fused_fn_id, (call.args[0],), fused, stmt.line, member),
                                       stmt.line))
                locals_by_input[call.args[0]] = ir.Ref(local, fused)
                if isinstance(call.args[0], ir.Ref) and call.args[0].name in stable:
                    shared[call.args[0]] = locals_by_input[call.args[0]]

        def as_slice(e):
            if not (isinstance(e, ir.Call) and e.receiver in rows):
                return None
            first_row, end_row = rows[e.receiver]
            items = tuple(("slice", const(0), None) for _ in range(e.type.rank - 1)) + (
                ("slice", const(first_row), const(end_row)),)
            return ir.Op("index", (locals_by_input[e.args[0]],), e.type, e.line, (("items", items),))

        new_body.append(replace(stmt, value=ir.map_expr(stmt.value, as_slice)))
        rewritten.append((stmt, sorted({c.receiver for c in calls}, key=list(rows).index)))
    method.body[:] = new_body
    return rewritten


# ----------------------------------------------------- fold_attention_scale


def _power_of_two(value: float) -> bool:
    mantissa, _ = math.frexp(value)
    return value > 0 and mantissa == 0.5


def _rearranges(e: ir.Expr) -> bool:
    """An op that moves every element of its operand somewhere in its result (a reshape, a
    permute): scaling all of its operand scales all of its result."""
    return isinstance(e, ir.Op) and ops.OPS[e.op].moves_data and ops.OPS[e.op].rearranges


def _data_movement(program: ir.Program, fn: ir.Function) -> bool:
    """A free function whose body only rearranges its one argument (`split_heads`)."""
    if fn.block is not None or len(fn.params) != 1 or len(fn.body) != 1 or not isinstance(fn.body[0], ir.Return):
        return False
    e = fn.body[0].value
    while _rearranges(e):
        e = e.args[0]
    return isinstance(e, ir.Ref) and e.name == fn.params[0][0]


#: The std attention functions whose scale folds into their queries: source -> the index of
#: the scale among the arguments (the queries are the first).
_SCALED_QUERIES = {ATTENTION: 3, ATTENTION_DROPOUT: 3, ATTENTION_PROBABILITIES: 2}


def _fold_attention_scale(out: Optimized, exact: bool) -> None:
    program = out.program
    for block_id in list(program.blocks):
        block = program.blocks[block_id]
        by_rows: dict[tuple[str, int, int], list] = {}
        for found in _scaled_attention_calls(program, block, exact):
            by_rows.setdefault(found[2][:3], []).append(found)
        for (member, start, stop), found in by_rows.items():
            scales = {call.args[_SCALED_QUERIES[program.functions[call.function].source]].value
                      for _, call, _ in found}
            if len(scales) != 1 or not _read_only_by(program, block, member, (start, stop), found):
                continue
            (scale,) = scales
            form = _dense(program, found[0][2][4])
            for prefix in _block_paths(program, block_id):
                for p in (form.weight, form.bias):
                    if p is None:
                        continue
                    path = f"{prefix}{member}.{p}"
                    t = out.plan.get(path, ParamTransform(path, (path,), 0))
                    out.plan[path] = replace(t, row_scales=t.row_scales + ((start, stop, scale),))
            for fn, call, _ in found:
                out.applied.append(f"{block_id}.{fn.name}: folded the attention scale {scale:g} into "
                                   f"`{member}` rows [{start}, {stop})")
            _set_scale_one(program, {id(call) for _, call, _ in found}, {fn.id for fn, _, _ in found})


def _scaled_attention_calls(program: ir.Program, block: ir.Block, exact: bool) -> list:
    """(method, attention call, (member, first row, end row, let name or None)) for each call
    in the block's methods whose scale may fold into the Linear its queries come from."""
    found = []
    for fn in _block_functions(program, block.id):
        lets = {s.name: s.value for s in fn.body if isinstance(s, ir.Let)}
        assigned = {s.name for s in fn.body if isinstance(s, ir.Assign)}
        for stmt in fn.body:
            if isinstance(stmt, ir.Loop):
                continue
            for e in ir.walk(stmt.value):
                if not (isinstance(e, ir.Call) and program.functions[e.function].source in _SCALED_QUERIES):
                    continue
                scale = e.args[_SCALED_QUERIES[program.functions[e.function].source]]
                if not isinstance(scale, ir.Scalar) or scale.value == 1.0:
                    continue
                if exact and (not _power_of_two(scale.value) or scale.type.dtype == "f16"):
                    continue
                target = _linear_source(program, block, e.args[0], lets, assigned)
                if target is not None:
                    found.append((fn, e, target))
    return found


def _read_only_by(program: ir.Program, block: ir.Block, member: str, rows: tuple[int, int], found) -> bool:
    """Whether every call of sub `member` is read, in the rows `rows`, by the queries of the
    `found` attention calls only: then scaling those rows of its weights changes nothing else.

    A call inside an expression must be a found call's queries; a call a `let` binds (a fused
    projection) may also be read, by its other users, in rows that do not overlap `rows`.
    """
    for fn in _block_functions(program, block.id):
        here = [target for f, _, target in found if f is fn]
        lets = {s.name: s.value for s in fn.body if isinstance(s, ir.Let)}
        exprs = list(ir.exprs(fn.body))
        direct = sum(isinstance(e, ir.Call) and e.receiver == member for e in exprs)
        for name, value in lets.items():
            if not (isinstance(value, ir.Call) and value.receiver == member):
                continue
            direct -= 1
            refs = sum(isinstance(e, ir.Ref) and e.name == name for e in exprs)
            elsewhere = sum(isinstance(e, ir.Op) and e.op == "index" and isinstance(e.args[0], ir.Ref)
                            and e.args[0].name == name and not _overlaps(e, rows) for e in exprs)
            if refs != elsewhere + sum(t[3] == name for t in here):
                return False
        if direct != sum(t[3] is None for t in here):
            return False
    return True


def _overlaps(index: ir.Op, rows: tuple[int, int]) -> bool:
    """Whether an index of a fused projection reads any of `rows` along its last axis."""
    *lead, last = index.attr("items")
    if not all(i == ("slice", const(0), None) for i in lead) or last[0] != "slice" or last[2] is None:
        return True
    return last[1].as_int() < rows[1] and rows[0] < last[2].as_int()


def _set_scale_one(program: ir.Program, calls: set[int], functions: set[str]) -> None:
    """Give the attention calls `calls` (by id) scale 1 in the `functions` that hold them."""
    def fold(e):
        if isinstance(e, ir.Call) and id(e) in calls:
            index = _SCALED_QUERIES[program.functions[e.function].source]
            return replace(e, args=e.args[:index] + (replace(e.args[index], value=1.0),) + e.args[index + 1:])
        return None

    for fn_id in functions:
        fn = program.functions[fn_id]
        for i, stmt in enumerate(fn.body):
            if not isinstance(stmt, ir.Loop):
                fn.body[i] = replace(stmt, value=ir.map_expr(stmt.value, fold))


def _linear_source(program, block, q, lets, assigned) -> tuple[str, int, int, str | None, ir.Call] | None:
    """(sub member, first row, end row, the `let` holding its call or None, that call) of the
    dense layer whose output `q` is, through data movement."""
    while True:
        if isinstance(q, ir.Call) and q.receiver is None and _data_movement(program, program.functions[q.function]):
            q = q.args[0]
        elif _rearranges(q):
            q = q.args[0]
        else:
            break
    subs = {s.name: s for s in block.subs}
    name = None
    if isinstance(q, ir.Op) and q.op == "index" and isinstance(q.args[0], ir.Ref):
        items = q.attr("items")
        *lead, last = items
        if not all(i == ("slice", const(0), None) for i in lead) or last[0] != "slice" or last[2] is None:
            return None
        name = q.args[0].name
        if name in assigned or name not in lets:
            return None
        q, rows = lets[name], (last[1].as_int(), last[2].as_int())
    else:
        rows = None
    if not (isinstance(q, ir.Call) and q.receiver in subs and subs[q.receiver].count is None):
        return None
    form = _dense(program, q)
    # Scaling whole rows of the weight scales outputs only when rows are outputs ([Out, In]).
    if form is None or not form.out_in:
        return None
    return (q.receiver, *(rows or (0, form.out_dim.as_int())), name, q)


# ------------------------------------------------------------------ binding


def bind_params(optimized: Optimized, tensors: Mapping[str, Any], *, only_plan: bool = False) -> dict[str, Any]:
    """The optimised program's params from the original ones, applying the plan once.

    Works on numpy arrays, torch tensors and JAX arrays alike.  Params the plan does not
    mention are passed through as they are (no copy); `only_plan` returns just the ones it
    makes.
    """
    out: dict[str, Any] = {}
    for path, t in optimized.program.param_paths():
        transform = optimized.plan.get(path)
        if transform is None:
            if not only_plan:
                out[path] = tensors[path]
            continue
        parts = [tensors[s] for s in transform.sources]
        framework = framework_of(parts[0])
        value = parts[0] if len(parts) == 1 else framework.concat(parts, transform.axis)
        if transform.row_scales:
            value = framework.scale_rows(value, transform.row_scales, owned=len(parts) > 1)
        out[path] = value
    return out


# ----------------------------------------------------------------- registry

#: Every pass by name.  `dead_rows` follows the two that rewrite blocks' methods in place (they
#: see every caller of a sub, and its clones would be more), and packing packs what is left of
#: the rows dead-row elimination computes.  Those two compute some values over fewer rows, in a
#: smaller GEMM that may round otherwise (within 1e-6), so they are not bit-exact.
REGISTRY: dict[str, ir.Pass] = {p.name: p for p in (
    ir.Pass("fuse_linears", _fuse_linears),
    ir.Pass("fold_attention_scale", _fold_attention_scale, requires=("fuse_linears",)),
    ir.Pass("dead_rows", dead_rows, requires=("fuse_linears", "fold_attention_scale"), exact=False),
    ir.Pass("pack_tokens", pack_tokens, requires=("dead_rows",), exact=False),
)}
