"""Forwarding slices through concatenations in an emitted ONNX graph: copies of data left out.

A decoder step over Linnet's one typed cache (`onnx_decoder`) stacks the per-layer inputs into
`[Stream + Layers, 2, B, Heads, P, Dh]`, slices each layer's slot back out to attend, grows the
whole cache by one concat and slices every `present.*` out of it again: each of those nodes
copies the cache, about seven copies a step where one (the layer's key or value with the new
position) is needed. Those are pure data movement, so they can be rewritten exactly:

* `Slice(Concat(xs, a))` on the concat axis a, inside one piece: a slice of that piece; on
  other axes: the concat of the pieces' slices;
* `Slice(Slice(x))` with constant bounds: one slice; a slice covering a whole static axis: left
  out; a slice of an `Unsqueeze` on other axes: the unsqueeze of the slice;
* `Squeeze(Unsqueeze(x))` and `Squeeze(Concat(xs))` off the concat axis: cancelled, pushed in;
* the same node on the same inputs computed once (structural CSE), nodes nobody reads dropped.

Every rule moves or cancels indexing only, so the result equals the original bit for bit; a
node a rule cannot reason about (dynamic bounds, steps, unknown static sizes) is kept as it was.
After it, each layer's step attends over `Concat(past, new, axis=2)`, which is also its
`present` output: the one copy transformers' own cache makes too.
"""
from __future__ import annotations

import numpy as np

from .onnx_files import node_reads

#: ends at or past this are "to the end" (what exporters write for INT64_MAX).
_TO_END = 2 ** 62


def forward_views(model) -> None:
    """Rewrite `model`'s graph in place (see the module doc); shapes from ONNX's own inference."""
    from onnx import helper, numpy_helper, shape_inference

    graph = model.graph
    inferred = shape_inference.infer_shapes(model, data_prop=True).graph
    shapes: dict[str, list] = {}
    for vi in list(inferred.value_info) + list(inferred.input) + list(inferred.output):
        if vi.type.tensor_type.HasField("shape"):
            shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
    consts: dict[str, np.ndarray] = {}
    by_value: dict[tuple, str] = {}
    for t in graph.initializer:
        if t.data_type == 7 and not t.external_data and len(t.dims) <= 1:  # small int64 constants
            array = numpy_helper.to_array(t)
            consts[t.name] = array
            by_value.setdefault((array.ndim, tuple(array.ravel().tolist())), t.name)
            shapes[t.name] = list(array.shape)
    new_inits = []
    producer: dict[str, object] = {}
    out_nodes: list = []
    cse: dict[tuple, str] = {}
    alias: dict[str, str] = {}
    counter = [0]

    def const(values: list[int]) -> str:
        key = (1, tuple(int(v) for v in values))
        if key not in by_value:
            name = f"view.i64.{list(key[1])}".replace(" ", "")
            array = np.asarray(values, np.int64)
            new_inits.append(numpy_helper.from_array(array, name))
            consts[name], by_value[key], shapes[name] = array, name, [len(values)]
        return by_value[key]

    def ints(name: str):
        return None if name not in consts else [int(v) for v in consts[name].ravel()]

    def attr(node, key, default=None):
        for a in node.attribute:
            if a.name == key:
                return helper.get_attribute_value(a)
        return default

    def emit(op: str, inputs: list[str], shape, output: str | None = None, **attrs) -> str:
        key = (op, tuple(inputs), tuple(sorted((k, repr(v)) for k, v in attrs.items())))
        if key in cse and output is None:
            return cse[key]
        if output is None:
            counter[0] += 1
            output = f"view/{op}_{counter[0]}"
        node = helper.make_node(op, inputs, [output], name=output, doc_string="forwarded view", **attrs)
        out_nodes.append(node)
        producer[output] = node
        if shape is not None:
            shapes[output] = shape
        cse[key] = output
        return output

    def slice_(x: str, ranges: dict[int, tuple[int, int | None]]) -> str:
        """x sliced on constant, non-negative ranges per axis (end None: to the end)."""
        shape = shapes.get(x)
        if shape is None:
            return _plain_slice(x, ranges, None)
        ranges = {a: r for a, r in ranges.items() if not (r[0] == 0 and (r[1] is None or
                                                                     (shape[a] is not None and r[1] >= shape[a])))}
        if not ranges:
            return x
        p = producer.get(x)
        if p is not None and p.op_type == "Slice" and _const_slice(p, ints, shapes) is not None:
            inner = _const_slice(p, ints, shapes)
            merged = dict(inner[1])
            for a, (s, e) in ranges.items():
                if a in merged:
                    s2, e2 = merged[a]
                    end = None if e is None else s2 + e
                    end = e2 if end is None else (end if e2 is None else min(end, e2))
                    merged[a] = (s2 + s, end)
                else:
                    merged[a] = (s, e)
            return slice_(inner[0], merged)
        if p is not None and p.op_type == "Concat":
            axis = attr(p, "axis") % len(shape)
            pieces = list(p.input)
            if axis not in ranges:
                return concat([slice_(piece, ranges) for piece in pieces], axis)
            sizes = [shapes.get(piece, [None] * len(shape))[axis] for piece in pieces]
            if None not in sizes:
                s, e = ranges[axis]
                e = sum(sizes) if e is None else min(e, sum(sizes))
                parts, offset = [], 0
                for piece, size in zip(pieces, sizes):
                    lo, hi = max(s, offset), min(e, offset + size)
                    if lo < hi:
                        parts.append(slice_(piece, {**ranges, axis: (lo - offset, hi - offset)}))
                    offset += size
                if parts:
                    return concat(parts, axis)
        if p is not None and p.op_type == "Unsqueeze" and ints(p.input[1]) is not None:
            added = sorted(a % len(shape) for a in ints(p.input[1]))
            if not set(ranges) & set(added):
                inner = {a - sum(u < a for u in added): r for a, r in ranges.items()}
                return unsqueeze(slice_(p.input[0], inner), added)
        return _plain_slice(x, ranges, shape)

    def _plain_slice(x, ranges, shape):
        axes = sorted(ranges)
        out_shape = None
        if shape is not None:
            out_shape = list(shape)
            for a in axes:
                s, e = ranges[a]
                out_shape[a] = None if shape[a] is None else max(0, min(shape[a], _TO_END if e is None else e) - s)
        return emit("Slice", [x, const([ranges[a][0] for a in axes]),
                              const([_TO_END if ranges[a][1] is None else ranges[a][1] for a in axes]), const(axes)],
                    out_shape)

    def concat(parts: list[str], axis: int) -> str:
        if len(parts) == 1:
            return parts[0]
        shape = None
        if all(p in shapes for p in parts):
            shape = list(shapes[parts[0]])
            sizes = [shapes[p][axis] for p in parts]
            shape[axis] = None if None in sizes else sum(sizes)
        return emit("Concat", parts, shape, axis=axis)

    def unsqueeze(x: str, axes: list[int]) -> str:
        shape = None
        if x in shapes:
            shape = list(shapes[x])
            for a in sorted(axes):
                shape.insert(a, 1)
        return emit("Unsqueeze", [x, const(axes)], shape)

    def squeeze(x: str, axes: list[int]) -> str:
        shape = shapes.get(x)
        if shape is None:
            return emit("Squeeze", [x, const(axes)], None)
        axes = sorted(a % len(shape) for a in axes)
        if not axes:
            return x
        p = producer.get(x)
        if p is not None and p.op_type == "Unsqueeze" and ints(p.input[1]) is not None:
            added = sorted(a % len(shape) for a in ints(p.input[1]))
            if set(added) <= set(axes):
                rest = [a for a in axes if a not in added]
                return squeeze(p.input[0], [a - sum(u < a for u in added) for a in rest])
            if set(axes) <= set(added):
                rest = [a for a in added if a not in axes]
                return unsqueeze(p.input[0], [a - sum(q < a for q in axes) for a in rest]) if rest else p.input[0]
        if p is not None and p.op_type == "Concat":
            axis = attr(p, "axis") % len(shape)
            if axis not in axes:
                return concat([squeeze(piece, axes) for piece in p.input], axis - sum(q < axis for q in axes))
        return emit("Squeeze", [x, const(axes)], [d for i, d in enumerate(shape) if i not in axes])

    def elements(name: str):
        """A 1-D int64 value's elements where constant (None where computed), or None."""
        if ints(name) is not None:
            return ints(name)
        p = producer.get(name)
        if p is None or p.op_type != "Concat" or attr(p, "axis") != 0:
            return None
        out = []
        for piece in p.input:
            known = ints(piece)
            size = (shapes.get(piece) or [None])[0] if len(shapes.get(piece) or []) == 1 else None
            if known is None and size is None:
                return None
            out.extend(known if known is not None else [None] * size)
        return out

    def split_slice(inputs: list[str]):
        """A slice with some axes' bounds computed: the constant axes forwarded first, the
        computed ones a Slice of that (their bounds gathered from the original vectors)."""
        if len(inputs) < 4 or (len(inputs) > 4 and inputs[4]):
            return None
        shape = shapes.get(inputs[0])
        starts, ends, axes = elements(inputs[1]), elements(inputs[2]), elements(inputs[3])
        if (shape is None or starts is None or ends is None or axes is None or None in axes
                or not len(starts) == len(ends) == len(axes)):
            return None
        fixed, computed = {}, []
        for i, (s, e, a) in enumerate(zip(starts, ends, axes)):
            if s is not None and e is not None and s >= 0 and e >= 0:
                fixed[a % len(shape)] = (s, None if e >= _TO_END else e)
            else:
                computed.append(i)
        if not fixed or not computed:
            return None
        inner = slice_(inputs[0], fixed)
        pick = const(computed)
        bounds = [emit("Gather", [inputs[k], pick], [len(computed)], axis=0) for k in (1, 2)]
        return emit("Slice", [inner, *bounds, const([axes[i] for i in computed])], None)

    outputs = {o.name for o in graph.output}
    for node in graph.node:
        inputs = [alias.get(i, i) for i in node.input]
        out = node.output[0] if len(node.output) == 1 else None
        result = None
        if out is not None and node.op_type == "Slice":
            probe = helper.make_node("Slice", inputs, [out])
            ranges = _const_slice(probe, ints, shapes)
            result = slice_(ranges[0], ranges[1]) if ranges is not None else split_slice(inputs)
        elif out is not None and node.op_type == "Squeeze" and len(inputs) > 1 and ints(inputs[1]) is not None:
            result = squeeze(inputs[0], ints(inputs[1]))
        if result is None:
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            key = (node.op_type, tuple(inputs), tuple(sorted((k, repr(v)) for k, v in attrs.items())))
            if out is not None and out not in outputs and key in cse and node.op_type not in _EFFECTFUL:
                alias[out] = cse[key]
                continue
            del node.input[:]
            node.input.extend(inputs)
            out_nodes.append(node)
            for o in node.output:
                producer[o] = node
            if out is not None:
                cse.setdefault(key, out)
            continue
        if result not in shapes and out in shapes:
            shapes[result] = shapes[out]
        alias[out] = result
    # Graph outputs: the node making each one's value renamed to it, else an Identity.
    renames: dict[str, str] = {}
    claimed = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {t.name for t in new_inits}
    for name in [o.name for o in graph.output]:
        value = alias.get(name, name)
        if value == name:
            continue
        if value in producer and value not in claimed and value not in renames and value not in outputs:
            renames[value] = name
            claimed.add(value)
        else:
            out_nodes.append(helper.make_node("Identity", [renames.get(value, value)], [name], name=name))
    for node in out_nodes:
        for field in (node.input, node.output):
            for i, v in enumerate(field):
                if v in renames:
                    field[i] = renames[v]
    # Dead nodes out, back from the outputs.
    needed = set(outputs)
    kept = []
    for node in reversed(out_nodes):
        if any(o in needed for o in node.output):
            kept.append(node)
            needed.update(node_reads(node))  # a Loop's body reads outer values by name
    kept.reverse()
    del graph.node[:]
    graph.node.extend(kept)
    graph.initializer.extend(new_inits)
    live = [t for t in graph.initializer if t.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(live)
    del graph.value_info[:]


#: never merged by CSE (none of today's emitted ops; a guard for random ones).
_EFFECTFUL = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Dropout"}


def _const_slice(node, ints, shapes):
    """(input, {axis: (start, end or None)}) for a Slice with constant, non-negative bounds and
    unit steps, else None."""
    if len(node.input) < 4 or not node.input[3]:
        return None
    if len(node.input) > 4 and node.input[4]:
        steps = ints(node.input[4])
        if steps is None or any(s != 1 for s in steps):
            return None
    starts, ends, axes = ints(node.input[1]), ints(node.input[2]), ints(node.input[3])
    shape = shapes.get(node.input[0])
    if None in (starts, ends, axes, shape):
        return None
    ranges = {}
    for s, e, a in zip(starts, ends, axes):
        a %= len(shape)
        if s < 0 or e < 0 or a in ranges:
            return None
        ranges[a] = (s, None if e >= _TO_END else e)
    return node.input[0], ranges
