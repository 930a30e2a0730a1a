"""Fine-tuning (linnet/nest/training.py): trainable torch modules, pure JAX functions, saving.

Small random `BertForPreTraining` / `BertForSequenceClassification` models written by
transformers' own `save_pretrained` are loaded through toy zoo entries over the zoo's BERT
source (as in test_heads.py) and by transformers from the same files. On a right-padded
batch with ignored labels, f32 on CPU:

* every parameter's gradient of `mlm_loss`, `nsp_loss`, `pretraining_loss` (and of a
  sequence-classification loss over the `logits` entry) equals transformers' gradient of the
  same loss within 1e-5, on torch and on JAX; the tied decoder's gradient lands on the word
  table, as transformers' does;
* 3 SGD steps give transformers' parameters within 1e-5;
* train mode drops at the configured rate (within 1%), eval mode is deterministic;
* `nest.save` writes the checkpoint's own keys, and transformers `from_pretrained` and
  `nest.load(weights=...)` of the saved folder give the trained module's outputs within 1e-5.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from linnet import nest
from linnet.diagnostics import LinnetError
from test_heads import TINY_CONFIG, _right_padded, save_transformers_model, write_tiny_entry
from test_losses import _batch

BOUND = 1e-5
VOCAB = TINY_CONFIG["vocab_size"]


def _t(*arrays):
    return tuple(torch.from_numpy(np.asarray(a)) for a in arrays)


@pytest.fixture(scope="module")
def pretraining(tmp_path_factory):
    base = tmp_path_factory.mktemp("training")
    return (write_tiny_entry(base / "entry", "PreTraining", "forward"),
            save_transformers_model("BertForPreTraining", base / "hf", seed=7))


@pytest.fixture(scope="module")
def classification(tmp_path_factory):
    base = tmp_path_factory.mktemp("training-cls")
    return (write_tiny_entry(base / "entry", "SequenceClassification", "logits"),
            save_transformers_model("BertForSequenceClassification", base / "hf", seed=8))


def _load(entry_and_checkpoint, backend: str = "torch"):
    entry, checkpoint = entry_and_checkpoint
    return nest.load(entry, backend=backend, weights=checkpoint / "model.safetensors")


def _reference(cls_name: str, checkpoint: Path):
    import transformers

    return getattr(transformers, cls_name).from_pretrained(checkpoint).eval()


def _transformers_name(key: str) -> str:
    """A checkpoint key as transformers names the param: TF-era LayerNorm `gamma`/`beta` are
    renamed `weight`/`bias` on load."""
    return key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")


def _gradient_diffs(module, reference) -> dict[str, float]:
    """Param path -> max |our grad - transformers' grad| of the same checkpoint tensor."""
    bound = module.linnet_source.report.bound
    theirs = dict(reference.named_parameters())
    diffs = {}
    for path, param in module.named_parameters():
        expected = theirs[_transformers_name(bound[path].key)].grad
        # A param the loss does not reach (the pooler, for the MLM loss) has no grad on either side.
        assert (param.grad is None) == (expected is None), path
        diffs[path] = 0.0 if expected is None else float((param.grad - expected).abs().max())
    return diffs


def _pretraining_losses(module, reference, which: str):
    tokens, types, mask, labels, next_sentence = _t(*_batch(seed=21))
    inputs = dict(input_ids=tokens, token_type_ids=types, attention_mask=mask)
    out = reference(**inputs)
    mlm = F.cross_entropy(out.prediction_logits.reshape(-1, VOCAB), labels.reshape(-1))
    nsp = F.cross_entropy(out.seq_relationship_logits, next_sentence)
    if which == "mlm_loss":
        return module.mlm_loss(**inputs, labels=labels), mlm
    if which == "nsp_loss":
        return module.nsp_loss(**inputs, next_sentence_label=next_sentence), nsp
    ours = module.pretraining_loss(**inputs, labels=labels, next_sentence_label=next_sentence)
    return ours, reference(**inputs, labels=labels, next_sentence_label=next_sentence).loss


# ------------------------------------------------------------------ the module itself


def test_params_are_named_by_path_and_require_grad(pretraining):
    model = _load(pretraining)
    module = model.torch_module()
    paths = [path for path, _ in module.linnet_source.program.param_paths()]
    names = [name for name, _ in module.named_parameters()]
    assert isinstance(module, torch.nn.Module) and not module.training
    assert sorted(names) == sorted(paths)
    assert "bert.encoder.layers.0.attention.query.weight" in names  # unfused: Q, K, V apart
    assert not [n for n in names if "fused" in n or "qkv" in n]
    assert all(p.requires_grad for p in module.parameters())
    # The word table is the MLM decoder too: one tensor, not two.
    assert not [n for n in names if "decoder" in n]
    # The inference model is untouched: its params stay frozen and are other tensors.
    frozen = list(model.runtime.model.parameters())
    assert frozen and not any(p.requires_grad for p in frozen)
    ours = dict(module.named_parameters())["bert.encoder.embeddings.word_embeddings"]
    assert all(ours.data_ptr() != p.data_ptr() for p in frozen)


def test_entries_take_names_aliases_and_equal_the_inference_model(pretraining):
    model = _load(pretraining)
    module = model.torch_module()
    tokens, types, mask, _, _ = _batch(seed=3)
    expected = model.mlm(tokens, types, attention_mask=mask).numpy()  # the optimised runtime
    with torch.no_grad():
        by_alias = module.mlm(input_ids=torch.from_numpy(tokens), token_type_ids=torch.from_numpy(types),
                              attention_mask=torch.from_numpy(mask))
        by_name = module.mlm(torch.from_numpy(tokens), token_types=torch.from_numpy(types),
                             attention_mask=torch.from_numpy(mask))
        defaulted = module(torch.from_numpy(tokens))  # `forward`, its mask and types filled as model() does
    real = mask.astype(bool)
    assert np.abs(by_alias.numpy() - expected)[real].max() <= BOUND
    assert torch.equal(by_alias, by_name)
    assert torch.equal(defaulted, module.forward(tokens=torch.from_numpy(tokens)))
    with pytest.raises(LinnetError) as raised:
        module.mlm(tokens, bogus=tokens)
    assert raised.value.code == "E0701" and "bogus" in str(raised.value)


# ------------------------------------------------------------------ gradients, torch


@pytest.mark.parametrize("loss_entry", ["mlm_loss", "nsp_loss", "pretraining_loss"])
def test_gradients_equal_transformers(pretraining, loss_entry):
    module = _load(pretraining).torch_module()
    reference = _reference("BertForPreTraining", pretraining[1])
    ours, theirs = _pretraining_losses(module, reference, loss_entry)
    assert abs(ours.item() - theirs.item()) <= BOUND
    ours.backward()
    theirs.backward()
    diffs = _gradient_diffs(module, reference)
    worst = max(diffs, key=diffs.get)
    spread = max(float(p.grad.abs().max()) for p in reference.parameters() if p.grad is not None)
    print(f"{loss_entry}: {len(diffs)} params, worst grad |diff| {diffs[worst]:.3g} at {worst} (largest grad {spread:.3g})")
    assert spread > 1e-2  # gradients of a real size, not all zero
    assert len(diffs) == len(list(reference.parameters()))
    assert diffs[worst] <= BOUND
    # tied decoder: the MLM loss reaches the word table through the decoder too
    if loss_entry != "nsp_loss":
        words = dict(module.named_parameters())["bert.encoder.embeddings.word_embeddings"].grad
        unused = sorted(set(range(VOCAB)) - set(_batch(seed=21)[0].ravel().tolist()))
        assert float(words[unused].abs().max()) > 0  # rows no input looks up still learn


def test_sequence_classification_gradients_equal_transformers(classification):
    module = _load(classification).torch_module()
    reference = _reference("BertForSequenceClassification", classification[1])
    tokens, types, mask = _right_padded([9, 4, 12, 6], VOCAB, seed=5)
    labels = torch.tensor([0, 2, 1, 2])
    logits = module.logits(*_t(tokens, types), attention_mask=torch.from_numpy(mask))
    ours = F.cross_entropy(logits, labels)
    theirs = reference(*_t(tokens), token_type_ids=torch.from_numpy(types), attention_mask=torch.from_numpy(mask),
                       labels=labels).loss
    assert abs(ours.item() - theirs.item()) <= BOUND
    ours.backward()
    theirs.backward()
    diffs = _gradient_diffs(module, reference)
    assert max(float(p.grad.abs().max()) for p in reference.parameters()) > 1e-2
    print(f"sequence classification: worst grad |diff| {max(diffs.values()):.3g} over {len(diffs)} params")
    assert len(diffs) == len(list(reference.parameters()))
    assert max(diffs.values()) <= BOUND


def test_three_sgd_steps_equal_transformers(pretraining):
    module = _load(pretraining).torch_module()
    reference = _reference("BertForPreTraining", pretraining[1])
    ours_opt = torch.optim.SGD(module.parameters(), lr=0.5)
    theirs_opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    for step in range(3):
        tokens, types, mask, labels, next_sentence = _t(*_batch(seed=30 + step))
        for opt in (ours_opt, theirs_opt):
            opt.zero_grad()
        module.pretraining_loss(tokens, types, mask, labels, next_sentence).backward()
        reference(input_ids=tokens, token_type_ids=types, attention_mask=mask, labels=labels,
                  next_sentence_label=next_sentence).loss.backward()
        ours_opt.step()
        theirs_opt.step()
    bound = module.linnet_source.report.bound
    theirs = dict(reference.named_parameters())
    start = {k: v for k, v in _safetensors(pretraining[1]).items()}
    diffs = {p: float((v.detach() - theirs[bound[p].key].detach()).abs().max()) for p, v in module.named_parameters()}
    moved = max(float(np.abs(v.detach().numpy() - start[bound[p].key]).max()) for p, v in module.named_parameters())
    print(f"3 SGD steps: worst param |diff| {max(diffs.values()):.3g}; params moved up to {moved:.3g}")
    assert moved > 1e-2 and max(diffs.values()) <= BOUND


def _safetensors(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(folder / "model.safetensors"))


# ------------------------------------------------------------------ dropout in train mode


def test_train_mode_drops_at_the_configured_rate_and_eval_is_deterministic(pretraining):
    module = _load(pretraining).torch_module()
    tokens, types, mask = _t(*_right_padded([64] * 16, VOCAB, seed=1))
    embeddings = module.bert.encoder.embeddings
    positions = torch.arange(64).expand(16, 64)
    with torch.no_grad():
        plain = embeddings(tokens, types, positions)
        assert torch.equal(plain, embeddings(tokens, types, positions))  # eval: the identity
        first = module(tokens, types, mask)
        assert torch.equal(first, module(tokens, types, mask))
        module.train()
        dropped = embeddings(tokens, types, positions)
        zeros = float((dropped == 0).float().mean())
        kept = dropped != 0
        print(f"train mode: {zeros:.4f} of {dropped.numel()} embedding outputs dropped (rate 0.1)")
        assert abs(zeros - 0.1) <= 0.01
        assert torch.allclose(dropped[kept], plain[kept] / 0.9, atol=1e-6)
        assert not torch.equal(module(tokens, types, mask), module(tokens, types, mask))
        module.eval()
        assert torch.equal(first, module(tokens, types, mask))


def test_train_mode_drops_at_a_rate_set_in_the_entry(pretraining, tmp_path):
    """`HiddenDropout = 0.3` in the entry's [generics] reaches the trainable module."""
    entry = tmp_path / "entry"
    write_tiny_entry(entry, "PreTraining", "forward", name="tiny-pretraining-dropout")
    toml = entry / "nest.toml"
    toml.write_text(toml.read_text().replace('T = "f32"\n', 'T = "f32"\nHiddenDropout = 0.3\n'))
    module = nest.load(entry, weights=pretraining[1] / "model.safetensors").torch_module().train()
    tokens, types, _ = _t(*_right_padded([64] * 16, VOCAB, seed=4))
    with torch.no_grad():
        dropped = module.bert.encoder.embeddings(tokens, types, torch.arange(64).expand(16, 64))
    zeros = float((dropped == 0).float().mean())
    print(f"HiddenDropout = 0.3: {zeros:.4f} of {dropped.numel()} dropped")
    assert abs(zeros - 0.3) <= 0.01


# ------------------------------------------------------------------ JAX


@pytest.mark.parametrize("loss_entry", ["mlm_loss", "pretraining_loss"])
def test_jax_gradients_equal_transformers(pretraining, loss_entry):
    import jax
    import jax.numpy as jnp

    model = _load(pretraining, backend="jax")
    params = model.jax_params()
    function = model.jax_function(loss_entry)
    reference = _reference("BertForPreTraining", pretraining[1])
    tokens, types, mask, labels, next_sentence = _batch(seed=21)
    inputs = [jnp.asarray(a, jnp.int32) for a in (tokens, types, mask, labels)]
    if loss_entry == "pretraining_loss":
        inputs.append(jnp.asarray(next_sentence, jnp.int32))
    loss, grads = jax.jit(jax.value_and_grad(function))(params, *inputs)
    module = _load(pretraining).torch_module()  # only for the param -> checkpoint key table
    _, theirs = _pretraining_losses(module, reference, loss_entry)
    theirs.backward()
    assert abs(float(loss) - theirs.item()) <= BOUND
    bound = module.linnet_source.report.bound
    named = dict(reference.named_parameters())
    def theirs_of(path):  # None where the loss does not reach the param: a zero gradient
        grad = named[bound[path].key].grad
        return np.zeros(named[bound[path].key].shape, np.float32) if grad is None else grad.numpy()

    diffs = {p: float(np.abs(np.asarray(g) - theirs_of(p)).max()) for p, g in grads.items()}
    print(f"jax {loss_entry}: worst grad |diff| {max(diffs.values()):.3g} over {len(diffs)} params")
    assert sorted(grads) == sorted(p for p, _ in module.named_parameters())
    assert max(diffs.values()) <= BOUND


def test_three_jax_sgd_steps_equal_transformers(pretraining):
    import jax
    import jax.numpy as jnp

    model = _load(pretraining, backend="jax")
    params = model.jax_params()
    loss = model.jax_function("pretraining_loss")
    step = jax.jit(lambda p, *inputs: jax.tree_util.tree_map(lambda w, g: w - 0.5 * g, p,
                                                             jax.grad(loss)(p, *inputs)))
    reference = _reference("BertForPreTraining", pretraining[1])
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    for seed in (30, 31, 32):
        batch = _batch(seed=seed)
        params = step(params, *(jnp.asarray(a, jnp.int32) for a in batch))
        tokens, types, mask, labels, next_sentence = _t(*batch)
        optimizer.zero_grad()
        reference(input_ids=tokens, token_type_ids=types, attention_mask=mask, labels=labels,
                  next_sentence_label=next_sentence).loss.backward()
        optimizer.step()
    bound = model.torch_module().linnet_source.report.bound
    named = dict(reference.named_parameters())
    diffs = {p: float(np.abs(np.asarray(w) - named[bound[p].key].detach().numpy()).max()) for p, w in params.items()}
    print(f"3 JAX SGD steps: worst param |diff| {max(diffs.values()):.3g} over {len(diffs)} params")
    assert max(diffs.values()) <= BOUND


def test_jax_function_drops_only_with_a_key(pretraining):
    import jax
    import jax.numpy as jnp

    model = _load(pretraining, backend="jax")
    params = model.jax_params()
    forward = jax.jit(model.jax_function())
    tokens, types, mask = (jnp.asarray(a, jnp.int32) for a in _right_padded([40] * 8, VOCAB, seed=2))
    plain = forward(params, tokens, types, mask)
    assert np.array_equal(plain, forward(params, tokens, types, mask))
    assert np.abs(np.asarray(plain) - np.asarray(model(tokens, types, mask))).max() <= BOUND
    one = forward(params, tokens, types, mask, key=jax.random.PRNGKey(0))
    again = forward(params, tokens, types, mask, key=jax.random.PRNGKey(0))
    other = forward(params, tokens, types, mask, key=jax.random.PRNGKey(1))
    assert np.array_equal(one, again) and not np.array_equal(one, other) and not np.array_equal(one, plain)
    # A training step's gradient with dropout on, under jit: finite, and drawn anew per key.
    loss = model.jax_function("mlm_loss")
    labels = jnp.where(mask == 1, tokens, -100)
    grad = jax.jit(jax.grad(lambda p, k: loss(p, tokens, types, mask, labels, key=k)))
    first, second = (grad(params, jax.random.PRNGKey(k))["bert.encoder.layers.0.up.weight"] for k in (5, 6))
    assert np.isfinite(np.asarray(first)).all() and not np.allclose(first, second)


# ------------------------------------------------------------------ saving


def _train_one_step(module):
    tokens, types, mask, labels, next_sentence = _t(*_batch(seed=40))
    optimizer = torch.optim.SGD(module.parameters(), lr=0.5)
    module.pretraining_loss(tokens, types, mask, labels, next_sentence).backward()
    optimizer.step()


def test_save_then_transformers_and_nest_load_give_the_trained_outputs(pretraining, tmp_path):
    model = _load(pretraining)
    module = model.torch_module()
    _train_one_step(module)
    written = nest.save(module, tmp_path / "tuned")
    assert written == tmp_path / "tuned" / "model.safetensors"
    source, saved = _safetensors(pretraining[1]), _safetensors(tmp_path / "tuned")
    assert sorted(saved) == sorted(source)  # the checkpoint's own keys, nothing more or less
    assert json.loads((tmp_path / "tuned" / "config.json").read_text()) == json.loads(
        (pretraining[1] / "config.json").read_text())
    tokens, types, mask, _, _ = _batch(seed=41)
    with torch.no_grad():
        trained = module.mlm(*_t(tokens, types, mask)).numpy()
        trained_nsp = module.nsp(*_t(tokens, types, mask)).numpy()
    real = mask.astype(bool)
    reloaded = _reference("BertForPreTraining", tmp_path / "tuned")
    with torch.no_grad():
        out = reloaded(*_t(tokens), token_type_ids=torch.from_numpy(types), attention_mask=torch.from_numpy(mask))
    again = nest.load(pretraining[0], weights=tmp_path / "tuned")
    diffs = {"transformers mlm": np.abs(out.prediction_logits.numpy() - trained)[real].max(),
             "transformers nsp": np.abs(out.seq_relationship_logits.numpy() - trained_nsp).max(),
             "nest.load mlm": np.abs(again.mlm(tokens, types, mask).numpy() - trained)[real].max()}
    before = model.mlm(tokens, types, mask).numpy()
    print(f"saved and reloaded: {diffs}; training moved the logits by {np.abs(before - trained)[real].max():.3g}")
    assert np.abs(before - trained)[real].max() > 1e-2
    assert max(diffs.values()) <= BOUND


def test_saving_an_untrained_model_writes_its_checkpoint_back(pretraining, tmp_path):
    saved = _safetensors(nest.save(_load(pretraining), tmp_path / "same").parent)
    source = _safetensors(pretraining[1])
    assert sorted(saved) == sorted(source)
    assert all(np.array_equal(saved[k], source[k]) and saved[k].dtype == source[k].dtype for k in source)


def test_save_keeps_gamma_beta_spelling_and_a_stored_tied_decoder(pretraining, tmp_path):
    """A TF-era checkpoint (LayerNorm `gamma`/`beta`) that also stores the MLM decoder as its
    own tensor: the saved file spells the LayerNorms as the source did and writes the decoder
    as the trained word table (transformers ties the two on load)."""
    from safetensors.numpy import save_file

    tensors = _safetensors(pretraining[1])
    renamed = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
               for k, v in tensors.items()}
    renamed["cls.predictions.decoder.weight"] = tensors["bert.embeddings.word_embeddings.weight"].copy()
    source = tmp_path / "tf-era"
    source.mkdir()
    save_file(renamed, str(source / "model.safetensors"), metadata={"format": "pt"})
    (source / "config.json").write_text((pretraining[1] / "config.json").read_text())
    module = nest.load(pretraining[0], weights=source).torch_module()
    _train_one_step(module)
    saved = _safetensors(nest.save(torch.compile(module), tmp_path / "tuned").parent)  # wrapped: saved the same
    assert sorted(saved) == sorted(renamed)
    words = dict(module.named_parameters())["bert.encoder.embeddings.word_embeddings"].detach().numpy()
    assert np.array_equal(saved["cls.predictions.decoder.weight"], words)
    assert np.array_equal(saved["bert.embeddings.word_embeddings.weight"], words)
    assert not np.array_equal(words, tensors["bert.embeddings.word_embeddings.weight"])
    assert np.array_equal(saved["bert.embeddings.LayerNorm.gamma"],
                          dict(module.named_parameters())["bert.encoder.embeddings.norm.weight"].detach().numpy())


def test_save_jax_params(pretraining, tmp_path):
    import jax

    model = _load(pretraining, backend="jax")
    params = model.jax_params()
    tuned = jax.tree_util.tree_map(lambda a: a * 1.01, params)
    nest.save(model, tmp_path / "tuned", params=tuned)
    saved = _safetensors(tmp_path / "tuned")
    bound = model.torch_module().linnet_source.report.bound
    assert all(np.array_equal(saved[bound[p].key], np.asarray(a)) for p, a in tuned.items())
    with pytest.raises(LinnetError) as raised:
        nest.save(model, tmp_path / "bad", params={"nsp.weight": params["nsp.weight"]})
    assert raised.value.code == "E1020" and "missing" in str(raised.value)
    with pytest.raises(LinnetError) as raised:
        nest.save(object(), tmp_path / "bad")
    assert raised.value.code == "E1020"


# ------------------------------------------------------------------ hf: entries


def test_an_hf_token_classifier_trains_saves_and_reloads(hf_cache, tmp_path):
    """`hf:` builds the entry from the repo's config.json (its dropout rates included); the
    trainable module's token-classification gradients equal transformers', and the saved
    folder loads in transformers and back through `hf:` with `weights=`."""
    from fixtures.hf_checkpoints import write_transformers_repo
    from transformers import BertForTokenClassification

    repo = write_transformers_repo(hf_cache, "linnet-tests/training-tokens", "BertForTokenClassification", seed=3,
                                   hidden_dropout_prob=0.25)
    model = nest.load(repo.name)
    module = model.torch_module()
    reference = BertForTokenClassification.from_pretrained(repo.snapshot).eval()
    tokens, types, mask = _right_padded([10, 6, 12], 1000, seed=6)
    labels = np.where(mask == 1, np.arange(mask.size).reshape(mask.shape) % 3, -100)
    logits = module.logits(*_t(tokens, types, mask))
    ours = F.cross_entropy(logits.reshape(-1, 3), torch.from_numpy(labels).reshape(-1))
    theirs = reference(*_t(tokens), token_type_ids=torch.from_numpy(types), attention_mask=torch.from_numpy(mask),
                       labels=torch.from_numpy(labels)).loss
    assert abs(ours.item() - theirs.item()) <= BOUND
    ours.backward()
    theirs.backward()
    diffs = _gradient_diffs(module, reference)
    print(f"hf: token classification: worst grad |diff| {max(diffs.values()):.3g} over {len(diffs)} params")
    assert max(diffs.values()) <= BOUND
    with torch.no_grad():
        dropped = module.train().encoder.embeddings(*_t(tokens, types), torch.arange(12).expand(3, 12))
        module.eval()
    assert abs(float((dropped == 0).float().mean()) - 0.25) <= 0.05  # the config's rate (only 2,304 elements)

    torch.optim.SGD(module.parameters(), lr=0.5).step()
    nest.save(module, tmp_path / "tuned")
    with torch.no_grad():
        trained = module.logits(*_t(tokens, types, mask)).numpy()
        reloaded = BertForTokenClassification.from_pretrained(tmp_path / "tuned").eval()
        out = reloaded(*_t(tokens), token_type_ids=torch.from_numpy(types), attention_mask=torch.from_numpy(mask))
    again = nest.load(repo.name, weights=tmp_path / "tuned").logits(tokens, types, mask).numpy()
    real = mask.astype(bool)
    before = model.logits(tokens, types, mask).numpy()
    assert np.abs(before - trained)[real].max() > 1e-2
    assert np.abs(out.logits.numpy() - trained)[real].max() <= BOUND
    assert np.abs(again - trained)[real].max() <= BOUND


# ------------------------------------------------------------------ beyond BERT


def test_gpt2_language_model_gradients_equal_transformers(tmp_path):
    """Nothing in torch_module() is BERT's: a tiny GPT-2 (Conv1D weights, the LM head tied to
    `wte`) fine-tunes with transformers' causal-LM loss, computed over the `forward` logits."""
    from fixtures.gpt2 import save_gpt2, write_tiny_entry as write_gpt2_entry

    reference = save_gpt2(tmp_path / "hf", seed=2)
    module = nest.load(write_gpt2_entry(tmp_path / "entry"), weights=tmp_path / "hf" / "model.safetensors").torch_module()
    vocab = reference.config.vocab_size
    ids = torch.from_numpy(np.random.default_rng(3).integers(0, vocab, (2, 12)))
    mask = torch.ones_like(ids)
    logits = module(input_ids=ids, attention_mask=mask)
    ours = F.cross_entropy(logits[:, :-1].reshape(-1, vocab), ids[:, 1:].reshape(-1))
    theirs = reference(input_ids=ids, attention_mask=mask, labels=ids).loss
    assert abs(ours.item() - theirs.item()) <= BOUND
    ours.backward()
    theirs.backward()
    named = dict(reference.named_parameters())
    bound = module.linnet_source.report.bound
    # The checkpoint's keys may or may not carry GPT2LMHeadModel's `transformer.` prefix.
    theirs = {path: named.get(bound[path].key, named.get(f"transformer.{bound[path].key}")) for path in bound}
    diffs = {path: float((param.grad - theirs[path].grad).abs().max()) for path, param in module.named_parameters()}
    print(f"gpt2: worst grad |diff| {max(diffs.values()):.3g} over {len(diffs)} params")
    assert len(diffs) == len(named) and max(diffs.values()) <= BOUND


def test_a_float_input_keeps_its_gradient_vit(hf_cache, tmp_path):
    """A float input given as a tensor is passed on as itself: the gradient of a small ViT's
    loss reaches the pixels as transformers' does."""
    from fixtures.vit_checkpoints import write_small_vit_repo

    vit = write_small_vit_repo(hf_cache, tmp_path / "vit-small", repo="linnet-tests/vit-training")
    model = nest.load(vit.entry)
    module = model.torch_module()
    entry = module.linnet_source.program.entries[model.manifest.source.entry]
    images = torch.from_numpy(np.random.default_rng(1).uniform(-1, 1, (2, 3, 32, 32)).astype(np.float32))
    ours_pixels, theirs_pixels = images.clone().requires_grad_(True), images.clone().requires_grad_(True)
    labels = torch.tensor([2, 0])
    ours = F.cross_entropy(module(ours_pixels), labels)
    theirs = vit.model(pixel_values=theirs_pixels, labels=labels).loss
    assert entry.inputs[0][1].dtype == "f32" and abs(ours.item() - theirs.item()) <= BOUND
    ours.backward()
    theirs.backward()
    assert ours_pixels.grad is not None and float(ours_pixels.grad.abs().max()) > 1e-4
    assert float((ours_pixels.grad - theirs_pixels.grad).abs().max()) <= BOUND
    # (transformers renames ViT's params on load, so they are not compared one by one here;
    # the pixel gradient runs back through every one of them.)
    assert all(p.grad is not None for p in module.parameters())
    print(f"vit: pixel grad |diff| {float((ours_pixels.grad - theirs_pixels.grad).abs().max()):.3g}")


# ------------------------------------------------------------------ full size


def test_bert_base_full_size_gradients_and_save(bert_base_checkpoint, tmp_path):
    """The zoo's bert-base-uncased on the full-size synthetic checkpoint (TF-era `gamma`/`beta`
    names, the tied decoder not stored): every param's gradient of `pretraining_loss` equals
    transformers' within 1e-5, and the saved folder keeps the checkpoint's keys and loads in
    transformers with the trained outputs."""
    from fixtures.checkpoints import BERT_BASE_REPO, BERT_BASE_REVISION
    from transformers import BertForPreTraining

    model = nest.load("bert-base-uncased", kernels="default")  # torch_module() compiles its own program
    module = model.torch_module()
    reference = BertForPreTraining.from_pretrained(BERT_BASE_REPO, revision=BERT_BASE_REVISION,
                                                   dtype=torch.float32).eval()
    tokens, types, mask = _right_padded([10, 6], 30522, seed=12)
    labels = np.where((np.arange(mask.size).reshape(mask.shape) % 3 == 0) & (mask == 1), tokens, -100)
    next_sentence = np.array([1, 0])
    inputs = _t(tokens, types, mask, labels, next_sentence)
    ours = module.pretraining_loss(*inputs)
    theirs = reference(input_ids=inputs[0], token_type_ids=inputs[1], attention_mask=inputs[2], labels=inputs[3],
                       next_sentence_label=inputs[4]).loss
    assert abs(ours.item() - theirs.item()) <= BOUND
    ours.backward()
    theirs.backward()
    diffs = _gradient_diffs(module, reference)
    print(f"bert-base full size: worst grad |diff| {max(diffs.values()):.3g} over {len(diffs)} params")
    assert len(diffs) == len(list(reference.parameters())) and max(diffs.values()) <= BOUND
    del reference

    torch.optim.SGD(module.parameters(), lr=1.0).step()
    folder = nest.save(module, tmp_path / "tuned").parent
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), framework="numpy") as saved, \
            safe_open(str(model.info.files[0]), framework="numpy") as source:
        assert sorted(saved.keys()) == sorted(source.keys())
        assert "bert.encoder.layer.11.output.LayerNorm.gamma" in saved.keys()  # the source's spelling
    with torch.no_grad():
        trained = module.nsp(*inputs[:3]).numpy()
        reloaded = BertForPreTraining.from_pretrained(folder, dtype=torch.float32).eval()
        out = reloaded(input_ids=inputs[0], token_type_ids=inputs[1], attention_mask=inputs[2])
    assert np.abs(model.nsp(tokens, types, mask) - trained).max() > 1e-3  # the step moved it
    assert np.abs(out.seq_relationship_logits.numpy() - trained).max() <= BOUND
