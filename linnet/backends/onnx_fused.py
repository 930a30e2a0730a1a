"""Std functions written as one ONNX kernel each (`FUSED`, keyed by `linnet.kernels`):
LayerNormalization, attention as MatMul-Softmax-MatMul, Linear as one Gemm, the erf GELU in
the form ONNX Runtime fuses; and softmax, in f32 for f16/bf16.  Each computes what the Linnet
body does, and may return None to fall back to the body."""
from __future__ import annotations

from .. import kernels
from ..dims import DimExpr, FloorDiv, Mod, Sym, const
from .onnx_emitter import GraphEmitter, _Frame
from .onnx_files import elem_type

_LOW_PRECISION = ("f16", "bf16")


def softmax(em: GraphEmitter, x: str, dtype: str, axis: int, scope: str, doc: str) -> str:
    """Softmax; in f16/bf16 the exponentials and their sum are computed in f32."""
    from onnx import TensorProto

    out = elem_type(dtype)
    if dtype not in _LOW_PRECISION:
        return em.node("Softmax", [x], out, scope=scope, doc=doc, axis=axis)
    wide = em.cast(x, TensorProto.FLOAT, scope, doc + " (softmax in f32)")
    probs = em.node("Softmax", [wide], TensorProto.FLOAT, scope=scope, doc=doc + " (softmax in f32)", axis=axis)
    return em.node("Cast", [probs], out, scope=scope, doc=doc, to=out)


def _fused_layer_norm(em: GraphEmitter, frame: _Frame, args: list[str], scalars: dict) -> str | None:
    from onnx import TensorProto

    fn = frame.fn
    x, weight, bias, eps = args
    eps_expr = scalars.get(3)
    if eps_expr is None:
        return None  # eps is computed at run time: LayerNormalization wants a number, emit the body
    dtype = fn.result.dtype
    scope, doc = em.scope(frame), em.doc(frame, fn.span.line) + " (fused LayerNormalization)"
    inputs = [x, weight] + ([bias] if bias else [])
    if dtype in _LOW_PRECISION:
        # Statistics in f32: the sum of squares over the channels overflows f16.
        doc += ", statistics in f32"
        inputs = [em.cast(v, TensorProto.FLOAT, scope, doc) for v in inputs]
        normed = em.node("LayerNormalization", inputs, TensorProto.FLOAT, scope=scope, doc=doc, axis=-1,
                         epsilon=eps_expr)
        return em.node("Cast", [normed], elem_type(dtype), scope=scope, doc=doc, to=elem_type(dtype))
    return em.node("LayerNormalization", inputs, elem_type(dtype), scope=scope, doc=doc, axis=-1, epsilon=eps_expr)


#: Attention whose query count the entry's `where` clauses let pass this (ModernBERT's S <= 8192)
#: runs in a Loop over chunks of `ATTENTION_CHUNK` queries, so its scores are never [.., Q, K] at
#: once.  A query dim no clause bounds keeps the one-pass form, as every entry had before.
ATTENTION_ONE_PASS = 1024
#: Queries per Loop iteration: [.., 256, K] scores (B=1, 12 heads, K=8192: 96 MiB in f32).
ATTENTION_CHUNK = 256


def _fused_attention(em: GraphEmitter, frame: _Frame, args: list[str], scalars: dict) -> str | None:
    fn = frame.fn
    q, k, v, scale, mask = args
    dtype = fn.result.dtype
    out = elem_type(dtype)
    scope, doc = em.scope(frame), em.doc(frame, fn.span.line) + " (attention: MatMul, Softmax, MatMul)"
    # The scale multiplies Q (S x Dh per head) rather than the scores (S x S): fewer multiplies.
    # A scale of exactly 1 (linnet.middle.optimize folded it into the query weights) needs no node.
    scaled = q if scalars.get(3) == 1.0 else em.node("Mul", [q, scale], out,
                                                     scope=scope, doc=doc + ", scale folded into Q")
    rank = fn.params[1][1].rank
    keys = em.node("Transpose", [k], out, scope=scope, doc=doc, perm=list(range(rank - 2)) + [rank - 1, rank - 2])
    queries = frame.resolve(fn.params[0][1].dims[-2])
    bound = em.upper_bound(queries)
    if bound is not None and bound > ATTENTION_ONE_PASS:
        mask_type = fn.params[4][1]
        mask_rows = bool(mask) and mask_type.rank >= 2 and str(mask_type.dims[-2]) != "1"
        return _chunked_attention(em, scaled, keys, v, mask if mask else None, mask_rows,
                                  mask_type.rank if mask else 0, queries, rank, dtype, scope, doc)
    scores = em.node("MatMul", [scaled, keys], out, scope=scope, doc=doc)
    if mask:
        scores = em.node("Add", [scores, mask], out, scope=scope, doc=doc + ", mask added")
    probs = softmax(em, scores, dtype, -1, scope, doc)
    return em.node("MatMul", [probs, v], out, scope=scope, doc=doc)


def _fused_windowed_attention(em: GraphEmitter, frame: _Frame, args: list[str], scalars: dict) -> str | None:
    """`windowed_attention` over the band alone: the chunked Loop of `_chunked_attention`, each
    chunk of queries reading only the keys within `window` of one of its rows.  A window of
    S - 1 or more reads every key (a global layer), so one graph serves both kinds of layer."""
    fn = frame.fn
    q, k, v, scale, mask, window = args
    types = [t for _, t in fn.params]
    # The specialisation whose queries are the keys' positions, row for row, with a key-padding
    # mask; a dead-rows clone (one query row) or a packed one keeps the Linnet body.
    if types[0].dims[2] != types[1].dims[2] or str(types[4].dims[2]) != "1" or not mask:
        return None
    dtype = fn.result.dtype
    out = elem_type(dtype)
    scope, doc = em.scope(frame), em.doc(frame, fn.span.line) + " (windowed attention over its band)"
    scaled = q if scalars.get(3) == 1.0 else em.node("Mul", [q, scale], out, scope=scope,
                                                     doc=doc + ", scale folded into Q")
    keys = em.node("Transpose", [k], out, scope=scope, doc=doc, perm=[0, 1, 3, 2])
    return _chunked_attention(em, scaled, keys, v, mask, False, 4, frame.resolve(types[0].dims[2]), 4, dtype,
                              scope, doc, window=window)


def _chunked_attention(em: GraphEmitter, q: str, keys: str, v: str, mask: str | None, mask_rows: bool,
                       mask_rank: int, queries, rank: int, dtype: str, scope: str, doc: str,
                       window: str | None = None) -> str:
    """softmax(q keys + mask) v in a Loop over chunks of min(Q, ATTENTION_CHUNK) query rows:
    iteration i slices rows [i c, i c + c) of q (and of the mask, when it has a row per query),
    pads a short last chunk with zero rows to c, and emits its [.., c, Dv] rows as a scan
    output; the [n, .., c, Dv] result is put back in row order and cut to Q rows.  Each row is
    the one-pass form's softmax over the same keys; only one chunk's scores exist at a time.

    With a `window` (an i32 scalar; queries and keys at the same positions, a key-padding
    mask), a chunk reads only the keys [i c - window, i c + c + window) and adds std's band,
    `WINDOW_OUTSIDE` where |query - key| > window: the keys left out are ones the body gives
    weight exactly 0, so no [Q, K] scores or band exist at all."""
    from onnx import TensorProto, helper

    out = elem_type(dtype)
    i64 = TensorProto.INT64
    doc = doc + f", a Loop over chunks of {ATTENTION_CHUNK} queries"
    axis = rank - 2
    # Outside the loop: Q, the chunk size c = min(Q, CHUNK) and the trip count ceil(Q / c).
    total = em.dim(queries)
    size = em.node("Min", [total, em.constant([ATTENTION_CHUNK], "i64", (1,))], i64, scope=scope, doc=doc)
    rounded = em.node("Add", [total, em.node("Sub", [size, em.constant([1], "i64", (1,))], i64, scope=scope,
                                             doc=doc)], i64, scope=scope, doc=doc)
    steps = em.node("Squeeze", [em.node("Div", [rounded, size], i64, scope=scope, doc=doc)], i64, scope=scope,
                    doc=doc + ", the trip count")
    one_axis = em.constant([axis], "i64", (1,))

    # The body: its nodes go to their own list; names stay unique across the whole graph.
    outer_nodes, outer_casts = em.nodes, dict(em._casts)
    em.nodes = []
    iteration, condition = em._unique(f"{scope}/loop_i"), em._unique(f"{scope}/loop_cond")
    index = em.node("Unsqueeze", [iteration, em.constant([0], "i64", (1,))], i64, scope=scope, doc=doc)
    start = em.node("Mul", [index, size], i64, scope=scope, doc=doc)
    end = em.node("Add", [start, size], i64, scope=scope, doc=doc)

    def rows(x: str, x_rank: int) -> str:
        """x's rows [start, end) along its next-to-last axis, a short last chunk padded with zero
        rows to the chunk size."""
        at = x_rank - 2
        part = em.node("Slice", [x, start, end, em.constant([at], "i64", (1,))], em.types.get(x, out), scope=scope,
                       doc=doc)
        have = em.node("Shape", [part], i64, scope=scope, doc=doc, start=at, end=at + 1)
        missing = em.node("Sub", [size, have], i64, scope=scope, doc=doc)
        before = em.constant([0] * (x_rank + at), "i64", (x_rank + at,))
        pads = em.node("Concat", [before, missing, em.constant([0], "i64", (1,))], i64, scope=scope, doc=doc, axis=0)
        return em.node("Pad", [part, pads], em.types.get(x, out), scope=scope, doc=doc + ", last chunk padded")

    values = v
    if window is not None:
        keys, values, mask = _band(em, start, size, total, window, keys, values, mask, dtype, scope, doc)
    scores = em.node("MatMul", [rows(q, rank), keys], out, scope=scope, doc=doc)
    if mask:
        chunk_mask = rows(mask, mask_rank) if mask_rows else mask
        scores = em.node("Add", [scores, chunk_mask], out, scope=scope, doc=doc + ", mask added")
    probs = softmax(em, scores, dtype, -1, scope, doc)
    chunk = em.node("MatMul", [probs, values], out, scope=scope, doc=doc)
    keep = em.node("Identity", [condition], TensorProto.BOOL, scope=scope, doc=doc)
    body = helper.make_graph(
        em.nodes, f"{scope}/attention_chunk",
        [helper.make_tensor_value_info(iteration, i64, []), helper.make_tensor_value_info(condition, TensorProto.BOOL, [])],
        [helper.make_tensor_value_info(keep, TensorProto.BOOL, []), helper.make_tensor_value_info(chunk, out, None)])
    em.nodes, em._casts = outer_nodes, outer_casts

    stacked = em.node("Loop", [steps, ""], out, scope=scope, doc=doc, body=body)  # [n, *Lead, c, Dv]
    # [n, *Lead, c, Dv] -> [*Lead, n, c, Dv] -> [*Lead, n c, Dv] -> the first Q rows.
    moved = em.node("Transpose", [stacked], out, scope=scope, doc=doc,
                    perm=list(range(1, axis + 1)) + [0, axis + 1, axis + 2])
    lead = em.node("Shape", [moved], i64, scope=scope, doc=doc, start=0, end=axis)
    width = em.node("Shape", [moved], i64, scope=scope, doc=doc, start=axis + 2, end=axis + 3)
    flat = em.node("Reshape", [moved, em.node("Concat", [lead, em.constant([-1], "i64", (1,)), width], i64,
                                              scope=scope, doc=doc, axis=0)], out, scope=scope, doc=doc)
    return em.node("Slice", [flat, em.constant([0], "i64", (1,)), total, one_axis], out, scope=scope, doc=doc)


def _band(em: GraphEmitter, start: str, size: str, total: str, window: str, keys: str, v: str, mask: str,
          dtype: str, scope: str, doc: str) -> tuple[str, str, str]:
    """Inside a windowed chunk starting at query `start`: the keys [low, high) any of its rows
    can see ([B, H, Dh, n] of the transposed `keys`, [B, H, n, Dv] of `v`), and the mask over
    them, [B, 1, c, n]: std's band (`WINDOW_OUTSIDE` beyond the window, else 0) plus the
    padding mask, added in the body's order."""
    from onnx import TensorProto

    out, i64 = elem_type(dtype), TensorProto.INT64
    doc = doc + ", the keys within the window"
    reach = em.node("Reshape", [em.cast(window, i64, scope, doc), em.constant([1], "i64", (1,))], i64,
                    scope=scope, doc=doc)
    zero = em.constant([0], "i64", (1,))
    stop = em.node("Add", [start, size], i64, scope=scope, doc=doc)  # the chunk's last query + 1
    low = em.node("Max", [em.node("Sub", [start, reach], i64, scope=scope, doc=doc), zero], i64, scope=scope, doc=doc)
    high = em.node("Min", [em.node("Add", [stop, reach], i64, scope=scope, doc=doc), total], i64, scope=scope, doc=doc)

    def keys_of(x: str, axis: int) -> str:
        return em.node("Slice", [x, low, high, em.constant([axis], "i64", (1,))], em.types.get(x, out), scope=scope,
                       doc=doc)

    def scalar(x: str) -> str:
        return em.node("Squeeze", [x, zero], i64, scope=scope, doc=doc)

    one = em.constant(1, "i64")
    query = em.node("Range", [scalar(start), scalar(stop), one], i64, scope=scope, doc=doc)
    key = em.node("Range", [scalar(low), scalar(high), one], i64, scope=scope, doc=doc)
    distance = em.node("Abs", [em.node("Sub", [em.node("Unsqueeze", [query, em.constant([1], "i64", (1,))], i64,
                                                          scope=scope, doc=doc),
                                                  em.node("Unsqueeze", [key, zero], i64, scope=scope, doc=doc)],
                                          i64, scope=scope, doc=doc)], i64, scope=scope, doc=doc)
    far = em.node("Greater", [distance, reach], TensorProto.BOOL, scope=scope, doc=doc)
    band = em.node("Where", [far, em._scalar(kernels.WINDOW_OUTSIDE, dtype), em._scalar(0.0, dtype)], out,
                   scope=scope, doc=doc + f", {kernels.WINDOW_OUTSIDE:g} outside")
    near_mask = em.node("Add", [band, keys_of(mask, 3)], out, scope=scope, doc=doc + ", band plus padding mask")
    return keys_of(keys, 3), keys_of(v, 2), near_mask


def _fused_attention_dropout(em: GraphEmitter, frame: _Frame, args: list[str], scalars: dict) -> str | None:
    """Attention with dropout on the probabilities: in an inference graph, attention itself."""
    return _fused_attention(em, frame, args[:5], scalars)


#: Dtypes whose Linear is one 2-D Gemm (f16/bf16 keep MatMul + Add: which providers have
#: half-precision Gemm kernels varies, and the measured gain is the CPU provider's).
GEMM_DTYPES = ("f32", "f64")


def _fused_linear(em: GraphEmitter, frame: _Frame, args: list[str], scalars: dict) -> str | None:
    """y = x W^T + b with the weight stored [In, Out].

    f32/f64 with a batch of rows (x of rank >= 2): x flattened to [rows, In], one Gemm with the
    bias as its C input, reshaped back to [..., Out].  ONNX Runtime fuses MatMul + Add into
    a Gemm only for 2-D inputs (as the packed graphs' [Tokens, D] rows are); over [B, S, D]
    it runs MatMul and then a separate pass for the bias.  Measured on CPU (bench/onnx_profile.py,
    docs/bench.md "Where Linnet ONNX's time goes"): about 1% less time for padded bert-base and
    ViT-base, outputs within 3e-6.  Otherwise MatMul + Add."""
    fn = frame.fn
    params = dict(em.program.blocks[fn.block].params)
    if "weight" not in params or "bias" not in params:  # not the std Linear this form is for
        return None
    out = elem_type(fn.result.dtype)
    weight = em.param(frame.prefix + "weight", params["weight"], transposed=True)
    bias = em.param(frame.prefix + "bias", params["bias"])
    if fn.result.dtype in GEMM_DTYPES and fn.result.rank >= 2:
        return _linear_as_gemm(em, frame, args[0], weight, bias, params["weight"].dims)
    scope, doc = em.scope(frame), em.doc(frame, fn.span.line) + " (fused Linear: MatMul + Add)"
    y = em.node("MatMul", [args[0], weight], out, scope=scope, doc=doc)
    return em.node("Add", [y, bias], out, scope=scope, doc=doc)


def _linear_as_gemm(em: GraphEmitter, frame: _Frame, x: str, weight: str, bias: str, weight_dims) -> str:
    """Gemm over x's rows; a rank-3+ x is flattened to [rows, In] around it."""
    fn = frame.fn
    out = elem_type(fn.result.dtype)
    scope, doc = em.scope(frame), em.doc(frame, fn.span.line) + " (fused Linear: Gemm, bias included)"
    outputs, inputs = weight_dims  # the weight is declared [Out, In]
    if fn.result.rank == 2:
        return em.node("Gemm", [x, weight, bias], out, scope=scope, doc=doc)
    rows = em.node("Reshape", [x, em.shape((const(-1), inputs))], out, scope=scope,
                   doc=doc + ", rows flattened")
    y = em.node("Gemm", [rows, weight, bias], out, scope=scope, doc=doc)
    dims = tuple(frame.resolve(d) for d in fn.result.dims)
    shape = em.shape(dims) if all(_known(em, d) for d in dims) else _leading_shape(em, x, outputs, scope, doc)
    return em.node("Reshape", [y, shape], out, scope=scope, doc=doc + ", rows restored")


def _known(em: GraphEmitter, expr: DimExpr) -> bool:
    """Whether `em.dim(expr)` can compute the dim from the entry's input shapes."""
    for monomial, _ in expr.terms:
        for atom, _ in monomial:
            if isinstance(atom, Sym) and atom.name not in em._dim_sources:
                return False
            if isinstance(atom, (FloorDiv, Mod)) and not (_known(em, atom.num) and _known(em, atom.den)):
                return False
            if not isinstance(atom, (Sym, FloorDiv, Mod)):
                return False
    return True


def _leading_shape(em: GraphEmitter, x: str, outputs, scope: str, doc: str) -> str:
    """x's shape with its last axis replaced by `outputs`, read from x at run time: for a
    Linear whose leading dims are not all dims of the entry's inputs (else the result's
    declared dims give the shape, the node the attention's reshapes share).  One per x:
    query, key and value share it."""
    from onnx import TensorProto

    key = f"leading:{x}:{outputs}"
    if key not in em._dims:
        i64 = TensorProto.INT64
        leading = em.node("Shape", [x], i64, scope=scope, doc=doc + ", leading dims", start=0, end=-1)
        em._dims[key] = em.node("Concat", [leading, em.dim(outputs)], i64, scope=scope, doc=doc, axis=0)
    return em._dims[key]


def _fused_gelu_erf(em: GraphEmitter, frame: _Frame, args: list[str], scalars: dict) -> str | None:
    """The erf GELU written in the one operand order ONNX Runtime's GeluFusion matches,
    `x * (Erf(x / sqrt 2) + 1) * 0.5`; it then runs one Gelu kernel (BiasGelu with the
    Linear's bias before it).  The body's `0.5 * x * (1 + erf(x * 0.7071...))` is the same
    formula but is left as five elementwise passes.  Unfused, the two differ only in how
    x / sqrt 2 rounds (at most 1 ulp of the erf argument)."""
    fn = frame.fn
    dtype = fn.result.dtype
    out = elem_type(dtype)
    scope, doc = em.scope(frame), em.doc(frame, fn.span.line) + " (gelu_erf in the form ORT fuses into Gelu)"
    x = args[0]
    scaled = em.node("Div", [x, em._scalar(1.4142135623730951, dtype)], out, scope=scope, doc=doc)
    erf = em.node("Erf", [scaled], out, scope=scope, doc=doc)
    shifted = em.node("Add", [erf, em._scalar(1.0, dtype)], out, scope=scope, doc=doc)
    product = em.node("Mul", [x, shifted], out, scope=scope, doc=doc)
    return em.node("Mul", [product, em._scalar(0.5, dtype)], out, scope=scope, doc=doc)


#: std function (checked key) -> fused emission; each computes what the Linnet body does.
#: A fused form may return None to fall back to the body.
FUSED = {
    kernels.LAYER_NORM: _fused_layer_norm,
    kernels.ATTENTION: _fused_attention,
    kernels.ATTENTION_DROPOUT: _fused_attention_dropout,
    kernels.WINDOWED_ATTENTION: _fused_windowed_attention,
    kernels.LINEAR: _fused_linear,
    kernels.GELU_ERF: _fused_gelu_erf,
}

