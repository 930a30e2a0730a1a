"""The image-classification bench: ViT on Linnet's backends against transformers.

    python -m bench.vision [--model vit-base-patch16-224] [--repeats 20] [--methods KEY,...]

The text bench (`bench.cli`) drives token batches; an image model takes `[B, 3, H, W]` f32
pixels instead, so its methods live here, each a small class with the phases of
`bench.methods.Method` that matter for one image workload: `load()`, `run(images)`.
Two measurements per method, as the issue asks:

* latency: B=1, the median of `repeats` timed calls after one warm-up;
* throughput: B=8, images per second over `repeats` calls;

and `max_abs_diff` of the logits against the reference (transformers' eager
ViTForImageClassification from the same files).  Results print as one JSON object.
Targets: the best Linnet backend <= 0.85 x transformers -> torch.onnx -> ORT at B=1,
Linnet torch <= 1.15 x it (see docs/bench.md); `onnx-reference` is that export.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

LATENCY_BATCH, THROUGHPUT_BATCH = 1, 8


class VisionMethod:
    key = ""

    def __init__(self, model: str, size: int):
        self.model_name, self.size = model, size

    def load(self) -> None:
        raise NotImplementedError

    def run(self, images: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class TransformersVit(VisionMethod):
    key = "transformers-eager"

    def load(self) -> None:
        import torch
        from transformers import ViTForImageClassification

        from linnet.nest.manifest import load_manifest

        weights = load_manifest(self.model_name).weights
        self.model = ViTForImageClassification.from_pretrained(weights.repo, revision=weights.revision,
                                                               dtype=torch.float32).eval()

    def run(self, images):
        import torch

        with torch.inference_mode():
            return self.model(pixel_values=torch.from_numpy(images)).logits.numpy()


class OnnxReference(TransformersVit):
    """transformers' model through torch.onnx.export, run by ONNX Runtime: the issue's yardstick."""

    key = "onnx-reference"

    def load(self) -> None:
        import onnxruntime
        import torch

        super().load()
        path = Path(tempfile.mkdtemp(prefix="vit-onnx-")) / "model.onnx"
        example = torch.zeros(1, 3, self.size, self.size)
        torch.onnx.export(self.model, (example,), str(path), input_names=["pixel_values"], output_names=["logits"],
                          dynamic_axes={"pixel_values": {0: "B"}, "logits": {0: "B"}}, dynamo=False)
        self.session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def run(self, images):
        return self.session.run(None, {"pixel_values": images})[0]


class LinnetVit(VisionMethod):
    backend = ""

    def load(self) -> None:
        from linnet import nest

        self.model = nest.load(self.model_name, backend=self.backend)

    def run(self, images):
        return np.asarray(self.model(images))


class LinnetTorch(LinnetVit):
    key, backend = "linnet-torch", "torch"


class LinnetOnnx(LinnetVit):
    key, backend = "linnet-onnx", "onnx"


class LinnetJax(LinnetVit):
    key, backend = "linnet-jax", "jax"


ALL = [TransformersVit, OnnxReference, LinnetTorch, LinnetOnnx, LinnetJax]
BY_KEY = {m.key: m for m in ALL}
REFERENCE = TransformersVit.key


def _images(batch: int, size: int) -> np.ndarray:
    return np.random.default_rng(batch).uniform(-1, 1, size=(batch, 3, size, size)).astype(np.float32)


def measure(method: VisionMethod, repeats: int) -> dict:
    started = time.perf_counter()
    method.load()
    result = {"load_s": time.perf_counter() - started}
    one, eight = _images(LATENCY_BATCH, method.size), _images(THROUGHPUT_BATCH, method.size)
    method.run(one)  # warm-up: first-call compilation and allocation are not latency
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        method.run(one)
        times.append(time.perf_counter() - t)
    result["latency_b1_ms"] = 1e3 * statistics.median(times)
    method.run(eight)
    t = time.perf_counter()
    for _ in range(repeats):
        method.run(eight)
    result["throughput_b8_images_per_s"] = THROUGHPUT_BATCH * repeats / (time.perf_counter() - t)
    result["logits"] = method.run(one)
    return result


def run(model: str, keys: list[str], repeats: int) -> dict:
    from linnet.nest.manifest import load_manifest

    size = int(load_manifest(model).generics["Image"])
    results = {}
    for key in keys:
        try:
            results[key] = measure(BY_KEY[key](model, size), repeats)
        except Exception as exc:  # one method failing must not take the others with it
            results[key] = {"error": f"{type(exc).__name__}: {exc}"}
    reference = results.get(REFERENCE, {}).get("logits")
    for key, result in results.items():
        logits = result.pop("logits", None)
        if reference is not None and logits is not None:
            result["max_abs_diff"] = float(np.abs(np.asarray(logits, np.float64) - reference).max())
    onnx_ms = results.get(OnnxReference.key, {}).get("latency_b1_ms")
    if onnx_ms:
        for result in results.values():
            if "latency_b1_ms" in result:
                result["latency_vs_onnx_reference"] = result["latency_b1_ms"] / onnx_ms
    return {"model": model, "image_size": size, "repeats": repeats, "methods": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.vision", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="vit-base-patch16-224", help="an image zoo entry (name or folder)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--methods", default=",".join(BY_KEY), help="comma-separated keys: " + ", ".join(BY_KEY))
    args = parser.parse_args(argv)
    keys = [k for k in args.methods.split(",") if k]
    unknown = [k for k in keys if k not in BY_KEY]
    if unknown:
        parser.error(f"unknown methods {unknown}; known: {', '.join(BY_KEY)}")
    print(json.dumps(run(args.model, keys, args.repeats), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
