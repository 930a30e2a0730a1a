"""The ONNX attention Loop over query chunks (`linnet.backends.onnx_fused._chunked_attention`)
on the graphs that normally take the one-pass form: a tiny GPT-2 (causal mask, left padding,
the prefill and step graphs) and the real all-MiniLM-L6-v2 on its padding-free graphs.

Only ModernBERT's `S <= 8192` puts an entry past the one-pass limit of 1,024 queries, and
its test (test_modernbert_long.py) needs S > 1,024. Here the limit is lowered to 8, so the
Loop runs at small sizes, with chunks of fewer rows than the queries. (When the Loop was
written, ONNX Runtime once refused a GPT-2 graph with it as not topologically sorted; that
has not been reproduced since, on f32, bf16 or shared-weight exports.) Each model
is exported twice into separate caches (the export's cache key does not see the limit),
and the Loop graphs must give the one-pass graphs' numbers.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from fixtures.gpt2 import save_gpt2
from linnet import nest
from linnet.backends import onnx_fused


def _both_forms(monkeypatch, tmp_path, load):
    """(one-pass model, Loop model): `load()` run in two fresh export caches, the second with
    the one-pass limit at 8 queries and chunks of 4."""
    monkeypatch.setenv("LINNET_CACHE", str(tmp_path / "one-pass"))
    plain = load()
    monkeypatch.setenv("LINNET_CACHE", str(tmp_path / "loop"))
    monkeypatch.setattr(onnx_fused, "ATTENTION_ONE_PASS", 8)
    monkeypatch.setattr(onnx_fused, "ATTENTION_CHUNK", 4)
    return plain, load()


def _loops(model, entry: str) -> int:
    graph = onnx.load(str(model.info.generated.parent / f"model.{entry}.onnx"), load_external_data=False).graph
    return sum(node.op_type == "Loop" for node in graph.node)


def test_gpt2_graphs_in_loop_form_equal_the_one_pass_graphs(monkeypatch, tmp_path):
    folder = tmp_path / "gpt2"
    save_gpt2(folder)
    plain, looped = _both_forms(monkeypatch, tmp_path, lambda: nest.load(str(folder), backend="onnx"))
    tokens = np.random.default_rng(1).integers(0, 96, (2, 23)).astype(np.int32)
    mask = np.ones_like(tokens)
    mask[0, :5] = 0  # GPT-2 pads on the left
    got = np.asarray(looped.forward(tokens, mask))
    assert _loops(looped, "forward") == 2 and _loops(plain, "forward") == 0  # one per layer
    assert np.abs(got - np.asarray(plain.forward(tokens, mask)))[mask == 1].max() <= 1e-5
    assert (looped.generate(tokens[1:, :9], max_new_tokens=4) == plain.generate(tokens[1:, :9], max_new_tokens=4)).all()


def test_padding_free_minilm_in_loop_form_equals_the_one_pass_graphs(monkeypatch, tmp_path, minilm_checkpoint):
    plain, looped = _both_forms(monkeypatch, tmp_path, lambda: nest.load("all-minilm-l6-v2", backend="onnx"))
    texts = ["short", "a sentence of a dozen or so tokens, to cross a few chunks of four",
             "another one of middling length"]
    assert _loops(looped, "embed") == 6
    assert np.abs(looped.encode(texts, progress=False) - plain.encode(texts, progress=False)).max() <= 1e-6
