"""The `loss` entries of BERT's task heads against transformers' `outputs.loss`.

Each head block of the zoo's BERT source runs at a toy size from a checkpoint that
transformers' own `save_pretrained` wrote (the helpers of test_heads.py), and the same files
load the transformers class. The batches are right-padded and their labels ignore some
rows (-100, or for question answering an index past the window), as a data collator writes
them:

* SequenceClassification: `loss` (single-label cross entropy), `multi_label_loss` (BCE with
  logits, problem_type "multi_label_classification"), `regression_loss` (MSE, problem_type
  "regression");
* SequenceRegression (num_labels = 1, which transformers treats as regression): `loss`;
* TokenClassification, MultipleChoice: `loss`;
* QuestionAnswering: `loss` with start/end positions clamped and past-the-window ones skipped.

torch, ONNX Runtime, JAX and StableHLO, f32 on CPU, within 1e-5; and the std losses alone
against torch on hard logits.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from linnet import nest
from test_heads import TINY_CONFIG, TINY_LABELS, _right_padded, save_transformers_model, write_tiny_entry

BACKENDS = ["torch", "onnx", "jax", "stablehlo"]
BOUND = 1e-5
VOCAB = TINY_CONFIG["vocab_size"]
LENGTHS = [12, 7, 3, 9]

#: root block -> (transformers class, labels of its checkpoint)
HEADS = {
    "SequenceClassification": ("BertForSequenceClassification", TINY_LABELS),
    "SequenceRegression": ("BertForSequenceClassification", 1),
    "TokenClassification": ("BertForTokenClassification", TINY_LABELS),
    "QuestionAnswering": ("BertForQuestionAnswering", 2),
    "MultipleChoice": ("BertForMultipleChoice", TINY_LABELS),
}


def _np(x) -> np.ndarray:
    return x.detach().numpy() if hasattr(x, "detach") else np.asarray(x)


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    """root -> (entry folder, checkpoint folder)."""
    made = {}
    for i, (root, (cls_name, labels)) in enumerate(HEADS.items()):
        base = tmp_path_factory.mktemp(root.lower())
        made[root] = (write_tiny_entry(base / "entry", root, "logits", name=f"tiny-loss-{root.lower()}"),
                      save_transformers_model(cls_name, base / "hf", seed=20 + i, num_labels=labels))
    return made


def _load(heads, root: str, backend: str):
    import transformers

    entry, checkpoint = heads[root]
    model = nest.load(entry, backend=backend, weights=checkpoint / "model.safetensors")
    reference = getattr(transformers, HEADS[root][0]).from_pretrained(checkpoint).eval()
    return model, reference


def _mask_aware_positions(mask: np.ndarray) -> np.ndarray:
    """The positions the BERT source counts by default (real tokens only), for transformers'
    `position_ids`: then its logits at padding equal ours too, which matters where a loss
    reads every position (question answering's softmax runs over the whole window)."""
    return np.maximum(np.cumsum(mask != 0, axis=-1) - 1, 0)


def _reference_loss(reference, tokens, types, mask, *, positions: bool = False, **labels) -> float:
    t = torch.from_numpy
    extra = {"position_ids": t(_mask_aware_positions(mask))} if positions else {}
    with torch.no_grad():
        out = reference(input_ids=t(tokens), token_type_ids=t(types), attention_mask=t(mask), **extra,
                        **{k: t(v) for k, v in labels.items()})
    return float(out.loss)


def _check(name: str, backend: str, ours, expected: float) -> None:
    ours = _np(ours)
    assert ours.shape == () and ours.dtype == np.float32, (ours.shape, ours.dtype)
    diff = abs(float(ours) - expected)
    print(f"{name} {backend}: ours {float(ours):.6f} transformers {expected:.6f} |diff| {diff:.2e}")
    assert np.isfinite(expected) and expected > 0.01  # a real loss, not a degenerate 0
    assert diff <= BOUND * max(1.0, abs(expected))


@pytest.mark.parametrize("backend", BACKENDS)
def test_sequence_classification_losses(heads, backend):
    model, reference = _load(heads, "SequenceClassification", backend)
    tokens, types, mask = _right_padded(LENGTHS, VOCAB, seed=1)
    rng = np.random.default_rng(1)

    labels = np.array([2, -100, 0, 1])
    reference.config.problem_type = "single_label_classification"
    _check("sequence loss", backend, model.loss(tokens, types, mask, labels),
           _reference_loss(reference, tokens, types, mask, labels=labels))
    # by transformers' argument names, as its forward takes them
    same = model.loss(input_ids=tokens, token_type_ids=types, attention_mask=mask, labels=labels)
    assert float(_np(same)) == float(_np(model.loss(tokens, types, mask, labels)))

    targets = (rng.random((4, TINY_LABELS)) < 0.5).astype(np.float32)
    reference.config.problem_type = "multi_label_classification"
    _check("sequence multi-label loss", backend, model.multi_label_loss(tokens, types, mask, targets),
           _reference_loss(reference, tokens, types, mask, labels=targets))

    values = rng.standard_normal((4, TINY_LABELS)).astype(np.float32)
    reference.config.problem_type = "regression"
    _check("sequence regression loss", backend, model.regression_loss(tokens, types, mask, values),
           _reference_loss(reference, tokens, types, mask, labels=values))


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_label_is_regression(heads, backend):
    """transformers infers regression from num_labels == 1; SequenceRegression's `loss` is MSE."""
    model, reference = _load(heads, "SequenceRegression", backend)
    assert reference.config.num_labels == 1 and reference.config.problem_type is None
    tokens, types, mask = _right_padded(LENGTHS, VOCAB, seed=2)
    scores = np.random.default_rng(2).standard_normal(4).astype(np.float32) * 2
    _check("regression loss", backend, model.loss(tokens, types, mask, scores),
           _reference_loss(reference, tokens, types, mask, labels=scores))
    assert _np(model.logits(tokens, types, attention_mask=mask)).shape == (4, 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_token_classification_loss(heads, backend):
    model, reference = _load(heads, "TokenClassification", backend)
    tokens, types, mask = _right_padded(LENGTHS, VOCAB, seed=3)
    rng = np.random.default_rng(3)
    labels = rng.integers(0, TINY_LABELS, size=tokens.shape)
    labels[mask == 0] = -100                             # padding
    labels[(rng.random(tokens.shape) < 0.3)] = -100      # word continuations
    assert 0 < (labels != -100).sum() < mask.sum()
    _check("token loss", backend, model.loss(tokens, types, mask, labels),
           _reference_loss(reference, tokens, types, mask, labels=labels))


@pytest.mark.parametrize("backend", BACKENDS)
def test_question_answering_loss_clamps_as_transformers(heads, backend):
    """Positions past the window (>= S) are clamped to S and skipped; negative ones are
    clamped to 0 and count (transformers clamps before ignoring)."""
    model, reference = _load(heads, "QuestionAnswering", backend)
    tokens, types, mask = _right_padded(LENGTHS, VOCAB, seed=4)
    width = tokens.shape[1]
    start = np.array([3, width + 5, -7, 2])
    end = np.array([5, width, 1, width - 1])
    expected = _reference_loss(reference, tokens, types, mask, positions=True,
                               start_positions=start, end_positions=end)
    _check("qa loss", backend, model.loss(tokens, types, mask, start, end), expected)
    # skipped and counted indices matter: the same batch with all answers inside differs
    inside = _np(model.loss(tokens, types, mask, np.array([3, 1, 0, 2]), end))
    assert abs(float(inside) - expected) > 1e-4


@pytest.mark.parametrize("backend", BACKENDS)
def test_multiple_choice_loss(heads, backend):
    model, reference = _load(heads, "MultipleChoice", backend)
    tokens, types, mask = (a.reshape(2, 3, -1) for a in _right_padded([10, 6, 8, 3, 10, 5], VOCAB, seed=5))
    labels = np.array([2, 0])
    _check("multiple-choice loss", backend, model.loss(tokens, types, mask, labels),
           _reference_loss(reference, tokens, types, mask, labels=labels))


# ------------------------------------------------------------------ std losses alone

STD_SOURCE = """
module stdlosses

use std.nn.losses::{binary_cross_entropy_with_logits, mse_loss}

pub block Losses<C: Dim> {
    pub entry bce<N: Dim>(logits: Tensor[N, C; f32], targets: Tensor[N, C; f32]) -> Tensor[; f32] {
        return binary_cross_entropy_with_logits(logits, targets)
    }

    pub entry mse<N: Dim>(predictions: Tensor[N, C; f32], targets: Tensor[N, C; f32]) -> Tensor[; f32] {
        return mse_loss(predictions, targets)
    }
}
"""


def test_std_bce_and_mse_equal_torch_on_large_logits(tmp_path):
    """Logits of +-1e4 (exp(-x) overflows in the naive form) and soft targets."""
    import textwrap

    from linnet.backends import torch_source
    from linnet.backends.pysource import import_generated

    root = tmp_path / "entry"
    (root / "src").mkdir(parents=True)
    (root / "src" / "lib.linnet").write_text(textwrap.dedent(STD_SOURCE).lstrip())
    (root / "linnet.toml").write_text('[package]\nname = "stdlosses"\nversion = "0.1.0"\nlanguage = "0.1"\n')
    (root / "nest.toml").write_text(
        '[model]\nname = "stdlosses"\ntitle = "Losses"\nsummary = "std losses."\nlicense = "Apache-2.0"\n'
        'family = "test"\n\n[source]\npath = "src/lib.linnet"\nroot = "Losses"\nentry = "bce"\n\n'
        '[generics]\nC = 5\n\n[check]\nN = 3\n')
    ctx, _ = nest.prepare(root, need_weights=False)
    module = import_generated(torch_source.write(ctx.program, tmp_path / "torch"), "linnet_test_stdlosses_torch")
    rng = np.random.default_rng(0)
    logits = torch.from_numpy((rng.standard_normal((20, 5)) * 20).astype(np.float32))
    logits[0, 0], logits[1, 1] = 1e4, -1e4
    targets = torch.from_numpy(rng.random((20, 5)).astype(np.float32))
    bce = float(module.Losses().bce(logits, targets))
    mse = float(module.Losses().mse(logits[2:], targets[2:]))
    expected_bce = float(F.binary_cross_entropy_with_logits(logits, targets))
    expected_mse = float(F.mse_loss(logits[2:], targets[2:]))
    print(f"bce {bce} vs {expected_bce}; mse {mse} vs {expected_mse}")
    assert abs(bce - expected_bce) <= BOUND * abs(expected_bce)
    assert abs(mse - expected_mse) <= BOUND * abs(expected_mse)
