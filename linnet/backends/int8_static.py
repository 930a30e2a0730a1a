"""Static int8 for the openvino backend: calibrated activation scales, with SmoothQuant.

OpenVINO runs int8 fastest from a graph whose scales are constants: `QuantizeLinear` /
`DequantizeLinear` pairs (QDQ) around each dense product, which its low-precision transformations
fuse into int8 kernels.  Per-call (dynamic) scales, what the onnx backend's plan uses, are ORT's
strength, not OpenVINO's.  A constant scale per activation tensor is cruder than a per-call one,
though: on all-MiniLM-L6-v2 quantising every product this way gives a mean cosine to f32 of
0.937, because a few input channels carry values a hundred times the rest and set the scale.

SmoothQuant (Xiao et al., 2023) moves that range into the weights, which are quantised per output
channel and take it well: for each product `x @ W`, input channel j is divided by
`s_j = max|x_j| ** ALPHA / max|W_j,:| ** (1 - ALPHA)` and row j of W multiplied by it, so the
product is unchanged in exact arithmetic.  The division is one `Mul` per activation tensor (the
products that read one tensor, BERT's query/key/value, share it and a scale from their joint
weight rows).  `s_j` is never below 1: a channel is only ever divided, because multiplying a
quiet channel widens the tensor's range for everyone (GELU's small negative values, scaled up
14x, took 40% of the FFN input's 256 levels on MiniLM).

Only the products' inputs are quantised, never their outputs: the product feeds the residual sum,
whose few huge values would set one scale for all of it (ORT's QDQ quantiser does quantise a
MatMul's output unless told not to; with it, every matrix int8 gave a mean cosine of 0.94).

Measured on all-MiniLM-L6-v2 (2026-12-06, AMD EPYC Zen 4), every one of its 36 matrices int8:
mean / min cosine to f32 0.9984 / 0.9945 on 300 unseen stdlib paragraphs, where NNCF's static
int8 of the same graph gets 0.9975 / 0.9806 (ALPHA 0.5: 0.9887 / 0.9704; 0.95: 0.9975 / 0.9881).

`onnx_int8.plan` decides which products run int8; this module only writes a graph for a plan.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np

from .onnx_int8 import as_matmuls, dense_nodes

#: SmoothQuant's migration strength: 0 leaves activations alone, 1 moves all their range to weights
#: (the best of 0.5-1.0 on MiniLM, module docstring).
ALPHA = 0.8
#: The form of graph this module writes, in the cache keys of its graphs and plans: a graph or plan
#: measured on an earlier form is not reused (2: scales >= 1, products' outputs left f32).
FORM = 2
#: Calibration texts per batch when collecting ranges.
BATCH = 16


def calibration_feeds(model, texts: list[str], names: tuple[str, ...]) -> list[dict]:
    """The tokenized calibration texts as graph feeds (the `embed` entry's inputs), in batches."""
    feeds = []
    for i in range(0, len(texts), BATCH):
        features = dict(model.tokenizer(texts[i:i + BATCH]))
        feeds.append({name: np.asarray(features[name]) for name in names if name in features})
    return feeds


class StaticInt8:
    """Writes a graph file of an export with every dense product but `kept_f32` in static int8."""

    scheme = "static"

    def __init__(self, feeds: list[dict], texts_digest: str):
        self.feeds = feeds
        self.texts_digest = texts_digest
        self._ranges: dict[Path, dict[str, np.ndarray]] = {}

    @property
    def key(self) -> str:
        """What a plan's measurements depend on besides the graph and the budget."""
        import onnxruntime as ort
        import openvino

        return (f"static{FORM}|smoothquant={ALPHA}|{self.texts_digest}|onnxruntime={ort.__version__}"
                f"|openvino={openvino.__version__}")

    def file(self, folder: Path, file: str, kept_f32: tuple[str, ...], *, candidate: bool = False) -> Path:
        digest = hashlib.sha256(repr((sorted(kept_f32), self.key)).encode()).hexdigest()[:16]
        path = folder / f"{Path(file).stem}.int8s-{digest}.onnx"
        if path.is_file():
            return path
        if candidate:  # a name of this process's own (`onnx_int8.quantised_file` says why)
            path = path.with_name(f"{path.stem}.candidate{os.getpid()}.onnx")
            if path.is_file():
                return path
        import onnx

        model = onnx.load(str(folder / file))
        quantised = [n for n in dense_nodes(model) if n not in kept_f32]
        as_matmuls(model)
        smooth(model, quantised, self._input_ranges(folder / file, model))
        feeds = self._feeds_for(model)
        with tempfile.TemporaryDirectory(dir=folder) as scratch:
            smoothed = Path(scratch) / "smoothed.onnx"
            onnx.save(model, str(smoothed), save_as_external_data=True, location="smoothed.bin")
            out = Path(scratch) / "int8.onnx"
            _quantize(smoothed, out, feeds, quantised)
            os.replace(out, path)
        return path

    def _feeds_for(self, model) -> list[dict]:
        names = {i.name for i in model.graph.input}
        return [{k: v for k, v in feed.items() if k in names} for feed in self.feeds]

    def _input_ranges(self, graph: Path, matmuls) -> dict[str, np.ndarray]:
        """max |x| per input channel of every dense product's input over the calibration feeds
        (`matmuls`, the f32 graph after `as_matmuls`, run once per file by ORT with those
        tensors as extra outputs; `matmuls` itself is left as it was)."""
        if graph not in self._ranges:
            import onnx
            import onnxruntime as ort

            model = onnx.ModelProto()
            model.CopyFrom(matmuls)
            wanted = set(dense_nodes(model))
            inputs = list(dict.fromkeys(n.input[0] for n in model.graph.node if n.name in wanted))
            for name in inputs:
                model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
            session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            ranges: dict[str, np.ndarray] = {}
            for feed in self._feeds_for(model):
                for name, value in zip(inputs, session.run(inputs, feed)):
                    top = np.abs(value.reshape(-1, value.shape[-1])).max(axis=0)
                    ranges[name] = np.maximum(ranges.get(name, top), top)
            self._ranges[graph] = ranges
        return self._ranges[graph]


def smooth(model, quantised: list[str], ranges: dict[str, np.ndarray]) -> None:
    """SmoothQuant, in place: each input of the `quantised` MatMuls divided per channel by one
    `Mul`, the weights' rows multiplied by the same scales (see the module docstring)."""
    from onnx import helper, numpy_helper

    weights = {t.name: t for t in model.graph.initializer}
    readers: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    by_input: dict[str, list] = {}
    for node in model.graph.node:
        if node.name in quantised:
            by_input.setdefault(node.input[0], []).append(node)
    muls = {}
    for x, nodes in by_input.items():
        rows = [numpy_helper.to_array(weights[n.input[1]]) for n in nodes]  # each [In, Out]
        w_top = np.max([np.abs(w).max(axis=1) for w in rows], axis=0)
        x_top = ranges[x]
        # Divide loud channels only (>= 1): see the module docstring.
        scale = np.where((x_top > 0) & (w_top > 0),
                         x_top ** ALPHA / np.maximum(w_top, 1e-12) ** (1 - ALPHA), 1.0).clip(1.0, 1e5)
        for node, w in zip(nodes, rows):
            name = node.input[1]
            if readers[name] > 1:  # a weight something else reads too (tied): scale a copy
                name = f"{node.name}/smoothed_weight"
                model.graph.initializer.append(numpy_helper.from_array(w, name))
                weights[name] = model.graph.initializer[-1]
                node.input[1] = name
            weights[name].CopyFrom(numpy_helper.from_array((w * scale[:, None]).astype(np.float32), name))
        inverse = f"{x}/smooth_inverse"
        model.graph.initializer.append(numpy_helper.from_array((1.0 / scale).astype(np.float32), inverse))
        muls[x] = helper.make_node("Mul", [x, inverse], [f"{x}/smoothed"], name=f"{x}/smooth")
        for node in nodes:
            node.input[0] = f"{x}/smoothed"
    nodes = []
    for node in model.graph.node:
        nodes.append(node)
        nodes.extend(muls.pop(out) for out in node.output if out in muls)
    # Inputs of the graph itself (no node makes them) go first.
    del model.graph.node[:]
    model.graph.node.extend(list(muls.values()) + nodes)


def _quantize(source: Path, out: Path, feeds: list[dict], nodes: list[str]) -> None:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Feeds(CalibrationDataReader):
        def __init__(self):
            self.left = iter(feeds)

        def get_next(self):
            return next(self.left, None)

    # Weights int8 symmetric per output channel; activations uint8 with a zero point, min-max
    # calibrated: the forms OpenVINO's CPU plugin runs as int8 (NNCF's defaults are the same).
    # The products' outputs stay f32 (module docstring).
    quantize_static(str(source), str(out), Feeds(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, nodes_to_quantize=nodes,
                    op_types_to_quantize=["MatMul"],
                    extra_options={"WeightSymmetric": True, "OpTypesToExcludeOutputQuantization": ["MatMul"]})
