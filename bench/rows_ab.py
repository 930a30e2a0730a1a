"""An interleaved A/B of the dead-row pass (linnet/middle/rows.py) on ViT's `forward`.

    python -m bench.rows_ab [--rounds 12] [--repeats 5] [--backends onnx,torch] [--batch 1]
                            [--torch-threads N] [--clock wall|cpu]

The same full-size synthetic vit-base-patch16-224 checkpoint (bench/vision.py writes it once)
loaded twice per backend, the pass on and off, timed in alternating order round after round
(the fastest of a few calls each time), so load on a shared machine falls on both alike.  It prints the per-round ratio on/off (median
and spread), the logits' max |on - off|, and the machine's load average before and after.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np


def _load(backend: str, folder, dead_rows: bool):
    from linnet import nest

    from dataclasses import replace

    from linnet.backends import RECORDS

    saved = RECORDS[backend]
    if not dead_rows:
        RECORDS[backend] = replace(saved, passes=tuple(p for p in saved.passes if p != "dead_rows"))
    try:
        return nest.load("vit-base-patch16-224", backend=backend, weights=folder)
    finally:
        RECORDS[backend] = saved


#: The clock `_seconds` reads: wall time, or this process's CPU time (`--clock cpu`, for one
#: torch thread on a loaded machine: the work done, not the neighbours' share of the cores).
CLOCK = time.perf_counter


def _seconds(model, images, repeats: int) -> float:
    """The fastest of `repeats` calls: on a loaded machine the slower ones measure the neighbours."""
    times = []
    for _ in range(repeats):
        started = CLOCK()
        np.asarray(model(images))
        times.append(CLOCK() - started)
    return min(times)


def measure(backend: str, folder, images, rounds: int, repeats: int) -> dict:
    on, off = _load(backend, folder, True), _load(backend, folder, False)
    assert "_rows" in on.program.entries["forward"].function and "_rows" not in off.program.entries["forward"].function
    diff = float(np.abs(np.asarray(on(images)) - np.asarray(off(images))).max())
    for model in (on, off):  # warm: first calls compile, allocate, pick kernels
        _seconds(model, images, 3)
    ratios, times_on, times_off = [], [], []
    for r in range(rounds):
        pair = [("on", on), ("off", off)] if r % 2 == 0 else [("off", off), ("on", on)]
        got = {tag: _seconds(model, images, repeats) for tag, model in pair}
        ratios.append(got["on"] / got["off"])
        times_on.append(got["on"])
        times_off.append(got["off"])
    return {"backend": backend, "max_abs_diff": diff, "ratio_median": statistics.median(ratios),
            "ratio_min": min(ratios), "ratio_max": max(ratios), "ms_on": 1e3 * statistics.median(times_on),
            "ms_off": 1e3 * statistics.median(times_off), "rounds": rounds, "repeats": repeats}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--backends", default="onnx,torch")
    parser.add_argument("--torch-threads", type=int, default=0, help="torch.set_num_threads (0: leave it)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = parser.parse_args(argv)
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)
    from bench.vision import _images, weights_folder

    folder, what = weights_folder("vit-base-patch16-224")
    images = _images(args.batch, 224)
    print(f"weights: {what}; clock: {args.clock}; load before: {os.getloadavg()}")
    for backend in args.backends.split(","):
        print(json.dumps(measure(backend, folder, images, args.rounds, args.repeats)), flush=True)
    print(f"load after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
