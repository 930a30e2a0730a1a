"""Checked program + instantiation -> the lowered form (`linnet.middle.ir`), shared by every backend.

Lowering walks each entry's call tree.  Every function is specialised for the generic
bindings it is called with (block generics are numbers, an entry's B and S stay symbols),
for which Option arguments are present, and for the block instance it runs on.  Types
come from the checker's records, substituted with the bindings; nothing is re-inferred.
Calls to std functions stay calls, so a backend can replace a whole function
(`std.nn.norm::layer_norm`) by a fused kernel of its own while the others emit its body.

Why over 500 lines: one `_lower_<node>` per syntax node of a function body, sharing one
specialisation scope; the per-primitive special cases live in the op registry (ops.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..front import ast
from .. import codes, ops
from . import ir
from ..check import CheckedProgram, FnSig
from ..diagnostics import InternalError, LinnetError, Diagnostic
from ..dims import DimExpr, Sym, const, sym
from .instantiate import BlockInstance, Instance
from ..types import (DIM_KIND, Binding, Member, DimT, ListT, NoneT, OptionT, TensorT, TupleT, Type, Variadic, dims_only,
                    number_range, substitute, substitute_dims)

#: Binary operator -> the op it lowers to, from the registry (`OpDef.operator`).
_ARITH = {op.operator: name for name, op in ops.OPS.items() if op.operator is not None}


def _number(value: int, dtype: str, span) -> float:
    """An integer (a literal or a concrete dim) as a number of `dtype`; one that does not fit is
    an error at its source, not an overflow inside a backend."""
    low, high = number_range(dtype)
    if not low <= value <= high:
        shown = str(value) if len(str(value)) <= 30 else f"{str(value)[:12]}...({len(str(value))} digits)"
        raise LinnetError(Diagnostic(codes.DTYPE_MISMATCH,
                                     f"the number {shown} does not fit {dtype}, whose values lie in "
                                     f"[{low:g}, {high:g}]", span))
    return float(value)


def _concrete(t: Type, env) -> ir.TensorType:
    s = substitute(t, env)
    if isinstance(s, TupleT):  # several results: each concrete
        return ir.TupleType(tuple(_concrete(i, {}) for i in s.items), s.names)
    if not isinstance(s, TensorT) or any(isinstance(d, Variadic) for d in s.dims) or not isinstance(s.dtype, str):
        raise InternalError(f"lowering met a type that is not concrete: {s}")
    return ir.TensorType(tuple(s.dims), s.dtype)


def _substitute_binding(value: Binding, env) -> Binding:
    if isinstance(value, DimExpr):
        return value.substitute(dims_only(env))
    if isinstance(value, tuple):
        return substitute_dims(value, env)
    if isinstance(value, (str, float, Member)):
        return value  # a dtype, a Real's number or a member
    bound = env.get(value.name)  # a DTypeVar, RealVar or MemberVar of the caller
    return bound if bound is not None else value


def _env_key(env: dict) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in env.items()))


def _id_part(value) -> str:
    """A generic's value as part of a block id (`Inner_0p25` for a Real of 0.25)."""
    text = str(_display(value))
    return text.replace(".", "p").replace("-", "m").replace("+", "") if isinstance(value, float) else text


def _display(value) -> object:
    if isinstance(value, DimExpr):
        return value.as_int() if value.as_int() is not None else str(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)


@dataclass
class _Scope:
    """Lowering state for one function body."""

    fn: FnSig
    env: dict
    block: BlockInstance | None
    block_id: str | None
    # Linnet local -> emitted name, for the names visible where lowering is; a nested body
    # (`static for`, `if let`) works on a copy, so its bindings end with it.
    names: dict[str, str] = field(default_factory=dict)
    present: dict[str, bool] = field(default_factory=dict)  # Option param -> passed some(...)
    # Visible loop variable (Linnet name) -> (emitted name, sub array member).
    loop_vars: dict[str, tuple[str, str]] = field(default_factory=dict)
    used_dims: set[str] = field(default_factory=set)
    # Every name the function's source binds or declares (params, locals, loop variables,
    # generics): a renamed local must not take one of them.
    source_names: set[str] = field(default_factory=set)
    emitted: set[str] = field(default_factory=set)  # emitted local names given out so far

    def enter(self) -> tuple[dict, dict]:
        """Open a nested body; `leave` with the result restores what is visible after it."""
        return dict(self.names), dict(self.loop_vars)

    def leave(self, saved: tuple[dict, dict]) -> None:
        self.names, self.loop_vars = saved

    def bind(self, name: str, avoid: frozenset[str] = frozenset()) -> str:
        """The emitted name of a new local `name`.

        Generated code has one flat namespace per function, where Linnet has a scope per
        body: a `let h` inside a `static for` that shadows an `h` outside must not overwrite
        it. So a name that would clobber a visible one (or one in `avoid`) becomes `h_2`."""
        taken = set(self.names.values()) | {emitted for emitted, _ in self.loop_vars.values()} | avoid
        emitted, n = name, 2
        while emitted in taken:
            # A new name must also differ from every name the source or earlier lowering uses.
            emitted, n = f"{name}_{n}", n + 1
            taken |= self.source_names | self.emitted
        self.emitted.add(emitted)
        return emitted


class Lowerer:
    def __init__(self, instance: Instance):
        self.instance = instance
        self.checked: CheckedProgram = instance.checked
        self.blocks: dict[str, ir.Block] = {}
        self.block_ids: dict[tuple, str] = {}  # (block key, env) -> Block.id
        self.instances: dict[str, BlockInstance] = {}
        self.functions: dict[str, ir.Function] = {}
        self.function_ids: dict[tuple, str] = {}
        #: Every dim symbol in use: the entries' dims, and the local ones `_local_dims` makes.
        self.dim_names: set[str] = {d for sig in instance.entries.values() for d in sig.dims}
        #: (callee generic, the caller's product) -> the callee's own dim for it (`_local_dims`)
        self.local_dims: dict[tuple[str, str], DimExpr] = {}

    # ---------------------------------------------------------------- blocks
    def lower(self) -> ir.Program:
        self._name_blocks()
        root_id = self._block_id(self.instance.root)
        entries = {}
        for name, sig in self.instance.entries.items():
            env = {**self.instance.root.env, **{d: sym(d) for d in sig.dims}}
            fn_id = self._function(sig.fn, env, self.instance.root, ())
            fn = self.functions[fn_id]
            entries[name] = ir.Entry(
                name, fn_id, list(sig.dims), [(n, ir.TensorType(tuple(t.dims), t.dtype)) for n, t in sig.params],
                _concrete(sig.result, {}),
                [(p.bound.left, p.bound.op, p.bound.right, p.clause.span) for p in sig.preconditions],
                sig.dim_sources(), dict(sig.fn.defaults))
            fn.dim_sources = {**sig.dim_sources(), **fn.dim_sources}
            for param, fn_name in sig.fn.computed.items():
                # The default's function, lowered with the entry's dims: the root block's own.
                default_sig = self.instance.root.block.functions[fn_name]
                default_id = self._function(default_sig, env, self.instance.root, ())
                node = default_sig.node
                entries[name].computed[param] = ir.ComputedDefault(
                    default_id, tuple(p.name for p in node.params), sig.fn.computed_text[param], node.span)
        program = ir.Program(root_id, self.blocks, self.functions, entries)
        ir.verify(program)
        return program

    def _name_blocks(self) -> None:
        """One ir.Block per distinct instantiation; suffix the name only when there are several."""
        by_block: dict[str, list[BlockInstance]] = {}
        for inst in self.instance.root.walk():
            key = (inst.block.key, _env_key(inst.env))
            if key in self.block_ids:
                continue
            self.block_ids[key] = ""
            by_block.setdefault(inst.block.key, []).append(inst)
        for block_key, insts in by_block.items():
            differing = [g.name for g in insts[0].block.generics
                         if len({str(i.env[g.name]) for i in insts}) > 1]
            for inst in insts:
                name = inst.block.name
                if len(insts) > 1:
                    name += "_" + "_".join(_id_part(inst.env[g]) for g in differing)
                self.block_ids[(block_key, _env_key(inst.env))] = name
                self.instances[name] = inst
        for name, inst in self.instances.items():
            self.blocks[name] = self._block(name, inst)

    def _block_id(self, inst: BlockInstance) -> str:
        return self.block_ids[(inst.block.key, _env_key(inst.env))]

    def _block(self, block_id: str, inst: BlockInstance) -> ir.Block:
        sig = inst.block
        params = [(name, _concrete(t, inst.env)) for name, (t, _) in sig.params.items()]
        subs = []
        for name, child in inst.children.items():
            if child == []:  # an empty sub array: no element, nothing for the program to name
                continue
            if isinstance(child, list):
                subs.append(ir.Sub(name, self._block_id(child[0]), len(child)))
            else:
                subs.append(ir.Sub(name, self._block_id(child), None))
        return ir.Block(block_id, sig.name, sig.key, {k: _display(v) for k, v in inst.env.items()}, params, subs,
                        span=sig.node.name_span)

    # ------------------------------------------------------------- functions
    def _function(self, sig: FnSig, env: dict, block: BlockInstance | None, presence: tuple) -> str:
        block_id = self._block_id(block) if block is not None else None
        key = (sig.key, block_id, _env_key(env), presence)
        if key in self.function_ids:
            return self.function_ids[key]
        fn_id = self._new_function_id(sig, block_id)
        self.function_ids[key] = fn_id
        scope = _Scope(sig, env, block, block_id)
        scope.source_names = ({name for name, _, _ in sig.params} | set(sig.scope)
                              | _declared_names(sig.node.body))
        params: list[tuple[str, ir.TensorType | None]] = []
        for (name, t, _), is_present in zip(sig.params, presence or (True,) * len(sig.params)):
            scope.names[name] = name
            scope.emitted.add(name)
            if isinstance(t, OptionT):
                scope.present[name] = is_present
                params.append((name, _concrete(t.inner, env) if is_present else None))
            else:
                params.append((name, self._param_type(t, env)))
        fn = ir.Function(fn_id, sig.name, sig.key, block_id, params, [], _concrete(sig.result, env),
                         sig.node.span, self._generics_for_comment(sig, env))
        self.functions[fn_id] = fn
        if block_id is not None:
            self.blocks[block_id].methods.setdefault(sig.name, fn_id)
        fn.body = self._stmts(sig.node.body, scope)
        fn.dim_sources = self._dim_sources(fn, scope)
        return fn_id

    def _param_type(self, t: Type, env) -> ir.TensorType | None:
        s = substitute(t, env)
        return _concrete(s, {}) if isinstance(s, TensorT) else None

    def _new_function_id(self, sig: FnSig, block_id: str | None) -> str:
        base = f"{block_id}.{sig.name}" if block_id else sig.name
        candidate, n = base, 2
        while candidate in self.functions:
            candidate, n = f"{base}_{n}", n + 1
        return candidate

    def _generics_for_comment(self, sig: FnSig, env) -> dict:
        return {name: _display(env[name]) for name in sig.scope if name in env}

    def _dim_sources(self, fn: ir.Function, scope: _Scope) -> dict[str, tuple[str, int]]:
        sources: dict[str, tuple[str, int]] = {}
        for dim in sorted(scope.used_dims):
            for name, t in fn.params:
                if t is None:
                    continue
                axis = next((i for i, d in enumerate(t.dims) if d == sym(dim)), None)
                if axis is not None:
                    sources[dim] = (name, axis)
                    break
            else:
                raise LinnetError(Diagnostic(
                    codes.DIM_NOT_IN_INPUTS,
                    f"`{fn.name}` uses the dim `{dim}` at run time, but none of its inputs has an axis "
                    f"of exactly that size, so the generated code could not read it", fn.span))
        return sources

    # ------------------------------------------------------------ statements
    def _stmts(self, stmts: list[ast.Stmt], scope: _Scope) -> list[ir.Stmt]:
        out: list[ir.Stmt] = []
        for stmt in stmts:
            out.extend(self._stmt(stmt, scope))
        return out

    def _stmt(self, stmt: ast.Stmt, scope: _Scope) -> list[ir.Stmt]:
        line = stmt.span.line
        if isinstance(stmt, ast.Let):
            value = self._expr(stmt.value, scope)  # before the name is bound: `let x = x + 1` reads the old x
            scope.names[stmt.name] = scope.bind(stmt.name)
            if isinstance(value, ir.DimValue):
                return []  # a dim local: each read is its dim expression (`_lower_name`), nothing to run
            return [ir.Let(scope.names[stmt.name], value, line)]
        if isinstance(stmt, ast.Destructure):
            value = self._expr(stmt.value, scope)
            for name in stmt.names:
                scope.names[name] = scope.bind(name)
            return [ir.Unpack(tuple(scope.names[n] for n in stmt.names), value, line)]
        if isinstance(stmt, ast.Assign):
            value = self._expr(stmt.value, scope)
            if isinstance(value, ir.DimValue):
                return []  # the same dim the variable holds (checked), so nothing changes
            return [ir.Assign(scope.names[stmt.name], value, line)]
        if isinstance(stmt, ast.Return):
            return [ir.Return(self._expr(stmt.value, scope), line)]
        if isinstance(stmt, ast.StaticFor):
            if scope.block.children[stmt.iterable] == []:  # an empty array: no pass, nothing to run
                if stmt.collect is not None:
                    raise LinnetError(Diagnostic(codes.IMPOSSIBLE_SHAPE, f"`static for ... collect` over the "
                                                 f"sub array `{stmt.iterable}`, which has no element here; a "
                                                 f"collecting loop needs at least one pass", stmt.span))
                return []
            return [self._loop(stmt, scope)]
        if isinstance(stmt, ast.IfSome):
            # Decided here: the instantiation knows whether the Option was passed.
            option = stmt.option.name
            saved = scope.enter()
            if scope.present.get(option):
                scope.names[stmt.binding] = scope.names[option]
                body = self._stmts(stmt.then_body, scope)
            else:
                body = self._stmts(stmt.else_body, scope)
            scope.leave(saved)
            return body
        raise InternalError(f"cannot lower statement {type(stmt).__name__}")

    def _loop(self, stmt: ast.StaticFor, scope: _Scope) -> ir.Loop:
        collect = stmt.collect
        # The stack is built in a local of its own while the body runs, so its name must not
        # be one that the body binds.
        into = scope.bind(collect.into, frozenset(_declared_names(stmt.body) | {stmt.var})) if collect else None
        saved = scope.enter()
        var = scope.bind(stmt.var)
        scope.loop_vars[stmt.var] = (var, stmt.iterable)
        index = self._bind_index(stmt, scope)
        body = tuple(self._stmts(stmt.body, scope))
        scope.leave(saved)
        if index is not None:
            # The pass number is the loop's own, not a dim read from the inputs' shapes.
            del scope.env[stmt.index]
            scope.used_dims.discard(index)
        if collect is None:
            return ir.Loop(var, stmt.iterable, body, stmt.span.line, index=index)
        values = self._tensor_type(collect.var, scope)
        passes = len(scope.block.children[stmt.iterable])
        stacked = ir.TensorType((const(passes + 1),) + values.dims, values.dtype)
        scope.names[collect.into] = into
        return ir.Loop(var, stmt.iterable, body, stmt.span.line,
                       ir.Collect(into, scope.names[collect.var.name], stacked), index)

    @staticmethod
    def _bind_index(stmt: ast.StaticFor, scope: _Scope) -> str | None:
        """`i` of `static for i, x in enumerate(xs)`: a Python-safe local name, and the dim `i`
        of the checked types rewritten to a symbol of that name, which each backend binds to
        the number of the pass."""
        if stmt.index is None:
            return None
        index = scope.bind(stmt.index)
        scope.names[stmt.index] = index  # taken, so no local of the body is emitted under it
        scope.env[stmt.index] = sym(index)
        return index

    # ----------------------------------------------------------- expressions
    def _type_of(self, node, scope: _Scope) -> Type:
        try:
            return substitute(self.checked.types[id(node)], scope.env)
        except KeyError:
            raise InternalError(f"no recorded type for expression at {node.span}") from None

    def _tensor_type(self, node, scope) -> ir.TensorType:
        return _concrete(self._type_of(node, scope), {})

    def _dim(self, expr: DimExpr, scope: _Scope) -> ir.DimValue:
        scope.used_dims |= set(expr.free_symbols())
        return ir.DimValue(expr)

    def _expr(self, node: ast.Expr, scope: _Scope) -> ir.Expr:
        return getattr(self, f"_lower_{type(node).__name__.lower()}")(node, scope)

    def _lower_name(self, node: ast.Name, scope: _Scope) -> ir.Expr:
        info = self.checked.names.get(id(node))
        t = self._type_of(node, scope)
        if info is None:
            raise InternalError(f"unresolved name `{node.name}` at {node.span}")
        if info.kind == "local":
            if isinstance(t, DimT):
                # A dim local (`let full = 1 - (i + 1) % Every`): the checker proved every
                # assignment equal to its declared dim, so a read is that dim, pass number included.
                return self._dim(t.expr, scope)
            return ir.Ref(scope.names.get(node.name, node.name), _concrete(t, {}))
        if info.kind == "param":
            return ir.ParamRef(node.name, _concrete(t, {}))
        if info.kind in ("dim", "index"):
            return self._dim(t.expr, scope)
        if info.kind == "real":
            return ir.Scalar(float(scope.env[node.name]), _concrete(t, {}))
        if info.kind == "member":
            # The primitive taking it (`activation`) reads the member's place in its kind.
            return ir.Scalar(float(scope.env[node.name].index), ir.TensorType((), "f32"))
        value, dtype = self.checked.consts[info.target]
        if isinstance(t, DimT):
            return ir.DimValue(t.expr)
        return ir.Scalar(float(value), _concrete(t, {}))

    def _lower_tuplelit(self, node: ast.TupleLit, scope) -> ir.Expr:
        t = self._tensor_type(node, scope)  # the function's declared results (checked so)
        args = tuple(self._as_operand(self._expr(item, scope), r.dtype, item.span)
                     for item, r in zip(node.items, t.items))
        return ir.MakeTuple(args, t, node.span.line)

    def _lower_intlit(self, node: ast.IntLit, scope) -> ir.Expr:
        return ir.DimValue(const(node.value))

    def _lower_floatlit(self, node: ast.FloatLit, scope) -> ir.Expr:
        return ir.Scalar(node.value, ir.TensorType((), "f32"))

    def _lower_nonelit(self, node, scope) -> ir.Expr:
        return ir.Absent()

    def _lower_unary(self, node: ast.Unary, scope) -> ir.Expr:
        t = self._type_of(node, scope)
        operand = self._expr(node.operand, scope)
        if isinstance(t, DimT):
            return self._dim(t.expr, scope)
        if isinstance(operand, ir.Scalar):
            return ir.Scalar(-operand.value, operand.type)
        return ir.Op("neg", (operand,), _concrete(t, {}), node.span.line)

    def _lower_binary(self, node: ast.Binary, scope) -> ir.Expr:
        t = self._type_of(node, scope)
        if isinstance(t, DimT):
            return self._dim(t.expr, scope)
        result = _concrete(t, {})
        left, right = self._expr(node.left, scope), self._expr(node.right, scope)
        args = tuple(self._as_operand(a, result.dtype, n.span) for a, n in ((left, node.left), (right, node.right)))
        if all(isinstance(a, ir.Scalar) for a in args):
            return ir.Scalar(_fold_arith(node.op, args[0].value, args[1].value), result)
        return ir.Op(_ARITH[node.op], args, result, node.span.line)

    @staticmethod
    def _as_operand(expr: ir.Expr, dtype: str, span=None) -> ir.Expr:
        """Numbers in a tensor expression take the expression's dtype."""
        if isinstance(expr, ir.DimValue) and expr.expr.as_int() is not None:
            return ir.Scalar(_number(expr.expr.as_int(), dtype, span), ir.TensorType((), dtype))
        if isinstance(expr, ir.Scalar):
            return ir.Scalar(expr.value, ir.TensorType((), dtype))
        return expr

    def _lower_index(self, node: ast.Index, scope) -> ir.Expr:
        target = self._expr(node.target, scope)
        items = []
        for item in node.items:
            if isinstance(item, ast.Slice):
                start = self._static(item.start, scope) if item.start is not None else const(0)
                stop = self._static(item.stop, scope) if item.stop is not None else None
                items.append(("slice", start, stop))
            else:
                items.append(("index", self._static(item, scope)))
            low, high = number_range("i64")  # every backend indexes with 64-bit integers
            for bound in items[-1][1:]:
                value = bound.as_int() if bound is not None else None
                if value is not None and not low < value < high:
                    raise LinnetError(Diagnostic(codes.INDEX_OUT_OF_BOUNDS,
                                                 f"index {value if len(str(value)) <= 30 else '(huge)'} "
                                                 "is out of bounds for any tensor (indices are 64-bit)", item.span))
        return ir.Op("index", (target,), self._tensor_type(node, scope), node.span.line, (("items", tuple(items)),))

    def _static(self, node, scope) -> DimExpr:
        t = self._type_of(node, scope)
        scope.used_dims |= set(t.expr.free_symbols())
        return t.expr

    def _lower_call(self, node: ast.Call, scope: _Scope) -> ir.Expr:
        if node.name == "some":
            return self._expr(node.args[0], scope)
        info = self.checked.calls.get(id(node))
        if info is None:
            raise InternalError(f"unresolved call `{node.name}` at {node.span}")
        if info.kind == "prim":
            return self._prim(node, info, scope)
        block = scope.block if info.kind == "self" else None
        return self._call(node, info, scope, block, ir.SIBLING if info.kind == "self" else None)

    def _lower_methodcall(self, node: ast.MethodCall, scope: _Scope) -> ir.Expr:
        info = self.checked.calls[id(node)]
        receiver, member = scope.loop_vars.get(node.receiver.name, (node.receiver.name, node.receiver.name))
        child = scope.block.children[member]
        block = child[0] if isinstance(child, list) else child
        return self._call(node, info, scope, block, receiver)

    def _call(self, node, info, scope: _Scope, block: BlockInstance | None, receiver: str | None) -> ir.Expr:
        callee = self.checked.functions[info.target]
        env = {k: _substitute_binding(v, scope.env) for k, v in info.bindings}
        if block is not None:
            env = {**block.env, **{k: v for k, v in env.items() if k not in block.env}}
        presence = tuple(not isinstance(self._type_of(a, scope), NoneT) for a in node.args)
        if not any(isinstance(t, OptionT) for _, t, _ in callee.params):
            presence = ()
        env = self._local_dims(callee, env)
        fn_id = self._function(callee, env, block, presence)
        args = tuple(self._expr(a, scope) for a in node.args)
        return ir.Call(fn_id, args, self._tensor_type(node, scope), node.span.line, receiver)

    def _local_dims(self, callee: FnSig, env: dict) -> dict:
        """A callee's dims bound to a product or sum of the caller's (`B * C` when a
        multiple-choice head flattens [B, C, S] to [B * C, S]) become dims of its own.

        Generated code reads every dim a function uses from its own inputs' shapes, and no
        input axis of the callee holds `B` or `C` alone, only `B * C`: a fresh symbol for
        the whole product is what the callee can read.  Its name is the callee's generic,
        made unique in the program (`B_2`).  The same product gets the same symbol at every
        call, so calls that agree in everything else share one specialisation of the callee
        (each entry of the multiple-choice head runs one encoder, not one copy per entry: a
        rewrite of one copy, such as the fused Q/K/V projection, then holds for all).
        """
        out = dict(env)
        for name in (g.name for g in callee.generics if g.kind == DIM_KIND):
            value = env.get(name)
            if not isinstance(value, DimExpr) or value.as_int() is not None or _is_symbol(value):
                continue
            key = (name, str(value))
            if key not in self.local_dims:
                fresh, n = name, 2
                while fresh in self.dim_names:
                    fresh, n = f"{name}_{n}", n + 1
                self.dim_names.add(fresh)
                self.local_dims[key] = sym(fresh)
            out[name] = self.local_dims[key]
        return out

    # ------------------------------------------------------------ primitives
    def _prim(self, node: ast.Call, info, scope: _Scope) -> ir.Expr:
        """A primitive call, by its registry record's hook; without one, the op of the same
        name over the lowered arguments, or the folded value of a constant argument."""
        record = ops.PRIMS[node.name]
        low = _PrimLowering(self, node, info, scope)
        if record.lower is not None:
            return record.lower(low)
        args = low.operands()
        if record.fold is not None and isinstance(args[0], ir.Scalar):
            return ir.Scalar(record.fold(args[0].value), low.result)
        return low.op(args)


class _PrimLowering:
    """One primitive call as its lowering hook sees it (the `ops.PrimLowering` protocol)."""

    def __init__(self, lowerer: Lowerer, node: ast.Call, info, scope: _Scope):
        self._lowerer, self._node, self._scope = lowerer, node, scope
        self.result = _concrete(lowerer._type_of(node, scope), {})
        self.result_dtype = self.result.dtype
        self.dtype_args = [_substitute_binding(v, scope.env) for _, v in info.bindings]
        self.arity = len(node.args)
        self._lowered: dict[int, ir.Expr] = {}

    def arg(self, i: int) -> ir.Expr:
        if i not in self._lowered:
            self._lowered[i] = self._lowerer._expr(self._node.args[i], self._scope)
        return self._lowered[i]

    def static(self, i: int) -> DimExpr:
        return self._lowerer._static(self._node.args[i], self._scope)

    def items(self, i: int) -> tuple[DimExpr, ...]:
        items = substitute(self._lowerer.checked.types[id(self._node.args[i])], self._scope.env)
        assert isinstance(items, ListT)
        for d in items.items:
            self._scope.used_dims |= set(d.free_symbols())
        return items.items

    def operands(self, dtype: str | None = None) -> tuple[ir.Expr, ...]:
        """Every argument; numbers take `dtype`, by default the result's."""
        return tuple(Lowerer._as_operand(self.arg(i), dtype or self.result_dtype, n.span)
                     for i, n in enumerate(self._node.args))

    def tensor_dtype(self) -> str:
        args = [self.arg(i) for i in range(self.arity)]
        return next((a.type.dtype for a in args if isinstance(a, (ir.Op, ir.Call, ir.Ref, ir.ParamRef))),
                    self.result_dtype)

    def number(self, i: int) -> ir.Scalar | None:
        arg = self.arg(i)
        if isinstance(arg, ir.DimValue) and arg.expr.as_int() is not None:
            return ir.Scalar(_number(arg.expr.as_int(), self.result_dtype, self._node.args[i].span), self.result)
        return None

    def read_dims(self, dims) -> None:
        for d in dims:
            self._scope.used_dims |= set(d.free_symbols())

    def fail(self, code, message: str):
        raise LinnetError(Diagnostic(code, message, self._node.span))

    def op(self, args, **attrs) -> ir.Op:
        return ir.Op(self._node.name, tuple(args), self.result, self._node.span.line, tuple(attrs.items()))


def _declared_names(stmts: list[ast.Stmt]) -> set[str]:
    """The names `let`, `var`, `static for` and `if let` bind in `stmts`, nested bodies included."""
    names: set[str] = set()
    for stmt in stmts:
        if isinstance(stmt, ast.Let):
            names.add(stmt.name)
        elif isinstance(stmt, ast.Destructure):
            names |= set(stmt.names)
        elif isinstance(stmt, ast.StaticFor):
            names |= {stmt.var} | _declared_names(stmt.body) | ({stmt.index} if stmt.index else set())
            if stmt.collect is not None:
                names.add(stmt.collect.into)
        elif isinstance(stmt, ast.IfSome):
            names |= {stmt.binding} | _declared_names(stmt.then_body) | _declared_names(stmt.else_body)
    return names


def _fold_arith(op: str, a: float, b: float) -> float:
    if op == "/" and b == 0:
        return _ieee_divide_by_zero(a, b)
    return {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else math.inf}[op]


def _ieee_divide_by_zero(a: float, b: float) -> float:
    """`a / ±0` as IEEE 754 defines it (Python raises instead): ±inf by the signs, NaN for 0 / 0."""
    if a == 0 or math.isnan(a):
        return math.nan
    return math.copysign(math.inf, a) * math.copysign(1.0, b)


def lower(instance: Instance) -> ir.Program:
    """Lower one instantiated model to the backend-neutral program every emitter reads."""
    return Lowerer(instance).lower()


def _is_symbol(value: DimExpr) -> bool:
    """`B`, as opposed to `B * C`, `2 * B` or `B + 1`."""
    return (len(value.terms) == 1 and value.terms[0][1] == 1 and len(value.terms[0][0]) == 1
            and value.terms[0][0][0][1] == 1 and isinstance(value.terms[0][0][0][0], Sym))
