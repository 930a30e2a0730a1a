"""bench/emit_ab.py: the GEMM-only floor graph does the matrix products Linnet's ViT does, and
the prototype rewrites compute what the graph they rewrite computes.  No time is asserted."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from bench import emit_ab
from fixtures.vit_checkpoints import SMALL_VIT, write_small_vit_repo
from linnet import nest

TINY = {"layers": 2, "tokens": 5, "width": 8, "hidden": 16, "heads": 2}


def _gemm_flops(model) -> float:
    """2 * M * K * N summed over the Gemm and MatMul nodes, from ONNX shape inference."""
    inferred = onnx.shape_inference.infer_shapes(model)
    dims = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]}
    dims.update({t.name: list(t.dims) for t in inferred.graph.initializer})
    total = 0.0
    for node in inferred.graph.node:
        if node.op_type in ("Gemm", "MatMul"):
            a, out = dims[node.input[0]], dims[node.output[0]]
            total += 2.0 * float(np.prod(out)) * a[-1]
    return total


def test_the_floor_graph_does_vits_products_with_dead_rows():
    layers, rows, width, hidden = TINY["layers"], TINY["tokens"], TINY["width"], TINY["hidden"]
    model = emit_ab.gemm_floor_model(**TINY)
    linear = lambda m, k, n: 2.0 * m * k * n  # noqa: E731
    # Every layer but the last: Q, K, V and out (width x width), up, down, and attention's two
    # products over all rows; the last: K and V over all rows, the rest on the class token's row.
    full = 4 * linear(rows, width, width) + 2 * linear(rows, width, hidden) + 2 * linear(rows, rows, width)
    last = (2 * linear(rows, width, width) + 2 * linear(1, width, width) + 2 * linear(1, width, hidden)
            + 2 * linear(1, rows, width))
    expected = linear(rows, width, width) + (layers - 1) * full + last + linear(1, width, 1000)
    assert _gemm_flops(model) == expected
    ops = [n.op_type for n in model.graph.node]
    assert set(ops) <= {"Gemm", "MatMul", "Reshape", "Slice"}
    assert ops.count("Gemm") == 1 + 6 * layers + 1


def test_the_floor_graph_stays_finite():
    model = emit_ab.gemm_floor_model(**TINY)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((TINY["tokens"], TINY["width"])).astype(np.float32)
    (y,) = session.run(None, {"patches": x})
    assert y.shape == (1, 1000) and np.isfinite(y).all()


@pytest.fixture(scope="module")
def small_vit_export(hf_cache, linnet_cache, tmp_path_factory):
    vit = write_small_vit_repo(hf_cache, tmp_path_factory.mktemp("zoo") / "vit-small")
    model = nest.load(vit.entry, backend="onnx", kernels="default")
    # This model's own export (the cache holds every other test's exports too).
    path = model.runtime.folder / "model.forward.onnx"
    assert path.is_file(), sorted(p.name for p in model.runtime.folder.iterdir())
    return path


@pytest.mark.parametrize("rewrite, sites", [("skip-layernorm", "SkipLayerNormalization"),
                                            ("skip-layernorm-bias", "SkipLayerNormalization"),
                                            ("bias-gelu", "BiasGelu")])
def test_a_rewrite_computes_what_the_export_does(small_vit_export, rewrite, sites):
    original = onnx.load(str(small_vit_export))
    model = onnx.load(str(small_vit_export))
    assert emit_ab.REWRITES[rewrite](model) > 0
    model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    assert sites in {n.op_type for n in model.graph.node}
    size = (2, SMALL_VIT.channels, SMALL_VIT.image, SMALL_VIT.image)
    images = np.random.default_rng(0).uniform(-1, 1, size).astype(np.float32)
    run = lambda m: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(  # noqa: E731
        None, {"images": images})[0]
    assert np.abs(run(model) - run(original)).max() <= 1e-5


def test_ab_of_an_export_with_itself_is_exact(small_vit_export):
    result = emit_ab.ab(small_vit_export, small_vit_export, rounds=2, calls=1, cpu_time=True)
    assert result["max_abs_diff"] == 0.0 and len(result["ratios"]) == 2 and result["ratio"] > 0
