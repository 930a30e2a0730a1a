"""Expressions: literals, names, operators, indexing and calls, each typed in its body's context.

`check_expr` dispatches on the syntax node and records the type it finds in
`checker.types`; names and calls also record what they resolved to (`checker.names`,
`checker.calls`), so later stages substitute rather than resolve again.
"""
from __future__ import annotations

from ..front import ast
from .. import codes
from ..diagnostics import Note, Span
from ..dims import DimError, DimExpr, const, sym
from ..prims import PRIMS, PrimCall
from ..types import (DIM_KIND, DTYPE_KINDS, MEMBER_KINDS, REAL_KIND, MemberT, WEAK_INT, DimT, ErrorT, ListT, NoneT, SomeT, SubArrayT, SubT, TensorT,
                     TupleT, Type, format_binding, scalar, substitute)
from .core import BodyContext, fail, item_key, silent, suggest
from .inference import bind_explicit, fill_defaults, infer
from .obligations import broadcast, discharge, expect_arg
from .program import CallInfo, FnSig, NameInfo
from .type_syntax import OPS_ON_DIMS, resolve_dtype_arg


def check_expr(node: ast.Expr, ctx: BodyContext, several: bool = False) -> Type:
    """The type of `node`.  Only `return` and `let (a, b) =` pass `several`: elsewhere a call
    that returns several results is refused, as one value is expected there."""
    t = _EXPRESSION_CHECKS[type(node)](node, ctx)
    if isinstance(t, TupleT) and not several:
        fail(codes.TUPLE_MISUSE, f"this call returns several results, {t}, where one value is expected",
             node.span, Note(f"bind them first: `let ({', '.join(_result_names(t))}) = ...`"))
    if isinstance(t, TensorT) and t.rank is not None:
        _refuse_pass_dependent_shape(node, t, ctx)
    ctx.checker.types[id(node)] = t
    return t


def _refuse_pass_dependent_shape(node: ast.Expr, t: TensorT, ctx: BodyContext) -> None:
    """An unrolled loop's passes share one body, so a value's shape may not change from one
    pass to the next: `rows[i:]` has Layers - i rows, a different type in each pass."""
    for dim in t.dims:
        if isinstance(dim, DimExpr) and _pass_numbers(dim, ctx):
            fail(codes.SHAPE_FROM_PASS_NUMBER, f"this value's shape {t} depends on the pass number, which every "
                 "pass of a `static for` must agree on", node.span, _pass_note(dim, ctx),
                 Note("index with the pass number, or slice a fixed length: `x[i:i + 1]`"))


def _result_names(t: TupleT) -> list[str]:
    return [n or f"r{i}" for i, n in enumerate(t.names)]


def _check_tuple_lit(node: ast.TupleLit, ctx: BodyContext) -> Type:
    # `return` checks its own tuple literal; anywhere else one is a mistake.
    fail(codes.TUPLE_MISUSE, f"a tuple of {len(node.items)} values is only a `return`'s value", node.span,
         Note("a function returns several results with `-> (A, B)` and `return (a, b)`"))


def _check_int_lit(node: ast.IntLit, ctx: BodyContext) -> Type:
    return DimT(const(node.value))


def _check_float_lit(node: ast.FloatLit, ctx: BodyContext) -> Type:
    return scalar("f32", weak=True)


def _check_none_lit(node: ast.NoneLit, ctx: BodyContext) -> Type:
    return NoneT()


def _check_list_lit(node: ast.ListLit, ctx: BodyContext) -> Type:
    items = []
    for item in node.items:
        t = check_expr(item, ctx)
        if isinstance(t, ErrorT):
            return t
        if not isinstance(t, DimT):
            fail(codes.BAD_LIST_ITEM,
                 f"list literals hold integers and dims (shapes, permutations); found {t}", item.span)
        items.append(t.expr)
    return ListT(tuple(items))


def check_name(node: ast.Name, ctx: BodyContext) -> Type:
    """A name: a local, a member of the block, a dim generic or a constant (statements use it
    too, to report an unknown `collect` name as an unknown name)."""
    checker = ctx.checker
    local = ctx.lookup(node.name)
    if local is not None:
        # A `static for` pass number is a dim, lowered as the number of the pass.
        checker.names[id(node)] = NameInfo("index" if local.kind == "index" else "local", node.name)
        return local.type
    block = ctx.sig.block
    if block is not None and node.name in block.params:
        checker.names[id(node)] = NameInfo("param", node.name)
        return block.params[node.name][0]
    if block is not None and node.name in block.subs:
        return block.subs[node.name][0]
    if block is not None and f"{block.key}#{node.name}" in checker.broken:
        return ErrorT()  # a member whose declaration failed
    generic = ctx.sig.scope.get(node.name)
    if generic is not None and generic.kind == REAL_KIND:
        # A number fixed when the model is built: a weak scalar like a float constant.
        checker.names[id(node)] = NameInfo("real", node.name)
        return scalar("f32", weak=True)
    if generic is not None and generic.kind in MEMBER_KINDS:
        # A member fixed when the model is built (`activation(x, Act)`): its own type, no tensor.
        checker.names[id(node)] = NameInfo("member", node.name)
        return MemberT(generic.kind)
    if generic is not None:
        if generic.kind != DIM_KIND:
            fail(codes.NOT_A_VALUE, f"`{node.name}` is a {generic.kind} generic, not a value", node.span)
        checker.names[id(node)] = NameInfo("dim", node.name)
        return DimT(sym(node.name))
    item = ctx.sig.module.scope.get(node.name)
    if item is not None and isinstance(item[1], ast.Const):
        key = item_key(item[0], node.name)
        if key not in checker.consts:
            return ErrorT()
        value, dtype = checker.consts[key]
        checker.names[id(node)] = NameInfo("const", key)
        return DimT(const(int(value))) if dtype in DTYPE_KINDS["Int"] else scalar(dtype, weak=True)
    if item is not None:
        # A function or block is in scope but is not a value: say so, rather than calling
        # the name unknown (and then suggesting the very same name).
        kind = "function" if isinstance(item[1], ast.Function) else "block"
        how = f"call it: `{node.name}(...)`" if kind == "function" else \
            f"declare it with `sub name: {node.name}<...>` and call its functions"
        fail(codes.NOT_A_VALUE, f"`{node.name}` is a {kind}, not a value; {how}", node.span,
             Note(f"`{node.name}` is declared here", item[1].name_span))
    fail(codes.UNKNOWN_NAME, f"unknown name `{node.name}`", node.span, *suggest(node.name, _visible(ctx)))


def _visible(ctx: BodyContext) -> list[str]:
    names = [n for scope in ctx.locals for n in scope] + list(ctx.sig.scope) + list(ctx.sig.module.scope)
    if ctx.sig.block:
        names += list(ctx.sig.block.params) + list(ctx.sig.block.subs)
    return names


def _check_unary(node: ast.Unary, ctx: BodyContext) -> Type:
    t = check_expr(node.operand, ctx)
    if isinstance(t, DimT):
        return DimT(const(0) - t.expr)
    if isinstance(t, (TensorT, ErrorT)):
        return t
    fail(codes.BAD_OPERAND, f"cannot negate {t}", node.span)


def _check_binary(node: ast.Binary, ctx: BodyContext) -> Type:
    left, right = check_expr(node.left, ctx), check_expr(node.right, ctx)
    if isinstance(left, ErrorT) or isinstance(right, ErrorT):
        return ErrorT()
    if isinstance(left, DimT) and isinstance(right, DimT):
        try:
            return DimT(OPS_ON_DIMS[node.op](left.expr, right.expr))
        except DimError as exc:
            fail(codes.BAD_DIM_EXPRESSION, f"invalid dim arithmetic: {exc}", node.span)
    if node.op == "%":
        fail(codes.BAD_OPERAND, "`%` applies to dims only", node.span)
    a = _as_tensor(left, node.left.span, node.op)
    b = _as_tensor(right, node.right.span, node.op)
    return broadcast(a, b, node.span, ctx)


def _as_tensor(t: Type, span: Span, op: str) -> TensorT:
    if isinstance(t, TensorT):
        return t
    if isinstance(t, DimT) and t.expr.as_int() is not None:
        return scalar(WEAK_INT, weak=True)  # an integer literal: takes the other side's dtype
    if isinstance(t, DimT):
        fail(codes.DIM_AS_TENSOR,
             f"the dim `{t.expr}` is not a tensor; use cast<T>({t.expr}) to use it in `{op}`", span)
    fail(codes.BAD_OPERAND, f"`{op}` needs tensors, found {t}", span)


# ---------------------------------------------------------------------- indexing


def _check_index(node: ast.Index, ctx: BodyContext) -> Type:
    target = check_expr(node.target, ctx)
    if isinstance(target, ErrorT):
        return target
    if not isinstance(target, TensorT) or target.rank is None:
        fail(codes.BAD_INDEX, f"only tensors of known rank can be indexed, found {target}", node.target.span)
    if len(node.items) > target.rank:
        fail(codes.BAD_INDEX, f"{len(node.items)} indices for {target}, which has rank {target.rank}", node.span)
    dims = []
    for item, dim in zip(node.items, target.dims):
        if isinstance(item, ast.Slice):
            dims.append(_slice_dim(item, dim, ctx))
        else:
            _check_index_value(item, dim, ctx)
    dims.extend(target.dims[len(node.items):])
    return TensorT(tuple(dims), target.dtype)


def _static_dim(node: ast.Expr, ctx: BodyContext) -> DimExpr:
    t = check_expr(node, ctx)
    if not isinstance(t, DimT):
        fail(codes.BAD_INDEX, f"indices and slice bounds are integers or dims, found {t}", node.span)
    return t.expr


def _check_index_value(node: ast.Expr, dim: DimExpr, ctx: BodyContext) -> None:
    index = _static_dim(node, ctx)
    value = index.as_int()
    bound = index + dim if value is not None and value < 0 else index
    if ctx.facts.decide(bound, "<", dim) is False or ctx.facts.decide(bound, ">=", const(0)) is False:
        fail(codes.INDEX_OUT_OF_BOUNDS, f"index {index} is out of bounds for a dim of size {dim}", node.span)
    if _pass_numbers(index, ctx) and not (ctx.facts.decide(bound, "<", dim) and ctx.facts.decide(bound, ">=", const(0))):
        fail(codes.INDEX_OUT_OF_BOUNDS, f"index {index} is not proven in bounds for a dim of size {dim} in every pass",
             node.span, _pass_note(index, ctx))


def _pass_numbers(expr: DimExpr, ctx: BodyContext) -> list[str]:
    """The `static for` pass numbers `expr` mentions. An index or slice that depends on one must
    be proven in bounds, not merely not disproven: the unrolled loop runs every value."""
    return sorted(n for n in expr.free_symbols() if (local := ctx.lookup(n)) is not None and local.kind == "index")


def _pass_note(expr: DimExpr, ctx: BodyContext) -> Note:
    names = _pass_numbers(expr, ctx)
    return Note(f"{', '.join(f'`{n}`' for n in names)} runs from 0 to the loop's length - 1", ctx.lookup(names[0]).span)


def _slice_dim(node: ast.Slice, dim: DimExpr, ctx: BodyContext) -> DimExpr:
    start = _static_dim(node.start, ctx) if node.start is not None else const(0)
    stop = _static_dim(node.stop, ctx) if node.stop is not None else dim
    # A negative literal bound counts from the end, as in indexing: `x[-2:]`, `x[:-1]`.
    # (Without this, `x[-2:]` of a dim 4 had size 6 and `x[:-1]` was rejected.)
    lo = start + dim if (start.as_int() or 0) < 0 else start
    hi = stop + dim if (stop.as_int() or 0) < 0 else stop
    unproven = bool(_pass_numbers(lo, ctx) or _pass_numbers(hi, ctx)) and not (
        ctx.facts.decide(lo, ">=", const(0)) and ctx.facts.decide(hi, "<=", dim) and ctx.facts.decide(lo, "<=", hi))
    if (ctx.facts.decide(lo, "<", const(0)) or ctx.facts.decide(hi, ">", dim)
            or ctx.facts.decide(lo, ">", hi) or unproven):
        written = f"{start if node.start is not None else ''}:{stop if node.stop is not None else ''}"
        fail(codes.INDEX_OUT_OF_BOUNDS, f"slice {written} does not fit a dim of size {dim}", node.span,
             Note(f"a slice a:b needs 0 <= a <= b <= {dim} (negative bounds count from the end)"))
    return hi - lo


# ------------------------------------------------------------------------- calls


def _check_call(node: ast.Call, ctx: BodyContext) -> Type:
    checker = ctx.checker
    if node.name == "some":
        if len(node.args) != 1 or node.generic_args:
            fail(codes.ARGUMENT_COUNT, "`some` takes exactly one value", node.span)
        inner = check_expr(node.args[0], ctx)
        return inner if isinstance(inner, ErrorT) else SomeT(inner)
    block = ctx.sig.block
    if block is not None and f"{block.key}.{node.name}" in checker.broken:
        silent()  # a sibling whose declaration failed
    if block is not None and node.name in block.functions:
        callee = block.functions[node.name]
        env = {g.name: g.symbol() for g in block.generics}
        return _call_fn(node, callee, env, ctx, CallInfo("self", callee.key, ()))
    item = ctx.sig.module.scope.get(node.name)
    if item is not None and isinstance(item[1], ast.Function):
        callee = checker.functions.get(item_key(item[0], node.name))
        if callee is None:
            return ErrorT()
        return _call_fn(node, callee, {}, ctx, CallInfo("fn", callee.key, ()))
    if item is not None and isinstance(item[1], ast.Block):
        fail(codes.NOT_A_BLOCK, f"`{node.name}` is a block: declare it with `sub name: {node.name}<...>` and call "
             "its functions", node.name_span, Note(f"`{node.name}` is declared here", item[1].name_span))
    if node.name in PRIMS:
        return _call_prim(node, ctx)
    candidates = list(PRIMS) + [n for n, (_, i) in ctx.sig.module.scope.items() if isinstance(i, ast.Function)]
    if block is not None:
        candidates += list(block.functions)
    fail(codes.UNKNOWN_FUNCTION, f"unknown function `{node.name}`", node.name_span, *suggest(node.name, candidates))


def _check_method_call(node: ast.MethodCall, ctx: BodyContext) -> Type:
    receiver = check_expr(node.receiver, ctx)
    if isinstance(receiver, ErrorT):
        return receiver
    if isinstance(receiver, SubArrayT):
        fail(codes.NOT_A_SUB_ARRAY, f"`{node.receiver.name}` is an array of sub-blocks; run over it with "
             f"`static for x in {node.receiver.name} {{ ... }}`", node.receiver.span)
    if not isinstance(receiver, SubT):
        fail(codes.NOT_A_SUB_BLOCK, f"`{node.receiver.name}` is {receiver}, not a sub-block with functions",
             node.receiver.span)
    target = ctx.checker.blocks[receiver.block]
    callee = target.functions.get(node.method)
    if callee is None and f"{target.key}.{node.method}" in ctx.checker.broken:
        silent()
    if callee is None:
        fail(codes.UNKNOWN_FUNCTION, f"block `{target.name}` has no function `{node.method}`", node.name_span,
             *(suggest(node.method, list(target.functions)) or
               (Note(f"`{target.name}` has: {', '.join(target.functions) or 'no functions'}",
                     target.node.name_span),)))
    if not callee.node.public and target.module is not ctx.sig.module:
        fail(codes.PRIVATE_ITEM, f"`{target.name}.{node.method}` is private to module `{target.module.name}`",
             node.name_span, Note("declared here without `pub`", callee.node.name_span))
    info = CallInfo("sub", callee.key, (), receiver.path)
    return _call_fn(node, callee, dict(receiver.bindings), ctx, info)


def _call_fn(node, callee: FnSig, env: dict, ctx: BodyContext, info: CallInfo) -> Type:
    """A call of a Linnet function: bind its generics, match its arguments, prove its `where`."""
    if not callee.checked:  # its signature failed (reported): check the arguments only
        for arg in node.args:
            check_expr(arg, ctx)
        return ErrorT()
    generic_args = getattr(node, "generic_args", [])
    env = dict(env)
    env.update(bind_explicit(callee.generics, generic_args, ctx.sig.scope, node.span,
                             f"`{callee.name}`", callee.node.name_span))
    if len(node.args) != len(callee.params):
        fail(codes.ARGUMENT_COUNT, f"`{callee.name}` takes {len(callee.params)} argument"
             f"{'s' if len(callee.params) != 1 else ''}, found {len(node.args)}", node.span,
             Note(f"declared as {callee.signature()}", callee.node.name_span))
    arg_types = [check_expr(a, ctx) for a in node.args]
    if any(isinstance(t, ErrorT) for t in arg_types):
        return ErrorT()
    infer(callee, env, arg_types, node.args)
    fill_defaults(callee, env, node, arg_types)
    try:
        for (name, param_t, _), arg_t, arg in zip(callee.params, arg_types, node.args):
            expect_arg(substitute(param_t, env), arg_t, ctx.facts, arg.span, callee, name)
        discharge(callee.where, env, ctx.facts, ctx.broadcasts, node.span, f"calling `{callee.name}`")
        result = substitute(callee.result, env)
    except DimError as exc:  # the bindings make a dim of the signature divide by 0
        fail(codes.BAD_DIM_EXPRESSION, f"calling `{callee.name}`: invalid dim arithmetic ({exc})", node.span,
             Note(f"with {', '.join(f'{k} = {format_binding(v)}' for k, v in env.items())}"),
             Note(f"`{callee.name}` is declared as {callee.signature()}", callee.node.name_span))
    ctx.checker.call_edges.setdefault(ctx.sig.key, []).append((callee.key, node.span))
    ctx.checker.calls[id(node)] = CallInfo(info.kind, info.target, tuple(env.items()), info.receiver)
    return result


def _call_prim(node: ast.Call, ctx: BodyContext) -> Type:
    prim = PRIMS[node.name]
    if len(node.generic_args) != prim.dtype_generics:
        n = prim.dtype_generics
        fail(codes.GENERIC_ARGUMENT_COUNT, f"`{prim.name}` takes {n} generic argument{'s' if n != 1 else ''}, "
             f"found {len(node.generic_args)}", node.span, Note(f"signature: {prim.signature}"))
    dtypes = [resolve_dtype_arg(a, "DType", ctx.sig.scope, f"generic argument of `{prim.name}`")
              for a in node.generic_args]
    if len(node.args) not in prim.arity:
        plural = "" if prim.arity == (1,) else "s"
        fail(codes.ARGUMENT_COUNT, f"`{prim.name}` takes {' or '.join(map(str, prim.arity))} argument{plural}, "
             f"found {len(node.args)}", node.span, Note(f"signature: {prim.signature}"))
    arg_types = [check_expr(a, ctx) for a in node.args]
    if any(isinstance(t, ErrorT) for t in arg_types):
        return ErrorT()
    call = PrimCall(prim.name, dtypes, arg_types, [a.span for a in node.args], node.span, _PrimContext(ctx))
    result = prim.rule(call)
    ctx.checker.calls[id(node)] = CallInfo("prim", prim.name, tuple((f"#{i}", d) for i, d in enumerate(dtypes)))
    return result


class _PrimContext:
    """What a primitive's rule may ask of the body it is called in (`prims.PrimContext`)."""

    def __init__(self, ctx: BodyContext):
        self.ctx = ctx

    def fail(self, code, message, span, *notes):
        fail(code, message, span, *notes)

    def broadcast(self, a, b, span):
        return broadcast(a, b, span, self.ctx)

    def dims_equal(self, a, b):
        return self.ctx.facts.equal(a, b)

    def decide(self, a, op, b):
        return self.ctx.facts.decide(a, op, b)

    def same_numel(self, a, b):
        return self.ctx.facts.equal(_numel(a), _numel(b))


def _numel(dims) -> DimExpr:
    total = const(1)
    for d in dims:
        total = total * d
    return total


_EXPRESSION_CHECKS = {
    ast.TupleLit: _check_tuple_lit,
    ast.IntLit: _check_int_lit,
    ast.FloatLit: _check_float_lit,
    ast.NoneLit: _check_none_lit,
    ast.ListLit: _check_list_lit,
    ast.Name: check_name,
    ast.Unary: _check_unary,
    ast.Binary: _check_binary,
    ast.Index: _check_index,
    ast.Call: _check_call,
    ast.MethodCall: _check_method_call,
}
