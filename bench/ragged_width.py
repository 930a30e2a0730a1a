"""What ragged serving can gain over padded: the packed `embed` graph at two widths, outside Triton.

    PYTHONPATH=. python -m bench.ragged_width [--model bert-base-uncased] [--batch 9] [--batches 12]
        [--width 0] [--texts 256] [--max-tokens 256]

Both Triton layouts of `bench.triton_ragged` run the same packed graph: the dense layers see the
real tokens only, and attention runs at the batch's width, which is what the layouts change
(padded: the longest text of the set, what its clients pad to; ragged: each batch's own
longest). This times that graph (`nest.load(..., backend="onnx")`'s `embed`, packed) on random
batches of `--batch` texts of the same corpus at both widths, interleaved per batch, after two
unmeasured batches: the ratio is the most ragged can gain over padded at batches of that size
(Triton's statistics give the size its dynamic batcher forms). `--width 0` pads to the set's
longest text, as the bench's padded clients do.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np


def main(argv=None) -> int:
    from bench.triton_ragged import right_padded, token_rows
    from bench.weights import resolve
    from linnet import nest
    from linnet.backends.measured import cpu_model

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="bert-base-uncased")
    parser.add_argument("--batch", type=int, default=9, help="texts per batch")
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--width", type=int, default=0, help="the padded width; 0: the set's longest text")
    parser.add_argument("--texts", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=256)
    args = parser.parse_args(argv)
    model = nest.load(args.model, backend="onnx", weights=str(resolve(args.model).snapshot()))
    seqs = token_rows(args.texts, args.max_tokens)
    width = args.width or max(len(s) for s in seqs)
    rng = np.random.default_rng(1)
    batches = [[seqs[i] for i in rng.choice(len(seqs), args.batch, replace=False)] for _ in range(args.batches + 2)]
    seconds = {"padded": 0.0, "own": 0.0}
    for index, rows in enumerate(batches):
        for layout, w in (("padded", width), ("own", max(len(r) for r in rows))):
            tokens, mask = right_padded(rows, w)
            started = time.perf_counter()
            model.embed(tokens, attention_mask=mask)
            if index >= 2:  # the first two warm the session up for both widths
                seconds[layout] += time.perf_counter() - started
    measured = batches[2:]
    print(json.dumps({
        "model": args.model, "cpu": cpu_model(), "batch": args.batch, "batches": args.batches,
        "padded_width": width, "own_width_mean": float(np.mean([max(len(r) for r in b) for b in measured])),
        "tokens_per_batch": float(np.mean([sum(len(r) for r in b) for b in measured])),
        "ms_per_batch": {k: round(1e3 * v / args.batches, 1) for k, v in seconds.items()},
        "padded_over_own": round(seconds["padded"] / seconds["own"], 3)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
