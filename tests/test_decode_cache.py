"""generate's decode cache written in place on torch (`linnet/backends/torch_cache.py`) and JAX.

The decoders' `decode` entries grow the cache by concatenation; on torch, `generate` holds it
in one buffer allocated after `prefill` and each step writes its new position in place. What
these tests would catch if the per-step copy came back:

* the cache after every step is a view of the same storage as after `prefill`, and no
  `aten::cat` (or `aten::stack`) run by a decode step makes a tensor as large as one layer's
  keys and values (seen at torch's dispatcher, under a `TorchDispatchMode`), on GPT-2 and on
  a grouped-query Llama;
* the logits at every step bit-equal to the entries run unchanged (`EntrySteps`: the plain
  concatenations), and generate's tokens equal to transformers' (tests/test_llama.py and
  tests/test_gpt2_generate.py run the same comparison on every backend);
* the buffer's write-once rule: an append over positions another append wrote with other
  values, or onto a view that is not the buffer's prefix, is `torch.cat` and leaves every
  view handed out unchanged;
* the buffer unregistered after generate returns, and generate's tokens equal to the same
  greedy loop on the plain entries;
* JAX (`JaxRingSteps`): each step's cache argument donated and aliased by the compiled step's
  output, no concatenation of the whole grown cache in the compiled HLO, the scores within
  1e-5 of the shifting window steps.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fixtures.gpt2 import TINY as GPT2, save_gpt2, write_tiny_entry
from linnet import nest
from linnet.backends.torch_cache import CacheBuffer
from linnet.backends.torch_runtime import TorchBufferSteps
from linnet.backends.torch_source import BUFFERS
from linnet.nest.generate import EntrySteps
from test_llama import save_llama


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    base = tmp_path_factory.mktemp("decode-cache-gpt2")
    save_gpt2(base / "hf", seed=3)
    return nest.load(write_tiny_entry(base / "entry"), backend="torch", weights=base / "hf" / "model.safetensors",
                     kernels="default")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    folder = tmp_path_factory.mktemp("decode-cache-llama")
    save_llama(folder, tie_word_embeddings=True, rope_theta=500.0)  # 4 query heads, 2 key/value heads
    return nest.load(folder, backend="torch")


class Joins(TorchDispatchMode):
    """The output sizes of every aten cat/stack run under it."""

    def __init__(self):
        super().__init__()
        self.sizes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in (torch.ops.aten.cat, torch.ops.aten.stack):
            self.sizes.append(out.numel())
        return out


def _batch(vocab: int, lengths=(9, 6)):
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, vocab - 1, (len(lengths), max(lengths)))
    mask = np.zeros_like(tokens)
    for row, n in enumerate(lengths):
        mask[row, max(lengths) - n:] = 1
    return tokens, mask


@pytest.mark.parametrize("which", ["gpt2", "llama"])
def test_generate_writes_the_cache_in_place_without_a_per_step_copy(request, which):
    model = request.getfixturevalue(which)
    vocab = model.program.entries["decode"].result.items[0].dims[1].as_int()
    tokens, mask = _batch(vocab)
    new = 24
    steps = model.runtime.cache_buffer_steps(tokens.shape[1] + new)
    assert isinstance(steps, TorchBufferSteps)
    plain = EntrySteps(model)
    ours, theirs = steps.start(tokens, mask), plain.start(tokens, mask)
    np.testing.assert_array_equal(ours, theirs)
    storage = steps.cache.untyped_storage().data_ptr()
    slots, _, batch, heads, _, dh = steps.buffer.data.shape
    try:
        for step in range(new - 1):
            token = theirs.argmax(-1)[:, None]
            mask = np.concatenate([mask, np.ones((mask.shape[0], 1), mask.dtype)], axis=1)
            length = mask.shape[1] - 1  # the cache's positions before this step
            with Joins() as joins:
                ours = steps.step(token, mask)
            theirs = plain.step(token, mask)
            np.testing.assert_array_equal(ours, theirs)  # bit-equal: the same values, not copied
            assert steps.cache.shape[4] == length + 1
            now = steps.cache.untyped_storage().data_ptr()
            assert now == storage, f"step {step}: the cache left its buffer"
            one_layer = 2 * batch * heads * length * dh
            assert joins.sizes and max(joins.sizes) < one_layer, (
                f"step {step}: a concatenation of {max(joins.sizes)} elements, a layer's cache is {one_layer}")
        assert steps.buffer.copied == 0 and steps.buffer.in_place >= new - 1
    finally:
        steps.close()
    assert storage not in getattr(model.runtime.module, BUFFERS)


@pytest.mark.parametrize("which", ["gpt2", "llama"])
def test_generate_leaves_no_buffer_registered_and_matches_the_entries(request, which):
    model = request.getfixturevalue(which)
    vocab = model.program.entries["decode"].result.items[0].dims[1].as_int()
    tokens, mask = _batch(vocab)
    out = model.generate(tokens, 12, attention_mask=mask)
    assert getattr(model.runtime.module, BUFFERS) == {}
    # The same loop on the plain entries (no buffer steps): the same tokens.
    plain = EntrySteps(model)
    logits, mask_, expect = plain.start(tokens, mask), mask, [tokens]
    for _ in range(12):
        token = logits.argmax(-1)
        expect.append(token[:, None])
        mask_ = np.concatenate([mask_, np.ones((mask_.shape[0], 1), mask_.dtype)], axis=1)
        logits = plain.step(token[:, None], mask_)
    np.testing.assert_array_equal(out, np.concatenate(expect, axis=1))


def test_the_buffer_writes_each_position_once_and_falls_back_to_cat():
    with torch.inference_mode():
        prefix = torch.arange(3 * 2 * 1 * 2 * 4 * 5, dtype=torch.float32).reshape(3, 2, 1, 2, 4, 5)
        buffer = CacheBuffer(prefix, 8, axis=4)
        cache = buffer.view(4)
        column = torch.full((2, 1, 2, 1, 5), 7.0)
        # One slot, then the whole cache with the same values there: both in place.
        slot = buffer.append(cache[1], column, 3)
        assert slot.untyped_storage().data_ptr() == buffer.ptr
        torch.testing.assert_close(slot, torch.cat([cache[1], column], 3), rtol=0, atol=0)
        new = torch.stack([column + 1, column, column + 2])
        grown = buffer.append(cache, new, 4)
        assert grown.untyped_storage().data_ptr() == buffer.ptr and buffer.copied == 0
        torch.testing.assert_close(grown, torch.cat([cache, new], 4), rtol=0, atol=0)
        # Other values over written positions: torch.cat, the views handed out unchanged.
        other = buffer.append(cache[1], column * 0, 3)
        assert other.untyped_storage().data_ptr() != buffer.ptr and buffer.copied == 1
        torch.testing.assert_close(slot[..., 4, :], column[..., 0, :], rtol=0, atol=0)
        torch.testing.assert_close(grown, torch.cat([cache, new], 4), rtol=0, atol=0)
        # Not the buffer's prefix (positions 1..3), a copy of it, or past its capacity (5 written
        # positions and 4 more in a buffer of 8): torch.cat.
        for a, b, dim in ((cache[..., 1:, :], new, 4), (cache.clone(), new, 4),
                          (buffer.view(5), torch.cat([new] * 4, 4), 4)):
            out = buffer.append(a, b, dim)
            assert out.untyped_storage().data_ptr() != buffer.ptr
            torch.testing.assert_close(out, torch.cat([a, b], dim), rtol=0, atol=0)


# ------------------------------------------------------------------------------ JAX


@pytest.fixture(scope="module")
def llama_jax(tmp_path_factory):
    folder = tmp_path_factory.mktemp("decode-cache-llama-jax")
    save_llama(folder, tie_word_embeddings=True, rope_theta=500.0)
    return nest.load(folder, backend="jax")


def test_jax_generate_updates_one_donated_cache_in_place(llama_jax):
    """JAX: the cache passed to each step is donated and the compiled step's output aliases it
    (XLA writes the new position into that buffer), no concatenation makes the whole grown
    cache (only each layer's attention concat remains), and the scores stay within 1e-5 of the
    window steps (`WindowSteps`, the cache shifted a position per step)."""
    import re

    from linnet.backends.jax_runtime import JaxRingSteps
    from linnet.nest.generate import WindowSteps

    model = llama_jax
    tokens, mask = _batch(101, (7, 4))
    new = 16
    total = tokens.shape[1] + new
    ring, window = model.runtime.cache_buffer_steps(total), WindowSteps(model, total)
    assert isinstance(ring, JaxRingSteps)
    ours, theirs = ring.start(tokens, mask), window.start(tokens, mask)
    np.testing.assert_array_equal(ours, theirs)
    for _ in range(new - 1):
        token = theirs.argmax(-1)[:, None]
        mask = np.concatenate([mask, np.ones((mask.shape[0], 1), mask.dtype)], axis=1)
        before = ring.ring
        ours, theirs = ring.step(token, mask), window.step(token, mask)
        assert before.is_deleted(), "the step's cache argument was not donated"
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5)
    hlo = ring._step.lower(model.runtime.params, np.zeros((2, 1), np.int32), ring.ring,
                           np.ones((2, total), np.int32), np.int32(0)).compile().as_text()
    cache = ring.ring.shape
    assert re.search(r"input_output_alias=\{ \{0\}: \(\d+, \{\}, may-alias\) \}", hlo), "no output aliases the cache"
    grown = ",".join(map(str, cache[:4] + (cache[4] + 1,) + cache[5:]))
    concats = set(re.findall(r"f32\[([0-9,]+)\][^\n]*concatenate\(", hlo))
    assert grown not in concats, f"the whole cache is concatenated: {sorted(concats)}"
