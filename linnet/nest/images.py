"""Pictures to model inputs, and logits to label names, for image models (`[image]` in nest.toml).

An image model's repository says how it expects its pixels in `preprocessor_config.json`
(transformers' image processor settings) and what each logit means in `config.json`'s
`id2label`.  `ImagePreprocessor` reads the first and does what transformers'
`ViTImageProcessor` does with it, with Pillow and numpy and in the same order and dtypes,
so the arrays are the same to the last bit:

1. each image to RGB as a Pillow image (a path is opened, a uint8 array wrapped);
2. resize to `size` with the configured `resample` filter, on the uint8 image (Pillow);
3. rescale: `uint8 -> float64 * rescale_factor -> float32` (1/255 by default);
4. normalise per channel in float32: `(x - mean) / std`;

and stacks the results as `[N, 3, H, W]` f32, what the entries take.  `labels_from_config`
reads `id2label` into a tuple indexed by logit.  Settings this module does not implement
(`do_center_crop`, padding, `shortest_edge` resizing) are refused rather than ignored.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import codes
from ..diagnostics import Diagnostic, LinnetError, Note
from .manifest import Manifest

CODES = codes.summaries("images")

#: Pillow's filter numbers, as transformers' `PILImageResampling` and the config files write them.
_RESAMPLE = {0: "NEAREST", 1: "LANCZOS", 2: "BILINEAR", 3: "BICUBIC", 4: "BOX", 5: "HAMMING"}
#: Settings the processor may carry that change nothing here, or that this module implements.
_UNDERSTOOD = {"do_resize", "size", "resample", "do_rescale", "rescale_factor", "do_normalize", "image_mean",
               "image_std", "do_convert_rgb", "feature_extractor_type", "image_processor_type", "processor_class",
               "crop_size", "do_center_crop", "do_pad", "pad_size", "input_data_format", "data_format",
               "return_tensors", "device", "disable_grouping", "default_to_square"}


def _error(code: codes.ErrorCode, message: str, *notes: str) -> LinnetError:
    return LinnetError(Diagnostic(code, message, None, tuple(Note(n) for n in notes)))


def _read_json_object(path: Path, what: str) -> dict:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise _error(codes.BAD_IMAGE_CONFIG, f"{what} {path} cannot be read as JSON: {exc}") from None
    if not isinstance(data, dict):
        raise _error(codes.BAD_IMAGE_CONFIG, f"{what} {path} is not a JSON object")
    return data


@dataclass(frozen=True)
class ImagePreprocessor:
    """What a `preprocessor_config.json` asks for, checked once when it is read."""

    height: int
    width: int
    resample: int  # Pillow's filter number
    do_resize: bool = True
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)

    @classmethod
    def from_file(cls, path: Path) -> "ImagePreprocessor":
        return cls.from_config(_read_json_object(path, "the preprocessor config"), str(path))

    @classmethod
    def from_config(cls, config: dict, where: str = "preprocessor_config.json") -> "ImagePreprocessor":
        def fail(message: str):
            raise _error(codes.BAD_IMAGE_CONFIG, f"{where}: {message}")

        for flag in ("do_center_crop", "do_pad"):
            if config.get(flag):
                fail(f"`{flag}` is set, which linnet's preprocessing does not implement")
        unknown = sorted(set(config) - _UNDERSTOOD)
        if unknown:
            fail(f"settings {unknown} are not understood, so the images would not be what the model expects")
        height, width = cls._size(config.get("size", {"height": 224, "width": 224}), fail)
        resample = config.get("resample", 2)
        if not isinstance(resample, int) or isinstance(resample, bool) or resample not in _RESAMPLE:
            fail(f"`resample` must be one of Pillow's filters {sorted(_RESAMPLE)}, found {resample!r}")
        factor = config.get("rescale_factor", 1 / 255)
        if not isinstance(factor, (int, float)) or isinstance(factor, bool):
            fail(f"`rescale_factor` must be a number, found {factor!r}")
        mean, std = (cls._triple(config.get(key, 0.5), key, fail) for key in ("image_mean", "image_std"))
        if 0.0 in std:
            fail("`image_std` holds a 0, which would divide by zero")
        flags = {}
        for key in ("do_resize", "do_rescale", "do_normalize"):
            value = config.get(key, True)
            if not isinstance(value, bool):
                fail(f"`{key}` must be true or false, found {value!r}")
            flags[key] = value
        return cls(height, width, resample, rescale_factor=float(factor), mean=mean, std=std, **flags)

    @staticmethod
    def _size(size, fail) -> tuple[int, int]:
        # The legacy spelling is one int for a square; today's is {"height": h, "width": w}.
        if isinstance(size, int) and not isinstance(size, bool) and size > 0:
            return size, size
        if isinstance(size, dict) and set(size) == {"height", "width"}:
            h, w = size["height"], size["width"]
            if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (h, w)):
                return h, w
        fail(f"`size` must be a positive int or {{\"height\": h, \"width\": w}}, found {size!r}")

    @staticmethod
    def _triple(value, key: str, fail) -> tuple[float, ...]:
        values = [value] * 3 if isinstance(value, (int, float)) and not isinstance(value, bool) else value
        if (not isinstance(values, list | tuple) or len(values) != 3
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)):
            fail(f"`{key}` must be a number or three numbers (R, G, B), found {value!r}")
        return tuple(float(v) for v in values)

    # ------------------------------------------------------------------- images

    def __call__(self, images) -> np.ndarray:
        """`[N, 3, H, W]` float32 from one image or a list of them (paths, PIL images, uint8 arrays)."""
        batch = list(images) if isinstance(images, (list, tuple)) else [images]
        if not batch:
            raise _error(codes.BAD_IMAGE_INPUT, "`preprocess` was given an empty list of images")
        return np.stack([self.one(image, i) for i, image in enumerate(batch)])

    def one(self, image, index: int = 0) -> np.ndarray:
        """`[3, H, W]` float32 for one image."""
        from PIL import Image

        picture = _as_rgb(image, index)
        if self.do_resize:
            picture = picture.resize((self.width, self.height), resample=Image.Resampling(self.resample))
        pixels = np.asarray(picture)  # [H, W, 3] uint8
        if self.do_rescale:
            values = (pixels.astype(np.float64) * self.rescale_factor).astype(np.float32)
        else:
            values = pixels.astype(np.float32)
        if self.do_normalize:
            values = (values - np.array(self.mean, np.float32)) / np.array(self.std, np.float32)
        return np.ascontiguousarray(values.transpose(2, 0, 1))


def _as_rgb(image, index: int):
    """A Pillow RGB image from a path, a Pillow image, or a uint8 array laid out as images are."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(image, (str, Path)):
        try:
            with Image.open(image) as opened:
                opened.load()
                return opened.convert("RGB")
        except (OSError, UnidentifiedImageError, ValueError) as exc:
            raise _error(codes.BAD_IMAGE_INPUT, f"image {index} ({image}) cannot be read by Pillow: {exc}") from None
    if isinstance(image, Image.Image):
        return image.convert("RGB")
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8:
            raise _error(codes.BAD_IMAGE_INPUT, f"image {index} is an array of {image.dtype}; `preprocess` takes "
                                                f"uint8 pixels (0..255) as image files hold them",
                         "an array already preprocessed goes straight to the model: `model(images)`")
        if image.ndim == 2 or (image.ndim == 3 and image.shape[-1] in (3, 4)):
            mode = {2: "L"}.get(image.ndim) or ("RGB" if image.shape[-1] == 3 else "RGBA")
            return Image.fromarray(np.ascontiguousarray(image), mode=mode).convert("RGB")
        raise _error(codes.BAD_IMAGE_INPUT, f"image {index} has shape {tuple(image.shape)}; an array image is "
                                            f"[H, W] (grey), [H, W, 3] (RGB) or [H, W, 4] (RGBA), channels last")
    raise _error(codes.BAD_IMAGE_INPUT, f"image {index} is a {type(image).__name__}; `preprocess` takes paths, "
                                        f"PIL images or uint8 arrays")


def labels_from_config(path: Path) -> tuple[str, ...]:
    """config.json's `id2label` as a tuple: the name of logit i at index i."""
    config = _read_json_object(path, "the model config")
    table = config.get("id2label")
    if not isinstance(table, dict) or not table:
        raise _error(codes.BAD_IMAGE_CONFIG, f"{path} has no `id2label` table naming the classes")
    try:
        by_index = {int(k): v for k, v in table.items()}
    except ValueError:
        raise _error(codes.BAD_IMAGE_CONFIG, f"{path}: `id2label` keys must be logit indices") from None
    if sorted(by_index) != list(range(len(by_index))) or not all(isinstance(v, str) for v in by_index.values()):
        raise _error(codes.BAD_IMAGE_CONFIG, f"{path}: `id2label` must name every index 0..{len(by_index) - 1} "
                                             f"once, with a string")
    return tuple(by_index[i] for i in range(len(by_index)))


# ---------------------------------------------------------------- from an entry


def _fetch(manifest: Manifest, name: str, beside: Path | None) -> Path:
    from .hub import fetch_file

    local = beside / name if beside is not None else None
    if local is not None and local.is_file():
        return local
    weights = manifest.weights
    if weights is None:
        raise _error(codes.NO_IMAGE_PREPROCESSOR, f"zoo entry {manifest.name!r} declares [image] but no [weights] "
                                                  f"repo to fetch {name} from")
    return fetch_file(weights.repo, name, weights.revision, what="image config file",
                      instead="pass `weights=` a folder holding the checkpoint and this file")


def _spec(manifest: Manifest):
    if manifest.image is None:
        raise _error(codes.NO_IMAGE_PREPROCESSOR, f"zoo entry {manifest.name!r} declares no [image], so it has no "
                                                  f"image preprocessing or labels",
                     f'add `[image] preprocessor = "preprocessor_config.json"` to {manifest.dir / "nest.toml"}')
    return manifest.image


def preprocessor_for_entry(manifest: Manifest, beside: Path | None = None) -> ImagePreprocessor:
    """The entry's preprocessing, from `[image].preprocessor` at the pinned revision (or the
    folder the checkpoint was read from, `beside`, when the file is there)."""
    return ImagePreprocessor.from_file(_fetch(manifest, _spec(manifest).preprocessor, beside))


def labels_for_entry(manifest: Manifest, beside: Path | None = None) -> tuple[str, ...]:
    spec = _spec(manifest)
    if spec.labels is None:
        raise _error(codes.NO_IMAGE_PREPROCESSOR, f"zoo entry {manifest.name!r} names no [image].labels file")
    return labels_from_config(_fetch(manifest, spec.labels, beside))
