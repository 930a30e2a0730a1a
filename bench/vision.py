"""The image-classification bench: ViT on Linnet's backends against transformers.

    python -m bench.vision [--model vit-base-patch16-224] [--repeats 20] [--methods KEY,...]

The text bench (`bench.cli`) drives token batches; an image model takes `[B, 3, H, W]` f32
pixels instead, so its methods live here, each a small class with the phases of
`bench.methods.Method` that matter for one image workload: `load()`, `run(images)`.
Two measurements per method, as the issue asks:

* latency: B=1, the median of `repeats` timed calls after one warm-up;
* throughput: B=8, images per second over `repeats` calls;

and `max_abs_diff` of the logits against the reference (transformers' eager
ViTForImageClassification from the same files).  Methods are loaded first, then timed in
interleaved rounds (every method once per round, the rounds' medians reported), so a busy
spell of the machine lands on every method alike.  Results print as one JSON object
(`--out` also writes it).

Weights: the zoo entry's pinned checkpoint when the Hugging Face cache holds it, else a
full-size synthetic checkpoint (random weights, the real key names and shapes) written once
into the bench cache by the tests' own fixture (`tests/fixtures/vit_checkpoints.py`); every
method reads the same folder.
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

    def __init__(self, model: str, size: int, folder: Path):
        self.model_name, self.size, self.folder = model, size, folder

    def load(self) -> None:
        raise NotImplementedError

    def run(self, images: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class TransformersVit(VisionMethod):
    key = "transformers-eager"

    def load(self) -> None:
        import torch
        from transformers import ViTForImageClassification

        self.model = ViTForImageClassification.from_pretrained(str(self.folder), dtype=torch.float32).eval()

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
        # Kept on the instance so the export (~330 MiB) lives as long as its session and is
        # removed with it, not left behind in /tmp by every bench run.
        self._export_dir = tempfile.TemporaryDirectory(prefix="vit-onnx-")
        path = Path(self._export_dir.name) / "model.onnx"
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

        self.model = nest.load(self.model_name, backend=self.backend, weights=self.folder)

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


def weights_folder(model: str) -> tuple[Path, str]:
    """The folder every method reads, and a sentence saying what it holds."""
    from huggingface_hub import try_to_load_from_cache

    from linnet.nest.manifest import load_manifest

    w = load_manifest(model).weights
    found = [try_to_load_from_cache(w.repo, f, revision=w.revision) for f in (*w.files, "config.json")]
    if all(isinstance(f, str) for f in found):
        return Path(found[0]).parent, f"real weights, {w.repo}@{w.revision[:8]} from the Hugging Face cache"
    return _synthetic_vit_base(), ("SYNTHETIC full-size checkpoint (random weights, the real key names and "
                                   "shapes; the real one is not cached here): speed is representative, "
                                   "labels are not")


def _synthetic_vit_base() -> Path:
    """Write the synthetic vit-base-patch16-224 checkpoint once into the bench cache."""
    from bench.weights import bench_cache, fixtures

    fixtures()  # puts tests/ on sys.path
    from fixtures.checkpoints import repo_cache_dir
    from fixtures.vit_checkpoints import (
        VIT_REPO,
        VIT_REVISION,
        write_synthetic_vit_base,
    )

    hub = bench_cache() / "hf" / "hub"
    snapshot = repo_cache_dir(hub, VIT_REPO) / "snapshots" / VIT_REVISION
    done = snapshot / ".bench-complete"
    if not done.exists():
        write_synthetic_vit_base(hub)
        done.write_text("ok")
    return snapshot


def _timed(method: VisionMethod, images: np.ndarray, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        method.run(images)
        times.append(time.perf_counter() - t)
    return times


def measure(methods: dict[str, VisionMethod], size: int, repeats: int, rounds: int) -> dict:
    """Load every method, then time them in interleaved rounds."""
    results, loaded = {}, {}
    one, eight = _images(LATENCY_BATCH, size), _images(THROUGHPUT_BATCH, size)
    for key, method in methods.items():
        try:
            started = time.perf_counter()
            method.load()
            results[key] = {"load_s": time.perf_counter() - started}
            method.run(one), method.run(eight)  # warm-up: first-call compilation and allocation
            loaded[key] = method
        except Exception as exc:  # one method failing must not take the others with it
            results[key] = {"error": f"{type(exc).__name__}: {exc}"}
    latency = {key: [] for key in loaded}
    throughput = {key: [] for key in loaded}
    for _ in range(rounds):
        for key, method in loaded.items():
            latency[key].append(statistics.median(_timed(method, one, repeats)))
            throughput[key].append(THROUGHPUT_BATCH * repeats / sum(_timed(method, eight, repeats)))
    for key, method in loaded.items():
        results[key]["latency_b1_ms"] = 1e3 * statistics.median(latency[key])
        results[key]["latency_b1_ms_rounds"] = [round(1e3 * t, 2) for t in latency[key]]
        results[key]["throughput_b8_images_per_s"] = statistics.median(throughput[key])
        results[key]["logits"] = method.run(one)
    return results


def run(model: str, keys: list[str], repeats: int, rounds: int = 3) -> dict:
    import os

    from linnet.backends.measured import cpu_model
    from linnet.nest.manifest import load_manifest

    size = int(load_manifest(model).generics["Image"])
    folder, origin = weights_folder(model)
    results = measure({key: BY_KEY[key](model, size, folder) for key in keys}, size, repeats, rounds)
    reference = results.get(REFERENCE, {}).get("logits")
    for key, result in results.items():
        logits = result.pop("logits", None)
        if reference is not None and logits is not None:
            result["max_abs_diff"] = float(np.abs(np.asarray(logits, np.float64) - reference).max())
    onnx = results.get(OnnxReference.key, {})
    for result in results.values():
        if onnx.get("latency_b1_ms") and "latency_b1_ms" in result:
            result["latency_vs_onnx_reference"] = result["latency_b1_ms"] / onnx["latency_b1_ms"]
            result["throughput_vs_onnx_reference"] = (result["throughput_b8_images_per_s"]
                                                      / onnx["throughput_b8_images_per_s"])
    return {"model": model, "image_size": size, "repeats": repeats, "rounds": rounds, "weights": origin,
            "cpu": cpu_model(), "cores": os.cpu_count(), "methods": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.vision", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="vit-base-patch16-224", help="an image zoo entry (name or folder)")
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per method per round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    parser.add_argument("--methods", default=",".join(BY_KEY), help="comma-separated keys: " + ", ".join(BY_KEY))
    args = parser.parse_args(argv)
    keys = [k for k in args.methods.split(",") if k]
    unknown = [k for k in keys if k not in BY_KEY]
    if unknown:
        parser.error(f"unknown methods {unknown}; known: {', '.join(BY_KEY)}")
    text = json.dumps(run(args.model, keys, args.repeats, args.rounds), indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
