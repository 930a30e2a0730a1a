"""int8 against f32 on the onnx backend: encode throughput in one interleaved run, and cosine to f32.

    python -m bench.int8_speed [--texts 300] [--rounds 5] [--weights FOLDER]

Both models are loaded first, warmed on the texts, then timed alternately (f32, int8, f32, ...)
so that load from other processes on a shared machine falls on both alike; each method's
median round is reported.  Texts: `bench.corpus` (stdlib docstring paragraphs, seeded).
"""
from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np

from bench.corpus import corpus, describe
from linnet import nest
from linnet.backends.measured import cpu_model
from linnet.backends.onnx_int8 import cosines


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--texts", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--weights", default=None, help="the all-MiniLM-L6-v2 folder (default: the zoo's)")
    args = parser.parse_args(argv)
    texts = corpus(args.texts)
    models = {p: nest.load("all-minilm-l6-v2", backend="onnx", weights=args.weights, precision=p)
              for p in ("f32", "int8")}
    out = {p: m.encode(texts, batch_size=args.batch_size, show_progress_bar=False) for p, m in models.items()}
    cos = cosines(out["int8"], out["f32"])
    times: dict[str, list[float]] = {p: [] for p in models}
    for _ in range(args.rounds):
        for p, m in models.items():
            started = time.perf_counter()
            m.encode(texts, batch_size=args.batch_size, show_progress_bar=False)
            times[p].append(time.perf_counter() - started)
    rate = {p: len(texts) / float(np.median(t)) for p, t in times.items()}
    result = {"cpu": cpu_model(), "python": platform.python_version(), "texts": describe(texts),
              "texts_per_s": {p: round(r, 1) for p, r in rate.items()},
              "int8_speedup": round(rate["int8"] / rate["f32"], 2),
              "rounds_s": {p: [round(x, 3) for x in t] for p, t in times.items()},
              "int8_cosine_to_f32": {"mean": float(cos.mean()), "min": float(cos.min())},
              "plan": {k: v for k, v in models["int8"].info.precision.items() if k != "tried"}}
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
