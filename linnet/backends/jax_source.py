"""Lowered program -> readable JAX source: pure functions over a params pytree.

There are no classes.  Each block method becomes a module-level function named
`<Block>_<method>` whose first argument, `params`, is that block's slice of the parameter
tree; each free function keeps its Linnet name.  The tree is nested dicts keyed by Linnet
names, with sub-block arrays as lists, so `params["layers"][3]["up"]["weight"]` is the param
`layers.3.up.weight` of `ctx.tensors("flax")`.  Sub-blocks are called with their slice
(`Embeddings_forward(params["embeddings"], ...)`) and `static for` is a Python loop over
the list, unrolled when traced.  Shapes are never stored: a function reads the dims it needs
from its inputs, so one source serves every (B, S), and a method body that does not mention
its instantiation's sizes (`Linear_forward`) is written once for all of them.

Every statement carries a `# file:line` comment.  A few std functions are replaced by the
JAX function that computes the same thing (`jax.nn.gelu(approximate=False)` for the exact
erf form, `jnp.take`, ...); attention and windowed attention become helpers written once per
module (`ATTENTION_HELPERS`, `WINDOWED_HELPERS`: the same jnp ops in chunks of queries on long
inputs), and layer norm is emitted from its Linnet body, already the explicit jnp ops XLA fuses.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from .. import dtypes, kernels
from ..middle import ir
from ..diagnostics import InternalError
from ..ops import OPS, Emissions
from .pysource import (ATOM, OPERATORS, FunctionNamer, PyWriter, Scope, arg_texts, concat_parts, dropping_functions,
                       emission_order, first_atom, function_call, functions_reaching, header, py_dim, py_index_item,
                       py_name)


def jax_dtype(dtype: str) -> str:
    """A Linnet dtype as generated code writes it: `jnp.float32`."""
    return f"jnp.{dtypes.by_name(dtype).jax}"


#: The name of every function's parameter-tree argument (reserved in pysource, so no Linnet
#: name can take it).
PARAMS = "params"

_UNARY_FUNCS = {"erf": "lax.erf", "tanh": "jnp.tanh", "exp": "jnp.exp", "log": "jnp.log",
                "sqrt": "jnp.sqrt", "rsqrt": "lax.rsqrt", "sigmoid": "jax.nn.sigmoid",
                "sin": "jnp.sin", "cos": "jnp.cos"}


#: Queries at or below this many run attention in one pass, the body's own [.., Q, K] scores;
#: above it, `ATTENTION_CHUNK` queries at a time (`ATTENTION_HELPERS`).
ATTENTION_ONE_PASS = 1024
#: Queries per step of the chunked form: its scores are [.., 256, K] (B=1, 12 heads, K=8192:
#: 96 MiB in f32) instead of [.., Q, K] (3 GiB at Q = 8192).
ATTENTION_CHUNK = 256

ATTENTION_HELPERS = f"""
def _linnet_attention(q, k, v, scale, mask, mask_rows):
    # softmax(q k^T * scale + mask) v, std.nn.attention's body.  Up to {ATTENTION_ONE_PASS} queries it runs
    # as written; beyond, a loop takes {ATTENTION_CHUNK} queries at a time (the last chunk starts at
    # Q - {ATTENTION_CHUNK}, dynamic_slice's clamp), so only one chunk's scores [.., {ATTENTION_CHUNK}, K] exist at once.
    # Every query row is the same softmax over the same keys either way.  `mask_rows`: the
    # mask has a row per query (its next-to-last dim is Q, not 1), sliced with the queries.
    def rows(qc, mc):
        scores = (qc @ jnp.swapaxes(k, -2, -1)) * scale
        if mc is not None:
            scores = scores + mc
        return jax.nn.softmax(scores, axis=-1) @ v

    queries = q.shape[-2]

    def chunked():
        size = min(queries, {ATTENTION_CHUNK}) if isinstance(queries, int) else jax.core.min_dim(queries, {ATTENTION_CHUNK})
        steps = (jnp.asarray(queries, jnp.int32) + size - 1) // size
        out = jnp.zeros(q.shape[:-1] + v.shape[-1:], jnp.result_type(q, v))

        def step(i, out):
            start = i * size
            qc = lax.dynamic_slice_in_dim(q, start, size, axis=q.ndim - 2)
            mc = lax.dynamic_slice_in_dim(mask, start, size, axis=mask.ndim - 2) if mask_rows else mask
            return lax.dynamic_update_slice_in_dim(out, rows(qc, mc).astype(out.dtype), start, axis=out.ndim - 2)

        return lax.fori_loop(0, steps, step, out)

    if isinstance(queries, int):
        return rows(q, mask) if queries <= {ATTENTION_ONE_PASS} else chunked()
    # A symbolic Q (jax.export, StableHLO).  Its `where` clauses decide: at most {ATTENTION_ONE_PASS} (BERT's
    # S <= 512), or no bound at all, is the one-pass form as before; bounded above {ATTENTION_ONE_PASS}
    # (ModernBERT's S <= 8192), a cond, whose predicate is a constant once a call's shapes are known.
    if _linnet_decided(lambda: queries <= {ATTENTION_ONE_PASS}) or not _linnet_decided(lambda: queries <= 2**31 - 1):
        return rows(q, mask)
    return lax.cond(jnp.asarray(queries) <= {ATTENTION_ONE_PASS}, lambda: rows(q, mask), chunked)


def _linnet_decided(comparison):
    # True where jax.export's constraints prove a comparison of dims, else False.
    try:
        return bool(comparison())
    except Exception:  # jax's InconclusiveDimensionOperation
        return False
"""

#: What generated code calling `std.nn.attention::windowed_attention` defines once, after
#: `ATTENTION_HELPERS`.
WINDOWED_HELPERS = f"""
def _linnet_windowed_attention(q, k, v, scale, mask, window):
    # std.nn.attention::windowed_attention: softmax(q k^T * scale + band + mask) v, the band
    # {kernels.WINDOW_OUTSIDE} (std's OUTSIDE) at keys more than `window` positions from the query.  A
    # window of S - 1 or more has no band: attention over the padding mask alone.  Otherwise
    # {ATTENTION_CHUNK} queries at a time, each chunk reading only the keys within `window` of one of
    # them (keys and values padded by `window` at both ends, those pads {kernels.WINDOW_OUTSIDE}), so no
    # [S, S] scores or band exist.  The keys left out are ones the body gives weight exactly 0.
    # A window known only at run time (a traced value) takes the body's [S, S] band.
    S = q.shape[-2]
    try:
        w = int(window)
    except jax.errors.ConcretizationTypeError:
        w = None
    if w is None or w < 0:
        index = jnp.arange(S, dtype=jnp.int32)
        outside = jnp.abs(index[:, None] - index[None, :]) > window
        band = jnp.where(outside, {kernels.WINDOW_OUTSIDE}, 0.0).astype(q.dtype)
        return _linnet_attention(q, k, v, scale, band + mask, True)

    def whole():
        return _linnet_attention(q, k, v, scale, mask, False)

    def banded():
        size = min(S, {ATTENTION_CHUNK}) if isinstance(S, int) else jax.core.min_dim(S, {ATTENTION_CHUNK})
        span, axis = size + 2 * w, q.ndim - 2
        pad = [(0, 0)] * axis + [(w, w), (0, 0)]
        keys, values = jnp.pad(k, pad), jnp.pad(v, pad)
        masks = jnp.pad(mask, [(0, 0)] * (mask.ndim - 1) + [(w, w)], constant_values={kernels.WINDOW_OUTSIDE})
        # Query start + r and padded key start + t (the key start - w + t): |r - t + w| > w is outside.
        distance = jnp.abs(jnp.arange(size)[:, None] - jnp.arange(span)[None, :] + w)
        band = jnp.where(distance > w, {kernels.WINDOW_OUTSIDE}, 0.0).astype(q.dtype)
        steps = (jnp.asarray(S, jnp.int32) + size - 1) // size
        out = jnp.zeros(q.shape[:-1] + v.shape[-1:], jnp.result_type(q, v))

        def step(i, out):
            start = jnp.minimum(i * size, S - size)  # the last chunk ends at S
            qc = lax.dynamic_slice_in_dim(q, start, size, axis=axis)
            kc = lax.dynamic_slice_in_dim(keys, start, span, axis=axis)
            vc = lax.dynamic_slice_in_dim(values, start, span, axis=axis)
            mc = lax.dynamic_slice_in_dim(masks, start, span, axis=masks.ndim - 1)
            scores = (qc @ jnp.swapaxes(kc, -2, -1)) * scale + (band + mc)
            rows = jax.nn.softmax(scores, axis=-1) @ vc
            return lax.dynamic_update_slice_in_dim(out, rows.astype(out.dtype), start, axis=axis)

        return lax.fori_loop(0, steps, step, out)

    if isinstance(S, int):
        return whole() if w >= S - 1 else banded()
    # A symbolic S (jax.export): decided by the `where` clauses where they can, else a cond
    # whose predicate is a constant once a call's shapes are known.
    if _linnet_decided(lambda: w >= S - 1):
        return whole()
    return lax.cond(jnp.asarray(S) - 1 <= w, whole, banded)
"""


def _mask_rows(fn: ir.Function) -> bool:
    """Whether attention's mask (a param of fn) has a row per query: rank 2 or more and its
    next-to-last dim not 1."""
    mask = fn.params[4][1]
    return mask is not None and mask.rank >= 2 and str(mask.dims[-2]) != "1"


def _fused_attention(fn: ir.Function, args: list[str]) -> str:
    q, k, v, scale, mask = args
    return f"_linnet_attention({q}, {k}, {v}, {scale}, {mask}, {_mask_rows(fn)})"


def _fused_windowed_attention(fn: ir.Function, args: list[str]) -> str | None:
    # As torch: only the specialisation whose queries are the keys' positions, row for row; a
    # clone with fewer query rows (linnet.middle.rows) or packed inputs keeps the body.
    types = [t for _, t in fn.params]
    if len(types) != 6 or types[0].dims[2] != types[1].dims[2]:
        return None
    return f"_linnet_windowed_attention({', '.join(args)})"


#: std function (checked key) -> template over the emitted parameter names.  Each computes
#: exactly what the Linnet body does.  Attention is `_linnet_attention` (`ATTENTION_HELPERS`),
#: its body in query chunks once Q passes `ATTENTION_ONE_PASS`; windowed attention is
#: `_linnet_windowed_attention` (`WINDOWED_HELPERS`), the band of keys each chunk of queries
#: can see; layer_norm is not here, its body is already plain jnp expressions, and jax has no
#: fused layer norm to call.
FUSED: dict[str, Callable[[ir.Function, list[str]], str | None]] = {
    kernels.ATTENTION: _fused_attention,
    kernels.WINDOWED_ATTENTION: _fused_windowed_attention,
    kernels.GELU_ERF: lambda fn, a: f"jax.nn.gelu({a[0]}, approximate=False)",
    kernels.GELU_TANH: lambda fn, a: f"jax.nn.gelu({a[0]}, approximate=True)",
    kernels.RELU: lambda fn, a: f"jax.nn.relu({a[0]})",
    kernels.SILU: lambda fn, a: f"jax.nn.silu({a[0]})",
    kernels.EMBEDDING: lambda fn, a: f"jnp.take({a[1]}, {a[0]}, axis=0)",
    kernels.LINEAR: lambda fn, a: f'{a[0]} @ {PARAMS}["weight"].T + {PARAMS}["bias"]',
}


# ------------------------------------------------------------------ emissions

#: IR op -> its JAX spelling: the Python operators, then one template per op.
EMISSIONS = Emissions("jax", OPERATORS)
for _name, _function in _UNARY_FUNCS.items():
    EMISSIONS.add(_name, function_call(_function))


@EMISSIONS.register("gelu_tanh")
def _emit_gelu_tanh(w, e: ir.Op, scope: Scope):
    return f"jax.nn.gelu({arg_texts(w, e, scope)[0]}, approximate=True)", ATOM


#: `activation`'s kinds (linnet.ops.ACTIVATIONS) as jax.nn calls, the ones std's functions fuse to.
_ACTIVATIONS = {"gelu_erf": "jax.nn.gelu({}, approximate=False)", "gelu_tanh": "jax.nn.gelu({}, approximate=True)",
                "relu": "jax.nn.relu({})", "silu": "jax.nn.silu({})"}


@EMISSIONS.register("activation")
def _emit_activation(w, e: ir.Op, scope: Scope):
    return _ACTIVATIONS[e.attr("kind")].format(arg_texts(w, e, scope)[0]), ATOM


@EMISSIONS.register("dropout")
def _emit_dropout(w, e: ir.Op, scope: Scope):
    # The identity unless the caller passed a key source (`rng`): inference never does.
    x, rate = arg_texts(w, e, scope)
    return f"_linnet_dropout({x}, {rate}, {w.mode_arg(scope)})", ATOM


#: What generated code that applies dropout defines once, after its imports.
DROPOUT_HELPERS = """
def _linnet_keys(key):
    # Training's key source: a one-element list holding a PRNG key, which each dropout
    # splits in turn as the trace reaches it (so every site and layer draws its own mask).
    return [key]


def _linnet_dropout(x, rate, rng):
    # Without keys (inference, eval mode) the identity; else each element is zeroed with
    # probability `rate` and the rest scaled by 1 / (1 - rate).
    if rng is None or rate == 0.0:
        return x
    rng[0], key = jax.random.split(rng[0])
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x))
"""


@EMISSIONS.register("maximum", "minimum")
def _emit_bound(w, e: ir.Op, scope: Scope):
    a = arg_texts(w, e, scope)
    return f"jnp.{e.op}({a[0]}, {a[1]})", ATOM


@EMISSIONS.register("select")
def _emit_select(w, e: ir.Op, scope: Scope):
    return f"jnp.where({', '.join(arg_texts(w, e, scope))})", ATOM


@EMISSIONS.register("transpose")
def _emit_transpose(w, e: ir.Op, scope: Scope):
    return f"jnp.swapaxes({arg_texts(w, e, scope)[0]}, -2, -1)", ATOM


@EMISSIONS.register("softmax")
def _emit_softmax(w, e: ir.Op, scope: Scope):
    return f"jax.nn.softmax({arg_texts(w, e, scope)[0]}, axis={e.attr('axis')})", ATOM


@EMISSIONS.register("cumsum")
def _emit_cumsum(w, e: ir.Op, scope: Scope):
    # the declared dtype, so an int32 running count stays int32
    return f"jnp.cumsum({arg_texts(w, e, scope)[0]}, axis={e.attr('axis')}, dtype={jax_dtype(e.type.dtype)})", ATOM


@EMISSIONS.register("sum", "mean", "max")
def _emit_reduce(w, e: ir.Op, scope: Scope):
    return f"jnp.{e.op}({arg_texts(w, e, scope)[0]}, axis={e.attr('axis')}, keepdims=True)", ATOM


@EMISSIONS.register("concat")
def _emit_concat(w, e: ir.Op, scope: Scope):
    parts = concat_parts(w, e, scope, lambda atom, shape: f"jnp.broadcast_to({atom}, ({shape},))")
    return f"jnp.concatenate([{', '.join(parts)}], axis={e.attr('axis')})", ATOM


@EMISSIONS.register("take")
def _emit_take(w, e: ir.Op, scope: Scope):
    # Rows of the table along its first axis, whatever its rank (torch: `table[ids]`).
    table, ids = arg_texts(w, e, scope)
    return f"jnp.take({table}, {ids}, axis=0)", ATOM


@EMISSIONS.register("reshape")
def _emit_reshape(w, e: ir.Op, scope: Scope):
    shape = ", ".join(py_dim(d) for d in e.attr("shape")) or "()"  # () for rank 0
    return f"{first_atom(w, e, scope)}.reshape({shape})", ATOM


@EMISSIONS.register("permute")
def _emit_permute(w, e: ir.Op, scope: Scope):
    perm = e.attr("perm")
    axes = f"({perm[0]},)" if len(perm) == 1 else f"({', '.join(map(str, perm))})"
    return f"jnp.transpose({arg_texts(w, e, scope)[0]}, {axes})", ATOM


@EMISSIONS.register("iota")
def _emit_iota(w, e: ir.Op, scope: Scope):
    return f"jnp.arange({py_dim(e.attr('n'))}, dtype={jax_dtype(e.attr('dtype'))})", ATOM


@EMISSIONS.register("cast")
def _emit_cast(w, e: ir.Op, scope: Scope):
    if isinstance(e.args[0], ir.DimValue):
        # Made of constants and pass numbers, it becomes a numpy value (`JaxEmitter._op`), which
        # a helper can read as a Python int (the window of windowed attention).
        return f"jnp.asarray({arg_texts(w, e, scope)[0]}, dtype={jax_dtype(e.attr('dtype'))})", ATOM
    return f"{first_atom(w, e, scope)}.astype({jax_dtype(e.attr('dtype'))})", ATOM


@EMISSIONS.register("index")
def _emit_index(w, e: ir.Op, scope: Scope):
    return f"{first_atom(w, e, scope)}[{', '.join(py_index_item(i) for i in e.attr('items'))}]", ATOM


#: The keyword argument of every function that reaches a `pack_index`: the packed rows'
#: length, a bucket at or above the kept count (`linnet.middle.packing.token_bucket`), static
#: under `jax.jit` so a program compiles once per bucket, not once per count.  None (a caller
#: that jits `ENTRIES` itself) takes every position, B * S: static and always enough.
BUCKET = "token_bucket"


@EMISSIONS.register("pack_index")
def _emit_pack_index(w, e: ir.Op, scope: Scope):
    # The flat positions of the kept tokens in row-major order, then flat position 0 up to the
    # bucket's length: those extra rows are computed like any other and never unpacked (no slot
    # reads them), so they are harmless.
    flat = f"{first_atom(w, e, scope)}.reshape(-1)"
    return f"jnp.nonzero({flat}, size={BUCKET} or {flat}.shape[0], fill_value=0)[0]", ATOM


@EMISSIONS.register("pack_rows")
def _emit_pack_rows(w, e: ir.Op, scope: Scope):
    x, rows = arg_texts(w, e, scope)
    axis = e.attr("axis")
    return f"jnp.take(lax.collapse({x}, {axis}, {axis + 2}), {rows}, axis={axis})", ATOM


@EMISSIONS.register("unpack_rows")
def _emit_unpack_rows(w, e: ir.Op, scope: Scope):
    # A zero row in front of the packed rows, then every slot reads its row (0: that zero row).
    x, slots = arg_texts(w, e, scope)
    axis, rank = e.attr("axis"), e.args[0].type.rank
    widths = ", ".join(["(0, 0)"] * axis + ["(1, 0)"] + ["(0, 0)"] * (rank - axis - 1))
    return f"jnp.take(jnp.pad({x}, ({widths},)), {slots}, axis={axis})", ATOM


# ------------------------------------------------------------ values known when traced
#
# JAX computes float64 and int64 as 32-bit unless the process enables x64, so a source that
# asks for f64 (RoPE's inverse frequencies) would silently get f32.  A value that depends on
# no input and no param -- constants, dims of constants and pass numbers, iota, casts,
# reshapes and elementwise arithmetic over those -- is written with numpy instead: computed
# once when traced, at the precision the source states, and a constant of the traced program.

#: Ops a trace-time value may be made of besides the elementwise ones (not dropout: it reads
#: the caller's key source).
_TRACE_TIME_OPS = frozenset({"iota", "reshape", "cast"})
_NUMPY_NAME = re.compile(r"\bnp\.(\w+)")


def _loop_indexes(stmts) -> set[str]:
    out: set[str] = set()
    for stmt in stmts:
        if isinstance(stmt, ir.Loop):
            out |= ({stmt.index} if stmt.index is not None else set()) | _loop_indexes(stmt.body)
    return out


def _bindings(stmts):
    for stmt in stmts:
        if isinstance(stmt, ir.Loop):
            yield from _bindings(stmt.body)
        elif isinstance(stmt, (ir.Let, ir.Assign)):
            yield stmt.name, stmt.value
        elif isinstance(stmt, ir.Unpack):
            for name in stmt.names:
                yield name, None  # a call's result: traced


def _known_dims(value, indexes: set[str]) -> bool:
    if isinstance(value, tuple):
        return all(_known_dims(v, indexes) for v in value)
    return not hasattr(value, "free_symbols") or value.free_symbols() <= indexes


def is_trace_time(e: ir.Expr, known: set[str], indexes: set[str]) -> bool:
    """Whether `e` is known when the function is traced: built from constants, dims of constants
    and pass numbers, and the locals in `known`, by ops numpy computes alike."""
    if isinstance(e, ir.Scalar):
        return True
    if isinstance(e, ir.DimValue):
        return e.expr.free_symbols() <= indexes
    if isinstance(e, ir.Ref):
        return e.name in known
    if isinstance(e, ir.Op):
        definition = OPS.get(e.op)
        if definition is None or e.op == "dropout" or not (definition.elementwise or e.op in _TRACE_TIME_OPS):
            return False
        return (all(_known_dims(v, indexes) for _, v in e.attrs)
                and all(is_trace_time(a, known, indexes) for a in e.args))
    return False


def trace_time_locals(fn: ir.Function) -> tuple[frozenset[str], frozenset[str]]:
    """The locals of `fn` every binding of which is known when traced, and its pass numbers."""
    indexes = _loop_indexes(fn.body)
    bindings: dict[str, list] = {}
    for name, value in _bindings(fn.body):
        bindings.setdefault(name, []).append(value)
    known: set[str] = set()
    grew = True
    while grew:  # a local is known once every value it is given is (the least fixed point)
        grew = False
        for name, values in bindings.items():
            if name not in known and all(v is not None and is_trace_time(v, known, indexes) for v in values):
                known.add(name)
                grew = True
    return frozenset(known), frozenset(indexes)


def as_numpy(text: str) -> str | None:
    """`text` with numpy in place of jax.numpy, or None where numpy lacks a name it calls or
    the text calls jax or lax."""
    if "jax." in text or "lax." in text or "_linnet" in text:
        return None
    text = re.sub(r"\bjnp\.", "np.", text)
    return text if all(hasattr(np, name) for name in _NUMPY_NAME.findall(text)) else None


class JaxEmitter(PyWriter):
    FUSED = FUSED
    receiver = PARAMS
    EMISSIONS = EMISSIONS
    STACK = "jnp.stack"

    def __init__(self, program: ir.Program, fused: bool = True):
        self.program = program
        self.uses_numpy = False  # set by an emission that writes a numpy value
        self.fused = fused
        blocks = program.blocks
        # Names are module-wide; folding is per block *source*, so the three Linear
        # instantiations of BERT share one `Linear_forward` when their bodies print alike.
        self.namer = FunctionNamer(
            base_name=lambda fn: py_name(f"{blocks[fn.block].name}_{fn.name}" if fn.block else fn.name),
            fold_scope=lambda fn: blocks[fn.block].source if fn.block else "",
            name_scope=lambda fn: "")
        self.dropping = dropping_functions(program)
        self.bucketed = functions_reaching(program, lambda e: isinstance(e, ir.Op) and e.op == "pack_index")

    def _extra_params(self, fn: ir.Function) -> list[str]:
        return [f"{BUCKET}=None"] if fn.id in self.bucketed else []

    def _function(self, fn: ir.Function) -> str:
        self._known, self._indexes = trace_time_locals(fn)
        return super()._function(fn)

    def _op(self, e: ir.Op, scope: Scope) -> tuple[str, int]:
        text, precedence = super()._op(e, scope)
        if is_trace_time(e, self._known, self._indexes):
            numpy_text = as_numpy(text)
            if numpy_text is not None:
                self.uses_numpy = True
                return numpy_text, precedence
        return text, precedence

    def _full(self, shape: str, value: int, dtype: str, like: str) -> str:
        return f"jnp.full({shape}, {value}, dtype={jax_dtype(dtype)})"

    def _mode_param(self, fn: ir.Function) -> str | None:
        return "rng=None"  # entries run without it: inference is eval mode

    def mode_arg(self, scope: Scope) -> str:
        return "rng"

    # ----------------------------------------------------------------- module
    def emit(self, title: str = "JAX functions") -> str:
        handles: list[int] = []
        for fn_id in emission_order(self.program):
            fn = self.program.functions[fn_id]
            handle = self.namer.assign(fn, self._function(fn))
            if handle is not None:
                handles.append(handle)
        files = sorted({f.span.file for f in self.program.functions.values()})
        lines = header(self.program, title, files)
        lines += ["# Pure functions: `params` is the block's slice of the parameter tree (nested dicts by",
                  "# Linnet name, sub-block arrays as lists); dims are read from the inputs' shapes.",
                  "", "import jax", "import jax.numpy as jnp"] + (["import numpy as np"] if self.uses_numpy else [])
        lines += ["from jax import lax", ""]
        if self.dropping:
            lines += DROPOUT_HELPERS.splitlines()
        sources = {f.source for f in self.program.functions.values()} if self.fused else set()
        if kernels.ATTENTION in sources or kernels.WINDOWED_ATTENTION in sources:
            lines += ATTENTION_HELPERS.splitlines()
        if kernels.WINDOWED_ATTENTION in sources:
            lines += WINDOWED_HELPERS.splitlines()
        for handle in handles:
            lines += ["", self.namer.text(handle), ""]
        lines += ["", "#: Entry name -> function; each takes (params, *inputs) and is pure, so jax.jit and",
                  "#: jax.export apply to it directly.", "ENTRIES = {"]
        for name, entry in self.program.entries.items():
            lines.append(f'    "{name}": {self.namer.names[entry.function]},')
        lines.append("}")
        text = "\n".join(lines).rstrip() + "\n"
        defined = re.findall(r"^def (\w+)\(", text, flags=re.M)
        if len(defined) != len(set(defined)):
            raise InternalError(f"JAX emitter: two functions got the same name: {sorted(defined)}")
        return text

    # -------------------------------------------------------------- functions
    def _param_ref(self, e: ir.ParamRef) -> str:
        return f'{PARAMS}["{e.name}"]'

    def _loop_source(self, member: str) -> str:
        return f'{PARAMS}["{member}"]'

    def _call(self, e: ir.Call, scope: Scope) -> str:
        args = [self._expr(a, scope)[0] for a in e.args]
        name = self.namer.names[e.function]
        if e.receiver is not None:
            # The callee's params: ours for a sibling method, a loop variable's element of a
            # sub array, else the sub-block's slice of our tree.
            if e.receiver == ir.SIBLING:
                args.insert(0, PARAMS)
            elif e.receiver in scope.loops:
                args.insert(0, py_name(e.receiver))
            else:
                args.insert(0, f'{PARAMS}["{e.receiver}"]')
        if e.function in self.dropping:
            args.append("rng")
        if e.function in self.bucketed:
            args.append(f"{BUCKET}={BUCKET}")
        return f"{name}({', '.join(args)})"


# --------------------------------------------------------------------- params tree


def params_tree(program: ir.Program, leaves: Mapping[str, Any] | Callable[[str, ir.TensorType], Any]) -> dict:
    """The nested parameter tree the generated functions take.

    `leaves` maps each dotted param path (`layers.3.up.weight`, as `ctx.tensors` returns
    them) to its array, or is a function (path, type) -> leaf, e.g. a `ShapeDtypeStruct`
    for export.  Sub-block arrays become lists, so the loop in the source is a Python loop.
    """
    leaf = leaves if callable(leaves) else (lambda path, _t: leaves[path])

    def walk(block_id: str, prefix: str) -> dict:
        block = program.blocks[block_id]
        node: dict[str, Any] = {name: leaf(prefix + name, t) for name, t in block.params}
        for sub in block.subs:
            if sub.count is None:
                node[sub.name] = walk(sub.block, f"{prefix}{sub.name}.")
            else:
                node[sub.name] = [walk(sub.block, f"{prefix}{sub.name}.{i}.") for i in range(sub.count)]
        return node

    return walk(program.root, "")


def emit(program: ir.Program, fused: bool = True, title: str = "JAX functions") -> str:
    return JaxEmitter(program, fused).emit(title)


def write(program: ir.Program, out_dir: Path, fused: bool = True, title: str = "JAX functions") -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "model.py"
    path.write_text(emit(program, fused, title), encoding="utf-8")
    return path
