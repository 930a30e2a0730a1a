"""`EMISSIONS`: each IR op as ONNX nodes, one emission per op of the registry (`linnet.ops`),
tinygrad's `code_for_op` for ONNX.  An emission takes the `Site` (emitter, node scope, doc
string, result element type, frame), the op and its arguments' value names, and returns the
result's value name."""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..middle import ir
from ..dims import const
from ..ops import Emissions
from . import onnx_fused
from .onnx_emitter import GraphEmitter, _Frame
from .onnx_files import elem_type

_BINARY = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "matmul": "MatMul", "less": "Less",
           "greater": "Greater", "equal": "Equal", "maximum": "Max", "minimum": "Min"}
_UNARY = {"neg": "Neg", "erf": "Erf", "tanh": "Tanh", "exp": "Exp", "log": "Log", "sqrt": "Sqrt",
          "sigmoid": "Sigmoid", "sin": "Sin", "cos": "Cos"}
_REDUCE = {"sum": "ReduceSum", "mean": "ReduceMean", "max": "ReduceMax"}


@dataclass(frozen=True)
class Site:
    """Where one op's nodes go: the emitter, the node-name scope, the doc string, the result's
    element type, and the frame of the function being inlined."""

    em: GraphEmitter
    scope: str
    doc: str
    out: int
    frame: _Frame

    def node(self, op_type: str, inputs: list[str], **attrs) -> str:
        """A node whose output has the op's result type."""
        return self.em.node(op_type, inputs, self.out, scope=self.scope, doc=self.doc, **attrs)


#: IR op -> how it is written as ONNX nodes: (site, op, argument value names) -> result name.
EMISSIONS = Emissions("onnx")
for _name, _op_type in {**_BINARY, **_UNARY}.items():
    EMISSIONS.add(_name, lambda site, e, args, op_type=_op_type: site.node(op_type, args))


@EMISSIONS.register("dropout")
def _emit_dropout(site: Site, e: ir.Op, args: list[str]) -> str:
    # An exported graph is for inference, where dropout is the identity; the node keeps the
    # place visible (its doc string points at the source line).
    return site.node("Identity", [args[0]])


@EMISSIONS.register("rsqrt")
def _emit_rsqrt(site: Site, e: ir.Op, args: list[str]) -> str:
    return site.node("Reciprocal", [site.node("Sqrt", args)])


@EMISSIONS.register("gelu_tanh")
def _emit_gelu_tanh(site: Site, e: ir.Op, args: list[str]) -> str:
    """`0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))`: opset 17 has no Gelu (it came in 20)."""
    (x,), dtype = args, e.type.dtype
    number = site.em._scalar
    cube = site.node("Pow", [x, number(3.0, dtype)])
    inner = site.node("Add", [x, site.node("Mul", [cube, number(0.044715, dtype)])])
    tanh = site.node("Tanh", [site.node("Mul", [inner, number(math.sqrt(2.0 / math.pi), dtype)])])
    return site.node("Mul", [site.node("Mul", [x, site.node("Add", [tanh, number(1.0, dtype)])]),
                             number(0.5, dtype)])


@EMISSIONS.register("activation")
def _emit_activation(site: Site, e: ir.Op, args: list[str]) -> str:
    """Each kind as std's function of that name is written (erf GELU in the form ONNX Runtime
    fuses into one Gelu kernel, as `_fused_gelu_erf`)."""
    (x,), kind, dtype = args, e.attr("kind"), e.type.dtype
    number = site.em._scalar
    if kind == "gelu_erf":
        erf = site.node("Erf", [site.node("Div", [x, number(1.4142135623730951, dtype)])])
        return site.node("Mul", [site.node("Mul", [x, site.node("Add", [erf, number(1.0, dtype)])]),
                                 number(0.5, dtype)])
    if kind == "gelu_tanh":
        return _emit_gelu_tanh(site, e, args)
    if kind == "relu":
        return site.node("Relu", [x])
    return site.node("Mul", [x, site.node("Sigmoid", [x])])  # silu


def transposed_param(e: ir.Op):
    """The 2-D param P of `matmul(x, transpose(P))` (a tied head: GPT-2's `lm_head` over
    `wte`), f32/f64, else None."""
    if e.op != "matmul" or e.type.dtype not in onnx_fused.GEMM_DTYPES or e.args[0].type.rank < 2:
        return None
    b = e.args[1]
    if isinstance(b, ir.Op) and b.op == "transpose" and isinstance(b.args[0], ir.ParamRef) \
            and b.args[0].type.rank == 2:
        return b.args[0]
    return None


def matmul_by_transposed_param(site: Site, e: ir.Op, x: str, param: str) -> str:
    """x @ P^T as one Gemm with transB=1 over x's rows, reading P as stored.  ORT folds a
    Transpose of a param into a transposed copy in every session opening the graph (154 MB
    per session for GPT-2's `wte`).  Only for `params_in_place` exports: a session that
    pre-packs keeps its packed copy either way, and where P is also read elsewhere (GPT-2's
    embedding Gather) the packing pages all of P in per session, which measured 273 MiB more
    for GPT-2 than the folded copy, which is released after packing (docs/backend-onnx.md)."""
    em, doc = site.em, site.doc + " (matmul by a transposed param: Gemm transB=1)"
    outputs, inputs = e.args[1].args[0].type.dims  # P is [Out, In], as a Linear's weight is declared
    if e.args[0].type.rank == 2:
        return em.node("Gemm", [x, param], site.out, scope=site.scope, doc=doc, transB=1)
    rows = em.node("Reshape", [x, em.shape((const(-1), inputs))], site.out, scope=site.scope,
                   doc=doc + ", rows flattened")
    y = em.node("Gemm", [rows, param], site.out, scope=site.scope, doc=doc, transB=1)
    dims = tuple(site.frame.resolve(d) for d in e.type.dims)
    shape = em.shape(dims) if all(onnx_fused._known(em, d) for d in dims) else onnx_fused._leading_shape(em, x, outputs, site.scope, doc)
    return em.node("Reshape", [y, shape], site.out, scope=site.scope, doc=doc + ", rows restored")


@EMISSIONS.register("select")
def _emit_select(site: Site, e: ir.Op, args: list[str]) -> str:
    return site.node("Where", args)


@EMISSIONS.register("transpose")
def _emit_transpose(site: Site, e: ir.Op, args: list[str]) -> str:
    rank = e.args[0].type.rank
    return site.node("Transpose", args, perm=list(range(rank - 2)) + [rank - 1, rank - 2])


@EMISSIONS.register("permute")
def _emit_permute(site: Site, e: ir.Op, args: list[str]) -> str:
    return site.node("Transpose", args, perm=list(e.attr("perm")))


@EMISSIONS.register("softmax")
def _emit_softmax(site: Site, e: ir.Op, args: list[str]) -> str:
    return onnx_fused.softmax(site.em, args[0], e.type.dtype, e.attr("axis"), site.scope, site.doc)


@EMISSIONS.register(*_REDUCE)
def _emit_reduce(site: Site, e: ir.Op, args: list[str]) -> str:
    axis = e.attr("axis")
    if e.op == "sum":  # ReduceSum takes its axes as an input since opset 13
        return site.node("ReduceSum", [args[0], site.em.constant([axis], "i64", (1,))], keepdims=1)
    return site.node(_REDUCE[e.op], args, axes=[axis], keepdims=1)


@EMISSIONS.register("cumsum")
def _emit_cumsum(site: Site, e: ir.Op, args: list[str]) -> str:
    # keeps the input dtype (an INT32 mask stays INT32)
    return site.node("CumSum", [args[0], site.em.constant(e.attr("axis"), "i64")])


@EMISSIONS.register("concat")
def _emit_concat(site: Site, e: ir.Op, args: list[str]) -> str:
    axis, parts = e.attr("axis"), []
    for arg, name in zip(e.args, args):
        dims = arg.type.dims
        if any(i != axis and str(d) != str(r) for i, (d, r) in enumerate(zip(dims, e.type.dims))):
            # An axis of 1 where the result's is wider: Expand it (the join axis keeps its own size).
            name = site.node("Expand", [name, site.em.shape(tuple(dims[i] if i == axis else r
                                                                   for i, r in enumerate(e.type.dims)))])
        parts.append(name)
    return site.node("Concat", parts, axis=axis)


@EMISSIONS.register("take")
def _emit_take(site: Site, e: ir.Op, args: list[str]) -> str:
    return site.node("Gather", args, axis=0)


@EMISSIONS.register("reshape")
def _emit_reshape(site: Site, e: ir.Op, args: list[str]) -> str:
    return site.node("Reshape", [args[0], site.em.shape(tuple(e.attr("shape")))])


@EMISSIONS.register("iota")
def _emit_iota(site: Site, e: ir.Op, args: list[str]) -> str:
    em, dtype = site.em, e.attr("dtype")
    limit = em.node("Squeeze", [em.dim(e.attr("n"))], elem_type("i64"), scope=site.scope, doc=site.doc)
    limit = em.cast(limit, site.out, site.scope, site.doc)
    return site.node("Range", [em.constant(0, dtype), limit, em.constant(1, dtype)])


@EMISSIONS.register("cast")
def _emit_cast(site: Site, e: ir.Op, args: list[str]) -> str:
    return site.em.cast(args[0], elem_type(e.attr("dtype")), site.scope, site.doc)


@EMISSIONS.register("index")
def _emit_index(site: Site, e: ir.Op, args: list[str]) -> str:
    return site.em._index(e, args[0], site.frame, site.scope, site.doc)


@EMISSIONS.register("pack_index")
def _emit_pack_index(site: Site, e: ir.Op, args: list[str]) -> str:
    """NonZero over the flattened keep mask: [1, Tokens] int64 positions, squeezed to [Tokens]."""
    flat = site.em.node("Reshape", [args[0], site.em.constant([-1], "i64", (1,))], elem_type(e.args[0].type.dtype),
                        scope=site.scope, doc=site.doc)
    return site.node("Squeeze", [site.node("NonZero", [flat]), site.em.constant([0], "i64", (1,))])


@EMISSIONS.register("pack_rows")
def _emit_pack_rows(site: Site, e: ir.Op, args: list[str]) -> str:
    """B and S merged into one axis (Reshape), then a Gather of the kept rows along it."""
    axis, dims = e.attr("axis"), e.args[0].type.dims
    merged = dims[:axis] + (dims[axis] * dims[axis + 1],) + dims[axis + 2:]
    flat = site.node("Reshape", [args[0], site.em.shape(merged)])
    return site.node("Gather", [flat, args[1]], axis=axis)


@EMISSIONS.register("unpack_rows")
def _emit_unpack_rows(site: Site, e: ir.Op, args: list[str]) -> str:
    """A zero row in front of the packed rows (Pad), then a Gather by the [B, S] slots: each slot
    reads its row, and the positions that were not kept read the zero row."""
    axis, rank = e.attr("axis"), e.args[0].type.rank
    pads = [0] * (2 * rank)
    pads[axis] = 1
    padded = site.node("Pad", [args[0], site.em.constant(pads, "i64", (2 * rank,))])
    return site.node("Gather", [padded, args[1]], axis=axis)


