"""ModernBERT on long inputs: attention without [B, Heads, S, S] scores (docs/backends.md,
"Long inputs").

* A full-size synthetic `modernbert-base` (random weights at answerdotai/ModernBERT-base's
  config, written by transformers' `save_pretrained`) equals transformers' `ModernBertModel` on
  one sequence with padding at its end, within 1e-5 on torch, JAX, StableHLO and ONNX.  S is
  2048 on torch and ONNX (ONNX in query chunks of 256); JAX and StableHLO run S = 1100, past the
  1024 queries above which they chunk too, which keeps each of these tests near a minute on 2
  shared cores (2048 takes them about twice that).
* Peak RSS of a B=1, S=8192 `forward` on torch, ONNX and JAX, each in a child process
  (VmHWM, less the RSS after loading and one S=8 call: `resource.getrusage` maxrss in a child
  also counts its parent's RSS at fork, which Linux carries across exec; `kernels="default"`,
  which skips the per-machine kernel probe), stays below
  2 GiB, at the real widths with 3 of the 22 layers (one full, two sliding; weights are not
  counted, and layers run one after another, so more layers do not raise the peak).  One
  layer's [1, 12, 8192, 8192] scores alone would be 3 GiB.
* S = 8193 is refused by the `where S <= MaxPositions` clause (E0702) before any compute.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from fixtures.parity import max_diff
from linnet import nest
from linnet.diagnostics import LinnetError

TOLERANCE = 1e-5
PAD = 48  # padding tokens at the end of the sequence
LENGTHS = {"torch": 2048, "onnx": 2048, "jax": 1100, "stablehlo": 1100}
#: The largest peak RSS above the loaded model a B=1, S=8192 forward may take.
RSS_BUDGET_MIB = 2048


def _save(root, **overrides):
    import torch
    from transformers import ModernBertConfig, ModernBertForMaskedLM

    torch.manual_seed(0)
    config = ModernBertConfig(pad_token_id=0, **overrides)
    # transformers' own init, unscaled: with Wqkv scaled by 4 transformers' f32 result itself
    # drifts from float64 by about 1e-5 over 22 layers at S=2048, which would leave no margin.
    model = ModernBertForMaskedLM(config).eval()
    model.save_pretrained(root)
    return model


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("modernbert-base-synthetic")
    model = _save(root)
    return root, model


@pytest.fixture(scope="module")
def three_layers(tmp_path_factory):
    root = tmp_path_factory.mktemp("modernbert-base-3-layers")
    _save(root, num_hidden_layers=3)
    return root


def _batch(length: int):
    rng = np.random.default_rng(length)
    tokens = rng.integers(3, 50000, size=(1, length)).astype(np.int64)
    mask = np.ones((1, length), np.int64)
    mask[0, length - PAD:] = 0
    tokens[mask == 0] = 0
    return tokens, mask


@pytest.mark.parametrize("backend", list(LENGTHS))
def test_full_size_base_matches_transformers_on_a_long_sequence(base, backend):
    import torch

    root, reference = base
    length = LENGTHS[backend]
    tokens, mask = _batch(length)
    with torch.no_grad():  # transformers' default attention (SDPA)
        want = reference.model(input_ids=torch.from_numpy(tokens),
                               attention_mask=torch.from_numpy(mask)).last_hidden_state.numpy()
    model = nest.load(str(root), backend=backend)
    got = np.asarray(model.forward(tokens.astype(np.int32), mask.astype(np.int32)))
    real = mask.astype(bool)
    diff = max_diff(got[real], want[real])
    print(f"modernbert-base synthetic S={length} {backend}: max |diff| {diff:.2e}")  # shown with -s
    assert diff <= TOLERANCE


_PEAK = textwrap.dedent("""
    import json, resource, sys
    import numpy as np
    from linnet import nest

    def status_mib(field):
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith(field + ":")) / 1024

    def rss_mib():
        return status_mib("VmRSS")

    root, backend, length = sys.argv[1], sys.argv[2], int(sys.argv[3])
    model = nest.load(root, backend=backend, kernels="default")  # no per-machine kernel probe
    model.forward(np.full((1, 8), 5, np.int32))  # packs torch's weights, builds ORT's session
    loaded = rss_mib()
    tokens = np.random.default_rng(0).integers(3, 50000, size=(1, length)).astype(np.int32)
    out = np.asarray(model.forward(tokens))
    # VmHWM, this process's own peak: Linux carries ru_maxrss across exec, so a child's maxrss
    # is at least its parent's RSS when it forked (pytest's, with transformers' model loaded).
    peak = status_mib("VmHWM")
    print(json.dumps({"loaded_mib": loaded, "peak_mib": peak, "above_mib": peak - loaded,
                      "ru_maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "finite": bool(np.isfinite(out).all()), "shape": list(out.shape)}))
""")


@pytest.mark.parametrize("backend", ["torch", "onnx", "jax"])
def test_a_forward_at_8192_tokens_stays_under_2_gib_above_the_model(three_layers, backend):
    run = subprocess.run([sys.executable, "-c", _PEAK, str(three_layers), backend, "8192"],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    print(f"modernbert S=8192 {backend}: {result}")  # shown with -s
    assert result["shape"] == [1, 8192, 768] and result["finite"]
    assert result["above_mib"] < RSS_BUDGET_MIB, result


@pytest.mark.parametrize("backend", ["torch", "jax", "stablehlo", "onnx"])
def test_more_than_8192_tokens_is_refused_before_compute(three_layers, backend):
    model = nest.load(str(three_layers), backend=backend)
    with pytest.raises(LinnetError) as caught:
        model.forward(np.full((1, 8193), 5, np.int32))
    assert caught.value.code == "E0702", caught.value.render()
    assert "8192" in caught.value.render()
