"""Lowered program -> readable PyTorch source: one `nn.Module` per block, one def per function.

Each block instantiation becomes a class whose parameters are created with their concrete
shapes, each free function a `def`; every statement carries a `# file:line` comment.  A few
std functions are replaced by the fused PyTorch kernel that computes the same thing
(`F.layer_norm`, `F.scaled_dot_product_attention` for plain and grouped-query attention,
`F.linear`, `F.embedding`, exact-erf `F.gelu`); everything else is emitted from its Linnet
body, each op by its entry in `EMISSIONS`, the backend's table over the op registry
(`linnet.ops`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from .. import dtypes, kernels
from ..middle import ir
from ..ops import Emissions
from ..paths import source_label
from .pysource import (ATOM, FunctionNamer, OPERATORS, PyWriter, Scope, arg_texts, comment_generics, comment_text,
                       concat_parts, dropping_functions, emission_order, first_atom, function_call, header, py_dim,
                       py_index_item, py_name)


def torch_dtype(dtype: str) -> str:
    """A Linnet dtype as generated code writes it: `torch.float32`."""
    return f"torch.{dtypes.by_name(dtype).torch}"




def _fused_layer_norm(fn: ir.Function, args: list[str]) -> str:
    x, weight, bias, eps = args
    width = py_dim(fn.params[0][1].dims[-1])
    return f"F.layer_norm({x}, ({width},), {weight}, {bias}, {eps})"


def _fused_attention(fn: ir.Function, args: list[str]) -> str:
    q, k, v, scale, mask = args
    masked = f", attn_mask={mask}" if mask != "None" else ""
    return f"F.scaled_dot_product_attention({q}, {k}, {v}{masked}, scale={scale})"


def _fused_grouped_attention(fn: ir.Function, args: list[str]) -> str:
    # SDPA repeats each key/value head for its `G` query heads as the Linnet body reads them
    # (query head h reads key/value head h // G), in one call instead of the body's eleven ops:
    # on a decoder step those ops cost more than the products they surround.
    q, k, v, scale, mask = args
    return f"F.scaled_dot_product_attention({q}, {k}, {v}, attn_mask={mask}, scale={scale}, enable_gqa=True)"


def _fused_attention_dropout(fn: ir.Function, args: list[str]) -> str:
    q, k, v, scale, mask, rate, training = args
    masked = f", attn_mask={mask}" if mask != "None" else ""
    return (f"F.scaled_dot_product_attention({q}, {k}, {v}{masked}, dropout_p={rate} if {training} else 0.0, "
            f"scale={scale})")


def _fused_windowed_attention(fn: ir.Function, args: list[str]) -> str | None:
    # Only the specialisation whose queries are the keys' positions, row for row: a clone with
    # fewer query rows (linnet.middle.rows) or packed inputs keeps the Linnet body.
    types = [t for _, t in fn.params]
    if len(types) != 6 or types[0].dims[2] != types[1].dims[2]:
        return None
    return f"{WINDOWED}({', '.join(args)})"


#: std function (checked key) -> template over the emitted parameter names.  Each computes
#: exactly what the Linnet body does, with PyTorch's fused kernel.
FUSED: dict[str, Callable[[ir.Function, list[str]], str | None]] = {
    kernels.LAYER_NORM: _fused_layer_norm,
    kernels.ATTENTION: _fused_attention,
    kernels.GROUPED_ATTENTION: _fused_grouped_attention,
    kernels.ATTENTION_DROPOUT: _fused_attention_dropout,
    kernels.WINDOWED_ATTENTION: _fused_windowed_attention,
    kernels.GELU_ERF: lambda fn, a: f"F.gelu({a[0]})",
    kernels.GELU_TANH: lambda fn, a: f'F.gelu({a[0]}, approximate="tanh")',
    kernels.RELU: lambda fn, a: f"F.relu({a[0]})",
    kernels.SILU: lambda fn, a: f"F.silu({a[0]})",
    kernels.EMBEDDING: lambda fn, a: f"F.embedding({a[0]}, {a[1]})",
    kernels.LINEAR: lambda fn, a: f"F.linear({a[0]}, self.weight, self.bias)",
}


# ------------------------------------------------------------------ emissions

#: IR op -> its PyTorch spelling: the Python operators, then one template per op.
EMISSIONS = Emissions("torch", OPERATORS)
for _name in ("erf", "tanh", "exp", "log", "sqrt", "rsqrt", "sigmoid", "sin", "cos"):
    EMISSIONS.add(_name, function_call(f"torch.{_name}"))


@EMISSIONS.register("gelu_tanh")
def _emit_gelu_tanh(w, e: ir.Op, scope: Scope):
    return f'F.gelu({arg_texts(w, e, scope)[0]}, approximate="tanh")', ATOM


#: `activation`'s kinds (linnet.ops.ACTIVATIONS) as torch calls, the ones std's functions fuse to.
_ACTIVATIONS = {"gelu_erf": "F.gelu({})", "gelu_tanh": 'F.gelu({}, approximate="tanh")', "relu": "F.relu({})",
                "silu": "F.silu({})"}


@EMISSIONS.register("activation")
def _emit_activation(w, e: ir.Op, scope: Scope):
    return _ACTIVATIONS[e.attr("kind")].format(arg_texts(w, e, scope)[0]), ATOM


@EMISSIONS.register("dropout")
def _emit_dropout(w, e: ir.Op, scope: Scope):
    # The identity unless the module is in train mode (`.train()`), as transformers' nn.Dropout.
    x, rate = arg_texts(w, e, scope)
    return f"F.dropout({x}, {rate}, {w.mode_arg(scope)})", ATOM


@EMISSIONS.register("maximum", "minimum")
def _emit_bound(w, e: ir.Op, scope: Scope):
    a = arg_texts(w, e, scope)
    if isinstance(e.args[1], ir.Scalar):
        bound = "min" if e.op == "maximum" else "max"
        return f"torch.clamp({a[0]}, {bound}={a[1]})", ATOM
    return f"torch.{e.op}({a[0]}, {a[1]})", ATOM


@EMISSIONS.register("select")
def _emit_select(w, e: ir.Op, scope: Scope):
    return f"torch.where({', '.join(arg_texts(w, e, scope))})", ATOM


@EMISSIONS.register("transpose")
def _emit_transpose(w, e: ir.Op, scope: Scope):
    return f"{first_atom(w, e, scope)}.transpose(-2, -1)", ATOM


@EMISSIONS.register("softmax")
def _emit_softmax(w, e: ir.Op, scope: Scope):
    return f"torch.softmax({arg_texts(w, e, scope)[0]}, dim={e.attr('axis')})", ATOM


@EMISSIONS.register("cumsum")
def _emit_cumsum(w, e: ir.Op, scope: Scope):
    # torch widens integer cumsums to int64; keep the declared dtype
    return (f"torch.cumsum({arg_texts(w, e, scope)[0]}, dim={e.attr('axis')}, "
            f"dtype={torch_dtype(e.type.dtype)})", ATOM)


@EMISSIONS.register("sum", "mean", "max")
def _emit_reduce(w, e: ir.Op, scope: Scope):
    method = "amax" if e.op == "max" else e.op
    return f"{first_atom(w, e, scope)}.{method}(dim={e.attr('axis')}, keepdim=True)", ATOM


@EMISSIONS.register("concat")
def _emit_concat(w, e: ir.Op, scope: Scope):
    parts = concat_parts(w, e, scope, lambda atom, shape: f"{atom}.expand({shape})")
    if len(parts) == 2 and _onto_input(e.args[0], scope):
        # A cache grown by one concat a step (a decoder's `decode`): `generate` may hold the
        # input in a preallocated buffer that takes the new part in place (`torch_cache`).
        return f"{CAT_ONTO}({parts[0]}, {parts[1]}, {e.attr('axis')})", ATOM
    return f"torch.cat([{', '.join(parts)}], dim={e.attr('axis')})", ATOM


#: The generated module's helper for a concat onto an input, and its registry of buffers.
CAT_ONTO, BUFFERS = "_cat_onto", "_BUFFERS"
CAT_ONTO_SOURCE = f"""\
#: Storage -> a preallocated cache buffer (linnet/backends/torch_cache.py) that `{CAT_ONTO}` may
#: write into in place; linnet's `generate` fills it for the length of one call. Empty, as it
#: is everywhere else, `{CAT_ONTO}` is `torch.cat`.
{BUFFERS} = {{}}


def {CAT_ONTO}(a, b, dim):
    buffer = {BUFFERS}.get(a.untyped_storage().data_ptr()) if {BUFFERS} else None
    return torch.cat([a, b], dim=dim) if buffer is None else buffer.append(a, b, dim)
"""


#: The generated module's helper for `std.nn.attention::windowed_attention`, and its queries per chunk.
WINDOWED, WINDOW_CHUNK = "_linnet_windowed_attention", 64
WINDOWED_SOURCE = f"""\
def {WINDOWED}(q, k, v, scale, mask, window):
    # std.nn.attention::windowed_attention: softmax(q k^T * scale + band + mask) v, the band
    # {kernels.WINDOW_OUTSIDE} (std's OUTSIDE) at keys more than `window` positions from the query.  A window of
    # S - 1 or more has no band: SDPA over the padding mask alone.  Otherwise {WINDOW_CHUNK} queries at a
    # time, each chunk reading only the keys within `window` of one of its queries: the keys
    # left out are ones the body gives weight exactly 0, so each row is the same softmax over
    # the keys that count, and no [S, S] scores or mask exist.
    S = q.shape[-2]
    w = int(window)
    if w >= S - 1:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    index = torch.arange(S, device=q.device)
    parts = []
    for start in range(0, S, {WINDOW_CHUNK}):
        stop = min(start + {WINDOW_CHUNK}, S)
        low, high = (max(0, start - w), min(S, stop + w)) if w >= 0 else (0, S)
        distance = (index[start:stop, None] - index[None, low:high]).abs()
        band = torch.where(distance > w, {kernels.WINDOW_OUTSIDE}, 0.0).to(q.dtype) + mask[..., low:high]
        parts.append(F.scaled_dot_product_attention(q[..., start:stop, :], k[..., low:high, :],
                                                    v[..., low:high, :], attn_mask=band, scale=scale))
    return torch.cat(parts, dim=-2)
"""


def _onto_input(arg: ir.Expr, scope: Scope) -> bool:
    """`arg` is one of the function's inputs, or a slot of one (`cache[i + 1]`: integer indices
    only), as a decoder's cache is where its `decode` appends a position."""
    if isinstance(arg, ir.Op) and arg.op == "index" and all(item[0] == "index" for item in arg.attr("items")):
        arg = arg.args[0]
    return isinstance(arg, ir.Ref) and any(name == arg.name for name, _ in scope.fn.params)


@EMISSIONS.register("take")
def _emit_take(w, e: ir.Op, scope: Scope):
    table, ids = arg_texts(w, e, scope)
    if e.args[0].type.rank == 2:
        return f"F.embedding({ids}, {table})", ATOM
    return f"{first_atom(w, e, scope)}[{ids}]", ATOM


@EMISSIONS.register("reshape")
def _emit_reshape(w, e: ir.Op, scope: Scope):
    shape = ", ".join(py_dim(d) for d in e.attr("shape")) or "()"  # () for rank 0
    return f"{first_atom(w, e, scope)}.reshape({shape})", ATOM


@EMISSIONS.register("permute")
def _emit_permute(w, e: ir.Op, scope: Scope):
    return f"{first_atom(w, e, scope)}.permute({', '.join(map(str, e.attr('perm')))})", ATOM


@EMISSIONS.register("iota")
def _emit_iota(w, e: ir.Op, scope: Scope):
    device = next((py_name(n) for n, t in scope.fn.params if t is not None), None)
    place = f", device={device}.device" if device else ""
    return f"torch.arange({py_dim(e.attr('n'))}, dtype={torch_dtype(e.attr('dtype'))}{place})", ATOM


@EMISSIONS.register("cast")
def _emit_cast(w, e: ir.Op, scope: Scope):
    if isinstance(e.args[0], ir.DimValue):
        return f"torch.tensor({arg_texts(w, e, scope)[0]}, dtype={torch_dtype(e.attr('dtype'))})", ATOM
    return f"{first_atom(w, e, scope)}.to({torch_dtype(e.attr('dtype'))})", ATOM


@EMISSIONS.register("index")
def _emit_index(w, e: ir.Op, scope: Scope):
    return f"{first_atom(w, e, scope)}[{', '.join(py_index_item(i) for i in e.attr('items'))}]", ATOM


@EMISSIONS.register("pack_index")
def _emit_pack_index(w, e: ir.Op, scope: Scope):
    # The flat positions of the kept tokens, in row-major order (int64).
    return f"torch.nonzero({first_atom(w, e, scope)}.reshape(-1)).squeeze(1)", ATOM


@EMISSIONS.register("pack_rows")
def _emit_pack_rows(w, e: ir.Op, scope: Scope):
    x, rows = arg_texts(w, e, scope)
    axis = e.attr("axis")
    return f"{first_atom(w, e, scope)}.flatten({axis}, {axis + 1}).index_select({axis}, {rows})", ATOM


@EMISSIONS.register("unpack_rows")
def _emit_unpack_rows(w, e: ir.Op, scope: Scope):
    # A zero row in front of the packed rows, then every slot reads its row (0: that zero row).
    x, slots = arg_texts(w, e, scope)
    axis, rank = e.attr("axis"), e.args[0].type.rank
    pad = ", ".join(["0, 0"] * (rank - axis - 1) + ["1, 0"])
    padded = f"F.pad({x}, ({pad}))"
    if axis == 0:
        return f"{padded}[{w._arg(e.args[1], scope, ATOM)}]", ATOM
    return f"{padded}.index_select({axis}, {slots}.reshape(-1)).unflatten({axis}, {slots}.shape)", ATOM


class TorchEmitter(PyWriter):
    FUSED = FUSED
    fused_note = "fused kernel for"
    EMISSIONS = EMISSIONS
    STACK = "torch.stack"

    def __init__(self, program: ir.Program, fused: bool = True):
        self.program = program
        self.fused = fused
        self.namer = FunctionNamer()
        self._methods: set[str] = set()  # method names of the class being written
        self.dropping = dropping_functions(program)

    def _mode_param(self, fn: ir.Function) -> str | None:
        return None if fn.block else "training"  # a method reads its module's own flag

    def mode_arg(self, scope: Scope) -> str:
        return "self.training" if scope.fn.block else "training"

    # ----------------------------------------------------------------- module
    def emit(self, title: str = "PyTorch module") -> str:
        files = sorted({f.span.file for f in self.program.functions.values()})
        lines = header(self.program, title, files)
        lines += ["", "import torch", "import torch.nn.functional as F", "from torch import nn", ""]
        free_defs: list[int] = []
        methods: dict[str, list[int]] = {b: [] for b in self.program.blocks}
        for fn_id in emission_order(self.program):
            fn = self.program.functions[fn_id]
            handle = self.namer.assign(fn, self._function(fn))
            if handle is not None:
                (methods[fn.block] if fn.block else free_defs).append(handle)
        texts = [self.namer.text(h) for h in free_defs]
        # A module-level helper is written out only when some emitted function calls it.
        emitted = texts + [self.namer.text(h) for hs in methods.values() for h in hs]
        for helper, source in ((CAT_ONTO, CAT_ONTO_SOURCE), (WINDOWED, WINDOWED_SOURCE)):
            if any(f"{helper}(" in text for text in emitted):
                lines += ["", source]
        for text in texts:
            lines += ["", text, ""]
        for block_id in self._class_order():
            texts = [self.namer.text(h) for h in methods[block_id]]
            lines += ["", self._class(self.program.blocks[block_id], texts), ""]
        return "\n".join(lines).rstrip() + "\n"

    def _class_order(self) -> list[str]:
        """Sub-block classes before the classes that use them."""
        order: list[str] = []

        def visit(block_id: str) -> None:
            if block_id in order:
                return
            for sub in self.program.blocks[block_id].subs:
                visit(sub.block)
            order.append(block_id)

        visit(self.program.root)
        return order

    def _class(self, block: ir.Block, methods: list[str]) -> str:
        source = comment_text(f"{source_label(block.span.file)}:{block.span.line}" if block.span else block.source)
        lines = [f"class {py_name(block.id)}(nn.Module):",
                 f'    """{comment_text(block.source)}<{comment_generics(block.generics)}>  ({source})"""', "",
                 "    def __init__(self):", "        super().__init__()"]
        method_names = {py_name(f.name) for f in self.program.functions.values() if f.block == block.id}
        for name, t in block.params:
            shape = ", ".join(py_dim(d) for d in t.dims) or "()"  # a rank-0 param: torch.empty(())
            # A method of the same name would make `self.<name> = ...` refuse the param.
            target = f'self._parameters["{py_name(name)}"]' if py_name(name) in method_names else f"self.{py_name(name)}"
            lines.append(f"        {target} = nn.Parameter(torch.empty({shape}, "
                         f"dtype={torch_dtype(t.dtype)}), requires_grad=False)")
        for sub in block.subs:
            cls = py_name(sub.block)
            if sub.count is None:
                lines.append(f"        self.{py_name(sub.name)} = {cls}()")
            else:
                lines.append(f"        self.{py_name(sub.name)} = nn.ModuleList({cls}() for _ in range({sub.count}))")
        for text in methods:
            lines += [""] + ["    " + line if line else "" for line in text.splitlines()]
        return "\n".join(lines)

    # -------------------------------------------------------------- functions
    def _function(self, fn: ir.Function) -> str:
        # The class's own method names: a param or sub of the same name (an entry `mlm`
        # over a sub `mlm`) is hidden by the method on `self.<name>`, so it is reached by name.
        self._methods = {py_name(f.name) for f in self.program.functions.values() if f.block == fn.block}
        return super()._function(fn)

    def _full(self, shape: str, value: int, dtype: str, like: str) -> str:
        return f"torch.full({shape}, {value}, dtype={torch_dtype(dtype)}, device={like}.device)"

    def _member(self, name: str, table: str) -> str:
        attribute = py_name(name)
        if attribute in self._methods:
            return f'self.{table}["{attribute}"]'
        return f"self.{attribute}"

    # ------------------------------------------------------------ expressions
    def _param_ref(self, e: ir.ParamRef) -> str:
        return self._member(e.name, "_parameters")

    def _loop_source(self, member: str) -> str:
        return self._member(member, "_modules")

    def _call(self, e: ir.Call, scope: Scope) -> str:
        texts = [self._expr(a, scope)[0] for a in e.args]
        if e.function in self.dropping and self._mode_param(self.program.functions[e.function]):
            texts.append(self.mode_arg(scope))
        args = ", ".join(texts)
        name = self.namer.names[e.function]
        if e.receiver is None:
            return f"{name}({args})"
        target = "self" if e.receiver == ir.SIBLING else (
            py_name(e.receiver) if e.receiver in scope.loops else self._member(e.receiver, "_modules"))
        if name == "forward" and e.receiver != ir.SIBLING:
            return f"{target}({args})"  # nn.Module.__call__ runs forward
        return f"{target}.{name}({args})"


def emit(program: ir.Program, fused: bool = True, title: str = "PyTorch module") -> str:
    return TorchEmitter(program, fused).emit(title)


def write(program: ir.Program, out_dir: Path, fused: bool = True) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "model.py"
    path.write_text(emit(program, fused), encoding="utf-8")
    return path
