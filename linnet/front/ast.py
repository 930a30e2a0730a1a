"""The syntax tree: what the parser builds, before any name means anything.

Every node carries the `Span` of the text it came from, so every later stage can point at
the source.  Nodes are plain dataclasses; identity (`id(node)`) is how the checker attaches
types to them.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..diagnostics import Span


def field_names(node) -> tuple[str, ...] | None:
    """The field names of a syntax node (a dataclass other than a `Span`), in order; None for
    anything else.  Looked up once per class: the tree walkers ask it of every node."""
    cls = type(node)
    names = _FIELD_NAMES.get(cls, False)
    if names is False:
        is_node = dataclasses.is_dataclass(node) and not isinstance(node, Span)
        names = tuple(f.name for f in dataclasses.fields(node)) if is_node else None
        if not isinstance(node, type):  # a class object is a dataclass or not by itself
            _FIELD_NAMES[cls] = names
    return names


_FIELD_NAMES: dict[type, tuple[str, ...] | None] = {}

# ---------------------------------------------------------------------------- dims


@dataclass(eq=False)
class DimName:
    name: str
    span: Span


@dataclass(eq=False)
class DimInt:
    value: int
    span: Span


@dataclass(eq=False)
class DimBinary:
    op: str  # one of + - * / %
    left: "DimNode"
    right: "DimNode"
    span: Span


DimNode = DimName | DimInt | DimBinary


@dataclass(eq=False)
class Variadic:
    """`*S` inside a tensor type: any number of leading (or inner) dims."""

    name: str
    span: Span


@dataclass(eq=False)
class Constraint:
    """One `where` clause: `S <= MaxPositions`, `D % Heads == 0`."""

    left: DimNode
    op: str
    right: DimNode
    span: Span


@dataclass(eq=False)
class BroadcastConstraint:
    """`where [*M] broadcasts to [*Lead, Q, K]`: a shape numpy-broadcasts to another."""

    left: list  # DimNode | Variadic
    right: list
    span: Span


# --------------------------------------------------------------------------- types


@dataclass(eq=False)
class TensorTypeNode:
    dims: list[DimNode | Variadic]
    dtype: "NamedTypeNode"
    span: Span


@dataclass(eq=False)
class NamedTypeNode:
    """A bare type name: a dtype (`f32`, `i32`) or a dtype generic (`T`)."""

    name: str
    span: Span


@dataclass(eq=False)
class OptionTypeNode:
    inner: "TypeNode"
    span: Span


@dataclass(eq=False)
class TupleTypeNode:
    """`(Tensor[...], Tensor[...])` or `(logits: Tensor[...], cache: Tensor[...])`: a function's
    several results (a result type only).  `names` is all None when the items are not named."""

    items: list["TypeNode"]
    names: list[str | None]
    span: Span


TypeNode = TensorTypeNode | NamedTypeNode | OptionTypeNode | TupleTypeNode


@dataclass(eq=False)
class BlockRef:
    """`Linear<D, D, T>` in a `sub` declaration."""

    name: str
    args: list["GenericArg"]
    span: Span


@dataclass(eq=False)
class SubArrayType:
    """`[EncoderLayer<D, Heads, Inner, T>; Layers]`."""

    element: BlockRef
    count: DimNode
    span: Span


GenericArg = "DimNode | FloatLit | BlockRef"  # a dim expression, a bare name that may be a dtype or a
# block, a Real's number, or a block with arguments (for a template's `Block` generic)


# --------------------------------------------------------------------------- exprs


@dataclass(eq=False)
class Name:
    name: str
    span: Span


@dataclass(eq=False)
class IntLit:
    value: int
    span: Span


@dataclass(eq=False)
class FloatLit:
    value: float
    text: str
    span: Span


@dataclass(eq=False)
class NoneLit:
    span: Span


@dataclass(eq=False)
class ListLit:
    items: list["Expr"]
    span: Span


@dataclass(eq=False)
class Binary:
    op: str  # + - * / %
    left: "Expr"
    right: "Expr"
    span: Span


@dataclass(eq=False)
class Unary:
    op: str  # -
    operand: "Expr"
    span: Span


@dataclass(eq=False)
class Call:
    """`f(x)`, `f<A, B>(x)`; `name_span` covers just the callee's name."""

    name: str
    generic_args: list[GenericArg]
    args: list["Expr"]
    span: Span
    name_span: Span


@dataclass(eq=False)
class MethodCall:
    """`norm.forward(x)`: a function of a sub-block (or of a loop variable over a sub array)."""

    receiver: Name
    method: str
    args: list["Expr"]
    span: Span
    name_span: Span


@dataclass(eq=False)
class Slice:
    start: "Expr | None"
    stop: "Expr | None"
    span: Span


@dataclass(eq=False)
class Index:
    """`hidden[:, 0, :]`: integers drop an axis, slices keep it."""

    target: "Expr"
    items: list["Expr | Slice"]
    span: Span


@dataclass(eq=False)
class TupleLit:
    """`(logits, cache)`: a return's value when the function returns several results."""

    items: list["Expr"]
    span: Span


Expr = TupleLit | Name | IntLit | FloatLit | NoneLit | ListLit | Binary | Unary | Call | MethodCall | Index


# ----------------------------------------------------------------------- statements


@dataclass(eq=False)
class Let:
    name: str
    mutable: bool  # `var` rather than `let`
    annotation: TypeNode | None
    value: Expr
    span: Span
    name_span: Span


@dataclass(eq=False)
class Destructure:
    """`let (logits, cache) = f(x)`: one local per result of a call that returns several."""

    names: list[str]
    name_spans: list[Span]
    value: Expr
    span: Span


@dataclass(eq=False)
class Assign:
    name: str
    value: Expr
    span: Span
    name_span: Span


@dataclass(eq=False)
class Return:
    value: Expr
    span: Span


@dataclass(eq=False)
class Collect:
    """The `let states = ... collect x` part of a collecting `static for`."""

    into: str  # the `let` that receives the stacked values
    into_span: Span
    var: Name  # the `var` whose values are collected
    annotation: "TypeNode | None" = None

    @property
    def span(self) -> Span:
        """From the receiving name to the collected one: `states ... collect x`."""
        start, end = self.into_span, self.var.span
        return Span(start.file, start.line, start.col, end.end_line, end.end_col)


@dataclass(eq=False)
class StaticFor:
    """`static for layer in layers { ... }`: unrolled over a sub-block array.

    With `collect` (`let states = static for layer in layers collect x { ... }`) it also
    binds `states`: the value of `x` as the loop starts, then after each pass, stacked.
    With `enumerate` (`static for i, layer in enumerate(layers)`) `index` names the pass
    number, a dim from 0 to the array's length - 1."""

    var: str
    iterable: str
    body: list["Stmt"]
    span: Span
    iterable_span: Span
    var_span: Span | None = None  # the loop variable's name
    collect: Collect | None = None
    index: str | None = None
    index_span: Span | None = None


@dataclass(eq=False)
class IfSome:
    """`if let some(b) = bias { ... } else { ... }`, decided when the function is instantiated."""

    binding: str
    option: Name
    then_body: list["Stmt"]
    else_body: list["Stmt"]
    span: Span
    binding_span: Span | None = None  # the name inside `some(...)`


Stmt = Let | Destructure | Assign | Return | StaticFor | IfSome


# ---------------------------------------------------------------------------- items


@dataclass(eq=False)
class GenericParam:
    name: str
    kind: str  # "Dim", "Float", "Int", "DType", "Shape", "Real"
    default: "NamedTypeNode | DimNode | FloatLit | None"
    variadic: bool
    span: Span


@dataclass(eq=False)
class GenericSplice:
    """`..Model` among a block alias's generics: Model's generics, in order, with their defaults,
    and its `where` clauses (front/resolve.py replaces it before anything reads the generics)."""

    name: str
    span: Span


@dataclass(eq=False)
class SpliceArg:
    """`..` as the generic arguments of a block in an alias's target (`Model<..>`): every generic
    of that block, passed by its own name (replaced by the resolver)."""

    span: Span


@dataclass(eq=False)
class Param:
    name: str
    type: TypeNode
    span: Span
    default: str | None = None  # `= zeros` / `= ones` on an entry's tensor parameter
    #: `= positions(attention_mask)`: a default computed from earlier parameters (the resolver
    #: makes it a function of the block, `<entry>_default_<param>`, and names it in `default_fn`).
    default_expr: "Expr | None" = None
    default_fn: str | None = None
    default_text: str = ""  # the expression as written, for signatures


@dataclass(eq=False)
class Function:
    name: str
    public: bool
    is_entry: bool
    generics: list[GenericParam]
    params: list[Param]
    result: TypeNode | None
    where: list  # Constraint | BroadcastConstraint
    body: list[Stmt]
    span: Span
    name_span: Span
    doc: str = ""
    #: (entry, parameter) for the function the resolver makes of a computed default.
    default_of: tuple[str, str] | None = None


@dataclass(eq=False)
class ParamDecl:
    """`param weight: Tensor[Out, In; T]` inside a block."""

    name: str
    type: TypeNode
    span: Span


@dataclass(eq=False)
class SubDecl:
    """`sub norm: LayerNorm<D, T>` or an array `sub layers: [EncoderLayer<...>; Layers]`."""

    name: str
    type: BlockRef | SubArrayType
    span: Span


@dataclass(eq=False)
class Delegate:
    """`pub use bert.forward as encode` inside a block: one delegated entry of the sub-block `field`."""

    public: bool
    field: str
    field_span: Span
    callee: str
    callee_span: Span
    name: str  # the name it gets in this block (`callee` unless renamed with `as`)
    name_span: Span
    span: Span
    position: int = 0  # how many of the block's functions are declared before it, to keep entry order
    then: str | None = None  # `... then scores`: the block function the callee's result goes through
    then_span: Span | None = None


@dataclass(eq=False)
class Block:
    name: str
    public: bool
    generics: list[GenericParam]
    where: list[Constraint]
    params: list[ParamDecl]
    subs: list[SubDecl]
    functions: list[Function]
    span: Span
    name_span: Span
    doc: str = ""
    delegates: list[Delegate] = field(default_factory=list)  # expanded into `functions` by the resolver
    delegates_expanded: bool = False  # set once they are in `functions`: a tree resolved twice gains them once
    #: For a block expanded from a block alias: (the template's name, the alias's name span), so a
    #: diagnostic at the template's text can say which instance of it found the problem.
    instance_of: "tuple[str, Span] | None" = None


@dataclass(eq=False)
class Const:
    name: str
    public: bool
    type: NamedTypeNode
    value: IntLit | FloatLit | Unary
    span: Span
    name_span: Span


@dataclass(eq=False)
class Use:
    """`use std.nn.norm::{layer_norm}`; `names` pairs each imported name with its span."""

    path: list[str]
    names: list[tuple[str, Span]]
    span: Span
    path_span: Span


@dataclass(eq=False)
class BlockAlias:
    """`pub block Name<generics> = Template<args> where ...`: a block template instantiated.

    `Template` is a block with at least one `Block` generic; the resolver expands the alias into
    an ordinary block named `name` with these generics and clauses and the template's members, the
    template's generics replaced by `target`'s arguments (front/templates.py, `Templates`)."""

    name: str
    public: bool
    generics: list[GenericParam]
    where: list
    target: BlockRef
    span: Span
    name_span: Span
    doc: str = ""


Item = Block | Function | Const | BlockAlias


@dataclass(eq=False)
class Module:
    name: str | None  # from `module name`, if declared
    name_span: Span | None
    uses: list[Use]
    items: list[Item]
    file: str
    span: Span = field(default=None)  # type: ignore[assignment]
