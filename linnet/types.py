"""The checker's types: tensors with symbolic dims, dims used as values, options and lists.

A tensor type is a tuple of dims and a dtype.  A dim is a `DimExpr` (see `linnet.dims`) or
a `Variadic` standing for any number of dims (`*S`).  A dtype is a concrete name (`"f32"`)
or a `DTypeVar` (a generic such as `T`).  Substitution replaces generics by what a call or an
instantiation binds them to; it is how signatures are specialised and how lowering makes
everything concrete.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Union

from . import dtypes
from .dims import DimExpr

# The dtype names come from the one table in `linnet.dtypes`, in its order (messages list them so).
FLOAT_DTYPES = dtypes.names("float")
INT_DTYPES = dtypes.names("int")
ALL_DTYPES = dtypes.names()


def number_range(dtype: str) -> tuple[float, float]:
    """The smallest and largest number a dtype holds (finite values, for floats)."""
    found = dtypes.lookup("name", dtype)
    return found.number_range() if found is not None else (-float("inf"), float("inf"))

#: Generic parameter kinds and what may bind them.
DIM_KIND, SHAPE_KIND = "Dim", "Shape"
#: A number known when the model is built (a dropout rate): blocks only, used as a weak scalar.
REAL_KIND = "Real"
DTYPE_KINDS = {"Float": FLOAT_DTYPES, "Int": INT_DTYPES, "DType": ALL_DTYPES}
#: Enum-like kinds: a generic of one is bound to one of its named members (`Act: Activation =
#: silu`). The one list of each kind's members; `activation`'s kinds (linnet.ops) are these.
MEMBER_KINDS = {"Activation": ("gelu_erf", "gelu_tanh", "relu", "silu")}
GENERIC_KINDS = (DIM_KIND, SHAPE_KIND, *DTYPE_KINDS, REAL_KIND, *MEMBER_KINDS)


@dataclass(frozen=True)
class Member:
    """A member of an enum-like kind (`gelu_erf` of `Activation`), what such a generic binds to."""

    kind: str
    name: str

    @property
    def index(self) -> int:
        return MEMBER_KINDS[self.kind].index(self.name)

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class MemberVar:
    """A generic of an enum-like kind standing for the member an instantiation gives it."""

    name: str
    kind: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class MemberT:
    """The type of a member-kind generic used as a value (`activation(x, Act)`)."""

    kind: str

    def __str__(self) -> str:
        return f"an {self.kind} member" if self.kind[0] in "AEIOU" else f"a {self.kind} member"


@dataclass(frozen=True)
class RealVar:
    """A `Real` generic standing for the number an instantiation gives it (`HiddenDropout`)."""

    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class DTypeVar:
    name: str
    kind: str  # "Float", "Int" or "DType"

    def __str__(self) -> str:
        return self.name


DType = Union[str, DTypeVar]


def dtype_kind_ok(dtype: DType, kind: str) -> bool:
    """Does a dtype (concrete or generic) belong to a generic kind such as Float?"""
    if isinstance(dtype, DTypeVar):
        return dtype.kind == kind or kind == "DType"
    return dtype in DTYPE_KINDS[kind]


def is_float(dtype: DType) -> bool:
    return dtype_kind_ok(dtype, "Float")


def is_int(dtype: DType) -> bool:
    return dtype_kind_ok(dtype, "Int")


#: The dtype of a weak scalar written as an integer literal (`1`, `0`); a float literal's is f32.
WEAK_INT = "i64"


def weak_fits(weak_dtype: DType, other: DType) -> bool:
    """Whether a literal of `weak_dtype` may take the dtype `other`: any literal joins a
    float tensor, and an integer literal joins an integer tensor too."""
    return is_float(other) or (weak_dtype == WEAK_INT and is_int(other))


@dataclass(frozen=True)
class Variadic:
    """`*S`: a run of dims bound as a whole (`*S` := `[B, S]`)."""

    name: str

    def __str__(self) -> str:
        return f"*{self.name}"


Dim = Union[DimExpr, Variadic]


@dataclass(frozen=True)
class TensorT:
    dims: tuple[Dim, ...]
    dtype: DType
    # A literal scalar such as `1e-12` or `0.5`: it takes the dtype of the tensor it meets.
    weak: bool = False

    @property
    def rank(self) -> int | None:
        return None if any(isinstance(d, Variadic) for d in self.dims) else len(self.dims)

    def __str__(self) -> str:
        dims = ", ".join(str(d) for d in self.dims)
        return f"Tensor[{dims}; {self.dtype}]" if dims else f"Tensor[; {self.dtype}]"


@dataclass(frozen=True)
class DimT:
    """A dim used as a value: `S` in `iota<i32>(S)`, `D / Heads` in `cast<f32>(D / Heads)`."""

    expr: DimExpr

    def __str__(self) -> str:
        return f"dim {self.expr}"


@dataclass(frozen=True)
class ListT:
    """A list literal of integers or dims: a permutation or a reshape target."""

    items: tuple[DimExpr, ...]

    def __str__(self) -> str:
        return "[" + ", ".join(str(i) for i in self.items) + "]"


@dataclass(frozen=True)
class OptionT:
    """`Option[X]` as declared; each call passes either `some(x)` or `none`."""

    inner: "Type"

    def __str__(self) -> str:
        return f"Option[{self.inner}]"


@dataclass(frozen=True)
class SomeT:
    inner: "Type"

    def __str__(self) -> str:
        return f"some({self.inner})"


@dataclass(frozen=True)
class NoneT:
    def __str__(self) -> str:
        return "none"


@dataclass(frozen=True)
class SubT:
    """A sub-block (or one element of a sub array) that functions are called on."""

    block: str  # qualified block name, `module::Block`
    bindings: tuple[tuple[str, object], ...]  # the block's generics as bound by the declaration
    path: str  # the member name, `norm`, or the loop variable for an array element

    def __str__(self) -> str:
        return f"sub-block {self.block.split('::')[-1]}"


@dataclass(frozen=True)
class SubArrayT:
    element: SubT
    count: DimExpr

    def __str__(self) -> str:
        return f"[{self.element}; {self.count}]"


@dataclass(frozen=True)
class TupleT:
    """A function's several results (`-> (logits: Tensor[...], cache: Tensor[...])`): a result
    type, and the type of a call of such a function, which only `let (a, b) =` and `return` take.
    `names` is all None when the items are not named."""

    items: tuple["Type", ...]
    names: tuple[str | None, ...]

    def __str__(self) -> str:
        return "(" + ", ".join(f"{n}: {t}" if n else str(t) for n, t in zip(self.names, self.items)) + ")"


Type = Union[TensorT, DimT, ListT, OptionT, SomeT, NoneT, SubT, SubArrayT, MemberT, TupleT]

#: What a generic is bound to: a dim, a dtype, a run of dims for a variadic, a Real's
#: number (a float, or a `RealVar` naming the enclosing block's Real generic), or a member
#: (a `Member`, or a `MemberVar` naming the enclosing block's generic of that kind).
Binding = Union[DimExpr, DType, tuple, float, RealVar, Member, MemberVar]


def dims_only(env: Mapping[str, Binding]) -> dict[str, DimExpr]:
    """The dim bindings of an environment (dropping dtypes and variadic runs)."""
    return {k: v for k, v in env.items() if isinstance(v, (DimExpr, int))}


def substitute_dims(dims: tuple[Dim, ...], env: Mapping[str, Binding]) -> tuple[Dim, ...]:
    out: list[Dim] = []
    dim_env = None
    for d in dims:
        if isinstance(d, Variadic):
            bound = env.get(d.name)
            if isinstance(bound, tuple):
                out.extend(bound)
            else:
                out.append(d)
        else:
            if dim_env is None:
                dim_env = dims_only(env)
            out.append(d.substitute(dim_env))
    return tuple(out)


def substitute_dtype(dtype: DType, env: Mapping[str, Binding]) -> DType:
    if isinstance(dtype, DTypeVar):
        bound = env.get(dtype.name)
        if isinstance(bound, (str, DTypeVar)):
            return bound
    return dtype


def substitute(t: Type, env: Mapping[str, Binding]) -> Type:
    """Replace generics by their bindings throughout a type."""
    if isinstance(t, TensorT):
        return TensorT(substitute_dims(t.dims, env), substitute_dtype(t.dtype, env), t.weak)
    if isinstance(t, DimT):
        return DimT(substitute_dims((t.expr,), env)[0])
    if isinstance(t, ListT):
        return ListT(tuple(substitute_dims(t.items, env)))
    if isinstance(t, OptionT):
        return OptionT(substitute(t.inner, env))
    if isinstance(t, SomeT):
        return SomeT(substitute(t.inner, env))
    if isinstance(t, TupleT):
        return TupleT(tuple(substitute(i, env) for i in t.items), t.names)
    return t


def scalar(dtype: DType, weak: bool = False) -> TensorT:
    return TensorT((), dtype, weak)


def format_binding(value: Binding) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)


@dataclass(frozen=True)
class ErrorT:
    """The type of an expression that already failed to check: it silences follow-on errors."""

    def __str__(self) -> str:
        return "<error>"
