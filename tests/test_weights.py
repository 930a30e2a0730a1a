"""Checkpoints: finding files through the HF cache, reading headers, checking bindings,
loading tensors; on the full-size synthetic bert-base-uncased and the real all-MiniLM-L6-v2."""
from __future__ import annotations

import json
import logging
import os
import pickle
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from fixtures.checkpoints import (
    BERT_BASE,
    BERT_BASE_CONFIG,
    BERT_BASE_REAL_FILE_BYTES,
    BERT_BASE_TENSOR_BYTES,
    MINILM,
    MINILM_SHA256,
    bert_base_checkpoint_shapes,
    bert_param_specs,
)
from linnet.diagnostics import LinnetError
from linnet.nest.manifest import load_manifest
from linnet.nest.weights import (
    CODES,
    Cast,
    TensorInfo,
    checkpoint_files,
    entry_bindings,
    load_bindings,
    load_tensors,
    read_header,
    read_index,
    sha256_of,
    verify_bindings,
)
from linnet.middle.params import ParamSpec
from linnet.paths import zoo_dir

CLS_KEYS = sorted(k for k in bert_base_checkpoint_shapes() if k.startswith("cls."))


def zoo_bindings(name: str, params: list[ParamSpec] | None = None) -> dict[str, str]:
    """The bindings a zoo entry declares, as nest.load reads them: its nest.toml's layout over
    `params` (by default the hand-written list of the entry's root block)."""
    manifest = load_manifest(name)
    if params is None:
        params = bert_param_specs(MINILM if manifest.source.root == "Model" else BERT_BASE, manifest.source.root)
    return entry_bindings(manifest.weights, [p.name for p in params])[0]


@pytest.fixture
def bert_index(bert_base_checkpoint):
    return read_index([bert_base_checkpoint.file])


@pytest.fixture
def minilm_index(minilm_checkpoint):
    return read_index([minilm_checkpoint / "model.safetensors"])


def raises(code: str, call, *args, **kwargs) -> LinnetError:
    with pytest.raises(LinnetError) as caught:
        call(*args, **kwargs)
    assert caught.value.code == code, caught.value.render()
    return caught.value


def fake_index(**shapes_and_dtypes) -> dict[str, TensorInfo]:
    """Header facts only, for a file that does not exist: verify_bindings must not need it."""
    missing = Path("/nonexistent/model.safetensors")
    return {key: TensorInfo(key, missing, dtype, shape) for key, (shape, dtype) in shapes_and_dtypes.items()}


def test_codes_are_documented():
    assert all(re.fullmatch(r"E10\d\d", code) and meaning for code, meaning in CODES.items())


# --------------------------------------------------------------------------- the synthetic checkpoint


def test_synthetic_bert_base_has_the_original_layout(bert_base_checkpoint, bert_index):
    file = bert_base_checkpoint.file
    assert set(bert_index) == set(bert_base_checkpoint_shapes())
    assert len(bert_index) == 199 + len(CLS_KEYS) == 206
    assert "cls.predictions.decoder.weight" not in bert_index  # tied to the word embeddings
    assert {info.dtype for info in bert_index.values()} == {"F32"}
    assert sum(info.nbytes for info in bert_index.values()) == BERT_BASE_TENSOR_BYTES
    with open(file, "rb") as f:
        [header_length] = struct.unpack("<Q", f.read(8))
    assert file.stat().st_size == 8 + header_length + BERT_BASE_TENSOR_BYTES
    # Same key names and shapes give a header of the same length as the real file's.
    assert file.stat().st_size == BERT_BASE_REAL_FILE_BYTES


def test_synthetic_bert_base_is_not_degenerate(bert_base_checkpoint):
    with safe_open(str(bert_base_checkpoint.file), framework="numpy") as f:
        gamma = f.get_tensor("bert.encoder.layer.3.output.LayerNorm.gamma")
        beta = f.get_tensor("bert.encoder.layer.3.output.LayerNorm.beta")
        weight = f.get_tensor("bert.encoder.layer.3.intermediate.dense.weight")
    assert abs(gamma.mean() - 1) < 0.01 and 0.01 < gamma.std() < 0.03
    assert abs(beta.mean()) < 0.01 and 0.01 < beta.std() < 0.03
    assert 0.019 < weight.std() < 0.021


def test_synthetic_bert_base_sits_in_the_hub_cache_layout(hf_cache, bert_base_checkpoint):
    repo_dir = hf_cache / "models--google-bert--bert-base-uncased"
    assert (repo_dir / "refs" / "main").read_bytes() == bert_base_checkpoint.revision.encode()
    link = bert_base_checkpoint.file
    assert link == repo_dir / "snapshots" / bert_base_checkpoint.revision / "model.safetensors"
    assert link.is_symlink() and not os.path.isabs(os.readlink(link))
    assert link.resolve() == repo_dir / "blobs" / bert_base_checkpoint.sha256
    assert sha256_of(link) == bert_base_checkpoint.sha256
    assert json.loads((link.parent / "config.json").read_text()) == BERT_BASE_CONFIG


# --------------------------------------------------------------------------- headers


def write_raw(path: Path, header: bytes | dict | list, data: bytes = b"",
              length: int | None = None) -> Path:
    """A safetensors-shaped file with whatever header and length prefix a test wants."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    prefix = struct.pack("<Q", len(raw) if length is None else length)
    path.write_bytes(prefix + raw + data)
    return path


TWELVE = b"\0" * 12


@pytest.mark.parametrize("header, data, length, reason", [
    (b"", b"", 0, None),  # placeholder replaced below: too short to hold the length prefix
    (b'{"a": {}}', b"", 1000, "the header claims 1000 bytes but the file has 9"),
    (b"{not json", b"", None, "the header is not valid JSON"),
    ([1, 2], b"", None, "the header is not a JSON object"),
    ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}}, b"\0" * 8, None,
     "tensor 'a': data_offsets [0, 12] lie outside the 8 data bytes"),
    ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, TWELVE, None,
     "tensor 'a': data_offsets span 8 bytes but [3] F32 needs 12"),
    ({"a": {"dtype": "F33", "shape": [3], "data_offsets": [0, 12]}}, TWELVE, None,
     "tensor 'a': unknown dtype 'F33'"),
    ({"a": {"dtype": "F32", "shape": [-3], "data_offsets": [0, 12]}}, TWELVE, None,
     "tensor 'a': shape [-3] is not a list of sizes"),
    ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [12, 0]}}, TWELVE, None, "lie outside"),
    ({"a": [1]}, TWELVE, None, "tensor 'a': header entry is not an object"),
])
def test_corrupt_headers_are_rejected_naming_the_file(tmp_path, header, data, length, reason):
    path = tmp_path / "broken.safetensors"
    if reason is None:
        path.write_bytes(b"\x10\x00\x00")
        reason = "the file is 3 bytes, too short for the 8-byte header length"
    else:
        write_raw(path, header, data, length)
    err = raises("E1004", read_index, [path])
    assert err.diagnostics[0].message.startswith("broken.safetensors is not a valid safetensors file: ")
    assert reason in err.diagnostics[0].message
    assert str(path) in err.render()


def test_truncated_checkpoint_is_caught_from_the_header(tmp_path, minilm_checkpoint):
    whole = (minilm_checkpoint / "model.safetensors").read_bytes()
    cut = tmp_path / "model.safetensors"
    cut.write_bytes(whole[: len(whole) // 2])
    err = raises("E1004", read_index, [cut])
    assert "lie outside" in str(err)


def test_header_matches_what_safetensors_reports(minilm_checkpoint, minilm_index):
    file = minilm_checkpoint / "model.safetensors"
    with safe_open(str(file), framework="numpy") as f:
        assert set(f.keys()) == set(minilm_index)
        for key in f.keys():
            tensor = f.get_slice(key)
            assert (tensor.get_dtype(), tuple(tensor.get_shape())) == (minilm_index[key].dtype,
                                                                        minilm_index[key].shape)
    assert minilm_index["embeddings.position_ids"].dtype == "I64"
    assert read_header(file) == list(minilm_index.values())


def test_a_key_in_two_files_is_an_error(tmp_path):
    save_file({"x": np.zeros(2, np.float32)}, str(tmp_path / "a.safetensors"))
    save_file({"x": np.zeros(2, np.float32), "y": np.zeros(1, np.float32)}, str(tmp_path / "b.safetensors"))
    err = raises("E1005", read_index, [tmp_path / "a.safetensors", tmp_path / "b.safetensors"])
    assert "'x' appears in both" in str(err) and "a.safetensors" in str(err) and "b.safetensors" in str(err)


# --------------------------------------------------------------------------- bindings files


def test_zoo_bindings_cover_exactly_the_model_params():
    for name, dims, root in (("bert-base-uncased", BERT_BASE, "PreTraining"), ("all-minilm-l6-v2", MINILM, "Model")):
        names = [p.name for p in bert_param_specs(dims, root)]
        assert load_manifest(name).source.root == root
        assert list(zoo_bindings(name, bert_param_specs(dims, root))) == names


@pytest.mark.parametrize("text, message, line", [
    ('["a", "b"]', "bindings.json: must hold a JSON object mapping Linnet param names to checkpoint "
                   "keys, found an array", None),
    ('{\n  "a": "x",\n  "b": 3\n}', "bindings.json: the binding of 'b' must be a checkpoint key string, "
                                   "found a number", 3),
    ('{\n  "a": "x",\n  "b": {"c": "d"}\n}', "bindings.json: the binding of 'b' must be a checkpoint "
                                             "key string, found an object", 3),
    ('{\n  "a": "x",\n  "a": "y"\n}', "bindings.json: param 'a' is bound twice", 2),
    ('{\n  "a": "x"\n  "b": "y"\n}', "bindings.json: invalid JSON: Expecting ',' delimiter", 3),
])
def test_malformed_bindings_files(tmp_path, text, message, line):
    path = tmp_path / "bindings.json"
    path.write_text(text)
    err = raises("E1011", load_bindings, path)
    assert err.diagnostics[0].message == message
    if line is not None:
        assert err.diagnostics[0].span.file == str(path) and err.diagnostics[0].span.line == line


def test_missing_bindings_file(tmp_path):
    err = raises("E1011", load_bindings, tmp_path / "bindings.json")
    assert "cannot read bindings file" in str(err)


# --------------------------------------------------------------------------- verify_bindings


def test_bert_base_bindings_verify_and_bind_the_pretraining_heads(bert_index, caplog):
    caplog.set_level(logging.INFO, logger="linnet.nest")
    params = bert_param_specs(BERT_BASE, "PreTraining")
    report = verify_bindings(params, zoo_bindings("bert-base-uncased"), bert_index)
    assert report.unused_keys == []
    assert list(report.bound) == [p.name for p in params]
    assert report.bound["bert.encoder.embeddings.norm.weight"].key == "bert.embeddings.LayerNorm.gamma"
    assert sorted(b.key for b in report.bound.values() if b.key.startswith("cls.")) == CLS_KEYS
    assert report.bound["mlm.bias"].key == "cls.predictions.bias"
    assert report.casts == []
    assert not [r for r in caplog.records if r.name == "linnet.nest"]  # nothing unused to report


def test_unused_checkpoint_keys_are_reported_in_one_line(bert_index, caplog):
    # The bare encoder-with-pooler params over the pre-training checkpoint leave its heads over.
    caplog.set_level(logging.INFO, logger="linnet.nest")
    bindings = {name: key for name, key in zoo_bindings("bert-base-uncased").items() if name.startswith("bert.")}
    params = [ParamSpec(f"bert.{p.name}", p.shape, p.dtype) for p in bert_param_specs(BERT_BASE)]
    report = verify_bindings(params, bindings, bert_index)
    assert report.unused_keys == CLS_KEYS
    [record] = [r for r in caplog.records if r.name == "linnet.nest"]
    assert record.levelno == logging.INFO and "\n" not in record.getMessage()
    assert record.getMessage().startswith("bindings.json: 7 checkpoint keys unused: cls.")


def test_minilm_bindings_verify_against_the_real_file(minilm_index):
    report = verify_bindings(bert_param_specs(MINILM), zoo_bindings("all-minilm-l6-v2"), minilm_index)
    assert report.unused_keys == ["embeddings.position_ids"]
    assert len(report.bound) == 103


def test_swapped_bindings_name_param_key_and_both_shapes(bert_index):
    bindings = zoo_bindings("bert-base-uncased")
    for suffix in ("weight", "bias"):
        up, down = f"bert.encoder.layers.0.up.{suffix}", f"bert.encoder.layers.0.down.{suffix}"
        bindings[up], bindings[down] = bindings[down], bindings[up]
    err = raises("E1009", verify_bindings, bert_param_specs(BERT_BASE, "PreTraining"), bindings, bert_index)
    assert [d.message for d in err.diagnostics] == [
        "param bert.encoder.layers.0.up.weight: Tensor[3072, 768; f32] but checkpoint key "
        "bert.encoder.layer.0.output.dense.weight is [768, 3072] F32",
        "param bert.encoder.layers.0.up.bias: Tensor[3072; f32] but checkpoint key "
        "bert.encoder.layer.0.output.dense.bias is [768] F32",
        "param bert.encoder.layers.0.down.weight: Tensor[768, 3072; f32] but checkpoint key "
        "bert.encoder.layer.0.intermediate.dense.weight is [3072, 768] F32",
        "param bert.encoder.layers.0.down.bias: Tensor[768; f32] but checkpoint key "
        "bert.encoder.layer.0.intermediate.dense.bias is [3072] F32",
    ]


def test_every_binding_problem_is_reported_in_one_error(bert_index):
    bindings = zoo_bindings("bert-base-uncased")
    del bindings["bert.pooler.dense.bias"]
    # (`LayerNorm.weight` would be found: it is the other spelling of the checkpoint's `gamma`.)
    bindings["bert.encoder.embeddings.norm.weight"] = "bert.embeddings.layer_norm.gamma"
    bindings["bert.encoder.layers.12.up.weight"] = "bert.encoder.layer.11.intermediate.dense.weight"
    err = raises("E1008", verify_bindings, bert_param_specs(BERT_BASE, "PreTraining"), bindings, bert_index)
    missing_key, no_binding, unknown_param = err.diagnostics
    assert missing_key.message == ("param bert.encoder.embeddings.norm.weight: bindings.json binds it to checkpoint "
                                   "key bert.embeddings.layer_norm.gamma, which the checkpoint does "
                                   "not have")
    assert "bert.embeddings.LayerNorm.gamma" in missing_key.notes[0].message
    assert (no_binding.code, no_binding.message) == (
        "E1006", "param bert.pooler.dense.bias: Tensor[768; f32] has no binding in bindings.json")
    assert unknown_param.code == "E1007"
    assert unknown_param.message == ("bindings.json binds bert.encoder.layers.12.up.weight (to "
                                     "bert.encoder.layer.11.intermediate.dense.weight), but the "
                                     "model has no param bert.encoder.layers.12.up.weight")
    assert re.fullmatch(r"did you mean bert\.encoder\.layers\.\d+\.up\.weight\?", unknown_param.notes[0].message)


def test_diagnostics_point_at_the_bindings_line_when_given_its_path(tmp_path, bert_index):
    path = tmp_path / "bindings.json"
    bindings = zoo_bindings("bert-base-uncased")
    bindings["bert.encoder.layers.0.up.weight"] = "bert.encoder.layer.0.output.dense.weight"
    path.write_text(json.dumps(bindings, indent=2))
    err = raises("E1009", verify_bindings, bert_param_specs(BERT_BASE, "PreTraining"), bindings, bert_index,
                 bindings_file=str(path))
    span = err.diagnostics[0].span
    assert span.file == str(path)
    assert path.read_text().splitlines()[span.line - 1].strip().startswith('"bert.encoder.layers.0.up.weight":')


def test_integers_and_floats_never_convert():
    index = fake_index(ids=((4,), "I64"), scale=((4,), "F32"))
    params = [ParamSpec("ids", (4,), "f32"), ParamSpec("scale", (4,), "i32")]
    err = raises("E1010", verify_bindings, params, {"ids": "ids", "scale": "scale"}, index,
                 cast_floats=True)
    assert [d.message for d in err.diagnostics] == [
        "param ids: Tensor[4; f32] but checkpoint key ids is [4] I64",
        "param scale: Tensor[4; i32] but checkpoint key scale is [4] F32",
    ]
    assert all("never converted" in d.notes[0].message for d in err.diagnostics)


def test_another_float_width_needs_cast_floats(caplog):
    caplog.set_level(logging.INFO, logger="linnet.nest")
    index = fake_index(w=((2, 3), "F16"))
    params = [ParamSpec("w", (2, 3), "f32")]
    err = raises("E1010", verify_bindings, params, {"w": "w"}, index)
    assert err.diagnostics[0].message == "param w: Tensor[2, 3; f32] but checkpoint key w is [2, 3] F16"
    assert "cast_floats=True" in err.diagnostics[0].notes[0].message
    report = verify_bindings(params, {"w": "w"}, index, cast_floats=True)
    assert report.casts == [Cast("w", "w", "F16", "f32")]
    assert any("1 float tensors converted on load (F16->f32)" in r.getMessage() for r in caplog.records)


def test_shape_and_dtype_both_wrong_are_two_problems():
    err = raises("E1009", verify_bindings, [ParamSpec("w", (3,), "i32")], {"w": "w"},
                 fake_index(w=((2,), "F32")))
    assert [d.code for d in err.diagnostics] == ["E1009", "E1010"]


def test_tied_params_may_share_a_key_when_shapes_agree():
    index = fake_index(emb=((10, 4), "F32"))
    params = [ParamSpec("embed", (10, 4), "f32"), ParamSpec("lm_head", (10, 4), "f32")]
    report = verify_bindings(params, {"embed": "emb", "lm_head": "emb"}, index)
    assert report.bound["embed"] == report.bound["lm_head"] and report.unused_keys == []


def test_tied_params_that_disagree_are_an_error_naming_both():
    index = fake_index(emb=((10, 4), "F32"))
    params = [ParamSpec("embed", (10, 4), "f32"), ParamSpec("lm_head", (4, 10), "f32")]
    err = raises("E1009", verify_bindings, params, {"embed": "emb", "lm_head": "emb"}, index)
    [diagnostic] = err.diagnostics
    assert diagnostic.message == "param lm_head: Tensor[4, 10; f32] but checkpoint key emb is [10, 4] F32"
    assert diagnostic.notes[0].message == ("key emb is also bound to param embed: Tensor[10, 4; f32], "
                                           "which agrees with it")


# --------------------------------------------------------------------------- checkpoint_files


def test_checkpoint_comes_from_the_hf_cache_offline(bert_base_checkpoint):
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    files = checkpoint_files(load_manifest("bert-base-uncased"))
    assert files == [bert_base_checkpoint.file]


def test_pinned_checkpoint_is_verified(minilm_checkpoint):
    [file] = checkpoint_files(load_manifest("all-minilm-l6-v2"))
    assert file == minilm_checkpoint / "model.safetensors"
    assert sha256_of(file) == MINILM_SHA256


def test_uncached_revision_says_what_is_missing_and_how_to_provide_it(bert_base_checkpoint):
    revision = "1" * 40
    err = raises("E1001", checkpoint_files, load_manifest("bert-base-uncased"), revision=revision)
    text = err.render()
    assert (f"checkpoint google-bert/bert-base-uncased/model.safetensors at revision {revision} is "
            f"not in the Hugging Face cache") in text
    assert "downloads are disabled (HF_HUB_OFFLINE=1)" in text
    assert "pass weights= a local .safetensors file" in text
    assert "set HF_HUB_OFFLINE=0" in text


@pytest.mark.parametrize("offline", [True, False])
def test_the_placeholder_revision_is_refused_before_any_request(hf_cache, monkeypatch, offline):
    """bert-base-multilingual-uncased was written offline; its pin is all zeros, which no Hub
    repo has: the error says so and how to load it anyway, with or without network."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    manifest = load_manifest("bert-base-multilingual-uncased")
    assert manifest.weights.revision == "0" * 40
    text = raises("E1016", checkpoint_files, manifest).render()
    assert "google-bert/bert-base-multilingual-uncased/model.safetensors" in text
    assert "a placeholder, not a commit" in text and 'pass revision="main"' in text and "weights=" in text


def copy_entry(tmp_path: Path, name: str, edit=lambda text: text) -> Path:
    entry = tmp_path / name
    entry.mkdir()
    for file in ("nest.toml", "linnet.toml"):
        text = (zoo_dir() / name / file).read_text()
        (entry / file).write_text(edit(text) if file == "nest.toml" else text)
    return entry


def test_uncached_repo(tmp_path, hf_cache):
    entry = copy_entry(tmp_path, "bert-base-uncased",
                       lambda text: text.replace("google-bert/bert-base-uncased\"", "linnet-tests/absent\""))
    err = raises("E1001", checkpoint_files, load_manifest(entry))
    assert "checkpoint linnet-tests/absent/model.safetensors at revision 86b5e09" in str(err)


def test_sha256_mismatch_names_file_expected_and_found(tmp_path, minilm_checkpoint):
    wrong = "0" * 64
    entry = copy_entry(tmp_path, "all-minilm-l6-v2", lambda text: text.replace(MINILM_SHA256, wrong))
    err = raises("E1002", checkpoint_files, load_manifest(entry))
    message = err.diagnostics[0].message
    assert message.startswith("sha256 of model.safetensors (sentence-transformers/all-MiniLM-L6-v2@")
    assert f"expected {wrong}, found {MINILM_SHA256}" in message


def test_pins_do_not_apply_to_a_users_own_weights(tmp_path, minilm_checkpoint):
    # A fine-tuned model.safetensors passed as weights= is not the pinned upstream file.
    folder = tmp_path / "finetuned"
    folder.mkdir()
    save_file({"w": np.zeros(1, np.float32)}, str(folder / "model.safetensors"))
    manifest = load_manifest("all-minilm-l6-v2")
    assert checkpoint_files(manifest, weights=folder) == [folder / "model.safetensors"]


def test_weights_argument_takes_a_file_or_a_folder(tmp_path, minilm_checkpoint):
    manifest = load_manifest("all-minilm-l6-v2")
    real = minilm_checkpoint / "model.safetensors"
    assert checkpoint_files(manifest, weights=real) == [real]
    assert checkpoint_files(manifest, weights=minilm_checkpoint) == [real]  # declared files
    shards = tmp_path / "shards"
    shards.mkdir()
    for name in ("b.safetensors", "a.safetensors"):
        save_file({name[0]: np.zeros(1, np.float32)}, str(shards / name))
    assert checkpoint_files(manifest, weights=shards) == [shards / "a.safetensors", shards / "b.safetensors"]


class _Tripwire:
    """Unpickling this creates a file: proof, if it exists, that a pickle was loaded."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pt", "weights.ckpt"])
def test_pickle_checkpoints_are_refused_unopened(tmp_path, name):
    marker = tmp_path / "unpickled"
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / name).write_bytes(pickle.dumps(_Tripwire(marker)))
    manifest = load_manifest("bert-base-uncased")
    for weights in (folder, folder / name):
        err = raises("E1003", checkpoint_files, manifest, weights=weights)
        assert f"holds only pickle checkpoints ({name}); Linnet never loads pickles" in str(err)
        assert "weights_only=True" in err.render()
    assert not marker.exists()


def test_weights_argument_that_is_not_a_checkpoint(tmp_path):
    manifest = load_manifest("bert-base-uncased")
    assert "does not exist" in str(raises("E1003", checkpoint_files, manifest, weights=tmp_path / "nope"))
    assert "holds no .safetensors files" in str(raises("E1003", checkpoint_files, manifest, weights=tmp_path))
    (tmp_path / "model.onnx").write_bytes(b"")
    assert "is not a .safetensors file" in str(
        raises("E1003", checkpoint_files, manifest, weights=tmp_path / "model.onnx"))


def test_entry_without_weights_needs_the_argument(tmp_path):
    entry = copy_entry(tmp_path, "bert-base-uncased", lambda text: text[:text.index("[weights]")])
    err = raises("E1012", checkpoint_files, load_manifest(entry))
    assert "declares no [weights]; pass weights=" in str(err)


# --------------------------------------------------------------------------- load_tensors


def test_loaded_tensors_equal_safetensors_own_read(bert_base_checkpoint, bert_index):
    params = bert_param_specs(BERT_BASE, "PreTraining")
    bindings = zoo_bindings("bert-base-uncased")
    arrays = load_tensors(params, bindings, bert_index)
    assert list(arrays) == [p.name for p in params]
    with safe_open(str(bert_base_checkpoint.file), framework="numpy") as f:
        for param in params:
            expected = f.get_tensor(bindings[param.name])
            assert arrays[param.name].dtype == np.float32
            np.testing.assert_array_equal(arrays[param.name], expected)


def test_minilm_loads_for_torch(minilm_checkpoint, minilm_index):
    import torch

    params = bert_param_specs(MINILM)
    bindings = zoo_bindings("all-minilm-l6-v2")
    tensors = load_tensors(params, bindings, minilm_index, framework="pt")
    with safe_open(str(minilm_checkpoint / "model.safetensors"), framework="pt") as f:
        for param in params:
            assert torch.equal(tensors[param.name], f.get_tensor(bindings[param.name]))


def test_a_declared_layout_that_misfits_the_checkpoint_is_named_in_every_problem(tmp_path, minilm_checkpoint):
    """MiniLM's keys carry no `bert.` prefix: declaring one makes every key absent, and each
    problem says the declared layout made the key (there is no bindings file to point at)."""
    from linnet import nest

    entry = copy_entry(tmp_path, "all-minilm-l6-v2", lambda text: text.replace('prefix = ""', 'prefix = "bert."'))
    err = raises("E1008", nest.prepare, entry)
    assert len(err.diagnostics) == len(bert_param_specs(MINILM))
    assert err.diagnostics[0].message == (
        'param encoder.embeddings.word_embeddings: the "bert" layout ([weights].bindings in nest.toml) binds '
        "it to checkpoint key bert.embeddings.word_embeddings.weight, which the checkpoint does not have")


@pytest.fixture
def small_checkpoint(tmp_path):
    rng = np.random.default_rng(1)
    path = tmp_path / "small.safetensors"
    save_file({"w": rng.standard_normal((3, 4), dtype=np.float32),
               "half": rng.standard_normal((5,), dtype=np.float32).astype(np.float16),
               "ids": np.arange(6, dtype=np.int64)}, str(path))
    return path, read_index([path])


@pytest.mark.parametrize("framework", ["numpy", "pt", "flax"])
def test_floats_are_cast_and_integers_left_alone(small_checkpoint, framework):
    path, index = small_checkpoint
    params = [ParamSpec("w", (3, 4), "f32"), ParamSpec("ids", (6,), "i64")]
    arrays = load_tensors(params, {"w": "w", "ids": "ids"}, index, framework=framework, dtype="bf16")
    # JAX narrows int64 to int32 unless jax_enable_x64 is set; either way it stays an integer.
    assert "bfloat16" in str(arrays["w"].dtype) and "int" in str(arrays["ids"].dtype)
    widened = arrays["w"].float() if framework == "pt" else arrays["w"].astype(np.float32)
    expected = safe_open(str(path), framework="numpy").get_tensor("w")
    np.testing.assert_allclose(np.asarray(widened), expected, rtol=1e-2)
    np.testing.assert_array_equal(np.asarray(arrays["ids"]), np.arange(6))


def test_narrower_checkpoint_floats_become_the_declared_dtype(small_checkpoint):
    _, index = small_checkpoint
    arrays = load_tensors([ParamSpec("half", (5,), "f32")], {"half": "half"}, index)
    assert arrays["half"].dtype == np.float32


def test_tied_keys_are_read_once(small_checkpoint):
    _, index = small_checkpoint
    params = [ParamSpec("embed", (3, 4), "f32"), ParamSpec("head", (3, 4), "f32")]
    arrays = load_tensors(params, {"embed": "w", "head": "w"}, index, framework="pt")
    assert arrays["embed"] is arrays["head"]


def test_load_tensors_rechecks_bindings_before_reading(small_checkpoint):
    _, index = small_checkpoint
    raises("E1009", load_tensors, [ParamSpec("w", (4, 3), "f32")], {"w": "w"}, index)


def test_load_tensors_arguments(small_checkpoint):
    _, index = small_checkpoint
    params = [ParamSpec("w", (3, 4), "f32")]
    assert "choose one of f64, f32, f16, bf16" in str(
        raises("E1013", load_tensors, params, {"w": "w"}, index, dtype="i8"))
    with pytest.raises(ValueError, match="framework must be one of"):
        load_tensors(params, {"w": "w"}, index, framework="tf")


# --------------------------------------------------------------------------- transformers agrees


def _transformers_name(checkpoint_key: str) -> str:
    # What transformers' BertModel calls a checkpoint tensor once it has loaded it (the
    # `cls.*` heads are not BertModel's; tests/test_heads.py compares them).
    name = checkpoint_key.removeprefix("bert.")
    return name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")


@pytest.mark.parametrize("checkpoint, model, entry", [
    ("bert_base_checkpoint", "transformers_bert_base", "bert-base-uncased"),
    ("minilm_checkpoint", "transformers_minilm", "all-minilm-l6-v2"),
])
def test_transformers_reads_the_same_values_from_the_cache(request, checkpoint, model, entry):
    import torch

    cached = request.getfixturevalue(checkpoint)
    file = getattr(cached, "file", None) or cached / "model.safetensors"
    state = request.getfixturevalue(model).state_dict()
    keys = [key for key in zoo_bindings(entry).values() if not key.startswith("cls.")]
    assert {_transformers_name(key) for key in keys} == set(state)
    with safe_open(str(file), framework="pt") as f:
        for key in keys:
            assert torch.equal(state[_transformers_name(key)], f.get_tensor(key)), key


def test_a_fresh_python_process_loads_the_synthetic_checkpoint(bert_base_checkpoint):
    # From the environment conftest set up (HF_HOME, HF_HUB_OFFLINE), and resolving the
    # revision through refs/main the way an unpinned user script would.
    script = ("import transformers; "
              "m = transformers.BertModel.from_pretrained('google-bert/bert-base-uncased'); "
              "print(m.config.num_hidden_layers, m.config.hidden_size, "
              "float(m.embeddings.LayerNorm.weight.mean()))")
    result = subprocess.run([sys.executable, "-c", script], env=os.environ.copy(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    layers, hidden, gamma_mean = result.stdout.split()
    assert (layers, hidden) == ("12", "768") and abs(float(gamma_mean) - 1) < 0.01


def test_jax_reads_equal_safetensors_own_flax_reader(tmp_path):
    # The JAX loader copies from its own memory map rather than through safetensors: every
    # dtype, a zero-size tensor and data at odd offsets must come out as safetensors' reader
    # gives them, bit for bit.
    import ml_dtypes

    rng = np.random.default_rng(3)
    path = tmp_path / "mixed.safetensors"
    save_file({"odd": np.arange(3, dtype=np.uint8),  # puts the next tensors at unaligned offsets
               "f32": rng.standard_normal((7, 5), dtype=np.float32),
               "f16": rng.standard_normal((9,), dtype=np.float32).astype(np.float16),
               "bf16": rng.standard_normal((4, 3), dtype=np.float32).astype(ml_dtypes.bfloat16),
               "mask": np.array([True, False, True]),
               "ids": np.arange(6, dtype=np.int32),
               "empty": np.zeros((0, 4), np.float32)}, str(path))
    index = read_index([path])
    specs = {"f32": "f32", "f16": "f16", "bf16": "bf16", "mask": "bool", "ids": "i32", "empty": "f32", "odd": "u8"}
    params = [ParamSpec(key, index[key].shape, dtype) for key, dtype in specs.items()]
    loaded = load_tensors(params, {key: key for key in specs}, index, framework="flax")
    with safe_open(str(path), framework="flax") as own:
        for key in specs:
            expected = own.get_tensor(key)
            assert loaded[key].dtype == expected.dtype and loaded[key].shape == expected.shape, key
            assert np.asarray(loaded[key]).tobytes() == np.asarray(expected).tobytes(), key


_READ_PEAK_SCRIPT = """
import gc, sys
from pathlib import Path
import jax.numpy as jnp
from linnet.middle.params import ParamSpec
from linnet.nest.weights import load_tensors, read_index

def peak_mib():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024

path = Path(sys.argv[1])
index = read_index([path])
params = [ParamSpec(key, info.shape, "f32") for key, info in index.items()]
jnp.zeros(1).block_until_ready()  # jax's own start-up is not the read's
before = peak_mib()
arrays = load_tensors(params, {key: key for key in index}, index, framework="flax")
first = peak_mib() - before
del arrays
gc.collect()
arrays = load_tensors(params, {key: key for key in index}, index, framework="flax")
print(first, peak_mib() - before)
"""


def test_jax_reads_peak_near_the_weights_size_even_loaded_twice(tmp_path):
    # safetensors' flax reader through one open handle peaked at about twice a checkpoint's
    # size (the pages it read stayed mapped, and each tensor passed through a bytes copy);
    # and a second load in the same process, after the first was freed, grew it again by
    # most of the size (the freed copies fragmented the heap).  Measured in a fresh process.
    count, rows = 24, 1024  # 24 tensors of 4 MiB
    path = tmp_path / "big.safetensors"
    rng = np.random.default_rng(0)
    save_file({f"t{i}": rng.standard_normal((rows, 1024), dtype=np.float32) for i in range(count)}, str(path))
    size_mib = count * rows * 1024 * 4 / 2 ** 20
    result = subprocess.run([sys.executable, "-c", _READ_PEAK_SCRIPT, str(path)], env=os.environ.copy(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    first, both = map(float, result.stdout.split())
    assert first < 1.3 * size_mib, f"reading {size_mib:.0f} MiB raised the peak RSS by {first:.0f} MiB"
    assert both < 1.3 * size_mib, f"a second read after freeing the first: peak +{both:.0f} MiB, weights {size_mib:.0f}"
