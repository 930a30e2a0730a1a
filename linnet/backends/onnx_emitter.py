"""`GraphEmitter`: the nodes and initializers of one ONNX graph, the call tree inlined.

It keeps the graph's SSA names, the initializers (one per constant, one per param, tied
weights shared), the dims computed from the input shapes, and one activation (`_Frame`) per
inlined function; each op is written by its emission (`onnx_emissions.EMISSIONS`) and a std
function with a fused form by `onnx_fused.FUSED`.  See `onnx_graph` for the layout decisions.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .. import dtypes
from ..middle import ir
from ..dims import DimExpr, FloorDiv, Mod, Sym
from ..paths import source_label
from .onnx_files import DeferredWeight, elem_type, unsupported

#: ONNX op types that move or reinterpret data without arithmetic (ONNX's vocabulary, not the
#: registry's: what the registry's data-movement ops, `take`, `cast` and the emitter's own
#: shape plumbing are written with; tests/test_onnx_backend.py checks that they are).  The
#: bf16 CPU variant leaves them in bf16.
DATA_OP_TYPES = frozenset({"Cast", "Shape", "Reshape", "Transpose", "Gather", "Slice", "Squeeze", "Unsqueeze",
                           "Concat", "Identity", "Range", "NonZero"})


def _tables():
    """The op emissions and fused forms, looked up when an emitter is made (they import this
    module's emitter API, so this module imports them last)."""
    from . import onnx_emissions, onnx_fused

    return onnx_emissions.EMISSIONS, onnx_fused.FUSED


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
        #: export for sessions sharing one copy of the weights; `onnx_emissions.matmul_by_transposed_param`).
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
        self.emissions, self.fused = _tables()

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
        if (self.emulate_bf16 and op_type not in DATA_OP_TYPES
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
        #: The largest value the entry's `where` clauses allow a dim (`S <= 8192`), by its text.
        self.bounds: dict[str, int] = {}
        for left, op, right, _ in entry.preconditions:
            limit = right.as_int()
            if limit is not None and op in ("<=", "<"):
                self.bounds[str(left)] = limit - (op == "<")

    def upper_bound(self, expr: DimExpr) -> int | None:
        """The largest value `expr` may take in the entry being emitted: a constant, or a dim
        one of its `where` clauses bounds; None when nothing bounds it."""
        value = expr.as_int()
        return value if value is not None else getattr(self, "bounds", {}).get(str(expr))

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
        """Inline one function (or its fused form) once per block path and argument values: the
        name of its result's value, or a tuple of names for a function with several results.

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
        fused = self.fused.get(fn.source)
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
            elif isinstance(stmt, ir.Unpack):  # the call's value is a tuple: one value per result
                frame.env.update(zip(stmt.names, self.expr(stmt.value, frame)))
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
        if receiver is None or receiver == ir.SIBLING:
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
        if isinstance(e, ir.MakeTuple):  # a return's several results: one value name each
            return tuple(self.expr(a, frame) for a in e.args)
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
        from .onnx_emissions import Site, matmul_by_transposed_param, transposed_param

        site = Site(self, self.scope(frame), self.doc(frame, e.line), elem_type(e.type.dtype), frame)
        if self.params_in_place and transposed_param(e) is not None:
            return matmul_by_transposed_param(site, e, self.expr(e.args[0], frame),
                                              self.expr(transposed_param(e), frame))
        args = [self.expr(a, frame) for a in e.args]
        emission = self.emissions.get(e.op)
        if emission is None:  # tests/test_ops.py proves the table complete but for declared refusals
            reason = self.emissions.refusals.get(e.op)
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

