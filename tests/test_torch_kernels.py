"""The torch backend's Linear kernel choice: measured per machine and shape, exact, cached.

Speed is never asserted here (bench/ measures it); these tests check that whatever the probe
picks gives the default kernel's numbers within 1e-5, that the choice is cached and reused,
that a chosen Linear holds its weight once (packed) and still gives the checkpoint's values
exactly to anything reading it, and that the option is validated.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from linnet import nest
from linnet.backends import torch_kernels
from linnet.diagnostics import LinnetError

# These tests are about the per-machine measurement that `kernels="auto"` runs.
pytestmark = pytest.mark.usefixtures("measured_kernels")

TEXTS = ["The cat sat on the mat.", "Interest rates rose again, the central bank said on Tuesday."]


@pytest.fixture()
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LINNET_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_probe_accepts_onednn_only_within_tolerance():
    import torch

    weight = torch.randn(256, 128) * 0.05
    bias = torch.randn(256) * 0.05
    choice = torch_kernels.probe(weight, bias)
    assert choice.max_error <= torch_kernels.TOLERANCE
    assert choice.kernel in ("onednn", "default") and choice.speedup > 0
    assert (choice.kernel == "onednn") == (choice.speedup >= torch_kernels.MIN_SPEEDUP)


@pytest.mark.parametrize("rows", [1, 7, 128, 1000])
def test_an_installed_onednn_linear_equals_f_linear_at_any_row_count(rows):
    import torch
    import torch.nn.functional as F

    module = torch.nn.Linear(384, 1536)
    torch_kernels.install_onednn(module)
    x = torch.randn(3, rows, 384)
    with torch.inference_mode():
        got = module(x)
        want = F.linear(x, module.weight, module.bias)
    assert got.shape == want.shape
    assert float((got - want).abs().max()) <= 1e-5 * max(1.0, float(want.abs().max()))


def test_an_installed_linear_holds_its_weight_once_and_gives_it_back_exactly():
    import torch
    import torch.nn.functional as F

    module = torch.nn.Linear(48, 24)
    weight, bias = module.weight.detach().clone(), module.bias.detach().clone()
    torch_kernels.install_onednn(module)
    # Only the packed copy is held: the dense weight is no parameter any more ...
    assert [name for name, _ in module.named_parameters()] == ["bias"]
    # ... yet reading it, or the state dict, gives the original values bit for bit.
    assert torch.equal(module.weight, weight)
    state = module.state_dict()
    assert list(state) == ["weight", "bias"] and torch.equal(state["weight"], weight)
    assert torch.equal(state["bias"], bias)
    # With autograd on, the generated forward runs over that dense weight, exactly F.linear's.
    x = torch.randn(4, 48, requires_grad=True)
    out = module(x)
    assert torch.equal(out, F.linear(x, weight, bias))
    out.sum().backward()
    assert x.grad is not None and x.grad.shape == (4, 48)


def test_a_lazily_installed_linear_packs_at_its_first_call_without_autograd(monkeypatch):
    import torch
    import torch.nn.functional as F

    monkeypatch.setattr(torch_kernels, "PLAIN_ROWS", 0)  # no call runs on the plain weight first

    module = torch.nn.Linear(48, 24)
    weight, bias = module.weight.detach().clone(), module.bias.detach().clone()
    torch_kernels.install_onednn(module, lazy=True)
    assert "linnet_packed_weight" not in module.__dict__
    assert [name for name, _ in module.named_parameters()] == ["weight", "bias"]
    x = torch.randn(4, 48, requires_grad=True)
    out = module(x)  # autograd on: F.linear over the dense weight, and nothing packed
    assert torch.equal(out, F.linear(x, weight, bias)) and "linnet_packed_weight" not in module.__dict__
    out.sum().backward()
    assert x.grad is not None
    with torch.inference_mode():
        got = module(x.detach())
        assert float((got - F.linear(x.detach(), weight, bias)).abs().max()) <= 1e-5 * max(1.0, float(got.abs().max()))
    # Packed now, and from then on held once, as an eagerly installed one is.
    assert "linnet_packed_weight" in module.__dict__
    assert [name for name, _ in module.named_parameters()] == ["bias"] and torch.equal(module.weight, weight)
    eager = torch.nn.Linear(48, 24)
    with torch.no_grad():
        eager.weight.copy_(weight), eager.bias.copy_(bias)
    torch_kernels.install_onednn(eager)
    with torch.inference_mode():
        assert torch.equal(module(x.detach()), eager(x.detach()))


def test_short_first_calls_run_on_the_plain_weight_with_the_packed_bits():
    """A lazily installed Linear runs calls of 2 rows and more on its plain weight until they
    would pass `PLAIN_ROWS` (a first result then does no packing), with the bits an eagerly
    packed copy gives; the call past it packs, and a one-row call packs at once."""
    import torch

    def pair():
        lazy = torch.nn.Linear(384, 1536)
        eager = torch.nn.Linear(384, 1536)
        with torch.no_grad():
            eager.weight.copy_(lazy.weight), eager.bias.copy_(lazy.bias)
        torch_kernels.install_onednn(lazy, lazy=True)
        torch_kernels.install_onednn(eager)
        return lazy, eager

    lazy, eager = pair()
    rows, calls = 16, torch_kernels.PLAIN_ROWS // 16
    with torch.inference_mode():
        for i in range(calls):
            x = torch.randn(1, rows, 384)
            assert torch.equal(lazy(x), eager(x))
            assert "linnet_packed_weight" not in lazy.__dict__, i
        x = torch.randn(1, rows, 384)
        assert torch.equal(lazy(x), eager(x))
        assert "linnet_packed_weight" in lazy.__dict__ and "weight" not in dict(lazy.named_parameters())
        lazy, eager = pair()
        x = torch.randn(1, 1, 384)
        assert torch.equal(lazy(x), eager(x)) and "linnet_packed_weight" in lazy.__dict__


def _onednn_modules(model) -> dict[str, object]:
    return {name: m for name, m in model.runtime.model.named_modules() if getattr(m, "linnet_kernel", None) == "onednn"}


def _packed(module) -> bool:
    return "linnet_packed_weight" in module.__dict__


def test_a_loaded_model_packs_each_linear_when_an_entry_first_runs_it(minilm_checkpoint, private_cache, monkeypatch):
    """Nothing is packed at load; `forward` packs the encoder's Linears and leaves the pooler,
    which only `pool` calls, dense; `pool` then packs it (no rows run plain first)."""
    monkeypatch.setattr(torch_kernels, "probe", lambda w, b: torch_kernels.Choice("onednn", 2.0, 0.0))
    monkeypatch.setattr(torch_kernels, "PLAIN_ROWS", 0)
    model = nest.load("all-minilm-l6-v2", weights=minilm_checkpoint)
    chosen = _onednn_modules(model)
    assert len(chosen) == 6 * 4 + 1 and "pooler.dense" in chosen
    assert not [name for name, m in chosen.items() if _packed(m)]
    assert all("weight" in dict(m.named_parameters()) for m in chosen.values())  # the dense weights stay
    batch = model.tokenizer(TEXTS)
    model(**batch)
    assert [name for name, m in chosen.items() if not _packed(m)] == ["pooler.dense"]
    assert "weight" in dict(chosen["pooler.dense"].named_parameters())
    assert all("weight" not in dict(m.named_parameters()) for n, m in chosen.items() if n != "pooler.dense")
    model.pool(batch.tokens, batch.token_types)
    assert all(_packed(m) for m in chosen.values())
    assert torch_kernels.pack_pending(model.runtime.model) == 0


@pytest.mark.parametrize("plain_rows", [0, torch_kernels.PLAIN_ROWS])
def test_packing_at_first_use_gives_the_bits_of_packing_at_load(plain_rows, minilm_checkpoint, private_cache,
                                                                monkeypatch):
    """Whether the first calls pack (`PLAIN_ROWS` 0) or run on the plain weights (these two
    short texts are far under `PLAIN_ROWS`), the outputs are the packed weights' bits."""
    monkeypatch.setattr(torch_kernels, "probe", lambda w, b: torch_kernels.Choice("onednn", 2.0, 0.0))
    monkeypatch.setattr(torch_kernels, "PLAIN_ROWS", plain_rows)
    lazy = nest.load("all-minilm-l6-v2", weights=minilm_checkpoint)
    eager = nest.load("all-minilm-l6-v2", weights=minilm_checkpoint)
    assert torch_kernels.pack_pending(eager.runtime.model) == 6 * 4 + 1
    assert all(_packed(m) for m in _onednn_modules(eager).values())
    plain = nest.load("all-minilm-l6-v2", weights=minilm_checkpoint, kernels="default")
    batch = lazy.tokenizer(TEXTS)
    import torch

    for entry in ("forward", "pool"):
        args = (batch.tokens, batch.token_types) if entry == "pool" else ()
        kwargs = {} if args else dict(batch)
        got, want = getattr(lazy, entry)(*args, **kwargs), getattr(eager, entry)(*args, **kwargs)
        assert torch.equal(torch.as_tensor(np.asarray(got)), torch.as_tensor(np.asarray(want))), entry
        reference = np.asarray(getattr(plain, entry)(*args, **kwargs))  # and the default kernels' numbers
        np.testing.assert_allclose(np.asarray(got), reference, atol=1e-5, rtol=0)
    assert any(_packed(m) for m in _onednn_modules(lazy).values()) == (plain_rows == 0)


@pytest.mark.parametrize("plain_calls", [0, 2])
def test_threads_whose_first_calls_meet_pack_each_weight_once(plain_calls, minilm_checkpoint, private_cache,
                                                              monkeypatch):
    """Four threads' first calls at once: each weight packs once, whichever thread gets there
    first; with room for two calls on the plain weights, the calls that run plain meanwhile
    give the packed weights' bits too."""
    import threading
    import time

    monkeypatch.setattr(torch_kernels, "probe", lambda w, b: torch_kernels.Choice("onednn", 2.0, 0.0))
    model = nest.load("all-minilm-l6-v2", weights=minilm_checkpoint)
    rows = int(np.asarray(model.tokenizer(TEXTS).tokens).size)  # what one call runs, padded or not
    monkeypatch.setattr(torch_kernels, "PLAIN_ROWS", plain_calls * rows)
    want = np.asarray(nest.load("all-minilm-l6-v2", weights=minilm_checkpoint, kernels="default")(
        **model.tokenizer(TEXTS)))
    reorder, packed = torch_kernels._reorder, []

    def slow_reorder(weight):  # widens the window in which another thread could pack the same weight
        time.sleep(0.002)
        packed.append(weight.shape)
        return reorder(weight)

    monkeypatch.setattr(torch_kernels, "_reorder", slow_reorder)
    results, errors = [None] * 4, []
    start = threading.Barrier(4)

    def call(i):
        try:
            start.wait()
            results[i] = np.asarray(model(**model.tokenizer(TEXTS)))
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert len(packed) == 6 * 4  # each encoder Linear once, whichever thread got there first
    for got in results:
        assert np.array_equal(got, results[0])
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_a_model_with_packed_weights_reads_back_the_checkpoint_exactly(minilm_checkpoint, private_cache,
                                                                       monkeypatch, tmp_path):
    """Every Linear packed (the probe forced to oneDNN), the dense pages handed back: state_dict
    and `nest.save` still give the checkpoint's values, and the outputs are unchanged."""
    import torch
    from safetensors.numpy import load_file

    monkeypatch.setattr(torch_kernels, "probe", lambda w, b: torch_kernels.Choice("onednn", 2.0, 0.0))
    auto = nest.load("all-minilm-l6-v2", weights=minilm_checkpoint)
    plain = nest.load("all-minilm-l6-v2", weights=minilm_checkpoint, kernels="default")
    packed = [m for m in auto.runtime.model.modules() if getattr(m, "linnet_kernel", None) == "onednn"]
    assert len(packed) == 6 * 4 + 1  # per layer fused Q/K/V, out, up, down; the pooler
    ours, theirs = auto.runtime.model.state_dict(), plain.runtime.model.state_dict()
    assert list(ours) == list(theirs)
    different = [k for k in theirs if not torch.equal(ours[k], theirs[k])]
    assert not different, different[:5]
    batch = auto.tokenizer(TEXTS)
    np.testing.assert_allclose(auto(**batch).numpy(), plain(**batch).numpy(), atol=1e-5, rtol=0)

    saved = load_file(str(nest.save(auto, tmp_path / "saved")))
    original = load_file(str(minilm_checkpoint / "model.safetensors"))
    assert set(saved) <= set(original)
    assert all(np.array_equal(saved[k], original[k]) for k in saved)


def test_auto_kernels_match_default_kernels_and_transformers(minilm_checkpoint, private_cache):
    auto = nest.load("all-minilm-l6-v2", weights=minilm_checkpoint)
    plain = nest.load("all-minilm-l6-v2", weights=minilm_checkpoint, kernels="default")
    assert plain.runtime.kernels == {}
    assert set(auto.runtime.kernels) == {"384x1152:float32", "384x384:float32", "384x1536:float32",
                                         "1536x384:float32"}  # fused Q/K/V, out, up, down
    batch = auto.tokenizer(TEXTS)
    np.testing.assert_allclose(auto(**batch).numpy(), plain(**batch).numpy(), atol=1e-5, rtol=0)

    from transformers import BertModel

    reference = BertModel.from_pretrained(str(minilm_checkpoint)).eval()
    import torch

    with torch.no_grad():
        theirs = reference(input_ids=torch.from_numpy(batch.tokens).long(),
                           attention_mask=torch.from_numpy(batch.attention_mask).long()).last_hidden_state
    real = batch.attention_mask.astype(bool)
    np.testing.assert_allclose(auto(**batch).numpy()[real], theirs.numpy()[real], atol=1e-5, rtol=0)


def test_choices_are_cached_per_machine_and_reused(minilm_checkpoint, private_cache, monkeypatch):
    first = nest.load("all-minilm-l6-v2", weights=minilm_checkpoint)
    stored = json.loads((private_cache / "kernels" / "torch-linear.json").read_text())
    assert list(stored) == [torch_kernels.machine_key()]
    assert set(stored[torch_kernels.machine_key()]) == set(first.runtime.kernels)

    def no_probe(*args, **kwargs):
        raise AssertionError("a cached shape was timed again")

    monkeypatch.setattr(torch_kernels, "probe", no_probe)
    again = nest.load("all-minilm-l6-v2", weights=minilm_checkpoint)
    assert again.runtime.kernels == first.runtime.kernels


def test_kernels_option_is_validated(minilm_checkpoint):
    with pytest.raises(LinnetError) as caught:
        nest.load("all-minilm-l6-v2", weights=minilm_checkpoint, kernels="fastest")
    assert caught.value.code == "E0802" and "kernels must be one of auto, default" in str(caught.value)
    with pytest.raises(LinnetError) as caught:  # JAX's choice is its XLA compiler options
        nest.load("all-minilm-l6-v2", backend="jax", weights=minilm_checkpoint, kernels="onednn")
    assert caught.value.code == "E0807" and "kernels must be one of auto, default" in str(caught.value)


def test_the_padding_free_program_runs_its_linears_on_the_chosen_kernel(minilm_checkpoint, private_cache,
                                                                        monkeypatch):
    """`packing=True` calls the Linears' `forward_packed*` methods, not `forward`: they must take
    the chosen kernel too, and give the default kernel's numbers."""
    monkeypatch.setattr(torch_kernels, "probe", lambda w, b: torch_kernels.Choice("onednn", 2.0, 0.0))
    packed = nest.load("all-minilm-l6-v2", weights=minilm_checkpoint, packing=True)
    plain = nest.load("all-minilm-l6-v2", weights=minilm_checkpoint, packing=True, kernels="default")
    calls = []
    onednn = torch_kernels._onednn_linear
    monkeypatch.setattr(torch_kernels, "_onednn_linear", lambda *a: calls.append(1) or onednn(*a))
    batch = packed.tokenizer(TEXTS)
    got = packed(**batch).numpy()
    assert len(calls) >= 6 * 4  # every Linear of the six layers, at least
    real = batch.attention_mask.astype(bool)
    np.testing.assert_allclose(got[real], plain(**batch).numpy()[real], atol=1e-5, rtol=0)



def _resident_pages(tensor) -> int:
    """How many whole pages inside `tensor` are in memory (/proc/self/pagemap's bit 63)."""
    import os
    import struct

    page = os.sysconf("SC_PAGE_SIZE")
    start, end = tensor.data_ptr(), tensor.data_ptr() + tensor.numel() * tensor.element_size()
    first, last = -(-start // page), end // page
    with open("/proc/self/pagemap", "rb") as handle:
        handle.seek(first * 8)
        data = handle.read((last - first) * 8)
    return sum(entry >> 63 for (entry,) in struct.iter_unpack("<Q", data))


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="pages are released on Linux only")
def test_a_packed_weight_read_from_a_mapped_file_hands_its_pages_back(tmp_path):
    import torch
    from safetensors import safe_open
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    values = rng.standard_normal((512, 256)).astype(np.float32)
    save_file({"weight": values, "bias": rng.standard_normal(512).astype(np.float32)}, str(tmp_path / "w.safetensors"))
    with safe_open(str(tmp_path / "w.safetensors"), framework="pt") as handle:
        weight, bias = handle.get_tensor("weight"), handle.get_tensor("bias")
    module = torch.nn.Linear(256, 512)
    module.weight, module.bias = torch.nn.Parameter(weight, False), torch.nn.Parameter(bias, False)
    assert torch.equal(weight, torch.from_numpy(values))  # read: its pages are resident
    assert _resident_pages(weight) > 100, "safetensors did not map the file (the test needs it mapped)"
    torch_kernels.install_onednn(module)
    assert _resident_pages(weight) == 0  # one copy of the weight in memory: the packed one
    # A view still alive reads the file's bytes again, unchanged; so does the module.
    assert torch.equal(weight, torch.from_numpy(values)) and torch.equal(module.weight, weight)
    with torch.inference_mode():
        x = torch.randn(3, 256)
        want = torch.nn.functional.linear(x, weight, bias)
        assert float((module(x) - want).abs().max()) <= 1e-5 * max(1.0, float(want.abs().max()))
    # With the file's ranges remembered, memory that is no file's keeps its values: a tensor
    # in anonymous memory, and one whose pages were written (a private copy of the file's).
    anonymous = torch.randn(256, 1024)
    kept = anonymous.clone()
    torch_kernels._release_mapped_pages(anonymous)
    assert torch.equal(anonymous, kept)
    with safe_open(str(tmp_path / "w.safetensors"), framework="pt") as handle:
        written = handle.get_tensor("weight")
    written.add_(1.0)
    torch_kernels._release_mapped_pages(written)
    assert torch.equal(written, torch.from_numpy(values) + 1.0)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_tied_lm_head_runs_packed_and_decodes_as_transformers(family, private_cache, monkeypatch, tmp_path):
    """The tied head (`matmul(hidden, transpose(wte))` in a block that also embeds with `wte`)
    is run through a packed oneDNN copy (the probe forced to choose it), the dense table kept
    for the embedding: logits within 1e-5 of the default kernels' and transformers', and
    greedy decoding token-identical to transformers' generate."""
    import torch
    from fixtures.gpt2 import save_gpt2, write_tiny_entry

    monkeypatch.setattr(torch_kernels, "probe", lambda w, b: torch_kernels.Choice("onednn", 2.0, 0.0))
    if family == "gpt2":
        reference = save_gpt2(tmp_path / "hf", seed=2)
        source, options = write_tiny_entry(tmp_path / "entry"), {"weights": tmp_path / "hf" / "model.safetensors"}
        head, table, vocab = "lm_head", "wte", 97
    else:
        reference = _tiny_llama(tmp_path, seed=2)
        source, options, head, table, vocab = tmp_path / "hf", {}, "tied_head", "embed_tokens", 101
    auto = nest.load(source, backend="torch", **options)
    plain = nest.load(source, backend="torch", kernels="default", **options)
    owners = [m for m in auto.runtime.model.modules() if head in getattr(m, "linnet_onednn_methods", {})]
    assert len(owners) == 1 and head not in owners[0].__dict__.get("linnet_packed_methods", {})  # packed at first use
    tokens = np.random.default_rng(4).integers(0, vocab - 1, (2, 9))
    with torch.no_grad():
        theirs = reference(torch.from_numpy(tokens)).logits.numpy()
    ours = np.asarray(auto(tokens))
    assert head in owners[0].linnet_packed_methods and table in dict(owners[0].named_parameters())  # the table stays
    np.testing.assert_allclose(ours, np.asarray(plain(tokens)), atol=1e-5, rtol=0)
    np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)
    reference.generation_config.eos_token_id = None
    with torch.no_grad():
        want = reference.generate(torch.from_numpy(tokens[:1]), max_new_tokens=12, do_sample=False,
                                  pad_token_id=0).numpy()
    assert np.array_equal(auto.generate(tokens[:1], 12, eos_token_id=-1), want)


@pytest.fixture()
def two_threads():
    """`split_gemv` splits over torch's threads, so it needs two (CI's machine has two cores)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("strided", [False, True])
@pytest.mark.parametrize("out_in", [True, False])
@pytest.mark.parametrize("shape", [(576, 192), (101, 32), (3, 8)])
def test_a_split_one_row_product_equals_f_linear(shape, out_in, strided, two_threads):
    """Both layouts, an odd output count (a vocabulary: the rows left over run apart), with and
    without a bias, the row contiguous (viewed as the blocks' column in place) or every other
    value of a wider one; more than one row is not its business."""
    import torch
    import torch.nn.functional as F

    out_features, in_features = shape
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(out_features, in_features, generator=generator)
    bias = torch.randn(out_features, generator=generator)
    stored = weight if out_in else weight.t().contiguous()
    x = torch.randn(1, 1, 2 * in_features, generator=generator)
    x = x[..., ::2] if strided else x[..., in_features:]
    assert x.is_contiguous() is not strided
    with torch.inference_mode():
        for b in (bias, None):
            got = torch_kernels.split_gemv(x, stored, b, out_in)
            want = F.linear(x, weight, b)
            assert got is not None and got.shape == want.shape == (1, 1, out_features)
            assert float((got - want).abs().max()) <= 1e-5 * max(1.0, float(want.abs().max()))


def test_a_split_linear_runs_a_prompt_on_the_default_matmul(two_threads):
    """A Linear whose one-row calls split runs calls of several rows (a prompt) on torch's
    default matmul, bit for bit: at SmolLM2's width oneDNN over the same weight sums in another
    order (1.6x the default's rounding error), which 30 layers carry past 1e-4 in the logits."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(2)
    linear = torch.nn.Linear(576, 192)
    torch_kernels.install_split_gemv(linear, torch_kernels._TORCH_LINEAR)
    assert linear.linnet_kernel == "split"
    with torch.inference_mode():
        for rows in (2, 16, 128):
            x = torch.randn(rows, 576)
            assert torch.equal(linear(x), F.linear(x, linear.weight, linear.bias))
        one = torch.randn(1, 576)
        assert torch.equal(linear(one), torch_kernels.split_gemv(one, linear.weight, linear.bias))


def test_a_split_product_declines_what_it_cannot_split():
    import torch

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch_kernels.split_gemv(torch.randn(1, 8), torch.randn(4, 8), None) is None
        torch.set_num_threads(2)  # [In, Out] splits the inputs: 7 of them do not halve
        assert torch_kernels.split_gemv(torch.randn(1, 7), torch.randn(7, 4), None, out_in=False) is None
    finally:
        torch.set_num_threads(before)


def _tiny_llama(tmp_path, seed=3):
    """A tied Llama (GQA 4/2, vocab 101) saved by transformers into tmp_path/hf; returned in eval
    mode, its generate ending on no id."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=101, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      tie_word_embeddings=True)
    reference = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for name, param in reference.named_parameters():
            param.copy_(torch.randn_like(param) * 0.2 + (1.0 if name.endswith("norm.weight") else 0.0))
    reference.save_pretrained(tmp_path / "hf", safe_serialization=True)
    reference.generation_config.eos_token_id = None
    return reference.eval()


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_decoder_splits_its_one_row_products_and_packs_nothing(family, private_cache, monkeypatch, tmp_path,
                                                                 two_threads):
    """With oneDNN chosen for many rows and the split for one (both forced), a decoder's Linears
    ([Out, In] in Llama, [In, Out] in GPT-2's Conv1D) keep their dense weights and never pack;
    a prompt's products run the default matmul (its hidden states are the default kernels'
    bits), its logits within 1e-5 of the default kernels' and of transformers', and greedy
    decoding is token-identical to transformers' generate."""
    import torch

    if family == "llama":
        reference = _tiny_llama(tmp_path)
        source, options, vocab, down = tmp_path / "hf", {}, 101, (32, 48)
    else:
        from fixtures.gpt2 import save_gpt2, write_tiny_entry

        reference = save_gpt2(tmp_path / "hf", seed=2)
        reference.generation_config.eos_token_id = None
        source, options = write_tiny_entry(tmp_path / "entry"), {"weights": tmp_path / "hf" / "model.safetensors"}
        vocab = reference.config.vocab_size
        down = tuple(reference.transformer.h[0].mlp.c_proj.weight.shape)  # [In, Out], as stored
    monkeypatch.setattr(torch_kernels, "probe", lambda w, b: torch_kernels.Choice("onednn", 2.0, 0.0))
    monkeypatch.setattr(torch_kernels, "probe_one_row",
                        lambda w, b, rows, out_in=True: torch_kernels.Choice("split", 2.0, 0.0))
    calls = []
    real_split = torch_kernels.split_gemv
    monkeypatch.setattr(torch_kernels, "split_gemv", lambda *a: calls.append(tuple(a[1].shape)) or real_split(*a))
    auto = nest.load(source, backend="torch", **options)
    plain = nest.load(source, backend="torch", kernels="default", **options)
    assert {k for k, c in auto.runtime.kernels.items() if k.endswith(torch_kernels.ONE_ROW)}
    linears = [m for m in auto.runtime.model.modules() if getattr(m, "linnet_kernel", None) is not None]
    assert linears and all(m.linnet_kernel == "split" for m in linears)
    tokens = np.random.default_rng(4).integers(0, vocab - 1, (2, 9))
    with torch.no_grad():
        theirs = reference(torch.from_numpy(tokens)).logits.numpy()
    ours = np.asarray(auto(tokens))
    np.testing.assert_allclose(ours, np.asarray(plain(tokens)), atol=1e-5, rtol=0)
    np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)
    assert not calls  # nine rows a sequence: the default matmul, not the split
    # Below the head (oneDNN here), a prompt runs torch's default matmul: the default kernels' bits.
    assert np.array_equal(np.asarray(auto.hidden_states(tokens)), np.asarray(plain.hidden_states(tokens)))
    with torch.no_grad():
        want = reference.generate(torch.from_numpy(tokens[:1]), max_new_tokens=12, do_sample=False,
                                  pad_token_id=0).numpy()
    assert np.array_equal(auto.generate(tokens[:1], 12, eos_token_id=-1), want)
    head = (vocab, reference.config.hidden_size)
    assert head in calls and down in calls  # the tied head and the MLP's down projection, stepping
    assert not [m for m in linears if "linnet_packed_weight" in m.__dict__]
    assert all(m.linnet_form.weight in dict(m.named_parameters()) for m in linears)


def test_a_decoder_never_runs_its_linears_on_onednn(private_cache, monkeypatch, tmp_path, two_threads):
    """Even where oneDNN would win at many rows and the split loses at one (both forced), a
    decoder's Linears stay on torch's default matmul: oneDNN's f32 sums, over a deep residual
    stream, take the logits past 1e-4 of transformers' (SmolLM2). The split is timed against
    that default matmul; only the tied head may pack."""
    _tiny_llama(tmp_path)
    timed_against = []
    monkeypatch.setattr(torch_kernels, "probe", lambda w, b: torch_kernels.Choice("onednn", 2.0, 0.0))
    monkeypatch.setattr(torch_kernels, "probe_one_row",
                        lambda w, b, rows, out_in=True: timed_against.append(rows.kernel)
                        or torch_kernels.Choice(rows.kernel, 0.5, 0.0))
    auto = nest.load(tmp_path / "hf", backend="torch")
    plain = nest.load(tmp_path / "hf", backend="torch", kernels="default")
    assert timed_against and set(timed_against) == {"default", "onednn"}  # the Linears', the head's
    linears = [m for m in auto.runtime.model.modules() if getattr(m, "linnet_form", None) is not None]
    assert not linears, [getattr(m, "linnet_kernel", None) for m in linears]
    tokens = np.random.default_rng(5).integers(0, 100, (2, 9))
    assert np.array_equal(np.asarray(auto.hidden_states(tokens)), np.asarray(plain.hidden_states(tokens)))


def test_an_encoder_is_not_timed_at_one_row(minilm_checkpoint, private_cache, monkeypatch):
    def no_probe(*args, **kwargs):
        raise AssertionError("an encoder's products were timed at one row")

    monkeypatch.setattr(torch_kernels, "probe_one_row", no_probe)
    model = nest.load("all-minilm-l6-v2", weights=minilm_checkpoint)
    assert not [k for k in model.runtime.kernels if k.endswith(torch_kernels.ONE_ROW)]


def test_choices_timed_while_others_share_the_cpu_are_used_but_not_cached(minilm_checkpoint, private_cache,
                                                                          monkeypatch):
    from linnet.contention import Contention, ContentionMeter

    monkeypatch.setattr(ContentionMeter, "stop", lambda self: Contention(0.6, 3.0, 2))
    model = nest.load("all-minilm-l6-v2", weights=minilm_checkpoint)
    assert model.runtime.kernels  # every shape was measured and its choice installed
    assert not (private_cache / "kernels" / "torch-linear.json").exists()


def test_one_row_choices_are_measured_cached_and_reused(private_cache, monkeypatch, tmp_path, two_threads):
    _tiny_llama(tmp_path)
    first = nest.load(tmp_path / "hf", backend="torch")
    one_row = {k: c for k, c in first.runtime.kernels.items() if k.endswith(torch_kernels.ONE_ROW)}
    assert one_row and all(c.kernel in ("split", "onednn", "default") and c.max_error <= torch_kernels.TOLERANCE
                           for c in one_row.values())
    stored = json.loads((private_cache / "kernels" / "torch-linear.json").read_text())
    assert set(one_row) <= set(stored[torch_kernels.machine_key()])

    def no_probe(*args, **kwargs):
        raise AssertionError("a cached shape was timed again")

    monkeypatch.setattr(torch_kernels, "probe", no_probe)
    monkeypatch.setattr(torch_kernels, "probe_one_row", no_probe)
    again = nest.load(tmp_path / "hf", backend="torch")
    assert again.runtime.kernels == first.runtime.kernels
