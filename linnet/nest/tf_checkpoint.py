"""`linnet convert-tf`: google-research/bert's TensorFlow checkpoints as safetensors.

The original BERT releases ship `bert_model.ckpt.index` + `bert_model.ckpt.data-00000-of-00001`
(TensorFlow's tensor-bundle format) and `bert_config.json`.  This module reads the bundle
without TensorFlow and writes what transformers' `load_tf_weights_in_bert` would load into a
`BertForPreTraining`: the same tensors under its `bert.`-prefixed key names, `kernel`s
transposed to PyTorch's `[out, in]`, `gamma`/`beta` as `weight`/`bias`; plus a `config.json`.

The bundle, as TensorFlow writes it (tensorflow/core/util/tensor_bundle):

* `.index` is a sorted string table in LevelDB's format (tensorflow/core/lib/io/table): data
  blocks of prefix-compressed key/value entries, an index block pointing at them, and a
  48-byte footer (two block handles, then a magic number).  Each key is a variable name and
  its value a `BundleEntryProto` (dtype, shape, shard, offset and size in the data file); the
  empty key holds the `BundleHeaderProto` (the number of data shards).
* `.data-SSSSS-of-NNNNN` holds the tensors' raw little-endian bytes at those offsets.

Protocol buffers are decoded by hand here (varints and length-delimited fields of the few
messages above), so the only dependency is numpy.
"""
from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import codes
from ..diagnostics import Note, error

#: The table footer's magic number (LevelDB's, which TensorFlow's table keeps).
_TABLE_MAGIC = 0xDB4775248B80FB57
_FOOTER_SIZE = 48
_NO_COMPRESSION = 0
#: TensorFlow DataType enum values -> numpy dtypes (the ones checkpoints of BERT hold).
_DTYPES = {1: np.float32, 2: np.float64, 3: np.int32, 9: np.int64, 19: np.float16}
#: Variables load_tf_weights_in_bert skips: optimizer slots and the step counter.
_SKIPPED = ("adam_v", "adam_m", "AdamWeightDecayOptimizer", "AdamWeightDecayOptimizer_1", "global_step")
_INDEXED = re.compile(r"([A-Za-z]+)_(\d+)")
#: TF scope names that transformers' modules call otherwise (load_tf_weights_in_bert's renames).
_RENAMED = {"kernel": "weight", "gamma": "weight", "beta": "bias", "output_bias": "bias",
            "output_weights": "weight", "squad": "classifier"}


@dataclass(frozen=True)
class BundleEntry:
    name: str
    dtype: int
    shape: tuple[int, ...]
    shard: int
    offset: int
    size: int


# ---------------------------------------------------------------- protocol buffers


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("a varint runs past the end of its buffer")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(message: bytes):
    """(field number, wire type, value) of each field; value an int or the raw bytes."""
    pos = 0
    while pos < len(message):
        tag, pos = _varint(message, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _varint(message, pos)
        elif wire == 1:
            value, pos = message[pos:pos + 8], pos + 8
        elif wire == 2:
            length, pos = _varint(message, pos)
            value, pos = message[pos:pos + length], pos + length
        elif wire == 5:
            value, pos = message[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"wire type {wire} is not used by tensor-bundle messages")
        yield number, wire, value


def _entry(name: str, message: bytes) -> BundleEntry:
    """A BundleEntryProto: 1 dtype, 2 shape (TensorShapeProto: 2 dim {1 size}), 3 shard_id,
    4 offset, 5 size, 7 slices (a partitioned variable, which BERT checkpoints never hold)."""
    dtype, shape, shard, offset, size = 0, [], 0, 0, 0
    for number, _, value in _fields(message):
        if number == 1:
            dtype = value
        elif number == 2:
            shape = [next((v for n, _, v in _fields(dim) if n == 1), 0)
                     for n, _, dim in _fields(value) if n == 2]
        elif number == 3:
            shard = value
        elif number == 4:
            offset = value
        elif number == 5:
            size = value
        elif number == 7:
            raise ValueError("it is a sliced (partitioned) variable")
    return BundleEntry(name, dtype, tuple(shape), shard, offset, size)


# ---------------------------------------------------------------- the string table


def _block(data: bytes, offset: int, size: int) -> bytes:
    """One table block, checked uncompressed (its trailer's first byte)."""
    if offset + size + 5 > len(data):
        raise ValueError("a block runs past the end of the file")
    if data[offset + size] != _NO_COMPRESSION:
        raise ValueError(f"a block is compressed (type {data[offset + size]}); TensorFlow writes bundle "
                         f"indexes uncompressed, so this file was written by something else")
    return data[offset:offset + size]


def _block_entries(block: bytes):
    """(key, value) of each entry of a block: keys share a prefix with the previous key."""
    restarts = struct.unpack_from("<I", block, len(block) - 4)[0]
    end = len(block) - 4 - 4 * restarts
    pos, key = 0, b""
    while pos < end:
        shared, pos = _varint(block, pos)
        unshared, pos = _varint(block, pos)
        length, pos = _varint(block, pos)
        key = key[:shared] + block[pos:pos + unshared]
        pos += unshared
        yield key, block[pos:pos + length]
        pos += length


def _handle(data: bytes, pos: int = 0) -> tuple[tuple[int, int], int]:
    offset, pos = _varint(data, pos)
    size, pos = _varint(data, pos)
    return (offset, size), pos


def read_index(index_file: Path) -> tuple[int, list[BundleEntry]]:
    """The number of data shards and every tensor's entry, from a bundle's `.index` file."""
    data = index_file.read_bytes()
    if len(data) < _FOOTER_SIZE or struct.unpack_from("<Q", data, len(data) - 8)[0] != _TABLE_MAGIC:
        raise ValueError("it does not end with a table footer (is it a TensorFlow .index file?)")
    footer = data[len(data) - _FOOTER_SIZE:]
    _, pos = _handle(footer)               # the metaindex block: unused by bundles
    (index_offset, index_size), _ = _handle(footer, pos)
    shards, entries = 1, []
    for _, handle in _block_entries(_block(data, index_offset, index_size)):
        (offset, size), _ = _handle(handle)
        for key, value in _block_entries(_block(data, offset, size)):
            if key == b"":  # BundleHeaderProto: 1 num_shards
                shards = next((v for n, _, v in _fields(value) if n == 1), 1)
            else:
                entries.append(_entry(key.decode("utf-8"), value))
    return shards, entries


def read_checkpoint(prefix: Path) -> dict[str, np.ndarray]:
    """Every variable of the checkpoint `prefix` (`.../bert_model.ckpt`), by its TF name."""
    index_file = prefix.with_name(prefix.name + ".index")
    where = Note(f"the checkpoint is {prefix}.index and its .data-* files")
    if not index_file.is_file():
        raise error(codes.TF_CHECKPOINT_UNREADABLE, f"no TensorFlow checkpoint at {prefix}: {index_file} does not "
                                                    f"exist", None, Note("give the prefix the files share, such as "
                                                                         "uncased_L-12_H-768_A-12/bert_model.ckpt"))
    try:
        shards, entries = read_index(index_file)
    except (ValueError, struct.error, UnicodeDecodeError) as exc:
        raise error(codes.TF_CHECKPOINT_UNREADABLE, f"{index_file} cannot be read as a tensor-bundle index: {exc}",
                    None, where) from None
    data: dict[int, bytes] = {}
    tensors = {}
    for entry in entries:
        if entry.dtype not in _DTYPES:
            raise error(codes.TF_CHECKPOINT_UNREADABLE,
                        f"{prefix}: variable {entry.name} has TensorFlow dtype {entry.dtype}, which convert-tf "
                        f"does not read (float16/32/64, int32/64 only)", None, where)
        if entry.shard not in data:
            shard_file = prefix.with_name(f"{prefix.name}.data-{entry.shard:05d}-of-{shards:05d}")
            if not shard_file.is_file():
                raise error(codes.TF_CHECKPOINT_UNREADABLE, f"{prefix}: the data file {shard_file} is missing",
                            None, where)
            data[entry.shard] = shard_file.read_bytes()
        raw = data[entry.shard][entry.offset:entry.offset + entry.size]
        dtype = np.dtype(_DTYPES[entry.dtype]).newbyteorder("<")
        if len(raw) != entry.size or entry.size != int(np.prod(entry.shape, dtype=np.int64)) * dtype.itemsize:
            raise error(codes.TF_CHECKPOINT_UNREADABLE,
                        f"{prefix}: variable {entry.name} should hold {entry.shape} {dtype.name} values, "
                        f"but its bytes in the data file are {len(raw)} (truncated?)", None, where)
        tensors[entry.name] = np.frombuffer(raw, dtype).reshape(entry.shape).astype(dtype.newbyteorder("="))
    return tensors


# ---------------------------------------------------------------- names


def transformers_key(tf_name: str) -> tuple[str, bool] | None:
    """The key load_tf_weights_in_bert loads `tf_name` into, and whether it is transposed;
    None for variables it skips (optimizer slots, the step counter)."""
    scopes = tf_name.split("/")
    if any(scope in _SKIPPED for scope in scopes):
        return None
    parts = []
    for scope in scopes:
        indexed = _INDEXED.fullmatch(scope)
        name, index = (indexed.group(1), indexed.group(2)) if indexed else (scope, None)
        parts.append(_RENAMED.get(name, name))
        if index is not None:
            parts.append(index)
    if scopes[-1].endswith("_embeddings"):
        parts.append("weight")
    return ".".join(parts), scopes[-1] == "kernel"


def convert(prefix: Path, output: Path, config_file: Path | None = None) -> list[Path]:
    """Write `model.safetensors` and `config.json` for the checkpoint `prefix` into `output`."""
    from safetensors.numpy import save_file

    variables = read_checkpoint(prefix)
    config = _bert_config(config_file or prefix.parent / "bert_config.json")
    tensors = {}
    for name, array in sorted(variables.items()):
        mapped = transformers_key(name)
        if mapped is None:
            continue
        key, transposed = mapped
        if not key.startswith(("bert.", "cls.")):
            raise error(codes.TF_CHECKPOINT_NAME,
                        f"{prefix}: variable {name} is outside the `bert/` and `cls/` scopes of google-research/bert's "
                        f"checkpoints, so transformers' BERT layout has no key for it", None,
                        Note(f"it would become {key}"))
        tensors[key] = np.ascontiguousarray(array.T if transposed else array)
    heads = any(key.startswith("cls.") for key in tensors)
    config = {**config, "model_type": "bert", "architectures": ["BertForPreTraining" if heads else "BertModel"]}
    if not heads:  # BertModel keys carry no `bert.` prefix
        tensors = {key.removeprefix("bert."): value for key, value in tensors.items()}
    output.mkdir(parents=True, exist_ok=True)
    weights, written_config = output / "model.safetensors", output / "config.json"
    save_file(tensors, str(weights), metadata={"format": "pt"})
    written_config.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return [weights, written_config]


def _bert_config(path: Path) -> dict:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise error(codes.TF_CHECKPOINT_NAME, f"cannot read the checkpoint's {path.name}: {exc}", None,
                    Note("google-research/bert ships bert_config.json beside bert_model.ckpt.*; "
                         "pass --config if it lies elsewhere")) from None
    if not isinstance(config, dict):
        raise error(codes.TF_CHECKPOINT_NAME, f"{path} must hold a JSON object", None)
    return config
