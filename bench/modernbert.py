"""`python -m bench.modernbert`: ModernBERT-base (full-size synthetic) latency and peak RSS, Linnet
against transformers, at B=1 and S = 128 and 2048.

The checkpoint is transformers' own random init at answerdotai/ModernBERT-base's config, written
by `save_pretrained` (`--folder`, default ~/.cache/linnet/bench/hf/modernbert-base-synthetic): speed
and memory are representative, the outputs mean nothing.  Each (method, S) is one child process:
load, one untimed call, then `--iters` timed calls of `forward` (the last hidden state, B=1, no
padding); it reports the median seconds, the RSS after load and the peak RSS (VmHWM: a child's
`ru_maxrss` includes its parent's RSS at fork, which Linux carries across exec).
Rounds interleave the methods (order reversed every other round).  Methods: transformers'
`ModernBertModel` with eager and with SDPA attention, Linnet's torch and onnx backends (their
default options).  transformers -> torch.onnx -> ONNX Runtime is not measured.

    python -m bench.modernbert                    # 1 round, 3 timed calls each
    python -m bench.modernbert --rounds 2 --iters 5
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
method, folder, length, iters = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
import numpy as np
import torch

def status_mib(field):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith(field + ":")) / 1024

def rss_mib():
    return status_mib("VmRSS")

ids = np.random.default_rng(length).integers(3, 50000, size=(1, length))
mask = np.ones((1, length), np.int64)
if method.startswith("transformers"):
    from transformers import ModernBertModel
    model = ModernBertModel.from_pretrained(folder, attn_implementation=method.split("-")[1]).eval()
    def call():
        with torch.inference_mode():
            return model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).last_hidden_state.numpy()
else:
    from linnet import nest
    model = nest.load(folder, backend=method.split("-")[1])
    def call():
        return np.asarray(model.forward(ids.astype(np.int32), mask.astype(np.int32)))
loaded = rss_mib()
out = call()
times = []
for _ in range(iters):
    start = time.perf_counter()
    call()
    times.append(time.perf_counter() - start)
print(json.dumps({"median_s": sorted(times)[len(times) // 2], "times_s": times, "rss_after_load_mib": loaded,
                  "peak_rss_mib": status_mib("VmHWM"),  # ru_maxrss would include the parent's RSS at fork
                  "row0": [float(v) for v in out[0, 0, :4]], "last": [float(v) for v in out[0, -1, :4]]}))
"""

METHODS = ("transformers-eager", "transformers-sdpa", "linnet-torch", "linnet-onnx")
LENGTHS = (128, 2048)
DEFAULT_FOLDER = Path(os.environ.get("LINNET_BENCH_CACHE", Path.home() / ".cache/linnet/bench")) / "hf" / \
    "modernbert-base-synthetic"


def synthetic(folder: Path) -> Path:
    """transformers' random init at ModernBERT-base's config, saved once."""
    if not (folder / "model.safetensors").is_file():
        import torch
        from transformers import ModernBertConfig, ModernBertForMaskedLM

        torch.manual_seed(0)
        ModernBertForMaskedLM(ModernBertConfig(pad_token_id=0)).save_pretrained(folder)
    return folder


def _child(method: str, folder: Path, length: int, iters: int) -> dict:
    run = subprocess.run([sys.executable, "-c", CHILD, method, str(folder), str(length), str(iters)],
                         capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"{method} S={length} failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.modernbert", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--folder", type=Path, default=DEFAULT_FOLDER)
    parser.add_argument("--out", type=Path, default=Path("nest/modernbert-base/long-inputs-bench.json"))
    args = parser.parse_args(argv)

    from bench.contention import ContentionMeter
    from bench.workload import environment, load_average

    folder = synthetic(args.folder)
    env = environment("cpu")
    runs: dict[tuple[str, int], list[dict]] = {(m, s): [] for m in METHODS for s in LENGTHS}
    meter = ContentionMeter()
    for r in range(args.rounds):
        for length in LENGTHS:
            for method in METHODS if r % 2 == 0 else reversed(METHODS):
                result = _child(method, folder, length, args.iters)
                runs[method, length].append(result)
                print(f"round {r + 1} S={length} {method}: {result['median_s']:.3f} s, peak "
                      f"{result['peak_rss_mib']:.0f} MiB", flush=True)
    contention = meter.stop()
    table: dict[str, dict] = {}
    for length in LENGTHS:
        reference = runs["transformers-sdpa", length][0]
        for method in METHODS:
            median = statistics.median(run["median_s"] for run in runs[method, length])
            first = runs[method, length][0]
            table[f"{method} S={length}"] = {
                "median_s": round(median, 4),
                "x_transformers_sdpa": round(median / statistics.median(
                    run["median_s"] for run in runs["transformers-sdpa", length]), 3),
                "rss_after_load_mib": round(first["rss_after_load_mib"]),
                "peak_rss_mib": round(max(run["peak_rss_mib"] for run in runs[method, length])),
                "max_abs_diff_row0_last_to_sdpa": max(abs(a - b) for key in ("row0", "last")
                                                      for a, b in zip(first[key], reference[key])),
            }
    result = {"what": "ModernBERT-base full-size synthetic (transformers' random init), forward, B=1, no padding: "
                      "median seconds per call of --iters timed calls after one untimed call, and peak RSS, each "
                      "(method, S) its own process",
              "rounds": args.rounds, "iters": args.iters, "environment": env,
              "load_average_at_end": load_average(),
              "other_processes_cpu_share": None if contention is None else round(contention.others_share, 2),
              "methods": table}
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
