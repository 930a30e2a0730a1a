"""Dead-row elimination: compute only the rows of a value that an entry reads.

A classifier reads one position of the last hidden state (`hidden[:, 0, :]`: BERT's pooler, ViT's
class token), yet the program as written computes every position of the last layer.  Most of
that layer acts on each position alone (Linear, layer norm, activations, the residual add);
only attention mixes positions, and it mixes them through its keys and values: row i of
`softmax(q k^T + m) v` reads row i of `q` (and of `m`) and every row of `k` and `v`.  This pass
pushes a fixed index back through the ops that act per position along the indexed axis, as far
as it can, and computes the rest on those rows only.

What the pass knows is one fact per op, about axes, never about models: along which axes of its
result the op acts *per position* (result row j depends only on row j of some operands and on
the whole of the others).

* elementwise ops (`add`, `erf`, `select`, ...: the registry's `OpDef.elementwise`, the trait
  `linnet.middle.packing` proves token ops with): along every axis; an operand that broadcasts along it (size 1, or absent) is read
  whole;
* reductions and `softmax`/`cumsum` along another axis than the one indexed; along the indexed
  axis itself a cumsum or a mean mixes the rows, so the pass stops there;
* `reshape`, when the axis survives it whole (the same size, the same product before it);
  `permute`, `transpose`, and `index` with a full slice there: they move the axis;
* `matmul(a, b)`: along the rows M of the product it reads rows of `a` and all of `b`; along
  the columns N, columns of `b` and all of `a`; along batch axes, both (broadcast as above);
* `take(table, ids)`: along the axes of `ids`.

Calls are specialised: a function whose result is read only at some rows gets a clone that
computes those rows (memoised per function and rows), and says which rows of each of its
params it reads.  So the pass reaches through `Linear.forward`, `layer_norm` and `attention`
by their Linnet bodies, with no list of known functions; a backend that writes `attention` or
`layer_norm` as a fused kernel gets fewer query rows, which every such kernel accepts.
Anything else, an op it has no fact for included, is computed whole and sliced after: the pass
is exact by construction, each kept row is computed by the same ops on the same inputs (a GEMM
over fewer rows may round in another order; measured within 1e-6).

Variables are followed backwards (a statement's uses are all known when its definition is
reached), and a `static for` whose result is read at some rows has its last pass peeled off
into a one-pass loop (`Loop.start`/`stop`) that runs the row-restricted body, repeatedly while
the rows entering a pass are still restricted; the other passes run as written.

The pass runs after `fuse_linears` and `fold_attention_scale`, which rewrite a block's methods in
place and need to see every caller of a sub (a clone would be one more).  So where the query,
key and value projections are fused (torch, JAX), the fused GEMM still computes the query for
every row and the query's row is sliced from it: 1/3 of that one GEMM, about 0.5% of a
12-layer model, is not saved.  ONNX keeps the projections apart, and there the query
projection runs on the one row.

One module of a little over 500 lines: the analysis and the rewrite are one backward walk that
shares the pending reads of every variable, and splitting it would pass that state around.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from . import ir
from .. import ops
from ..dims import DimExpr, const

#: Reads of a variable are written as a Ref to a name no source can spell until the variable's
#: definition says whether it holds every row or only the ones read (`_Body._resolve`).
_PENDING = "\0rows-pending-"


@dataclass(frozen=True)
class Rows:
    """The rows [start, stop) along `axis` of a value: all that its readers read."""

    axis: int
    start: int
    stop: int

    @property
    def count(self) -> int:
        return self.stop - self.start

    def at(self, axis: int) -> "Rows":
        return Rows(axis, self.start, self.stop)


def restrict(t: ir.TensorType, rows: Rows | None) -> ir.TensorType:
    if rows is None:
        return t
    dims = list(t.dims)
    dims[rows.axis] = const(rows.count)
    return ir.TensorType(tuple(dims), t.dtype)


def _full() -> tuple:
    return ("slice", const(0), None)


def slice_rows(e: ir.Expr, rows: Rows, line: int) -> ir.Op:
    """`e[..., start:stop, ...]` along `rows.axis`: the rows of a value that is computed whole."""
    items = tuple(_full() for _ in range(rows.axis)) + (("slice", const(rows.start), const(rows.stop)),)
    return ir.Op("index", (e,), restrict(e.type, rows), line, (("items", items),))


def _join(demands: list[Rows | None]) -> Rows | None:
    """The rows every use reads, or None (the whole value) when they differ or one reads all."""
    if not demands or any(d is None for d in demands):
        return None
    return demands[0] if all(d == demands[0] for d in demands) else None


def _tensor_rank(e: ir.Expr) -> int | None:
    t = getattr(e, "type", None)
    return t.rank if isinstance(t, ir.TensorType) else None


@dataclass
class _Use:
    """A read of a variable whose rows are not decided until its definition is reached."""

    name: str
    rows: Rows | None
    type: ir.TensorType  # the variable's type as written
    key: str


@dataclass
class Specialised:
    function: str  # the clone's id
    params: tuple[Rows | None, ...]  # the rows of each param it reads
    work: int  # ops it computes on fewer rows than written, its callees' included
    sources: tuple[str, ...]  # the fixed indices in it (or its callees) that start a restriction


class DeadRows:
    """The analysis and rewrite of one program (its memo is shared by every entry)."""

    def __init__(self, program: ir.Program):
        self.program = program
        self.clones = ir.Specialisations(program, "rows")
        self.memo: dict[tuple[str, Rows | None, bool], Specialised | None] = self.clones.memo
        self.made: dict[str, ir.Function] = self.clones.made
        self.keys = itertools.count()

    def specialise(self, fn_id: str, rows: Rows | None, *, entry: bool = False) -> Specialised | None:
        """The clone of a function for `rows` of its result; None if it would save nothing.  An
        entry's clone reads its params (the inputs) whole, taking the rows it reads itself."""
        key = (fn_id, rows, entry)
        if key not in self.memo:
            self.memo[key] = None  # no recursion in Linnet, but never loop if there were
            fn = self.program.functions[fn_id]
            body = _Body(self, fn)
            stmts, params = body.run(rows, whole_params=entry)
            useful = body.useful(params)
            self.memo[key] = self._clone(fn, rows, stmts, params, body.work, tuple(body.sources)) if useful else None
        return self.memo[key]

    def _clone(self, fn: ir.Function, rows, stmts, params, work, found) -> Specialised | None:
        new_params = [(name, restrict(t, d) if t is not None else t) for (name, t), d in zip(fn.params, params)]
        sources = _dim_sources(fn, new_params, params, stmts)
        if sources is None:
            return None  # a dim it still needs is read only from a param it now gets fewer rows of
        result = next(s.value.type for s in stmts if isinstance(s, ir.Return))
        note = (f"dead rows (linnet.middle.rows): computes rows [{rows.start}, {rows.stop}) of axis {rows.axis} "
                "of its result, all that its caller reads" if rows is not None else
                "dead rows (linnet.middle.rows): computes only the rows that are read of some values")
        new_id = self.clones.clone(fn, new_params, stmts, result, sources, note)
        return Specialised(new_id, tuple(params), work, found)


def _dim_sources(fn: ir.Function, new_params, param_rows, stmts) -> dict | None:
    """Where the clone reads each dim it still mentions; None if one has no param left to read it from."""
    needed = _mentioned_dims(stmts)
    sources = {}
    for dim, (param, axis) in fn.dim_sources.items():
        rows = dict(zip((n for n, _ in fn.params), param_rows)).get(param)
        if rows is None or rows.axis != axis:
            sources[dim] = (param, axis)
            continue
        if dim not in needed:
            continue
        other = [(name, i) for name, t in new_params if t is not None for i, d in enumerate(t.dims) if str(d) == dim]
        if not other:
            return None
        sources[dim] = other[0]
    return sources


def _mentioned_dims(stmts) -> set[str]:
    dims: set[str] = set()

    def add(d):
        if isinstance(d, DimExpr):
            dims.update(d.free_symbols())

    def walk(e):
        if isinstance(e, ir.DimValue):
            add(e.expr)
        t = getattr(e, "type", None)
        if isinstance(t, ir.TensorType):
            for d in t.dims:
                add(d)
        if isinstance(e, ir.Op):
            for _, value in e.attrs:
                for part in value if isinstance(value, tuple) else (value,):
                    for d in part if isinstance(part, tuple) else (part,):
                        add(d)
        if isinstance(e, (ir.Op, ir.Call)):
            for a in e.args:
                walk(a)

    for stmt in stmts:
        if isinstance(stmt, ir.Loop):
            dims |= _mentioned_dims(stmt.body)
        else:
            walk(stmt.value)
    return dims


class _Body:
    """One function's statements, rewritten backwards for the rows of its result that are read."""

    def __init__(self, owner: DeadRows, fn: ir.Function):
        self.owner, self.fn = owner, fn
        self.uses: dict[str, list[_Use]] = {}
        self.resolved: dict[str, ir.Expr] = {}
        self.work = 0
        self.sources: list[str] = []  # each index that starts a restriction, each loop pass peeled

    def useful(self, params) -> bool:
        return self.work > 0 or any(p is not None for p in params)

    def run(self, rows: Rows | None, whole_params: bool = False):
        stmts = self._stmts(self.fn.body, rows)
        params = []
        for name, t in self.fn.params:
            uses = self.uses.pop(name, [])
            joined = _join([u.rows for u in uses]) if t is not None and not whole_params else None
            self._resolve(uses, joined)
            params.append(joined)
        return [_substitute(s, self.resolved) for s in stmts], params

    # ------------------------------------------------------------ statements
    def _stmts(self, stmts, rows: Rows | None) -> list:
        out = []
        for stmt in reversed(stmts):
            if isinstance(stmt, ir.Return):
                out.append(ir.Return(self.push(stmt.value, rows), stmt.line))
            elif isinstance(stmt, ir.Loop):
                out.extend(reversed(self._loop(stmt)))
            else:
                out.append(self._define(stmt))
        return out[::-1]

    def _define(self, stmt):
        uses = self.uses.pop(stmt.name, [])
        joined = _join([u.rows for u in uses])
        value = self.push(stmt.value, joined)
        self._resolve(uses, joined)
        return type(stmt)(stmt.name, value, stmt.line)

    def _resolve(self, uses: list[_Use], joined: Rows | None) -> None:
        """Each pending read of a variable, now that its value (whole, or `joined` rows) is known."""
        for use in uses:
            if joined is not None:
                self.resolved[use.key] = ir.Ref(use.name, restrict(use.type, joined))
            elif use.rows is None:
                self.resolved[use.key] = ir.Ref(use.name, use.type)
            else:
                self.resolved[use.key] = slice_rows(ir.Ref(use.name, use.type), use.rows, self.fn.span.line)

    def _loop(self, loop: ir.Loop) -> list[ir.Loop]:
        """The loop, with its last passes peeled off while the rows they produce are read restricted."""
        count = _sub_count(self.owner.program, self.fn, loop.member)
        start, stop = loop.start, loop.stop if loop.stop is not None else count
        carried = sorted({s.name for s in loop.body if isinstance(s, ir.Assign)})
        peeled: list[ir.Loop] = []
        while stop > start and loop.collect is None and any(
                _join([u.rows for u in self.uses.get(n, [])]) is not None for n in carried):
            body = self._stmts(list(loop.body), None)
            peeled.insert(0, replace(loop, body=tuple(body), start=stop - 1, stop=stop))
            self.sources.append(f"the pass {stop - 1} over `{loop.member}` in `{self.fn.name}` is peeled off")
            stop -= 1
        if stop > start:
            # The remaining passes run whole: every carried value is read whole by the next pass.
            for name in carried:
                self._resolve(self.uses.pop(name, []), None)
                self.uses[name] = [self._pending_use(name, None, _assigned_type(loop, name))]
            collect = loop.collect
            if collect is not None:
                self._resolve(self.uses.pop(collect.into, []), None)
            body = self._stmts(list(loop.body), None)
            for name in carried:  # the value entering the first pass is read whole too
                self.uses.setdefault(name, []).append(self._pending_use(name, None, _assigned_type(loop, name)))
            if collect is not None:
                t = ir.TensorType(collect.type.dims[1:], collect.type.dtype)
                self.uses.setdefault(collect.var, []).append(self._pending_use(collect.var, None, t))
            ranged = {"start": start, "stop": stop} if (start, stop) != (0, count) else {"start": 0, "stop": None}
            peeled.insert(0, replace(loop, body=tuple(body), **ranged))
        return peeled

    def _pending_use(self, name: str, rows: Rows | None, t: ir.TensorType) -> _Use:
        return _Use(name, rows, t, f"{_PENDING}{next(self.owner.keys)}")

    # ----------------------------------------------------------- expressions
    def push(self, e: ir.Expr, rows: Rows | None) -> ir.Expr:
        """`e` computed for `rows` of its value (all of it for None)."""
        if isinstance(e, ir.Ref):
            use = self._pending_use(e.name, rows, e.type)
            self.uses.setdefault(e.name, []).append(use)
            return ir.Ref(use.key, restrict(e.type, rows))
        if isinstance(e, ir.Call):
            return self._call(e, rows)
        if isinstance(e, ir.Op):
            if rows is None:
                return self._whole_op(e)
            return self._op(e, rows)
        if rows is not None and isinstance(e, ir.ParamRef):
            return slice_rows(e, rows, self.fn.span.line)
        return e  # numbers, dims, none; a param read whole

    def _whole(self, e: ir.Expr, rows: Rows) -> ir.Expr:
        """No fact lets the rows through `e`: compute it whole, then take the rows."""
        return slice_rows(self.push(e, None), rows, getattr(e, "line", self.fn.span.line))

    def _call(self, e: ir.Call, rows: Rows | None) -> ir.Expr:
        made = self.owner.specialise(e.function, rows)
        if made is None:
            if rows is not None:
                return self._whole(e, rows)
            return replace(e, args=tuple(self.push(a, None) for a in e.args))
        self.work += made.work
        self.sources += [s for s in made.sources if s not in self.sources]
        args = tuple(self.push(a, r) for a, r in zip(e.args, made.params))
        return ir.Call(made.function, args, restrict(e.type, rows), e.line, e.receiver)

    def _whole_op(self, e: ir.Op) -> ir.Expr:
        source = _fixed_rows(e)
        if source is None:
            return replace(e, args=tuple(self.push(a, None) for a in e.args))
        # `x[:, k, :]`: x is needed at row k only.  Whether that saves anything is known only
        # once x's definition is reached (it may be a variable); a function that ends up with
        # nothing computed on fewer rows is not cloned (`DeadRows.specialise`).
        rows, items = source
        self.sources.append(f"`{self.fn.name}` line {e.line} reads position {rows.start} of axis {rows.axis}")
        return ir.Op("index", (self.push(e.args[0], rows),), e.type, e.line, (("items", items),))

    def _op(self, e: ir.Op, rows: Rows) -> ir.Expr:
        args = self._operand_rows(e, rows)
        if args is None:
            return self._whole(e, rows)
        if not ops.OPS[e.op].moves_data:  # rewriting data movement saves no arithmetic
            self.work += 1
        new_args = tuple(self.push(a, r) for a, r in zip(e.args, args))
        attrs = e.attrs
        if e.op == "reshape":
            shape = list(e.attr("shape"))
            shape[rows.axis] = const(rows.count)
            attrs = tuple((k, tuple(shape) if k == "shape" else v) for k, v in e.attrs)
        return ir.Op(e.op, new_args, restrict(e.type, rows), e.line, attrs)

    def _operand_rows(self, e: ir.Op, rows: Rows) -> list[Rows | None] | None:
        """The rows of each operand that `rows` of the result read; None when the op mixes along the axis."""
        op, axis, rank, record = e.op, rows.axis, e.type.rank, ops.OPS[e.op]
        if record.elementwise:
            return [_broadcast_rows(a, rows, rank) for a in e.args]
        x = e.args[0]
        if record.along_axis:
            own = (e.attr("axis") if e.attr("axis") is not None else -1) % rank
            return None if own == axis or _tensor_rank(x) != rank else [rows]
        if op == "permute":
            return [rows.at(e.attr("perm")[axis])]
        if op == "transpose":
            return [rows.at({rank - 1: rank - 2, rank - 2: rank - 1}.get(axis, axis))]
        if op == "reshape":
            source = _reshape_source_axis(x.type.dims, e.attr("shape"), axis)
            return None if source is None else [rows.at(source)]
        if op == "index":
            source = _index_source_axis(e.attr("items"), axis)
            items = e.attr("items")
            if source < len(items) and items[source] != _full():
                return None
            return [rows.at(source)]
        if op == "matmul":
            return _matmul_rows(e, rows)
        if op == "take":
            return [None, rows] if axis < e.args[1].type.rank else None
        return None


def _broadcast_rows(a: ir.Expr, rows: Rows, rank: int) -> Rows | None:
    """The rows of an operand of a broadcasting op: none to restrict if it broadcasts along the axis."""
    own = _tensor_rank(a)
    if own is None:
        return None
    aligned = rows.axis - (rank - own)
    if aligned < 0 or a.type.dims[aligned] == const(1):
        return None
    return rows.at(aligned)


def _matmul_rows(e: ir.Op, rows: Rows) -> list[Rows | None] | None:
    a, b = e.args
    rank, axis = e.type.rank, rows.axis
    if axis == rank - 2:
        return [rows.at(a.type.rank - 2), None]
    if axis == rank - 1:
        return [None, rows.at(b.type.rank - 1)]
    # A batch axis: both operands, each broadcast over the product's leading axes.
    return [_broadcast_rows(x, replace(rows, axis=axis - (rank - 2) + (x.type.rank - 2)), x.type.rank)
            if axis - (rank - 2) + (x.type.rank - 2) >= 0 else None for x in (a, b)]


def _product(dims) -> DimExpr:
    out = const(1)
    for d in dims:
        out = out * d
    return out


def _reshape_source_axis(src, shape, axis: int) -> int | None:
    """The input axis that output `axis` of a reshape is, whole, if there is one."""
    before = _product(shape[:axis])
    for i, d in enumerate(src):
        if d == shape[axis] and _product(src[:i]) == before:
            return i
    return None


def _index_source_axis(items, out_axis: int) -> int:
    kept = [i for i, it in enumerate(items) if it[0] != "index"]
    return kept[out_axis] if out_axis < len(kept) else out_axis + len(items) - len(kept)


def _fixed_rows(e: ir.Op) -> tuple[Rows, tuple] | None:
    """For `x[:, k, :]` (k a constant, full slices elsewhere): the row it reads, and its items
    once `x` holds only that row.  A constant slice (`qkv[:, :, 768:1536]`, the keys' part of a
    fused projection) starts nothing: the pass removes rows that are never read, it does not
    split work that is read in parts."""
    if e.op != "index":
        return None
    items = e.attr("items")
    fixed = [i for i, it in enumerate(items) if it != _full()]
    if len(fixed) != 1 or items[fixed[0]][0] != "index":
        return None
    i = fixed[0]
    start = items[i][1].as_int()
    if start is None or start < 0:
        return None
    return Rows(i, start, start + 1), items[:i] + (("index", const(0)),) + items[i + 1:]


def _sub_count(program: ir.Program, fn: ir.Function, member: str) -> int:
    return next(s.count for s in program.blocks[fn.block].subs if s.name == member)


def _assigned_type(loop: ir.Loop, name: str) -> ir.TensorType:
    return next(s.value.type for s in loop.body if isinstance(s, ir.Assign) and s.name == name)


def _substitute(stmt, resolved: dict[str, ir.Expr]):
    """Put each pending read's resolution in place (pending reads are Refs with reserved names)."""
    def fix(e):
        if isinstance(e, ir.Ref) and e.name.startswith(_PENDING):
            return fix(resolved[e.name])
        if isinstance(e, (ir.Op, ir.Call)):
            args = tuple(fix(a) for a in e.args)
            return replace(e, args=args) if args != e.args else e
        return e

    if isinstance(stmt, ir.Loop):
        return replace(stmt, body=tuple(_substitute(s, resolved) for s in stmt.body))
    return replace(stmt, value=fix(stmt.value))


# ------------------------------------------------------------------ the pass


def dead_rows(out, exact: bool = True) -> None:
    """The pass (see the module doc): each entry computes only the rows its result reads."""
    program = out.program
    owner = DeadRows(program)
    for name, entry in list(program.entries.items()):
        if ir.returns_several(program, entry):
            out.notes.append(f"{name}: dead rows: not tried, as it has several results somewhere")
            continue
        made = owner.specialise(entry.function, None)
        if made is not None and any(p is not None for p in made.params):
            made = owner.specialise(entry.function, None, entry=True)  # it reads rows of an input
        if made is None or made.work == 0:
            continue  # nothing computed on fewer rows
        fn, clone = program.functions[entry.function], owner.made[made.function]
        clone.name = fn.name  # the entry keeps its name; the original stays for other callers
        fn.name = f"{fn.name}_full"
        entry.function = made.function
        out.applied.append(f"{name}: dead rows: {'; '.join(made.sources)}; {made.work} ops run on those rows only")
    program.functions.update(_reachable(program, owner.made))


def _reachable(program: ir.Program, made: dict[str, ir.Function]) -> dict[str, ir.Function]:
    """The clones some entry calls (a clone made for a caller that was not rewritten is dropped)."""
    functions = {**program.functions, **made}
    seen: set[str] = set()
    todo = [fn_id for entry in program.entries.values() for fn_id in entry.functions()]
    while todo:
        fn_id = todo.pop()
        if fn_id in seen:
            continue
        seen.add(fn_id)
        todo += [e.function for e in ir.calls(functions[fn_id].body)]
    return {fn_id: fn for fn_id, fn in made.items() if fn_id in seen}
