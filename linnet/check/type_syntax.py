"""Type syntax -> types: tensor types, dims, dtypes, shapes and `where` clauses as written.

Every function here reads only the syntax and the generics in scope (`scope`: name ->
`GenericInfo`), so declarations, signatures and bodies share them.
"""
from __future__ import annotations

import difflib
import math

from ..front import ast
from .. import codes
from ..diagnostics import Note
from ..dims import DimError, DimExpr, const, floordiv, mod, sym
from ..types import (ALL_DTYPES, DIM_KIND, DTYPE_KINDS, MEMBER_KINDS, REAL_KIND, SHAPE_KIND, DTypeVar, Member, MemberVar, RealVar, OptionT, TensorT, Type, Variadic,
                     dtype_kind_ok, scalar)
from .core import fail, suggest
from .program import BroadcastClause, WhereClause

#: What the arithmetic operators mean on dims, in type syntax and in expressions alike.
OPS_ON_DIMS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
               "/": floordiv, "%": mod}


def resolve_type(node: ast.TypeNode, scope) -> Type:
    if isinstance(node, ast.OptionTypeNode):
        return OptionT(resolve_type(node.inner, scope))
    if isinstance(node, ast.NamedTypeNode):
        return scalar(_dtype_name(node, scope))
    dims = []
    variadics = 0
    for d in node.dims:
        if isinstance(d, ast.Variadic):
            variadics += 1
            dims.append(Variadic(_variadic_generic(d, scope)))
        else:
            dims.append(resolve_dim(d, scope))
    if variadics > 1:
        fail(codes.MISUSED_SHAPE, "a tensor type may hold at most one `*Shape`", node.span)
    return TensorT(tuple(dims), _dtype_name(node.dtype, scope))


def resolve_dim(node: ast.DimNode, scope) -> DimExpr:
    if isinstance(node, ast.FloatLit):
        fail(codes.BAD_DIM_EXPRESSION, f"a dim is an integer; `{node.text}` is a number for a Real generic",
             node.span)
    if isinstance(node, ast.DimInt):
        return const(node.value)
    if isinstance(node, ast.DimName):
        g = scope.get(node.name)
        if g is None:
            fail(codes.UNKNOWN_NAME, f"unknown dim `{node.name}`", node.span,
                 *suggest(node.name, [n for n, i in scope.items() if i.kind == DIM_KIND]),
                 Note("dims are generics declared `Name: Dim`"))
        if g.kind != DIM_KIND:
            fail(codes.MISUSED_SHAPE, f"`{node.name}` is a {g.kind} generic, not a Dim", node.span)
        return sym(node.name)
    left, right = resolve_dim(node.left, scope), resolve_dim(node.right, scope)
    try:
        return OPS_ON_DIMS[node.op](left, right)
    except DimError as exc:
        fail(codes.BAD_DIM_EXPRESSION, f"invalid dim expression: {exc}", node.span)


def resolve_where(node, scope) -> WhereClause | BroadcastClause:
    if isinstance(node, ast.BroadcastConstraint):
        left, right = _shape(node.left, scope), _shape(node.right, scope)
        if sum(isinstance(d, Variadic) for d in left) > 1 or sum(isinstance(d, Variadic) for d in right) > 1:
            fail(codes.MISUSED_SHAPE, "a shape may hold at most one `*Shape`", node.span)
        return BroadcastClause(left, right, node.span)
    return WhereClause(resolve_dim(node.left, scope), node.op, resolve_dim(node.right, scope), node.span)


def resolve_dtype_arg(node, kind: str, scope, what: str):
    """A dtype passed as a generic argument (`cast<f32>`, `Linear<D, D, T>`), of generic kind `kind`."""
    if not isinstance(node, ast.DimName):
        fail(codes.BAD_DTYPE_ARGUMENT,
             f"{what} must be a dtype ({', '.join(DTYPE_KINDS[kind])}), found a dim expression",
             node.span)
    if node.name in ALL_DTYPES:
        dtype = node.name
    elif node.name in scope and scope[node.name].is_dtype:
        dtype = DTypeVar(node.name, scope[node.name].kind)
    else:
        known = scope.get(node.name)
        found = f"`{node.name}`, a {known.kind} generic" if known else f"`{node.name}`"
        dtypes = ("dtypes" if kind == "DType" else f"{kind} dtypes") + f" are {', '.join(DTYPE_KINDS[kind])}"
        fail(codes.BAD_DTYPE_ARGUMENT, f"{what} must be a dtype, found {found}", node.span,
             *((Note(f"`{node.name}` is declared here", known.span),) if known else ()), Note(dtypes))
    if not dtype_kind_ok(dtype, kind):
        fail(codes.BAD_DTYPE_ARGUMENT, f"{what} must be {kind}, found {dtype}", node.span)
    return dtype


def resolve_real_arg(node, scope, what: str):
    """A number passed to a `Real` generic: a literal (`0.1`, `0`), or a Real generic in scope."""
    if isinstance(node, (ast.FloatLit, ast.DimInt)):
        return _finite_real(node, what)
    if isinstance(node, ast.DimName) and node.name in scope and scope[node.name].kind == REAL_KIND:
        return RealVar(node.name)
    known = scope.get(node.name) if isinstance(node, ast.DimName) else None
    found = f"`{node.name}`, a {known.kind} generic" if known else "an expression"
    fail(codes.BAD_REAL_ARGUMENT, f"{what} is Real and needs a number (`0.1`) or a Real generic, found {found}",
         node.span, *((Note(f"`{node.name}` is declared here", known.span),) if known else ()))


def resolve_member_arg(node, kind: str, scope, what: str):
    """A member passed to a generic of an enum-like kind (`Activation`): one of the kind's
    member names (`silu`), or a generic of the same kind in scope."""
    members = MEMBER_KINDS[kind]
    listing = Note(f"{kind} members are {', '.join(members)}")
    if isinstance(node, ast.DimName) and node.name in scope:
        known = scope[node.name]
        if known.kind == kind:
            return MemberVar(node.name, kind)
        fail(codes.BAD_MEMBER_ARGUMENT, f"{what} is {kind} and needs one of its members, found `{node.name}`, "
             f"a {known.kind} generic", node.span, Note(f"`{node.name}` is declared here", known.span), listing)
    if isinstance(node, ast.DimName):
        if node.name in members:
            return Member(kind, node.name)
        fail(codes.UNKNOWN_MEMBER, f"{what}: `{node.name}` is not a member of {kind}", node.span,
             *member_suggestion(node.name, members), listing)
    found = "a number" if isinstance(node, (ast.FloatLit, ast.DimInt)) else "an expression"
    fail(codes.BAD_MEMBER_ARGUMENT, f"{what} is {kind} and needs one of its members by name, found {found}",
         node.span, listing)


def member_suggestion(name: str, members: tuple[str, ...]) -> tuple[Note, ...]:
    """A "did you mean" note naming the closest members (`gelu` -> `gelu_erf` or `gelu_tanh`)."""
    close = [m for m in members if m.startswith(name)] if name else []
    close = close or difflib.get_close_matches(name, members, n=2)
    return (Note(f"did you mean {' or '.join(f'`{m}`' for m in close)}?"),) if close else ()


def _finite_real(node, what: str) -> float:
    """A literal's value as a Real (a 64-bit float); one past its range (`1e999`, an integer
    of 400 digits) is an error here rather than an OverflowError or an infinity later."""
    try:
        value = float(node.value)
    except OverflowError:
        value = math.inf
    if not math.isfinite(value):
        text = node.text if isinstance(node, ast.FloatLit) else str(node.value)
        shown = text if len(text) <= 24 else f"{text[:12]}...({len(text)} characters)"
        fail(codes.DTYPE_MISMATCH, f"{what} is Real (a 64-bit float), and {shown} is outside its range",
             node.span, Note("the largest finite Real is about 1.8e308"))
    return value


def _shape(items: list, scope) -> tuple:
    return tuple(Variadic(_variadic_generic(d, scope)) if isinstance(d, ast.Variadic)
                 else resolve_dim(d, scope) for d in items)


def _variadic_generic(d: ast.Variadic, scope) -> str:
    g = scope.get(d.name)
    if g is None or g.kind != SHAPE_KIND:
        fail(codes.MISUSED_SHAPE, f"`*{d.name}` needs a generic `*{d.name}: Shape`", d.span)
    return d.name


def _dtype_name(node: ast.NamedTypeNode, scope):
    if node.name in ALL_DTYPES:
        return node.name
    g = scope.get(node.name)
    if g is not None and g.is_dtype:
        return DTypeVar(g.name, g.kind)
    if node.name == "Tensor":
        fail(codes.UNKNOWN_DTYPE, "`Tensor` needs dims and a dtype: Tensor[B, S; f32]", node.span)
    fail(codes.UNKNOWN_DTYPE, f"unknown dtype `{node.name}`", node.span,
         *suggest(node.name, list(ALL_DTYPES) + [n for n, g in scope.items() if g.is_dtype]),
         Note(f"dtypes are {', '.join(ALL_DTYPES)}, or a generic declared `T: Float`"))
