"""Golden generated code: all-minilm-l6-v2's PyTorch and JAX sources and its ONNX graph, pinned.

`tests/golden/codegen/` holds what the emitters make of the MiniLM entry: the two Python
sources verbatim, and the ONNX model as readable text (every node's op type, name, inputs,
outputs, attributes and doc string; every initializer's name, dtype and shape; the graph's
inputs, outputs and metadata).  A change to an emitter, to lowering or to the BERT source
thus shows up as a reviewable diff (tinygrad's "process replay", PyTorch's
`assertExpectedInline`).  After a deliberate change, refresh the files with

    LINNET_UPDATE_GOLDEN=1 python -m pytest tests/test_codegen_golden.py

(the flag the diagnostics goldens of `test_corpus.py` use) and review `git diff`.

The files name Linnet sources from the folder that holds std/ and nest/
(`std/nn/linear.linnet:12`), so they are the same whatever the working directory or the
checkout's location: the program is compiled twice, from the repository and from an
unrelated folder, and both must give the same text.
"""
from __future__ import annotations

import difflib
import os
from pathlib import Path

import numpy as np
import pytest

from linnet.cli.targets import locate
from linnet.compiler import compile_target
from linnet.middle.lower import lower
from linnet.nest.manifest import load_manifest
from linnet.paths import zoo_dir

REPO = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden" / "codegen"
UPDATE = os.environ.get("LINNET_UPDATE_GOLDEN") == "1"
ENTRY = "all-minilm-l6-v2"


def check_golden(text: str, name: str) -> None:
    """`text` must equal the golden file `name`; with LINNET_UPDATE_GOLDEN=1 it is written instead."""
    golden = GOLDEN / name
    if UPDATE:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text, encoding="utf-8")
        return
    refresh = "rerun with LINNET_UPDATE_GOLDEN=1 to write it, then review the diff"
    assert golden.is_file(), f"{golden.relative_to(REPO)} is missing; {refresh}"
    expected = golden.read_text(encoding="utf-8")
    if text != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(keepends=True), text.splitlines(keepends=True),
                                            f"{golden.relative_to(REPO)} (golden)", "generated now", n=2))
        pytest.fail(f"the generated code differs from {golden.relative_to(REPO)}; if the change is deliberate, "
                    f"rerun with LINNET_UPDATE_GOLDEN=1 and review `git diff`:\n{diff}", pytrace=False)


def _lowered(cwd: Path, monkeypatch):
    """The entry lowered as `linnet build` lowers it, compiled with `cwd` as the working directory
    (no compile cache, so the spans are the ones made there)."""
    monkeypatch.chdir(cwd)
    compiled = compile_target(locate(str(zoo_dir() / ENTRY)))
    return lower(compiled.instance), dict(compiled.generics)


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    with pytest.MonkeyPatch.context() as monkeypatch:
        return {"the repository": _lowered(REPO, monkeypatch),
                "another folder": _lowered(tmp_path_factory.mktemp("elsewhere"), monkeypatch)}


def _each(programs, render) -> str:
    """`render` of both compilations, which must agree; the text once."""
    texts = {where: render(*compiled) for where, compiled in programs.items()}
    first, second = texts.values()
    assert first == second, "the generated code depends on the working directory it was compiled from"
    return first


def test_torch_source_is_the_golden_one(programs):
    from linnet.backends import torch_source as pytorch

    check_golden(_each(programs, lambda program, _: pytorch.emit(program)), f"{ENTRY}.torch.py")


def test_jax_source_is_the_golden_one(programs):
    from linnet.backends import jax_source as jax

    check_golden(_each(programs, lambda program, _: jax.emit(program)), f"{ENTRY}.jax.py")


def test_onnx_graph_is_the_golden_one(programs):
    check_golden(_each(programs, onnx_summary), f"{ENTRY}.onnx.txt")


# --------------------------------------------------------------------------- ONNX as text


def onnx_summary(program, generics: dict) -> str:
    """The entry's ONNX models as text; the weights are zeros, only their names and shapes show."""
    from linnet import dtypes
    from linnet.backends import onnx_graph as onnx_backend

    tensors = {path: np.zeros([d.as_int() for d in t.dims], dtypes.by_name(t.dtype).numpy_type())
               for path, t in program.param_paths()}
    manifest = load_manifest(ENTRY)
    outputs = {entry: manifest.output_name(entry) for entry in program.entries}
    files = onnx_backend.emit(program, tensors, name=ENTRY, outputs=outputs, root_entry=manifest.source.entry,
                              generics=generics, source=ENTRY)
    return "\n".join(_model_text(f.file, f.model) for f in files)


def _model_text(file: str, model) -> str:
    from onnx import helper

    graph = model.graph
    opsets = ", ".join(f"{o.domain or 'ai.onnx'} {o.version}" for o in model.opset_import)
    lines = [f"file {file}: ir_version {model.ir_version}, opset {opsets}, "
             f"producer {model.producer_name} {model.producer_version}",
             f"doc: {model.doc_string}", "metadata:"]
    lines += [f"  {p.key} = {p.value}" for p in model.metadata_props]
    lines += [f"graph {graph.name}: {graph.doc_string}", "inputs:"]
    lines += [f"  {_value_text(v)}" for v in graph.input]
    lines += ["outputs:"] + [f"  {_value_text(v)}" for v in graph.output]
    lines += ["initializers:"]
    lines += [f"  {t.name}: {_dtype(t.data_type)}[{', '.join(map(str, t.dims))}]"
              + (f"  # {t.doc_string}" if t.doc_string else "") for t in graph.initializer]
    lines += ["nodes:"]
    for node in graph.node:
        attrs = ", ".join(f"{a.name}={_attribute_text(helper.get_attribute_value(a))}" for a in node.attribute)
        lines.append(f"  {node.name}: {node.op_type}({', '.join(node.input)})" + (f" {{{attrs}}}" if attrs else "")
                     + f" -> {', '.join(node.output)}")
        if node.doc_string:
            lines.append(f"      # {node.doc_string}")
    return "\n".join(lines) + "\n"


def _dtype(elem_type: int) -> str:
    from onnx import TensorProto

    return TensorProto.DataType.Name(elem_type)


def _value_text(value) -> str:
    t = value.type.tensor_type
    dims = [d.dim_param or str(d.dim_value) for d in t.shape.dim]
    return f"{value.name}: {_dtype(t.elem_type)}[{', '.join(dims)}]"


def _attribute_text(value) -> str:
    from onnx import TensorProto, numpy_helper

    if isinstance(value, TensorProto):
        array = numpy_helper.to_array(value)
        shown = f" {array.tolist()!r}" if array.size <= 8 else ""
        return f"tensor {_dtype(value.data_type)}[{', '.join(map(str, value.dims))}]{shown}"
    if isinstance(value, bytes):
        return repr(value.decode())
    return repr(value)
