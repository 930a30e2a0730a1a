"""The openvino backend's `precision="int8"`: static int8 after SmoothQuant, planned against the
same measured budget as the onnx backend's, on the real all-MiniLM-L6-v2.

The test texts are test_encode's corpus (not calibration texts, checked in test_int8); the
reference is sentence-transformers (torch f32) on the package's files.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from linnet import LinnetError, codes, nest
from linnet.backends.int8_static import smooth
from linnet.backends.onnx_int8 import cosines
from test_encode import corpus


@pytest.fixture(scope="module")
def texts():
    return corpus()


@pytest.fixture(scope="module")
def reference(minilm_checkpoint, texts):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_checkpoint), device="cpu").encode(texts, convert_to_numpy=True)


@pytest.fixture(scope="module")
def int8(minilm_checkpoint):
    return nest.load("all-minilm-l6-v2", backend="openvino", weights=minilm_checkpoint, precision="int8")


def test_static_int8_encode_is_within_budget_of_sentence_transformers(int8, texts, reference):
    plan = int8.info.precision
    assert plan["plan"] == "int8" and plan["scheme"] == "static" and plan["quantised"] > 0
    assert 1 - plan["mean_cosine"] <= 0.005 and plan["min_cosine"] >= 0.98  # on the calibration texts
    assert "embed" in plan["entries"]
    assert not [p.name for p in int8.runtime.folder.iterdir() if ".candidate" in p.name]
    cos = cosines(int8.encode(texts, show_progress_bar=False), reference)
    print(f"openvino static int8 vs sentence-transformers f32 on {len(texts)} texts: mean {cos.mean():.5f}, "
          f"min {cos.min():.5f}; plan: {plan['quantised']} int8, {len(plan['kept_f32'])} f32")
    assert cos.mean() >= 0.995 and cos.min() >= 0.98
    assert cos.mean() < 0.99999, "no int8 ran: the embeddings are f32's"


def test_openvino_runs_the_planned_products_in_int8(int8):
    plan = int8.info.precision
    graph = onnx.load(str(int8.runtime.folder / int8.runtime._file("embed")), load_external_data=False)
    made_by = {out: node.op_type for node in graph.graph.node for out in node.output}
    int8_products = [n for n in graph.graph.node if n.op_type == "MatMul"
                     and [made_by.get(i) for i in n.input[:2]] == ["DequantizeLinear"] * 2]
    assert len(int8_products) == plan["quantised"]
    assert any(n.name.endswith("/smooth") for n in graph.graph.node), "SmoothQuant's Mul is missing"
    # What OpenVINO compiled: one integer fully-connected layer per planned matrix.
    compiled = int8.runtime.compiled_model("embed").get_runtime_model()
    layers = Counter((op.get_rt_info()["layerType"].astype(str), op.get_rt_info()["runtimePrecision"].astype(str))
                     for op in compiled.get_ops())
    integer = sum(n for (kind, precision), n in layers.items() if kind == "FullyConnected" and precision in ("u8", "i8"))
    assert integer == plan["quantised"], layers
    # The rest runs at the f32 hint, read back as for f32.
    assert int8.runtime.compiled_model("embed").get_property("INFERENCE_PRECISION_HINT").to_string() == "f32"


def test_the_static_graph_quantises_the_products_inputs_only(int8):
    """A product's output feeds the residual sum, whose few huge values would set one uint8 scale
    for all of it: only the products' inputs (and weights) may be quantised."""
    graph = onnx.load(str(int8.runtime.folder / int8.runtime._file("embed")), load_external_data=False)
    made_by = {out: node for node in graph.graph.node for out in node.output}
    quantised = [made_by[n.input[0]] for n in graph.graph.node if n.op_type == "QuantizeLinear"
                 and n.input[0] in made_by]
    assert quantised, "no activation is quantised"
    products = [n.name for n in quantised if n.op_type in ("MatMul", "Gemm")]
    assert not products, f"{len(products)} products' outputs are quantised, e.g. {products[:2]}"
    # Each quantised activation is SmoothQuant's output, and SmoothQuant only divides.
    assert {n.op_type for n in quantised} == {"Mul"}
    inits = {t.name: numpy_helper.to_array(t) for t in graph.graph.initializer}
    inverses = [inits[n.input[1]] for n in quantised]
    assert max(float(v.max()) for v in inverses) <= 1.0, "a channel was multiplied, not divided"


def test_smoothing_keeps_the_products_and_shares_one_scale_per_input():
    """SmoothQuant moves range from activations to weights; in f32 the graph computes the same."""
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 8)).astype(np.float32)
    x[:, 3] *= 100  # an outlier channel, what smoothing is for
    w1, w2 = rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal((8, 6)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["a"], name="one"), helper.make_node("MatMul", ["x", "w2"], ["b"], name="two"),
         helper.make_node("MatMul", ["x", "w1"], ["c"], name="tied")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 8])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "abc"],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    before = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    smooth(model, ["one", "two"], {"x": np.abs(x).max(axis=0)})
    after = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    for want, got in zip(before, after):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    muls = [n for n in model.graph.node if n.op_type == "Mul"]
    assert len(muls) == 1  # both products read x: one division, shared
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert not np.array_equal(weights["w2"], w2), "the weight rows were not scaled"
    # `tied` reads w1 unsmoothed: the smoothed product got a copy of its own.
    assert np.array_equal(weights["w1"], w1)
    scale = 1 / weights["x/smooth_inverse"]
    assert scale[3] == scale.max(), "the outlier channel should be divided the most"


def test_int8_options_are_checked_on_openvino(minilm_checkpoint):
    for options, code in (({"precision": "int4"}, codes.UNKNOWN_BACKEND_OPTION),
                          ({"calibration": ["a text"]}, codes.UNKNOWN_BACKEND_OPTION),
                          ({"precision": "int8", "max_cosine_loss": "small"}, codes.BAD_BACKEND_OPTION_TYPE)):
        with pytest.raises(LinnetError) as caught:
            nest.load("all-minilm-l6-v2", backend="openvino", weights=minilm_checkpoint, **options)
        assert caught.value.code == code, options


def test_int8_without_the_instructions_falls_back_to_f32(monkeypatch, minilm_checkpoint):
    """A CPU whose OpenVINO plugin lists no INT8 (forced here) runs f32 and says so."""
    from linnet.backends import openvino_runtime

    real = openvino_runtime.capabilities
    monkeypatch.setattr(openvino_runtime, "capabilities", lambda core: tuple(c for c in real(core) if c != "INT8"))
    with pytest.warns(UserWarning, match="no int8 arithmetic on this CPU.*running at f32"):
        model = nest.load("all-minilm-l6-v2", backend="openvino", weights=minilm_checkpoint, precision="int8")
    assert model.runtime.int8_plan is None and not model.info.precision
    f32 = nest.load("all-minilm-l6-v2", backend="openvino", weights=minilm_checkpoint)
    texts = ["a CPU without int8 kernels", "runs the f32 graph"]
    np.testing.assert_array_equal(model.encode(texts, show_progress_bar=False), f32.encode(texts, show_progress_bar=False))
