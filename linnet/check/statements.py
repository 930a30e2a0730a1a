"""Function bodies: `let`, `var` and assignment, `return`, `static for` (with `collect`) and `if let`.

Each body gets its own `BodyContext`. Errors are collected per statement: a failed
statement gives what it binds an error type, which silences follow-on errors, and checking
goes on with the next statement.
"""
from __future__ import annotations

from ..front import ast
from .. import codes
from ..diagnostics import Diagnostic, Note, Span
from ..dims import DimExpr, const, sym
from ..types import DimT, ErrorT, NoneT, OptionT, SomeT, SubArrayT, SubT, TensorT, TupleT, Type
from .core import BodyContext, Checker, Failure, Local, fail, silent
from .expressions import check_expr, check_name
from .obligations import broadcasts_of, expect_same, mismatch
from .program import FnSig, NameInfo
from .type_syntax import resolve_type


def check_body(checker: Checker, fn: FnSig) -> None:
    block_clauses = fn.block.where if fn.block else []
    ctx = BodyContext(checker, fn, fn.facts, broadcasts_of(block_clauses + fn.where), [{}])
    for name, t, span in fn.params:
        ctx.bind(name, Local(t, False, span, "param"))
    returned = _check_stmts(fn.node.body, ctx)
    if not returned and not any(d.span and d.span.file == fn.node.span.file and
                                _inside(d.span, fn.node.span) for d in checker.errors):
        checker.errors.append(Diagnostic(codes.MISSING_RETURN, f"function `{fn.name}` does not end with `return`",
                                         fn.node.name_span,
                                         (Note(f"it must return {fn.result}", fn.node.result.span),)))


def _check_stmts(stmts: list[ast.Stmt], ctx: BodyContext) -> bool:
    """Check a statement list; True when it always returns."""
    for i, stmt in enumerate(stmts):
        try:
            returned = _STATEMENT_CHECKS[type(stmt)](stmt, ctx)
        except Failure as failure:
            ctx.checker.record(failure)
            _poison(stmt, ctx)
            returned = isinstance(stmt, ast.Return)
        if returned:
            if i + 1 < len(stmts):
                ctx.checker.errors.append(Diagnostic(codes.UNREACHABLE_STATEMENT,
                                                     "unreachable statement after `return`",
                                                     stmts[i + 1].span))
            return True
    return False


def _poison(stmt: ast.Stmt, ctx: BodyContext) -> None:
    """Bind what a failed statement would have bound to the error type."""
    if isinstance(stmt, ast.Let):
        ctx.bind(stmt.name, Local(ErrorT(), stmt.mutable, stmt.name_span))
    elif isinstance(stmt, ast.Destructure):
        for name, span in zip(stmt.names, stmt.name_spans):
            ctx.bind(name, Local(ErrorT(), False, span))
    elif isinstance(stmt, ast.StaticFor) and stmt.collect is not None:
        ctx.bind(stmt.collect.into, Local(ErrorT(), False, stmt.collect.into_span))


def _check_let(stmt: ast.Let, ctx: BodyContext) -> bool:
    if ctx.lookup(stmt.name) is not None and stmt.name in ctx.locals[-1]:
        fail(codes.DUPLICATE_NAME, f"`{stmt.name}` is already bound in this scope", stmt.name_span,
             Note("first bound here", ctx.lookup(stmt.name).span))
    t = check_expr(stmt.value, ctx)
    if stmt.annotation is not None:
        declared = resolve_type(stmt.annotation, ctx.sig.scope)
        expect_same(declared, t, ctx.facts, stmt.value.span, f"the annotation of `{stmt.name}`",
                    stmt.annotation.span)
        t = declared
    if isinstance(t, (SubT, SubArrayT, NoneT, SomeT)):
        # Options exist only as parameters, decided per call; a local cannot hold one
        # (`if let` would then have nothing to test).
        fail(codes.BAD_LOCAL, f"`{stmt.name}` cannot hold {t}; locals hold tensors, dims and lists", stmt.value.span)
    ctx.bind(stmt.name, Local(t, stmt.mutable, stmt.name_span, "var" if stmt.mutable else "let"))
    return False


def _check_assign(stmt: ast.Assign, ctx: BodyContext) -> bool:
    local = ctx.lookup(stmt.name)
    block = ctx.sig.block
    if local is None and block is not None and (stmt.name in block.params or stmt.name in block.subs):
        what = "param" if stmt.name in block.params else "sub"
        fail(codes.ASSIGN_TO_LET, f"cannot assign to `{stmt.name}`: it is a {what} of block `{block.name}`, "
             "which functions only read", stmt.name_span,
             Note("declared here", (block.params.get(stmt.name) or block.subs[stmt.name])[1]))
    if local is None:
        fail(codes.UNKNOWN_NAME, f"cannot assign to unknown variable `{stmt.name}`", stmt.name_span,
             Note("declare it first with `var`"))
    if not local.mutable:
        # Say what the name is: a parameter or a loop variable was never a `let`.
        what = {"param": "it is a parameter of the function",
                "loop": "it is the variable of a `static for`",
                "some": "it is bound by `if let some(...)`"}.get(local.kind, "it was bound with `let`")
        fail(codes.ASSIGN_TO_LET, f"cannot assign to `{stmt.name}`: {what}", stmt.name_span,
             Note("declare it with `var` to reassign it" if local.kind == "let"
                  else "only names declared with `var` can be reassigned", local.span))
    t = check_expr(stmt.value, ctx)
    expect_same(local.type, t, ctx.facts, stmt.value.span, f"variable `{stmt.name}`", local.span)
    return False


def _check_return(stmt: ast.Return, ctx: BodyContext) -> bool:
    default_of = ctx.sig.node.default_of  # the function the resolver made of a computed default
    what = (f"the default of `{default_of[1]}` (a parameter of `{default_of[0]}`)" if default_of
            else f"the result of `{ctx.sig.name}`")
    result, decl = ctx.sig.result, ctx.sig.node.result.span
    if isinstance(stmt.value, ast.TupleLit):
        _check_returned_tuple(stmt.value, result, what, ctx)
        return True
    t = check_expr(stmt.value, ctx, several=True)
    if isinstance(result, TupleT) or isinstance(t, TupleT):
        _expect_results(result, t, stmt.value.span, what, decl)
        for expected, found in zip(result.items, t.items):
            expect_same(expected, found, ctx.facts, stmt.value.span, what, decl)
    else:
        expect_same(result, t, ctx.facts, stmt.value.span, what, decl)
    return True


def _check_returned_tuple(value: ast.TupleLit, result: Type, what: str, ctx: BodyContext) -> None:
    """`return (a, b)`: as many values as the declared results, each of its result's type."""
    found = TupleT(tuple(check_expr(item, ctx) for item in value.items), (None,) * len(value.items))
    decl = ctx.sig.node.result.span
    _expect_results(result, found, value.span, what, decl)
    for i, (item, expected, t) in enumerate(zip(value.items, result.items, found.items)):
        name = result.names[i]
        expect_same(expected, t, ctx.facts, item.span, f"result {i + 1}{f' (`{name}`)' if name else ''} of "
                    f"{what.removeprefix('the result of ')}", decl)
    ctx.checker.types[id(value)] = result


def _expect_results(expected: Type, found: Type, span: Span, what: str, decl: Span) -> None:
    """Several values where several are declared, and as many; a failure names both counts."""
    if isinstance(expected, ErrorT) or isinstance(found, ErrorT):
        silent()  # reported where it failed
    if not isinstance(expected, TupleT):
        fail(codes.TUPLE_MISUSE, f"{what} is one value, {expected}; found {len(found.items)} values, {found}",
             span, Note("declared here", decl))
    if not isinstance(found, TupleT):
        fail(codes.TUPLE_MISUSE, f"{what} is {len(expected.items)} values, {expected}; found one, {found}",
             span, Note("declared here", decl), Note("return several with `return (a, b)`"))
    if len(expected.items) != len(found.items):
        fail(codes.TUPLE_ARITY, f"{what} is {len(expected.items)} values, {expected}; found "
             f"{len(found.items)}", span, Note("declared here", decl))


def _check_destructure(stmt: ast.Destructure, ctx: BodyContext) -> bool:
    """`let (a, b) = f(x)`: one `let` per result of a call that returns several."""
    for i, (name, span) in enumerate(zip(stmt.names, stmt.name_spans)):
        earlier = stmt.name_spans[stmt.names.index(name)]
        if stmt.names.index(name) < i:
            fail(codes.DUPLICATE_NAME, f"`{name}` is bound twice by this `let`", span, Note("first here", earlier))
        if name in ctx.locals[-1]:
            fail(codes.DUPLICATE_NAME, f"`{name}` is already bound in this scope", span,
                 Note("first bound here", ctx.lookup(name).span))
    t = check_expr(stmt.value, ctx, several=True)
    if isinstance(t, ErrorT):
        silent()
    if not isinstance(t, TupleT):
        fail(codes.TUPLE_MISUSE, f"`let ({', '.join(stmt.names)})` takes the results of a call that returns "
             f"several; this is one value, {t}", stmt.value.span, Note("bind one value with `let name = ...`"))
    if len(t.items) != len(stmt.names):
        fail(codes.TUPLE_ARITY, f"this call returns {len(t.items)} results, {t}; the `let` names "
             f"{len(stmt.names)}", stmt.span)
    for name, span, item in zip(stmt.names, stmt.name_spans, t.items):
        ctx.bind(name, Local(item, False, span, "let"))
    return False


def _check_static_for(stmt: ast.StaticFor, ctx: BodyContext) -> bool:
    collect = stmt.collect
    if collect is not None and collect.into in ctx.locals[-1]:
        fail(codes.DUPLICATE_NAME, f"`{collect.into}` is already bound in this scope", collect.into_span,
             Note("first bound here", ctx.locals[-1][collect.into].span))
    block = ctx.sig.block
    member = block.subs.get(stmt.iterable) if block else None
    if member is None and block is not None and f"{block.key}#{stmt.iterable}" in ctx.checker.broken:
        silent()
    if member is None or not isinstance(member[0], SubArrayT):
        fail(codes.NOT_A_SUB_ARRAY,
             f"`static for` runs over a sub-block array of this block; `{stmt.iterable}` is not one",
             stmt.iterable_span)
    # What is collected is looked up before the body's scope opens: a var of the code
    # around the loop, whose type every pass keeps.
    collected: Type = ErrorT()
    if collect is not None:
        try:
            collected = _collected_type(stmt, ctx)
        except Failure as failure:  # reported; the body is still checked
            ctx.checker.record(failure)
    element = member[0].element
    scope = {stmt.var: Local(SubT(element.block, element.bindings, stmt.var), False, stmt.var_span or stmt.span,
                             "loop")}
    facts = ctx.facts
    if stmt.index is not None:
        scope[stmt.index] = _index_local(stmt, ctx)
        # What the body may rely on: 0 <= index < the array's length (so `cache[i + 1]` of an
        # axis `Layers + 1` is proven in bounds).
        index = sym(stmt.index)
        ctx.facts = facts.with_fact(index, ">=", const(0)).with_fact(index + const(1), "<=", member[0].count)
    ctx.locals.append(scope)
    try:
        _check_stmts(stmt.body, ctx)
    finally:
        ctx.locals.pop()
        ctx.facts = facts
    # Any `return` in the body, also one inside an `if let` that returns on one branch only,
    # and pointed at itself rather than at the whole loop.
    ret = _first_return(stmt.body)
    if ret is not None:
        ctx.checker.errors.append(Diagnostic(
            codes.RETURN_IN_STATIC_FOR, "`return` inside `static for` is not allowed", ret.span,
            (Note("the loop is unrolled over the sub-block array; return after it", stmt.iterable_span),)))
    if collect is not None:
        _bind_collection(stmt, member[0].count, collected, ctx)
    return False


def _index_local(stmt: ast.StaticFor, ctx: BodyContext) -> Local:
    """The pass number of `static for i, x in enumerate(xs)`: a dim of its own name, which must
    not be a generic of the function already (the two would be one symbol to the checker)."""
    if stmt.index == stmt.var:
        fail(codes.DUPLICATE_NAME, f"`{stmt.index}` names both the pass number and the sub-block", stmt.index_span)
    if stmt.index in ctx.sig.scope or ctx.lookup(stmt.index) is not None:
        fail(codes.DUPLICATE_NAME, f"`{stmt.index}` is already bound here; name the pass number differently",
             stmt.index_span)
    return Local(DimT(sym(stmt.index)), False, stmt.index_span, "index")


def _collected_type(stmt: ast.StaticFor, ctx: BodyContext) -> Type:
    """The type of the var that `collect x` names: a tensor `var` declared before the loop."""
    name = stmt.collect.var
    local = ctx.lookup(name.name)
    how = "`collect` takes a `var` declared before the loop, which the loop reassigns"
    if local is None and name.name == stmt.var:
        fail(codes.BAD_COLLECT, f"`collect {name.name}`: `{name.name}` is this loop's sub-block, not a value",
             name.span, Note(how))
    if local is None:
        inner = _declared_in(stmt.body, name.name)
        if inner is not None:
            fail(codes.BAD_COLLECT, f"`collect {name.name}`: `{name.name}` is declared inside the loop, so it does not "
                 "exist before the first pass", name.span, Note("declared here", inner), Note(how))
        check_name(name, ctx)  # an unknown name fails here, with a suggestion
        block = ctx.sig.block
        what = ("a param of block" if block and name.name in block.params else
                "a sub-block of block" if block and name.name in block.subs else None)
        what = f"{what} `{block.name}`" if what else "not a local variable"
        fail(codes.BAD_COLLECT, f"`collect {name.name}`: `{name.name}` is {what}", name.span, Note(how))
    if isinstance(local.type, ErrorT):
        silent()
    if not local.mutable:
        what = {"param": "a parameter of the function", "loop": "the variable of a `static for`",
                "some": "bound by `if let some(...)`"}.get(local.kind, "bound with `let`")
        fail(codes.BAD_COLLECT, f"`collect {name.name}`: `{name.name}` is {what}, so it would be the same value "
             "in every pass", name.span, Note("declared here", local.span), Note(how))
    t = local.type
    if not isinstance(t, TensorT):
        fail(codes.BAD_COLLECT, f"`collect {name.name}`: only tensors are collected, and `{name.name}` is {t}",
             name.span, Note("declared here", local.span))
    if t.weak:
        fail(codes.BAD_COLLECT, f"`collect {name.name}`: `{name.name}` is a literal scalar without a dtype of its own",
             name.span, Note("declared here", local.span),
             Note(f"give it one where it is declared, e.g. `var {name.name} = cast<f32>(...)`"))
    ctx.checker.names[id(name)] = NameInfo("local", name.name)
    ctx.checker.types[id(name)] = t
    return t


def _bind_collection(stmt: ast.StaticFor, count: DimExpr, collected: Type, ctx: BodyContext) -> None:
    """Bind `let into = ... collect x`: x before the loop and after each of `count` passes."""
    collect = stmt.collect
    t: Type = ErrorT() if isinstance(collected, ErrorT) else TensorT((count + const(1),) + collected.dims,
                                                                      collected.dtype)
    if collect.annotation is not None:
        declared = resolve_type(collect.annotation, ctx.sig.scope)
        end = collect.var.span
        header = Span(end.file, stmt.span.line, stmt.span.col, end.end_line, end.end_col)  # `let ... collect x`
        ctx.bind(collect.into, Local(declared, False, collect.into_span))
        reason = mismatch(declared, t, ctx.facts)
        if reason:
            x = collect.var.name
            fail(codes.DECLARED_TYPE,
                 f"the annotation of `{collect.into}` is {declared}, found {t}", header, Note(reason),
                 Note(f"`collect {x}` gathers `{x}` as the loop starts and after each of its {count} passes: "
                      f"{count + const(1)} values"),
                 Note("declared here", collect.annotation.span))
        return
    ctx.bind(collect.into, Local(t, False, collect.into_span))


def _check_if_some(stmt: ast.IfSome, ctx: BodyContext) -> bool:
    t = check_expr(stmt.option, ctx)
    if isinstance(t, ErrorT):
        t = OptionT(ErrorT())  # already reported; still check both branches
    if not isinstance(t, OptionT):
        fail(codes.IF_LET_NOT_OPTION,
             f"`if let some(...)` needs an Option, but `{stmt.option.name}` is {t}", stmt.option.span)
    ctx.locals.append({stmt.binding: Local(t.inner, False, stmt.binding_span or stmt.span, "some")})
    try:
        then_returns = _check_stmts(stmt.then_body, ctx)
    finally:
        ctx.locals.pop()
    ctx.locals.append({})
    try:
        else_returns = _check_stmts(stmt.else_body, ctx)
    finally:
        ctx.locals.pop()
    return then_returns and else_returns


_STATEMENT_CHECKS = {
    ast.Let: _check_let,
    ast.Destructure: _check_destructure,
    ast.Assign: _check_assign,
    ast.Return: _check_return,
    ast.StaticFor: _check_static_for,
    ast.IfSome: _check_if_some,
}


def _declared_in(stmts: list[ast.Stmt], name: str) -> Span | None:
    """Where `name` is bound by a `let`/`var` somewhere in `stmts` (nested bodies included)."""
    for stmt in stmts:
        if isinstance(stmt, ast.Let) and stmt.name == name:
            return stmt.name_span
        if isinstance(stmt, ast.Destructure) and name in stmt.names:
            return stmt.name_spans[stmt.names.index(name)]
        if isinstance(stmt, ast.StaticFor) and stmt.collect is not None and stmt.collect.into == name:
            return stmt.collect.into_span
        for inner in (getattr(stmt, "body", None), getattr(stmt, "then_body", None),
                      getattr(stmt, "else_body", None)):
            found = _declared_in(inner, name) if inner else None
            if found:
                return found
    return None


def _first_return(stmts: list[ast.Stmt]) -> ast.Return | None:
    for stmt in stmts:
        if isinstance(stmt, ast.Return):
            return stmt
        for inner in (getattr(stmt, "body", None), getattr(stmt, "then_body", None),
                      getattr(stmt, "else_body", None)):
            found = _first_return(inner) if inner else None
            if found:
                return found
    return None


def _inside(inner: Span, outer: Span) -> bool:
    return (outer.line, outer.col) <= (inner.line, inner.col) <= (outer.end_line, outer.end_col)
