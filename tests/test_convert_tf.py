"""`linnet convert-tf`: a google-research/bert TensorFlow checkpoint as safetensors.

The checkpoint in fixtures/tf_bert/ was written by TensorFlow 2.21 (`tf.compat.v1.train.Saver`,
fixtures/write_tf_bert.py): a two-layer BERT with its pre-training heads, named as
google-research/bert names its variables, plus Adam slots and `global_step`.

* Without TensorFlow: the pure-Python bundle reader recovers exactly the values handed to
  TensorFlow (values.npz); the converted folder has transformers' BertForPreTraining keys
  and loads into it with nothing missing but the tied decoder; the errors name the problem.
* With TensorFlow (the `[tf]` extra): the reader equals TensorFlow's own
  `tf.train.load_variable` on every variable, bit for bit.
* With TensorFlow and a transformers that still has `load_tf_weights_in_bert` (removed in
  transformers 5, so in an environment of its own: sentence-transformers 6 needs
  transformers 5): every converted tensor equals what that function loads, and the zoo's BERT
  source run from the converted file equals that transformers model within 1e-5 on torch,
  ONNX Runtime and JAX.  Without them these tests fail, naming the packages.  They are marked
  `tf`, which the default run deselects (pyproject.toml); run them with `python -m pytest -m tf`
  in an environment with the `[tf]` extra and transformers < 5.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from fixtures.parity import max_diff
from linnet import nest
from linnet.cli import main
from linnet.diagnostics import LinnetError
from linnet.nest.tf_checkpoint import read_checkpoint, transformers_key
from test_heads import _right_padded, write_tiny_entry

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "tf_bert"
PREFIX = FIXTURE / "bert_model.ckpt"
BOUND = 1e-5


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("converted")
    assert main(["convert-tf", str(PREFIX), "-o", str(folder)]) == 0
    return folder


def _tensors(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(folder / "model.safetensors"))


def test_the_reader_recovers_what_tensorflow_was_given():
    values = np.load(FIXTURE / "values.npz")
    read = read_checkpoint(PREFIX)
    assert set(read) == {k.replace("|", "/") for k in values.files} | {"global_step"}
    for key in values.files:
        assert read[key.replace("|", "/")].dtype == np.float32
        np.testing.assert_array_equal(read[key.replace("|", "/")], values[key])
    assert read["global_step"].dtype == np.int64 and read["global_step"].shape == ()


def test_names_follow_transformers_layout():
    assert transformers_key("bert/encoder/layer_11/attention/self/query/kernel") == (
        "bert.encoder.layer.11.attention.self.query.weight", True)
    assert transformers_key("bert/embeddings/word_embeddings") == ("bert.embeddings.word_embeddings.weight", False)
    assert transformers_key("cls/predictions/output_bias") == ("cls.predictions.bias", False)
    assert transformers_key("cls/seq_relationship/output_weights") == ("cls.seq_relationship.weight", False)
    assert transformers_key("bert/embeddings/LayerNorm/gamma") == ("bert.embeddings.LayerNorm.weight", False)
    assert transformers_key("bert/pooler/dense/kernel/adam_m") is None
    assert transformers_key("global_step") is None


def test_the_folder_loads_into_bert_for_pretraining(converted):
    from transformers import BertForPreTraining

    tensors = _tensors(converted)
    model = BertForPreTraining.from_pretrained(converted)
    expected = {k for k in model.state_dict() if k != "cls.predictions.decoder.weight"}
    assert set(tensors) - {"cls.predictions.decoder.bias"} == expected - {"cls.predictions.decoder.bias"}
    values = np.load(FIXTURE / "values.npz")
    kernel = values["bert|encoder|layer_1|intermediate|dense|kernel"]
    np.testing.assert_array_equal(tensors["bert.encoder.layer.1.intermediate.dense.weight"], kernel.T)
    np.testing.assert_array_equal(model.bert.encoder.layer[1].intermediate.dense.weight.detach().numpy(), kernel.T)
    assert model.config.architectures == ["BertForPreTraining"] and model.config.vocab_size == 99


def _tensorflow():
    try:
        import tensorflow
    except ImportError:
        pytest.fail("this test needs TensorFlow to read the checkpoint: pip install tensorflow-cpu "
                    "(the `[tf]` extra)")
    return tensorflow


@pytest.mark.tf
def test_the_reader_equals_tensorflows_own():
    tf = _tensorflow()
    listed = dict(tf.train.list_variables(str(PREFIX)))
    read = read_checkpoint(PREFIX)
    assert set(read) == set(listed)
    for name, shape in listed.items():
        theirs = tf.train.load_variable(str(PREFIX), name)
        assert list(read[name].shape) == list(shape) and read[name].dtype == theirs.dtype, name
        np.testing.assert_array_equal(read[name], theirs, err_msg=name)


def _reference_via_transformers():
    """BertForPreTraining filled by transformers' own load_tf_weights_in_bert."""
    _tensorflow()
    from transformers import BertConfig, BertForPreTraining
    from transformers.models.bert import modeling_bert

    if not hasattr(modeling_bert, "load_tf_weights_in_bert"):
        pytest.fail("this test needs transformers' load_tf_weights_in_bert, which transformers 5 removed: "
                    "pip install 'transformers<5' beside tensorflow-cpu")
    config = BertConfig.from_json_file(str(FIXTURE / "bert_config.json"))
    model = BertForPreTraining(config)
    modeling_bert.load_tf_weights_in_bert(model, config, str(PREFIX))
    return model.eval()


@pytest.mark.tf
@pytest.mark.parametrize("backend", ["torch", "onnx", "jax"])
def test_equals_transformers_load_tf_weights_in_bert(converted, tmp_path, backend):
    reference = _reference_via_transformers()
    tensors = _tensors(converted)
    for key, value in reference.state_dict().items():
        if key in tensors:
            np.testing.assert_array_equal(tensors[key], value.numpy(), err_msg=key)
    entry = write_tiny_entry(tmp_path / "entry", "PreTraining", "forward", name=f"tiny-tf-{backend}")
    model = nest.load(entry, backend=backend, weights=converted / "model.safetensors")
    tokens, types, mask = _right_padded([10, 4, 7], 99, seed=3)
    with torch.no_grad():
        out = reference(input_ids=torch.from_numpy(tokens), token_type_ids=torch.from_numpy(types),
                        attention_mask=torch.from_numpy(mask))
    real = mask.astype(bool)
    mlm = max_diff(np.asarray(model.mlm(tokens, types, attention_mask=mask))[real], out.prediction_logits.numpy()[real])
    nsp = max_diff(np.asarray(model.nsp(tokens, types, attention_mask=mask)), out.seq_relationship_logits.numpy())
    print(f"convert-tf {backend}: mlm {mlm:.2e} nsp {nsp:.2e}")
    assert mlm <= BOUND and nsp <= BOUND


# ------------------------------------------------------------------ errors


def _raises(code: str, *argv) -> str:
    with pytest.raises(LinnetError) as caught:
        from linnet.nest.tf_checkpoint import convert

        convert(*argv)
    assert caught.value.code == code, caught.value.render()
    return caught.value.render()


def test_a_missing_checkpoint_is_named(tmp_path):
    text = _raises("E1014", tmp_path / "bert_model.ckpt", tmp_path / "out")
    assert "bert_model.ckpt.index does not exist" in text
    assert main(["convert-tf", str(tmp_path / "bert_model.ckpt"), "-o", str(tmp_path / "out")]) == 1


def test_a_truncated_data_file_is_refused(tmp_path):
    for file in FIXTURE.iterdir():
        shutil.copy(file, tmp_path / file.name)
    data = tmp_path / "bert_model.ckpt.data-00000-of-00001"
    data.write_bytes(data.read_bytes()[:1000])
    assert "(truncated?)" in _raises("E1014", tmp_path / "bert_model.ckpt", tmp_path / "out")


def test_an_index_that_is_not_a_table_is_refused(tmp_path):
    (tmp_path / "bert_model.ckpt.index").write_bytes(b"not a table" * 10)
    assert "does not end with a table footer" in _raises("E1014", tmp_path / "bert_model.ckpt", tmp_path / "out")


def test_a_missing_config_is_named(tmp_path):
    for file in FIXTURE.glob("bert_model.ckpt*"):
        shutil.copy(file, tmp_path / file.name)
    text = _raises("E1015", tmp_path / "bert_model.ckpt", tmp_path / "out")
    assert "bert_config.json" in text and "--config" in text
