"""What checking produces: signatures of blocks and functions, clauses, and the checked program.

These are the records later stages read (`instantiate`, `lower`); the checker fills them in
phases (headers, members, signatures, bodies), so the mutable ones start half-empty.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..front import ast
from ..diagnostics import Span
from ..dims import DimExpr, Facts, sym
from ..front.modules import ModuleInfo
from ..front.resolve import Program
from ..types import (DIM_KIND, DTYPE_KINDS, MEMBER_KINDS, REAL_KIND, MemberVar, SHAPE_KIND, RealVar, Binding, DTypeVar, ErrorT, SubArrayT, SubT, TensorT, Type,
                     Variadic, dims_only, substitute, substitute_dims)


@dataclass(frozen=True)
class GenericInfo:
    name: str
    kind: str
    default: Binding | None
    span: Span

    @property
    def is_dtype(self) -> bool:
        return self.kind in DTYPE_KINDS

    def symbol(self) -> Binding:
        """How this generic appears inside types: a dim symbol, a dtype variable or `*S`."""
        if self.kind == DIM_KIND:
            return sym(self.name)
        if self.kind == SHAPE_KIND:
            return (Variadic(self.name),)
        if self.kind == REAL_KIND:
            return RealVar(self.name)
        if self.kind in MEMBER_KINDS:
            return MemberVar(self.name, self.kind)
        return DTypeVar(self.name, self.kind)


@dataclass(frozen=True)
class WhereClause:
    left: DimExpr
    op: str
    right: DimExpr
    span: Span

    def substitute(self, env) -> "WhereClause":
        dims = dims_only(env)
        return WhereClause(self.left.substitute(dims), self.op, self.right.substitute(dims), self.span)

    def __str__(self) -> str:
        return f"{self.left} {self.op} {self.right}"


@dataclass
class BroadcastClause:
    """`where [*M] broadcasts to [*Lead, Q, K]`: `left` numpy-broadcasts to exactly `right`."""

    left: tuple
    right: tuple
    span: Span

    def substitute(self, env) -> "BroadcastClause":
        return BroadcastClause(substitute_dims(self.left, env), substitute_dims(self.right, env), self.span)

    def __str__(self) -> str:
        return f"[{', '.join(map(shape_item, self.left))}] broadcasts to [{', '.join(map(shape_item, self.right))}]"


def shape_item(d) -> str:
    """One item of a shape as written: `*S` for a Shape generic, else the dim."""
    return f"*{d.name}" if isinstance(d, Variadic) else str(d)


#: Fill values an entry parameter may default to (`attention_mask: Tensor[B, S; i32] = ones`).
PARAM_DEFAULTS = {"zeros": 0, "ones": 1}


@dataclass
class FnSig:
    key: str  # `module::fn` or `module::Block.fn`
    name: str
    node: ast.Function
    module: ModuleInfo
    block: "BlockSig | None"
    generics: list[GenericInfo]  # the function's own
    scope: dict[str, GenericInfo]  # the block's generics and the function's own
    params: list[tuple[str, Type, Span]] = field(default_factory=list)
    result: Type = field(default_factory=ErrorT)
    where: list[WhereClause | BroadcastClause] = field(default_factory=list)
    facts: Facts = field(default_factory=Facts)
    #: Entry parameters the caller may leave out, and the value they are filled with.
    defaults: dict[str, int] = field(default_factory=dict)
    #: Entry parameters with a computed default (`= positions(attention_mask)`) -> the block
    #: function that computes it (`forward_default_position_ids`, made by the resolver).
    computed: dict[str, str] = field(default_factory=dict)
    #: Each computed default as written (`positions(attention_mask)`), for signatures.
    computed_text: dict[str, str] = field(default_factory=dict)
    checked: bool = False  # the signature checked, so the body can be

    @property
    def is_entry(self) -> bool:
        return self.node.is_entry

    def signature(self, env=None) -> str:
        env = env or {}
        params = ", ".join(f"{n}: {substitute(t, env)}" for n, t, _ in self.params)
        # `*S` for a Shape generic, as declared (it printed as plain `S`, which reads as a Dim).
        generics = ", ".join(("*" if g.kind == SHAPE_KIND else "") + g.name
                             for g in self.generics if g.name not in env)
        head = f"{self.name}<{generics}>" if generics else self.name
        return f"{head}({params}) -> {substitute(self.result, env)}"


@dataclass
class BlockSig:
    key: str
    name: str
    node: ast.Block
    module: ModuleInfo
    generics: list[GenericInfo]
    where: list[WhereClause] = field(default_factory=list)
    facts: Facts = field(default_factory=Facts)
    params: dict[str, tuple[TensorT, Span]] = field(default_factory=dict)
    subs: dict[str, tuple[SubT | SubArrayT, Span]] = field(default_factory=dict)
    functions: dict[str, FnSig] = field(default_factory=dict)

    @property
    def scope(self) -> dict[str, GenericInfo]:
        return {g.name: g for g in self.generics}


@dataclass(frozen=True)
class CallInfo:
    """What a call resolved to, with the callee's generics bound in the caller's terms."""

    kind: str  # "prim", "fn" (free function), "self" (sibling in the block), "sub" (method on a sub)
    target: str  # prim name or function key
    bindings: tuple[tuple[str, Binding], ...]
    receiver: str | None = None  # sub member or loop variable, for kind "sub"

    @property
    def env(self) -> dict[str, Binding]:
        return dict(self.bindings)


@dataclass(frozen=True)
class NameInfo:
    kind: str  # "local", "param" (block param), "const", "dim"
    target: str  # local name, param name, const key, or dim name


@dataclass
class CheckedProgram:
    program: Program
    blocks: dict[str, BlockSig]
    functions: dict[str, FnSig]
    consts: dict[str, tuple[float | int, str]]
    types: dict[int, Type]  # id(expression node) -> its type, in its function's generics
    calls: dict[int, CallInfo]
    names: dict[int, NameInfo]

    def find_block(self, name: str) -> BlockSig:
        matches = [b for b in self.blocks.values() if b.name == name or b.key == name]
        if not matches:
            raise KeyError(name)
        return matches[0]
