"""Hostile manifests, bindings and checkpoints: named errors, nothing read or written that should not be.

Complements tests/test_manifest.py and tests/test_weights.py (which cover missing fields,
wrong types, unknown keys, `../` paths, revisions, pins, corrupt headers, malformed bindings
and pickles) with what they did not: symlinked bindings and absolute repository paths,
safetensors headers that safetensors itself would refuse only when the tensors are read
(overlapping, gapped or partial data, bad metadata, overflowing shapes), the same hostile
checkpoints through `nest.load` on every backend's common path, and a proof that failing
loads leave the Hugging Face cache byte-identical.
"""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from linnet import LinnetError, nest
from linnet.nest.manifest import load_manifest
from linnet.nest.weights import read_index
from linnet.paths import zoo_dir

MINILM = "all-minilm-l6-v2"


def copy_entry(parent: Path, name: str = MINILM, edit_nest=lambda t: t, bindings: dict | None = None) -> Path:
    """A private copy of a zoo entry (its manifest files only; the source is the zoo's).

    `bindings`: a bindings.json of the copy's own, named in its nest.toml instead of the
    entry's declared layout.
    """
    entry = parent / f"{name}-copy"
    entry.mkdir(parents=True)
    nest_toml = edit_nest((zoo_dir() / name / "nest.toml").read_text())
    if bindings is not None:
        nest_toml = re.sub(r"(?m)^bindings = \{.*\}$", 'bindings = "bindings.json"', nest_toml)
        (entry / "bindings.json").write_text(json.dumps(bindings))
    (entry / "nest.toml").write_text(nest_toml)
    (entry / "linnet.toml").write_text((zoo_dir() / name / "linnet.toml").read_text())
    return entry


def raises(code: str, call, *args, **kwargs) -> LinnetError:
    with pytest.raises(LinnetError) as caught:
        call(*args, **kwargs)
    assert caught.value.code == code, caught.value.render()
    return caught.value


# --------------------------------------------------------------------------- manifests


def test_bindings_symlinked_out_of_the_entry(tmp_path):
    entry = copy_entry(tmp_path / "zoo", bindings={"x": "y"})
    outside = tmp_path / "elsewhere.json"
    outside.write_text((entry / "bindings.json").read_text())
    (entry / "bindings.json").unlink()
    (entry / "bindings.json").symlink_to(outside)
    err = raises("E0907", load_manifest, entry)
    assert "[weights].bindings" in err.render() and "nest.toml" in err.render()


@pytest.mark.parametrize("name", ["/etc/passwd", "C:\\\\model.safetensors", "a/../../b.safetensors"])
def test_repository_files_must_be_relative(tmp_path, name):
    entry = copy_entry(tmp_path, edit_nest=lambda t: t.replace('files = ["model.safetensors"]',
                                                               f'files = ["{name}"]')
                       .replace('sha256 = { "model.safetensors"', f'sha256 = {{ "{name}"'))
    err = raises("E0907", load_manifest, entry)
    assert "[weights].files" in err.render()


@pytest.mark.parametrize("old, new, code, field", [
    ('name = "all-minilm-l6-v2"', 'name = "../../x"', "E0912", "[model].name"),
    ('name = "all-minilm-l6-v2"', "name = 7", "E0905", "name"),
    ('Layers = 6', 'Layers = "six"', "E0912", "[generics].Layers"),
    ('files = ["model.safetensors"]', 'files = "model.safetensors"', "E0905", "files"),
    ('B = 1', 'B = -1', "E0503", "B"),
])
def test_wrong_values_name_file_and_field(tmp_path, old, new, code, field):
    entry = copy_entry(tmp_path, edit_nest=lambda t: t.replace(old, new))
    with pytest.raises(LinnetError) as caught:
        nest.prepare(entry, need_weights=False)
    codes = [d.code for d in caught.value.diagnostics]
    assert code in codes, caught.value.render()
    assert field in caught.value.render() and "nest.toml" in caught.value.render()


# --------------------------------------------------------------------------- checkpoint headers


def write_raw(path: Path, header: dict, data: bytes) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


F32x3 = {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}


@pytest.mark.parametrize("header, data, reason", [
    ({"a": F32x3, "b": F32x3}, b"\0" * 12, "tensor 'b': data_offsets start at 0, but the tensors before it end at 12"),
    ({"a": {**F32x3, "data_offsets": [4, 16]}}, b"\0" * 16, "tensor 'a': data_offsets start at 4"),
    ({"a": F32x3}, b"\0" * 20, "the tensors cover 12 of the 20 data bytes"),
    ({"__metadata__": [1], "a": F32x3}, b"\0" * 12, "__metadata__ is not an object of strings"),
    ({"__metadata__": {"format": 3}, "a": F32x3}, b"\0" * 12, "__metadata__ is not an object of strings"),
    ({"a": {"dtype": "F32", "shape": [2 ** 40, 2 ** 40, 0], "data_offsets": [0, 0]}}, b"",
     "overflows 64-bit sizes"),
])
def test_headers_safetensors_would_refuse_later_are_refused_at_once(tmp_path, header, data, reason):
    """Each of these passed the header check before and failed inside safe_open, unnamed."""
    from safetensors import SafetensorError, safe_open

    path = write_raw(tmp_path / "bad.safetensors", header, data)
    with pytest.raises(SafetensorError):  # what the tensor read would have met
        with safe_open(str(path), framework="numpy") as f:
            [f.get_tensor(k) for k in f.keys()]
    err = raises("E1004", read_index, [path])
    assert reason in err.diagnostics[0].message and "bad.safetensors" in err.render()


def test_zero_sized_tensors_and_metadata_are_fine(tmp_path):
    path = tmp_path / "ok.safetensors"
    save_file({"a": np.zeros((0, 3), np.float32), "b": np.ones(2, np.float16)}, str(path),
              metadata={"format": "pt"})
    assert {k: v.shape for k, v in read_index([path]).items()} == {"a": (0, 3), "b": (2,)}


# --------------------------------------------------------------------------- nest.load with hostile weights


@pytest.fixture(scope="module")
def minilm_tensors(minilm_checkpoint):
    return load_file(str(minilm_checkpoint / "model.safetensors"))


class _Tripwire:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def _variant(tmp_path: Path, tensors: dict, change: str) -> Path:
    folder = tmp_path / change.replace(" ", "-")
    folder.mkdir()
    tensors = dict(tensors)
    key = "encoder.layer.0.attention.self.query.weight"
    if change == "wrong dtype":
        tensors[key] = tensors[key].astype(np.float16)
    elif change == "wrong shape":
        tensors[key] = tensors[key][:, :-1].copy()
    elif change == "missing tensor":
        del tensors[key]
    elif change == "extra tensors":
        tensors["classifier.weight"] = np.zeros((2, 384), np.float32)
    save_file(tensors, str(folder / "model.safetensors"))
    if change == "truncated":
        data = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(data[:-1000])
    if change == "corrupt header":
        data = bytearray((folder / "model.safetensors").read_bytes())
        data[20:30] = b"\xff" * 10
        (folder / "model.safetensors").write_bytes(bytes(data))
    return folder / "model.safetensors"


@pytest.mark.parametrize("change, code, words", [
    ("truncated", "E1004", ["model.safetensors", "lie outside"]),
    ("corrupt header", "E1004", ["model.safetensors", "not valid JSON"]),
    ("wrong dtype", "E1010", ["layers.0.attention.query.weight", "encoder.layer.0.attention.self.query.weight",
                              "F16", "dtype= to nest.load"]),
    ("wrong shape", "E1009", ["layers.0.attention.query.weight", "[384, 383]", "Tensor[384, 384; f32]"]),
    ("missing tensor", "E1008", ["layers.0.attention.query.weight", "encoder.layer.0.attention.self.query.weight"]),
])
def test_hostile_checkpoints_fail_before_any_tensor_is_read(tmp_path, minilm_tensors, monkeypatch, change, code,
                                                           words):
    import linnet.nest.weights as weights

    path = _variant(tmp_path, minilm_tensors, change)

    def no_reads(*args, **kwargs):
        raise AssertionError("tensor data was read before the checkpoint was verified")

    monkeypatch.setattr(weights, "_read_file", no_reads)
    err = raises(code, nest.load, MINILM, backend="onnx", weights=path)
    for word in words:
        assert word in err.render(), (word, err.render())


def test_extra_tensors_are_reported_not_fatal(tmp_path, minilm_tensors):
    path = _variant(tmp_path, minilm_tensors, "extra tensors")
    ctx, info = nest.prepare(MINILM, weights=path)
    assert "classifier.weight" in info.report.unused_keys


def test_a_pickle_offered_as_weights_is_never_unpickled(tmp_path):
    marker = tmp_path / "unpickled"
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(_Tripwire(marker)))
    # Renamed to .safetensors, it is parsed as one (and refused), never handed to pickle.
    (tmp_path / "model.safetensors").write_bytes(pickle.dumps(_Tripwire(marker)))
    raises("E1003", nest.load, MINILM, backend="torch", weights=folder)
    raises("E1003", nest.load, MINILM, backend="torch", weights=folder / "pytorch_model.bin")
    raises("E1004", nest.load, MINILM, backend="torch", weights=tmp_path / "model.safetensors")
    assert not marker.exists()


# --------------------------------------------------------------------------- the HF cache stays untouched


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under the cache: file content hashes, link targets, folders."""
    tree = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(".locks"):  # huggingface_hub's own lock files
            continue
        if path.is_symlink():
            tree[rel] = ("link", os.readlink(path))
        elif path.is_file():
            digest = hashlib.sha256()
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 22), b""):
                    digest.update(chunk)
            tree[rel] = ("file", path.stat().st_size, digest.hexdigest())
        else:
            tree[rel] = ("dir",)
    return tree


def test_failing_loads_leave_the_hf_cache_byte_identical(tmp_path, hf_cache, minilm_checkpoint, minilm_tensors):
    before = snapshot(hf_cache)
    assert any("all-MiniLM-L6-v2" in k for k in before)
    failures = [
        # a pin that does not match the cached file
        lambda: nest.load(copy_entry(tmp_path / "a", edit_nest=lambda t: t.replace(
            "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db", "0" * 64)), backend="onnx"),
        # a revision that is not cached, offline
        lambda: nest.load(MINILM, backend="onnx", revision="f" * 40),
        # bindings that do not fit the cached checkpoint
        lambda: nest.load(copy_entry(tmp_path / "b", bindings={"x": "y"}), backend="torch"),
        # corrupt and pickle checkpoints given as weights=
        lambda: nest.load(MINILM, backend="onnx", weights=_variant(tmp_path, minilm_tensors, "truncated")),
        lambda: nest.load(MINILM, backend="jax", weights=_variant(tmp_path, minilm_tensors, "wrong shape")),
        lambda: nest.load("bert-base-uncased", backend="torch", revision="e" * 40),
    ]
    codes = []
    for fail in failures:
        with pytest.raises(LinnetError) as caught:
            fail()
        codes.append(caught.value.code)
    assert codes == ["E1002", "E1001", "E1006", "E1004", "E1009", "E1001"]
    assert snapshot(hf_cache) == before
