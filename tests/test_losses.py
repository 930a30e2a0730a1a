"""Losses written in Linnet (`std.nn.losses.cross_entropy`) and the loss entries of BERT's
PreTraining block, against transformers and torch.

A small random BertForPreTraining saved by transformers' own `save_pretrained` is loaded
through a toy zoo entry over the zoo's BERT source (as in test_heads.py) and by transformers
from the same files. On a right-padded batch whose `labels` are -100 at padding and at most
real positions (as a masked-LM data collator writes them) and whose `next_sentence_label`
ignores one sequence:

* `pretraining_loss` equals `BertForPreTraining(...).loss`;
* `mlm_loss` / `nsp_loss` equal F.cross_entropy of transformers' own logits (its `loss` is
  their sum, which is checked too);
on torch, ONNX Runtime, JAX and StableHLO, f32 on CPU, within 1e-5; and std's cross entropy alone
against F.cross_entropy on logits of +-1e4.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from linnet import nest
from test_heads import TINY_CONFIG, _right_padded, save_transformers_model, write_tiny_entry

BACKENDS = ["torch", "onnx", "jax", "stablehlo"]
BOUND = 1e-5
VOCAB = TINY_CONFIG["vocab_size"]


def _np(x) -> np.ndarray:
    return x.detach().numpy() if hasattr(x, "detach") else np.asarray(x)


# ------------------------------------------------------------------ std.nn.losses alone

CE_SOURCE = """
module celoss

use std.nn.losses::{cross_entropy}

pub block Losses<C: Dim> {
    pub entry ce<N: Dim>(logits: Tensor[N, C; f32], labels: Tensor[N; i32]) -> Tensor[; f32] {
        return cross_entropy(logits, labels)
    }
}
"""


def _cross_entropy_program(root: Path, classes: int):
    (root / "src").mkdir(parents=True)
    (root / "src" / "lib.linnet").write_text(textwrap.dedent(CE_SOURCE).lstrip())
    (root / "linnet.toml").write_text('[package]\nname = "celoss"\nversion = "0.1.0"\nlanguage = "0.1"\n')
    (root / "nest.toml").write_text(
        '[model]\nname = "celoss"\ntitle = "Cross entropy"\nsummary = "std cross entropy."\n'
        'license = "Apache-2.0"\nfamily = "test"\n\n[source]\npath = "src/lib.linnet"\nroot = "Losses"\n'
        f'entry = "ce"\n\n[generics]\nC = {classes}\n\n[check]\nN = 3\n')
    ctx, _ = nest.prepare(root, need_weights=False)
    return ctx.program


def test_std_cross_entropy_equals_torch_on_hard_logits(tmp_path):
    """Logits of +-1e4 (exp overflows without the max shift), -100 labels, every class as a
    target; generated torch and JAX code against F.cross_entropy."""
    import jax.numpy as jnp

    from linnet.backends import jax_source, torch_source
    from linnet.backends.pysource import import_generated

    program = _cross_entropy_program(tmp_path / "entry", classes=7)
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((50, 7)) * 30).astype(np.float32)
    logits[0, 3], logits[2, 3], logits[1] = 1e4, 1e4, -1e4  # row 0 is ignored, rows 1 and 2 count
    labels = np.arange(50) % 7
    labels[::3] = -100
    expected = float(F.cross_entropy(torch.from_numpy(logits), torch.from_numpy(labels)))
    torch_module = import_generated(torch_source.write(program, tmp_path / "torch"), "linnet_test_celoss_torch")
    jax_module = import_generated(jax_source.write(program, tmp_path / "jax"), "linnet_test_celoss_jax")
    got = {"torch": torch_module.Losses().ce(torch.from_numpy(logits), torch.from_numpy(labels.astype(np.int32))),
           "jax": jax_module.ENTRIES["ce"]({}, jnp.asarray(logits), jnp.asarray(labels, jnp.int32))}
    for backend, value in got.items():
        value = np.asarray(value)
        print(f"std cross_entropy {backend}: {float(value):.6f} vs torch {expected:.6f}")
        assert value.shape == () and np.isfinite(value)
        assert abs(float(value) - expected) <= BOUND * max(1.0, abs(expected))


# ------------------------------------------------------------------ BERT's loss entries


@pytest.fixture(scope="module")
def tiny_pretraining(tmp_path_factory):
    base = tmp_path_factory.mktemp("losses")
    return (write_tiny_entry(base / "entry", "PreTraining", "forward"),
            save_transformers_model("BertForPreTraining", base / "hf", seed=5))


@pytest.fixture(scope="module")
def reference(tiny_pretraining):
    from transformers import BertForPreTraining

    return BertForPreTraining.from_pretrained(tiny_pretraining[1]).eval()


@pytest.fixture(scope="module", params=BACKENDS)
def model(request, tiny_pretraining):
    entry, checkpoint = tiny_pretraining
    return nest.load(entry, backend=request.param, weights=checkpoint / "model.safetensors")


def _batch(seed: int = 11):
    """A right-padded batch, masked-LM labels (a word id at ~30% of real positions, -100
    elsewhere and at every pad) and next-sentence labels with the second sequence ignored."""
    tokens, types, mask = _right_padded([12, 7, 3, 9], VOCAB, seed)
    rng = np.random.default_rng(seed)
    predicted = (rng.random(tokens.shape) < 0.3) & mask.astype(bool)
    predicted[2, 0] = True  # every sequence, even the shortest, has a target
    labels = np.where(predicted, rng.integers(0, VOCAB, size=tokens.shape), -100)
    next_sentence = np.array([0, -100, 1, 1])
    return tokens, types, mask, labels, next_sentence


def _transformers(reference, tokens, types, mask, labels, next_sentence):
    t = torch.from_numpy
    with torch.no_grad():
        return reference(input_ids=t(tokens), token_type_ids=t(types), attention_mask=t(mask),
                         labels=t(labels), next_sentence_label=t(next_sentence))


def test_loss_entries_equal_bert_for_pretraining(model, reference):
    tokens, types, mask, labels, next_sentence = _batch()
    assert 0 < (labels != -100).sum() < mask.sum()  # some real positions are ignored too
    out = _transformers(reference, tokens, types, mask, labels, next_sentence)
    ref_mlm = F.cross_entropy(out.prediction_logits.reshape(-1, VOCAB), torch.from_numpy(labels).reshape(-1))
    ref_nsp = F.cross_entropy(out.seq_relationship_logits, torch.from_numpy(next_sentence))
    assert abs(float(ref_mlm + ref_nsp) - float(out.loss)) <= 1e-6  # transformers' loss is their sum

    ours_total = _np(model.pretraining_loss(tokens, types, mask, labels, next_sentence))
    ours_mlm = _np(model.mlm_loss(tokens, types, mask, labels))
    ours_nsp = _np(model.nsp_loss(tokens, types, mask, next_sentence_label=next_sentence))
    assert ours_total.shape == ours_mlm.shape == ours_nsp.shape == ()
    assert ours_total.dtype == np.float32
    diffs = {"pretraining": abs(float(ours_total) - float(out.loss)),
             "mlm": abs(float(ours_mlm) - float(ref_mlm)), "nsp": abs(float(ours_nsp) - float(ref_nsp))}
    print(f"losses {model.backend}: loss {float(out.loss):.6f} mlm {float(ref_mlm):.6f} "
          f"nsp {float(ref_nsp):.6f}; |diff| {diffs}")
    assert float(ref_mlm) > 1.0 and float(ref_nsp) > 0.1  # real losses, not a degenerate 0
    assert max(diffs.values()) <= BOUND
    # called as transformers' forward is, by its argument names
    as_transformers = _np(model.pretraining_loss(input_ids=tokens, token_type_ids=types, attention_mask=mask,
                                                 labels=labels, next_sentence_label=next_sentence))
    assert as_transformers == ours_total


def test_ignored_labels_change_nothing_and_are_not_counted(model):
    """With all but one target ignored the loss is that one row's cross entropy (the mean
    is over counted rows, not over the batch), and it differs from the loss over all."""
    tokens, types, mask, labels, next_sentence = _batch(seed=12)
    base = float(_np(model.nsp_loss(tokens, types, mask, next_sentence)))
    only_first = np.array([next_sentence[0], -100, -100, -100])
    one = float(_np(model.nsp_loss(tokens, types, mask, only_first)))
    logits = torch.from_numpy(_np(model.nsp(tokens, types, attention_mask=mask)))
    assert abs(one - float(F.cross_entropy(logits[:1], torch.from_numpy(only_first[:1])))) <= BOUND
    assert abs(base - one) > 1e-4  # the other targets did count before


def test_every_label_ignored_gives_nan_as_torch(model):
    tokens, types, mask, _, _ = _batch()
    loss = float(_np(model.nsp_loss(tokens, types, mask, np.full(len(tokens), -100))))
    assert np.isnan(loss) and np.isnan(float(F.cross_entropy(torch.zeros(4, 2), torch.full((4,), -100))))


def test_onnx_writes_the_weights_once(tiny_pretraining):
    """The loss entries take labels too, so they are graphs of their own beside model.onnx
    (which keeps the inference entries, as served); their weights are references into the
    one weights.bin, not copies."""
    entry, checkpoint = tiny_pretraining
    model = nest.load(entry, backend="onnx", weights=checkpoint / "model.safetensors")
    folder = model.info.generated.parent
    sizes = {p.name: p.stat().st_size for p in folder.iterdir() if p.name.startswith("weights.bin")}
    from safetensors.numpy import load_file

    params = sum(t.nbytes for t in load_file(str(checkpoint / "model.safetensors")).values())
    print(f"onnx weights files: {sizes}; checkpoint tensors {params} bytes")
    assert sizes["weights.bin"] >= 0.9 * params
    assert sum(sizes.values()) - sizes["weights.bin"] <= 0.05 * params
    for name in ("mlm_loss", "nsp_loss", "pretraining_loss"):
        assert (folder / f"model.{name}.onnx").exists()
