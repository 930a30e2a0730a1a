"""Writing the runtime export's graphs with their weights as ONNX external data, one graph at a time.

`onnx.save(model, save_as_external_data=True)` needs every weight inside the proto as
`raw_data` before it writes it out, so an export emitted that way held each graph's full copy
of the weights, and the runtime's export emitted all its graphs first: seven graphs of
bert-base at ~420 MB each peaked at 4.7 GB of RSS.  Here the graphs come from
`onnx_graph.emit_each(..., defer_weights=True)`, whose initializers hold only names and
shapes, and `ExternalWeights.save` copies each weight from the checkpoint's array to the data
file as it goes (a transposed weight is transposed then, one at a time).

The files are the ones `onnx.save` wrote, byte for byte: the same tensors go to the data
file (those whose `raw_data` would pass onnx's `size_threshold` of 1024, which it compares
with `sys.getsizeof` of the bytes object), in the graph's order, with the same
`external_data` entries (location, offset, length); smaller ones stay inline.  A tensor some
earlier graph of the export already wrote (the same name, type, shape, doc string and bytes)
is a reference to those bytes, so the weights are on disk once (`weights.bin`, which
`onnx_weights.SharedWeights` maps and the Triton exporter packages).
"""
from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

#: onnx.save's default `size_threshold`: smaller tensors stay inside the graph file.
SIZE_THRESHOLD = 1024
#: onnx compares `sys.getsizeof(raw_data)`, which counts the bytes object's own header too.
_BYTES_HEADER = sys.getsizeof(b"")


class ExternalWeights:
    """The data files of one export folder, and which tensors they hold already."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self._written: dict[tuple, object] = {}  # a tensor's content key -> a TensorProto referring to its bytes
        self._digests: dict[tuple[int, bool], tuple[object, bytes]] = {}  # (id(array), transposed) -> (array, digest)
        self._ends: dict[str, int] = {}  # data file -> its size so far

    def save(self, model, deferred: dict, file: str, data: str) -> Path:
        """Write `model` to `file` in the folder, its weights to `data` (or references to bytes
        written before).  deferred: initializer name -> `onnx_graph.DeferredWeight` for the
        initializers emitted without data.  `model` keeps the references, not the bytes."""
        import onnx

        self.folder.mkdir(parents=True, exist_ok=True)
        for tensor in model.graph.initializer:
            self._place(tensor, deferred.get(tensor.name), data)
        path = self.folder / file
        onnx.save(model, str(path))
        return path

    def _place(self, tensor, weight, data: str) -> None:
        """Point one initializer at its bytes in a data file, or leave it inline when small."""
        from onnx import TensorProto

        if weight is None and not tensor.HasField("raw_data"):
            return  # a reference already, or typed data onnx would not move either
        payload = weight.payload() if weight is not None else memoryview(tensor.raw_data)
        size = payload.nbytes
        key = None
        if size >= SIZE_THRESHOLD:
            key = (tensor.name, tensor.data_type, tuple(tensor.dims), tensor.doc_string, self._digest(weight, payload))
            earlier = self._written.get(key)
            if earlier is not None:
                tensor.CopyFrom(earlier)
                return
        if size + _BYTES_HEADER < SIZE_THRESHOLD:
            if weight is not None:
                tensor.raw_data = payload.tobytes()
            return
        offset = self._append(data, payload)
        tensor.ClearField("raw_data")
        del tensor.external_data[:]
        tensor.data_location = TensorProto.EXTERNAL
        for field, value in (("location", data), ("offset", offset), ("length", size)):
            entry = tensor.external_data.add()
            entry.key, entry.value = field, str(value)
        if key is not None:
            self._written[key] = type(tensor).FromString(tensor.SerializeToString())

    def _digest(self, weight, payload) -> bytes:
        """The bytes' digest; a deferred weight's once per array (graphs read the same arrays)."""
        if weight is None:
            return hashlib.blake2b(payload, digest_size=20).digest()
        memo = (id(weight.array), weight.transposed)
        known = self._digests.get(memo)
        if known is None or known[0] is not weight.array:  # the array itself is kept, so its id stays its own
            known = self._digests[memo] = (weight.array, hashlib.blake2b(payload, digest_size=20).digest())
        return known[1]

    def _append(self, data: str, payload) -> int:
        """Append the bytes to the data file; their offset."""
        path = self.folder / data
        if data not in self._ends:
            self._ends[data] = path.stat().st_size if path.exists() else 0
        offset = self._ends[data]
        # Owner-only, as onnx's own writer creates the file.
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as out:
            out.write(payload)
        self._ends[data] = offset + payload.nbytes
        return offset
