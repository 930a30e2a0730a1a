"""Inputs with computed defaults: `position_ids: Tensor[B, S; i32] = positions(mask)`.

The resolver makes each computed default a block function (`forward_default_position_ids`);
the torch and JAX code computes a left-out input in the entry (`if position_ids is None:`),
the ONNX runtime runs the default's own graph first.  Each backend is compared with numpy by
hand: left out equals passed explicitly with the default's value, and both equal the reference.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from linnet.diagnostics import LinnetError
from linnet.front.resolve import load_file

REPO = Path(__file__).resolve().parents[1]

SOURCE = """\
module defaults
use std.nn.embedding::embedding
use std.nn.masks::positions

pub block Positioned<D: Dim, P: Dim> {
    param w: Tensor[D; f32]
    param table: Tensor[P, D; f32]
    // x scaled by w and `scale`, plus the embedding of each position; the positions are
    // counted from the mask unless given.  (Not `attention_mask`: that name licenses the
    // packing pass to return zeros at padding, and this test compares every position.)
    pub entry forward<B: Dim, S: Dim>(
        x: Tensor[B, S, D; f32],
        mask: Tensor[B, S; i32] = ones,
        position_ids: Tensor[B, S; i32] = positions(mask),
        scale: Tensor[D; f32] = ones,
    ) -> Tensor[B, S, D; f32]
    where S <= P {
        return x * w * scale + embedding(position_ids, table)
    }
}
"""

MANIFEST = """\
[model]
name = "positioned"
title = "Computed defaults test"
summary = "An entry whose position_ids default to positions(mask)."
license = "MIT"
family = "test"

[source]
path = "src/lib.linnet"
root = "Positioned"
entry = "forward"

[generics]
D = 4
P = 8

[check]
B = 2
S = 5

[weights]
repo = "linnet/positioned"
revision = "0000000000000000000000000000000000000000"
files = ["model.safetensors"]
bindings = "bindings.json"
"""


@pytest.fixture(scope="module")
def positioned(tmp_path_factory):
    """A zoo entry of `SOURCE` with random weights: its folder, weights file and the weights."""
    import numpy as np
    import safetensors.numpy

    root = tmp_path_factory.mktemp("defaults")
    entry = root / "positioned"
    (entry / "src").mkdir(parents=True)
    (entry / "src" / "lib.linnet").write_text(SOURCE, encoding="utf-8")
    (entry / "nest.toml").write_text(MANIFEST, encoding="utf-8")
    (entry / "linnet.toml").write_text('[package]\nname = "defaults"\nversion = "0.1.0"\nlanguage = "0.1"\n')
    rng = np.random.default_rng(7)
    weights = {"w": rng.standard_normal(4).astype(np.float32),
               "table": rng.standard_normal((8, 4)).astype(np.float32)}
    (entry / "bindings.json").write_text(json.dumps({k: f"ckpt.{k}" for k in weights}))
    safetensors.numpy.save_file({f"ckpt.{k}": v for k, v in weights.items()}, str(root / "model.safetensors"))
    return entry, root / "model.safetensors", weights


def _reference(x, mask, position_ids, scale, weights):
    """The entry in float64 numpy."""
    import numpy as np

    return x.astype(np.float64) * weights["w"] * scale + weights["table"].astype(np.float64)[position_ids]


def _positions(mask):
    """std.nn.masks::positions by hand: a running count of real tokens less one, floored at 0."""
    import numpy as np

    return np.maximum(np.cumsum(mask != 0, axis=1) - 1, 0)


@pytest.mark.parametrize("backend", ["torch", "jax", "onnx"])
def test_a_left_out_computed_default_is_computed_from_the_inputs_before_it(positioned, backend):
    import numpy as np

    from linnet import nest

    entry, weights_file, weights = positioned
    model = nest.load(entry, backend=backend, weights=weights_file)
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 5, 4)).astype(np.float32)
    mask = np.array([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1]], dtype=np.int32)  # right- and left-padded
    ones = np.ones(4, dtype=np.float32)
    counted = _positions(mask)
    assert counted.tolist() == [[0, 1, 2, 2, 2], [0, 0, 0, 1, 2]]  # the hand count itself
    expected = _reference(x, mask, counted, ones, weights)
    left_out = np.asarray(model(x, mask))
    np.testing.assert_allclose(left_out, expected, rtol=1e-5, atol=1e-5)
    # Passing the default's value explicitly gives the same; passing another overrides it.
    np.testing.assert_array_equal(np.asarray(model(x, mask, position_ids=counted.astype(np.int32))), left_out)
    given = np.array([[4, 3, 2, 1, 0], [7, 7, 7, 7, 7]], dtype=np.int32)
    np.testing.assert_allclose(np.asarray(model(x, mask, given)), _reference(x, mask, given, ones, weights),
                               rtol=1e-5, atol=1e-5)
    # Everything left out: the mask is ones, so the positions are 0..S-1; a later constant
    # default (`scale`) after a computed one still fills; scale given by name with positions left out.
    np.testing.assert_allclose(np.asarray(model(x)),
                               _reference(x, None, np.tile(np.arange(5), (2, 1)), ones, weights),
                               rtol=1e-5, atol=1e-5)
    scale = rng.standard_normal(4).astype(np.float32)
    np.testing.assert_allclose(np.asarray(model(x, mask, scale=scale)),
                               _reference(x, mask, counted, scale, weights), rtol=1e-5, atol=1e-5)


def test_the_signature_shows_the_default_as_written(positioned):
    entry, _, _ = positioned
    run = subprocess.run([sys.executable, "-m", "linnet.cli", "check", str(entry), "--format", "json"],
                         capture_output=True, text=True, cwd=REPO)
    assert run.returncode == 0, run.stderr
    signature = json.loads(run.stdout)["entries"]["forward"]["signature"]
    assert "position_ids: Tensor[B, S; i32] = positions(mask)" in signature
    assert "scale: Tensor[4; f32] = ones" in signature


def test_the_generated_torch_and_jax_code_computes_it_when_left_out(positioned):
    from linnet.backends import jax_source, torch_source
    from linnet.cli.targets import locate
    from linnet.compiler import compile_target
    from linnet.middle.lower import lower

    entry, _, _ = positioned
    program = lower(compile_target(locate(str(entry))).instance)
    torch_code = torch_source.emit(program)
    assert "def forward(self, x, mask, position_ids=None, scale=None):" in torch_code
    assert "position_ids=None" in torch_code
    assert "if position_ids is None:  # position_ids = positions(mask)" in torch_code
    assert "position_ids = self.forward_default_position_ids(mask)" in torch_code
    jax_code = jax_source.emit(program)
    assert "if position_ids is None:" in jax_code
    assert "Positioned_forward_default_position_ids(params, mask)" in jax_code


def _error_codes(tmp_path, text):
    path = tmp_path / "m.linnet"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(LinnetError) as err:
        load_file(path)
    return [d.code for d in err.value.diagnostics]


def test_defaults_must_be_trailing_and_read_only_earlier_parameters(tmp_path):
    assert _error_codes(tmp_path, SOURCE.replace("scale: Tensor[D; f32] = ones,", "scale: Tensor[D; f32],")) \
        == ["E0113"]
    reordered = SOURCE.replace(
        "mask: Tensor[B, S; i32] = ones,\n        position_ids: Tensor[B, S; i32] = positions(mask),",
        "position_ids: Tensor[B, S; i32] = positions(mask),\n        mask: Tensor[B, S; i32] = ones,")
    assert reordered != SOURCE
    assert _error_codes(tmp_path, reordered) == ["E0114"]
    assert _error_codes(tmp_path, SOURCE.replace("= positions(mask)", "= positions(position_ids)")) \
        == ["E0114"]


def test_the_trainable_torch_module_computes_a_left_out_default(positioned):
    """`model.torch_module()` (linnet.nest.training) runs the generated method unoptimised:
    the left-out input reaches it as None and the method computes it."""
    import numpy as np
    import torch

    from linnet import nest

    entry, weights_file, weights = positioned
    module = nest.load(entry, backend="torch", weights=weights_file).torch_module()
    x = np.random.default_rng(13).standard_normal((2, 5, 4)).astype(np.float32)
    mask = np.array([[1, 1, 0, 0, 0], [0, 1, 1, 1, 1]], dtype=np.int32)
    with torch.no_grad():
        left_out = module(torch.from_numpy(x), torch.from_numpy(mask)).numpy()
    expected = _reference(x, mask, _positions(mask), np.ones(4, np.float32), weights)
    np.testing.assert_allclose(left_out, expected, rtol=1e-5, atol=1e-5)
