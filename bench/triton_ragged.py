"""Ragged vs padded Triton serving of all-MiniLM-L6-v2 under perf_analyzer (one short run).

    PYTHONPATH=. python -m bench.triton_ragged [--concurrency 1,4,16] [--ms 4000]

Both repositories serve `embedding` on Triton's ONNX Runtime backend (the onnxruntime layout)
with the same batching (max_batch_size 32, max_queue_delay 2000 us).  The texts are the same
variable-length token sequences (S uniform in [8, 128], a fixed seed):

* ragged: `--ragged`, each request its own `[1, S_i]`; the batcher concatenates any lengths.
* padded: the default export, each request padded to S = 128 with `attention_mask`, so the
  batcher can merge them (it only merges requests of one shape).

Figures are requests (texts) per second and latency percentiles from perf_analyzer's report.
On a shared machine they are indicative only: report the load alongside.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

MINILM = "all-minilm-l6-v2"
PAD = 128


def texts(n: int = 64, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1000, 30000, size=int(s)).astype(np.int32) for s in rng.integers(8, PAD + 1, size=n)]


def main(argv=None) -> int:
    from linnet.nest import prepare
    from linnet.serving.triton import export_passes, export_triton
    from linnet.testing.perf_analyzer import measure
    from linnet.testing.triton_ort import build_onnxruntime_backend
    from linnet.testing.triton_server import TritonServer, provision

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--ms", type=int, default=4000, help="perf_analyzer's measurement window")
    args = parser.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    tools = provision()
    build_onnxruntime_backend(tools)
    seqs = texts()
    ragged_rows = [{"tokens": s} for s in seqs]
    padded_rows = []
    for s in seqs:
        tokens, mask = np.zeros(PAD, np.int32), np.zeros(PAD, np.int32)
        tokens[:len(s)], mask[:len(s)] = s, 1
        padded_rows.append({"tokens": tokens, "attention_mask": mask})
    ctx, _ = prepare(MINILM, optimize=export_passes())
    options = {"max_batch_size": 32, "max_queue_delay_us": 2000, "entries": ["embedding"]}
    results = {"load_avg_at_start": os.getloadavg(), "cpus": os.cpu_count(), "texts": len(seqs),
               "mean_tokens": float(np.mean([len(s) for s in seqs])), "pad_to": PAD, "runs": []}
    with tempfile.TemporaryDirectory(prefix="bench-ragged-") as work:
        root = Path(work)
        export_triton(ctx, root / "ragged", ragged=True, **options)
        export_triton(ctx, root / "padded", **options)
        for layout, rows in (("ragged", ragged_rows), ("padded", padded_rows)):
            with TritonServer(root / layout, tools, log_path=root / f"{layout}.log") as server:
                for c in levels:
                    f = measure(tools, server.grpc_url, MINILM, rows, concurrency=c, batch=1, measurement_ms=args.ms)
                    results["runs"].append({"layout": layout, **f.to_json()})
                    print(json.dumps(results["runs"][-1]), flush=True)
        shutil.rmtree(root, ignore_errors=True)
    results["load_avg_at_end"] = os.getloadavg()
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
