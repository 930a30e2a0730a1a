"""What must be proven from the facts in scope: types that match, shapes that broadcast, `where` clauses.

The facts are the `where` clauses of the block and function being checked (`facts_of`,
`broadcasts_of`). A call proves its callee's clauses from them (`discharge`); an argument,
an assignment or a result proves its type equal to the declared one (`mismatch`); a binary
operator or a primitive broadcasts two tensors (`broadcast`), using a `broadcasts to` clause
in scope where the shapes are symbolic.
"""
from __future__ import annotations

from .. import codes
from ..diagnostics import Note, Span
from ..dims import DimError, DimExpr, Facts, FloorDiv, mod
from ..types import (DimT, ErrorT, NoneT, OptionT, SomeT, TensorT, Type, Variadic, format_binding, substitute_dims,
                     weak_fits)
from .core import BodyContext, fail
from .program import BroadcastClause, FnSig, WhereClause, shape_item


def facts_of(clauses: list) -> Facts:
    facts = Facts()
    for c in clauses:
        if isinstance(c, WhereClause):
            facts = facts.with_fact(c.left, c.op, c.right)
    return facts


def broadcasts_of(clauses: list) -> list[BroadcastClause]:
    return [c for c in clauses if isinstance(c, BroadcastClause)]


# ----------------------------------------------------------------- where clauses


def discharge(clauses: list[WhereClause], env, facts: Facts, broadcasts: list[BroadcastClause], span: Span,
              what: str) -> None:
    """Prove a callee's `where` clauses, bound by `env`, from the caller's facts and broadcasts."""
    for clause in clauses:
        if isinstance(clause, BroadcastClause):
            _discharge_broadcast(clause, env, facts, broadcasts, span, what)
            continue
        values = _describe_bindings(clause, env)
        try:
            bound = clause.substitute(env)
        except DimError as exc:  # e.g. `D % H == 0` with H bound to 0
            fail(codes.WHERE_VIOLATED, f"{what}: where clause `{clause}` has no value ({exc})", span,
                 Note(f"required here{values}", clause.span))
        verdict = facts.decide(bound.left, bound.op, bound.right)
        if verdict:
            continue
        if verdict is False:
            fail(codes.WHERE_VIOLATED, f"{what}: where clause `{clause}` is violated ({bound} is false)",
                 span, Note(f"required here{values}", clause.span))
        fail(codes.WHERE_UNPROVEN, f"{what}: cannot prove `{bound}`", span,
             Note(f"required by this where clause{values}", clause.span),
             Note("add it (or something that implies it) to the caller's `where` clauses"))


def _discharge_broadcast(clause: BroadcastClause, env, facts: Facts, broadcasts: list[BroadcastClause], span: Span,
                         what: str) -> None:
    """Prove that the bound left shape broadcasts to exactly the bound right shape."""
    left, right = substitute_dims(clause.left, env), substitute_dims(clause.right, env)
    unbound = {d.name for d in clause.left + clause.right if isinstance(d, Variadic)} - set(env)
    if unbound:  # only an absent Option argument leaves a shape unbound: nothing to broadcast
        return
    shown = f"[{', '.join(map(shape_item, left))}] broadcasts to [{', '.join(map(shape_item, right))}]"
    for known in broadcasts:  # the caller's own clause, passed on
        if same_shape(left, known.left, facts) and same_shape(right, known.right, facts):
            return
    if same_shape(left, right, facts):
        return
    note = Note(f"required by this where clause (`{clause}`)", clause.span)
    if any(isinstance(d, Variadic) for d in left + right) or len(left) > len(right):
        surely_longer = len(left) > len(right) and not any(isinstance(d, Variadic) for d in left)
        code = codes.WHERE_VIOLATED if surely_longer else codes.WHERE_UNPROVEN
        verdict = "is violated" if code == codes.WHERE_VIOLATED else "cannot be proven"
        fail(code, f"{what}: `{shown}` {verdict}", span, note,
             Note("shapes broadcast from the right: each dim of the left shape must equal the right's or be 1"))
    for x, y in zip(reversed(left), reversed(right)):
        if x.as_int() == 1 or facts.equal(x, y):
            continue
        if facts.decide(x, "==", y) is False:
            fail(codes.WHERE_VIOLATED, f"{what}: `{shown}` is violated: dim {x} is neither 1 nor {y}", span, note)
        fail(codes.WHERE_UNPROVEN, f"{what}: cannot prove `{shown}`: dim {x} vs {y}", span, note,
             Note("add it (or something that implies it) to the caller's `where` clauses"))


def _describe_bindings(clause: WhereClause, env) -> str:
    names = sorted(clause.left.free_symbols() | clause.right.free_symbols())
    shown = [f"{n} = {format_binding(env[n])}" for n in names if n in env and str(env[n]) != n]
    return f" with {', '.join(shown)}" if shown else ""


# ------------------------------------------------------------------ matching types


def expect_arg(expected: Type, actual: Type, facts: Facts, span: Span, callee: FnSig, param: str) -> None:
    if isinstance(expected, OptionT):
        if isinstance(actual, NoneT):
            return
        if not isinstance(actual, SomeT):
            fail(codes.ARGUMENT_TYPE, f"argument `{param}` of `{callee.name}` is {expected}; pass some(x) or none, "
                 f"found {actual}", span)
        expected, actual = expected.inner, actual.inner
    reason = mismatch(expected, actual, facts)
    if reason:
        fail(codes.ARGUMENT_TYPE, f"argument `{param}` of `{callee.name}`: expected {expected}, found {actual}", span,
             Note(reason), Note(f"`{callee.name}` is declared as {callee.signature()}", callee.node.name_span))


def expect_same(expected: Type, actual: Type, facts: Facts, span: Span, what: str, decl_span: Span) -> None:
    if isinstance(expected, ErrorT) or isinstance(actual, ErrorT):
        return
    reason = mismatch(expected, actual, facts)
    if reason:
        fail(codes.DECLARED_TYPE, f"{what} is {expected}, found {actual}", span, Note(reason),
             Note("declared here", decl_span))


def mismatch(expected: Type, actual: Type, facts: Facts) -> str | None:
    """Why `actual` does not fit `expected`, or None when it does."""
    if isinstance(expected, ErrorT) or isinstance(actual, ErrorT):
        return None
    if isinstance(expected, TensorT) and isinstance(actual, TensorT):
        if expected.dtype != actual.dtype and not (actual.weak and weak_fits(actual.dtype, expected.dtype)):
            return f"dtype {actual.dtype} is not {expected.dtype}"
        if actual.weak and not actual.dims:
            return None if not expected.dims else f"a scalar is not {expected}"
        if len(expected.dims) != len(actual.dims):
            return f"rank {len(actual.dims)} is not {len(expected.dims)}"
        for i, (e, a) in enumerate(zip(expected.dims, actual.dims)):
            if isinstance(e, Variadic) or isinstance(a, Variadic):
                if e != a:
                    return f"axis {i}: {a} is not {e}"
            elif not facts.equal(e, a):
                reason = f"axis {i}: {a} is not {e}"
                if e.free_symbols() | a.free_symbols():
                    hints = _divisibility_hints(e, a)
                    # `Heads * (D / Heads)` is `D` exactly when Heads divides D: say so.
                    tail = f"; `where {', '.join(hints)}` would prove it" if hints else ""
                    reason += f" (no `where` clause proves {a} == {e}{tail})"
                return reason
        return None
    if isinstance(expected, DimT) and isinstance(actual, DimT):
        return None if facts.equal(expected.expr, actual.expr) else f"{actual.expr} is not {expected.expr}"
    if type(expected) is type(actual) and expected == actual:
        return None
    if isinstance(expected, TensorT) and isinstance(actual, DimT):
        return "a dim is not a tensor; use cast<T>(...)"
    return f"{actual} is not {expected}"


def same_shape(xs: tuple, ys: tuple, facts: Facts) -> bool:
    return len(xs) == len(ys) and all(
        x == y or (isinstance(x, DimExpr) and isinstance(y, DimExpr) and facts.equal(x, y)) for x, y in zip(xs, ys))


def _divisibility_hints(*exprs: DimExpr) -> list[str]:
    """`p % q == 0` for each division `p / q` inside the expressions: the clause that
    usually makes such a dim equal to the undivided one."""
    hints: list[str] = []
    for expr in exprs:
        for atom in expr.atoms():
            if isinstance(atom, FloorDiv):
                hint = f"{mod(atom.num, atom.den)} == 0"
                if hint not in hints:
                    hints.append(hint)
    return hints


# -------------------------------------------------------------------- broadcasting


def broadcast(a: TensorT, b: TensorT, span: Span, ctx: BodyContext) -> TensorT:
    """The type of an elementwise operation on `a` and `b`: joined dtype, broadcast dims."""
    dtype = _join_dtypes(a, b, span)
    dims = _broadcast_dims(a, b, span, ctx)
    return TensorT(dims, dtype, a.weak and b.weak)


def _join_dtypes(a: TensorT, b: TensorT, span: Span):
    if a.dtype == b.dtype:
        return a.dtype
    if a.weak and weak_fits(a.dtype, b.dtype):
        return b.dtype
    if b.weak and weak_fits(b.dtype, a.dtype):
        return a.dtype
    fail(codes.DTYPE_MISMATCH, f"dtype mismatch: {a} and {b}", span, Note("convert one side with cast<T>(...)"))


def _broadcast_dims(a: TensorT, b: TensorT, span: Span, ctx: BodyContext) -> tuple:
    facts = ctx.facts
    for clause in ctx.broadcasts:  # `where [*M] broadcasts to [...]` in scope
        if same_shape(a.dims, clause.left, facts) and same_shape(b.dims, clause.right, facts):
            return b.dims
        if same_shape(b.dims, clause.left, facts) and same_shape(a.dims, clause.right, facts):
            return a.dims
    xs, ys = list(a.dims), list(b.dims)
    out = []
    while xs and ys:
        x, y = xs[-1], ys[-1]
        if isinstance(x, Variadic) or isinstance(y, Variadic):
            if x == y and same_shape(tuple(xs), tuple(ys), facts):
                return tuple(xs) + tuple(reversed(out))
            fail(codes.SHAPE_MISMATCH, f"cannot broadcast {a} with {b}: `{x}` and `{y}` have no known alignment", span)
        out.append(_broadcast_dim(x, y, a, b, span, facts))
        xs.pop(), ys.pop()
    return tuple(xs or ys) + tuple(reversed(out))


def _broadcast_dim(x: DimExpr, y: DimExpr, a, b, span, facts: Facts) -> DimExpr:
    if facts.equal(x, y):
        return x
    if x.as_int() == 1:
        return y
    if y.as_int() == 1:
        return x
    fail(codes.SHAPE_MISMATCH, f"shape mismatch: cannot broadcast {a} with {b} (dim {x} vs {y})", span,
         Note("shapes broadcast from the right; each pair of dims must be equal or 1"))
