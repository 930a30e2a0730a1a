"""Checked program + concrete generics -> one model: its parameter tree and entry signatures.

The root block's generics get values (from a manifest's `[generics]` or `--set`), every
`where` clause is evaluated with them, and the sub-block tree is walked to list each
parameter with its concrete shape.  An entry's own dims (B, S) stay free: its `where`
clauses over them become preconditions, checked here for any concrete values given (the
manifest's `[check]` dims) and turned into runtime guards and export constraints later.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .check import BlockSig, CheckedProgram, FnSig, WhereClause
from .diagnostics import Diagnostic, LinnetError, Note, Span
from .dims import DimError, DimExpr, const, sym
from .params import ParamSpec
from .types import (DIM_KIND, DTYPE_KINDS, Binding, SubArrayT, SubT, TensorT, Type, dims_only, dtype_kind_ok,
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


@dataclass
class EntrySignature:
    name: str
    fn: FnSig
    dims: list[str]  # the entry's free dims, in declaration order
    params: list[tuple[str, TensorT]]
    result: Type
    preconditions: list[Precondition]

    def __str__(self) -> str:
        params = ", ".join(f"{n}: {t}" for n, t in self.params)
        text = f"{self.name}<{', '.join(self.dims)}>({params}) -> {self.result}"
        if self.preconditions:
            text += " where " + ", ".join(str(p) for p in self.preconditions)
        return text

    def dim_sources(self) -> dict[str, tuple[str, int]]:
        """Where each free dim can be read at run time: (input name, axis)."""
        sources: dict[str, tuple[str, int]] = {}
        for name, t in self.params:
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

    def check_dims(self, entry: str, values: dict[str, int]) -> list[Diagnostic]:
        """Evaluate an entry's preconditions at concrete dims; one diagnostic per failure."""
        sig = self.entries[entry]
        problems = []
        for pre in sig.preconditions:
            verdict = _evaluate(pre.bound, values)
            if verdict is False:
                problems.append(_precondition_diagnostic(sig, pre, values, self.root.env))
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


def _precondition_diagnostic(sig: EntrySignature, pre: Precondition, values, block_env) -> Diagnostic:
    env = {**block_env, **values}
    left = pre.clause.left.substitute(dims_only(env))
    right = pre.clause.right.substitute(dims_only(env))
    return Diagnostic(
        "E0403",
        f"entry `{sig.name}` cannot run with {_values_text(pre.clause, env)}: "
        f"`{pre.clause}` requires {left} {pre.clause.op} {right}",
        pre.clause.span,
        (Note(f"`{sig.name}` declares this precondition; the values come from the [check] dims or --set"),),
    )


def instantiate(checked: CheckedProgram, root: str, generics: dict[str, int | str],
                origin: Span | None = None) -> Instance:
    """Bind the root block's generics and build the model; raises LinnetError on any violation."""
    try:
        block = checked.find_block(root)
    except KeyError:
        known = ", ".join(sorted(b.name for b in checked.blocks.values() if b.module.name in
                                 {m.name for m in checked.program.roots}))
        raise LinnetError(Diagnostic("E0501", f"no block `{root}` in the package (blocks: {known})", origin),
                          checked.program.sources) from None
    env = _bind_root(block, generics, origin, checked)
    errors: list[Diagnostic] = []
    # The checker proved every sub-block's clauses from its parent's, so the root's decide.
    _check_clauses(block, env, errors)
    if errors:
        raise LinnetError(errors, checked.program.sources)
    root_instance = _build(block, env, "", checked)
    entries = {name: _entry_signature(fn, env) for name, fn in block.functions.items() if fn.is_entry}
    return Instance(checked, root_instance, entries)


def _bind_root(block: BlockSig, values: dict[str, int | str], origin, checked) -> dict[str, Binding]:
    errors: list[Diagnostic] = []
    env: dict[str, Binding] = {}
    for g in block.generics:
        if g.name not in values:
            if g.default is None:
                errors.append(Diagnostic("E0502", f"generic `{g.name}` of `{block.name}` has no value",
                                         origin, (Note("declared here", g.span),)))
            else:
                env[g.name] = g.default
            continue
        value = values[g.name]
        if g.kind == DIM_KIND:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                errors.append(Diagnostic("E0503", f"`{g.name}` is a Dim and needs a non-negative integer, "
                                         f"found {value!r}", origin, (Note("declared here", g.span),)))
                continue
            env[g.name] = const(value)
        elif g.kind in DTYPE_KINDS:
            if not isinstance(value, str) or not dtype_kind_ok(value, g.kind):
                errors.append(Diagnostic("E0503", f"`{g.name}` is {g.kind} and needs one of "
                                         f"{', '.join(DTYPE_KINDS[g.kind])}, found {value!r}", origin,
                                         (Note("declared here", g.span),)))
                continue
            env[g.name] = value
    unknown = sorted(set(values) - {g.name for g in block.generics})
    if unknown:
        errors.append(Diagnostic("E0504", f"`{block.name}` has no generic {', '.join(unknown)}", origin,
                                 (Note(f"its generics are {', '.join(g.name for g in block.generics)}",
                                       block.node.name_span),)))
    if errors:
        raise LinnetError(errors, checked.program.sources)
    return env


def _check_clauses(block: BlockSig, env, errors: list[Diagnostic]) -> None:
    for clause in block.where:
        bound = clause.substitute(env)
        if _evaluate(bound, {}) is False:
            left, right = bound.left, bound.right
            shown = f"`{clause.left}` is {left}" if str(clause.left) != str(left) else ""
            if str(clause.right) != str(right):
                shown += (" and " if shown else "") + f"`{clause.right}` is {right}"
            errors.append(Diagnostic(
                "E0401",
                f"where clause `{clause}` of `{block.name}` is violated: with {_values_text(clause, env)}, "
                f"{shown or str(bound)}, so `{left} {clause.op} {right}` is false",
                clause.span,
                (Note("the values come from the manifest's [generics] or --set"),)))


def _build(block: BlockSig, env, path: str, checked: CheckedProgram) -> BlockInstance:
    instance = BlockInstance(block, env, path)
    prefix = f"{path}." if path else ""
    for name, (t, _) in block.params.items():
        concrete = substitute(t, env)
        shape = tuple(d.as_int() for d in concrete.dims)
        instance.params.append(ParamSpec(prefix + name, shape, concrete.dtype))
    for name, (sub, _) in block.subs.items():
        if isinstance(sub, SubArrayT):
            count = sub.count.substitute(dims_only(env)).as_int()
            instance.children[name] = [
                _build_child(sub.element, env, f"{prefix}{name}.{i}", checked) for i in range(count)]
        else:
            instance.children[name] = _build_child(sub, env, prefix + name, checked)
    return instance


def _build_child(sub: SubT, parent_env, path: str, checked: CheckedProgram) -> BlockInstance:
    child_env = {name: _substitute_binding(value, parent_env) for name, value in sub.bindings}
    return _build(checked.blocks[sub.block], child_env, path, checked)


def _substitute_binding(value: Binding, env) -> Binding:
    if isinstance(value, DimExpr):
        return value.substitute(dims_only(env))
    if isinstance(value, str):
        return value
    bound = env.get(getattr(value, "name", None))
    return bound if bound is not None else value


def _entry_signature(fn: FnSig, env) -> EntrySignature:
    params = [(name, substitute(t, env)) for name, t, _ in fn.params]
    own = {g.name for g in fn.generics}
    preconditions = [Precondition(c, c.substitute(env)) for c in fn.where]
    # A clause that the block's generics alone make true says nothing about the inputs.
    preconditions = [p for p in preconditions if _evaluate(p.bound, {}) is not True]
    return EntrySignature(fn.name, fn, [g.name for g in fn.generics], params, substitute(fn.result, env),
                          preconditions)
