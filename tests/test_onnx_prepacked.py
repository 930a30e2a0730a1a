"""The ONNX session a load opens, from this machine's saved pre-packed graph
(linnet/backends/onnx_prepacked.py), on real ONNX Runtime.

The first load with kernels="auto" opens the session while ORT saves its optimised graph and
packed weights; the next load opens that copy instead of packing again.  What must hold: the
copy's outputs are the same bits as a session that packed its own weights (MiniLM's real
weights, whose 87 MB export is above `MIN_WEIGHT_BYTES`, and a tiny GPT-2's decoder steps with
the threshold lowered), a damaged or unwritable copy falls back to packing at load, and
small models and kernels="default" save nothing.  Each test keeps its copies in its own
folder (the runtime's `cache_dir`), so no other module's loads are read back.
"""
from __future__ import annotations

import logging

import numpy as np
import pytest

from fixtures.gpt2 import TINY, save_gpt2, write_tiny_entry
from fixtures.parity import random_inputs
from linnet import nest
from linnet.backends import onnx_options, onnx_prepacked, onnx_runtime
from linnet.backends.onnx_decoder import STEP_FILE

EOS = TINY["eos_token_id"]


@pytest.fixture
def saved_here(tmp_path, monkeypatch):
    """Copies go under tmp_path; the session-options probe is skipped (tests/test_onnx_options.py
    covers it): the default settings are what a probe that found nothing faster returns."""
    monkeypatch.setattr(onnx_runtime, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(onnx_options, "choose", lambda *args, **kwargs: onnx_options.SessionChoice({}))
    return tmp_path / "onnx-prepacked"


def _copies(root) -> list:
    return sorted(p for p in root.glob("*/*") if p.is_dir()) if root.exists() else []


def _minilm_outputs(model) -> list[np.ndarray]:
    outputs = []
    for batch, seq in ((1, 1), (2, 33), (3, 128)):
        tokens, token_types = random_inputs(batch, seq)
        outputs.append(np.asarray(model(tokens, token_types)))
    tokens, token_types = random_inputs(2, 20, seed=5)
    mask = np.ones_like(tokens)
    mask[1, 11:] = 0
    outputs.append(np.asarray(model.forward(tokens=tokens, token_types=token_types, attention_mask=mask)))
    return outputs


def test_a_second_load_reads_the_saved_packed_weights_and_computes_the_same_bits(minilm_checkpoint, saved_here):
    first = nest.load("all-minilm-l6-v2", backend="onnx", kernels="auto")
    assert first.runtime.prepacked == "saved"
    [copy] = _copies(saved_here)
    assert (copy / onnx_prepacked.COMPLETE).exists() and (copy / onnx_prepacked.DATA_FILE).stat().st_size > 0
    second = nest.load("all-minilm-l6-v2", backend="onnx", kernels="auto")
    assert second.runtime.prepacked == "loaded"
    # kernels="default" opens ORT's session as ORT does: packed at load, nothing saved or read.
    plain = nest.load("all-minilm-l6-v2", backend="onnx", kernels="default")
    assert plain.runtime.prepacked is None and _copies(saved_here) == [copy]
    for saved, loaded, packed in zip(_minilm_outputs(first), _minilm_outputs(second), _minilm_outputs(plain)):
        assert np.array_equal(loaded, packed) and np.array_equal(saved, packed)


def test_a_damaged_copy_is_saved_again_and_an_unwritable_cache_packs_at_load(minilm_checkpoint, saved_here,
                                                                           caplog, monkeypatch):
    reference = _minilm_outputs(nest.load("all-minilm-l6-v2", backend="onnx", kernels="default"))
    nest.load("all-minilm-l6-v2", backend="onnx", kernels="auto")
    [copy] = _copies(saved_here)
    graph = next(copy.glob("*.onnx"))
    graph.write_bytes(b"not a graph")
    with caplog.at_level(logging.WARNING, logger="linnet.onnx"):
        again = nest.load("all-minilm-l6-v2", backend="onnx", kernels="auto")
    assert again.runtime.prepacked == "saved"
    assert "could not be opened" in caplog.text and "saving it again" in caplog.text
    assert graph.stat().st_size > 1000  # the copy was written anew
    assert all(np.array_equal(a, b) for a, b in zip(_minilm_outputs(again), reference))

    # A cache folder that cannot be created (a file stands where it would go): packed at load.
    blocked = saved_here.parent / "blocked"
    blocked.write_text("")
    monkeypatch.setattr(onnx_runtime, "cache_dir", lambda: blocked)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="linnet.onnx"):
        unsaved = nest.load("all-minilm-l6-v2", backend="onnx", kernels="auto")
    assert unsaved.runtime.prepacked == "not saved"
    assert "could not save ONNX Runtime's pre-packed graph" in caplog.text
    assert all(np.array_equal(a, b) for a, b in zip(_minilm_outputs(unsaved), reference))


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory):
    base = tmp_path_factory.mktemp("tiny-gpt2-prepacked")
    save_gpt2(base / "hf", seed=4)
    return write_tiny_entry(base / "entry"), base / "hf" / "model.safetensors"


def _greedy(model) -> np.ndarray:
    rng = np.random.default_rng(9)
    tokens = rng.integers(0, EOS, (2, 7))
    mask = np.ones((2, 7), np.int64)
    mask[1, :3] = 0
    tokens[mask == 0] = EOS
    logits = np.asarray(model.forward(tokens=tokens, attention_mask=mask))
    return logits, np.asarray(model.generate(tokens, 12, attention_mask=mask, eos_token_id=EOS))


def test_small_models_pack_at_load_and_save_nothing(tiny_gpt2, saved_here):
    entry, weights = tiny_gpt2
    model = nest.load(entry, backend="onnx", weights=weights, kernels="auto")
    assert model.runtime.prepacked is None and _copies(saved_here) == []


def test_a_decoder_steps_on_its_saved_step_graph_with_the_same_tokens(tiny_gpt2, saved_here, monkeypatch):
    monkeypatch.setattr(onnx_prepacked, "MIN_WEIGHT_BYTES", 0)
    entry, weights = tiny_gpt2
    plain = nest.load(entry, backend="onnx", weights=weights, kernels="default")
    first = nest.load(entry, backend="onnx", weights=weights, kernels="auto")
    second = nest.load(entry, backend="onnx", weights=weights, kernels="auto")
    assert (first.runtime.prepacked, second.runtime.prepacked) == ("saved", "loaded")
    # The session a decoder's load opens is generate's step graph, so that is the one saved.
    [copy] = _copies(saved_here)
    assert (copy / STEP_FILE).exists()
    expected_logits, expected_tokens = _greedy(plain)
    for model in (first, second):
        logits, tokens = _greedy(model)
        assert np.array_equal(logits, expected_logits) and np.array_equal(tokens, expected_tokens)


def test_the_copy_is_keyed_by_machine_runtime_settings_and_file(tmp_path, monkeypatch):
    folder = tmp_path / "export-abc"
    settings = onnx_options.default_settings(2)
    key = lambda **change: onnx_prepacked.saved_folder(tmp_path, folder, change.get("file", "model.forward.onnx"),
                                                       {**settings, **change.get("settings", {})})
    assert key() == key()
    assert key(file="decoder_with_past_model.onnx") != key()
    assert key(settings={"intra_op_num_threads": 4}) != key()
    here = key()
    monkeypatch.setattr(onnx_prepacked, "cpu_model", lambda: "another CPU")
    assert key() != here
    monkeypatch.undo()
    monkeypatch.setattr(onnx_prepacked, "cpu_flags", lambda: "the same CPU with AVX-512 hidden")
    assert key() != here
