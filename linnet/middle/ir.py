"""The lowered form: one backend-neutral program that every emitter reads.

Lowering (`linnet.middle.lower`) monomorphises the checked program for one instantiation: every
block generic is a number or a dtype, `if let` is decided, `some`/`none` are resolved, and
only an entry's own dims (B, S) remain symbolic.  What is left is small:

* `Block` — one per distinct block instantiation: its params (concrete shapes), its subs,
  and the functions defined on it.
* `Function` — parameters, a list of statements, a result type.  Expressions are trees
  (`Op`, `Call`, `Ref`, ...) whose every node carries its concrete type and the source
  line it came from, so emitters can write readable, commented code.

`verify()` checks the invariants emitters rely on: every name read is defined, every call
names a function and passes it as many arguments as it takes, a variable is read at the type
its `let` gave it, and every op and its attrs are what the op registry declares.  Tests run it
after every lowering, and after every optimisation pass (`run_passes(..., verify_each=True)`).

Passes share the helpers here: `walk`/`exprs`/`calls` visit expressions, `map_expr`/
`map_stmts` rewrite them, `fresh`/`fresh_id` make names, `Specialisations` clones functions
per form of their inputs, and `Pass`/`run_passes` run a sequence of rewrites.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Union

from .. import ops
from ..diagnostics import InternalError, Span
from ..dims import DimExpr


@dataclass(frozen=True)
class TensorType:
    dims: tuple[DimExpr, ...]  # constants, or expressions over the entry's dims
    dtype: str

    @property
    def rank(self) -> int:
        return len(self.dims)

    def __str__(self) -> str:
        return f"Tensor[{', '.join(map(str, self.dims))}; {self.dtype}]"


@dataclass(frozen=True)
class TupleType:
    """A function's several results (`-> (logits: ..., cache: ...)`); `names` all None when
    they are not named.  Only a function's result, a call of it and a `MakeTuple` have one."""

    items: tuple[TensorType, ...]
    names: tuple[str | None, ...]

    def __str__(self) -> str:
        return "(" + ", ".join(f"{n}: {t}" if n else str(t) for n, t in zip(self.names, self.items)) + ")"


def result_types(t: "TensorType | TupleType") -> tuple[TensorType, ...]:
    """The tensors a result is: itself, or each of several."""
    return t.items if isinstance(t, TupleType) else (t,)


# ------------------------------------------------------------------- expressions


@dataclass(frozen=True)
class Ref:
    """A function parameter or local variable."""

    name: str
    type: TensorType


@dataclass(frozen=True)
class ParamRef:
    """A parameter of the block the function belongs to (`self.weight`)."""

    name: str
    type: TensorType


@dataclass(frozen=True)
class Scalar:
    """A number known at compile time; `type.dtype` is the dtype it takes in its expression."""

    value: float
    type: TensorType


@dataclass(frozen=True)
class DimValue:
    """The value of a dim (`S`, `D / Heads`), possibly known only at run time."""

    expr: DimExpr


@dataclass(frozen=True)
class Absent:
    """`none` passed for an Option parameter."""


@dataclass(frozen=True)
class Op:
    """A primitive (`matmul`, `softmax`, ...) or arithmetic (`add`, `sub`, `mul`, `div`, `neg`).

    `op` names a record of the op registry (`linnet.ops.OPS`), whose schema says which static
    arguments live in `attrs`: `axis`, `perm`, `shape` (a tuple of dims), `items` for
    indexing (each `("index", dim)` or `("slice", start, stop)`), `dtype` for cast/iota, `n`
    for iota.
    """

    op: str
    args: tuple["Expr", ...]
    type: TensorType
    line: int
    attrs: tuple[tuple[str, object], ...] = ()

    def attr(self, name: str, default=None):
        return dict(self.attrs).get(name, default)


#: The receiver of a call of a sibling function. No source name can be spelled this way, so
#: a sub or loop variable named `self` is never taken for the block itself.
SIBLING = "<sibling>"


@dataclass(frozen=True)
class Call:
    """A call of another lowered function.

    `receiver` is None for a free function, `SIBLING` for a sibling function of the same
    block, or the sub member (or static-for loop variable) whose function is called.
    """

    function: str  # Function.id
    args: tuple["Expr", ...]
    type: TensorType
    line: int
    receiver: str | None = None


@dataclass(frozen=True)
class MakeTuple:
    """`(a, b)`, the value of a `Return` in a function with several results, and nowhere else."""

    args: tuple["Expr", ...]
    type: TupleType
    line: int


Expr = Union[Ref, ParamRef, Scalar, DimValue, Absent, Op, Call, MakeTuple]
#: The expressions with arguments, which visitors descend into.
WITH_ARGS = (Op, Call, MakeTuple)


# -------------------------------------------------------------------- statements


@dataclass(frozen=True)
class Let:
    name: str
    value: Expr
    line: int


@dataclass(frozen=True)
class Assign:
    name: str
    value: Expr
    line: int


@dataclass(frozen=True)
class Unpack:
    """`let (a, b) = f(x)`: `value`, a call whose type is a `TupleType`, bound one name per result."""

    names: tuple[str, ...]
    value: Expr
    line: int


@dataclass(frozen=True)
class Return:
    value: Expr
    line: int


@dataclass(frozen=True)
class Collect:
    """What a collecting loop (`let into = static for ... collect var { ... }`) gathers: the
    value of the local `var` as the loop starts, then after each pass, stacked on a new
    leading axis into the local `into` of type `type` (`[passes + 1, *var's dims]`)."""

    into: str
    var: str
    type: TensorType


@dataclass(frozen=True)
class Loop:
    """`static for var in member { body }` over a sub-block array of the function's block.
    `index`, when the loop enumerates, names the dim symbol that is the pass number (0, 1, ...)
    in the body's index expressions.  `start`/`stop` make it run over the elements [start, stop)
    of the array only (stop None: to the end); `linnet.middle.rows` peels a last pass off that
    way, so that pass can run a body of its own."""

    var: str
    member: str
    body: tuple["Stmt", ...]
    line: int
    collect: Collect | None = None
    index: str | None = None
    start: int = 0
    stop: int | None = None

    def passes(self, count: int) -> range:
        """The elements of a `count`-long sub array the loop runs over."""
        return range(self.start, count if self.stop is None else self.stop)


Stmt = Union[Let, Unpack, Assign, Return, Loop]


# ---------------------------------------------------------------------- program


@dataclass
class Function:
    id: str  # unique in the program: `split_heads`, `Linear_768_3072.forward`
    name: str  # the Linnet name: `split_heads`, `forward`
    source: str  # the checked function's key, e.g. `std.nn.norm::layer_norm`
    block: str | None  # Block.id for methods
    params: list[tuple[str, TensorType | None]]  # None: an absent Option (always passed `none`)
    body: list[Stmt]
    result: "TensorType | TupleType"
    span: Span
    generics: dict[str, object]  # the instantiation, for comments: {"D": 768, "T": "f32"}
    # Where each symbolic dim used in the body is read at run time: dim -> (param, axis).
    dim_sources: dict[str, tuple[str, int]] = field(default_factory=dict)
    #: What an optimisation pass did to this function, for the generated code's comments.
    notes: list[str] = field(default_factory=list)


@dataclass
class Sub:
    name: str
    block: str  # Block.id
    count: int | None  # None for one sub-block, N for an array


@dataclass
class Block:
    id: str  # `Linear_768_3072` when several instantiations exist, else the Linnet name
    name: str
    source: str  # the checked block's key, e.g. `std.nn.linear::Linear`
    generics: dict[str, object]
    params: list[tuple[str, TensorType]]
    subs: list[Sub]
    methods: dict[str, str] = field(default_factory=dict)  # Linnet fn name -> Function.id
    span: Span | None = None


@dataclass(frozen=True)
class ComputedDefault:
    """An entry input the caller may leave out, computed from earlier inputs when left out
    (`position_ids: Tensor[B, S; i32] = positions(attention_mask)`)."""

    function: str  # Function.id of the block function the resolver made of the expression
    args: tuple[str, ...]  # the entry inputs it reads, in order
    text: str  # the expression as written, for signatures and comments
    span: Span  # where it is written


@dataclass
class Entry:
    name: str
    function: str  # Function.id of the root block's method
    dims: list[str]  # the free dims, B and S
    inputs: list[tuple[str, TensorType]]
    result: "TensorType | TupleType"  # several results: a tuple at run time (named if they are)
    preconditions: list[tuple[DimExpr, str, DimExpr, Span]]  # e.g. (S, "<=", 512)
    dim_sources: dict[str, tuple[str, int]]
    #: Inputs the caller may leave out (`= zeros` / `= ones`) and their fill value.  Every
    #: backend's function takes every input; the Python API fills the left-out ones.
    defaults: dict[str, int] = field(default_factory=dict)
    #: Set by `linnet.middle.packing` when the entry runs packed: (the mask input, the fixed
    #: positions kept besides its nonzero ones), so a runtime can count the kept tokens.
    packed_by: tuple[str, tuple[int, ...]] | None = None
    #: Inputs with a computed default.  The torch and JAX code computes a left-out one in the
    #: entry function (`if position_ids is None: ...`); the ONNX runtime runs the default's
    #: own graph first (`onnx_runtime`), as the entry's graph takes every input.
    computed: dict[str, ComputedDefault] = field(default_factory=dict)

    def functions(self) -> list[str]:
        """The function ids the entry runs: its own, then its computed defaults'."""
        return [self.function] + [c.function for c in self.computed.values()]


def output_names(entry: Entry, base: str) -> list[str]:
    """What exports (ONNX graph outputs, StableHLO's signature.json, Triton) call the entry's
    results: `base` (nest.toml `[outputs]`, else the entry's name) for one result; for several,
    `base.name` per named result, `base.0`, `base.1`, ... when unnamed, so two entries of one
    graph never share an output name."""
    if not isinstance(entry.result, TupleType):
        return [base]
    return [f"{base}.{name if name is not None else i}" for i, name in enumerate(entry.result.names)]


def pairwise_result(entry: Entry) -> bool:
    """Whether the entry's result has one of its free dims twice, a value per pair of
    positions (attention probabilities, `[B, Layers, Heads, S, S]`): its size grows with the
    square of the sequence, so exports keep it apart from the per-token entries (a graph of
    its own, out of Triton's default set)."""
    for result in result_types(entry.result):
        free = [str(d) for d in result.dims if str(d) in entry.dims]
        if len(free) != len(set(free)):
            return True
    return False


@dataclass
class Program:
    root: str  # Block.id
    blocks: dict[str, Block]
    functions: dict[str, Function]
    entries: dict[str, Entry]
    files: dict[str, str] = field(default_factory=dict)  # source file name -> display path

    def param_paths(self) -> list[tuple[str, TensorType]]:
        """Every parameter of the model, by dotted path (`layers.0.up.weight`)."""
        return [(prefix + name, t) for block_id, prefix in self.instances() for name, t in self.blocks[block_id].params]

    def instances(self) -> list[tuple[str, str]]:
        """Every block instance in the tree, as (Block.id, param-path prefix): ("Model", ""),
        ("EncoderLayer", "layers.0."), ... in depth-first order."""
        out: list[tuple[str, str]] = []

        def walk(block_id: str, prefix: str) -> None:
            out.append((block_id, prefix))
            for sub in self.blocks[block_id].subs:
                if sub.count is None:
                    walk(sub.block, f"{prefix}{sub.name}.")
                else:
                    for i in range(sub.count):
                        walk(sub.block, f"{prefix}{sub.name}.{i}.")

        walk(self.root, "")
        return out


# ------------------------------------------------------ visiting and rewriting


def walk(expr: Expr):
    """`expr` and every expression inside it, parents before their arguments."""
    yield expr
    if isinstance(expr, WITH_ARGS):
        for a in expr.args:
            yield from walk(a)


def exprs(stmts):
    """Every expression of the statements, those in loop bodies included, in order."""
    for stmt in stmts:
        if isinstance(stmt, Loop):
            yield from exprs(stmt.body)
        else:
            yield from walk(stmt.value)


def calls(stmts):
    """Every call of another function in the statements."""
    return (e for e in exprs(stmts) if isinstance(e, Call))


def map_expr(expr: Expr, fn) -> Expr:
    """Rebuild `expr` bottom-up; `fn(node)` returns a replacement or None to keep the node.
    Unchanged subtrees stay the same objects."""
    if isinstance(expr, WITH_ARGS):
        args = tuple(map_expr(a, fn) for a in expr.args)
        if args != expr.args:
            expr = replace(expr, args=args)
    replaced = fn(expr)
    return expr if replaced is None else replaced


def map_stmts(stmts, fn) -> list:
    """The statements with `map_expr(value, fn)` applied to every value, in loop bodies too."""
    out = []
    for stmt in stmts:
        if isinstance(stmt, Loop):
            out.append(replace(stmt, body=tuple(map_stmts(stmt.body, fn))))
        else:
            out.append(replace(stmt, value=map_expr(stmt.value, fn)))
    return out


def returns_several(program: "Program", entry: Entry) -> bool:
    """Whether the entry, or a function it reaches, has several results.  The passes that
    rewrite a function for its call sites (packing, dead rows) do not follow a tuple through
    `Unpack`, so they leave such an entry as it is: unoptimised, never wrong."""
    seen: set[str] = set()
    todo = list(entry.functions())
    while todo:
        fn = program.functions[todo.pop()]
        if fn.id in seen:
            continue
        seen.add(fn.id)
        if isinstance(fn.result, TupleType):
            return True
        todo += [c.function for c in calls(fn.body)]
    return False


def fresh(name: str, taken) -> str:
    """A local name not in `taken`: `name`, else `name_2`, `name_3`, ..."""
    candidate, n = name, 2
    while candidate in taken:
        candidate, n = f"{name}_{n}", n + 1
    return candidate


def fresh_id(base: str, *taken) -> str:
    """A function id in none of `taken`: `base`, else `base_`, `base__`, ..."""
    while any(base in t for t in taken):
        base += "_"
    return base


class Specialisations:
    """Clones of a program's functions, one per function and form of its inputs (what its
    callers pass, or what they read of its result), for the passes that rewrite a function for
    its call sites (`linnet.middle.packing`, `linnet.middle.rows`).

    `memo` maps a pass's key (function id, form, ...) to what it made of that function; `made`
    holds the clones by id, each named `<function>_<tag>`.  Stores may be shared between
    instances (packing shares one per mask), and `ids` is every id given out, over all stores.
    """

    def __init__(self, program: Program, tag: str, memo: dict | None = None,
                 made: dict[str, Function] | None = None, ids: set[str] | None = None):
        self.program, self.tag = program, tag
        self.memo: dict = {} if memo is None else memo
        self.made: dict[str, Function] = {} if made is None else made
        self.ids: set[str] = set() if ids is None else ids

    def clone(self, fn: Function, params, body, result: TensorType, dim_sources: dict, note: str) -> str:
        """Add the clone of `fn` with these params, body and result; returns its id."""
        new_id = fresh_id(f"{fn.id}_{self.tag}", self.program.functions, self.made, self.ids)
        self.ids.add(new_id)
        self.made[new_id] = Function(new_id, f"{fn.name}_{self.tag}", fn.source, fn.block, list(params), list(body),
                                     result, fn.span, fn.generics, dim_sources, [note])
        return new_id


# ------------------------------------------------------------------------ passes


@dataclass(frozen=True)
class Pass:
    """One rewrite of the optimisation stage: `run(state, exact)` changes `state.program` in
    place (and whatever else the state records).  `requires`: the passes that must come before
    it when they run too (ordering, not inclusion); `exact`: whether it keeps every output
    bit-identical (a pass that computes fewer rows through a smaller GEMM may round otherwise)."""

    name: str
    run: Callable[[object, bool], None]
    requires: tuple[str, ...] = ()
    exact: bool = True


def run_passes(state, passes, *, exact: bool = True, verify_each: bool = False) -> None:
    """Run `passes` (a sequence of `Pass`) in order over `state.program`; with `verify_each`,
    `verify` the program after each one, so a pass that breaks an invariant is named."""
    names = [p.name for p in passes]
    for i, p in enumerate(passes):
        late = [r for r in p.requires if r in names[i + 1:]]
        if late:
            raise InternalError(f"the pass `{p.name}` must run after {', '.join(f'`{r}`' for r in late)}")
    for p in passes:
        p.run(state, exact)
        if verify_each:
            try:
                verify(state.program)
            except InternalError as error:
                error.add_note(f"found by ir.verify after the pass `{p.name}`")
                raise


# ------------------------------------------------------------------------ verify


def _expr_refs(expr: Expr):
    if isinstance(expr, Ref):
        yield expr.name
    elif isinstance(expr, WITH_ARGS):
        for a in expr.args:
            yield from _expr_refs(a)


def bound_names(stmts) -> set[str]:
    """Every local name the statements bind, in nested loops too: lets, assigned vars, loop
    variables and collected stacks."""
    names: set[str] = set()
    for stmt in stmts:
        if isinstance(stmt, Loop):
            names |= {stmt.var} | bound_names(stmt.body)
            if stmt.collect is not None:
                names.add(stmt.collect.into)
        elif isinstance(stmt, (Let, Assign)):
            names.add(stmt.name)
        elif isinstance(stmt, Unpack):
            names |= set(stmt.names)
    return names


def _introduced_dims(stmts) -> set[str]:
    """Dims a function makes itself: the count a `pack_index` op finds at run time."""
    dims: set[str] = set()
    for stmt in stmts:
        if isinstance(stmt, Loop):
            dims |= _introduced_dims(stmt.body)
        elif isinstance(stmt.value, Op) and stmt.value.op == "pack_index":
            dims |= stmt.value.attr("dim").free_symbols()
    return dims


def _verify_function(program: Program, fn: Function, allowed_dims: set[str]) -> None:
    defined = {name for name, _ in fn.params}
    #: The type of each param and `let` (an `Assign`ed variable may change what it holds).
    types: dict[str, TensorType | None] = dict(fn.params)

    def check_expr(expr: Expr) -> None:
        if isinstance(expr, Call):
            if expr.function not in program.functions:
                raise InternalError(f"{fn.id}: call of unknown function {expr.function}")
            callee = program.functions[expr.function]
            if len(expr.args) != len(callee.params):
                raise InternalError(f"{fn.id}: a call of {callee.id} with {len(expr.args)} arguments; "
                                    f"it takes {len(callee.params)}")
        if isinstance(expr, Ref) and types.get(expr.name) is not None and expr.type != types[expr.name]:
            raise InternalError(f"{fn.id}: `{expr.name}` is read as {expr.type}, but it holds {types[expr.name]}")
        if isinstance(expr, WITH_ARGS):
            for d in (d for t in result_types(expr.type) for d in t.dims):
                extra = d.free_symbols() - allowed_dims
                if extra:
                    raise InternalError(f"{fn.id}: type {expr.type} has unbound dims {sorted(extra)}")
            for a in expr.args:
                check_expr(a)
        if isinstance(expr, Op):
            problem = ops.attr_problem(expr.op, expr.attrs)
            if problem is not None:
                raise InternalError(f"{fn.id}: {problem}")
        for name in _expr_refs(expr):
            if name not in defined:
                raise InternalError(f"{fn.id}: reference to undefined `{name}`")
        if isinstance(expr, ParamRef) and fn.block is not None:
            names = {n for n, _ in program.blocks[fn.block].params}
            if expr.name not in names:
                raise InternalError(f"{fn.id}: unknown block param `{expr.name}`")

    def check_stmts(stmts) -> None:
        for stmt in stmts:
            if isinstance(stmt, Loop):
                check_range(stmt)
                if stmt.collect is not None:
                    check_collect(stmt)
                check_stmts(stmt.body)
                if stmt.collect is not None:
                    defined.add(stmt.collect.into)
                continue
            check_expr(stmt.value)
            check_several(stmt)
            if isinstance(stmt, Unpack):
                defined.update(stmt.names)
                types.update(zip(stmt.names, stmt.value.type.items))
            if isinstance(stmt, (Let, Assign)):
                defined.add(stmt.name)
                value_type = getattr(stmt.value, "type", None)
                types[stmt.name] = value_type if isinstance(stmt, Let) and isinstance(value_type, TensorType) else None

    def check_several(stmt) -> None:
        """Several results travel only from a call to an `Unpack` or a `Return`, a `MakeTuple`
        only to a `Return`, and a return's value is what the function declares it returns."""
        several = isinstance(getattr(stmt.value, "type", None), TupleType)
        if isinstance(stmt, Unpack):
            if not (isinstance(stmt.value, Call) and several and len(stmt.names) == len(stmt.value.type.items)):
                raise InternalError(f"{fn.id}: unpacking {len(stmt.names)} names from {stmt.value}")
        elif isinstance(stmt, Return):
            if several != isinstance(fn.result, TupleType) or (several and stmt.value.type != fn.result):
                raise InternalError(f"{fn.id}: returns {getattr(stmt.value, 'type', None)}, declared {fn.result}")
        elif several:
            raise InternalError(f"{fn.id}: several results bound to one name, `{stmt.name}`")
        nested = [e for e in walk(stmt.value) if e is not stmt.value]
        if any(isinstance(getattr(e, "type", None), TupleType) for e in nested):
            raise InternalError(f"{fn.id}: several results used as one value")

    def check_range(loop: Loop) -> None:
        subs = {s.name: s for s in program.blocks[fn.block].subs} if fn.block is not None else {}
        count = subs[loop.member].count if loop.member in subs else None
        stop = count if loop.stop is None else loop.stop
        if count is not None and not 0 <= loop.start <= stop <= count:
            raise InternalError(f"{fn.id}: a loop over [{loop.start}, {loop.stop}) of `{loop.member}`, "
                                f"which has {count} elements")

    def check_collect(loop: Loop) -> None:
        collect = loop.collect
        if collect.var not in defined:
            raise InternalError(f"{fn.id}: `collect {collect.var}` of a variable not defined before the loop")
        subs = {s.name: s for s in program.blocks[fn.block].subs} if fn.block is not None else {}
        member = subs.get(loop.member)
        if member is None or member.count is None:
            raise InternalError(f"{fn.id}: a loop over `{loop.member}`, which is not a sub-block array")
        if (loop.start, loop.stop) != (0, None):
            raise InternalError(f"{fn.id}: a collecting loop over part of `{loop.member}` only")
        if not collect.type.dims or collect.type.dims[0].as_int() != member.count + 1:
            raise InternalError(f"{fn.id}: `{collect.into}` is {collect.type}, but the loop makes "
                                f"{member.count} passes, so it collects {member.count + 1} values")

    check_stmts(fn.body)


def verify(program: Program) -> None:
    """Raise InternalError unless every emitter invariant holds."""
    if program.root not in program.blocks:
        raise InternalError(f"root block {program.root} missing")
    for entry in program.entries.values():
        if any(fn_id not in program.functions for fn_id in entry.functions()):
            raise InternalError(f"entry {entry.name} points at a missing function")
        for param, default in entry.computed.items():
            inputs = [n for n, _ in entry.inputs]
            if param not in inputs or not set(default.args) <= set(inputs[:inputs.index(param)]):
                raise InternalError(f"entry {entry.name}: the default of `{param}` reads {default.args}, "
                                    "which are not inputs before it")
        missing = set(entry.dims) - set(entry.dim_sources)
        if missing:
            raise InternalError(f"entry {entry.name}: no input gives dims {sorted(missing)}")
    entry_dims = {d for e in program.entries.values() for d in e.dims}
    # A count `pack_index` finds at run time (the packed tokens) may appear in the types of the
    # functions that make and pass it on; it is read from the packed rows where it is used.
    entry_dims |= {d for fn in program.functions.values() for d in _introduced_dims(fn.body)}
    for fn in program.functions.values():
        # A function may also use dims of its own that it reads from its inputs (lowering
        # makes them for a product of the caller's dims, such as `B * C`).
        readable = {s for _, t in fn.params if t is not None for d in t.dims for s in d.free_symbols()}
        _verify_function(program, fn, entry_dims | readable)
    for block in program.blocks.values():
        for sub in block.subs:
            if sub.block not in program.blocks:
                raise InternalError(f"{block.id}.{sub.name}: unknown block {sub.block}")
