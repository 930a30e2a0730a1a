"""Primitive operations: the type rules the checker applies to their calls.

Each primitive's record in the op registry (`linnet.ops`) holds its one-line signature (the
same text docs/language.md shows) and one of the rules here, which computes its result type
from the argument types, failing with a reason when they do not fit.  Rules see a
`PrimCall`, which carries the argument types, the explicit dtype generics (`cast<f32>`,
`iota<i32>`), the facts in scope and a way to fail with a span.  `PRIMS` (name -> record)
is importable from here for the checker.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn, Protocol

from . import codes
from .diagnostics import Span
from .dims import DimExpr, const
from .types import WEAK_INT, DimT, DType, ListT, MemberT, TensorT, Type, Variadic, is_float, is_int, scalar


class PrimContext(Protocol):
    def fail(self, code: codes.ErrorCode, message: str, span: Span, *notes) -> NoReturn: ...

    def broadcast(self, a: TensorT, b: TensorT, span: Span) -> TensorT: ...

    def dims_equal(self, a: DimExpr, b: DimExpr) -> bool: ...

    def decide(self, a: DimExpr, op: str, b: DimExpr) -> bool | None: ...

    def same_numel(self, a: tuple, b: tuple) -> bool: ...


@dataclass
class PrimCall:
    name: str
    dtype_args: list[DType]
    args: list[Type]
    arg_spans: list[Span]
    span: Span
    ctx: PrimContext

    def fail(self, message: str, arg: int | None = None, code: codes.ErrorCode = codes.BAD_OPERAND) -> NoReturn:
        self.ctx.fail(code, message, self.arg_spans[arg] if arg is not None else self.span)

    def tensor(self, i: int, what: str = "a tensor") -> TensorT:
        t = self.args[i]
        if isinstance(t, DimT) and t.expr.as_int() is not None:
            return scalar(WEAK_INT, weak=True)  # an integer literal takes the other operand's dtype
        if not isinstance(t, TensorT):
            self.fail(f"argument {i + 1} of `{self.name}` must be {what}, found {t}", i)
        return t

    def float_tensor(self, i: int) -> TensorT:
        t = self.tensor(i, "a float tensor")
        if t.weak and not t.dims:
            return scalar("f32", weak=True)  # `rsqrt(2)`: a literal is as good as a float
        if not is_float(t.dtype):
            self.fail(f"`{self.name}` needs a float tensor, found dtype {t.dtype}", i, code=codes.DTYPE_MISMATCH)
        return t

    def static_int(self, i: int, what: str) -> int:
        t = self.args[i]
        value = t.expr.as_int() if isinstance(t, DimT) else None
        if value is None:
            self.fail(f"{what} of `{self.name}` must be an integer literal, found {t}", i)
        return value

    def known_rank(self, i: int, t: TensorT) -> int:
        if t.rank is None:
            self.fail(f"`{self.name}` needs a tensor of known rank, found {t}", i, code=codes.BAD_INDEX)
        return t.rank


def _unary_float(call: PrimCall) -> Type:
    return call.float_tensor(0)


def _binary_broadcast(call: PrimCall) -> Type:
    return call.ctx.broadcast(call.tensor(0), call.tensor(1), call.span)


def _compare(call: PrimCall) -> Type:
    out = call.ctx.broadcast(call.tensor(0), call.tensor(1), call.span)
    return TensorT(out.dims, "bool")


def _axis(call: PrimCall, t: TensorT, arg: int) -> int:
    """A literal axis, negative from the end; with `*S` dims only axes outside it are allowed."""
    axis = call.static_int(arg, "the axis")
    n = len(t.dims)
    variadic_at = next((i for i, d in enumerate(t.dims) if isinstance(d, Variadic)), None)
    index = axis + n if axis < 0 else axis
    if not 0 <= index < n:
        call.fail(f"axis {axis} is out of range for {t} (rank {n})", arg, code=codes.AXIS_OUT_OF_RANGE)
    if variadic_at is not None and (axis >= 0 and index >= variadic_at or axis < 0 and index <= variadic_at):
        call.fail(f"axis {axis} of {t} falls inside the variadic dims; count from the other end", arg,
                  code=codes.AXIS_OUT_OF_RANGE)
    return index


def _reduce(call: PrimCall) -> Type:
    t = call.tensor(0)
    index = _axis(call, t, 1)
    dims = list(t.dims)
    dims[index] = const(1)  # reductions keep the axis so the result broadcasts back
    return TensorT(tuple(dims), t.dtype)


def _softmax(call: PrimCall) -> Type:
    t = call.float_tensor(0)
    if len(call.args) == 2:
        _axis(call, t, 1)
    elif not t.dims:
        call.fail("`softmax` needs at least one axis", 0)
    return t


def _matmul(call: PrimCall) -> Type:
    a, b = call.float_tensor(0), call.float_tensor(1)
    if len(a.dims) < 2 or len(b.dims) < 2 or isinstance(a.dims[-1], Variadic) or isinstance(b.dims[-2], Variadic):
        call.fail(f"`matmul` needs [..., M, K] and [..., K, N], found {a} and {b}", code=codes.SHAPE_MISMATCH)
    if isinstance(a.dims[-2], Variadic) and len(b.dims) != 2:
        call.fail(f"`matmul` of {a} needs a plain matrix on the right, found {b}", code=codes.SHAPE_MISMATCH)
    if a.dtype != b.dtype:
        call.fail(f"`matmul` operands differ in dtype: {a.dtype} and {b.dtype}", code=codes.DTYPE_MISMATCH)
    k_a, k_b = a.dims[-1], b.dims[-2]
    if not call.ctx.dims_equal(k_a, k_b):
        call.fail(f"`matmul` inner dims differ: the last dim of {a} is {k_a}, but the second-to-last "
                  f"dim of {b} is {k_b}", code=codes.SHAPE_MISMATCH)
    batch = call.ctx.broadcast(TensorT(a.dims[:-2], a.dtype), TensorT(b.dims[:-2], b.dtype), call.span)
    return TensorT(batch.dims + (a.dims[-2], b.dims[-1]), a.dtype)


def _transpose(call: PrimCall) -> Type:
    t = call.tensor(0)
    if len(t.dims) < 2 or any(isinstance(d, Variadic) for d in t.dims[-2:]):
        call.fail(f"`transpose` swaps the last two dims and needs at least two, found {t}", 0,
                  code=codes.SHAPE_MISMATCH)
    return TensorT(t.dims[:-2] + (t.dims[-1], t.dims[-2]), t.dtype)


def _take(call: PrimCall) -> Type:
    table, ids = call.tensor(0), call.tensor(1)
    if not table.dims or isinstance(table.dims[0], Variadic):
        call.fail(f"`take` gathers rows of a table [N, ...], found {table}", 0, code=codes.SHAPE_MISMATCH)
    if not is_int(ids.dtype):
        call.fail(f"`take` indices must be integers, found dtype {ids.dtype}", 1, code=codes.DTYPE_MISMATCH)
    return TensorT(ids.dims + table.dims[1:], table.dtype)


def _static_list(call: PrimCall, i: int, what: str) -> ListT:
    t = call.args[i]
    if not isinstance(t, ListT):
        call.fail(f"{what} of `{call.name}` must be a list literal such as [0, 2, 1, 3], found {t}", i)
    return t


def _reshape(call: PrimCall) -> Type:
    t = call.tensor(0)
    call.known_rank(0, t)
    target = _static_list(call, 1, "the target shape")
    negative = [d for d in target.items if call.ctx.decide(d, "<", const(0))]
    if negative:  # a common habit from numpy/torch, where -1 means "infer this dim"
        call.fail(f"reshape target dims cannot be negative, found {negative[0]}; Linnet does not infer "
                  f"a -1 dim, write it out (e.g. D / Heads)", 1, code=codes.RESHAPE_COUNT)
    if not call.ctx.same_numel(t.dims, target.items):
        call.fail(f"cannot reshape {t} to [{', '.join(map(str, target.items))}]: "
                  f"the element counts {_product(t.dims)} and {_product(target.items)} cannot be proven equal",
                  code=codes.RESHAPE_COUNT)
    return TensorT(target.items, t.dtype)


def _product(dims) -> str:
    return " * ".join(f"({d})" if len(str(d).split()) > 1 else str(d) for d in dims) or "1"


def _permute(call: PrimCall) -> Type:
    t = call.tensor(0)
    rank = call.known_rank(0, t)
    perm_t = _static_list(call, 1, "the permutation")
    perm = [d.as_int() for d in perm_t.items]
    if any(p is None for p in perm) or sorted(perm) != list(range(rank)):
        call.fail(f"[{', '.join(map(str, perm_t.items))}] is not a permutation of the {rank} axes of {t}",
                  1, code=codes.NOT_A_PERMUTATION)
    return TensorT(tuple(t.dims[p] for p in perm), t.dtype)


def _iota(call: PrimCall) -> Type:
    (dtype,) = call.dtype_args
    n = call.args[0]
    if not isinstance(n, DimT):
        call.fail(f"`iota` takes a dim such as `S`, found {n}", 0)
    if not is_int(dtype):
        call.fail(f"`iota` makes integer indices; {dtype} is not an integer dtype", code=codes.DTYPE_MISMATCH)
    if call.ctx.decide(n.expr, "<", const(0)):
        call.fail(f"`iota` needs a count of at least 0, found {n.expr}", 0, code=codes.INDEX_OUT_OF_BOUNDS)
    return TensorT((n.expr,), dtype)


def _cast(call: PrimCall) -> Type:
    (dtype,) = call.dtype_args
    t = call.args[0]
    if isinstance(t, DimT):
        return scalar(dtype, weak=True)  # a number known from dims adapts like a literal
    if not isinstance(t, TensorT):
        call.fail(f"`cast` takes a tensor or a dim, found {t}", 0)
    return TensorT(t.dims, dtype)


def _select(call: PrimCall) -> Type:
    cond, a, b = call.tensor(0), call.tensor(1), call.tensor(2)
    if cond.dtype != "bool":
        call.fail(f"the condition of `select` must be a bool tensor, found {cond.dtype}", 0, code=codes.DTYPE_MISMATCH)
    value = call.ctx.broadcast(a, b, call.span)
    # Only the condition's shape joins the values'; its dtype is bool whatever theirs is.
    shape = call.ctx.broadcast(TensorT(cond.dims, value.dtype, value.weak), value, call.span)
    return TensorT(shape.dims, value.dtype, value.weak)


def _dropout(call: PrimCall) -> Type:
    """`dropout(x, rate)`: x itself in eval mode, so its type; the rate is one number."""
    t = call.float_tensor(0)
    rate = call.tensor(1, "a number (the drop rate)")
    if rate.dims or not (rate.weak or is_float(rate.dtype)):
        call.fail(f"the rate of `dropout` must be one float number (a literal, a Real generic or a scalar "
                  f"parameter), found {rate}", 1)
    return t


def _activation(call: PrimCall) -> Type:
    """`activation(x, kind)`: an elementwise function of x picked when the model is built, by an
    `Activation` generic (`Act`) or, as before that kind existed, a number (a literal or a Real
    generic); its type is x's."""
    t = call.float_tensor(0)
    if isinstance(call.args[1], MemberT):
        if call.args[1].kind != "Activation":
            call.fail(f"the kind of `activation` must be an Activation member, found {call.args[1]}", 1,
                      code=codes.BAD_MEMBER_ARGUMENT)
        return t
    kind = call.tensor(1, "an Activation generic or a number (the kind of activation)")
    if kind.dims or not kind.weak:
        call.fail(f"the kind of `activation` must be one number known when the model is built (a literal or "
                  f"a Real generic), found {kind}", 1)
    return t


def _cumsum(call: PrimCall) -> Type:
    t = call.tensor(0)
    _axis(call, t, 1)
    return TensorT(t.dims, t.dtype)


def _concat(call: PrimCall) -> Type:
    """Join two tensors of one rank along an axis; every other axis must agree, or be 1 on one
    side, which is repeated to the other's size (prepending a learned [1, 1, D] token to a
    [B, N, D] batch gives [B, N + 1, D], as `torch.cat` after an `expand` would)."""
    a, b = call.tensor(0), call.tensor(1)
    rank_a, rank_b = call.known_rank(0, a), call.known_rank(1, b)
    if rank_a != rank_b:
        call.fail(f"`concat` joins tensors of one rank, found {a} (rank {rank_a}) and {b} (rank {rank_b})",
                  code=codes.SHAPE_MISMATCH)
    if a.dtype != b.dtype and not (a.weak or b.weak):
        call.fail(f"`concat` operands differ in dtype: {a.dtype} and {b.dtype}", code=codes.DTYPE_MISMATCH)
    if a.weak or b.weak:
        call.fail("`concat` joins tensors, not literals", 0 if a.weak else 1)
    index = _axis(call, a, 2)
    dims = []
    for i, (da, db) in enumerate(zip(a.dims, b.dims)):
        if i == index:
            dims.append(da + db)
        elif call.ctx.dims_equal(da, db) or call.ctx.dims_equal(db, const(1)):
            dims.append(da)
        elif call.ctx.dims_equal(da, const(1)):
            dims.append(db)
        else:
            call.fail(f"`concat` along axis {index} needs the other axes to agree or be 1: axis {i} is {da} "
                      f"in {a} and {db} in {b}", code=codes.SHAPE_MISMATCH)
    return TensorT(tuple(dims), a.dtype)


def __getattr__(name: str):
    # The table of primitives is the op registry's (`linnet.ops`), which imports the rules
    # above; it is looked up here on first use, so the checker's `from .prims import PRIMS`
    # works whichever of the two modules is imported first.
    if name == "PRIMS":
        from .ops import PRIMS

        return PRIMS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
