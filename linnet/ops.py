"""The op registry: one record per operation of the lowered program, and the tables backends fill.

Every `ir.Op` names one `OpDef`.  A record holds what is true of the op wherever it is used:

* for a primitive (an op a program calls by name, `softmax(x, -1)`): its signature as
  docs/language.md shows it, how many arguments and `<dtype>` generics it takes, and its type
  rule (the rules themselves live in `linnet.prims`, which is the checker's side);
* the schema of its IR attrs (`axis: int`, `shape: tuple[DimExpr]`), which `ir.verify`
  checks on every op;
* how a call of it lowers to IR: a hook over a `PrimLowering`, or nothing for the plain
  case (an op of the same name over the lowered arguments, a constant argument folded with
  `fold` where the record has one).

The arithmetic ops lowering makes from operators and indexing (`add`, `neg`, `index`) are
records too, with no signature: a program cannot call them by name.

Each backend keeps one `Emissions` table, op name -> how it writes that op (jax's
`mlir.register_lowering`, tinygrad's `code_for_op`), or a declared refusal with a reason;
tests/test_ops.py proves every table covers every op.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, NoReturn, Protocol

from . import codes
from .dims import DimExpr
from .prims import (PrimCall, _activation, _binary_broadcast, _cast, _compare, _concat, _cumsum, _dropout, _iota, _matmul, _permute,
                    _reduce, _reshape, _select, _softmax, _take, _transpose, _unary_float)
from .types import ALL_DTYPES, MEMBER_KINDS, Type


# ------------------------------------------------------------------ attr schemas


@dataclass(frozen=True)
class AttrType:
    """The Python type an IR attr holds, by the name the schema shows and a test of a value."""

    text: str
    accepts: Callable[[object], bool]


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_index_item(item) -> bool:
    """`("index", dim)` or `("slice", start, stop)` with stop None for "to the end"."""
    if not isinstance(item, tuple) or not item:
        return False
    if item[0] == "index":
        return len(item) == 2 and isinstance(item[1], DimExpr)
    return (item[0] == "slice" and len(item) == 3 and isinstance(item[1], DimExpr)
            and (item[2] is None or isinstance(item[2], DimExpr)))


INT = AttrType("int", _is_int)
INTS = AttrType("tuple[int]", lambda v: isinstance(v, tuple) and all(map(_is_int, v)))
DIM = AttrType("DimExpr", lambda v: isinstance(v, DimExpr))
DIMS = AttrType("tuple[DimExpr]", lambda v: isinstance(v, tuple) and all(isinstance(d, DimExpr) for d in v))
DTYPE = AttrType("DType", lambda v: v in ALL_DTYPES)
INDEX_ITEMS = AttrType("tuple[IndexItem]", lambda v: isinstance(v, tuple) and all(map(_is_index_item, v)))


# ------------------------------------------------------------------- lowering


class PrimLowering(Protocol):
    """One call of a primitive as its lowering hook sees it (`linnet.middle.lower` implements it).

    Arguments are lowered once, in order, the first time a hook asks for them.
    """

    result: Any  # the call's `ir.TensorType`
    result_dtype: str
    dtype_args: list[str]  # the explicit `<dtype>` generics, bound: `cast<f32>` -> ["f32"]
    arity: int  # how many value arguments the call has

    def arg(self, i: int) -> Any: ...  # argument i, lowered

    def static(self, i: int) -> DimExpr: ...  # argument i, a dim known at compile time

    def items(self, i: int) -> tuple[DimExpr, ...]: ...  # argument i, a list literal of dims

    def operands(self, dtype: str | None = None) -> tuple: ...  # every argument; numbers take `dtype`

    def tensor_dtype(self) -> str: ...  # the dtype of the first tensor argument, else the result's

    def number(self, i: int) -> Any | None: ...  # argument i as a constant of the result dtype, if known

    def op(self, args: Iterable, **attrs) -> Any: ...  # an `ir.Op` of this primitive with the result type

    def read_dims(self, dims: Iterable[DimExpr]) -> None: ...  # the emitted code reads these dims at run time

    def fail(self, code: codes.ErrorCode, message: str) -> NoReturn: ...  # a user error at this call


def _lower_axis(low: PrimLowering):
    """The reductions, softmax and cumsum: the axis literal (softmax's defaults to -1) as an attr."""
    return low.op((low.arg(0),), axis=low.static(1).as_int() if low.arity > 1 else -1)


def _lower_compare(low: PrimLowering):
    # The result is bool, so a literal operand takes the dtype of the tensor it is compared with.
    return low.op(low.operands(low.tensor_dtype()))


def _lower_concat(low: PrimLowering):
    # The axis as a non-negative attr, so emitters index the result's dims with it directly.
    a, b = low.arg(0), low.arg(1)
    axis = low.static(2).as_int()
    # An operand repeated along a 1-axis is expanded to the result's shape, written from its dims.
    low.read_dims([*low.result.dims, *a.type.dims, *b.type.dims])
    return low.op((a, b), axis=axis + a.type.rank if axis < 0 else axis)


def _lower_reshape(low: PrimLowering):
    return low.op((low.arg(0),), shape=low.items(1))


def _lower_permute(low: PrimLowering):
    return low.op((low.arg(0),), perm=tuple(d.as_int() for d in low.items(1)))


def _lower_iota(low: PrimLowering):
    return low.op((), n=low.static(0), dtype=low.dtype_args[0])


#: What `activation(x, kind)` computes: the members of the `Activation` generic kind (linnet.types),
#: in the order of the legacy kind numbers. transformers' `hidden_act` names map onto these
#: (linnet.nest.families), and each backend writes each one as its framework's own kernel.
ACTIVATIONS = MEMBER_KINDS["Activation"]
ACTIVATION = AttrType("activation kind", lambda v: v in ACTIVATIONS)


def _lower_activation(low: PrimLowering):
    """The kind (known once the generics are) becomes the op's `kind` attr: an `Activation`
    member arrives as its place in the kind (linnet.middle.lower), a Real generic or literal as
    the legacy number, which is checked here."""
    kind = getattr(low.arg(1), "value", None)
    if kind is None or kind != int(kind) or not 0 <= kind < len(ACTIVATIONS):
        low.fail(codes.BAD_ACTIVATION,
                 f"`activation` takes a kind number in 0..{len(ACTIVATIONS) - 1} "
                 f"({', '.join(f'{i} {name}' for i, name in enumerate(ACTIVATIONS))}), found "
                 f"{'a value known only at run time' if kind is None else kind}")
    return low.op((low.arg(0),), kind=ACTIVATIONS[int(kind)])


def _lower_cast(low: PrimLowering):
    # A cast of a number known now (a literal, a concrete dim) is that number.
    number = low.number(0)
    return number if number is not None else low.op((low.arg(0),), dtype=low.dtype_args[0])


# -------------------------------------------------------------------- folding


def _folding(exact: Callable[[float], float], ieee: Callable | None = None) -> Callable[[float], float]:
    """A fold of a constant argument: `exact` (math), with IEEE results where math raises
    (`rsqrt(0.0)` is inf) from `ieee(np, v)`, the same formula over a numpy float64."""

    def fold(x: float) -> float:
        try:
            return exact(x)
        except (ValueError, ZeroDivisionError, OverflowError):
            if ieee is None:
                raise
            import numpy as np

            with np.errstate(all="ignore"):
                return float(ieee(np, np.float64(x)))

    return fold


def _gelu_tanh(x, tanh: Callable = math.tanh):
    """GELU's tanh approximation (transformers' `gelu_new`, torch's `approximate="tanh"`)."""
    return 0.5 * x * (1.0 + tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


_FOLDS = {
    "erf": _folding(math.erf),  # defined for every float
    "tanh": _folding(math.tanh, lambda np, v: np.tanh(v)),
    "exp": _folding(math.exp, lambda np, v: np.exp(v)),
    "log": _folding(math.log, lambda np, v: np.log(v)),
    "sqrt": _folding(math.sqrt, lambda np, v: np.sqrt(v)),
    "rsqrt": _folding(lambda x: 1.0 / math.sqrt(x), lambda np, v: 1.0 / np.sqrt(v)),
    "sigmoid": _folding(lambda x: 1.0 / (1.0 + math.exp(-x)), lambda np, v: 1.0 / (1.0 + np.exp(-v))),
    "gelu_tanh": _folding(_gelu_tanh, lambda np, v: _gelu_tanh(v, np.tanh)),
    # RoPE's tables (std.nn.rotary); sin(inf) is nan, as IEEE has it.
    "sin": _folding(math.sin, lambda np, v: np.sin(v)),
    "cos": _folding(math.cos, lambda np, v: np.cos(v)),
}


# --------------------------------------------------------------------- traits

#: What an op is, as the passes see it (`OpDef.kind`).  Each pass derives its sets from these,
#: so a new op is handled by every pass once its record says which it is:
#:
#: * `UNARY`: elementwise on one tensor (`exp`, `cast`; `activation`'s kind is an attr);
#: * `ELEMENTWISE`: elementwise over operands that broadcast together (`add`, `select`,
#:   `dropout`, whose rate is one number): result element i reads element i of each operand;
#: * `REDUCE`: along its `axis` attr, which becomes 1 (`sum`); `SCAN`: along its `axis`,
#:   which keeps its length (`softmax`, `cumsum`).  Both act on each position of every other
#:   axis alone, and mix the positions along their own;
#: * `MOVEMENT`: moves or selects elements without arithmetic (`reshape`, `permute`,
#:   `transpose`, `index`); `OpDef.rearranges` says which keep every element;
#: * `STRUCTURED`: none of these; a pass that handles it has a rule of its own for it (`matmul`
#:   contracts an axis, `take` gathers rows, `concat` joins), and any other pass treats it as
#:   mixing positions along every axis (computes it whole, or refuses).
UNARY, ELEMENTWISE, REDUCE, SCAN, MOVEMENT, STRUCTURED = (
    "unary", "elementwise", "reduce", "scan", "movement", "structured")
KINDS = (UNARY, ELEMENTWISE, REDUCE, SCAN, MOVEMENT, STRUCTURED)

#: `OpDef.zero_fill`: how zeros at some positions survive the op, over its operands that hold
#: those positions (`linnet.middle.packing` fills the positions it does not compute with 0):
#: `ZERO_IF_ALL`, the result is 0 where all of them are 0 (`neg`, a `reshape`); `ZERO_IF_ANY`,
#: where any of them is (`mul`).  None: no claim.
ZERO_IF_ALL, ZERO_IF_ANY = "all", "any"


# -------------------------------------------------------------------- records


@dataclass(frozen=True)
class OpDef:
    name: str
    #: IR attrs: name -> type, every one present on every op of this name.
    attrs: tuple[tuple[str, AttrType], ...] = ()
    #: The primitive's signature as the docs show it; None for an op no program calls by name.
    signature: str | None = None
    arity: tuple[int, ...] = ()  # accepted numbers of value arguments
    dtype_generics: int = 0  # how many explicit `<dtype>` arguments it takes
    rule: Callable[[PrimCall], Type] | None = None
    #: How a call lowers, when it is not the plain op over its lowered arguments.
    lower: Callable[[PrimLowering], Any] | None = None
    #: The value of the op on a constant (a compile-time number) argument.
    fold: Callable[[float], float] | None = None
    #: What it is for the passes: one of `KINDS`.  Every record says (tests/test_ops.py); a
    #: pass reads a missing kind as `STRUCTURED`, an op it knows nothing of.
    kind: str | None = None
    #: For a `MOVEMENT` op: whether every element of its operand reaches the result (a
    #: reshape or permute does; an `index` selects).
    rearranges: bool = False
    #: `ZERO_IF_ALL`, `ZERO_IF_ANY` or None (see those).
    zero_fill: str | None = None
    #: The pass that makes it, for an op no program and no lowering writes (`pack_rows`).
    made_by: str | None = None
    #: The binary operator lowering makes it from (`+` for `add`).
    operator: str | None = None
    #: Whether swapping its two operands gives the same value (`add`, `mul`).
    commutative: bool = False

    @property
    def is_primitive(self) -> bool:
        return self.signature is not None

    @property
    def elementwise(self) -> bool:
        """Acts on each element alone: result element i reads element i of each operand (an
        operand broadcast along an axis is read whole along it)."""
        return self.kind in (UNARY, ELEMENTWISE)

    @property
    def along_axis(self) -> bool:
        """Acts along its `axis` attr only, on each position of every other axis alone."""
        return self.kind in (REDUCE, SCAN)

    @property
    def moves_data(self) -> bool:
        """Moves or selects values and computes nothing: rewriting it saves no arithmetic."""
        return self.kind == MOVEMENT

    @property
    def rule_home(self) -> str:
        """Where its type rule lives: a rule of `linnet.prims` for a primitive; lowering makes
        the result type of an operator or an index, and a pass that of the ops it makes."""
        if self.rule is not None:
            return f"{self.rule.__module__}.{self.rule.__name__}"
        return self.made_by or "linnet.middle.lower"

    def schema(self) -> str:
        """The attrs as text: `axis: int`."""
        return ", ".join(f"{name}: {t.text}" for name, t in self.attrs) or "no attrs"


def _primitive(name: str, signature: str, rule, arity=(1,), dtype_generics: int = 0, **more) -> OpDef:
    return OpDef(name, signature=signature, arity=arity, dtype_generics=dtype_generics, rule=rule, **more)


_AXIS = (("axis", INT),)
_ZERO_MOVEMENT = dict(kind=MOVEMENT, zero_fill=ZERO_IF_ALL)
_PACKING = "linnet.middle.packing"

_RECORDS = [
    *(_primitive(name, f"{name}(x: Tensor[*S; T: Float]) -> Tensor[*S; T]", _unary_float, fold=_FOLDS[name],
                 kind=UNARY)
      for name in ("erf", "tanh", "exp", "log", "sqrt", "rsqrt", "sigmoid", "gelu_tanh", "sin", "cos")),
    *(_primitive(name, f"{name}(a: Tensor[*A; T], b: Tensor[*B; T]) -> Tensor[broadcast(A, B); T]",
                 _binary_broadcast, (2,), kind=ELEMENTWISE) for name in ("maximum", "minimum")),
    *(_primitive(name, f"{name}(a: Tensor[*A; T], b: Tensor[*B; T]) -> Tensor[broadcast(A, B); bool]",
                 _compare, (2,), lower=_lower_compare, kind=ELEMENTWISE) for name in ("less", "greater", "equal")),
    _primitive("select", "select(cond: Tensor[*C; bool], a: Tensor[*A; T], b: Tensor[*B; T]) -> "
               "Tensor[broadcast(C, A, B); T]", _select, (3,), kind=ELEMENTWISE),
    _primitive("matmul", "matmul(a: Tensor[*B, M, K; T], b: Tensor[*B, K, N; T]) -> Tensor[*B, M, N; T]",
               _matmul, (2,), kind=STRUCTURED),
    _primitive("transpose", "transpose(x: Tensor[*S, M, N; T]) -> Tensor[*S, N, M; T]", _transpose,
               rearranges=True, **_ZERO_MOVEMENT),
    _primitive("softmax", "softmax(x: Tensor[*S; T: Float], axis = -1) -> Tensor[*S; T]", _softmax, (1, 2),
               attrs=_AXIS, lower=_lower_axis, kind=SCAN),
    *(_primitive(name, f"{name}(x: Tensor[..., N, ...; T], axis) -> Tensor[..., 1, ...; T]  (keeps the axis)",
                 _reduce, (2,), attrs=_AXIS, lower=_lower_axis, kind=REDUCE) for name in ("sum", "mean", "max")),
    # Training's regulariser: the identity in eval mode (every inference backend); in train mode
    # each element is zeroed with probability `rate` and the rest scaled by 1 / (1 - rate).
    _primitive("dropout", "dropout(x: Tensor[*S; T: Float], rate: T) -> Tensor[*S; T]  "
               "(identity in eval mode)", _dropout, (2,), kind=ELEMENTWISE),
    # One of several elementwise functions, picked when the model is built (BERT's `hidden_act`).
    _primitive("activation", "activation(x: Tensor[*S; T: Float], kind) -> Tensor[*S; T]  "
               "(kind: an Activation member gelu_erf, gelu_tanh, relu, silu; or 0..3)", _activation, (2,),
               attrs=(("kind", ACTIVATION),), lower=_lower_activation, kind=UNARY),
    _primitive("cumsum", "cumsum(x: Tensor[*S; T], axis) -> Tensor[*S; T]  (running sum along the axis)",
               _cumsum, (2,), attrs=_AXIS, lower=_lower_axis, kind=SCAN),
    _primitive("concat", "concat(a: Tensor[..., N, ...; T], b: Tensor[..., M, ...; T], axis) -> "
               "Tensor[..., N + M, ...; T]  (other axes equal, or 1 and repeated)", _concat, (3,), attrs=_AXIS,
               lower=_lower_concat, kind=STRUCTURED),
    _primitive("take", "take(table: Tensor[N, *R; T], ids: Tensor[*S; I: Int]) -> Tensor[*S, *R; T]", _take, (2,),
               kind=STRUCTURED),
    _primitive("reshape", "reshape(x: Tensor[*S; T], [d1, ..., dn]) -> Tensor[d1, ..., dn; T]  "
               "(element count proven equal)", _reshape, (2,), attrs=(("shape", DIMS),), lower=_lower_reshape,
               rearranges=True, **_ZERO_MOVEMENT),
    _primitive("permute", "permute(x: Tensor[d0, ..., dn; T], [p0, ..., pn]) -> Tensor[dp0, ..., dpn; T]",
               _permute, (2,), attrs=(("perm", INTS),), lower=_lower_permute, rearranges=True, **_ZERO_MOVEMENT),
    _primitive("iota", "iota<I: Int>(N: Dim) -> Tensor[N; I]  (0, 1, ..., N - 1)", _iota, dtype_generics=1,
               attrs=(("n", DIM), ("dtype", DTYPE)), lower=_lower_iota, kind=STRUCTURED),
    _primitive("cast", "cast<U>(x: Tensor[*S; T] | Dim) -> Tensor[*S; U]", _cast, dtype_generics=1,
               attrs=(("dtype", DTYPE),), lower=_lower_cast, kind=UNARY, zero_fill=ZERO_IF_ALL),
    # What lowering makes of operators (`a + b`, `-x`) and of indexing (`x[:, 0]`).
    *(OpDef(name, kind=ELEMENTWISE, zero_fill=ZERO_IF_ANY if name == "mul" else None, operator=operator,
            commutative=name in ("add", "mul"))
      for name, operator in (("add", "+"), ("sub", "-"), ("mul", "*"), ("div", "/"))),
    OpDef("neg", kind=UNARY, zero_fill=ZERO_IF_ALL),
    OpDef("index", (("items", INDEX_ITEMS),), **_ZERO_MOVEMENT),
    # What the packing pass (`linnet.middle.packing`) makes; no program calls them by name.
    # `pack_index(keep: [B, S; int])` -> `[Tokens; i64]`: the row-major flat positions where keep
    # is nonzero (`dim` names the count, a dim only the run time knows).  `pack_rows(x, rows)`
    # gathers those positions of `x: [*P, B, S, *R]` (B at `axis`) into `[*P, Tokens, *R]`;
    # `unpack_rows(x, slots)` puts them back: `slots: [B, S; i64]` holds 1 + the packed row of
    # each kept position and 0 elsewhere, and the positions not kept read 0.
    *(OpDef(name, attrs, kind=STRUCTURED, made_by=_PACKING) for name, attrs in (("pack_index", (("dim", DIM),)),
                                                              ("pack_rows", _AXIS), ("unpack_rows", _AXIS))),
]

#: Every op of the lowered program, by name.
OPS: dict[str, OpDef] = {op.name: op for op in _RECORDS}
#: The ops a program calls by name, for the checker (`linnet.prims.PRIMS` is this table).
PRIMS: dict[str, OpDef] = {name: op for name, op in OPS.items() if op.is_primitive}


def named(test: Callable[[OpDef], bool]) -> frozenset[str]:
    """The names of the ops whose record passes `test`: how a pass gets a set of ops from
    their traits (`named(lambda op: op.elementwise)`)."""
    return frozenset(name for name, op in OPS.items() if test(op))


def attr_problem(name: str, attrs: tuple[tuple[str, object], ...]) -> str | None:
    """Why an op's name or attrs do not fit the registry, or None when they do."""
    op = OPS.get(name)
    if op is None:
        return f"the op `{name}` is not in the registry"
    given, schema = dict(attrs), dict(op.attrs)
    if len(given) != len(attrs) or set(given) != set(schema):
        return f"`{name}` has attrs {sorted(given)}; its schema is ({op.schema()})"
    for attr, value in given.items():
        if not schema[attr].accepts(value):
            return f"`{name}` attr `{attr}` is {value!r}, not a {schema[attr].text}"
    return None


# ------------------------------------------------------------- backend tables


class Emissions(dict):
    """One backend's emission per op (op name -> function), and the ops it declares it cannot
    express (`refusals`: op name -> reason).  `base` starts it from another table, as a
    language-family table that backends extend (pysource's Python operators)."""

    def __init__(self, backend: str, base: Mapping[str, Callable] = ()):
        super().__init__(base)
        self.backend = backend
        self.refusals: dict[str, str] = dict(getattr(base, "refusals", {}))

    def register(self, *names: str) -> Callable:
        """Decorator: `fn` emits each of `names`."""

        def add(fn: Callable) -> Callable:
            for name in names:
                self.add(name, fn)
            return fn

        return add

    def add(self, name: str, fn: Callable) -> None:
        if name not in OPS:
            raise KeyError(f"{self.backend}: no op `{name}` in the registry")
        self[name] = fn
        self.refusals.pop(name, None)

    def refuse(self, name: str, reason: str) -> None:
        if name not in OPS:
            raise KeyError(f"{self.backend}: no op `{name}` in the registry")
        self.pop(name, None)
        self.refusals[name] = reason

    def missing(self) -> list[str]:
        """Ops with neither an emission nor a declared refusal."""
        return [name for name in OPS if name not in self and name not in self.refusals]

    def why_not(self, name: str) -> str:
        """The message for an op this table has no emission for."""
        if name in self.refusals:
            return f"the {self.backend} backend cannot express `{name}`: {self.refusals[name]}"
        return f"the {self.backend} backend has no emission for `{name}`"
