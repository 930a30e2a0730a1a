"""`onnx_views.forward_views`: slices forwarded through concats give the same bits, fewer copies.

A small graph with the decoder step's shapes of data movement (pieces unsqueezed and stacked,
grown along another axis, then sliced back out on constant and on computed bounds, squeezed)
run by ONNX Runtime before and after the rewrite on random inputs: every output equal bit for
bit, and the stacked concatenations no longer computed.
"""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="these tests need the onnx package (pip install onnx)")
ort = pytest.importorskip("onnxruntime", reason="these tests need onnxruntime (pip install onnxruntime)")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from linnet.backends.onnx_views import forward_views  # noqa: E402


def _graph():
    f = TensorProto.FLOAT
    c = lambda name, v: numpy_helper.from_array(np.asarray(v, np.int64), name)
    inits = [c("z0", [0]), c("z1", [1]), c("z2", [2]), c("z3", [3]), c("z01", [0, 1]), c("z11", [1, 1]), c("z22", [2, 2]),
             c("z4", [4]), c("big", [2 ** 62]), c("a3", [3]), c("colshape", [1, 2, 3, 1, 4]), c("one_two", [1, 2])]
    n = helper.make_node
    nodes = [
        n("Unsqueeze", ["k", "z01"], ["uk"]), n("Unsqueeze", ["v", "z01"], ["uv"]),
        n("Concat", ["uk", "uv"], ["slot"], axis=1),                      # [1, 2, H, P, D]
        n("Shape", ["k"], ["kshape"]), n("Concat", ["one_two", "kshape"], ["zshape"], axis=0),
        n("ConstantOfShape", ["zshape"], ["zero"]),
        n("Concat", ["zero", "slot"], ["stack"], axis=0),                 # [2, 2, H, P, D]
        n("Slice", ["stack", "z1", "z2", "z0"], ["s1"]), n("Squeeze", ["s1", "z0"], ["layer"]),  # [2, H, P, D]
        n("Concat", ["layer", "new"], ["grown"], axis=2),                 # [2, H, P + 1, D]
        n("Slice", ["grown", "z0", "z1", "z0"], ["gk"]), n("Squeeze", ["gk", "z0"], ["key"]),
        n("Unsqueeze", ["new", "z0"], ["unew"]),
        n("ConstantOfShape", ["colshape"], ["zcol"]),
        n("Concat", ["zcol", "unew"], ["col"], axis=0),                   # [2, 2, H, 1, D]
        n("Concat", ["stack", "col"], ["all"], axis=3),                   # [2, 2, H, P + 1, D]
        n("Slice", ["all", "z1", "a3", "z0"], ["tail"]),                 # slot 1 on, the end clipped
        n("Slice", ["all", "z11", "z22", "z01"], ["pv0"]), n("Squeeze", ["pv0", "z01"], ["value"]),
        # a computed start on axis 3: the last position of slot 1, part 1
        n("Gather", ["kshape", "z1"], ["p"]),
        n("Concat", ["z1", "z1", "p"], ["st"], axis=0), n("Concat", ["z2", "z2", "big"], ["en"], axis=0),
        n("Concat", ["z0", "z1", "z3"], ["ax"], axis=0),
        n("Slice", ["all", "st", "en", "ax"], ["last"]),
    ]
    h, p, d = 3, 5, 4
    inputs = [helper.make_tensor_value_info("k", f, [h, p, d]), helper.make_tensor_value_info("v", f, [h, p, d]),
              helper.make_tensor_value_info("new", f, [2, h, 1, d])]
    outputs = [helper.make_tensor_value_info(o, f, None) for o in ("key", "value", "tail", "last")]
    model = helper.make_model(helper.make_graph(nodes, "views", inputs, outputs, initializer=inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, (h, p, d)


def _run(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def test_forwarded_views_equal_the_original_graph_bit_for_bit():
    model, (h, p, d) = _graph()
    rng = np.random.default_rng(0)
    feeds = {"k": rng.standard_normal((h, p, d), np.float32), "v": rng.standard_normal((h, p, d), np.float32),
             "new": rng.standard_normal((2, h, 1, d), np.float32)}
    before = _run(model, feeds)
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    forward_views(rewritten)
    after = _run(rewritten, feeds)
    for name, x, y in zip(("key", "value", "tail", "last"), before, after):
        assert x.shape == y.shape and np.array_equal(x, y), name
    # numpy's own reading of the two slices the decoder reads most
    assert np.array_equal(after[0], np.concatenate([feeds["k"], feeds["new"][0]], axis=1))
    assert np.array_equal(after[1], np.concatenate([feeds["v"], feeds["new"][1]], axis=1))
    kept = {o for n in rewritten.graph.node for o in n.output}
    assert not kept & {"stack", "all", "grown"}, kept & {"stack", "all", "grown"}  # "tail" reads "slot"
