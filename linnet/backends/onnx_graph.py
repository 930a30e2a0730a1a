"""Lowered program -> ONNX graphs, written node by node with `onnx.helper` (not torch.onnx).

Layout decisions (docs/backend-onnx.md has the long form):

* The call tree is inlined.  ONNX local functions would mirror the Linnet functions, but
  runtimes inline them anyway before optimising, TensorRT and older ONNX Runtime builds
  (as shipped in Triton) handle them unevenly, and the graph stays readable without them:
  every node's name is `<block path><function>/<Op>` (`layers.3.attention.forward/MatMul`)
  and its doc_string names the Linnet function, its generics and the `file:line` of the
  statement it came from, which Netron shows next to the node.
* One file holds every entry when all entries take the same inputs (same names, dtypes and
  dims); each entry then has its own graph output, named by nest.toml `[outputs]`.  Shared
  work is emitted once: a call is memoised on (function, block path, argument values), so
  `pool`, which calls `forward`, reads the encoder output `forward` already produced.  When
  the entries' inputs differ, each entry gets a file of its own.  The root entry's file is
  always `model.onnx`; any other is `model.<entry>.onnx`.
* Opset 17: the oldest opset with LayerNormalization, so the files load in the widest range
  of runtimes.  GELU is the Linnet body (the erf formula), which ONNX Runtime fuses back
  into one kernel itself.
* Graph inputs keep their declared dtypes (i32 token ids stay INT32: Gather takes int32
  indices), and dims the entry leaves free are `dim_param`s named after the Linnet dims.
* f16/bf16: weights and activations are in that dtype, but LayerNorm and softmax run in f32
  (Cast up before, Cast down after).  Their reductions overflow or lose the small variance
  in half precision (the known fp16 LayerNorm problem of BERT exports: sums of squares over
  768 channels pass 65504), and the softmax exponentials over long rows lose the small
  probabilities.
* `bf16_compute="f32"` builds a variant for runtimes without bf16 arithmetic (ONNX Runtime's
  CPU provider has bf16 Cast, Gather and data movement, but no bf16 Add, MatMul, ...): every
  arithmetic node reads its bf16 inputs cast to f32 and its result is rounded back to bf16,
  so every tensor between nodes is still bf16, as with a GPU's bf16 kernels (which also
  accumulate in f32).  It is a different graph and is cached separately.

Why one long module: ONNX has no functions the way Python does, so this emitter inlines
every call and keeps the graph's SSA names itself; the op emissions, the fused std kernels
and the inlining share that name and scope state and are kept together.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .. import __version__, codes, dtypes, kernels
from ..middle import ir
from ..diagnostics import Diagnostic, LinnetError
from ..dims import DimExpr, FloorDiv, Mod, Sym, const
from ..ops import Emissions
from ..paths import source_label

OPSET = 17
#: IR version 8 is the lowest that opset 17 needs; older runtimes read it too.
IR_VERSION = 8
#: protobuf refuses messages over 2 GiB; above this the weights go to an external file.
EXTERNAL_DATA_BYTES = 2 * 1024 ** 3 - 64 * 1024 ** 2

#: Ops that move or reinterpret data without arithmetic; the bf16 CPU variant leaves them in bf16.
_DATA_OPS = frozenset({"Cast", "Shape", "Reshape", "Transpose", "Gather", "Slice", "Squeeze", "Unsqueeze",
                       "Concat", "Identity", "Range", "NonZero"})

_BINARY = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "matmul": "MatMul", "less": "Less",
           "greater": "Greater", "equal": "Equal", "maximum": "Max", "minimum": "Min"}
_UNARY = {"neg": "Neg", "erf": "Erf", "tanh": "Tanh", "exp": "Exp", "log": "Log", "sqrt": "Sqrt",
          "sigmoid": "Sigmoid"}
_REDUCE = {"sum": "ReduceSum", "mean": "ReduceMean", "max": "ReduceMax"}
_LOW_PRECISION = ("f16", "bf16")


def elem_type(dtype: str) -> int:
    """A Linnet dtype as an ONNX TensorProto element type."""
    return dtypes.by_name(dtype).onnx


def unsupported(message: str, fn: ir.Function | None = None) -> LinnetError:
    span = fn.span if fn is not None else None
    return LinnetError(Diagnostic(codes.ONNX_UNSUPPORTED, f"the onnx backend cannot express {message}", span))


# --------------------------------------------------------------------- file layout


@dataclass
class ModelFile:
    """One ONNX file: its name, the entries it answers, and (once emitted) the model."""

    file: str
    entries: list[str]
    model: object = None  # onnx.ModelProto
    #: Initializer name -> its `DeferredWeight`, for a model emitted with `defer_weights=True`
    #: (those initializers have no data in `model` until `inline_weights` or the writer
    #: `onnx_external.ExternalWeights` puts it in).
    weights: dict = field(default_factory=dict)


@dataclass(frozen=True)
class DeferredWeight:
    """A param's bytes, not yet copied into an initializer: the checkpoint's array as loaded
    and whether the initializer stores it transposed.  A graph of bert-base holds ~420 MB of
    weights, and the runtime's export writes one graph per entry; deferred, each graph's proto
    holds names and shapes only, and each weight is copied (and transposed) once, when written."""

    array: object  # numpy.ndarray
    transposed: bool = False

    @property
    def nbytes(self) -> int:
        return self.array.nbytes

    def payload(self):
        """The initializer's raw_data as a flat uint8 array (what `array.tobytes()` gives,
        C order, without the copy where the array is already contiguous)."""
        import numpy as np

        array = np.ascontiguousarray(self.array.T if self.transposed else self.array)
        return array.reshape(-1).view(np.uint8)


def inline_weights(model_file: ModelFile) -> None:
    """Put the deferred weights' bytes into the model's initializers (a self-contained file)."""
    for tensor in model_file.model.graph.initializer:
        weight = model_file.weights.get(tensor.name)
        if weight is not None:
            tensor.raw_data = weight.payload().tobytes()
    model_file.weights = {}


def _signature(entry: ir.Entry) -> tuple:
    return tuple((name, t.dtype, tuple(str(d) for d in t.dims)) for name, t in entry.inputs)


def layout(program: ir.Program, root_entry: str | None = None) -> list[ModelFile]:
    """Which entries go to which file: the root entry and every entry taking the same inputs
    share `model.onnx`; each other entry has a file of its own (a loss entry, which also
    takes labels, a decoder step that takes a cache, or an entry with a `pairwise_result`).

    The root entry comes first and its file is `model.onnx`, so a caller that wants "the"
    model can take the first path.
    """
    names = list(program.entries)
    if root_entry in program.entries:
        names.remove(root_entry)
        names.insert(0, root_entry)
    shared = _signature(program.entries[names[0]])
    # ONNX Runtime runs every node of a graph whatever outputs a call asks for, so an entry
    # with a result per pair of positions (attention probabilities) would make every call of
    # model.onnx pay for it: it gets a file of its own.
    first = [n for n in names if _signature(program.entries[n]) == shared
             and (n == names[0] or not ir.pairwise_result(program.entries[n]))]
    return [ModelFile("model.onnx", first)] + [ModelFile(f"model.{n}.onnx", [n]) for n in names if n not in first]


def value_dims(t: ir.TensorType) -> list[int | str | None]:
    """Graph-boundary dims: numbers, names of free dims, None for a computed expression."""
    out: list[int | str | None] = []
    for d in t.dims:
        value = d.as_int()
        if value is not None:
            out.append(value)
        else:
            text = str(d)
            out.append(text if text.isidentifier() else None)
    return out


# -------------------------------------------------------------------------- emitter


@dataclass
class _Frame:
    """One inlined function activation: where its block sits and what its names hold."""

    fn: ir.Function
    prefix: str  # the block's param path prefix, `layers.3.attention.`; "" at the root
    env: dict[str, str] = field(default_factory=dict)  # Linnet local -> ONNX value name
    loops: dict[str, str] = field(default_factory=dict)  # loop variable -> prefix of its element
    indices: dict[str, int] = field(default_factory=dict)  # an enumerating loop's index -> this pass

    def resolve(self, expr: DimExpr) -> DimExpr:
        """`expr` with the pass numbers of the loops around it filled in."""
        return expr.substitute(self.indices) if self.indices else expr


class GraphEmitter:
    """Builds the nodes and initializers of one graph."""

    def __init__(self, program: ir.Program, tensors: dict, *, bf16_compute: str = "native",
                 params_in_place: bool = False, defer_weights: bool = False):
        if bf16_compute not in ("native", "f32"):
            raise ValueError(f"bf16_compute must be 'native' or 'f32', got {bf16_compute!r}")
        self.program = program
        self.tensors = tensors
        self.emulate_bf16 = bf16_compute == "f32"
        #: `matmul(x, transpose(P))` of a param as Gemm transB=1 reading P as stored (the
        #: export for sessions sharing one copy of the weights; `_matmul_by_transposed_param`).
        self.params_in_place = params_in_place
        #: Params become initializers without data, their arrays kept in `weights` (`DeferredWeight`).
        self.defer_weights = defer_weights
        self.weights: dict[str, DeferredWeight] = {}
        self.nodes: list = []
        self.initializers: list = []
        self.types: dict[str, int] = {}  # value name -> element type, for the f32 islands
        self._names: set[str] = set()
        self._consts: dict[tuple, str] = {}
        self._params: dict[tuple[str, bool], str] = {}
        self._by_array: dict[tuple[int, bool], str] = {}  # tied weights share one initializer
        self._dims: dict[str, str] = {}
        self._memo: dict[tuple, str] = {}
        self._casts: dict[tuple[str, int], str] = {}
        self._dim_sources: dict[str, tuple[str, int]] = {}
        self.initializer_bytes = 0

    # --------------------------------------------------------------- names
    def reserve(self, name: str) -> None:
        self._names.add(name)

    def _unique(self, base: str) -> str:
        name, n = base, 2
        while name in self._names:
            name, n = f"{base}_{n}", n + 1
        self._names.add(name)
        return name

    # --------------------------------------------------------------- nodes
    def node(self, op_type: str, inputs: list[str], out_type: int, *, scope: str, doc: str,
             output: str | None = None, **attrs) -> str:
        """Append one node; returns its output's name.  `out_type` is its element type."""
        from onnx import TensorProto, helper

        name = self._unique(f"{scope}/{op_type}") if output is None else output
        if output is not None:
            self._names.add(output)
        if (self.emulate_bf16 and op_type not in _DATA_OPS
                and any(self.types.get(i) == TensorProto.BFLOAT16 for i in inputs if i)):
            # The bf16 CPU variant: compute this node in f32 and round its result to bf16.
            wide = [self.cast(i, TensorProto.FLOAT, scope, doc) if self.types.get(i) == TensorProto.BFLOAT16
                    else i for i in inputs]
            wide_type = TensorProto.FLOAT if out_type == TensorProto.BFLOAT16 else out_type
            inner = self.node(op_type, wide, wide_type, scope=scope, doc=doc, **attrs)
            if out_type != TensorProto.BFLOAT16:
                return inner
            return self.node("Cast", [inner], out_type, scope=scope, doc=doc + " (rounded back to bf16)",
                             output=name, to=out_type)
        self.nodes.append(helper.make_node(op_type, inputs, [name], name=name, doc_string=doc, **attrs))
        self.types[name] = out_type
        return name

    def cast(self, value: str, to: int, scope: str, doc: str) -> str:
        if self.types.get(value) == to:
            return value
        key = (value, to)
        if key not in self._casts:
            self._casts[key] = self.node("Cast", [value], to, scope=scope, doc=doc, to=to)
        return self._casts[key]

    # ------------------------------------------------------- initializers
    def _initializer(self, name: str, array, elem: int, doc: str = "", deferred: DeferredWeight | None = None) -> str:
        """One initializer holding `array`; with `deferred`, it holds only the shape and the
        bytes come from `deferred` when the model is written."""
        from onnx import TensorProto

        tensor = TensorProto()
        tensor.name = name
        tensor.data_type = elem
        tensor.dims.extend(array.shape)
        if deferred is None:
            tensor.raw_data = array.tobytes()  # little-endian, as ONNX raw_data requires on x86/ARM
        else:
            self.weights[name] = deferred
        if doc:
            tensor.doc_string = doc
        self.initializers.append(tensor)
        self.types[name] = elem
        self._names.add(name)
        self.initializer_bytes += array.nbytes
        return name

    def constant(self, value, dtype: str, shape: tuple = ()) -> str:
        """A small constant (scalar or shape list) as an initializer, one per value."""
        import numpy as np

        key = (dtype, shape, repr(value))
        if key not in self._consts:
            numpy_type = dtypes.by_name(dtype).numpy_type()
            if dtype == "bf16":  # narrowed from the f32 constant, not rounded from the Python float
                array = np.asarray(value, dtype=np.float32).astype(numpy_type).reshape(shape)
            else:
                array = np.asarray(value, dtype=numpy_type).reshape(shape)
            shown = value if not isinstance(value, float) else float(f"{value:.9g}")
            name = self._unique(f"const.{dtype}.{shown}".replace(" ", ""))
            self._consts[key] = self._initializer(name, array, elem_type(dtype))
        return self._consts[key]

    def param(self, path: str, t: ir.TensorType, transposed: bool = False) -> str:
        """The initializer of a Linnet param by path; `transposed` stores it as [In, Out]."""
        key = (path, transposed)
        if key not in self._params:
            if path not in self.tensors:
                raise unsupported(f"the param `{path}`: the weights given have no tensor for it")
            array = self.tensors[path]
            if tuple(array.shape) != tuple(d.as_int() for d in t.dims):
                raise unsupported(f"the param `{path}`: weights of shape {tuple(array.shape)}, declared {t}")
            tied = self._by_array.get((id(array), transposed))
            if tied is not None:
                self._params[key] = tied
            else:
                doc = f"Linnet param {path}: {t}"
                name = path
                deferred = DeferredWeight(array, transposed) if self.defer_weights else None
                if transposed:
                    import numpy as np

                    # Deferred, the transposed copy is made when the weight is written, one at a time.
                    array = array.T if deferred is not None else np.ascontiguousarray(array.T)
                    doc += ", stored transposed for MatMul"
                    name = f"{path}^T"
                # Unique, since an input or an entry's output may already have the name.
                name = self._unique(name)
                self._params[key] = self._initializer(name, array, elem_type(t.dtype), doc, deferred)
                self._by_array[(id(self.tensors[path]), transposed)] = self._params[key]
        return self._params[key]

    # --------------------------------------------------------------- dims
    def bind_dims(self, entry: ir.Entry) -> None:
        self._dim_sources = dict(entry.dim_sources)

    def dim(self, expr: DimExpr) -> str:
        """A dim's value as an int64 tensor of shape [1], computed from the input shapes."""
        from onnx import TensorProto

        value = expr.as_int()
        if value is not None:
            return self.constant([value], "i64", (1,))
        text = str(expr)
        if text in self._dims:
            return self._dims[text]
        i64 = TensorProto.INT64
        doc = f"the dim {text}"
        total = None
        for monomial, coeff in expr.terms:
            term = self.constant([coeff], "i64", (1,)) if (coeff != 1 or not monomial) else None
            for atom, power in monomial:
                factor = self._atom(atom)
                for _ in range(power):
                    term = factor if term is None else self.node("Mul", [term, factor], i64, scope="dims", doc=doc)
            total = term if total is None else self.node("Add", [total, term], i64, scope="dims", doc=doc)
        self._dims[text] = total
        return total

    def _atom(self, atom) -> str:
        from onnx import TensorProto

        if isinstance(atom, Sym):
            if atom.name not in self._dim_sources:
                raise unsupported(f"the dim `{atom.name}`: no input of the entry has an axis of that size")
            source, axis = self._dim_sources[atom.name]
            key = f"dim:{atom.name}"
            if key not in self._dims:
                self._dims[key] = self.node("Shape", [source], TensorProto.INT64, scope=f"dims/{atom.name}",
                                            doc=f"{atom.name} = {source}.shape[{axis}]", start=axis, end=axis + 1)
            return self._dims[key]
        if isinstance(atom, (FloorDiv, Mod)):
            # Dims are never negative, so ONNX's truncating integer Div is floor division here.
            op = "Div" if isinstance(atom, FloorDiv) else "Mod"
            return self.node(op, [self.dim(atom.num), self.dim(atom.den)], TensorProto.INT64, scope="dims",
                             doc=f"the dim {atom}")
        raise unsupported(f"the dim expression {atom}")

    def shape(self, dims: tuple[DimExpr, ...]) -> str:
        if all(d.as_int() is not None for d in dims):
            return self.constant([d.as_int() for d in dims], "i64", (len(dims),))
        from onnx import TensorProto

        key = "shape:" + ", ".join(map(str, dims))
        if key not in self._dims:
            parts = [self.dim(d) for d in dims]
            self._dims[key] = self.node("Concat", parts, TensorProto.INT64, scope="dims",
                                        doc=f"the shape [{', '.join(map(str, dims))}]", axis=0)
        return self._dims[key]

    # --------------------------------------------------------- functions
    def call(self, fn_id: str, args: list[str], prefix: str, scalars: dict[int, float] | None = None) -> str:
        """Inline one function (or its fused form) once per block path and argument values.

        scalars: the arguments known at compile time (param index -> value), which a fused
        form may need as node attributes (LayerNormalization's epsilon).
        """
        key = (fn_id, prefix, tuple(args))
        if key in self._memo:
            return self._memo[key]
        fn = self.program.functions[fn_id]
        frame = _Frame(fn, prefix, {name: a for (name, _), a in zip(fn.params, args)})
        for dim, (param, axis) in fn.dim_sources.items():
            # A dim of the function's own (lowering's name for a product like B * C) is read
            # from the argument's shape, as the Python emitters read it from the parameter's.
            if dim not in self._dim_sources and frame.env.get(param):
                self._dim_sources[dim] = (frame.env[param], axis)
        fused = FUSED.get(fn.source)
        result = fused(self, frame, args, scalars or {}) if fused is not None else None
        if result is None:
            result = self._stmts(fn.body, frame)
            if result is None:
                raise unsupported(f"`{fn.id}`: its body ends without a return", fn)
        self._memo[key] = result
        return result

    def _stmts(self, stmts, frame: _Frame) -> str | None:
        for stmt in stmts:
            if isinstance(stmt, ir.Loop):
                member = self._sub(frame, stmt.member)
                # A collecting loop keeps the var's value as the loop starts and after each pass.
                collected = [frame.env[stmt.collect.var]] if stmt.collect is not None else []
                for i in stmt.passes(member.count or 0):
                    frame.loops[stmt.var] = f"{frame.prefix}{stmt.member}.{i}."
                    if stmt.index is not None:  # the body's dims see the pass number as a constant
                        frame.indices[stmt.index] = i
                    result = self._stmts(stmt.body, frame)
                    if result is not None:
                        return result
                    if stmt.collect is not None:
                        collected.append(frame.env[stmt.collect.var])
                frame.loops.pop(stmt.var, None)
                frame.indices.pop(stmt.index, None)
                if stmt.collect is not None:
                    frame.env[stmt.collect.into] = self._stack(collected, stmt, frame)
            elif isinstance(stmt, ir.Return):
                return self.expr(stmt.value, frame)
            else:
                frame.env[stmt.name] = self.expr(stmt.value, frame)
        return None

    def _stack(self, values: list[str], loop: ir.Loop, frame: _Frame) -> str:
        """The collected values on a new first axis: an Unsqueeze of each, then one Concat."""
        out = elem_type(loop.collect.type.dtype)
        scope = self.scope(frame)
        doc = self.doc(frame, loop.line) + f" (collect {loop.collect.var} into {loop.collect.into})"
        axes = self.constant([0], "i64", (1,))
        rows: dict[str, str] = {}  # a var the loop leaves unchanged is unsqueezed once
        for value in values:
            if value not in rows:
                rows[value] = self.node("Unsqueeze", [value, axes], out, scope=scope, doc=doc)
        return self.node("Concat", [rows[v] for v in values], out, scope=scope, doc=doc, axis=0)

    def _sub(self, frame: _Frame, member: str) -> ir.Sub:
        block = self.program.blocks[frame.fn.block]
        for sub in block.subs:
            if sub.name == member:
                return sub
        raise unsupported(f"the sub-block `{member}` of {block.id}", frame.fn)

    def _callee_prefix(self, frame: _Frame, receiver: str | None) -> str:
        if receiver is None or receiver == "self":
            return frame.prefix
        if receiver in frame.loops:
            return frame.loops[receiver]
        return f"{frame.prefix}{receiver}."

    # -------------------------------------------------------- expressions
    def scope(self, frame: _Frame) -> str:
        return f"{frame.prefix}{frame.fn.name}"

    def doc(self, frame: _Frame, line: int) -> str:
        fn = frame.fn
        generics = ", ".join(f"{k}={v}" for k, v in fn.generics.items())
        return f"{fn.source}<{generics}> at {source_label(fn.span.file)}:{line}"

    def expr(self, e: ir.Expr, frame: _Frame) -> str:
        if isinstance(e, ir.Ref):
            return frame.env[e.name]
        if isinstance(e, ir.ParamRef):
            return self.param(frame.prefix + e.name, e.type)
        if isinstance(e, ir.Scalar):
            return self._scalar(e.value, e.type.dtype)
        if isinstance(e, ir.DimValue):
            from onnx import TensorProto
            expr = frame.resolve(e.expr)
            return self.node("Squeeze", [self.dim(expr)], TensorProto.INT64, scope="dims",
                             doc=f"the dim {expr} as a scalar")
        if isinstance(e, ir.Absent):
            return ""
        if isinstance(e, ir.Call):
            callee = self.program.functions[e.function]
            # A compile-time number takes the dtype of the parameter it is passed to
            # (`rsqrt(cast<f32>(Dh))` passed as `scale: T` is an f16 constant in an f16 model).
            args = [self._scalar(a.value, t.dtype) if isinstance(a, ir.Scalar) and t is not None
                    else self.expr(a, frame) for a, (_, t) in zip(e.args, callee.params)]
            scalars = {i: float(a.value) for i, a in enumerate(e.args) if isinstance(a, ir.Scalar)}
            return self.call(e.function, args, self._callee_prefix(frame, e.receiver), scalars)
        return self._op(e, frame)

    def _scalar(self, value: float, dtype: str) -> str:
        return self.constant(float(value) if dtypes.by_name(dtype).is_float else int(value), dtype)

    def _op(self, e: ir.Op, frame: _Frame) -> str:
        site = _Site(self, self.scope(frame), self.doc(frame, e.line), elem_type(e.type.dtype), frame)
        if self.params_in_place and _transposed_param(e) is not None:
            return _matmul_by_transposed_param(site, e, self.expr(e.args[0], frame),
                                               self.expr(_transposed_param(e), frame))
        args = [self.expr(a, frame) for a in e.args]
        emission = EMISSIONS.get(e.op)
        if emission is None:  # tests/test_ops.py proves the table complete but for declared refusals
            reason = EMISSIONS.refusals.get(e.op)
            raise unsupported(f"the primitive `{e.op}`" + (f": {reason}" if reason else ""), frame.fn)
        return emission(site, e, args)

    def _index(self, e: ir.Op, x: str, frame: _Frame, scope: str, doc: str) -> str:
        """`x[...]` as one Slice over the sliced and indexed axes, then a Squeeze of the indexed ones."""
        starts, ends, axes, dropped = [], [], [], []
        for axis, item in enumerate(e.attr("items")):
            item = (item[0],) + tuple(frame.resolve(b) if b is not None else None for b in item[1:])
            if item[0] == "index":
                starts.append(item[1])
                ends.append(item[1] + 1)
                axes.append(axis)
                dropped.append(axis)
            else:
                _, start, stop = item
                if start.as_int() == 0 and stop is None:
                    continue  # `:` keeps the whole axis
                starts.append(start)
                ends.append(stop if stop is not None else e.args[0].type.dims[axis])
                axes.append(axis)
        out = elem_type(e.type.dtype)
        if axes:
            x = self.node("Slice", [x, self.shape(tuple(starts)), self.shape(tuple(ends)),
                                    self.constant(axes, "i64", (len(axes),))], out, scope=scope, doc=doc)
        if dropped:
            x = self.node("Squeeze", [x, self.constant(dropped, "i64", (len(dropped),))], out, scope=scope, doc=doc)
        return x


# ------------------------------------------------------------------ emissions


@dataclass(frozen=True)
class _Site:
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
def _emit_dropout(site: _Site, e: ir.Op, args: list[str]) -> str:
    # An exported graph is for inference, where dropout is the identity; the node keeps the
    # place visible (its doc string points at the source line).
    return site.node("Identity", [args[0]])


@EMISSIONS.register("rsqrt")
def _emit_rsqrt(site: _Site, e: ir.Op, args: list[str]) -> str:
    return site.node("Reciprocal", [site.node("Sqrt", args)])


@EMISSIONS.register("gelu_tanh")
def _emit_gelu_tanh(site: _Site, e: ir.Op, args: list[str]) -> str:
    """`0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))`: opset 17 has no Gelu (it came in 20)."""
    (x,), dtype = args, e.type.dtype
    number = site.em._scalar
    cube = site.node("Pow", [x, number(3.0, dtype)])
    inner = site.node("Add", [x, site.node("Mul", [cube, number(0.044715, dtype)])])
    tanh = site.node("Tanh", [site.node("Mul", [inner, number(math.sqrt(2.0 / math.pi), dtype)])])
    return site.node("Mul", [site.node("Mul", [x, site.node("Add", [tanh, number(1.0, dtype)])]),
                             number(0.5, dtype)])


@EMISSIONS.register("activation")
def _emit_activation(site: _Site, e: ir.Op, args: list[str]) -> str:
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


def _transposed_param(e: ir.Op):
    """The 2-D param P of `matmul(x, transpose(P))` (a tied head: GPT-2's `lm_head` over
    `wte`), f32/f64, else None."""
    if e.op != "matmul" or e.type.dtype not in _GEMM_DTYPES or e.args[0].type.rank < 2:
        return None
    b = e.args[1]
    if isinstance(b, ir.Op) and b.op == "transpose" and isinstance(b.args[0], ir.ParamRef) \
            and b.args[0].type.rank == 2:
        return b.args[0]
    return None


def _matmul_by_transposed_param(site: _Site, e: ir.Op, x: str, param: str) -> str:
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
    shape = em.shape(dims) if all(_known(em, d) for d in dims) else _leading_shape(em, x, outputs, site.scope, doc)
    return em.node("Reshape", [y, shape], site.out, scope=site.scope, doc=doc + ", rows restored")


@EMISSIONS.register("select")
def _emit_select(site: _Site, e: ir.Op, args: list[str]) -> str:
    return site.node("Where", args)


@EMISSIONS.register("transpose")
def _emit_transpose(site: _Site, e: ir.Op, args: list[str]) -> str:
    rank = e.args[0].type.rank
    return site.node("Transpose", args, perm=list(range(rank - 2)) + [rank - 1, rank - 2])


@EMISSIONS.register("permute")
def _emit_permute(site: _Site, e: ir.Op, args: list[str]) -> str:
    return site.node("Transpose", args, perm=list(e.attr("perm")))


@EMISSIONS.register("softmax")
def _emit_softmax(site: _Site, e: ir.Op, args: list[str]) -> str:
    return softmax(site.em, args[0], e.type.dtype, e.attr("axis"), site.scope, site.doc)


@EMISSIONS.register(*_REDUCE)
def _emit_reduce(site: _Site, e: ir.Op, args: list[str]) -> str:
    axis = e.attr("axis")
    if e.op == "sum":  # ReduceSum takes its axes as an input since opset 13
        return site.node("ReduceSum", [args[0], site.em.constant([axis], "i64", (1,))], keepdims=1)
    return site.node(_REDUCE[e.op], args, axes=[axis], keepdims=1)


@EMISSIONS.register("cumsum")
def _emit_cumsum(site: _Site, e: ir.Op, args: list[str]) -> str:
    # keeps the input dtype (an INT32 mask stays INT32)
    return site.node("CumSum", [args[0], site.em.constant(e.attr("axis"), "i64")])


@EMISSIONS.register("concat")
def _emit_concat(site: _Site, e: ir.Op, args: list[str]) -> str:
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
def _emit_take(site: _Site, e: ir.Op, args: list[str]) -> str:
    return site.node("Gather", args, axis=0)


@EMISSIONS.register("reshape")
def _emit_reshape(site: _Site, e: ir.Op, args: list[str]) -> str:
    return site.node("Reshape", [args[0], site.em.shape(tuple(e.attr("shape")))])


@EMISSIONS.register("iota")
def _emit_iota(site: _Site, e: ir.Op, args: list[str]) -> str:
    em, dtype = site.em, e.attr("dtype")
    limit = em.node("Squeeze", [em.dim(e.attr("n"))], elem_type("i64"), scope=site.scope, doc=site.doc)
    limit = em.cast(limit, site.out, site.scope, site.doc)
    return site.node("Range", [em.constant(0, dtype), limit, em.constant(1, dtype)])


@EMISSIONS.register("cast")
def _emit_cast(site: _Site, e: ir.Op, args: list[str]) -> str:
    return site.em.cast(args[0], elem_type(e.attr("dtype")), site.scope, site.doc)


@EMISSIONS.register("index")
def _emit_index(site: _Site, e: ir.Op, args: list[str]) -> str:
    return site.em._index(e, args[0], site.frame, site.scope, site.doc)


@EMISSIONS.register("pack_index")
def _emit_pack_index(site: _Site, e: ir.Op, args: list[str]) -> str:
    """NonZero over the flattened keep mask: [1, Tokens] int64 positions, squeezed to [Tokens]."""
    flat = site.em.node("Reshape", [args[0], site.em.constant([-1], "i64", (1,))], elem_type(e.args[0].type.dtype),
                        scope=site.scope, doc=site.doc)
    return site.node("Squeeze", [site.node("NonZero", [flat]), site.em.constant([0], "i64", (1,))])


@EMISSIONS.register("pack_rows")
def _emit_pack_rows(site: _Site, e: ir.Op, args: list[str]) -> str:
    """B and S merged into one axis (Reshape), then a Gather of the kept rows along it."""
    axis, dims = e.attr("axis"), e.args[0].type.dims
    merged = dims[:axis] + (dims[axis] * dims[axis + 1],) + dims[axis + 2:]
    flat = site.node("Reshape", [args[0], site.em.shape(merged)])
    return site.node("Gather", [flat, args[1]], axis=axis)


@EMISSIONS.register("unpack_rows")
def _emit_unpack_rows(site: _Site, e: ir.Op, args: list[str]) -> str:
    """A zero row in front of the packed rows (Pad), then a Gather by the [B, S] slots: each slot
    reads its row, and the positions that were not kept read the zero row."""
    axis, rank = e.attr("axis"), e.args[0].type.rank
    pads = [0] * (2 * rank)
    pads[axis] = 1
    padded = site.node("Pad", [args[0], site.em.constant(pads, "i64", (2 * rank,))])
    return site.node("Gather", [padded, args[1]], axis=axis)


# ----------------------------------------------------------------- fused forms


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
    scores = em.node("MatMul", [scaled, keys], out, scope=scope, doc=doc)
    if mask:
        scores = em.node("Add", [scores, mask], out, scope=scope, doc=doc + ", mask added")
    probs = softmax(em, scores, dtype, -1, scope, doc)
    return em.node("MatMul", [probs, v], out, scope=scope, doc=doc)


def _fused_attention_dropout(em: GraphEmitter, frame: _Frame, args: list[str], scalars: dict) -> str | None:
    """Attention with dropout on the probabilities: in an inference graph, attention itself."""
    return _fused_attention(em, frame, args[:5], scalars)


#: Dtypes whose Linear is one 2-D Gemm (f16/bf16 keep MatMul + Add: which providers have
#: half-precision Gemm kernels varies, and the measured gain is the CPU provider's).
_GEMM_DTYPES = ("f32", "f64")


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
    if fn.result.dtype in _GEMM_DTYPES and fn.result.rank >= 2:
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
    kernels.LINEAR: _fused_linear,
    kernels.GELU_ERF: _fused_gelu_erf,
}


# ----------------------------------------------------------------------- models


def emit(program: ir.Program, tensors: dict, *, name: str, outputs: dict[str, str],
         root_entry: str | None = None, generics: dict | None = None, bf16_compute: str = "native",
         source: str = "", params_in_place: bool = False) -> list[ModelFile]:
    """The ONNX models of a lowered program, one per file of `layout`, weights inline.

    tensors: param path -> numpy array (already in the export dtype).  outputs: entry ->
    graph output name.  generics: recorded in the metadata.  params_in_place: see
    `GraphEmitter.params_in_place`.  Every model is in memory at once, each with a copy of
    the weights it reads: to write an export, iterate `emit_each` instead.
    """
    files = []
    for model_file in emit_each(program, tensors, name=name, outputs=outputs, root_entry=root_entry,
                                generics=generics, bf16_compute=bf16_compute, source=source,
                                params_in_place=params_in_place, defer_weights=True):
        inline_weights(model_file)
        files.append(model_file)
    return files


def emit_each(program: ir.Program, tensors: dict, *, name: str, outputs: dict[str, str],
              root_entry: str | None = None, generics: dict | None = None, bf16_compute: str = "native",
              source: str = "", params_in_place: bool = False, defer_weights: bool = False):
    """`emit`'s models one at a time, each built when the previous one has been taken, so a
    writer that saves and drops each holds one graph at a time.  defer_weights: the params'
    initializers hold no data; `ModelFile.weights` names their arrays (`DeferredWeight`)."""
    from onnx import helper

    files = layout(program, root_entry)
    for model_file in files:
        first = program.entries[model_file.entries[0]]
        em = GraphEmitter(program, tensors, bf16_compute=bf16_compute, params_in_place=params_in_place,
                          defer_weights=defer_weights)
        em.bind_dims(first)
        inputs = []
        for input_name, t in first.inputs:
            em.reserve(input_name)
            em.types[input_name] = elem_type(t.dtype)
            inputs.append(helper.make_tensor_value_info(input_name, elem_type(t.dtype), value_dims(t)))
        graph_outputs = []
        for entry_name in model_file.entries:
            em.reserve(outputs[entry_name])
        for entry_name in model_file.entries:
            entry = program.entries[entry_name]
            value = em.call(entry.function, [n for n, _ in entry.inputs], "")
            out_name = outputs[entry_name]
            em.node("Identity", [value], elem_type(entry.result.dtype), scope=entry_name,
                    doc=f"the result of entry `{entry_name}`", output=out_name)
            graph_outputs.append(helper.make_tensor_value_info(out_name, elem_type(entry.result.dtype),
                                                               value_dims(entry.result)))
        # Arguments are emitted before a fused form decides which it needs (LayerNormalization
        # takes epsilon as an attribute), so drop constants that no node reads.
        used = {i for node in em.nodes for i in node.input}
        initializers = [t for t in em.initializers if t.name in used]
        graph = helper.make_graph(em.nodes, name, inputs, graph_outputs, initializer=initializers,
                                  doc_string=f"{name}: entries {', '.join(model_file.entries)}")
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="linnet", producer_version=__version__,
                                  doc_string=f"Generated by Linnet {__version__} from {source or name}. "
                                             "Node doc_strings give the Linnet function and file:line.")
        model.ir_version = IR_VERSION
        helper.set_model_props(model, metadata(program, model_file.entries, outputs, generics or {}, source))
        model_file.model = model
        model_file.initializer_bytes = em.initializer_bytes
        model_file.weights = {t.name: em.weights[t.name] for t in initializers if t.name in em.weights}
        del em, initializers, graph, model  # the file's caller holds the one copy from here
        yield model_file


def metadata(program: ir.Program, entries: list[str], outputs: dict[str, str], generics: dict,
             source: str) -> dict[str, str]:
    """metadata_props: what a reader of the file needs to call it correctly."""
    pre: list[str] = []
    for name in entries:
        for left, op, right, _ in program.entries[name].preconditions:
            text = f"{left} {op} {right}"
            if text not in pre:
                pre.append(text)
    signatures = []
    for name in entries:
        e = program.entries[name]
        params = ", ".join(f"{n}: {t}" for n, t in e.inputs)
        signatures.append(f"{name}({params}) -> {e.result} as `{outputs[name]}`")
    where = []
    for name in entries:
        for _, _, _, span in program.entries[name].preconditions:
            where.append(f"{name}: {source_label(span.file)}:{span.line}")
    props = {
        "linnet.version": __version__,
        "linnet.source": source,
        "linnet.entries": "; ".join(signatures),
        "linnet.outputs": ", ".join(f"{n}={outputs[n]}" for n in entries),
        "linnet.preconditions": ", ".join(pre),
        "linnet.preconditions.where": "; ".join(where),
        "linnet.generics": ", ".join(f"{k}={v}" for k, v in generics.items()),
    }
    return props


def save(model_file: ModelFile, out_dir) -> list:
    """Write one model; weights go to `<file>.data` beside it when the model passes 2 GiB."""
    import onnx
    from pathlib import Path

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / model_file.file
    if getattr(model_file, "initializer_bytes", 0) > EXTERNAL_DATA_BYTES:
        data = model_file.file + ".data"
        onnx.save(model_file.model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                  location=data, size_threshold=1024)
        return [path, out_dir / data]
    onnx.save(model_file.model, str(path))
    return [path]
