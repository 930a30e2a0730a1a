"""The onnx backend's `precision="int8"` on the real all-MiniLM-L6-v2: the measured plan holds
its budget against sentence-transformers' f32 embeddings on texts it was not calibrated on.

The test texts are test_encode's corpus (stdlib docstring paragraphs of other modules than
`linnet.backends.onnx_int8.default_calibration`'s; checked disjoint below); the reference is
sentence-transformers (torch f32) on the package's files, the same the model loads.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from linnet import LinnetError, codes, nest
from linnet.backends.onnx_int8 import cosines, default_calibration
from test_encode import corpus


@pytest.fixture(scope="module")
def texts():
    chosen = corpus()
    assert not set(chosen) & set(default_calibration()), "the test texts must not be calibration texts"
    return chosen


@pytest.fixture(scope="module")
def reference(minilm_checkpoint, texts):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_checkpoint), device="cpu").encode(texts, convert_to_numpy=True)


def _load(checkpoint, **options):
    return nest.load("all-minilm-l6-v2", backend="onnx", weights=checkpoint, **options)


@pytest.fixture(scope="module")
def int8(minilm_checkpoint):
    return _load(minilm_checkpoint, precision="int8")


def _ops(session) -> list[str]:
    return [n.op_type for n in onnx.load(session._model_path, load_external_data=False).graph.node]


def test_int8_encode_is_within_budget_of_sentence_transformers(int8, texts, reference):
    plan = int8.info.precision
    # The plan measured several candidates; the folder keeps only the chosen one's graph.
    assert not [p.name for p in int8.runtime.folder.iterdir() if ".candidate" in p.name]
    assert plan["plan"] == "int8" and plan["quantised"] > 0
    assert 1 - plan["mean_cosine"] <= 0.005 and plan["min_cosine"] >= 0.98  # on the calibration texts
    cos = cosines(int8.encode(texts, show_progress_bar=False), reference)
    print(f"int8 vs sentence-transformers f32 on {len(texts)} texts: mean {cos.mean():.5f}, min {cos.min():.5f}; "
          f"plan: {plan['quantised']} int8, {len(plan['kept_f32'])} f32")
    assert cos.mean() >= 0.995 and cos.min() >= 0.98
    assert cos.mean() < 0.99999, "no int8 ran: the embeddings are f32's"
    # The session really runs int8 matrices: as many integer products as the plan says.
    ops = _ops(int8.runtime.session("embed"))
    assert ops.count("MatMulInteger") == plan["quantised"]


def test_a_tight_budget_keeps_more_matrices_f32(minilm_checkpoint, int8, texts, reference):
    tight = _load(minilm_checkpoint, precision="int8", max_cosine_loss=0.0005, min_cosine=0.999)
    plan = tight.info.precision
    assert len(plan["kept_f32"]) > len(int8.info.precision["kept_f32"])
    assert plan["quantised"] > 0
    assert 1 - plan["mean_cosine"] <= 0.0005 and plan["min_cosine"] >= 0.999
    cos = cosines(tight.encode(texts, show_progress_bar=False), reference)
    print(f"tight plan vs sentence-transformers: mean {cos.mean():.6f}, min {cos.min():.6f}")
    assert cos.mean() >= 0.999 and cos.min() >= 0.995


def test_an_impossible_budget_is_refused(minilm_checkpoint):
    folder = _load(minilm_checkpoint).runtime.folder
    before = {p.name for p in folder.iterdir()}
    with pytest.raises(LinnetError) as caught:
        _load(minilm_checkpoint, precision="int8", max_cosine_loss=0, min_cosine=1,
              calibration=default_calibration()[:8])
    assert caught.value.code == codes.INT8_BUDGET
    assert "best mean cosine" in str(caught.value) and "8 calibration texts" in str(caught.value)
    # Every plan it measured was a quantised graph on disk; none is left in the export folder.
    assert {p.name for p in folder.iterdir()} == before


def test_f32_stays_exact(minilm_checkpoint, texts, reference):
    f32 = _load(minilm_checkpoint)
    assert f32.info.precision is None
    np.testing.assert_allclose(f32.encode(texts, show_progress_bar=False), reference, atol=1e-5, rtol=0)
    assert "MatMulInteger" not in _ops(f32.runtime.session("embed"))


def test_int8_options_are_checked(minilm_checkpoint):
    for options, code in (({"precision": "int4"}, codes.UNKNOWN_BACKEND_OPTION),
                          ({"max_cosine_loss": 0.01}, codes.UNKNOWN_BACKEND_OPTION),
                          ({"precision": "int8", "min_cosine": "high"}, codes.BAD_BACKEND_OPTION_TYPE)):
        with pytest.raises(LinnetError) as caught:
            _load(minilm_checkpoint, **options)
        assert caught.value.code == code, options


def test_the_plan_is_read_back_not_measured_again(minilm_checkpoint, int8, monkeypatch):
    import linnet.backends.onnx_int8 as onnx_int8

    def measured(*args):
        raise AssertionError("the plan was measured again")

    monkeypatch.setattr(onnx_int8, "cosines", measured)
    again = _load(minilm_checkpoint, precision="int8")
    assert again.info.precision == int8.info.precision
    with pytest.raises(AssertionError, match="measured again"):  # another budget is another plan
        _load(minilm_checkpoint, precision="int8", max_cosine_loss=0.004)
    # The measurement failed after writing its first candidate graph; none is left behind.
    assert not [p.name for p in int8.runtime.folder.iterdir() if ".candidate" in p.name]
