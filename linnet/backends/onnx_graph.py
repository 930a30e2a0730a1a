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


The emitter is split by concern, each module importing only those before it:
`onnx_files` (file layout, element types, metadata, writing), `onnx_emitter` (`GraphEmitter`:
names, initializers, dims, inlining), `onnx_fused` (std functions written as one ONNX kernel),
`onnx_emissions` (`EMISSIONS`, the op table), and this module, which builds the models and
re-exports the public names.
"""
from __future__ import annotations

from .. import __version__
from ..middle import ir
# The public names of the ONNX emitter, importable from here as before the split.
from .onnx_emissions import EMISSIONS, Site
from .onnx_emitter import DATA_OP_TYPES, GraphEmitter
from .onnx_files import (graph_inputs_used, default_file, EXTERNAL_DATA_BYTES, IR_VERSION, OPSET, DeferredWeight, ModelFile, elem_type, inline_weights,
                         layout, metadata, save, unsupported, value_dims)
from .onnx_fused import FUSED, softmax

__all__ = ["DATA_OP_TYPES", "default_file", "default_model", "EMISSIONS", "EXTERNAL_DATA_BYTES", "FUSED", "IR_VERSION", "OPSET", "DeferredWeight",
           "GraphEmitter", "ModelFile", "Site", "elem_type", "emit", "emit_each", "inline_weights", "layout",
           "metadata", "save", "softmax", "unsupported", "value_dims"]


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
              source: str = "", params_in_place: bool = False, defer_weights: bool = False,
              entries=None):
    """`emit`'s models one at a time, each built when the previous one has been taken, so a
    writer that saves and drops each holds one graph at a time.  defer_weights: the params'
    initializers hold no data; `ModelFile.weights` names their arrays (`DeferredWeight`).
    entries: build only model.onnx and the files answering one of these (None: every file)."""
    from onnx import helper

    files = layout(program, root_entry)
    if entries is not None:
        files = files[:1] + [f for f in files[1:] if set(f.entries) & set(entries)]
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
            for out_name in ir.output_names(program.entries[entry_name], outputs[entry_name]):
                em.reserve(out_name)
        for entry_name in model_file.entries:
            entry = program.entries[entry_name]
            value = em.call(entry.function, [n for n, _ in entry.inputs], "")
            several = isinstance(entry.result, ir.TupleType)  # a graph output per result
            for i, (out_name, v, t) in enumerate(zip(ir.output_names(entry, outputs[entry_name]),
                                                     value if several else (value,), ir.result_types(entry.result))):
                em.node("Identity", [v], elem_type(t.dtype), scope=entry_name, output=out_name,
                        doc=f"result {i + 1} of entry `{entry_name}`" if several else f"the result of entry `{entry_name}`")
                graph_outputs.append(helper.make_tensor_value_info(out_name, elem_type(t.dtype), value_dims(t)))
        # Arguments are emitted before a fused form decides which it needs (LayerNormalization
        # takes epsilon as an attribute), so drop constants that no node reads.
        used = graph_inputs_used(em.nodes)
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


def default_model(program: ir.Program, tensors: dict, entry: ir.Entry, param: str, *,
                  bf16_compute: str = "native"):
    """The graph of one computed default (`position_ids = positions(attention_mask)`): its
    inputs are the entry inputs the default reads, its one output is named after `param`.

    An ONNX graph input cannot be computed from the others when left out, so the entry's own
    graph takes `param` as a required input, and this graph computes it: the runtime (or any
    ONNX user) runs it first when the caller leaves `param` out.
    """
    from onnx import helper

    default = entry.computed[param]
    types = dict(entry.inputs)
    inputs = [(a, types[a]) for a in default.args]
    readable = {str(d) for _, t in inputs for d in t.dims}
    dims = [d for d in entry.dims if d in readable]
    sources = {d: next((a, axis) for a, t in inputs for axis, x in enumerate(t.dims) if str(x) == d) for d in dims}
    em = GraphEmitter(program, tensors, bf16_compute=bf16_compute)
    em.bind_dims(ir.Entry(f"{entry.name}.{param}", default.function, dims, inputs, types[param], [], sources))
    graph_inputs = []
    for name, t in inputs:
        em.reserve(name)
        em.types[name] = elem_type(t.dtype)
        graph_inputs.append(helper.make_tensor_value_info(name, elem_type(t.dtype), value_dims(t)))
    em.reserve(param)
    value = em.call(default.function, list(default.args), "")
    result = types[param]
    em.node("Identity", [value], elem_type(result.dtype), scope=f"{entry.name}.{param}",
            doc=f"the default of `{param}` of entry `{entry.name}`: {default.text}", output=param)
    used = graph_inputs_used(em.nodes)
    graph = helper.make_graph(em.nodes, f"{entry.name}_default_{param}", graph_inputs,
                              [helper.make_tensor_value_info(param, elem_type(result.dtype), value_dims(result))],
                              initializer=[t for t in em.initializers if t.name in used],
                              doc_string=f"`{param}` of entry `{entry.name}` when left out: {default.text} "
                                         f"({default.span.file}:{default.span.line})")
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="linnet", producer_version=__version__)
    model.ir_version = IR_VERSION
    return model
