"""`python -m bench.training`: one fine-tuning step, Linnet's torch module against transformers.

A step is forward + backward + `torch.optim.AdamW`, all-MiniLM-L6-v2 (its real weights, as
`bench.weights` finds them), B = 8 sentences of S = 128 tokens (stdlib docstrings, padded or
cut to 128), in train mode (dropout on, at the checkpoint's rates), with the same loss on
both sides: cross entropy of a two-class linear head over the masked mean of the last
hidden state, the head identical at the start.

* Linnet: `nest.load("all-minilm-l6-v2").torch_module()` (the unoptimised program, torch's own
  kernels; see docs/training.md), its `forward` entry.
* transformers: `BertModel.from_pretrained(folder)` from the same files, `last_hidden_state`,
  its default attention implementation.

Before timing, both compute the step's loss and gradients in eval mode on the same batch;
the largest gradient difference is printed (a sanity check that both train the same model).
Then `rounds` rounds each run `steps` steps of one side and then of the other (the order
alternating per round), so drift in the machine's speed hits both alike; the median step
time of each and their ratio (Linnet / transformers; <= 1.0 is the issue's target) are
printed, with the CPU share other processes took (linnet.contention) when that is large.

    python -m bench.training                     # the lead's run: quiet machine, defaults
    python -m bench.training --rounds 1 --steps 1 --batch 2 --seq 16   # a smoke run
"""
from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
import time


def _texts(count: int) -> list[str]:
    """Real sentences: the docstrings of a few stdlib modules, longest first."""
    import importlib

    texts = []
    for name in ("json", "shutil", "textwrap", "statistics", "argparse", "email.message"):
        module = importlib.import_module(name)
        for value in vars(module).values():
            doc = inspect.getdoc(value) if callable(value) else None
            if doc and len(doc) > 200:
                texts.append(" ".join(doc.split()))
    texts.sort(key=len, reverse=True)
    return (texts * (count // max(1, len(texts)) + 1))[:count]


def _models(device: str):
    import torch

    from linnet import nest
    from transformers import BertModel

    from .weights import resolve

    weights = resolve("all-minilm-l6-v2")
    model = nest.load("all-minilm-l6-v2", weights=weights.linnet_weights)
    ours = model.torch_module().to(device)
    theirs = BertModel.from_pretrained(weights.source, revision=weights.revision, dtype=torch.float32).to(device)
    return model, ours, theirs, weights


class Side:
    """One model with its head and optimiser, and how it turns a batch into a loss."""

    def __init__(self, name: str, encoder, head, hidden):
        import torch

        self.name, self.encoder, self.head, self.hidden = name, encoder, head, hidden
        self.optimizer = torch.optim.AdamW([*encoder.parameters(), *head.parameters()], lr=2e-5)
        self.times: list[float] = []

    def loss(self, batch, labels):
        import torch.nn.functional as F

        hidden = self.hidden(self.encoder, batch)
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1)
        return F.cross_entropy(self.head(pooled), labels)

    def step(self, batch, labels, sync) -> float:
        started = time.perf_counter()
        loss = self.loss(batch, labels)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        sync()
        return time.perf_counter() - started


def _gradient_check(ours: Side, theirs: Side, batch, labels, keys: dict[str, str]) -> float:
    """Largest |gradient difference| over every encoder param, eval mode, same batch."""
    for side in (ours, theirs):
        side.encoder.eval()
        side.optimizer.zero_grad(set_to_none=True)
        side.loss(batch, labels).backward()
    named = dict(theirs.encoder.named_parameters())
    worst = 0.0
    for path, param in ours.encoder.named_parameters():
        other = named[keys[path]].grad
        if (param.grad is None) != (other is None):
            raise AssertionError(f"{path}: a gradient on one side only")
        if other is not None:
            worst = max(worst, float((param.grad - other).abs().max()))
    if all(p.grad is None for p in ours.encoder.parameters()):
        raise AssertionError("the loss reached no encoder param")
    for side in (ours, theirs):
        side.optimizer.zero_grad(set_to_none=True)
        side.encoder.train()
    return worst


def run(rounds: int = 7, steps: int = 5, batch_size: int = 8, seq: int = 128, device: str = "cpu",
        threads: int | None = None, log=print) -> dict:
    import torch

    from linnet.contention import ContentionMeter

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    model, ours_encoder, theirs_encoder, weights = _models(device)
    tokenizer = model.tokenizer
    encoded = tokenizer(_texts(batch_size), max_length=seq, padding="max_length")
    batch = {k: torch.as_tensor(v, dtype=torch.long).to(device) for k, v in encoded.items()}
    labels = torch.arange(batch_size, device=device) % 2
    width = theirs_encoder.config.hidden_size
    head = torch.nn.Linear(width, 2).to(device)
    head_copy = torch.nn.Linear(width, 2).to(device)
    head_copy.load_state_dict(head.state_dict())
    transformers_batch = {"input_ids": batch["tokens"], "token_type_ids": batch["token_types"],
                          "attention_mask": batch["attention_mask"]}
    ours = Side("linnet", ours_encoder, head, lambda enc, b: enc.forward(b["tokens"], b["token_types"],
                                                                         b["attention_mask"]))
    theirs = Side("transformers", theirs_encoder, head_copy,
                  lambda enc, b: enc(**transformers_batch).last_hidden_state)
    bound = {path: info.key for path, info in ours_encoder.linnet_source.report.bound.items()}
    grad_diff = _gradient_check(ours, theirs, batch, labels, bound)
    log(f"weights: {weights.origin}; B={batch_size} S={seq} {device}, {torch.get_num_threads()} threads")
    log(f"eval-mode gradient check: largest |grad difference| {grad_diff:.3g} over "
        f"{sum(1 for _ in ours_encoder.parameters())} params")
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for side in (ours, theirs):  # warm-up: allocator, AdamW state, first-call costs
        side.step(batch, labels, sync)
    meter = ContentionMeter()
    for r in range(rounds):
        order = (ours, theirs) if r % 2 == 0 else (theirs, ours)
        for side in order:
            side.times += [side.step(batch, labels, sync) for _ in range(steps)]
        log(f"round {r + 1}/{rounds}: linnet {statistics.median(ours.times) * 1e3:.1f} ms, "
            f"transformers {statistics.median(theirs.times) * 1e3:.1f} ms (medians so far)")
    contention = meter.stop()
    result = {"model": "all-minilm-l6-v2", "device": device, "batch": batch_size, "seq": seq,
              "rounds": rounds, "steps_per_round": steps, "threads": torch.get_num_threads(),
              "linnet_step_ms": statistics.median(ours.times) * 1e3,
              "transformers_step_ms": statistics.median(theirs.times) * 1e3,
              "eval_grad_max_abs_diff": grad_diff}
    result["ratio"] = result["linnet_step_ms"] / result["transformers_step_ms"]
    if contention is not None:
        result["other_processes_cpu_share"] = round(contention.others_share, 3)
        if contention.shared:
            log(f"NOTE: {contention.describe()}: the ratio is rough")
    log(f"training step: linnet {result['linnet_step_ms']:.1f} ms, transformers {result['transformers_step_ms']:.1f} ms, "
        f"ratio {result['ratio']:.3f} (linnet / transformers)")
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="one fine-tuning step, Linnet torch vs transformers")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=5, help="steps of each side per round")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", help="also write the result to this file")
    args = parser.parse_args(argv)
    result = run(args.rounds, args.steps, args.batch, args.seq, args.device, args.threads)
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
