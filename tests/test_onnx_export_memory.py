"""The runtime's ONNX export (`onnx_runtime._write_entry_models`): memory while building it,
and what it writes.

The export holds one graph per entry, each reading all the weights.  Emitted together, with
their weights inline, bert-base's seven graphs held 4.7 GB at once; now one graph is in
memory at a time, without its weights' bytes (`onnx_external.ExternalWeights` copies each
weight from the checkpoint's array to `weights.bin` as the graph is written).  These tests
check the memory bound on MiniLM (real weights) by the process's peak RSS, since the graphs'
protobuf memory is not Python's and tracemalloc does not see it; and that the files hold the
emitted values, each weight once on disk.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from linnet import dtypes, nest
from linnet.backends import integration
from linnet.backends.onnx_graph import emit, layout
from linnet.backends.onnx_runtime import WEIGHTS_FILE, _write_entry_models


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"/proc/self/status has no {field} (these tests need Linux)")


def _reset_peak_rss() -> None:
    """Start VmHWM again from the current RSS (Linux: writing 5 to clear_refs)."""
    Path("/proc/self/clear_refs").write_text("5")


@pytest.fixture(scope="module")
def minilm_ctx(minilm_checkpoint):
    """MiniLM prepared as nest.load prepares it for the onnx backend (packing included)."""
    ctx, _ = nest.prepare("all-minilm-l6-v2", optimize=nest.backend_passes("onnx", integration("onnx")))
    return ctx


def _weight_bytes(ctx) -> int:
    """The params' bytes, from their declared types (reads no weights)."""
    return sum(math.prod(d.as_int() for d in t.dims) * dtypes.by_name(t.dtype).itemsize
               for _, t in ctx.program.param_paths())


def test_the_export_holds_one_graph_and_no_copy_of_its_weights_at_a_time(minilm_ctx, tmp_path):
    weights = _weight_bytes(minilm_ctx)
    graphs = len(layout(minilm_ctx.program, minilm_ctx.manifest.source.entry))
    assert graphs >= 3  # so holding every graph's weights at once would be far past the bound
    before = _status_kib("VmRSS") * 1024
    _reset_peak_rss()
    _write_entry_models(minilm_ctx, tmp_path / "export", "native")
    grown = _status_kib("VmHWM") * 1024 - before
    # What the build has to hold: the checkpoint's arrays, loaded inside it, and one weight in
    # flight (a transposed copy while it is written), plus small graphs: under two copies of
    # the weights.  Emitting every graph with its weights inline held about one copy per
    # graph (708 MiB for MiniLM's 87 MiB, five graphs); reading the checkpoint through one
    # safetensors handle held a second copy's worth of mapped pages (174 MiB).
    assert grown < 2 * weights, f"the build grew by {grown / 2**20:.0f} MiB for {weights / 2**20:.0f} MiB of weights"


def _initializers(path: Path) -> dict[str, np.ndarray]:
    model = onnx.load(str(path))  # with its external data
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def test_the_files_hold_the_emitted_weights_each_once_on_disk(minilm_ctx, tmp_path):
    folder = tmp_path / "export"
    _write_entry_models(minilm_ctx, folder, "native")
    ctx = minilm_ctx
    # The same program emitted with every weight inline: what each graph must read.
    inline = {}
    for model_file in emit(ctx.program, ctx.tensors("numpy"), name=ctx.name,
                           outputs={e: ctx.output_name(e) for e in ctx.program.entries},
                           root_entry=ctx.manifest.source.entry, generics=ctx.compiled.generics):
        inline.update((t.name, numpy_helper.to_array(t)) for t in model_file.model.graph.initializer)
    graph_files = sorted(folder.glob("*.onnx"))
    assert len(graph_files) > 3
    for path in graph_files:
        for name, value in _initializers(path).items():
            assert value.dtype == inline[name].dtype and np.array_equal(value, inline[name]), (path.name, name)
    # Every external tensor of every graph points into weights.bin, and the distinct ranges
    # tile it exactly: each weight is on disk once, whatever number of graphs reads it.
    ranges = set()
    for path in graph_files:
        for tensor in onnx.load(str(path), load_external_data=False).graph.initializer:
            if tensor.data_location == onnx.TensorProto.EXTERNAL:
                info = {e.key: e.value for e in tensor.external_data}
                assert info["location"] == WEIGHTS_FILE
                ranges.add((int(info["offset"]), int(info["length"])))
    assert [p.name for p in folder.iterdir() if not p.name.endswith(".onnx")] == [WEIGHTS_FILE]
    ends = 0
    for offset, length in sorted(ranges):
        assert offset == ends, "weights.bin holds bytes no graph reads, or two ranges overlap"
        ends = offset + length
    assert ends == (folder / WEIGHTS_FILE).stat().st_size
