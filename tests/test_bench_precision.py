"""The precision bench's plumbing (`bench/precision.py`): its measures on hand-computed cases,
its text selection, the method list built from its tuples, and the target check.

Nothing here loads a model or times anything; the figures themselves are the run's
(`nest/all-minilm-l6-v2/precision-bench.json`, docs/bench.md "Precision").
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # `bench` lives at the top of the repository, beside linnet/

from bench import precision  # noqa: E402
from bench.methods import LinnetMethod  # noqa: E402


# ------------------------------------------------------------------ measures


def test_cosines_by_hand():
    a = np.array([[1.0, 0.0], [1.0, 1.0], [3.0, 4.0]])
    b = np.array([[0.0, 1.0], [2.0, 2.0], [-3.0, -4.0]])
    np.testing.assert_allclose(precision.cosines(a, b), [0.0, 1.0, -1.0], atol=1e-15)
    # Rows need not be normalised: cos([1, 0], [1, 1]) = 1/sqrt(2).
    np.testing.assert_allclose(precision.cosines([[1.0, 0.0]], [[1.0, 1.0]]), [2 ** -0.5])


def test_top_k_by_hand():
    queries = np.array([[1.0, 0.0], [0.0, 1.0]])
    docs = np.array([[0.9, 0.1], [0.1, 0.9], [0.5, 0.5], [1.0, 0.0]])
    # query 0 scores 0.9, 0.1, 0.5, 1.0; query 1 scores 0.1, 0.9, 0.5, 0.0
    assert precision.top_k(queries, docs, 2).tolist() == [[3, 0], [1, 2]]
    # k past the number of docs gives every doc, ranked.
    assert precision.top_k(queries, docs, 10).tolist() == [[3, 0, 2, 1], [1, 2, 0, 3]]
    # ties keep the lower index first
    assert precision.top_k(np.array([[1.0, 0.0]]), np.array([[1.0, 0.0]] * 3), 2).tolist() == [[0, 1]]


def test_top_k_overlap_by_hand():
    reference = np.array([[0, 1, 2], [3, 4, 5]])
    other = np.array([[2, 5, 0], [5, 4, 3]])  # order does not count, membership does
    np.testing.assert_allclose(precision.top_k_overlap(reference, other), [2 / 3, 1.0])


# ------------------------------------------------------------------ texts


def test_first_sentence():
    assert precision.first_sentence("Return the value. Raise KeyError if absent.") == "Return the value."
    assert precision.first_sentence("Use e.g. this one") == "Use e.g. this one"  # no capital after the dot
    assert precision.first_sentence("Only one line") == "Only one line"


def test_long_texts_join_consecutive_paragraphs_within_the_token_range():
    words = lambda text: len(text.split())  # noqa: E731 - a tokenizer that counts words
    # 50-word paragraphs reach any target in [150, 250] exactly at a multiple of 50 <= 250; the
    # 300-word one overshoots whatever join it ends, which is dropped.
    paragraphs = [" ".join([f"p{i}"] * (300 if i == 7 else 50)) for i in range(30)]
    found = precision.long_texts(paragraphs, words, n=100, seed=0, low=150, high=250)
    assert len(found) >= 4, found
    for text in found:
        assert 150 <= words(text) <= 250
    # every text is a run of consecutive paragraphs joined with one space
    joined = " | ".join(paragraphs)
    for text in found:
        assert any(" ".join(paragraphs[i:j]) == text for i in range(len(paragraphs))
                   for j in range(i + 1, len(paragraphs) + 1)), text
    # the 300-word paragraph overshoots the range and never appears
    assert not any("p7" in t for t in found) and joined
    # a seeded sample when more were found than asked for
    one = precision.long_texts(paragraphs * 5, words, n=2, seed=3)
    assert len(one) == 2 and one == precision.long_texts(paragraphs * 5, words, n=2, seed=3)


def test_short_texts_are_distinct_first_sentences_in_range_excluding():
    paragraphs = ["Open the file. Then read it.", "Open the file. Close it later.", "x", "Close the socket now.",
                  "A very long sentence " + "word " * 40 + "end."]
    found = precision.short_texts(paragraphs, n=10, low=10, high=60, exclude=["Close the socket now."])
    assert found == ["Open the file."]
    two = precision.short_texts([f"Sentence number {i} here." for i in range(50)], n=5, seed=1)
    assert len(two) == 5 and len(set(two)) == 5


def test_nn_sets_queries_are_not_docs():
    paragraphs = [f"Paragraph {i} says something. And more about {i}." for i in range(40)]
    docs, queries = precision.nn_sets(paragraphs, n_docs=25, n_queries=10, seed=0)
    assert len(docs) == 25 and len(queries) == 10
    sources = {q.split()[1] for q in queries}  # "Paragraph <i> says something."
    assert not sources & {d.split()[1] for d in docs}


# ------------------------------------------------------------------ methods


def test_methods_are_generated_from_the_tuples():
    keys = precision.default_keys()
    assert keys[0] == precision.ANCHOR
    assert keys[:len(precision.REFERENCES)] == [k for k, _ in precision.REFERENCES]
    classes = precision.by_key()
    for backend, dtype, mode in precision.LINNET + precision.LINNET_EXTRA:
        cls = precision.precision_method(backend, dtype, mode)
        assert issubclass(cls, LinnetMethod)
        assert (cls.backend, cls.dtype, cls.mode) == (backend, dtype, mode)
        assert cls.devices == ("cpu",)
        assert classes[cls.key].__name__ == cls.__name__
    assert len(keys) == len(set(keys)) == len(precision.REFERENCES) + len(precision.LINNET)
    # the reference keys are the classes' own
    for key, cls in precision.REFERENCES:
        assert cls.key == key


def test_precision_options_reach_nest_load():
    int8 = precision.precision_method("onnx", "f32", "int8")
    assert int8.key == "linnet-onnx-f32-int8" and int8.precision == "int8"
    assert int8.options == {"precision": "int8"}
    hint = precision.precision_method("openvino", "f32", "bf16-hint")
    assert hint.precision == "bf16" and hint.options == {"precision_hint": "bf16"}
    bf16 = precision.precision_method("torch", "bf16", "eager")
    assert bf16.key == "linnet-torch-bf16" and bf16.precision == "bf16"
    # a method instance's nest.load arguments carry the dtype (f32 is the default, left out)
    ctx = type("Ctx", (), {"weights": type("W", (), {"linnet_weights": None})()})()
    method = bf16.__new__(bf16)
    method.ctx = ctx
    assert method._load_args() == {"backend": "torch", "dtype": "bf16"}


def test_methods_for_adds_the_anchor_and_refuses_unknown_keys():
    chosen = [cls.key for cls in precision.methods_for(["linnet-onnx-f32-int8", "onnx-reference-int8"])]
    assert chosen == [precision.ANCHOR, "onnx-reference-int8", "linnet-onnx-f32-int8"]
    with pytest.raises(ValueError, match="unknown method"):
        precision.methods_for(["no-such-method"])


# ------------------------------------------------------------------ targets and table


def _method(key, long, short, mean, low, diff=0.0, error=None):
    return {"key": key, "method": key, "kind": "k", "precision": "p", "error": error, "notes": [],
            "metrics": {"long_per_s": long, "short_per_s": short, "cosine_mean": mean, "cosine_min": low,
                        "max_abs_diff": diff, "top10_overlap_mean": 1.0, "top10_overlap_min": 1.0,
                        "long_x_st": 1.0, "short_x_st": 1.0, "peak_rss_mib": 500.0}}


def test_targets_by_hand():
    result = {"methods": [
        _method("openvino-reference-int8-nncf", 10.0, 100.0, 0.996, 0.99),
        _method("linnet-onnx-f32-int8", 13.0, 130.0, 0.996, 0.985),   # 1.30x, 1.30x: met
        _method("openvino-reference-default", 10.0, 100.0, 0.99998, 0.9999),
        _method("linnet-torch-bf16", 12.0, 100.0, 0.99999, 0.9999),   # short 1.00x < 1.15: not met
        _method("linnet-openvino-f32-bf16-hint", 12.0, 120.0, 0.99997, 0.9999),  # cosine short of 0.99998
        _method("openvino-reference", 10.0, 100.0, 1.0, 1.0),
        _method("linnet-onnx-f32", 10.0, 101.0, 1.0, 1.0, diff=2e-7),
        _method("linnet-openvino-f32", 12.0, 130.0, 1.0, 1.0, diff=3e-5)]}  # faster, but not exact
    found = precision.targets(result)
    assert found["int8"]["long_x"] == 1.3 and found["int8"]["met"] is True
    assert found["bf16"]["short_x"] == 1.0 and found["bf16"]["met"] is False
    assert found["bf16 (OpenVINO hint)"]["met"] is False
    assert found["f32"]["met"] is True
    assert found["f32 (OpenVINO)"]["long_x"] == 1.2 and found["f32 (OpenVINO)"]["met"] is False
    result["methods"][-2]["metrics"]["max_abs_diff"] = 1e-3  # not exact any more
    assert precision.targets(result)["f32"]["met"] is False
    result["methods"][0]["error"] = "load: failed"  # no OpenVINO int8 figure: nothing is met
    assert precision.targets(result)["int8"]["long_x"] is None and precision.targets(result)["int8"]["met"] is False


def test_table_has_a_row_per_method_and_shows_errors():
    result = {"methods": [_method("a", 1.0, 2.0, 1.0, 1.0), _method("b", None, None, None, None, error="build: x")]}
    text = precision.table(result)
    rows = text.splitlines()
    assert len(rows) == 4 and "`a`" in rows[2] and "error: build: x" in rows[3]


def test_python_m_bench_workloads_precision_delegates(monkeypatch):
    from bench import cli

    seen = []
    monkeypatch.setattr(precision, "main", lambda argv: seen.append(argv) or 0)
    assert cli.main(["--model", "all-minilm-l6-v2", "--workloads", "precision", "--quick",
                     "--methods", "linnet-onnx-f32-int8", "--out", "/tmp/x.json"]) == 0
    assert seen == [["--model", "all-minilm-l6-v2", "--methods", "linnet-onnx-f32-int8", "--out", "/tmp/x.json",
                     "--quick"]]
    with pytest.raises(SystemExit):  # not mixed with the harness's own workloads
        cli.main(["--model", "all-minilm-l6-v2", "--workloads", "precision,fixed"])
