"""`nest.load("hf:owner/name")`: entries built from a repo's config.json and checkpoint.

The checkpoints are written by transformers itself (`save_pretrained` of random `BertFor*`
models, see fixtures/hf_checkpoints.py) into the offline test hub cache, and every head is
compared with the transformers model that wrote it, on a right-padded batch.  The error
tests assert what each message says, not only its code.
"""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from fixtures.hf_checkpoints import (
    ARCHITECTURES,
    DROP,
    LABELS,
    SMALL,
    build_model,
    config_dict,
    fake_commit,
    old_style,
    state_arrays,
    write_raw_repo,
    write_transformers_repo,
)
from fixtures.parity import max_diff
from linnet import nest
from linnet.diagnostics import LinnetError
from linnet.nest import hf
from linnet.nest.families import bert as bert_family

TOLERANCE = 1e-5
BATCH, SEQ, CHOICES = 2, 12, 3
#: Real tokens per row: the second row is padded on the right, as tokenizers pad.
LENGTHS = (SEQ, 8)

BACKENDS = ["torch", "onnx", "jax"]


def raises(code: str, call, *args, **kwargs) -> LinnetError:
    with pytest.raises(LinnetError) as caught:
        call(*args, **kwargs)
    assert caught.value.code == code, caught.value.render()
    return caught.value


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def repos(hf_cache):
    """One repo per architecture, each written by transformers' save_pretrained."""
    return {arch: write_transformers_repo(hf_cache, f"linnet-tests/{arch.lower()}", arch, seed=i)
            for i, arch in enumerate(ARCHITECTURES)}


def _inputs(shape: tuple[int, ...], seed: int = 0) -> dict[str, np.ndarray]:
    """Random tokens, two segments, and right padding (the last axis is the sequence)."""
    rng = np.random.default_rng(seed)
    seq = shape[-1]
    tokens = rng.integers(0, SMALL["vocab_size"], size=shape).astype(np.int32)
    token_types = np.zeros(shape, np.int32)
    token_types[..., seq // 2:] = 1
    mask = np.ones(shape, np.int32)
    flat = mask.reshape(-1, seq)
    for row, length in enumerate(LENGTHS * (flat.shape[0] // len(LENGTHS))):
        flat[row, length:] = 0
    tokens[mask == 0] = 0  # [PAD]
    return {"tokens": tokens, "token_types": token_types, "attention_mask": mask}


def _reference(model, inputs: dict[str, np.ndarray]):
    import torch

    with torch.no_grad():
        return model(input_ids=torch.from_numpy(inputs["tokens"]).long(),
                     token_type_ids=torch.from_numpy(inputs["token_types"]).long(),
                     attention_mask=torch.from_numpy(inputs["attention_mask"]).long())


def _real(values, mask: np.ndarray) -> np.ndarray:
    """Per-token outputs at the real (unpadded) positions only: transformers gives padding
    positions arange positions where Linnet counts real tokens, so only these must agree."""
    return np.asarray(values)[mask.astype(bool)]


def _head_pairs(arch: str, model, ref_model) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """For each head of `arch`: (Linnet's output, transformers') on the same padded batch."""
    shape = (BATCH, CHOICES, SEQ) if arch == "BertForMultipleChoice" else (BATCH, SEQ)
    inputs = _inputs(shape)
    mask = inputs["attention_mask"]
    ref = _reference(ref_model, inputs)
    if arch == "BertModel":
        return {"hidden": (_real(model.forward(**inputs), mask), _real(ref.last_hidden_state, mask)),
                "pooled": (model.pool(**inputs), ref.pooler_output)}
    if arch == "BertForPreTraining":
        return {"mlm": (_real(model.mlm(**inputs), mask), _real(ref.prediction_logits, mask)),
                "nsp": (model.nsp(**inputs), ref.seq_relationship_logits)}
    if arch == "BertForMaskedLM":
        return {"mlm": (_real(model.mlm(**inputs), mask), _real(ref.logits, mask))}
    if arch == "BertForTokenClassification":
        return {"logits": (_real(model.logits(**inputs), mask), _real(ref.logits, mask))}
    if arch == "BertForQuestionAnswering":
        span = np.asarray(model.logits(**inputs))
        return {"start": (_real(span[..., 0], mask), _real(ref.start_logits, mask)),
                "end": (_real(span[..., 1], mask), _real(ref.end_logits, mask))}
    return {"logits": (model.logits(**inputs), ref.logits)}  # sequence classification, multiple choice


def _as_numpy(value) -> np.ndarray:
    if hasattr(value, "detach"):
        return value.detach().cpu().numpy()
    return np.asarray(value)


# --------------------------------------------------------------------------- parity


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_every_head_matches_transformers(repos, arch, backend):
    repo = repos[arch]
    model = nest.load(repo.name, backend=backend)
    assert model.manifest.source.root == bert_family.BertFamily.architectures[arch]
    pairs = _head_pairs(arch, model, repo.model)
    for head, (ours, theirs) in pairs.items():
        ours, theirs = _as_numpy(ours), _as_numpy(theirs)
        assert ours.shape == theirs.shape, head
        diff = max_diff(ours, theirs)
        print(f"hf parity {arch} {head} {backend}: max |diff| {diff:.2e}")  # shown with -s
        assert diff <= TOLERANCE, f"{arch} {head} on {backend}: max |diff| {diff:.3g}"


def test_stablehlo_runs_an_hf_entry_too(repos):
    """StableHLO reads the generated bindings file itself (its artifact holds no weights)."""
    repo = repos["BertForTokenClassification"]
    (ours, theirs), = _head_pairs("BertForTokenClassification", nest.load(repo.name, backend="stablehlo"),
                                  repo.model).values()
    assert max_diff(_as_numpy(ours), _as_numpy(theirs)) <= TOLERANCE


def test_the_root_entry_is_what_the_class_is_for(repos):
    model = nest.load(repos["BertForSequenceClassification"].name, backend="torch")
    inputs = _inputs((BATCH, SEQ))
    np.testing.assert_array_equal(_as_numpy(model(**inputs)), _as_numpy(model.logits(**inputs)))
    assert nest.load(repos["BertForMaskedLM"].name).manifest.source.entry == "mlm"
    assert nest.load(repos["BertModel"].name).manifest.source.entry == "forward"


def test_labels_come_from_id2label(repos):
    assert nest.load(repos["BertForSequenceClassification"].name).labels == LABELS
    assert nest.load(repos["BertForTokenClassification"].name).labels == LABELS
    assert nest.load(repos["BertForQuestionAnswering"].name).labels is None


def test_num_labels_without_id2label_gives_transformers_default_names(hf_cache):
    model = build_model("BertForSequenceClassification", seed=5, num_labels=4, id2label=None, label2id=None)
    config = {**config_dict("BertForSequenceClassification"), "num_labels": 4}
    del config["id2label"], config["label2id"]
    repo = write_raw_repo(hf_cache, "linnet-tests/num-labels", config, state_arrays(model))
    loaded = nest.load(repo.name)
    assert loaded.labels == ("LABEL_0", "LABEL_1", "LABEL_2", "LABEL_3")
    inputs = _inputs((BATCH, SEQ))
    assert max_diff(_as_numpy(loaded.logits(**inputs)), _reference(model, inputs).logits) <= TOLERANCE


def test_a_sharded_checkpoint_loads(hf_cache):
    repo = write_transformers_repo(hf_cache, "linnet-tests/sharded", "BertForSequenceClassification",
                                   seed=11, max_shard_size="100KB")
    assert (repo.snapshot / "model.safetensors.index.json").is_file()
    assert len(list(repo.snapshot.glob("model-*.safetensors"))) > 1
    model = nest.load(repo.name)
    assert len(model.info.files) > 1
    (ours, theirs), = _head_pairs("BertForSequenceClassification", model, repo.model).values()
    assert max_diff(_as_numpy(ours), theirs) <= TOLERANCE


def test_an_old_style_checkpoint_loads(hf_cache):
    """TF-era names (LayerNorm gamma/beta, the `bert.` prefix, a stored position_ids buffer)
    and a transformers-4 config (`torch_dtype`)."""
    model = build_model("BertForPreTraining", seed=7)
    arrays = old_style(state_arrays(model))
    assert "bert.embeddings.LayerNorm.gamma" in arrays and "bert.embeddings.LayerNorm.weight" not in arrays
    config = config_dict("BertForPreTraining", dtype=DROP, torch_dtype="float32")
    repo = write_raw_repo(hf_cache, "linnet-tests/old-style", config, arrays)
    loaded = nest.load(repo.name, backend="torch")
    bound = {info.key for info in loaded.info.report.bound.values()}
    assert "bert.encoder.layer.1.output.LayerNorm.beta" in bound
    assert "bert.embeddings.position_ids" in loaded.info.report.unused_keys
    for head, (ours, theirs) in _head_pairs("BertForPreTraining", loaded, model).items():
        assert max_diff(_as_numpy(ours), _as_numpy(theirs)) <= TOLERANCE, head


def test_a_stored_decoder_equal_to_the_word_embeddings_is_accepted(hf_cache):
    model = build_model("BertForMaskedLM", seed=8)
    arrays = state_arrays(model)
    arrays["cls.predictions.decoder.weight"] = arrays["bert.embeddings.word_embeddings.weight"].copy()
    repo = write_raw_repo(hf_cache, "linnet-tests/stored-decoder", config_dict("BertForMaskedLM"), arrays)
    loaded = nest.load(repo.name)
    (ours, theirs), = _head_pairs("BertForMaskedLM", loaded, model).values()
    assert max_diff(_as_numpy(ours), theirs) <= TOLERANCE


def test_weights_binds_local_files_under_the_repos_config(repos, tmp_path):
    other = build_model("BertForSequenceClassification", seed=41)
    other.save_pretrained(tmp_path, safe_serialization=True)
    model = nest.load(repos["BertForSequenceClassification"].name, weights=tmp_path)
    assert model.info.files == [tmp_path / "model.safetensors"]
    (ours, theirs), = _head_pairs("BertForSequenceClassification", model, other).values()
    assert max_diff(_as_numpy(ours), theirs) <= TOLERANCE


def test_revision_selects_the_commit(hf_cache):
    repo_id = "linnet-tests/two-revisions"
    first = write_transformers_repo(hf_cache, repo_id, "BertForSequenceClassification", seed=21,
                                    revision=fake_commit(repo_id, "first"))
    second = write_transformers_repo(hf_cache, repo_id, "BertForSequenceClassification", seed=22,
                                     revision=fake_commit(repo_id, "second"))  # refs/main now
    inputs = _inputs((BATCH, SEQ))
    for revision, written in ((first.revision, first), (None, second)):
        model = nest.load(f"hf:{repo_id}", revision=revision)
        assert model.manifest.weights.revision == written.revision
        assert max_diff(_as_numpy(model.logits(**inputs)), _reference(written.model, inputs).logits) <= TOLERANCE


def test_sizes_are_part_of_the_compile_key(hf_cache):
    """One repo, two revisions at different sizes: each load gets its own compiled program
    (a program reused from the first would not fit the second's checkpoint)."""
    from dataclasses import replace

    from linnet.nest import _compile_key

    repo_id = "linnet-tests/resized"
    labels = {i: f"l{i}" for i in range(5)}
    three = write_transformers_repo(hf_cache, repo_id, "BertForSequenceClassification", seed=31,
                                    revision=fake_commit(repo_id, "three"))
    five = write_transformers_repo(hf_cache, repo_id, "BertForSequenceClassification", seed=32,
                                   revision=fake_commit(repo_id, "five"), num_labels=5, id2label=labels,
                                   label2id={v: k for k, v in labels.items()})
    inputs = _inputs((BATCH, SEQ))
    for written, count in ((three, 3), (five, 5)):
        model = nest.load(written.name, revision=written.revision)
        assert model.manifest.generics["Labels"] == count and len(model.labels) == count
        ours, theirs = _as_numpy(model.logits(**inputs)), _reference(written.model, inputs).logits
        assert ours.shape == (BATCH, count) and max_diff(ours, theirs) <= TOLERANCE
    manifest = model.manifest
    resized = replace(manifest, generics={**manifest.generics, "Labels": 7})
    assert _compile_key(manifest, None, None, ()) != _compile_key(resized, None, None, ())


def test_the_generated_bindings_follow_the_mapping_table(repos):
    model = nest.load(repos["BertForPreTraining"].name)
    bindings = json.loads(model.manifest.weights.bindings.read_text())
    layer0, layer1 = "bert.encoder.layer.0", "bert.encoder.layer.1"
    assert bindings["bert.encoder.layers.1.attention.query.weight"] == f"{layer1}.attention.self.query.weight"
    assert bindings["bert.encoder.layers.0.attention.out.bias"] == f"{layer0}.attention.output.dense.bias"
    assert bindings["bert.encoder.layers.0.attention_norm.weight"] == f"{layer0}.attention.output.LayerNorm.weight"
    assert bindings["bert.encoder.layers.1.up.weight"] == "bert.encoder.layer.1.intermediate.dense.weight"
    assert bindings["bert.encoder.layers.1.down.bias"] == "bert.encoder.layer.1.output.dense.bias"
    assert bindings["mlm.norm.bias"] == "cls.predictions.transform.LayerNorm.bias"
    assert bindings["nsp.weight"] == "cls.seq_relationship.weight"
    assert not any("decoder" in key for key in bindings.values())
    plain = json.loads(nest.load(repos["BertModel"].name).manifest.weights.bindings.read_text())
    assert plain["encoder.embeddings.norm.weight"] == "embeddings.LayerNorm.weight"
    assert plain["pooler.dense.weight"] == "pooler.dense.weight"


def _labels_for(arch: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """transformers' label arguments for `arch`, ignoring some targets as collators do."""
    mask = inputs["attention_mask"]
    if arch == "BertForTokenClassification":
        labels = (np.arange(mask.size).reshape(mask.shape) % len(LABELS))
        labels[mask == 0] = -100
        labels[:, 1] = -100
        return {"labels": labels}
    if arch == "BertForQuestionAnswering":  # one answer inside, one past the window (skipped)
        return {"start_positions": np.array([2, SEQ + 3]), "end_positions": np.array([5, -1])}
    if arch == "BertForMultipleChoice":
        return {"labels": np.array([2, 0])}
    return {"labels": np.array([1, -100])}


def _reference_loss(model, inputs: dict[str, np.ndarray], labels: dict[str, np.ndarray]) -> float:
    """transformers' `outputs.loss`, given the positions Linnet counts (real tokens only), so
    the logits at padding agree too (question answering's softmax runs over them)."""
    import torch

    mask = inputs["attention_mask"]
    positions = np.maximum(np.cumsum(mask != 0, axis=-1) - 1, 0)
    t = lambda a: torch.from_numpy(np.asarray(a)).long()  # noqa: E731
    with torch.no_grad():
        return float(model(input_ids=t(inputs["tokens"]), token_type_ids=t(inputs["token_types"]),
                           attention_mask=t(mask), position_ids=t(positions),
                           **{k: t(v) for k, v in labels.items()}).loss)


LOSS_HEADS = ("BertForSequenceClassification", "BertForTokenClassification", "BertForQuestionAnswering",
              "BertForMultipleChoice")


@pytest.mark.parametrize("backend", ["torch", "onnx"])
@pytest.mark.parametrize("arch", LOSS_HEADS)
def test_every_head_has_transformers_loss(repos, arch, backend):
    repo = repos[arch]
    model = nest.load(repo.name, backend=backend)
    inputs = _inputs((BATCH, CHOICES, SEQ) if arch == "BertForMultipleChoice" else (BATCH, SEQ))
    labels = _labels_for(arch, inputs)
    expected = _reference_loss(repo.model, inputs, labels)
    ours = _as_numpy(model.loss(input_ids=inputs["tokens"], token_type_ids=inputs["token_types"],
                                attention_mask=inputs["attention_mask"], **labels))
    print(f"hf loss {arch} {backend}: {float(ours):.6f} vs {expected:.6f}")
    assert ours.shape == () and np.isfinite(expected) and expected > 0.01
    assert abs(float(ours) - expected) <= TOLERANCE


def test_one_label_is_a_regressor_with_mse_loss(hf_cache):
    """num_labels == 1: transformers infers problem_type "regression"; hf: picks the
    SequenceRegression root, whose `loss` takes float targets."""
    repo = write_transformers_repo(hf_cache, "linnet-tests/regressor", "BertForSequenceClassification", seed=9,
                                   id2label={0: "score"}, label2id={"score": 0})
    model = nest.load(repo.name, backend="torch")
    assert model.manifest.source.root == "SequenceRegression" and model.labels == ("score",)
    inputs = _inputs((BATCH, SEQ))
    scores = np.array([0.5, -2.0], np.float32)
    import torch

    with torch.no_grad():
        expected = float(repo.model(input_ids=torch.from_numpy(inputs["tokens"]).long(),
                                    token_type_ids=torch.from_numpy(inputs["token_types"]).long(),
                                    attention_mask=torch.from_numpy(inputs["attention_mask"]).long(),
                                    labels=torch.from_numpy(scores)).loss)
    assert max_diff(_as_numpy(model.logits(**inputs)), _reference(repo.model, inputs).logits) <= TOLERANCE
    ours = float(_as_numpy(model.loss(**inputs, labels=scores)))
    print(f"hf regression loss: {ours:.6f} vs {expected:.6f}")
    assert expected > 0.01 and abs(ours - expected) <= TOLERANCE


#: transformers' `hidden_act` -> the `Activation` member the adapter must set (transformers'
#: ACT2FN: "swish" is SiLU, "gelu_new" and "gelu_pytorch_tanh" the tanh approximation).
HIDDEN_ACTS = {"relu": "relu", "silu": "silu", "swish": "silu", "gelu_new": "gelu_tanh",
               "gelu_pytorch_tanh": "gelu_tanh"}


@pytest.fixture(scope="module")
def activation_repos(hf_cache):
    """A masked-LM repo per `hidden_act`: the activation runs in every feed-forward layer and
    in the masked-LM head's transform, so both places are compared."""
    return {act: write_transformers_repo(hf_cache, f"linnet-tests/act-{act.replace('_', '-')}", "BertForMaskedLM",
                                         seed=30 + i, hidden_act=act)
            for i, act in enumerate(HIDDEN_ACTS)}


@pytest.mark.parametrize("backend", BACKENDS + ["stablehlo"])
@pytest.mark.parametrize("act", HIDDEN_ACTS)
def test_every_supported_hidden_act_matches_transformers(activation_repos, act, backend):
    repo = activation_repos[act]
    model = nest.load(repo.name, backend=backend)
    assert model.manifest.generics["HiddenAct"] == HIDDEN_ACTS[act]
    inputs = _inputs((BATCH, SEQ), seed=3)
    mask = inputs["attention_mask"]
    ours, theirs = _real(_as_numpy(model.mlm(**inputs)), mask), _real(_reference(repo.model, inputs).logits, mask)
    diff = max_diff(ours, theirs)
    print(f"hf hidden_act {act} {backend}: max |diff| {diff:.2e}")
    assert diff <= TOLERANCE


def test_the_activation_changes_the_outputs(activation_repos):
    """The relu repo's weights under transformers' default "gelu" give other logits than
    ours: the generic reaches the generated code, it is not the old GELU under another name."""
    relu = activation_repos["relu"]
    model = nest.load(relu.name, backend="torch")
    as_gelu = build_model("BertForMaskedLM", 0, hidden_act="gelu")
    as_gelu.load_state_dict(relu.model.state_dict())
    inputs = _inputs((BATCH, SEQ), seed=3)
    mask = inputs["attention_mask"]
    assert max_diff(_real(_as_numpy(model.mlm(**inputs)), mask), _real(_reference(as_gelu, inputs).logits, mask)) > 1e-3


# --------------------------------------------------------------------------- errors


def _config_repo(hf_cache, repo: str, **overrides):
    """A repo with only a config.json: errors in it are found before any checkpoint is read."""
    return write_raw_repo(hf_cache, f"linnet-tests/{repo}", config_dict("BertForSequenceClassification", **overrides))


def test_codes_are_documented_in_this_module():
    assert all(re.fullmatch(r"E11\d\d", code) and meaning for code, meaning in hf.CODES.items())


def test_missing_config_field_names_the_field_and_the_file(hf_cache):
    repo = _config_repo(hf_cache, "no-hidden-size", hidden_size=DROP)
    err = raises("E1103", nest.load, repo.name)
    text = err.render()
    assert "config.json has no `hidden_size`" in text
    assert str(repo.snapshot / "config.json") in text
    assert len(err.diagnostics) == 1


def test_every_config_problem_is_reported_at_once(hf_cache):
    repo = _config_repo(hf_cache, "several-problems", num_hidden_layers=DROP, intermediate_size="wide",
                        hidden_act="gelu_fast")
    err = raises("E1103", nest.load, repo.name)
    messages = [d.message for d in err.diagnostics]
    assert any("has no `num_hidden_layers`" in m for m in messages)
    assert any('`intermediate_size` must be a positive integer' in m and '"wide"' in m for m in messages)
    assert any(d.code == "E1106" and 'hidden_act = "gelu_fast"' in d.message for d in err.diagnostics)


def test_unknown_architecture_lists_the_supported_ones(hf_cache):
    repo = _config_repo(hf_cache, "lm-head", architectures=["BertLMHeadModel"])
    text = raises("E1105", nest.load, repo.name).render()
    assert 'names architecture "BertLMHeadModel", which hf: cannot build' in text
    assert "supported BERT architectures: " + ", ".join(ARCHITECTURES) in text


def test_missing_architectures_is_a_missing_field(hf_cache):
    repo = _config_repo(hf_cache, "no-architectures", architectures=DROP)
    assert "config.json has no `architectures`" in raises("E1103", nest.load, repo.name).render()


def test_another_model_type_is_refused(hf_cache):
    repo = _config_repo(hf_cache, "roberta", model_type="roberta")
    text = raises("E1104", nest.load, repo.name).render()
    assert 'model_type "roberta", which no Linnet source reads' in text and '"bert"' in text


@pytest.mark.parametrize("field, value, says", [
    ("hidden_act", "gelu_fast", 'hidden_act = "gelu_fast"; the BERT source computes "gelu", "gelu_new", '
                                '"gelu_pytorch_tanh", "relu", "silu", "swish" only'),
    ("hidden_act", "mish", 'hidden_act = "mish"'),
    ("position_embedding_type", "relative_key", 'position_embedding_type = "relative_key"'),
    ("is_decoder", True, "is_decoder = true"),
    ("add_cross_attention", True, "add_cross_attention = true"),
    ("num_attention_heads", 5, "hidden_size 64, which 5 attention heads cannot share equally"),
])
def test_what_the_source_cannot_compute_is_refused(hf_cache, field, value, says):
    repo = _config_repo(hf_cache, f"unsupported-{field}-{value}".lower().replace(".", ""), **{field: value})
    assert says in raises("E1106", nest.load, repo.name).render()


def test_layer_norm_eps_is_the_configs(hf_cache):
    """`layer_norm_eps` becomes the source's `Eps` generic: another epsilon loads and runs
    with it (outputs compared with transformers), a non-positive one is refused."""
    repo = write_transformers_repo(hf_cache, "linnet-tests/eps-1e-5", "BertModel", seed=41, layer_norm_eps=1e-5)
    model = nest.load(repo.name, backend="torch")
    assert model.manifest.generics["Eps"] == 1e-5
    inputs = _inputs((BATCH, SEQ), seed=4)
    mask = inputs["attention_mask"]
    assert max_diff(_real(_as_numpy(model.forward(**inputs)), mask),
                    _real(_reference(repo.model, inputs).last_hidden_state, mask)) <= TOLERANCE
    bad = _config_repo(hf_cache, "eps-negative", layer_norm_eps=-1.0)
    assert "`layer_norm_eps` must be a positive number" in raises("E1103", nest.load, bad.name).render()


def test_a_missing_checkpoint_key_is_named(hf_cache):
    model = build_model("BertForSequenceClassification", seed=9)
    arrays = state_arrays(model)
    del arrays["classifier.weight"], arrays["bert.encoder.layer.1.output.dense.bias"]
    repo = write_raw_repo(hf_cache, "linnet-tests/missing-key", config_dict("BertForSequenceClassification"), arrays)
    text = raises("E1008", nest.load, repo.name).render()
    assert "the checkpoint lacks 2 tensors that BertForSequenceClassification needs" in text
    assert "bert.encoder.layer.1.output.dense.bias" in text and "classifier.weight" in text
    assert "stores param classifier.weight as classifier.weight" in text


def test_a_label_count_the_checkpoint_disagrees_with_is_a_shape_error(hf_cache):
    model = build_model("BertForSequenceClassification", seed=10)
    labels = {str(i): f"l{i}" for i in range(5)}
    repo = write_raw_repo(hf_cache, "linnet-tests/wrong-labels",
                          config_dict("BertForSequenceClassification", id2label=labels), state_arrays(model))
    text = raises("E1009", nest.load, repo.name).render()
    assert "classifier.weight: Tensor[5, 64; f32] but checkpoint key classifier.weight is [3, 64] F32" in text


def test_an_untied_decoder_is_refused(hf_cache):
    model = build_model("BertForMaskedLM", seed=12)
    arrays = state_arrays(model)
    arrays["cls.predictions.decoder.weight"] = arrays["bert.embeddings.word_embeddings.weight"] + 1
    repo = write_raw_repo(hf_cache, "linnet-tests/untied", config_dict("BertForMaskedLM"), arrays)
    text = raises("E1108", nest.load, repo.name).render()
    assert "cls.predictions.decoder.weight differs from its embeddings bert.embeddings.word_embeddings.weight" in text


def test_offline_and_not_cached(hf_cache):
    text = raises("E1001", nest.load, "hf:linnet-tests/never-written").render()
    assert ("config file linnet-tests/never-written/config.json at revision main is not in the "
            "Hugging Face cache") in text
    assert "HF_HUB_OFFLINE=1" in text


def test_a_config_without_a_checkpoint_says_neither_form_is_cached(hf_cache):
    repo = _config_repo(hf_cache, "config-only")
    text = raises("E1001", nest.load, repo.name).render()
    assert "linnet-tests/config-only/model.safetensors" in text
    assert "nor is model.safetensors.index.json" in text


@pytest.mark.parametrize("name", ["hf:", "hf:a/b/c", "hf:../x", "hf:owner/ name"])
def test_a_malformed_name_is_refused(name):
    assert 'expected "hf:owner/name"' in raises("E1101", nest.load, name).render()


def test_a_config_that_is_not_json(hf_cache):
    repo = write_raw_repo(hf_cache, "linnet-tests/not-json", {})
    (repo.snapshot / "config.json").resolve().write_text("{not json")
    assert "config.json cannot be read as JSON" in raises("E1102", nest.load, repo.name).render()


# --------------------------------------------------------------------------- tokenizer


def _word_vocab() -> list[str]:
    """BERT's special tokens, then 995 cased words and word pieces: a 1000-entry vocab.txt."""
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", "?", "!"]
    stems = ["Good", "good", "film", "Film", "bad", "plot", "the", "The", "was", "is", "a", "great"]
    words += stems + [f"##{s.lower()}" for s in stems]
    words += [f"w{i}" for i in range(1000 - len(words))]
    return words


@pytest.mark.parametrize("lowercase", [False, True])
def test_an_hf_repo_with_a_vocab_gets_its_tokenizer(hf_cache, lowercase):
    import torch
    from fixtures.checkpoints import _Snapshot
    from transformers import BertTokenizer

    repo = write_transformers_repo(hf_cache, f"linnet-test/classifier-vocab-{lowercase}",
                                   "BertForSequenceClassification", seed=8)
    snapshot = _Snapshot(hf_cache, repo.repo, repo.revision)
    snapshot.add_bytes("vocab.txt", ("\n".join(_word_vocab()) + "\n").encode())
    snapshot.add_bytes("tokenizer_config.json", json.dumps({"do_lower_case": lowercase}).encode())
    model = nest.load(repo.name, backend="torch")
    texts = ["The film was great!", "Good plot, bad film?"]
    batch = model.tokenizer(texts)
    expected = BertTokenizer.from_pretrained(str(snapshot.dir))(texts, padding=True)
    assert batch.tokens.tolist() == expected["input_ids"]
    assert batch.attention_mask.tolist() == expected["attention_mask"]
    with torch.inference_mode():
        reference = repo.model(**{k: torch.tensor(v) for k, v in expected.items()}).logits.numpy()
    assert max_diff(_as_numpy(model.logits(**batch)), reference) <= 1e-5


def test_an_hf_repo_without_tokenizer_files_still_loads(repos):
    model = nest.load(repos["BertModel"].name, backend="torch")
    assert model.manifest.tokenizer is None
    with pytest.raises(LinnetError) as info:
        model.tokenizer
    assert info.value.code == "E1202"
