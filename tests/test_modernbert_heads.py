"""ModernBERT's task heads (std.nn.transform_heads over nest/modernbert-base's `Model`) and
the base model's `pool`/`embed` against transformers 5.

* Tiny random ModernBertForSequenceClassification (`classifier_pooling` "mean" and "cls") and
  ModernBertForTokenClassification written by transformers' `save_pretrained` at
  test_modernbert.py's config (4 layers, full attention at layers 0 and 3, a sliding window
  of 2 positions either side in layers 1 and 2, narrower than the 10-token batch), loaded as
  folders: logits on its right-padded batch within 1e-5 of transformers' eager attention on
  torch, JAX, StableHLO and ONNX (per-token logits at real tokens).
* The losses: single-label, multi-label and regression for the sequence head and token cross
  entropy with -100 labels equal transformers' `outputs.loss` for the matching
  `problem_type`, on torch and ONNX Runtime.
* One label with problem_type null is transformers' regression: loaded through `hf:` from
  the test hub cache, its logits [B, 1] and MSE loss equal transformers'.
* `pool` on the bare ModernBertModel follows its config's `classifier_pooling`: the mean of
  transformers' last hidden state over the mask, computed here with numpy; `embed` is that
  vector at unit length.
* A pooling or problem type the source does not know is refused by name.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from fixtures.hf_checkpoints import fake_commit, save_model_repo
from fixtures.parity import max_diff
from linnet import nest
from linnet.diagnostics import LinnetError
from test_modernbert import _config, _inputs

BACKENDS = ["torch", "jax", "stablehlo", "onnx"]
TOLERANCE = 1e-5
#: name -> (transformers class, config overrides)
HEADS = {
    "sequence-mean": ("ModernBertForSequenceClassification", {"classifier_pooling": "mean", "num_labels": 3}),
    "sequence-cls": ("ModernBertForSequenceClassification", {"classifier_pooling": "cls", "num_labels": 3}),
    "token": ("ModernBertForTokenClassification", {"num_labels": 5}),
}


def _build(class_name: str, seed: int, **overrides):
    """A random model whose norms and biases are off their initial 1 and 0, and whose
    attention is sharp enough that the window and the mask matter (as test_modernbert.py)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    model = getattr(transformers, class_name)(_config(**overrides)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or "bias" in name:
                param.add_(0.1 * torch.randn_like(param))
            if "Wqkv" in name:
                param.mul_(10.0)
    return model


def _run(model, tokens, mask, **labels):
    import torch

    t = torch.from_numpy
    with torch.no_grad():
        return model(input_ids=t(tokens), attention_mask=t(mask), **{k: t(v) for k, v in labels.items()})


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """name -> (folder, transformers model, its logits on the batch)."""
    root = tmp_path_factory.mktemp("modernbert-heads")
    tokens, mask = _inputs()
    made = {}
    for seed, (name, (class_name, overrides)) in enumerate(HEADS.items()):
        model = _build(class_name, seed, **overrides)
        model.save_pretrained(root / name)
        made[name] = (root / name, model, _run(model, tokens, mask).logits.numpy())
    return made


_LOADED: dict[tuple[str, str], object] = {}


def _load(saved, name: str, backend: str):
    if (name, backend) not in _LOADED:
        _LOADED[name, backend] = nest.load(str(saved[name][0]), backend=backend)
    return _LOADED[name, backend]


def _batch():
    tokens, mask = _inputs()
    return tokens.astype(np.int32), mask.astype(np.int32), mask.astype(bool)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(HEADS))
def test_logits_match_transformers(saved, name, backend):
    tokens, mask, real = _batch()
    model = _load(saved, name, backend)
    want = saved[name][2]
    got = np.asarray(model(tokens, mask))
    assert got.shape == want.shape
    if got.ndim == 3:  # per token: padding is not compared (ONNX Runtime runs packed)
        got, want = got[real], want[real]
    diff = max_diff(got, want)
    print(f"modernbert {name} {backend}: max |diff| {diff:.2e} (spread {want.std():.2g})")  # shown with -s
    assert want.std() > 100 * TOLERANCE and diff <= TOLERANCE


def test_the_pooling_mode_changes_the_logits(saved):
    """The same mean-pooling weights pooled at the first token instead give other logits (by
    more than 100 times the tolerance), so the parity above tells the two modes apart."""
    tokens, mask = _inputs()
    model = saved["sequence-mean"][1]
    model.config.classifier_pooling = "cls"
    try:
        other = _run(model, tokens, mask).logits.numpy()
    finally:
        model.config.classifier_pooling = "mean"
    assert max_diff(other, saved["sequence-mean"][2]) > 100 * TOLERANCE


def _check_loss(what: str, backend: str, ours, expected) -> None:
    ours, expected = np.asarray(ours), float(expected)
    diff = abs(float(ours) - expected)
    print(f"modernbert {what} {backend}: ours {float(ours):.6f} transformers {expected:.6f} |diff| {diff:.2e}")
    assert ours.shape == () and np.isfinite(expected) and expected > 0.01
    assert diff <= TOLERANCE * max(1.0, abs(expected))


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_losses_equal_transformers(saved, backend):
    tokens, mask, real = _batch()
    rng = np.random.default_rng(7)
    sequence, reference = _load(saved, "sequence-mean", backend), saved["sequence-mean"][1]
    cases = [
        ("single_label_classification", "loss", np.array([2, 0])),
        ("multi_label_classification", "multi_label_loss", (rng.random((2, 3)) < 0.5).astype(np.float32)),
        ("regression", "regression_loss", rng.standard_normal((2, 3)).astype(np.float32)),
    ]
    try:
        for problem, entry, labels in cases:
            reference.config.problem_type = problem
            expected = _run(reference, tokens.astype(np.int64), mask.astype(np.int64), labels=labels).loss
            _check_loss(f"sequence {entry}", backend, getattr(sequence, entry)(tokens, mask, labels), expected)
    finally:
        reference.config.problem_type = None

    labels = rng.integers(0, 5, size=tokens.shape)
    labels[~real] = -100
    labels[0, 3] = labels[1, 1] = -100  # a word's continuation pieces
    expected = _run(saved["token"][1], tokens.astype(np.int64), mask.astype(np.int64), labels=labels).loss
    _check_loss("token loss", backend, _load(saved, "token", backend).loss(tokens, mask, labels), expected)


def test_one_label_through_hf_is_regression(hf_cache):
    """num_labels = 1 and problem_type null: transformers computes MSE against one float per
    sequence; hf: picks the SequenceRegression root, whose logits are [B, 1]."""
    model = _build("ModernBertForSequenceClassification", 5, classifier_pooling="mean", num_labels=1)
    repo = save_model_repo(hf_cache, "linnet-tests/modernbert-regressor", model,
                           fake_commit("linnet-tests/modernbert-regressor"))
    loaded = nest.load(repo.name, backend="torch")
    assert loaded.manifest.source.root == "SequenceRegression"
    tokens, mask, _ = _batch()
    scores = np.array([0.5, -1.5], np.float32)
    out = _run(model, tokens.astype(np.int64), mask.astype(np.int64), labels=scores)
    logits = np.asarray(loaded(tokens, mask))
    assert logits.shape == (2, 1) and max_diff(logits, out.logits.numpy()) <= TOLERANCE
    _check_loss("regression loss", "torch", loaded.loss(tokens, mask, scores), out.loss)


def test_pool_and_embed_of_the_bare_model(saved, tmp_path):
    """ModernBertModel with the classifier's config: `pool` is the mean of transformers' last
    hidden state over the real tokens (numpy here), `embed` that vector at unit length."""
    head = saved["sequence-mean"][1]
    head.model.save_pretrained(tmp_path / "bare")
    assert json.loads((tmp_path / "bare" / "config.json").read_text())["classifier_pooling"] == "mean"
    bare = nest.load(str(tmp_path / "bare"), backend="torch")
    tokens, mask, real = _batch()
    hidden = _run(head.model, tokens.astype(np.int64), mask.astype(np.int64)).last_hidden_state.numpy()
    weights = real[:, :, None].astype(np.float32)
    mean = (hidden * weights).sum(1) / weights.sum(1)
    assert max_diff(mean, hidden[:, 0]) > 100 * TOLERANCE  # the two poolings differ on this batch
    pooled = np.asarray(bare.pool(tokens, mask))
    assert max_diff(pooled, mean) <= TOLERANCE
    unit = mean / np.linalg.norm(mean, axis=1, keepdims=True)
    assert max_diff(np.asarray(bare.embed(tokens, mask)), unit) <= TOLERANCE
    # the classifier root pools the same way
    assert max_diff(np.asarray(_load(saved, "sequence-mean", "torch").pool(tokens, mask)), mean) <= TOLERANCE


REFUSALS = [
    ({"classifier_pooling": "max"}, 'sets classifier_pooling = "max"; the ModernBERT source computes "cls", "mean"'),
    ({"problem_type": "ordinal"}, 'sets problem_type = "ordinal"'),
]


@pytest.mark.parametrize("change, says", REFUSALS, ids=["pooling", "problem-type"])
def test_unknown_settings_are_refused_by_name(saved, tmp_path, change, says):
    config = json.loads((saved["sequence-cls"][0] / "config.json").read_text())
    config.update(change)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(LinnetError) as caught:
        nest.load(str(tmp_path))
    assert caught.value.code == "E1106", caught.value.render()
    assert says in caught.value.render()
