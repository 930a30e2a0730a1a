"""One copy of each weight for every ONNX Runtime session of a loaded model (`share_weights=True`).

The runtime's export (`onnx_runtime._write_entry_models`) writes each weight once, to
`weights.bin`, and every graph of the folder (`model.<entry>.onnx`, `decoder_model.onnx`,
`decoder_with_past_model.onnx`) refers to those bytes by (file, offset, length). ONNX Runtime
still gives each session a copy of its own: it maps or reads the external data per session and,
on the CPU provider, pre-packs every constant MatMul/Gemm weight into a per-session buffer
(the Python API has no shared pre-packed container). A loaded full-size GPT-2 on ONNX opens
three sessions (forward, prefill, one step), so it held about three copies of its ~500 MB.

`SharedWeights` maps each data file once (`numpy.memmap`, copy-on-write, so nothing ever
writes the cache) and wraps every external initializer's bytes in one `onnxruntime.OrtValue`,
keyed by where the bytes are, so the same weight read by several graphs is one OrtValue.
`SessionOptions.add_initializer` hands those to each session, which then reads them in place
instead of loading its own. Pre-packing must be off for this to save anything (a pre-packed
session keeps its packed copy *and* ours), which costs speed: see docs/backend-onnx.md
("Memory") for the measured trade. Such a runtime loads its own export, in which a tied head
reads its weight in place (`onnx_graph.GraphEmitter.params_in_place`). The OrtValues and the arrays under them live as long as this object,
which the runtime keeps as long as its sessions.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

#: ONNX Runtime's session config key that stops the per-session packed weight copies.
DISABLE_PREPACKING = "session.disable_prepacking"


class SharedWeights:
    """The OrtValues over one export folder's external weights, made once, shared by sessions."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self._maps: dict[str, np.memmap] = {}           # data file name -> its one mapping
        self.values: dict[tuple[str, int, int], tuple[np.ndarray, object]] = {}  # (file, offset, length) -> (array, OrtValue)
        self.given: dict[str, dict[str, tuple[str, int, int]]] = {}  # graph file -> {initializer: key}

    def register(self, options, model_file: str) -> None:
        """Give `options` (the session's, before it is created) every external initializer of
        `model_file` as a shared OrtValue, and turn pre-packing off (see the module docstring)."""
        options.add_session_config_entry(DISABLE_PREPACKING, "1")
        given = self.given.setdefault(model_file, {})
        for name, key, tensor in self._external_initializers(model_file):
            given[name] = key
            options.add_initializer(name, self._value(key, tensor)[1])

    def array(self, model_file: str, initializer: str) -> np.ndarray:
        """The array a session of `model_file` reads `initializer` from (for tests and tools)."""
        return self.values[self.given[model_file][initializer]][0]

    def _external_initializers(self, model_file: str):
        import onnx

        model = onnx.load(str(self.folder / model_file), load_external_data=False)
        for tensor in model.graph.initializer:
            if tensor.data_location != onnx.TensorProto.EXTERNAL:
                continue
            info = {entry.key: entry.value for entry in tensor.external_data}
            yield tensor.name, (info["location"], int(info.get("offset", 0)), int(info["length"])), tensor

    def _value(self, key: tuple[str, int, int], tensor):
        value = self.values.get(key)
        if value is None:
            import onnxruntime as ort
            from onnx.helper import tensor_dtype_to_np_dtype

            location, offset, length = key
            mapping = self._maps.get(location)
            if mapping is None:
                # "c": private copy-on-write pages; ORT only reads them, the cache file stays as written.
                mapping = self._maps[location] = np.memmap(self.folder / location, mode="c")
            array = mapping[offset:offset + length].view(tensor_dtype_to_np_dtype(tensor.data_type))
            array = array.reshape(tuple(tensor.dims))
            value = self.values[key] = (array, ort.OrtValue.ortvalue_from_numpy(array))
        return value
