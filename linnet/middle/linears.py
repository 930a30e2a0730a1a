"""Dense layers recognised by what their body computes, not by the block's name.

A method is a dense layer when its body is `matmul(x, W)` or `matmul(x, transpose(W))`, plus
an optional bias `b` (either side of the add), where `x` is its one argument and `W` (rank 2)
and `b` (rank 1) are params of its block.  std's `Linear` and `LinearNoBias` store W as
[Out, In] and read it transposed; GPT-2's `Conv1D` stores it [In, Out] and reads it as it
is.  The passes that rewrite dense layers (`linnet.middle.optimize`) and the torch backend's
per-machine kernel choice ask `dense_form` instead of matching `std.nn.linear::Linear`.

`LINNET_STRUCTURAL_LINEARS=0` switches the recognition off: only std's `Linear` with a bias
is then a dense layer, as before it existed; the decoder bench uses it to measure both in
one run.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from . import ir
from .. import ops
from ..dims import DimExpr
from ..kernels import LINEAR

#: The environment variable that turns structural recognition off when set to 0.
SWITCH = "LINNET_STRUCTURAL_LINEARS"


def structural() -> bool:
    """Whether dense layers are recognised by structure (the default) or by std's name only."""
    return os.environ.get(SWITCH, "1") != "0"


@dataclass(frozen=True)
class DenseForm:
    """What a dense-layer method computes: `x W^T (+ b)` over its block's params."""

    weight: str                # the weight param's name
    bias: str | None           # the bias param's name, None without one
    out_in: bool               # the weight is stored [Out, In] (read transposed); else [In, Out]
    in_dim: DimExpr
    out_dim: DimExpr
    dtype: str

    @property
    def out_axis(self) -> int:
        """The weight's axis that runs over the outputs."""
        return 0 if self.out_in else 1


def dense_form(program: ir.Program, fn: ir.Function) -> DenseForm | None:
    """The dense layer `fn` is, or None.  The block must hold exactly the params the body reads
    and no subs, so a pass that replaces the block loses nothing."""
    return _form(program, fn, whole_block=True)


def dense_method(program: ir.Program, fn: ir.Function) -> DenseForm | None:
    """The dense product a method computes over params of a block that holds more (a tied LM
    head, `matmul(hidden, transpose(wte))` in a block whose `wte` the embedding reads too), or
    None; with structural recognition only.  Nothing may replace such a block, but a runtime
    may run the method itself on another kernel (`linnet.backends.torch_kernels`)."""
    if not structural():
        return None
    return _form(program, fn, whole_block=False)


def _form(program: ir.Program, fn: ir.Function, *, whole_block: bool) -> DenseForm | None:
    if fn.block is None or len(fn.params) != 1 or len(fn.body) != 1 or not isinstance(fn.body[0], ir.Return):
        return None
    if not structural() and fn.source != LINEAR:
        return None
    block = program.blocks[fn.block]
    params = dict(block.params)
    product, bias = _split_bias(fn.body[0].value)
    if not (isinstance(product, ir.Op) and product.op == "matmul" and isinstance(product.args[0], ir.Ref)
            and product.args[0].name == fn.params[0][0]):
        return None
    weight, out_in = product.args[1], False
    if isinstance(weight, ir.Op) and weight.op == "transpose":
        weight, out_in = weight.args[0], True
    if not (isinstance(weight, ir.ParamRef) and weight.type.rank == 2):
        return None
    in_dim, out_dim = weight.type.dims[::-1] if out_in else weight.type.dims
    if bias is not None and not (isinstance(bias, ir.ParamRef) and bias.type.dims == (out_dim,)):
        return None
    used = {weight.name} | ({bias.name} if bias is not None else set())
    if whole_block and (set(params) != used or block.subs):
        return None
    if not used <= set(params):
        return None
    if not structural() and (bias is None or not out_in):
        return None
    return DenseForm(weight.name, None if bias is None else bias.name, out_in, in_dim, out_dim, weight.type.dtype)


def _split_bias(e: ir.Expr) -> tuple[ir.Expr, ir.Expr | None]:
    """(the product, the bias) of `product + bias` in either order; (e, None) for no add."""
    if isinstance(e, ir.Op) and e.op == "add" and len(e.args) == 2:
        first, second = e.args
        if isinstance(second, ir.ParamRef):
            return first, second
        if ops.OPS["add"].commutative and isinstance(first, ir.ParamRef):
            return second, first
    return e, None
