"""`python -m bench.first_result`: time to a first result, Linnet against transformers, one run.

What a user waits for in a new process with warm caches (the checkpoint in the page cache,
Linnet's compiled program, kernel choices and ONNX export already on disk): the imports,
then `from_pretrained` / `nest.load`, then one forward of one 16-token sentence.  Each
measurement is its own child process; rounds interleave the methods (order alternating per
round), and one unmeasured round first warms every cache.  Per method the medians of
import, load and first-forward seconds are written to `--out` with the ratio of load + first
forward (and of all three) to transformers', and the CPU share other processes took.

    python -m bench.first_result                  # bert-base-uncased, 5 rounds
    python -m bench.first_result --rounds 1       # a smoke run
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from linnet.backends.measured import cpu_model

#: One child: imports, load, one forward; prints {"import": s, "load": s, "first": s}.
CHILD = r"""
import json, sys, time
start = time.perf_counter()
method, folder = sys.argv[1], sys.argv[2]
import numpy as np
import torch
ids = np.random.default_rng(0).integers(1000, 2000, size=(1, 16)).astype(np.int64)
if method == "transformers":
    from transformers import BertModel
    imported = time.perf_counter()
    model = BertModel.from_pretrained(folder).eval()
    loaded = time.perf_counter()
    with torch.inference_mode():
        out = model(input_ids=torch.from_numpy(ids)).last_hidden_state.numpy()
else:
    from linnet import nest
    if method == "torch-pack-first":  # every Linear packs at its first call, as before PLAIN_ROWS
        from linnet.backends import torch_kernels
        torch_kernels.PLAIN_ROWS = 0
    imported = time.perf_counter()
    model = nest.load("bert-base-uncased", backend=method.split("-")[0], weights=folder)
    loaded = time.perf_counter()
    out = np.asarray(model.forward(tokens=ids.astype(np.int32), attention_mask=np.ones((1, 16), np.int32)))
done = time.perf_counter()
assert out.shape == (1, 16, 768), out.shape
print(json.dumps({"import": imported - start, "load": loaded - imported, "first": done - loaded,
                  "row0": [float(v) for v in out[0, 0, :4]]}))
"""

METHODS = ("transformers", "torch", "onnx")
#: Also `--methods`: torch with every Linear packed at its first call (`PLAIN_ROWS = 0`), as
#: before short first calls ran on the plain weights.
OTHER_METHODS = ("torch-pack-first",)


def _child_env() -> dict:
    """The children's environment: Python's own bytecode caching, as a user's interpreter has it.
    A `PYTHONDONTWRITEBYTECODE` in the caller's (this project's sandbox sets it) would have every
    child compile each module it imports from source, which `nest.load`'s lazy imports then
    count as load time (88 ms of bert-base's ONNX load, profiled). The compiled files go under
    the bench cache (`PYTHONPYCACHEPREFIX`), not into the tree; the unmeasured round writes them."""
    from bench.weights import bench_cache

    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(bench_cache() / "pycache")
    return env


def _child(method: str, folder: Path) -> dict:
    run = subprocess.run([sys.executable, "-c", CHILD, method, str(folder)], capture_output=True, text=True,
                         env=_child_env())
    if run.returncode != 0:
        raise SystemExit(f"{method} failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.first_result", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("nest/bert-base-uncased/first-result.json"))
    parser.add_argument("--methods", default=",".join(METHODS),
                        help=f"comma-separated, transformers always first: {', '.join(METHODS + OTHER_METHODS)}")
    args = parser.parse_args(argv)
    methods = ("transformers",) + tuple(m for m in args.methods.split(",") if m and m != "transformers")
    unknown = [m for m in methods if m not in METHODS + OTHER_METHODS]
    if unknown:
        parser.error(f"unknown method {unknown[0]!r}")

    from linnet.contention import ContentionMeter
    from bench.weights import resolve

    weights = resolve("bert-base-uncased")
    folder = weights.linnet_weights or Path(weights.source)
    for method in methods:  # warms the page cache, the compiled program, kernel choices, the export
        _child(method, folder)
    runs: dict[str, list[dict]] = {m: [] for m in methods}
    meter = ContentionMeter()
    for r in range(args.rounds):
        for method in methods if r % 2 == 0 else reversed(methods):
            runs[method].append(_child(method, folder))
            print(f"round {r + 1} {method}: " + ", ".join(f"{k} {v:.3f}s" for k, v in runs[method][-1].items()
                                                           if k != "row0"), flush=True)
    contention = meter.stop()
    # The same outputs, so each method timed the same work (transformers is the reference).
    reference = runs["transformers"][0]["row0"]
    worst = max(abs(a - b) for m in methods for a, b in zip(runs[m][0]["row0"], reference))

    def median(method: str, *parts: str) -> float:
        return statistics.median(sum(run[p] for p in parts) for run in runs[method])

    table = {m: {"import_s": round(median(m, "import"), 3), "load_s": round(median(m, "load"), 3),
                 "first_forward_s": round(median(m, "first"), 3),
                 "load_and_first_x_transformers": round(median(m, "load", "first") /
                                                        median("transformers", "load", "first"), 2),
                 "all_x_transformers": round(median(m, "import", "load", "first") /
                                             median("transformers", "import", "load", "first"), 2)}
             for m in methods}
    result = {"what": "time to a first result: a new process's imports, load, one forward (1 x 16 tokens), "
                      "warm caches (Python's bytecode too), medians",
              "cpu": cpu_model(), "rounds": args.rounds, "weights": weights.origin,
              "max_abs_diff_to_transformers": worst,
              "other_processes_cpu_share": None if contention is None else round(contention.others_share, 2),
              "methods": table}
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
