"""`static for i, layer in enumerate(layers)`: a loop that knows its pass number.

The pass number is a dim the checker knows to lie in 0 <= i < the array's length, so an index
such as `table[i + 1]` of an axis `Layers + 1` is proven in bounds, and one that is not proven
(`table[i + 2]`) is refused with its place. A small program is emitted for torch, JAX and ONNX
and compared with numpy; the generated Python shows the `enumerate` a reader expects. (GPT-2's
`decode` reads each layer's cache slot this way: tests/test_gpt2.py.)
"""
from __future__ import annotations

import textwrap

import numpy as np
import pytest

from linnet import codes
from linnet.cli.targets import locate
from linnet.compiler import compile_target
from linnet.diagnostics import LinnetError
from linnet.middle import ir
from linnet.middle.instantiate import instantiate
from linnet.middle.lower import lower

# Each layer adds row i + 1 of `shifts` scaled by i, and the collect keeps row i of `marks`
# (a slice that depends on the pass number too).
SOURCE = """\
use std.nn.linear::{Linear}

block Shifted<D: Dim, Layers: Dim> {
    sub layers: [Linear<D, D, f32>; Layers]

    entry forward<B: Dim>(x: Tensor[B, D; f32], shifts: Tensor[Layers + 1, D; f32]) -> Tensor[B, D; f32] {
        var h = x
        static for i, layer in enumerate(layers) {
            h = layer.forward(h) + shifts[INDEX] * cast<f32>(i)
        }
        return h
    }

    entry marks<B: Dim>(marks: Tensor[Layers, B, D; f32]) -> Tensor[Layers + 1, B, D; f32] {
        var row = marks[0]
        let rows = static for i, layer in enumerate(layers) collect row {
            row = marks[i:i + 1][0] * 2.0
        }
        return rows
    }
}
"""

D, LAYERS = 3, 4


def compiled_program(tmp_path, index: str = "i + 1"):
    path = tmp_path / "shifted.linnet"
    path.write_text(SOURCE.replace("INDEX", index), encoding="utf-8")
    return compile_target(locate(path))


def expected_forward(weights, x, shifts):
    h = x.astype(np.float64)
    for i in range(LAYERS):
        h = h @ weights[f"layers.{i}.weight"].T.astype(np.float64) + weights[f"layers.{i}.bias"] + shifts[i + 1] * i
    return h


def test_an_index_from_the_pass_number_runs_on_torch_jax_and_onnx(tmp_path):
    import jax
    import onnxruntime as ort
    import torch

    from linnet.backends import jax_source, onnx_graph, torch_source
    from linnet.backends.pysource import import_generated
    from linnet.backends.torch_runtime import torch_param_name

    program = lower(instantiate(compiled_program(tmp_path).checked, "Shifted", {"D": D, "Layers": LAYERS}))
    ir.verify(program)
    rng = np.random.default_rng(3)
    weights = {p: rng.standard_normal(tuple(d.as_int() for d in t.dims)).astype(np.float32)
               for p, t in program.param_paths()}
    x = rng.standard_normal((2, D)).astype(np.float32)
    shifts = rng.standard_normal((LAYERS + 1, D)).astype(np.float32)
    marks = rng.standard_normal((LAYERS, 2, D)).astype(np.float32)
    expected = expected_forward(weights, x, shifts)
    expected_marks = np.concatenate([marks[:1], marks * 2.0])

    source = torch_source.emit(program)
    assert "for i, layer in enumerate(self.layers):" in source
    (tmp_path / "model.py").write_text(source)
    model = import_generated(tmp_path / "model.py", "linnet_test_enumerate").Shifted()
    model.load_state_dict({torch_param_name(k): torch.from_numpy(v) for k, v in weights.items()})
    with torch.no_grad():
        got = {"torch": (model.forward(torch.from_numpy(x), torch.from_numpy(shifts)).numpy(),
                         model.marks(torch.from_numpy(marks)).numpy())}
    namespace: dict = {}
    exec(compile(jax_source.emit(program), "shifted_jax.py", "exec"), namespace)
    tree = jax_source.params_tree(program, weights)
    got["jax"] = (np.asarray(jax.jit(namespace["ENTRIES"]["forward"])(tree, x, shifts)),
                  np.asarray(jax.jit(namespace["ENTRIES"]["marks"])(tree, marks)))
    files = onnx_graph.emit(program, weights, name="shifted", outputs={"forward": "y", "marks": "rows"})
    runs = []
    for model_file, inputs in zip(files, ({"x": x, "shifts": shifts}, {"marks": marks})):
        session = ort.InferenceSession(model_file.model.SerializeToString(), providers=["CPUExecutionProvider"])
        runs.append(session.run(None, inputs)[0])
    got["onnx"] = tuple(runs)
    for backend, (forward, rows) in got.items():
        np.testing.assert_allclose(forward, expected, rtol=1e-5, atol=1e-5, err_msg=backend)
        np.testing.assert_allclose(rows, expected_marks, rtol=0, atol=1e-6, err_msg=backend)


def test_an_index_not_proven_in_every_pass_is_refused_with_its_place(tmp_path):
    with pytest.raises(LinnetError) as caught:
        compiled_program(tmp_path, "i + 2")
    text = caught.value.render()
    assert caught.value.code == codes.INDEX_OUT_OF_BOUNDS.code and "index i + 2 is not proven in bounds" in text
    assert "shifted.linnet:9:" in text and "`i` runs from 0 to the loop's length - 1" in text


@pytest.mark.parametrize("loop,says", [
    ("static for layer, layer in enumerate(layers)", "names both the pass number and the sub-block"),
    ("static for B, layer in enumerate(layers)", "`B` is already bound here"),
])
def test_a_pass_number_needs_a_name_of_its_own(tmp_path, loop, says):
    path = tmp_path / "dup.linnet"
    path.write_text(SOURCE.replace("INDEX", "1").replace("static for i, layer in enumerate(layers)", loop, 1))
    with pytest.raises(LinnetError) as caught:
        compile_target(locate(path))
    assert says in caught.value.render()


def test_enumerate_is_still_a_name_elsewhere(tmp_path):
    """Only after `in` of a loop head is `enumerate` part of the loop's syntax."""
    path = tmp_path / "plain.linnet"
    path.write_text(textwrap.dedent("""\
        fn enumerate_twice(enumerate: Tensor[2; f32]) -> Tensor[2; f32] {
            return enumerate * 2.0
        }
    """))
    compile_target(locate(path))


def test_a_shape_that_depends_on_the_pass_number_is_refused(tmp_path):
    """Every pass runs one body with one set of types: `shifts[i:]` would have Layers + 1 - i rows."""
    path = tmp_path / "tail.linnet"
    path.write_text(SOURCE.replace("shifts[INDEX] * cast<f32>(i)", "shifts[i:][0] * cast<f32>(i)"), encoding="utf-8")
    with pytest.raises(LinnetError) as caught:
        compile_target(locate(path))
    text = caught.value.render()
    assert caught.value.code == codes.SHAPE_FROM_PASS_NUMBER.code
    assert "shape Tensor[Layers - i + 1, D; f32] depends on the pass number" in text and "tail.linnet:9:" in text


def test_a_dim_local_computed_from_the_pass_number_lowers_and_runs(tmp_path):
    """`let k = ...i...` binds a dim that differs per pass; each read is that dim for the pass
    (ModernBERT picks full or sliding layers so). It once passed the checker and then stopped
    lowering with an InternalError ("a type that is not concrete")."""
    import jax
    import onnxruntime as ort
    import torch

    from linnet.backends import jax_source, onnx_graph, torch_source
    from linnet.backends.pysource import import_generated
    from linnet.backends.torch_runtime import torch_param_name

    path = tmp_path / "dimlocal.linnet"
    path.write_text(SOURCE.replace("INDEX", "i + 1").replace(
        "            h = layer.forward(h) + shifts[i + 1] * cast<f32>(i)\n",
        "            let odd = (i + 1) % 2\n"
        "            var scale = 3 * odd + i\n"
        "            scale = 3 * odd + i\n"
        "            h = layer.forward(h) + shifts[i + 1] * cast<f32>(scale)\n"), encoding="utf-8")
    checked = compile_target(locate(path)).checked
    program = lower(instantiate(checked, "Shifted", {"D": D, "Layers": LAYERS}))
    ir.verify(program)
    rng = np.random.default_rng(5)
    weights = {p: rng.standard_normal(tuple(d.as_int() for d in t.dims)).astype(np.float32)
               for p, t in program.param_paths()}
    x = rng.standard_normal((2, D)).astype(np.float32)
    shifts = rng.standard_normal((LAYERS + 1, D)).astype(np.float32)
    h = x.astype(np.float64)
    for i in range(LAYERS):
        scale = 3 * ((i + 1) % 2) + i  # 3, 1, 5, 3
        h = h @ weights[f"layers.{i}.weight"].T.astype(np.float64) + weights[f"layers.{i}.bias"] + shifts[i + 1] * scale

    (tmp_path / "model.py").write_text(torch_source.emit(program))
    model = import_generated(tmp_path / "model.py", "linnet_test_dim_local").Shifted()
    model.load_state_dict({torch_param_name(k): torch.from_numpy(v) for k, v in weights.items()})
    with torch.no_grad():
        got = {"torch": model.forward(torch.from_numpy(x), torch.from_numpy(shifts)).numpy()}
    namespace: dict = {}
    exec(compile(jax_source.emit(program), "dimlocal_jax.py", "exec"), namespace)
    got["jax"] = np.asarray(jax.jit(namespace["ENTRIES"]["forward"])(jax_source.params_tree(program, weights), x, shifts))
    model_file = onnx_graph.emit(program, weights, name="dimlocal", outputs={"forward": "y", "marks": "rows"})[0]
    session = ort.InferenceSession(model_file.model.SerializeToString(), providers=["CPUExecutionProvider"])
    got["onnx"] = session.run(None, {"x": x, "shifts": shifts})[0]
    for backend, forward in got.items():
        np.testing.assert_allclose(forward, h, rtol=1e-5, atol=1e-5, err_msg=backend)
