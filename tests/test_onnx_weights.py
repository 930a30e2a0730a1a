"""How many copies of the weights a model loaded on ONNX Runtime holds.

* A decoder (GPT-2) opens only the graph `generate` runs, its step graph (`extend`), which
  takes the prompt too: no `forward` and no prefill session, one copy of the weights.
* `share_weights=True`: every session reads one memory-mapped copy of each weight
  (`linnet.backends.onnx_weights.SharedWeights`, given with `SessionOptions.add_initializer`),
  for GPT-2's prefill and step graphs and for a BERT's per-entry graphs alike; tokens and
  outputs stay those of transformers.
"""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from fixtures.gpt2 import TINY, save_gpt2, write_tiny_entry
from fixtures.parity import random_inputs, reference
from linnet import LinnetError, nest
from linnet.backends.onnx_decoder import PREFILL_FILE, STEP_FILE
from linnet.backends.onnx_runtime import entry_file

EOS = TINY["eos_token_id"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    base = tmp_path_factory.mktemp("tiny-gpt2-weights")
    reference_model = save_gpt2(base / "hf", seed=3)
    return write_tiny_entry(base / "entry"), base / "hf" / "model.safetensors", reference_model


def _greedy(reference_model, tokens, new):
    import torch

    with torch.no_grad():
        out = reference_model.generate(torch.tensor(tokens), attention_mask=torch.ones_like(torch.tensor(tokens)),
                                       max_new_tokens=new, do_sample=False, pad_token_id=EOS, eos_token_id=None)
    return out.numpy()


def _file_digest(path) -> str:
    return hashlib.blake2b(path.read_bytes(), digest_size=16).hexdigest()


def test_a_loaded_decoder_opens_no_forward_session(tiny):
    entry, weights, _ = tiny
    model = nest.load(entry, backend="onnx", weights=weights)
    assert set(model.runtime.sessions) == {STEP_FILE}  # opened at load: a broken export fails there
    model.generate(np.array([[5, 9, 2]]), 4, eos_token_id=None)
    assert set(model.runtime.sessions) == {STEP_FILE}  # the prompt ran on it too (an empty cache)
    assert model.runtime.shared_weights is None  # the default keeps ORT's own (pre-packed) copies


def test_gpt2_sessions_read_one_shared_copy_of_each_weight(tiny):
    entry, weights, reference_model = tiny
    model = nest.load(entry, backend="onnx", weights=weights, share_weights=True)
    tokens = np.random.default_rng(2).integers(0, EOS, (2, 6))
    ours = model.generate(tokens, 24, eos_token_id=None)
    assert (ours == _greedy(reference_model, tokens, 24)).all()

    shared = model.runtime.shared_weights
    assert set(shared.given) == {STEP_FILE}  # generate opens the step graph alone
    model.runtime.session(PREFILL_FILE)  # a second graph's session gets the same OrtValues
    assert set(shared.given) == {PREFILL_FILE, STEP_FILE}
    assert set(shared.given[PREFILL_FILE]) == set(shared.given[STEP_FILE])
    assert shared.array(PREFILL_FILE, "wte") is shared.array(STEP_FILE, "wte")
    assert len(shared.values) == len(shared.given[STEP_FILE])  # one OrtValue per weight, not per session

    # The sessions read the shared buffer itself, not a copy taken at creation: a change to
    # the token embedding is seen by both graphs. The mapping is copy-on-write, so the
    # cache's weights file stays as written.
    weights_file = model.runtime.folder / "weights.bin"
    before_file = _file_digest(weights_file)
    steps = model.runtime.decoder_steps()
    mask = np.ones_like(tokens)
    first = steps.start(tokens, mask)
    token = np.array([[4], [4]])
    second = steps.step(token, np.concatenate([mask, np.ones_like(token)], 1))
    shared.array(PREFILL_FILE, "wte")[:] *= 3.0
    assert np.abs(steps.start(tokens, mask) - first).max() > 1e-3
    assert np.abs(steps.step(token, np.concatenate([mask, np.ones_like(token)], 1)) - second).max() > 1e-3
    assert _file_digest(weights_file) == before_file


def test_the_shared_export_reads_the_tied_head_in_place(tiny):
    # ORT folds `Transpose(wte)` into a transposed copy per session; the share_weights export
    # multiplies by wte itself (Gemm transB=1), the default one keeps MatMul over the Transpose.
    import onnx

    entry, weights, _ = tiny

    def head(model):
        graph = onnx.load(str(model.runtime.folder / STEP_FILE), load_external_data=False).graph
        return [n for n in graph.node if "wte" in n.input and n.op_type != "Gather"]

    shared = nest.load(entry, backend="onnx", weights=weights, share_weights=True, kernels="default")
    default = nest.load(entry, backend="onnx", weights=weights, kernels="default")
    assert shared.runtime.folder != default.runtime.folder
    assert [(n.op_type, [a.i for a in n.attribute if a.name == "transB"]) for n in head(shared)] == [("Gemm", [1])]
    assert [n.op_type for n in head(default)] == ["Transpose"]


def test_bert_entry_sessions_share_weights_and_match_transformers(minilm_checkpoint, transformers_minilm):
    model = nest.load("all-minilm-l6-v2", backend="onnx", kernels="default", share_weights=True)
    tokens, token_types = random_inputs(2, 17, seed=4)
    hidden, pooled = model(tokens, token_types), model.pool(tokens, token_types)
    ref_hidden, ref_pooled = reference(transformers_minilm, tokens, token_types)
    print(f"shared-weights minilm: hidden {np.abs(hidden - ref_hidden).max():.3g} "
          f"pooled {np.abs(pooled - ref_pooled).max():.3g}")
    assert np.abs(hidden - ref_hidden).max() <= 1e-5 and np.abs(pooled - ref_pooled).max() <= 1e-5

    shared = model.runtime.shared_weights
    forward, pool = shared.given[entry_file("forward")], shared.given[entry_file("pool")]
    common = set(forward) & set(pool)
    assert len(common) >= 6 * 6  # every encoder layer's matrices, at least
    assert all(forward[name] == pool[name] for name in common)
    assert len(shared.values) == len({*forward.values(), *pool.values()})


def test_share_weights_takes_a_bool(tiny):
    entry, weights, _ = tiny
    with pytest.raises(LinnetError, match="share_weights must be True or False"):
        nest.load(entry, backend="onnx", weights=weights, share_weights="yes")


def test_export_file_names_parse_back_to_their_entry():
    # Triton leaves out the graphs of entries it does not serve by parsing these names, so the
    # parser must invert both writers and claim nothing else in an export folder.
    from linnet.backends.onnx_files import WEIGHTS_FILE, default_file, entry_of_file

    assert entry_of_file(entry_file("pool")) == "pool"
    assert entry_of_file(default_file("forward", "position_ids")) == "forward"
    for other in ("model.onnx", WEIGHTS_FILE, f"{WEIGHTS_FILE}.1", "model.forward.int8-0123456789abcdef.onnx",
                  "linnet_io.json", "model.pool.onnx.data"):
        assert entry_of_file(other) is None, other
