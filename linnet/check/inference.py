"""Generic binding: the callee's generics bound from explicit arguments, argument types or defaults.

A call binds its callee's generics in three steps: the explicit `<...>` arguments
(`bind_explicit`), then unification of the parameter types with the argument types
(`infer`), then the generics' defaults (`fill_defaults`). What is still unbound is an error,
except a generic only an absent Option argument (`none`) mentions.
"""
from __future__ import annotations

from .. import codes
from ..diagnostics import Note, Span
from ..dims import DimExpr, sym
from ..types import (DIM_KIND, DTYPE_KINDS, MEMBER_KINDS, REAL_KIND, SHAPE_KIND, Binding, DTypeVar, NoneT, OptionT, SomeT, TensorT, Type,
                     Variadic, dtype_kind_ok)
from .core import fail
from .program import FnSig, GenericInfo
from .type_syntax import resolve_dim, resolve_dtype_arg, resolve_member_arg, resolve_real_arg


def bind_explicit(generics: list[GenericInfo], args: list, scope, span: Span, what: str,
                  decl: Span | None = None) -> dict:
    """Bind `generics` to the explicit arguments written at a call or a sub's type."""
    if len(args) > len(generics):
        n = len(generics)
        # Only the extra arguments are wrong; `decl` points at the declaration for the list.
        shown = ", ".join(("*" if g.kind == SHAPE_KIND else "") + g.name for g in generics)
        fail(codes.GENERIC_ARGUMENT_COUNT,
             f"{what} takes {n} generic argument{'s' if n != 1 else ''}, found {len(args)}", span,
             *((Note(f"declared with <{shown}>" if generics else "declared without generics", decl),)
               if decl else ()))
    env: dict[str, Binding] = {}
    for g, arg in zip(generics, args):
        if g.is_dtype:
            env[g.name] = resolve_dtype_arg(arg, g.kind, scope, f"generic `{g.name}` of {what}")
        elif g.kind == DIM_KIND:
            env[g.name] = resolve_dim(arg, scope)
        elif g.kind == REAL_KIND:
            env[g.name] = resolve_real_arg(arg, scope, f"generic `{g.name}` of {what}")
        elif g.kind in MEMBER_KINDS:
            env[g.name] = resolve_member_arg(arg, g.kind, scope, f"generic `{g.name}` of {what}")
        else:
            fail(codes.GENERIC_ARGUMENT_COUNT,
                 f"the Shape generic `*{g.name}` of {what} is inferred, not passed", arg.span)
    return env


def infer(callee: FnSig, env: dict, arg_types, arg_nodes) -> None:
    """Bind the callee's remaining generics from the argument types."""
    own = {g.name: g for g in callee.generics}
    # Weak scalars say little about dtypes, so let the real tensors bind first.
    order = sorted(range(len(arg_types)), key=lambda i: getattr(arg_types[i], "weak", False))
    for i in order:
        _unify(callee.params[i][1], arg_types[i], own, env, arg_nodes[i].span, callee)


def fill_defaults(callee: FnSig, env: dict, node, arg_types=()) -> None:
    """Bind what is still unbound to its default; fail for a generic nothing tells."""
    absent_only = _generics_of_absent_options(callee, arg_types)
    for g in callee.generics:
        if g.name in env or (g.default is None and g.name in absent_only):
            continue  # only an Option passed `none` mentions it: there is nothing to infer from
        if g.default is None:
            fail(codes.UNINFERRED_GENERIC, f"cannot infer generic `{g.name}` of `{callee.name}`; pass it explicitly, "
                 f"e.g. {callee.name}<{', '.join(x.name for x in callee.generics)}>(...)", node.span,
                 Note(f"`{g.name}` is declared here", g.span))
        env[g.name] = g.default


def symbol_name(e: DimExpr) -> str | None:
    """The name when a dim is a bare generic (`S`), else None (`S + 1`, `D / Heads`, `3`)."""
    free = e.free_symbols()
    if len(free) != 1:
        return None
    name = next(iter(free))
    return name if e == sym(name) else None


def _unify(pattern: Type, actual: Type, own, env, span, callee) -> None:
    if isinstance(pattern, OptionT):
        if isinstance(actual, SomeT):
            _unify(pattern.inner, actual.inner, own, env, span, callee)
        return
    if not isinstance(pattern, TensorT) or not isinstance(actual, TensorT):
        return
    if isinstance(pattern.dtype, DTypeVar) and pattern.dtype.name in own and pattern.dtype.name not in env:
        if not actual.weak:
            # An inferred dtype must fit the generic's kind, as an explicit one must:
            # `gelu_erf` of i32 ids would otherwise check, with T: Float bound to i32.
            g = own[pattern.dtype.name]
            if not dtype_kind_ok(actual.dtype, g.kind):
                fail(codes.DTYPE_MISMATCH, f"`{callee.name}` needs its generic `{g.name}` to be {g.kind} "
                     f"({', '.join(DTYPE_KINDS[g.kind])}), but this argument has dtype {actual.dtype}",
                     span, Note(f"`{g.name}: {g.kind}` is declared here", g.span))
            env[pattern.dtype.name] = actual.dtype
    dims = list(pattern.dims)
    variadic_at = next((i for i, d in enumerate(dims) if isinstance(d, Variadic)), None)
    if variadic_at is None:
        if len(actual.dims) != len(dims) or any(isinstance(d, Variadic) for d in actual.dims):
            return  # the rank mismatch is reported with the full types by expect_arg
        pairs = list(zip(dims, actual.dims))
    else:
        prefix, suffix = dims[:variadic_at], dims[variadic_at + 1:]
        if len(actual.dims) < len(prefix) + len(suffix):
            return
        middle = tuple(actual.dims[len(prefix):len(actual.dims) - len(suffix)])
        name = dims[variadic_at].name
        if name in own and name not in env:
            env[name] = middle
        pairs = list(zip(prefix, actual.dims[:len(prefix)])) + list(
            zip(suffix, actual.dims[len(actual.dims) - len(suffix):]))
    for p, a in pairs:
        if isinstance(p, DimExpr) and isinstance(a, DimExpr):
            name = symbol_name(p)
            if name is not None and name in own and name not in env:
                env[name] = a


def _type_generics(t) -> set[str]:
    """Names of the generics a type mentions (dims, `*Shape`s, dtype variables)."""
    if isinstance(t, OptionT):
        return _type_generics(t.inner)
    names: set[str] = set()
    if isinstance(t, TensorT):
        for d in t.dims:
            names |= {d.name} if isinstance(d, Variadic) else set(d.free_symbols())
        if isinstance(t.dtype, DTypeVar):
            names.add(t.dtype.name)
    return names


def _generics_of_absent_options(callee: FnSig, arg_types) -> set[str]:
    """Generics mentioned only by Option parameters whose argument is `none`."""
    absent, present = set(), _type_generics(callee.result)
    for (name, param_t, _), arg_t in zip(callee.params, arg_types):
        (absent if isinstance(param_t, OptionT) and isinstance(arg_t, NoneT) else present).update(
            _type_generics(param_t))
    return absent - present
