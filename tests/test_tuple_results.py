"""Several results from one entry: `-> (out: A, totals: B)`, `return (a, b)`, `let (a, b) = f(x)`.

A small zoo entry whose root block destructures a sub-block's two results and returns two of
its own (named), and delegates (`pub use`) an entry of the sub-block that returns two unnamed
ones.  Each backend's results are compared with the same computation written in numpy; the
errors of misuse are in the golden corpus (`tests/golden/errors/tuple_*.linnet`).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from test_triton import triton_tools  # noqa: F401 - the session's provisioned tools (a fixture)

from linnet import codes, nest
from linnet.diagnostics import LinnetError

SOURCE = """\
module pairs

pub block Pair<D: Dim> {
    param w: Tensor[D, D; f32]
    pub fn both<*S: Shape>(x: Tensor[*S, D; f32]) -> (Tensor[*S, D; f32], Tensor[*S, 1; f32]) {
        return (matmul(x, w), sum(x * 2.0, -1))
    }
    pub entry split<B: Dim, S: Dim>(x: Tensor[B, S, D; f32]) -> (Tensor[B, S, D; f32], Tensor[B, S, 1; f32]) {
        return both(x)
    }
}

pub block Model<D: Dim> {
    sub pair: Pair<D>
    param bias: Tensor[D; f32]
    pub use pair.split
    // `then` over several results: `shift` takes one input per result, here named `result_0`
    // like the local the expansion would pick first.
    pub use pair.{split as shifted} then shift
    fn shift<B: Dim, S: Dim>(result_0: Tensor[B, S, D; f32], sums: Tensor[B, S, 1; f32])
        -> (moved: Tensor[B, S, D; f32], sums: Tensor[B, S, 1; f32]) {
        return (result_0 - bias, sums)
    }
    pub entry forward<B: Dim, S: Dim>(x: Tensor[B, S, D; f32]) -> (out: Tensor[B, S, D; f32], totals: Tensor[B, S; f32]) {
        let (projected, summed) = pair.both(x)
        return (projected + bias, summed[:, :, 0] - 1.0)
    }
}
"""

MANIFEST = """\
[model]
name = "pairs"
title = "Several results"
summary = "An entry returning two tensors."
license = "MIT"
family = "test"

[source]
path = "src/lib.linnet"
root = "Model"
entry = "forward"

[generics]
D = 4

[check]
B = 2
S = 3

[weights]
repo = "linnet/pairs"
revision = "0000000000000000000000000000000000000000"
files = ["model.safetensors"]
bindings = "bindings.json"
"""

BACKENDS = ["torch", "jax", "stablehlo", "onnx"]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """The entry's folder, its weights file and the weights; loaded models, one per backend."""
    return _write_entry(tmp_path_factory.mktemp("tuples"), SOURCE)


def _write_entry(root, source: str):
    import safetensors.numpy

    entry = root / "pairs"
    (entry / "src").mkdir(parents=True)
    (entry / "src" / "lib.linnet").write_text(source, encoding="utf-8")
    (entry / "nest.toml").write_text(MANIFEST, encoding="utf-8")
    (entry / "linnet.toml").write_text('[package]\nname = "pairs"\nversion = "0.1.0"\nlanguage = "0.1"\n')
    rng = np.random.default_rng(3)
    weights = {"pair.w": rng.standard_normal((4, 4)).astype(np.float32),
               "bias": rng.standard_normal(4).astype(np.float32)}
    (entry / "bindings.json").write_text(json.dumps({k: f"ckpt.{k}" for k in weights}))
    safetensors.numpy.save_file({f"ckpt.{k}": v for k, v in weights.items()}, str(root / "model.safetensors"))
    return entry, root / "model.safetensors", weights, {}


def _model(pairs, backend):
    entry, weights_file, _, loaded = pairs
    if backend not in loaded:
        # kernels="default": no per-machine measuring of kernel options, which costs seconds here
        loaded[backend] = nest.load(entry, backend=backend, weights=weights_file, kernels="default")
    return loaded[backend]


def _expected(x, weights):
    """Both entries in float64 numpy, written from the source's meaning, not from its code."""
    x = x.astype(np.float64)
    projected = x @ weights["pair.w"].astype(np.float64)
    summed = (2 * x).sum(-1, keepdims=True)
    return (projected + weights["bias"], summed[:, :, 0] - 1.0), (projected, summed)


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_backend_returns_every_result(pairs, backend):
    model = _model(pairs, backend)
    x = np.random.default_rng(5).standard_normal((2, 3, 4)).astype(np.float32)
    (out, totals), (projected, summed) = _expected(x, pairs[2])
    result = model(x)
    # Named results: a named tuple, by field and by position.
    assert type(result).__name__ == "forward_results" and result._fields == ("out", "totals")
    np.testing.assert_allclose(np.asarray(result.out), out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(result[1]), totals, rtol=1e-5, atol=1e-5)
    assert np.asarray(result.totals).shape == (2, 3)
    # The delegated entry's results are not named: a plain tuple of two.
    split = model.split(x)
    assert type(split) is tuple and len(split) == 2
    np.testing.assert_allclose(np.asarray(split[0]), projected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(split[1]), summed, rtol=1e-5, atol=1e-5)
    # `then` over them: both pass through `shift`, whose results are named.
    shifted = model.shifted(x)
    assert shifted._fields == ("moved", "sums")
    np.testing.assert_allclose(np.asarray(shifted.moved), projected - pairs[2]["bias"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(shifted.sums), summed, rtol=1e-5, atol=1e-5)


def test_the_exports_have_one_output_per_result(pairs):
    import onnx

    folder = _model(pairs, "onnx").runtime.folder
    graph = onnx.load(str(folder / "model.onnx"), load_external_data=False).graph
    outputs = {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim] for o in graph.output}
    assert outputs == {"forward.out": ["B", "S", 4], "forward.totals": ["B", "S"],
                       "split.0": ["B", "S", 4], "split.1": ["B", "S", 1],
                       "shifted.moved": ["B", "S", 4], "shifted.sums": ["B", "S", 1]}
    signature = _model(pairs, "stablehlo").runtime.signature
    assert [r["name"] for r in signature["entries"]["forward"]["results"]] == ["forward.out", "forward.totals"]
    assert [r["dims"] for r in signature["entries"]["split"]["results"]] == [["B", "S", 4], ["B", "S", 1]]
    assert "result" not in signature["entries"]["forward"]


def test_the_signature_shows_every_result(pairs):
    model = _model(pairs, "torch")
    assert model.signature().endswith("-> (out: Tensor[B, S, 4; f32], totals: Tensor[B, S; f32])")
    assert model.signature("split").endswith("-> (Tensor[B, S, 4; f32], Tensor[B, S, 1; f32])")


@pytest.mark.parametrize("runtime", ["onnxruntime", "python"])
def test_triton_serves_each_result_as_an_output(pairs, tmp_path, runtime):
    """Each result of an entry is a Triton output of its own, named as in the ONNX graph, and
    the exported graphs and configs declare exactly those outputs."""
    import onnx

    from test_triton import parse_config

    from linnet.serving.triton import export_triton, triton_io

    ctx, _ = nest.prepare(pairs[0], weights=pairs[1])
    names = ["forward.out", "forward.totals", "split.0", "split.1", "shifted.moved", "shifted.sums"]
    io = triton_io(ctx)
    assert [(o.entry, o.name, o.dims) for o in io.outputs] == [
        ("forward", "forward.out", ("B", "S", "4")), ("forward", "forward.totals", ("B", "S")),
        ("split", "split.0", ("B", "S", "4")), ("split", "split.1", ("B", "S", "1")),
        ("shifted", "shifted.moved", ("B", "S", "4")), ("shifted", "shifted.sums", ("B", "S", "1"))]
    folder = export_triton(ctx, tmp_path / "repo", runtime=runtime)
    if runtime == "python":
        config = parse_config((folder / "config.pbtxt").read_text())
        graph = onnx.load(str(folder / "1" / "model.onnx"), load_external_data=False).graph
        assert [o.name for o in config.output] == [o.name for o in graph.output] == names
    else:
        for name in names:
            step = folder.parent / f"{folder.name}.{name}"
            config = parse_config((step / "config.pbtxt").read_text())
            graph = onnx.load(str(step / "1" / "model.onnx"), load_external_data=False).graph
            assert [o.name for o in config.output] == [o.name for o in graph.output] == [name]


@pytest.mark.parametrize("then, message", [
    ("fn first<B: Dim, S: Dim>(x: Tensor[B, S, D; f32]) -> Tensor[B, S, D; f32] {\n        return x\n    }",
     "`first` takes 1 input; `then` needs a function of 2 inputs, one per result of `split`,"),
    ("fn first<B: Dim, S: Dim>(x: Tensor[B, S, D; f32], y: Tensor[B, S; f32]) -> Tensor[B, S, D; f32] {\n"
     "        return x\n    }",
     "`split`'s result 1 does not fit `first`'s input `y`: it has 3 dims, the input 2"),
])
def test_then_over_several_results_needs_one_fitting_input_per_result(tmp_path, then, message):
    from linnet.front.resolve import load_file

    path = tmp_path / "m.linnet"
    path.write_text(SOURCE.replace("pub use pair.split\n", f"pub use pair.split then first\n    {then}\n"),
                    encoding="utf-8")
    with pytest.raises(LinnetError) as info:
        load_file(path)
    assert info.value.code == codes.DELEGATION_THEN_MISMATCH and message in str(info.value), str(info.value)


def test_the_generated_python_unpacks_and_returns_tuples(pairs):
    from linnet.backends import jax_source, torch_source
    from linnet.cli.targets import locate
    from linnet.compiler import compile_target
    from linnet.middle.lower import lower

    program = lower(compile_target(locate(str(pairs[0]))).instance)
    torch_code, jax_code = torch_source.emit(program), jax_source.emit(program)
    assert "projected, summed = self.pair.both(x)" in torch_code
    assert "return (projected + self.bias, summed[:, :, 0] - 1.0)" in torch_code
    assert "return (x @ self.w, (x * 2.0).sum(dim=-1, keepdim=True))" in torch_code
    assert "projected, summed = Pair_both(params[\"pair\"], x)" in jax_code


def test_verify_holds_several_results_to_return_and_unpack(pairs):
    import dataclasses

    from linnet.cli.targets import locate
    from linnet.compiler import compile_target
    from linnet.diagnostics import InternalError
    from linnet.middle import ir
    from linnet.middle.lower import lower

    program = lower(compile_target(locate(str(pairs[0]))).instance)
    both = next(fn for fn in program.functions.values() if fn.name == "both")
    (ret,) = both.body
    assert isinstance(ret.value, ir.MakeTuple) and isinstance(both.result, ir.TupleType)
    both.body = [dataclasses.replace(ret, value=ret.value.args[0])]  # one value where two are declared
    with pytest.raises(InternalError, match="returns"):
        ir.verify(program)
    both.body = [ret]
    forward = program.functions[program.entries["forward"].function]
    unpack = forward.body[0]
    assert isinstance(unpack, ir.Unpack) and len(unpack.names) == 2
    forward.body[0] = ir.Let("projected", unpack.value, unpack.line)  # a tuple bound to one name
    with pytest.raises(InternalError, match="several results bound to one name"):
        ir.verify(program)


@pytest.fixture(scope="module", params=["onnxruntime", "python"])
def pairs_server(request, pairs, tmp_path_factory, triton_tools):  # noqa: F811 - the imported fixture
    """The entry's default export, both layouts, on a real tritonserver."""
    from fixtures.triton import serving

    from linnet.serving.triton import export_triton

    root = tmp_path_factory.mktemp(f"triton-pairs-{request.param}")
    ctx, _ = nest.prepare(pairs[0], weights=pairs[1])
    export_triton(ctx, root / "repo", runtime=request.param)
    with serving(root / "repo", triton_tools, log_path=root / "tritonserver.log") as server:
        yield server


def test_a_served_entry_returns_each_result(pairs, pairs_server):
    from tritonclient import http

    x = np.random.default_rng(11).standard_normal((2, 3, 4)).astype(np.float32)
    names = ["forward.out", "forward.totals", "split.0", "split.1", "shifted.moved", "shifted.sums"]
    client = http.InferenceServerClient(pairs_server.http_url)
    try:
        tensor = http.InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        got = client.infer("pairs", [tensor], outputs=[http.InferRequestedOutput(n) for n in names])
        # Only what is asked for comes back.
        one = client.infer("pairs", [tensor], outputs=[http.InferRequestedOutput("split.1")])
    finally:
        client.close()
    (out, totals), (projected, summed) = _expected(x, pairs[2])
    want = [out, totals, projected, summed, projected - pairs[2]["bias"], summed]
    for name, expected in zip(names, want):
        np.testing.assert_allclose(got.as_numpy(name), expected, rtol=1e-5, atol=1e-5, err_msg=name)
    assert one.as_numpy("split.1").shape == (2, 3, 1) and one.as_numpy("split.0") is None


def test_generate_refuses_cache_steps_without_their_logits_by_name(tmp_path):
    """`prefill`/`decode` that return the cache alone (the form before several results) are
    named, not an unpacking error inside the loop."""
    steps = """    pub entry prefill<B: Dim, S: Dim>(tokens: Tensor[B, S; i32], attention_mask: Tensor[B, S; i32] = ones)
        -> Tensor[B, S; f32] {
        return cast<f32>(tokens + attention_mask)
    }
    pub entry decode<B: Dim, P: Dim>(token: Tensor[B, 1; i32], cache: Tensor[B, P; f32],
        attention_mask: Tensor[B, P + 1; i32] = ones) -> Tensor[B, P + 1; f32] {
        return concat(cache, cast<f32>(token), 1)
    }
    pub entry forward"""
    entry, weights_file, _, _ = _write_entry(tmp_path, SOURCE.replace("    pub entry forward", steps, 1))
    model = nest.load(entry, backend="torch", weights=weights_file, kernels="default")
    with pytest.raises(LinnetError) as info:
        model.generate(np.array([[1, 2, 3]]), 2)
    assert info.value.code == codes.NOT_A_DECODER
    assert "its `prefill` returns Tensor[B, S; f32], where generate needs two results" in str(info.value)
