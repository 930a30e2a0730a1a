"""Checked program + concrete generics -> one model: its parameter tree and entry signatures.

The root block's generics get values (from a manifest's `[generics]` or `--set`), every
`where` clause is evaluated with them, and the sub-block tree is walked to list each
parameter with its concrete shape.  An entry's own dims (B, S) stay free: its `where`
clauses over them become preconditions, checked here for any concrete values given (the
manifest's `[check]` dims) and turned into runtime guards and export constraints later.
"""
from __future__ import annotations

import math

from dataclasses import dataclass, field

from .. import codes
from ..check import BlockSig, CheckedProgram, FnSig, WhereClause
from ..check.type_syntax import member_suggestion
from ..diagnostics import Diagnostic, LinnetError, Note, Span
from ..dims import MAX_DIM, DimError, DimExpr, const, sym
from .params import ParamSpec
from ..types import (DIM_KIND, DTYPE_KINDS, MEMBER_KINDS, REAL_KIND, Binding, Member, MemberVar, RealVar, SubArrayT, TensorT, Type, dims_only, dtype_kind_ok,
                    format_binding, substitute)


@dataclass
class BlockInstance:
    block: BlockSig
    env: dict[str, Binding]  # every generic of the block, concrete
    path: str  # "" for the root, "embeddings", "layers.3.attention"
    params: list[ParamSpec] = field(default_factory=list)
    children: dict[str, "BlockInstance | list[BlockInstance]"] = field(default_factory=dict)

    def walk(self):
        yield self
        for child in self.children.values():
            for c in child if isinstance(child, list) else [child]:
                yield from c.walk()


@dataclass(frozen=True)
class Precondition:
    """A `where` clause over an entry's free dims, with the block's generics filled in."""

    clause: WhereClause  # as written, for messages
    bound: WhereClause  # concrete except for the entry's own dims

    def __str__(self) -> str:
        return str(self.bound)


_DEFAULT_NAMES = {0: "zeros", 1: "ones"}


@dataclass
class EntrySignature:
    name: str
    fn: FnSig
    dims: list[str]  # the entry's free dims, in declaration order
    params: list[tuple[str, TensorT]]
    result: Type
    preconditions: list[Precondition]

    def __str__(self) -> str:
        params = ", ".join(f"{n}: {t}{self.default_text(n)}" for n, t in self.params)
        text = f"{self.name}<{', '.join(self.dims)}>({params}) -> {self.result}"
        if self.preconditions:
            text += " where " + ", ".join(str(p) for p in self.preconditions)
        return text

    def default_text(self, name: str) -> str:
        """` = ones`, ` = positions(attention_mask)`, or "" for an input without a default."""
        if name in self.fn.defaults:
            return f" = {_DEFAULT_NAMES[self.fn.defaults[name]]}"
        if name in self.fn.computed:
            return f" = {self.fn.computed_text[name]}"
        return ""

    def dim_sources(self) -> dict[str, tuple[str, int]]:
        """Where each free dim can be read at run time: (input name, axis)."""
        sources: dict[str, tuple[str, int]] = {}
        for name, t in self.params:
            if name in self.fn.defaults or name in self.fn.computed:
                continue  # may be left out, so it cannot be where a dim is read
            for axis, d in enumerate(t.dims):
                for dim in self.dims:
                    if dim not in sources and d == sym(dim):
                        sources[dim] = (name, axis)
        return sources


@dataclass
class Instance:
    checked: CheckedProgram
    root: BlockInstance
    entries: dict[str, EntrySignature]

    @property
    def params(self) -> list[ParamSpec]:
        return [p for inst in self.root.walk() for p in inst.params]

    @property
    def param_count(self) -> int:
        return sum(p.numel for p in self.params)

    def check_dims(self, entry: str, values: dict[str, int],
                   origins: "dict[str, ValueOrigin] | None" = None) -> list[Diagnostic]:
        """Evaluate an entry's preconditions at concrete dims; one diagnostic per failure.

        `origins` (optional) says where each value was given, for notes pointing there."""
        sig = self.entries[entry]
        problems = []
        for pre in sig.preconditions:
            verdict = _evaluate(pre.bound, values)
            if verdict is False:
                problems.append(_precondition_diagnostic(sig, pre, values, self.root.env, origins or {}))
        return problems


def _evaluate(clause: WhereClause, values: dict[str, int]) -> bool | None:
    try:
        left, right = clause.left.evaluate(values), clause.right.evaluate(values)
    except DimError:
        return None
    return _COMPARE[clause.op](left, right)


_COMPARE = {"<=": lambda a, b: a <= b, "<": lambda a, b: a < b, ">=": lambda a, b: a >= b,
            ">": lambda a, b: a > b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b}


def _values_text(clause: WhereClause, env: dict) -> str:
    names = sorted(clause.left.free_symbols() | clause.right.free_symbols())
    return ", ".join(f"{n} = {format_binding(env[n])}" for n in names if n in env)


def _precondition_diagnostic(sig: EntrySignature, pre: Precondition, values, block_env,
                             origins=None) -> Diagnostic:
    env = {**block_env, **values}
    left = pre.clause.left.substitute(dims_only(env))
    right = pre.clause.right.substitute(dims_only(env))
    names = sorted(pre.clause.left.free_symbols() | pre.clause.right.free_symbols())
    notes = _origin_notes(names, {k: v for k, v in env.items()}, origins or {})
    return Diagnostic(
        codes.CHECK_DIMS_PRECONDITION,
        f"entry `{sig.name}` cannot run with {_values_text(pre.clause, env)}: "
        f"`{pre.clause}` requires {left} {pre.clause.op} {right}",
        pre.clause.span,
        (Note(f"`{sig.name}` declares this precondition" +
              ("" if notes else "; the values come from the [check] dims or --set")), *notes),
    )


@dataclass(frozen=True)
class ValueOrigin:
    """Where the value of a root generic (or an entry dim) came from, for diagnostics.

    `span` is its line in a manifest (`D = 768` under `[generics]`); None when it was given
    on the command line, which `text` then quotes (`--set D=-1`).
    """

    text: str
    span: Span | None = None


def instantiate(checked: CheckedProgram, root: str, generics: dict[str, int | str],
                origin: Span | None = None, origins: "dict[str, ValueOrigin] | None" = None) -> Instance:
    """Bind the root block's generics and build the model; raises LinnetError on any violation.

    `origin` is where the values as a whole come from (the manifest); `origins` says, per
    name, where each value was written, so a bad value is pointed at where it was given.
    """
    origins = origins or {}
    try:
        block = checked.find_block(root)
    except KeyError:
        known = ", ".join(sorted(b.name for b in checked.blocks.values() if b.module.name in
                                 {m.name for m in checked.program.roots}))
        where = origins.get("<root>")
        raise LinnetError(Diagnostic(codes.UNKNOWN_ROOT, f"no block `{root}` in the package (blocks: {known})",
                                     where.span if where and where.span else origin),
                          checked.program.sources) from None
    env = _bind_root(block, generics, origin, checked, origins)
    errors: list[Diagnostic] = []
    # The checker proved every sub-block's clauses from its parent's, so the root's decide.
    _check_clauses(block, env, errors, origins)
    if errors:
        raise LinnetError(errors, checked.program.sources)
    # Dims the clauses do not constrain can still make a shape negative (`N - 4` with N = 2)
    # or divide by zero; those are reported here, not by a crash further on.
    root_instance = _build(block, env, "", checked, errors, origins)
    entries = {}
    for name, fn in block.functions.items():
        if fn.is_entry:
            try:
                entries[name] = _entry_signature(fn, env)
            except DimError as exc:
                errors.append(Diagnostic(codes.IMPOSSIBLE_SHAPE, f"entry `{name}` has no valid signature with "
                                         f"{_env_text(env)}: {exc}", fn.node.name_span,
                                         _origin_notes(sorted(env), env, origins)))
    if errors:
        # One report per source place: a bad sub array element would repeat for every index.
        unique: dict = {}
        for d in errors:
            unique.setdefault((d.code, d.span), d)
        ordered = sorted(unique.values(), key=lambda d: (d.span.file, d.span.line, d.span.col) if d.span
                         else ("", 0, 0))
        raise LinnetError(ordered, checked.program.sources)
    return Instance(checked, root_instance, entries)


def _env_text(env) -> str:
    return ", ".join(f"{k} = {format_binding(v)}" for k, v in env.items())


def _origin_notes(names, env, origins) -> tuple[Note, ...]:
    """One note per value that came from a known place: its manifest line or `--set`."""
    notes = []
    for n in names:
        where = origins.get(n)
        if where is None or n not in env:
            continue
        if where.span is not None:
            notes.append(Note(f"{n} = {format_binding(env[n])} is set here", where.span))
        else:
            notes.append(Note(f"{n} = {format_binding(env[n])} comes from {where.text}"))
    return tuple(notes)


def _bind_root(block: BlockSig, values: dict[str, int | str], origin, checked,
               origins: "dict[str, ValueOrigin] | None" = None) -> dict[str, Binding]:
    origins = origins or {}
    errors: list[Diagnostic] = []
    env: dict[str, Binding] = {}

    def bad_value(g, message: str, code=codes.BAD_GENERIC_VALUE, notes: tuple = ()) -> Diagnostic:
        # Point at where the value was written: its manifest line, or (for --set, which has
        # no file) the generic's declaration. Only without either fall back to the manifest.
        where = origins.get(g.name)
        if where is not None and where.span is not None:
            return Diagnostic(code, message, where.span, (Note(f"`{g.name}` is declared here", g.span), *notes))
        if where is not None:
            return Diagnostic(code, f"{message} (given by {where.text})", g.span, notes)
        return Diagnostic(code, message, origin, (Note("declared here", g.span), *notes))

    for g in block.generics:
        if g.name not in values:
            if g.default is None:
                table = origins.get("[generics]")
                errors.append(Diagnostic(codes.MISSING_GENERIC_VALUE,
                                         f"generic `{g.name}` of `{block.name}` has no value",
                                         table.span if table and table.span else origin,
                                         (Note("declared here without a default", g.span),)))
            else:
                # A Real default may name an earlier Real generic (`ClassifierDropout = HiddenDropout`).
                named = isinstance(g.default, (RealVar, MemberVar))
                env[g.name] = env.get(g.default.name, g.default) if named else g.default
            continue
        value = values[g.name]
        if g.kind == DIM_KIND:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                errors.append(bad_value(g, f"`{g.name}` is a Dim and needs a non-negative integer, "
                                           f"found {value!r}"))
                continue
            if value > MAX_DIM:
                errors.append(bad_value(g, f"`{g.name}` = {value} is larger than a tensor dim can be "
                                           f"({MAX_DIM:,}, the largest 64-bit signed integer)"))
                continue
            env[g.name] = const(value)
        elif g.kind in DTYPE_KINDS:
            if not isinstance(value, str) or not dtype_kind_ok(value, g.kind):
                errors.append(bad_value(g, f"`{g.name}` is {g.kind} and needs one of "
                                           f"{', '.join(DTYPE_KINDS[g.kind])}, found {value!r}"))
                continue
            env[g.name] = value
        elif g.kind == REAL_KIND:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                errors.append(bad_value(g, f"`{g.name}` is Real and needs a finite number, found {value!r}"))
                continue
            env[g.name] = float(value)
        elif g.kind in MEMBER_KINDS:
            members = MEMBER_KINDS[g.kind]
            if not isinstance(value, str) or value not in members:
                found = f'"{value}"' if isinstance(value, str) else f"the number {value!r}"
                close = member_suggestion(value, members) if isinstance(value, str) else ()
                errors.append(bad_value(g, f"`{g.name}` is {g.kind} and needs one of its members by name "
                                           f"({', '.join(members)}), found {found}", codes.BAD_MEMBER_VALUE, close))
                continue
            env[g.name] = Member(g.kind, value)
    for name in sorted(set(values) - {g.name for g in block.generics}):
        where = origins.get(name)
        generics_note = Note(f"its generics are {', '.join(g.name for g in block.generics)}",
                             block.node.name_span)
        message = f"`{block.name}` has no generic {name}"
        if where is not None and where.span is None:
            errors.append(Diagnostic(codes.UNKNOWN_GENERIC, f"{message} (given by {where.text})", block.node.name_span,
                                     (Note(f"its generics are {', '.join(g.name for g in block.generics)}"),)))
        else:
            errors.append(Diagnostic(codes.UNKNOWN_GENERIC, message, where.span if where else origin, (generics_note,)))
    if errors:
        raise LinnetError(errors, checked.program.sources)
    return env


def _check_clauses(block: BlockSig, env, errors: list[Diagnostic], origins=None) -> None:
    origins = origins or {}
    for clause in block.where:
        if not isinstance(clause, WhereClause):
            continue  # `broadcasts to` clauses are refused on blocks by the checker
        names = sorted(clause.left.free_symbols() | clause.right.free_symbols())
        notes = _origin_notes(names, env, origins) or (
            Note("the values come from the manifest's [generics] or --set"),)
        try:
            bound = clause.substitute(env)
        except DimError as exc:  # `D % Heads == 0` with Heads = 0: the clause has no value
            errors.append(Diagnostic(
                codes.WHERE_VIOLATED, f"where clause `{clause}` of `{block.name}` cannot hold with "
                f"{_values_text(clause, env)}: {exc}", clause.span, notes))
            continue
        if _evaluate(bound, {}) is False:
            left, right = bound.left, bound.right
            shown = f"`{clause.left}` is {left}" if str(clause.left) != str(left) else ""
            if str(clause.right) != str(right):
                shown += (" and " if shown else "") + f"`{clause.right}` is {right}"
            errors.append(Diagnostic(
                codes.WHERE_VIOLATED,
                f"where clause `{clause}` of `{block.name}` is violated: with {_values_text(clause, env)}, "
                f"{shown or str(bound)}, so `{left} {clause.op} {right}` is false",
                clause.span, notes))


#: The most block instances one model may have: every one is built, lowered and emitted, so a
#: `sub layers: [Layer; Layers]` with Layers = 10^9 is refused instead of running for hours.
MAX_BLOCK_INSTANCES = 100_000


def _build(block: BlockSig, env, path: str, checked: CheckedProgram,
           errors: list[Diagnostic] | None = None, origins=None, budget: list[int] | None = None) -> BlockInstance:
    errors = [] if errors is None else errors
    budget = [MAX_BLOCK_INSTANCES] if budget is None else budget
    budget[0] -= 1
    instance = BlockInstance(block, env, path)
    prefix = f"{path}." if path else ""
    for name, (t, span) in block.params.items():
        try:
            concrete = substitute(t, env)
            shape = tuple(d.evaluate({}) for d in concrete.dims)
        except DimError as exc:
            errors.append(_bad_dims(block, f"param `{prefix + name}`", str(exc), span, env, origins, t))
            continue
        if any(n < 0 for n in shape):
            errors.append(_bad_dims(block, f"param `{prefix + name}`", f"its shape {list(shape)} has a "
                                    f"negative dim (declared {t})", span, env, origins, t))
            continue
        instance.params.append(ParamSpec(prefix + name, shape, concrete.dtype))
    for name, (sub, span) in block.subs.items():
        if isinstance(sub, SubArrayT):
            try:
                count = sub.count.substitute(dims_only(env)).evaluate({})
            except DimError as exc:
                errors.append(_bad_dims(block, f"sub array `{prefix + name}`", str(exc), span, env, origins,
                                        sub.count))
                continue
            if count < 0:
                errors.append(_bad_dims(block, f"sub array `{prefix + name}`", f"its length {sub.count} "
                                        f"is {count}; a sub array's length cannot be negative", span, env,
                                        origins, sub.count))
                continue
            element = sub.element
        else:
            element, count = sub, None
        try:
            child_env = {n: _substitute_binding(value, env) for n, value in element.bindings}
        except DimError as exc:
            errors.append(_bad_dims(block, f"sub `{prefix + name}`", str(exc), span, env, origins))
            continue
        child = checked.blocks[element.block]
        if count is not None:
            # Counted before anything is built: building 10^5 instances only to refuse them takes seconds.
            each = _instance_count(child, child_env, checked, {})
            if count * each > budget[0]:
                per = "" if each == 1 else f" of {each:,} block instances each"
                errors.append(_bad_dims(block, f"sub array `{prefix + name}`", f"its length {sub.count} is "
                                        f"{count:,}{per}, more than the {MAX_BLOCK_INSTANCES:,} block instances "
                                        "a model may have", span, env, origins, sub.count))
                continue
        # A child's values are derived from the parent's, so they have no origin of their own.
        if count is None:
            instance.children[name] = _build(child, child_env, prefix + name, checked, errors, budget=budget)
        else:
            instance.children[name] = []
            for i in range(count):
                if budget[0] <= 0:
                    errors.append(_bad_dims(block, f"sub array `{prefix + name}`", f"the model would have more "
                                            f"than the {MAX_BLOCK_INSTANCES:,} block instances a model may have",
                                            span, env, origins, sub.count))
                    break
                instance.children[name].append(_build(child, dict(child_env), f"{prefix}{name}.{i}", checked,
                                                      errors, budget=budget))
    return instance


def _instance_count(block: BlockSig, env, checked: CheckedProgram, seen: dict) -> int:
    """How many block instances `_build` would make for `block` under `env` (itself included).

    Identical layers share one count (`seen`, keyed by block and values), so this costs the number
    of distinct (block, values) pairs, not the number of instances. A sub whose values cannot be
    computed counts as one: `_build` reports it.
    """
    key = (block.name, tuple(sorted((n, repr(v)) for n, v in env.items())))
    if key in seen:
        return seen[key]
    total = 1
    for sub, _ in block.subs.values():
        element = sub.element if isinstance(sub, SubArrayT) else sub
        try:
            count = sub.count.substitute(dims_only(env)).evaluate({}) if isinstance(sub, SubArrayT) else 1
            child_env = {n: _substitute_binding(value, env) for n, value in element.bindings}
        except DimError:
            count, child_env = 0, None
        if child_env is not None and count > 0:
            total += count * _instance_count(checked.blocks[element.block], child_env, checked, seen)
        if total > MAX_BLOCK_INSTANCES:
            break  # already too many; the exact figure does not matter
    seen[key] = total
    return total


def _bad_dims(block: BlockSig, what: str, reason: str, span: Span, env, origins, declared=None) -> Diagnostic:
    """A concrete shape that cannot exist: negative, or dividing by zero."""
    dims = dims_only(env)
    if declared is not None:  # show only the values the declaration uses
        used = set()
        for d in getattr(declared, "dims", None) or (declared,):
            used |= d.free_symbols() if isinstance(d, DimExpr) else set()
        dims = {k: v for k, v in dims.items() if k in used} or dims
    return Diagnostic(codes.IMPOSSIBLE_SHAPE, f"{what} of `{block.name}` cannot be built with {_env_text(dims)}: "
                      f"{reason}", span, _origin_notes(sorted(dims), env, origins or {}))


def _substitute_binding(value: Binding, env) -> Binding:
    if isinstance(value, DimExpr):
        return value.substitute(dims_only(env))
    if isinstance(value, (str, Member)):
        return value
    bound = env.get(getattr(value, "name", None))
    return bound if bound is not None else value


def _entry_signature(fn: FnSig, env) -> EntrySignature:
    params = [(name, substitute(t, env)) for name, t, _ in fn.params]
    preconditions = [Precondition(c, c.substitute(env)) for c in fn.where if isinstance(c, WhereClause)]
    # A clause that the block's generics alone make true says nothing about the inputs.
    preconditions = [p for p in preconditions if _evaluate(p.bound, {}) is not True]
    return EntrySignature(fn.name, fn, [g.name for g in fn.generics], params, substitute(fn.result, env),
                          preconditions)
