"""bench/onnx_profile.py: the ORT profile summary counts the right FLOPs and the graphs it
builds compute what they claim.  No time is asserted (the machine is shared)."""
from __future__ import annotations

import tempfile

import numpy as np
import onnx
import onnxruntime as ort

from bench import onnx_profile


def _save(model, path) -> str:
    onnx.save(model, str(path))
    return str(path)


def test_one_matmul_graph_is_x_times_its_weight(tmp_path):
    path = _save(onnx_profile.one_matmul_model(0, 8, 16, 4), tmp_path / "mm.onnx")
    weight = onnx.numpy_helper.to_array(onnx.load(path).graph.initializer[0])
    x = np.random.default_rng(1).standard_normal((8, 16)).astype(np.float32)
    (y,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"a": x})
    assert weight.shape == (16, 4)
    np.testing.assert_allclose(y, x @ weight, rtol=1e-5, atol=1e-6)


def test_profile_sums_each_gemm_shape_and_its_flops(tmp_path, monkeypatch):
    plain = _save(onnx_profile.one_matmul_model(0, 8, 16, 4), tmp_path / "mm.onnx")
    batched = _save(onnx_profile.one_matmul_model(3, 5, 6, 7), tmp_path / "bmm.onnx")
    monkeypatch.setitem(onnx_profile.SIZE, "free", 8)
    summaries = onnx_profile.profile([plain, batched], runs=3)
    (flops_plain,) = [v[1] for v in summaries[plain]["by_shape"].values()]
    (flops_batched,) = [v[1] for v in summaries[batched]["by_shape"].values()]
    assert flops_plain == 2 * 8 * 16 * 4  # per run, the 3 timed runs averaged
    assert flops_batched == 2 * 3 * 5 * 6 * 7
    assert set(summaries[batched]["by_op"]) == {"MatMul"}


def test_shapes_parse_with_and_without_a_batch():
    assert onnx_profile.parse_shape("128x768x3072") == (0, 128, 768, 3072)
    assert onnx_profile.parse_shape("12:128x64x128") == (12, 128, 64, 128)


def test_gemm_chain_has_every_bert_linear_and_keeps_its_scale(tmp_path):
    model = onnx_profile.gemm_chain_model(layers=2, tokens=4, width=8, hidden=32)
    assert [n.op_type for n in model.graph.node] == ["MatMul"] * 12
    shapes = [tuple(t.dims) for t in model.graph.initializer]
    assert shapes == [(8, 8)] * 4 + [(8, 32), (32, 8)] + [(8, 8)] * 4 + [(8, 32), (32, 8)]
    path = _save(model, tmp_path / "chain.onnx")
    x = np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32)
    (y,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert 0.05 < float(np.std(y)) < 20  # 1/sqrt(K) weights: no blow-up, no denormals


def test_ab_of_a_file_with_itself_is_exact(tmp_path, monkeypatch):
    path = _save(onnx_profile.one_matmul_model(0, 8, 16, 4), tmp_path / "mm.onnx")
    monkeypatch.setitem(onnx_profile.SIZE, "free", 8)
    result = onnx_profile.ab(path, path, rounds=2, calls=1, cpu_time=True)
    assert result["max_abs_diff"] == 0.0 and len(result["ratios"]) == 2 and result["ratio"] > 0


def test_ab_of_two_different_graphs_reports_their_difference(tmp_path, monkeypatch):
    first = _save(onnx_profile.one_matmul_model(0, 8, 16, 4), tmp_path / "a.onnx")
    model = onnx_profile.one_matmul_model(0, 8, 16, 4)
    weight = model.graph.initializer[0]
    weight.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(weight) * 2, weight.name))
    second = _save(model, tmp_path / "b.onnx")
    monkeypatch.setitem(onnx_profile.SIZE, "free", 8)
    result = onnx_profile.ab(first, second, rounds=3, calls=1, cpu_time=True)
    assert result["max_abs_diff"] > 0 and len(result["ratios"]) == 3


def test_alternate_takes_turns_at_going_first():
    order = []
    result = onnx_profile.alternate(lambda k: order.append(k) or {"a": 0.001, "b": 0.002}[k], rounds=4)
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert result["ratio"] == 2.0 and result["a_ms"] == 1.0 and result["b_ms"] == 2.0


def test_profile_and_roofline_leave_no_files_behind(tmp_path, monkeypatch):
    """Each profile writes a trace and each roofline shape a graph; a bench run used to leave
    them in the temp folder (with ViT's 330 MiB export, 39 runs had left 13 GB)."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    path = _save(onnx_profile.one_matmul_model(0, 8, 16, 4), tmp_path / "mm.onnx")
    monkeypatch.setitem(onnx_profile.SIZE, "free", 8)
    assert onnx_profile.profile([path], runs=2)[path]["by_op"]
    assert len(onnx_profile.roofline(["8x16x4"], seconds_per_shape=0.01)) == 1
    assert list(scratch.iterdir()) == []
