"""ViT (google/vit-base-patch16-224) on every backend, against transformers' ViTForImageClassification.

* `linnet check` proves the entry at its generics: 86,567,656 params, image-size preconditions.
* A full-size random checkpoint in the original key layout (tests/fixtures/vit_checkpoints.py)
  and a small random model saved by transformers' own `save_pretrained`: logits, the class
  token's final state and every hidden state match transformers within 1e-5 on torch, JAX,
  StableHLO and ONNX.
* Bad images (wrong channel count, 225x225, uint8 pixels, a NaN) are refused by name before
  anything runs.
"""
from __future__ import annotations

import numpy as np
import pytest

from fixtures.parity import max_diff
from fixtures.vit_checkpoints import VIT_BASE_PARAMS, write_small_vit_repo, write_synthetic_vit_base
from linnet import nest
from linnet.diagnostics import LinnetError

BACKENDS = ["torch", "jax", "stablehlo", "onnx"]
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def vit_base(hf_cache):
    return write_synthetic_vit_base(hf_cache)


@pytest.fixture(scope="module")
def transformers_vit_base(vit_base):
    import torch
    from transformers import ViTForImageClassification

    return ViTForImageClassification.from_pretrained(vit_base.repo, revision=vit_base.revision,
                                                     dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def small_vit(hf_cache, tmp_path_factory):
    return write_small_vit_repo(hf_cache, tmp_path_factory.mktemp("zoo") / "vit-small")


def _images(batch: int, size: int, seed: int = 0) -> np.ndarray:
    # Values in [-1, 1], what the preprocessor makes of real pixels.
    rng = np.random.default_rng(seed)
    return rng.uniform(-1.0, 1.0, size=(batch, 3, size, size)).astype(np.float32)


def _reference(model, images: np.ndarray):
    import torch

    with torch.no_grad():
        out = model(pixel_values=torch.from_numpy(images), output_hidden_states=True)
        embedding = model.vit(pixel_values=torch.from_numpy(images)).last_hidden_state[:, 0]
    return out.logits.numpy(), embedding.numpy(), torch.stack(out.hidden_states, dim=1).numpy()


# ------------------------------------------------------------------- check


def test_check_proves_the_entry_and_counts_the_published_params(capsys):
    from linnet.cli import main

    assert main(["check", "vit-base-patch16-224"]) == 0
    out = capsys.readouterr().out
    assert f"params: {VIT_BASE_PARAMS:,} in 200 tensors" in out
    assert ("entry forward<B, H, W>(images: Tensor[B, 3, H, W; f32]) -> Tensor[B, 1000; f32] "
            "where H == 224, W == 224") in out
    assert "entry embed<B, H, W>(images: Tensor[B, 3, H, W; f32]) -> Tensor[B, 768; f32]" in out
    assert "-> Tensor[B, 13, 197, 768; f32] where H == 224, W == 224" in out


def test_check_refuses_an_image_size_the_patches_do_not_divide(capsys):
    from linnet.cli import main

    assert main(["check", "vit-base-patch16-224", "--set", "Image=225"]) == 1
    assert "`Image % Patch == 0`" in capsys.readouterr().err


def test_check_refuses_other_sizes_at_the_check_dims(capsys):
    from linnet.cli import main

    assert main(["check", "vit-base-patch16-224", "--set", "H=384", "--set", "W=384"]) == 1
    err = capsys.readouterr().err
    assert "E0403" in err and "`H == Image` requires 384 == 224" in err


# ------------------------------------------------------------------ parity


@pytest.fixture(scope="module")
def base_reference(transformers_vit_base):
    images = _images(2, 224)
    return images, _reference(transformers_vit_base, images)


@pytest.mark.parametrize("backend", BACKENDS)
def test_full_size_checkpoint_matches_transformers(vit_base, base_reference, backend):
    images, (logits, embedding, _) = base_reference
    model = nest.load("vit-base-patch16-224", backend=backend)
    got = np.asarray(model(images))
    assert got.shape == (2, 1000)
    assert max_diff(got, logits) <= TOLERANCE, (backend, max_diff(got, logits))
    assert max_diff(model.embed(images), embedding) <= TOLERANCE
    # Logits of unit size, so the bound means something: a wrong layer would be off by O(1).
    assert np.abs(logits).max() > 0.5


@pytest.mark.parametrize("backend", BACKENDS)
def test_small_saved_model_matches_transformers_on_every_entry(small_vit, backend):
    images = _images(3, 32, seed=1)
    logits, embedding, hidden = _reference(small_vit.model, images)
    model = nest.load(small_vit.entry, backend=backend)
    assert max_diff(model(images), logits) <= TOLERANCE
    assert max_diff(model.embed(images), embedding) <= TOLERANCE
    states = np.asarray(model.hidden_states(images))
    assert states.shape == (3, 3, 17, 64)  # Layers + 1 states of 16 patches + the class token
    assert max_diff(states, hidden) <= TOLERANCE


def test_bindings_name_the_checkpoint_keys(vit_base):
    model = nest.load("vit-base-patch16-224", backend="torch")
    report = model.info.report
    bound = {param: tensor.key for param, tensor in report.bound.items()}
    assert report.unused_keys == [] and report.aliases == []
    assert bound["vit.embeddings.patch_embeddings.weight"] == "vit.embeddings.patch_embeddings.projection.weight"
    assert bound["vit.layers.11.attention.query.bias"] == "vit.encoder.layer.11.attention.attention.query.bias"
    assert bound["vit.layers.0.attention.out.weight"] == "vit.encoder.layer.0.attention.output.dense.weight"
    assert bound["vit.layers.3.up.weight"] == "vit.encoder.layer.3.intermediate.dense.weight"
    assert bound["vit.layers.3.down.weight"] == "vit.encoder.layer.3.output.dense.weight"
    assert bound["vit.layers.5.layernorm_after.bias"] == "vit.encoder.layer.5.layernorm_after.bias"
    assert set(bound.values()) == set(vit_base.shapes)  # every checkpoint tensor, each once


# --------------------------------------------------------------- bad input


@pytest.fixture(scope="module")
def small_models(small_vit):
    return {backend: nest.load(small_vit.entry, backend=backend) for backend in BACKENDS}


def _nan_image():
    images = _images(1, 32)
    images[0, 1, 5, 7] = np.nan
    return images


BAD_IMAGES = {
    "four channels": (lambda: _images(1, 32)[:, [0, 1, 2, 0]], "E0701", "`images` axis 1 must be 3"),
    "33x33": (lambda: np.zeros((1, 3, 33, 33), np.float32), "E0702", "requires H == 32, but H = 33"),
    "uint8 pixels": (lambda: np.zeros((1, 3, 32, 32), np.uint8), "E0701", "must hold floats"),
    "a NaN": (_nan_image, "E0701", r"holds nan at \[0, 1, 5, 7\]"),
}


@pytest.mark.parametrize("case", sorted(BAD_IMAGES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_images_are_refused_by_name_before_compute(small_models, monkeypatch, backend, case):
    make, code, message = BAD_IMAGES[case]
    model = small_models[backend]

    def never(*args, **kwargs):
        raise AssertionError("the backend ran")

    monkeypatch.setattr(model.runtime, "run", never)
    with pytest.raises(LinnetError, match=message) as caught:
        model(make())
    assert caught.value.diagnostics[0].code == code


def test_full_size_refuses_225(vit_base):
    model = nest.load("vit-base-patch16-224", backend="onnx")
    with pytest.raises(LinnetError, match="requires H == 224, but H = 225") as caught:
        model(np.zeros((1, 3, 225, 225), np.float32))
    assert caught.value.diagnostics[0].code == "E0702"
