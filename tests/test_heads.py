"""BERT's heads: the pre-training `mlm` and `nsp` entries of bert-base-uncased, the tied
masked-LM decoder, and every task-head block of the BERT source.

* `mlm` and `nsp` against transformers' BertForPreTraining loaded from the same synthetic
  bert-base-uncased checkpoint (prediction_logits, seq_relationship_logits), unpadded and
  right-padded, on torch and ONNX Runtime, f32 on CPU.
* The decoder is tied: the model has one [Vocab, D] table, and changing one row of the
  checkpoint's word embeddings changes that word's masked-LM scores and nothing else.
* Each task-head block at a toy size against the transformers `BertFor*` class it mirrors,
  from a checkpoint that transformers' own `save_pretrained` wrote, loaded through a zoo
  entry written into a temporary folder (nest.toml + bindings.json over the zoo's source).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fixtures.checkpoints import BERT_BASE_REPO, BERT_BASE_REVISION
from fixtures.parity import max_diff, random_inputs
from linnet import nest

BACKENDS = ["torch", "onnx", "jax"]
#: f32 parity bound for every head and backend (the issue's 1e-5).
BOUND = 1e-5


def _np(x) -> np.ndarray:
    return x.detach().numpy() if hasattr(x, "detach") else np.asarray(x)


def _right_padded(lengths: list[int], vocab: int, seed: int):
    """tokens, token_types, attention_mask (int64, as a tokenizer returns them), padded on the
    right to the longest length."""
    rng = np.random.default_rng(seed)
    width = max(lengths)
    tokens = np.zeros((len(lengths), width), np.int64)
    types = np.zeros_like(tokens)
    mask = np.zeros_like(tokens)
    for row, n in enumerate(lengths):
        tokens[row, :n] = rng.integers(1, vocab, size=n)
        types[row, :n] = rng.integers(0, 2, size=n)
        mask[row, :n] = 1
    return tokens, types, mask


def _real_positions_diff(ours: np.ndarray, ref: np.ndarray, mask: np.ndarray) -> float:
    """Largest difference over real tokens only: transformers numbers pad positions on from
    the last real one, Linnet repeats it, so per-token outputs at pads legitimately differ."""
    real = mask.astype(bool)
    return max_diff(ours[real], ref[real])


def _transformers(model, tokens, types, mask):
    with torch.no_grad():
        return model(input_ids=torch.from_numpy(tokens), token_type_ids=torch.from_numpy(types),
                     attention_mask=torch.from_numpy(mask))


# ------------------------------------------------------------------ bert-base-uncased: mlm, nsp


@pytest.fixture(scope="module")
def pretraining_reference(bert_base_checkpoint):
    from transformers import BertForPreTraining

    model = BertForPreTraining.from_pretrained(BERT_BASE_REPO, revision=BERT_BASE_REVISION, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="module", params=BACKENDS)
def bert_heads(request, bert_base_checkpoint):
    return nest.load("bert-base-uncased", backend=request.param)


def _bert_inputs(layout: str):
    if layout == "unpadded":
        tokens, types = random_inputs(2, 24, seed=9)
        return tokens, types, np.ones_like(tokens)
    return _right_padded([9, 40, 23], 30522, seed=4)


@pytest.mark.parametrize("layout", ["unpadded", "right-padded"])
def test_mlm_and_nsp_match_bert_for_pretraining(bert_heads, pretraining_reference, layout):
    tokens, types, mask = _bert_inputs(layout)
    ref = _transformers(pretraining_reference, tokens, types, mask)
    ref_mlm, ref_nsp = ref.prediction_logits.numpy(), ref.seq_relationship_logits.numpy()
    mlm = _np(bert_heads.mlm(tokens, types, attention_mask=mask))
    nsp = _np(bert_heads.nsp(tokens, types, attention_mask=mask))
    assert mlm.shape == ref_mlm.shape == (*tokens.shape, 30522) and nsp.shape == (len(tokens), 2)
    mlm_diff, nsp_diff = _real_positions_diff(mlm, ref_mlm, mask), max_diff(nsp, ref_nsp)
    print(f"bert-base {bert_heads.backend} {layout} {tokens.shape}: mlm {mlm_diff:.3g} nsp {nsp_diff:.3g}"
          f" (logits spread {ref_mlm.std():.3g})")
    # Random weights still give logits of real spread, so the bound is a small fraction of them.
    assert ref_mlm.std() > 0.1 and ref_nsp.std() > 0.01
    assert mlm_diff <= BOUND and nsp_diff <= BOUND


def test_mlm_of_a_padded_batch_equals_each_sequence_alone(bert_heads):
    tokens, types, mask = _right_padded([5, 17], 30522, seed=8)
    batch = _np(bert_heads.mlm(tokens, types, attention_mask=mask))
    for row, n in enumerate(mask.sum(1)):
        alone = _np(bert_heads.mlm(tokens[row:row + 1, :n], types[row:row + 1, :n]))[0]
        assert max_diff(batch[row, :n], alone) <= BOUND


def test_the_decoder_is_the_word_table():
    """One [Vocab, D] table in the program, no decoder param, and every checkpoint key bound:
    the checkpoint stores no decoder, so a second copy could not have been bound."""
    ctx, _ = nest.prepare("bert-base-uncased", need_weights=False)
    shapes = {path: tuple(d.as_int() for d in t.dims) for path, t in ctx.program.param_paths()}
    assert [p for p, shape in shapes.items() if sorted(shape) == [768, 30522]] == [
        "bert.encoder.embeddings.word_embeddings"]
    assert not [p for p in shapes if "decoder" in p]
    assert shapes["mlm.bias"] == (30522,)


def test_every_checkpoint_tensor_is_bound(bert_base_checkpoint):
    model = nest.load("bert-base-uncased", backend="onnx")
    assert model.info.report.unused_keys == []
    assert model.info.report.bound["mlm.bias"].key == "cls.predictions.bias"
    assert model.info.report.bound["nsp.weight"].key == "cls.seq_relationship.weight"


# ------------------------------------------------------------------ task heads at a toy size

TINY_CONFIG = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                   intermediate_size=37, max_position_embeddings=64, type_vocab_size=2)
#: Labels of the classification heads; question answering always has two (start, end).
TINY_LABELS = 3
TINY_GENERICS = {"Vocab": 99, "MaxPositions": 64, "TypeVocab": 2, "D": 32, "Heads": 4, "Inner": 37,
                 "Layers": 2}

def save_transformers_model(cls_name: str, folder: Path, seed: int = 0, num_labels: int | None = None) -> Path:
    """A randomly initialised `transformers.<cls_name>` saved by transformers itself. Every
    tensor is drawn at random, biases and LayerNorms included (their init is 0 and 1), so a
    param bound to the wrong tensor cannot go unnoticed."""
    import transformers

    torch.manual_seed(seed)
    labels = num_labels or (2 if cls_name == "BertForQuestionAnswering" else TINY_LABELS)
    model = getattr(transformers, cls_name)(transformers.BertConfig(**TINY_CONFIG, num_labels=labels))
    with torch.no_grad():
        for name, param in model.named_parameters():  # tied params come once
            param.copy_(torch.randn_like(param) * 0.1 + (1.0 if "LayerNorm.weight" in name else 0.0))
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def write_tiny_entry(folder: Path, root: str, entry: str, name: str = "") -> Path:
    """A zoo entry over the zoo's BERT source: root block, toy generics, bindings to the
    transformers layout (written from each param's path, not from the checkpoint)."""
    from linnet.cli.targets import locate
    from linnet.compiler import compile_target

    generics = {**TINY_GENERICS, **({"Labels": TINY_LABELS} if "Classification" in root else {})}
    folder.mkdir(parents=True)
    (folder / "linnet.toml").write_text('[package]\nname = "bert"\nversion = "0.1.0"\nlanguage = "0.1"\n')
    (folder / "bindings.json").write_text("{}")
    (folder / "nest.toml").write_text(
        f'[model]\nname = "{name or "tiny-" + root.lower()}"\ntitle = "Tiny {root}"\n'
        f'summary = "The zoo\'s BERT {root} block at a toy size."\nlicense = "Apache-2.0"\nfamily = "bert"\n\n'
        f'[source]\nzoo = "bert-base-uncased"\nroot = "{root}"\nentry = "{entry}"\n\n'
        "[generics]\n" + "".join(f"{k} = {v}\n" for k, v in generics.items()) + 'T = "f32"\n\n'
        f'[weights]\nrepo = "tests/tiny-bert"\nrevision = "{"0" * 40}"\nfiles = ["model.safetensors"]\n'
        'bindings = "bindings.json"\n')
    from linnet.nest.zoo import bert_bindings

    params = compile_target(locate(folder)).instance.params
    # The layout `save_pretrained` of a BertFor* model writes: `bert.` prefix, new LayerNorm names.
    bindings = bert_bindings([p.name for p in params], prefix="bert.", old_layer_norm=False)
    (folder / "bindings.json").write_text(json.dumps(bindings, indent=2))
    return folder


def _tiny_inputs(seed: int = 2):
    return _right_padded([12, 7, 3], TINY_CONFIG["vocab_size"], seed)


def _tiny_choices(seed: int = 3):
    """[B, C, S] inputs: two questions with three choices each, of different lengths."""
    tokens, types, mask = _right_padded([10, 6, 8, 3, 10, 5], TINY_CONFIG["vocab_size"], seed)
    return tuple(a.reshape(2, 3, -1) for a in (tokens, types, mask))


def _logits_per_head(root: str, out) -> dict[str, np.ndarray]:
    """transformers' outputs, under the names of our entries."""
    if root == "PreTraining":
        return {"mlm": out.prediction_logits.numpy(), "nsp": out.seq_relationship_logits.numpy()}
    if root == "MaskedLm":
        return {"mlm": out.logits.numpy()}
    if root == "QuestionAnswering":  # [..., 0] start, [..., 1] end
        return {"logits": torch.stack([out.start_logits, out.end_logits], -1).numpy()}
    return {"logits": out.logits.numpy()}


# root block -> (the transformers class it mirrors, the entry nest.toml names)
HEADS = {
    "PreTraining": ("BertForPreTraining", "mlm"),
    "MaskedLm": ("BertForMaskedLM", "mlm"),
    "SequenceClassification": ("BertForSequenceClassification", "logits"),
    "TokenClassification": ("BertForTokenClassification", "logits"),
    "QuestionAnswering": ("BertForQuestionAnswering", "logits"),
    "MultipleChoice": ("BertForMultipleChoice", "logits"),
}


@pytest.fixture(scope="module")
def tiny_heads(tmp_path_factory):
    """root -> (entry folder, checkpoint folder) for every head block."""
    made = {}
    for root, (cls_name, entry) in HEADS.items():
        base = tmp_path_factory.mktemp(root.lower())
        made[root] = (write_tiny_entry(base / "entry", root, entry), save_transformers_model(cls_name, base / "hf"))
    return made


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("root", list(HEADS))
def test_every_head_block_matches_its_transformers_class(tiny_heads, root, backend):
    import transformers

    entry, checkpoint = tiny_heads[root]
    model = nest.load(entry, backend=backend, weights=checkpoint / "model.safetensors")
    assert model.info.report.unused_keys == []  # the checkpoint holds nothing the block lacks
    reference = getattr(transformers, HEADS[root][0]).from_pretrained(checkpoint).eval()
    tokens, types, mask = _tiny_choices() if root == "MultipleChoice" else _tiny_inputs()
    expected = _logits_per_head(root, _transformers(reference, tokens, types, mask))
    for name, ref in expected.items():
        ours = _np(model.run(name, tokens, types, attention_mask=mask))
        assert ours.shape == ref.shape, name
        per_token = ours.ndim == mask.ndim + 1  # [B, S, ...] scores, not one row per sequence
        diff = _real_positions_diff(ours, ref, mask) if per_token else max_diff(ours, ref)
        print(f"{root}.{name} {backend}: {diff:.3g} (spread {ref.std():.3g})")
        assert ref.std() > 0.05 and diff <= BOUND


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_changed_word_row_moves_only_that_words_mlm_scores(tiny_heads, tmp_path, backend):
    """With the decoder tied, row K of the word table is also word K's output vector. Inputs
    without word K never look row K up, so the hidden state stays the same to the bit, and
    only column K of the masked-LM scores may move; transformers, whose decoder is tied too,
    agrees on the changed file."""
    from safetensors.numpy import load_file, save_file
    from transformers import BertForMaskedLM

    entry, checkpoint = tiny_heads["MaskedLm"]
    tokens, types, mask = _tiny_inputs()
    word = 42
    tokens[tokens == word] = word + 1
    tensors = load_file(str(checkpoint / "model.safetensors"))
    tensors["bert.embeddings.word_embeddings.weight"][word] += np.float32(0.5)
    changed = tmp_path / "changed"
    changed.mkdir()
    save_file(tensors, str(changed / "model.safetensors"), metadata={"format": "pt"})
    (changed / "config.json").write_text((checkpoint / "config.json").read_text())

    # An entry of its own for the changed file: the ONNX backend caches its export, weights
    # included, by entry and program, so the same entry would serve the old table.
    changed_entry = write_tiny_entry(tmp_path / "changed-entry", "MaskedLm", "mlm", name="tiny-maskedlm-changed")
    # kernels="default": measured choices are made per export (ONNX probes each on its own),
    # and two different ones would sum in different orders, bit-level noise in an exact check.
    before = nest.load(entry, backend=backend, weights=checkpoint / "model.safetensors", kernels="default")
    after = nest.load(changed_entry, backend=backend, weights=changed / "model.safetensors", kernels="default")
    hidden = [_np(m.run("forward", tokens, types, attention_mask=mask)) for m in (before, after)]
    assert np.array_equal(*hidden)
    mlm_before = _np(before.mlm(tokens, types, attention_mask=mask))
    mlm_after = _np(after.mlm(tokens, types, attention_mask=mask))
    moved = np.flatnonzero(np.abs(mlm_after - mlm_before).max(axis=(0, 1)))
    assert moved.tolist() == [word]
    reference = BertForMaskedLM.from_pretrained(changed).eval()
    ref = _transformers(reference, tokens, types, mask).logits.numpy()
    assert _real_positions_diff(mlm_after, ref, mask) <= BOUND


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("root", ["MaskedLm", "SequenceClassification", "TokenClassification", "QuestionAnswering"])
def test_the_full_entries_leave_position_ids_and_head_mask_out(tiny_heads, root, backend):
    """`logits_full` / `mlm_full` (`Encoder.forward_full` lifted through the head): left out,
    position_ids and head_mask are the counted positions and ones, so the entry is the head's
    main one; given position_ids, it is transformers' class given them."""
    import transformers

    entry, checkpoint = tiny_heads[root]
    model = nest.load(entry, backend=backend, weights=checkpoint / "model.safetensors")
    reference = getattr(transformers, HEADS[root][0]).from_pretrained(checkpoint).eval()
    name = HEADS[root][1]
    tokens, types, mask = _tiny_inputs(seed=5)
    positions = np.random.default_rng(6).integers(0, TINY_CONFIG["max_position_embeddings"], size=tokens.shape)
    main = _np(model.run(name, tokens, types, attention_mask=mask))
    left_out = _np(model.run(f"{name}_full", tokens, types, attention_mask=mask))
    per_token = main.ndim == mask.ndim + 1
    diff = (lambda a, b: _real_positions_diff(a, b, mask)) if per_token else max_diff
    assert diff(left_out, main) <= BOUND
    with torch.no_grad():
        out = reference(input_ids=torch.from_numpy(tokens), token_type_ids=torch.from_numpy(types),
                        attention_mask=torch.from_numpy(mask), position_ids=torch.from_numpy(positions))
    (ref,) = _logits_per_head(root, out).values()
    given = _np(model.run(f"{name}_full", tokens, types, mask, positions))
    print(f"{root}.{name}_full {backend}: {diff(given, ref):.3g}")
    assert diff(given, ref) <= BOUND and diff(given, main) > 1e-3  # the positions given are used
