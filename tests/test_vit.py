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

from pathlib import Path

import numpy as np
import pytest

from fixtures.parity import max_diff
from fixtures.vit_checkpoints import VIT_BASE_PARAMS, write_small_vit_repo, write_synthetic_vit_base
from linnet import nest
from linnet.diagnostics import LinnetError

BACKENDS = ["torch", "jax", "stablehlo", "onnx", "openvino"]
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


# ---------------------------------------------------------- preprocessing


def _grace_hopper() -> Path:
    import matplotlib

    photo = Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"
    assert photo.is_file(), f"matplotlib's sample photo {photo} is missing"
    return photo


def _made_images(tmp_path) -> dict:
    """Pictures of odd sizes: random noise, smooth gradients, a PNG file, an RGBA PIL image."""
    from PIL import Image

    rng = np.random.default_rng(7)
    noise = rng.integers(0, 256, size=(41, 57, 3), dtype=np.uint8)
    y, x = np.mgrid[0:300, 0:211]
    gradient = np.stack([x * 255 // 210, y * 255 // 299, (x + y) % 256], axis=-1).astype(np.uint8)
    png = tmp_path / "gradient.png"
    Image.fromarray(gradient).save(png)
    rgba = Image.fromarray(np.concatenate([noise, np.full((41, 57, 1), 200, np.uint8)], axis=-1), mode="RGBA")
    return {"noise": noise, "gradient": gradient, "png": png, "rgba": rgba}


def _transformers_pixels(processor, image) -> np.ndarray:
    from PIL import Image

    if isinstance(image, Path):
        image = Image.open(image)
    if isinstance(image, Image.Image):
        image = image.convert("RGB")  # transformers keeps an alpha channel; both drop it here
    return processor(images=image, return_tensors="np")["pixel_values"]


def test_preprocess_equals_vit_image_processor_on_made_images(small_vit, tmp_path):
    from transformers import ViTImageProcessor

    model = nest.load(small_vit.entry, backend="torch")
    processor = ViTImageProcessor.from_pretrained(str(small_vit.snapshot))
    for name, image in _made_images(tmp_path).items():
        got = model.preprocess(image)
        expected = _transformers_pixels(processor, image)
        assert got.shape == expected.shape == (1, 3, 32, 32) and got.dtype == np.float32, name
        assert max_diff(got, expected) <= 1e-6, name


def test_preprocess_of_a_photo_equals_the_checkpoints_processor(vit_base):
    from transformers import ViTImageProcessor

    model = nest.load("vit-base-patch16-224", backend="onnx")
    processor = ViTImageProcessor.from_pretrained(vit_base.repo, revision=vit_base.revision)
    got = model.preprocess([_grace_hopper(), str(_grace_hopper())])
    expected = _transformers_pixels(processor, _grace_hopper())
    assert got.shape == (2, 3, 224, 224)
    assert max_diff(got[0], expected[0]) <= 1e-6 and max_diff(got[1], expected[0]) <= 1e-6
    assert -1.0 <= got.min() < -0.5 and 0.5 < got.max() <= 1.0  # mean = std = 0.5 maps [0, 1] to [-1, 1]
    assert model(got).shape == (2, 1000)


@pytest.mark.parametrize("resample", [0, 3, 1])
def test_preprocess_follows_the_configured_filter(tmp_path, resample):
    from transformers import ViTImageProcessor

    from linnet.nest.images import ImagePreprocessor

    config = {"size": {"height": 24, "width": 40}, "resample": resample, "image_mean": [0.4, 0.5, 0.6],
              "image_std": [0.2, 0.3, 0.25], "do_resize": True}
    ours = ImagePreprocessor.from_config(config)
    theirs = ViTImageProcessor(**config)
    image = _made_images(tmp_path)["gradient"]
    assert max_diff(ours(image), _transformers_pixels(theirs, image)) <= 1e-6


def test_labels_come_from_id2label(vit_base, small_vit):
    assert nest.load(small_vit.entry, backend="torch").labels == ("tabby", "teapot", "lighthouse")
    labels = nest.load("vit-base-patch16-224", backend="onnx").labels
    assert len(labels) == 1000 and labels[999] == "synthetic class 999"


@pytest.mark.parametrize("image,message", [
    (np.zeros((32, 32, 3), np.float32), "is an array of float32; `preprocess` takes uint8"),
    (np.zeros((3, 32, 32), np.uint8), r"has shape \(3, 32, 32\); an array image is \[H, W\]"),
    ("no/such/picture.png", "cannot be read by Pillow"),
    (42, "is a int; `preprocess` takes paths"),
    ([], "empty list"),
])
def test_preprocess_refuses_what_is_not_an_image(small_vit, image, message):
    model = nest.load(small_vit.entry, backend="torch")
    with pytest.raises(LinnetError, match=message) as caught:
        model.preprocess(image)
    assert caught.value.diagnostics[0].code == "E1403"


@pytest.mark.parametrize("config,message", [
    ({"do_center_crop": True, "size": 8}, "`do_center_crop` is set"),
    ({"resample": 9}, "`resample` must be one of Pillow's filters"),
    ({"size": {"shortest_edge": 224}}, "`size` must be a positive int"),
    ({"image_std": [0.5, 0.0, 0.5]}, "divide by zero"),
    ({"do_reduce_labels": True}, r"settings \['do_reduce_labels'\] are not understood"),
])
def test_preprocessor_settings_it_cannot_follow_are_refused(config, message):
    from linnet.nest.images import ImagePreprocessor

    with pytest.raises(LinnetError, match=message) as caught:
        ImagePreprocessor.from_config(config)
    assert caught.value.diagnostics[0].code == "E1402"


def test_an_entry_without_image_table_says_so():
    from linnet.nest.images import preprocessor_for_entry
    from linnet.nest.manifest import load_manifest

    with pytest.raises(LinnetError, match="declares no \\[image\\]") as caught:
        preprocessor_for_entry(load_manifest("bert-base-uncased"))
    assert caught.value.diagnostics[0].code == "E1401"


# ------------------------------------------------------- commands and serving


def test_linnet_run_prints_the_top_five_labels_of_an_image(small_vit, tmp_path, capsys):
    from PIL import Image

    from linnet.cli import main

    picture = tmp_path / "image.png"
    Image.fromarray(_made_images(tmp_path)["gradient"]).save(picture)
    assert main(["run", str(small_vit.entry), str(picture), str(_grace_hopper())]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "vit-small (torch), classify-image:" and lines[1] == f"{picture}:"
    model = nest.load(small_vit.entry, backend="torch")
    logits = np.asarray(model(model.preprocess([picture, _grace_hopper()])), np.float64)
    probabilities = np.exp(logits - logits.max(1, keepdims=True))
    probabilities /= probabilities.sum(1, keepdims=True)
    for row, block in enumerate((lines[2:5], lines[6:9])):  # 3 labels, fewer than the top 5
        order = np.argsort(-probabilities[row])
        assert block == [f"  {probabilities[row, i]:6.3f}  {model.labels[i]}" for i in order]


def test_export_triton_declares_the_image_input_fp32_3_224_224(vit_base, tmp_path):
    from linnet.cli import main

    assert main(["export-triton", "vit-base-patch16-224", "-o", str(tmp_path)]) == 0
    config = (tmp_path / "vit-base-patch16-224" / "config.pbtxt").read_text()
    assert 'name: "images"\n    data_type: TYPE_FP32\n    dims: [ 3, 224, 224 ]' in config
    assert 'name: "logits"\n    data_type: TYPE_FP32\n    dims: [ 1000 ]' in config
    assert 'name: "hidden_states"\n    data_type: TYPE_FP32\n    dims: [ 13, 197, 768 ]' in config


def test_vision_bench_smoke(small_vit):
    """One call per phase on the small model: every method loads, runs, and agrees with the reference."""
    from bench import vision

    report = vision.run(str(small_vit.entry), list(vision.BY_KEY), repeats=1, rounds=1)
    for key, result in report["methods"].items():
        assert "error" not in result, (key, result.get("error"))
        assert result["latency_b1_ms"] > 0 and result["throughput_b8_images_per_s"] > 0
        assert result["max_abs_diff"] <= TOLERANCE, key
