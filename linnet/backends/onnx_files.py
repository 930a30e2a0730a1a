"""ONNX files: which entries go to which file, element types, the metadata a reader needs,
and writing a model (weights inline, deferred, or external past 2 GiB).  See `onnx_graph`."""
from __future__ import annotations

from dataclasses import dataclass, field

from .. import __version__, codes, dtypes
from ..middle import ir
from ..diagnostics import Diagnostic, LinnetError
from ..paths import source_label

OPSET = 17
#: IR version 8 is the lowest that opset 17 needs; older runtimes read it too.
IR_VERSION = 8
#: protobuf refuses messages over 2 GiB; above this the weights go to an external file.
EXTERNAL_DATA_BYTES = 2 * 1024 ** 3 - 64 * 1024 ** 2


def graph_inputs_used(nodes) -> set[str]:
    """Every value name the nodes read, the nodes of their subgraphs (a Loop's body, which
    reads the outer graph's values by name) included."""
    used: set[str] = set()
    for node in nodes:
        used.update(node.input)
        used |= _subgraph_reads(node)
    return used


def node_reads(node) -> set[str]:
    """The value names one node reads: its inputs and what its subgraphs read by name."""
    return {i for i in node.input if i} | _subgraph_reads(node)


def _subgraph_reads(node) -> set[str]:
    reads: set[str] = set()
    for attr in node.attribute:
        if attr.HasField("g"):
            reads |= graph_inputs_used(attr.g.node)
        for graph in attr.graphs:
            reads |= graph_inputs_used(graph.node)
    return reads


def elem_type(dtype: str) -> int:
    """A Linnet dtype as an ONNX TensorProto element type."""
    return dtypes.by_name(dtype).onnx


def unsupported(message: str, fn: ir.Function | None = None) -> LinnetError:
    span = fn.span if fn is not None else None
    return LinnetError(Diagnostic(codes.ONNX_UNSUPPORTED, f"the onnx backend cannot express {message}", span))


# ----------------------------------------------------------------- export file names
# The ONNX runtime, OpenVINO and Triton all read one export folder; its file names are
# written and parsed here only.

#: The one weights file every per-entry model of an export reads.
WEIGHTS_FILE = "weights.bin"
#: A decoder's two graphs (`onnx_decoder`), under optimum's file names.
PREFILL_FILE, STEP_FILE = "decoder_model.onnx", "decoder_with_past_model.onnx"


def entry_file(entry: str) -> str:
    """The export's file for one entry (the entry name is a validated identifier)."""
    return f"model.{entry}.onnx"


def default_file(entry: str, param: str) -> str:
    """The file of the graph that computes `entry`'s left-out input `param` (its computed default)."""
    return f"default.{entry}.{param}.onnx"


def entry_of_file(file: str) -> str | None:
    """The entry an export file belongs to (`entry_file` or `default_file`); None for the
    whole graph, the weights and anything else."""
    parts = file.split(".")
    if parts[-1] != "onnx":
        return None
    if parts[0] == "model" and len(parts) == 3 or parts[0] == "default" and len(parts) == 4:
        return parts[1]
    return None


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
        signatures.append(f"{name}({params}) -> {e.result} as "
                          + ", ".join(f"`{o}`" for o in ir.output_names(e, outputs[name])))
    where = []
    for name in entries:
        for _, _, _, span in program.entries[name].preconditions:
            where.append(f"{name}: {source_label(span.file)}:{span.line}")
    props = {
        "linnet.version": __version__,
        "linnet.source": source,
        "linnet.entries": "; ".join(signatures),
        "linnet.outputs": ", ".join(f"{n}={'+'.join(ir.output_names(program.entries[n], outputs[n]))}"
                                    for n in entries),
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
