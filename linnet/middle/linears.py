"""Dense layers recognised by what their body computes, not by the block's name.

A method is a dense layer when its body is `matmul(x, W)` or `matmul(x, transpose(W))`, plus
an optional bias `b` (either side of the add), where `x` is its one argument and `W` (rank 2)
and `b` (rank 1) are params of its block.  std's `Linear` and `LinearNoBias` store W as
[Out, In] and read it transposed; GPT-2's `Conv1D` stores it [In, Out] and reads it as it
is.  The passes that rewrite dense layers (`linnet.middle.optimize`) and the torch backend's
per-machine kernel choice ask `dense_form` instead of matching `std.nn.linear::Linear`.

The product may pass through locals first (`var y = matmul(x, transpose(W)); return y`), and
the bias may sit in a sub-block array of at most one element whose method is `x + b`
(std's `MaybeBiasLinear`: Qwen2's biased q/k/v with `Biased = 1`, Llama's bias-free ones with
0): the body is evaluated symbolically, a one-pass `static for` over that array becoming
`+ b`, and the form names such a bias by its path under the block (`bias.0.bias`).

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
    bias: str | None           # the bias param's path under the block (`bias`, `bias.0.bias`), None without one
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
    if fn.block is None or len(fn.params) != 1:
        return None
    if not structural() and fn.source != LINEAR:
        return None
    block = program.blocks[fn.block]
    params = dict(block.params)
    returned = _returned(program, block, fn.body)
    if returned is None:
        return None
    product, bias = _split_bias(returned)
    if not (isinstance(product, ir.Op) and product.op == "matmul" and isinstance(product.args[0], ir.Ref)
            and product.args[0].name == fn.params[0][0]):
        return None
    weight, out_in = product.args[1], False
    if isinstance(weight, ir.Op) and weight.op == "transpose":
        weight, out_in = weight.args[0], True
    if not (isinstance(weight, ir.ParamRef) and weight.type.rank == 2 and weight.name in params):
        return None
    in_dim, out_dim = weight.type.dims[::-1] if out_in else weight.type.dims
    if bias is not None and not (isinstance(bias, (ir.ParamRef, _SubParam)) and bias.type.dims == (out_dim,)):
        return None
    if isinstance(bias, ir.ParamRef) and bias.name not in params:
        return None
    own = {weight.name} | ({bias.name} if isinstance(bias, ir.ParamRef) else set())
    if whole_block:
        # Nothing but what the body reads: the params, and the bias's one-element array (or an
        # empty one, which holds nothing).
        held = [s for s in block.subs if s.count != 0]
        if set(params) != own or held != ([bias.sub] if isinstance(bias, _SubParam) else []):
            return None
    if not structural() and (bias is None or not out_in):
        return None
    return DenseForm(weight.name, None if bias is None else bias.name, out_in, in_dim, out_dim, weight.type.dtype)


@dataclass(frozen=True)
class _SubParam:
    """The bias param of a one-element sub-block array, read by the body's `static for`."""

    sub: ir.Sub
    param: str
    type: ir.TensorType

    @property
    def name(self) -> str:
        return f"{self.sub.name}.0.{self.param}"


def _returned(program: ir.Program, block: ir.Block, body) -> ir.Expr | None:
    """What the body returns, with its locals substituted and a one-pass bias loop made an
    add of a `_SubParam`; None for anything else (a call, a loop of another kind)."""
    env: dict[str, ir.Expr] = {}

    def value(e: ir.Expr) -> ir.Expr | None:
        if any(isinstance(x, ir.Call) for x in ir.walk(e)):
            return None
        return ir.map_expr(e, lambda x: env.get(x.name) if isinstance(x, ir.Ref) and x.name in env else None)

    subs = {s.name: s for s in block.subs}
    for stmt in body:
        if isinstance(stmt, (ir.Let, ir.Assign)):
            v = value(stmt.value)
            if v is None:
                return None
            env[stmt.name] = v
        elif isinstance(stmt, ir.Loop):
            sub = subs.get(stmt.member)
            if sub is None or sub.count is None or stmt.collect is not None:
                return None
            passes = stmt.passes(sub.count)
            if len(passes) == 0:
                continue
            added = _bias_pass(program, stmt, sub)
            if len(passes) != 1 or added is None or added[0] not in env:
                return None
            name, bias = added
            env[name] = ir.Op("add", (env[name], bias), env[name].type, stmt.line)
        elif isinstance(stmt, ir.Return):
            return value(stmt.value)
        else:
            return None
    return None


def _bias_pass(program: ir.Program, loop: ir.Loop, sub: ir.Sub) -> tuple[str, _SubParam] | None:
    """(local, bias) when the loop's body is `y = b.forward(y)` and that method is `x + bias`
    over the element block's one param."""
    if len(loop.body) != 1 or not isinstance(loop.body[0], ir.Assign):
        return None
    stmt = loop.body[0]
    call = stmt.value
    if not (isinstance(call, ir.Call) and call.receiver == loop.var and len(call.args) == 1
            and isinstance(call.args[0], ir.Ref) and call.args[0].name == stmt.name):
        return None
    method = program.functions[call.function]
    element = program.blocks[sub.block]
    if method.block != sub.block or element.subs or len(element.params) != 1 or len(method.params) != 1 \
            or len(method.body) != 1 or not isinstance(method.body[0], ir.Return):
        return None
    e = method.body[0].value
    if not (isinstance(e, ir.Op) and e.op == "add" and len(e.args) == 2):
        return None
    x, b = e.args
    if isinstance(x, ir.ParamRef):
        x, b = b, x
    (param, t), = element.params
    if not (isinstance(x, ir.Ref) and x.name == method.params[0][0] and isinstance(b, ir.ParamRef)
            and b.name == param and t.rank == 1):
        return None
    return stmt.name, _SubParam(sub, param, t)


def _split_bias(e: ir.Expr) -> tuple[ir.Expr, ir.Expr | None]:
    """(the product, the bias) of `product + bias` in either order; (e, None) for no add."""
    if isinstance(e, ir.Op) and e.op == "add" and len(e.args) == 2:
        first, second = e.args
        if isinstance(second, (ir.ParamRef, _SubParam)):
            return first, second
        if ops.OPS["add"].commutative and isinstance(first, (ir.ParamRef, _SubParam)):
            return second, first
    return e, None
