"""The torch backend's Linear kernel choice: measured per machine and shape, exact, cached.

Speed is never asserted here (bench/ measures it); these tests check that whatever the probe
picks gives the default kernel's numbers within 1e-5, that the choice is cached and reused,
that autograd still sees the checkpoint's parameters, and that the option is validated.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from linnet import nest
from linnet.backends import torch_kernels
from linnet.diagnostics import LinnetError

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


def test_autograd_runs_the_generated_forward_and_reaches_the_parameters():
    import torch

    module = torch.nn.Linear(16, 8)
    torch_kernels.install_onednn(module)
    module(torch.randn(4, 16)).sum().backward()
    assert module.weight.grad is not None and module.weight.grad.shape == (8, 16)


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
    with pytest.raises(LinnetError) as caught:
        nest.load("all-minilm-l6-v2", backend="jax", weights=minilm_checkpoint, kernels="auto")
    assert caught.value.code == "E0807"  # JAX has no kernel choice (ONNX's is its session options)


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
