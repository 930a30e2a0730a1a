"""One torch decode step's CPU time, SmolLM2: generate's entry steps (the cache concatenated and
validated each step) against its buffer steps (the cache written in place), alternating.

    python -m bench.cache_step

The calling thread's CPU time (`time.thread_time`; torch at one thread runs there), which
other processes on a shared machine disturb far less than wall time. Prompt 64 tokens, 48
steps a round, the median of the last 16 (95-110 cached positions), 4 rounds each; prints
each round's median and the median of those (ms). docs/llama.md "The cache in place".
"""
import json
import statistics
import time

import numpy as np
import torch

from bench.decoder import prompt, smollm2_folder
from linnet import nest
from linnet.nest.generate import EntrySteps


def main() -> None:
    torch.set_num_threads(1)
    model = nest.load(smollm2_folder(), backend="torch")
    seq, new = 64, 48
    tokens = prompt(seq, 49152)
    mask = np.ones_like(tokens)
    medians = {"entry": [], "buffer": []}
    for _ in range(4):
        for kind in medians:
            steps = EntrySteps(model) if kind == "entry" else model.runtime.cache_buffer_steps(seq + new)
            logits, grown, times = steps.start(tokens, mask), mask, []
            for _ in range(new - 1):
                token = logits.argmax(-1)[:, None]
                grown = np.concatenate([grown, np.ones((1, 1), grown.dtype)], 1)
                started = time.thread_time()
                logits = steps.step(token, grown)
                times.append(time.thread_time() - started)
            getattr(steps, "close", lambda: None)()
            medians[kind].append(statistics.median(times[-16:]))
    print(json.dumps({k: [round(1e3 * x, 2) for x in v] for k, v in medians.items()}))
    print({k: round(1e3 * statistics.median(v), 2) for k, v in medians.items()})


if __name__ == "__main__":
    main()
