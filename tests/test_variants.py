"""The google-bert variants in the zoo, checked without their 0.4-1.3 GB checkpoints.

* Each entry passes `linnet check`, at the sizes the BERT paper and the model cards give,
  and its parameter count equals the count of values in the real `model.safetensors`
  (published in huggingface/safetensors' table of Hub checkpoints, `temp.md`: no cls decoder
  matrix is stored, the decoder being tied to the word embeddings).
* Its bindings (the layout its nest.toml declares) verify against a header-only safetensors file whose keys and shapes
  are the checkpoint's, written from `fixtures.checkpoints.bert_base_checkpoint_shapes` (the
  BertForPreTraining layout written out by hand), never from the bindings themselves.
* A wrong shape or a missing key in such a header is reported as E1009/E1008 naming the key.
* LayerNorm names: a binding written `gamma`/`beta` finds a checkpoint's `weight`/`bias`
  (and the reverse), is logged, and is still shape-checked.
"""
from __future__ import annotations

import functools
import logging
from pathlib import Path

import numpy as np
import pytest

from fixtures.checkpoints import BertDims, bert_base_checkpoint_shapes
from fixtures.headers import header_bytes, new_layer_norm_names, write_header_only
from linnet.cli.targets import locate
from linnet.compiler import compile_target
from linnet.diagnostics import LinnetError
from linnet.nest.manifest import load_manifest
from linnet.nest.weights import entry_bindings, load_tensors, read_index, verify_bindings
from linnet.middle.params import ParamSpec

REPO = Path(__file__).resolve().parent.parent

BASE = dict(hidden=768, heads=12, inner=3072, layers=12)
LARGE = dict(hidden=1024, heads=16, inner=4096, layers=24)

#: name -> (sizes, vocabulary, lowercase, values in the real model.safetensors).
#: Sizes from the BERT README (google-research/bert) and the Hub configs; value counts from
#: huggingface/safetensors temp.md (bert-large-uncased 336226108, ...).
VARIANTS = {
    "bert-large-uncased": (LARGE, 30522, True, 336_226_108),
    "bert-base-cased": (BASE, 28996, False, 108_932_934),
    "bert-large-cased": (LARGE, 28996, False, 334_661_958),
    "bert-base-multilingual-cased": (BASE, 119547, False, 178_566_653),
    # Not in temp.md: 167,356,416 is BertModel at the published config (vocab 105879), and
    # the pre-training heads the cased checkpoint stores add 699,545 (transform 590,592,
    # LayerNorm 1,536, bias 105,879, next-sentence 1,538).
    "bert-base-multilingual-uncased": (BASE, 105879, True, 167_356_416 + 699_545),
    "bert-base-chinese": (BASE, 21128, False, 102_882_442),
}


def dims_of(name: str) -> BertDims:
    sizes, vocab, _, _ = VARIANTS[name]
    return BertDims(vocab=vocab, max_positions=512, type_vocab=2, **sizes)


@functools.lru_cache(maxsize=None)
def compiled(name: str):
    return compile_target(locate(str(REPO / "nest" / name)))


def params_of(name: str) -> list[ParamSpec]:
    return compiled(name).instance.params


def bindings_of(name: str) -> dict[str, str]:
    """The entry's bindings as nest.load reads them: its declared layout over its params."""
    return entry_bindings(load_manifest(REPO / "nest" / name).weights, [p.name for p in params_of(name)])[0]


def raises(code: str, call, *args, **kwargs) -> LinnetError:
    with pytest.raises(LinnetError) as caught:
        call(*args, **kwargs)
    assert caught.value.code == code, caught.value.render()
    return caught.value


# --------------------------------------------------------------------------- manifests


@pytest.mark.parametrize("name", VARIANTS)
def test_linnet_check_passes_at_the_published_sizes(name):
    result = compiled(name)
    sizes, vocab, _, values = VARIANTS[name]
    assert result.instance.root.block.name == "PreTraining"
    assert result.generics == {"Vocab": vocab, "MaxPositions": 512, "TypeVocab": 2, "D": sizes["hidden"],
                               "Heads": sizes["heads"], "Inner": sizes["inner"], "Layers": sizes["layers"],
                               "T": "f32"}
    assert result.instance.param_count == values
    assert {"forward", "hidden_states", "pool", "embed", "mlm", "nsp"} <= set(result.instance.entries)


@pytest.mark.parametrize("name", VARIANTS)
def test_the_cli_check_passes(name, capsys):
    from linnet.cli import main

    assert main(["check", str(REPO / "nest" / name)]) == 0
    out = capsys.readouterr().out
    assert f"params: {VARIANTS[name][3]:,} in" in out


@pytest.mark.parametrize("name", VARIANTS)
def test_manifest_reuses_the_bert_source_and_pins_the_google_bert_repo(name):
    manifest = load_manifest(REPO / "nest" / name)
    assert manifest.source.zoo == "bert-base-uncased" and manifest.source.path is None
    assert manifest.source_file() == REPO / "nest" / "bert-base-uncased" / "src" / "lib.linnet"
    assert manifest.weights.repo == f"google-bert/{name}"
    assert manifest.weights.files == ("model.safetensors",)
    assert manifest.license == "Apache-2.0" and manifest.family == "bert"
    assert manifest.tokenizer.files == ("vocab.txt",)
    assert manifest.tokenizer.lowercase is VARIANTS[name][2]


# --------------------------------------------------------------------------- bindings vs headers


def checkpoint_file(tmp_path: Path, name: str, shapes: dict | None = None) -> Path:
    shapes = bert_base_checkpoint_shapes(dims_of(name)) if shapes is None else shapes
    return write_header_only(tmp_path / name / "model.safetensors", shapes)


@pytest.mark.parametrize("name", VARIANTS)
def test_bindings_verify_against_the_checkpoint_header(tmp_path, name):
    shapes = bert_base_checkpoint_shapes(dims_of(name))
    file = checkpoint_file(tmp_path, name, shapes)
    index = read_index([file])
    report = verify_bindings(params_of(name), bindings_of(name), index)
    # Every tensor of the checkpoint is used (the decoder is tied, so none is stored for it).
    assert report.unused_keys == [] and report.aliases == []
    assert set(info.key for info in report.bound.values()) == set(shapes)
    assert sum(int(np.prod(s)) for s in shapes.values()) == VARIANTS[name][3]


def test_header_only_file_is_valid_safetensors_and_costs_no_data(tmp_path):
    from safetensors import safe_open

    shapes = bert_base_checkpoint_shapes(dims_of("bert-large-cased"))
    file = checkpoint_file(tmp_path, "bert-large-cased", shapes)
    prefix, data = header_bytes(shapes)
    assert file.stat().st_size == len(prefix) + data == len(prefix) + 4 * 334_661_958
    with safe_open(str(file), framework="numpy") as handle:
        assert set(handle.keys()) == set(shapes)
        key = "bert.encoder.layer.23.output.LayerNorm.gamma"
        assert tuple(handle.get_slice(key).get_shape()) == (1024,)
        assert not handle.get_tensor(key).any()  # a hole reads as zeros


@pytest.mark.parametrize("name", ["bert-base-chinese", "bert-large-uncased"])
def test_a_wrong_shape_is_reported_naming_the_key(tmp_path, name):
    dims = dims_of(name)
    shapes = bert_base_checkpoint_shapes(dims)
    key = "bert.encoder.layer.5.intermediate.dense.weight"
    shapes[key] = (dims.inner, dims.hidden + 1)
    err = raises("E1009", verify_bindings, params_of(name), bindings_of(name),
                 read_index([checkpoint_file(tmp_path, name, shapes)]))
    assert len(err.diagnostics) == 1
    assert err.diagnostics[0].message == (
        f"param bert.encoder.layers.5.up.weight: Tensor[{dims.inner}, {dims.hidden}; f32] but checkpoint "
        f"key {key} is [{dims.inner}, {dims.hidden + 1}] F32")


@pytest.mark.parametrize("name", ["bert-base-multilingual-cased", "bert-large-cased"])
def test_a_missing_key_is_reported_naming_the_key(tmp_path, name):
    shapes = bert_base_checkpoint_shapes(dims_of(name))
    del shapes["cls.predictions.bias"]
    err = raises("E1008", verify_bindings, params_of(name), bindings_of(name),
                 read_index([checkpoint_file(tmp_path, name, shapes)]))
    assert [d.message for d in err.diagnostics] == [
        "param mlm.bias: bindings.json binds it to checkpoint key cls.predictions.bias, which the "
        "checkpoint does not have"]


def test_a_vocabulary_mixup_is_caught(tmp_path):
    """bert-base-cased's bindings against an uncased (30522-word) checkpoint: every tensor
    with a vocabulary axis mismatches, and nothing else does."""
    err = raises("E1009", verify_bindings, params_of("bert-base-cased"), bindings_of("bert-base-cased"),
                 read_index([checkpoint_file(tmp_path, "bert-base-uncased",
                                             bert_base_checkpoint_shapes(BertDims(30522, 512, 2, **BASE)))]))
    keys = sorted(d.message.split(" checkpoint key ")[1].split()[0] for d in err.diagnostics)
    assert keys == ["bert.embeddings.word_embeddings.weight", "cls.predictions.bias"]


# --------------------------------------------------------------------------- LayerNorm names


@pytest.mark.parametrize("name", ["bert-base-cased", "bert-large-uncased"])
def test_gamma_beta_bindings_bind_a_weight_bias_checkpoint(tmp_path, name, caplog):
    shapes = new_layer_norm_names(bert_base_checkpoint_shapes(dims_of(name)))
    index = read_index([checkpoint_file(tmp_path, name, shapes)])
    with caplog.at_level(logging.INFO, logger="linnet.nest"):
        report = verify_bindings(params_of(name), bindings_of(name), index)
    layers = dims_of(name).layers
    # Two per LayerNorm: the embeddings', two per layer, and the masked-LM head's.
    assert len(report.aliases) == 2 * (1 + 2 * layers + 1)
    assert all(a.written.endswith((".gamma", ".beta")) and a.found.endswith((".weight", ".bias"))
               for a in report.aliases)
    assert report.bound["bert.encoder.embeddings.norm.weight"].key == "bert.embeddings.LayerNorm.weight"
    assert report.unused_keys == []
    assert any("other LayerNorm spelling" in r.getMessage() for r in caplog.records)


def small_specs() -> list[ParamSpec]:
    return [ParamSpec("norm.weight", (4,), "f32"), ParamSpec("norm.bias", (4,), "f32"),
            ParamSpec("dense.weight", (4, 4), "f32")]


def small_checkpoint(tmp_path: Path, tensors: dict[str, np.ndarray]) -> dict:
    from safetensors.numpy import save_file

    path = tmp_path / "small.safetensors"
    save_file(tensors, str(path))
    return read_index([path])


def test_weight_bias_bindings_bind_a_gamma_beta_checkpoint_with_its_values(tmp_path):
    gamma, beta, dense = np.arange(4, dtype=np.float32), -np.arange(4, dtype=np.float32), np.eye(4, dtype=np.float32)
    index = small_checkpoint(tmp_path, {"ln.gamma": gamma, "ln.beta": beta, "dense.weight": dense})
    bindings = {"norm.weight": "ln.weight", "norm.bias": "ln.bias", "dense.weight": "dense.weight"}
    report = verify_bindings(small_specs(), bindings, index)
    assert [(a.written, a.found) for a in report.aliases] == [("ln.weight", "ln.gamma"), ("ln.bias", "ln.beta")]
    arrays = load_tensors(small_specs(), bindings, index)
    np.testing.assert_array_equal(arrays["norm.weight"], gamma)
    np.testing.assert_array_equal(arrays["norm.bias"], beta)


def test_the_exact_key_wins_over_its_alias(tmp_path):
    index = small_checkpoint(tmp_path, {"ln.gamma": np.ones(4, np.float32), "ln.weight": np.zeros(4, np.float32),
                                        "ln.beta": np.zeros(4, np.float32), "dense.weight": np.eye(4, dtype=np.float32)})
    bindings = {"norm.weight": "ln.gamma", "norm.bias": "ln.beta", "dense.weight": "dense.weight"}
    report = verify_bindings(small_specs(), bindings, index)
    assert report.aliases == [] and report.unused_keys == ["ln.weight"]
    np.testing.assert_array_equal(load_tensors(small_specs(), bindings, index)["norm.weight"], np.ones(4))


def test_an_aliased_tensor_of_another_shape_is_refused(tmp_path):
    index = small_checkpoint(tmp_path, {"ln.weight": np.ones(5, np.float32), "ln.bias": np.zeros(4, np.float32),
                                        "dense.weight": np.eye(4, dtype=np.float32)})
    bindings = {"norm.weight": "ln.gamma", "norm.bias": "ln.beta", "dense.weight": "dense.weight"}
    err = raises("E1009", verify_bindings, small_specs(), bindings, index)
    assert [d.message for d in err.diagnostics] == [
        "param norm.weight: Tensor[4; f32] but checkpoint key ln.weight is [5] F32"]


def test_only_layer_norm_spellings_are_tried(tmp_path):
    index = small_checkpoint(tmp_path, {"ln.scale": np.ones(4, np.float32), "ln.beta": np.zeros(4, np.float32),
                                        "dense.weight": np.eye(4, dtype=np.float32)})
    bindings = {"norm.weight": "ln.gamma", "norm.bias": "ln.beta", "dense.weight": "dense.weight"}
    err = raises("E1008", verify_bindings, small_specs(), bindings, index)
    assert "checkpoint key ln.gamma, which the checkpoint does not have" in err.diagnostics[0].message


def test_bindings_are_the_spec_mapping(tmp_path):
    """Spot checks of each entry's bindings against the mapping written out in the issue's spec."""
    for name in VARIANTS:
        bindings = bindings_of(name)
        last = VARIANTS[name][0]["layers"] - 1
        assert bindings[f"bert.encoder.layers.{last}.attention.out.bias"] == \
            f"bert.encoder.layer.{last}.attention.output.dense.bias"
        assert bindings["bert.encoder.layers.0.attention_norm.weight"] == \
            "bert.encoder.layer.0.attention.output.LayerNorm.gamma"
        assert bindings["mlm.norm.bias"] == "cls.predictions.transform.LayerNorm.beta"
        assert bindings["nsp.weight"] == "cls.seq_relationship.weight"
        assert not any("decoder" in key for key in bindings.values())
