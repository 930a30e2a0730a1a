"""GPT-2's `generate` on every backend, and the ONNX graphs with a key and a value per layer.

A small random GPT2LMHeadModel saved by transformers' `save_pretrained` (tests/fixtures/gpt2.py)
is loaded through a zoo entry over `nest/gpt2`'s source and compared with transformers'
`generate(do_sample=False)` on a left-padded batch, 32 new tokens, on torch, JAX, StableHLO
and ONNX Runtime; the smallest margin between transformers' two best scores is printed, so a
near-tie would show. Then:

* JAX and StableHLO step on a cache of one length (JAX's `JaxRingSteps`, updated in place;
  StableHLO's `WindowSteps`): every decode call sees the same shapes, so each entry (JAX: its
  one jitted step) compiles once per generate call, not once per position;
* the ONNX runtime's optimum-style graphs (`decoder_model.onnx`, `decoder_with_past_model.onnx`):
  their inputs and outputs by name and dims, their results against the entries (1e-5), and
  generate running on them through IOBinding rather than on the entries;
* seeded sampling reproducible on each backend; bad prompts refused before compute on the
  backends' own stepping paths too.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fixtures.gpt2 import TINY, save_gpt2, write_tiny_entry
from linnet import nest
from linnet.backends.onnx_decoder import PREFILL_FILE, STEP_FILE, PastKeyValueSteps, past_names, present_names

BACKENDS = ["torch", "jax", "stablehlo", "onnx", "openvino"]
BOUND = 1e-5
EOS = TINY["eos_token_id"]
LAYERS, HEADS, DH = TINY["n_layer"], TINY["n_head"], TINY["n_embd"] // TINY["n_head"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    base = tmp_path_factory.mktemp("tiny-gpt2-generate")
    reference = save_gpt2(base / "hf", seed=1)
    return write_tiny_entry(base / "entry"), base / "hf" / "model.safetensors", reference


@pytest.fixture(scope="module")
def models(tiny):
    entry, weights, _ = tiny
    loaded = {}

    def load(backend):
        if backend not in loaded:
            options = {"kernels": "default"} if backend == "torch" else {}
            loaded[backend] = nest.load(entry, backend=backend, weights=weights, **options)
        return loaded[backend]

    return load


def left_padded(lengths: list[int], seed: int):
    rng = np.random.default_rng(seed)
    width = max(lengths)
    tokens = rng.integers(0, EOS, (len(lengths), width))
    mask = np.zeros((len(lengths), width), np.int64)
    for row, n in enumerate(lengths):
        mask[row, width - n:] = 1
    tokens[mask == 0] = EOS
    return tokens, mask


def transformers_greedy(reference, tokens, mask, new: int):
    with torch.no_grad():
        out = reference.generate(torch.tensor(tokens), attention_mask=torch.tensor(mask), max_new_tokens=new,
                                 do_sample=False, pad_token_id=EOS, eos_token_id=EOS, output_scores=True,
                                 return_dict_in_generate=True)
    scores = torch.stack(out.scores, 1).numpy()  # [B, new, Vocab]
    top2 = np.sort(scores, axis=-1)[..., -2:]
    margin = top2[..., 1] - top2[..., 0]
    return out.sequences.numpy(), float(margin[np.isfinite(margin)].min())


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_generate_of_32_tokens_is_token_identical_to_transformers(tiny, models, backend):
    tokens, mask = left_padded([7, 4, 1], seed=6)
    theirs, margin = transformers_greedy(tiny[2], tokens, mask, 32)
    ours = models(backend).generate(tokens, 32, attention_mask=mask, eos_token_id=EOS)
    print(f"{backend}: smallest top-1/top-2 margin in transformers' scores {margin:.3g}")
    assert ours.shape == theirs.shape == (3, 39)
    assert (ours == theirs).all(), np.argwhere(ours != theirs)[:5]


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_backends_steps_equal_a_full_recompute_at_every_step(models, backend):
    """The stepping generate uses on this backend (the entries, the fixed window, or ONNX
    Runtime's past-key-value graphs) against `forward` over the whole sequence so far."""
    from linnet.nest.generate import _left_pad, _steps

    model = models(backend)
    tokens, mask = left_padded([6, 2], seed=12)
    new = 6
    steps = _steps(model, tokens, mask, new)
    logits = steps.start(tokens, mask)
    rng = np.random.default_rng(13)
    width = tokens.shape[1] + new
    for step in range(new - 1):
        # The reference at one width, left-padded (padding is checked against transformers in
        # tests/test_gpt2.py), so JAX and StableHLO compile `forward` once.
        pad = width - tokens.shape[1]
        full = np.asarray(model(_left_pad(tokens, pad), attention_mask=_left_pad(mask, pad)))[:, -1]
        assert np.abs(np.asarray(logits) - full).max() < BOUND, (type(steps).__name__, step)
        token = rng.integers(0, EOS, (2, 1))
        tokens, mask = np.concatenate([tokens, token], 1), np.concatenate([mask, np.ones_like(token)], 1)
        logits = steps.step(token, mask)


@pytest.mark.parametrize("backend", ["jax", "stablehlo"])
def test_compiling_backends_step_on_one_cache_length(models, backend, monkeypatch):
    model = models(backend)
    shapes = []
    run = model.runtime.run
    monkeypatch.setattr(model.runtime, "run", lambda entry, inputs: (
        shapes.append((entry, tuple(tuple(np.shape(a)) for a in inputs))), run(entry, inputs))[1])
    tokens, mask = left_padded([5, 2], seed=2)
    compiled = model.runtime.ring_step()._cache_size() if backend == "jax" else 0
    model.generate(tokens, 9, attention_mask=mask)
    decodes = {s for entry, s in shapes if entry == "decode"}
    cache = (LAYERS, 2, 2, HEADS, 13, DH)  # the prompt (5) padded to 5 + 9 - 1 positions, kept there
    # `prefill` once, at that length.
    assert [s for entry, s in shapes if entry == "prefill"] == [((2, 13), (2, 13))]
    if backend == "jax":
        # JAX steps on one cache updated in place (`JaxRingSteps`): 8 calls of one jitted
        # decode step, compiled once.
        assert not decodes
        assert model.runtime.ring_step()._cache_size() - compiled <= 1
        return
    assert len([1 for entry, _ in shapes if entry == "decode"]) == 8
    # One shape for every decode.
    assert decodes == {((2, 1), cache, (2, 14))}


@pytest.mark.parametrize("backend", BACKENDS)
def test_seeded_sampling_is_reproducible(models, backend):
    model = models(backend)
    tokens, mask = left_padded([5, 3], seed=8)
    run = lambda seed: model.generate(tokens, 10, attention_mask=mask, do_sample=True, temperature=1.3, top_k=30,
                                      top_p=0.9, seed=seed)
    first = run(4)
    assert (run(4) == first).all()
    assert not all((run(s) == first).all() for s in (5, 6, 7))


# ------------------------------------------------------------------ ONNX past key values


def test_onnx_decoder_graphs_have_optimum_names_and_dims(models):
    import onnx

    folder = models("onnx").runtime.folder
    # Their weights are the entries' weights file, not copies of their own.
    assert not list(folder.glob("decoder.*.bin"))
    past, present = past_names(LAYERS), present_names(LAYERS)
    assert past[:2] == ["past_key_values.0.key", "past_key_values.0.value"] and present[-1] == f"present.{LAYERS - 1}.value"

    def io(file):
        graph = onnx.load(str(folder / file), load_external_data=False).graph
        dims = lambda v: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
        return ({v.name: dims(v) for v in graph.input}, {v.name: dims(v) for v in graph.output})

    inputs, outputs = io(STEP_FILE)
    assert list(inputs) == ["input_ids", "attention_mask"] + past
    # Emitted from `extend`: S new tokens after P cached ones (the prompt over an empty cache).
    assert inputs["input_ids"] == ["B", "S"] and inputs["attention_mask"] == ["B", "P + S"]
    assert inputs["past_key_values.1.value"] == ["B", HEADS, "P", DH]
    assert list(outputs) == ["logits"] + present
    assert outputs["logits"] == ["B", 1, TINY["vocab_size"]] and outputs["present.0.key"] == ["B", HEADS, "P + S", DH]
    inputs, outputs = io(PREFILL_FILE)
    assert list(inputs) == ["input_ids", "attention_mask"] and inputs["input_ids"] == ["B", "S"]
    assert list(outputs) == ["logits"] + present and outputs["present.1.key"] == ["B", HEADS, "S", DH]


def test_onnx_step_copies_each_layers_cache_once(models):
    """The step graph grows each layer's keys and values by one concat of the input with the new
    position, which is also what that layer attends over; the stacked cache
    [Layers + 1, 2, B, Heads, P, Dh] the entry is written over, and its slices, are gone
    (`onnx_views.forward_views`)."""
    import onnx

    model = onnx.load(str(models("onnx").runtime.folder / STEP_FILE), load_external_data=False)
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    for past, present in zip(past_names(LAYERS), present_names(LAYERS)):
        node = producer[present]
        assert node.op_type == "Concat" and node.input[0] == past, (present, node.op_type, list(node.input))
        assert sorted(n.op_type for n in graph.node if past in n.input and n.op_type != "Shape") == ["Concat"], past
        assert [n.op_type for n in graph.node if present in n.input], f"nothing attends over {present}"
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True).graph
    stacked = [v.name for v in inferred.value_info
               if [d.dim_value for d in v.type.tensor_type.shape.dim][:2] == [LAYERS, 2]]
    assert not stacked, stacked


def test_onnx_past_key_value_steps_equal_the_entries(models):
    model = models("onnx")
    steps = model.runtime.decoder_steps()
    assert isinstance(steps, PastKeyValueSteps)
    tokens, mask = left_padded([6, 3], seed=4)
    expected, cache = model.prefill(tokens, attention_mask=mask)
    logits = steps.start(tokens, mask)
    assert np.abs(logits - expected).max() < BOUND
    rng = np.random.default_rng(9)
    for step in range(4):
        for i in range(LAYERS):
            key, value = (steps._cache[2 * i + part].numpy() for part in (0, 1))
            assert np.abs(key - cache[i, 0]).max() < BOUND and np.abs(value - cache[i, 1]).max() < BOUND
        token = rng.integers(0, EOS, (2, 1))
        mask = np.concatenate([mask, np.ones_like(token)], 1)
        expected, cache = model.decode(token, cache, attention_mask=mask)
        logits = steps.step(token, mask)
        assert np.abs(logits - expected).max() < BOUND, step


def test_onnx_generate_runs_on_the_past_key_value_graphs(tiny, models, monkeypatch):
    model = models("onnx")
    monkeypatch.setattr(model.runtime, "run", lambda *a: pytest.fail("generate ran an entry's graph"))
    tokens, mask = left_padded([4, 6], seed=5)
    ours = model.generate(tokens, 12, attention_mask=mask, eos_token_id=EOS)
    theirs, _ = transformers_greedy(tiny[2], tokens, mask, 12)
    assert (ours == theirs).all()


@pytest.mark.parametrize("backend", ["jax", "onnx"])
def test_bad_prompts_are_refused_before_compute_on_a_runtimes_own_steps(models, backend, monkeypatch):
    model = models(backend)
    monkeypatch.setattr(model.runtime, "run", lambda *a: pytest.fail("ran before refusing"))
    monkeypatch.setattr(PastKeyValueSteps, "start", lambda *a: pytest.fail("ran before refusing"))
    with pytest.raises(Exception) as caught:
        model.generate(np.array([[1, TINY["vocab_size"]]]), 3)
    assert caught.value.code == "E0701" and f"`wte`, which has {TINY['vocab_size']} rows" in caught.value.render()
    with pytest.raises(Exception) as caught:
        model.generate(np.zeros((1, 60), np.int64), 5)
    assert caught.value.code == "E0702" and "needs 65 positions" in caught.value.render()
