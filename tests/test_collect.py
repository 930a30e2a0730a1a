"""`let xs = static for x in subs collect v { ... }`: every value a loop's `var` takes, stacked.

A small residual stack (`Step`: x + tanh(x Wᵀ + b) * gain, three of them) is written as a
zoo entry with random weights and loaded on every backend (torch, JAX, StableHLO, ONNX). Its
entries collect the state before and after each step, the first position after each step
(a second var and a slice of the stack), and a var that a `let` in the body shadows (so it
never changes). Each is compared with the same computation written in numpy, in float64.
Then: what the checker proves about the stack's first axis, the diagnostics of misuse (with
file:line:col), and the generated code a reader sees.
"""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

from linnet.middle import ir
from linnet.cli.targets import locate
from linnet.compiler import compile_target
from linnet.diagnostics import InternalError, LinnetError
from linnet.dims import const
from linnet.middle.lower import lower

DIM, LAYERS = 4, 3

SOURCE = """\
// A residual stack whose entries return the intermediate states.
module stacks

use std.nn.linear::{Linear}

pub block Step<D: Dim, T: Float> {
    sub dense: Linear<D, D, T>
    param gain: Tensor[D; T]

    pub fn forward<B: Dim, S: Dim>(x: Tensor[B, S, D; T]) -> Tensor[B, S, D; T] {
        return x + tanh(dense.forward(x)) * gain
    }
}

pub block Model<D: Dim, Layers: Dim, T: Float = f32> {
    sub steps: [Step<D, T>; Layers]

    // The input, then the state after each step.
    pub entry states<B: Dim, S: Dim>(x: Tensor[B, S, D; T]) -> Tensor[Layers + 1, B, S, D; T] {
        var h = x
        let states = static for step in steps collect h {
            h = step.forward(h)
        }
        return states
    }

    // The first position after each step (not the input): a second var, then a slice.
    pub entry firsts<B: Dim, S: Dim>(x: Tensor[B, S, D; T]) -> Tensor[Layers, B, D; T]
    where S > 0 {
        var h = x
        var first = x[:, 0, :]
        let firsts: Tensor[Layers + 1, B, D; T] = static for step in steps collect first {
            h = step.forward(h)
            first = h[:, 0, :]
        }
        return firsts[1:]
    }

    // The `let h` in the body is a new name: the collected var keeps the input.
    pub entry shadowed<B: Dim, S: Dim>(x: Tensor[B, S, D; T]) -> Tensor[Layers + 1, B, S, D; T] {
        var h = x
        let unchanged = static for step in steps collect h {
            let h = step.forward(h)
        }
        return unchanged * 2.0
    }
}
"""

MANIFEST = f"""\
[model]
name = "collect-stack"
title = "Collect test stack"
summary = "A residual stack that returns its states."
license = "MIT"
family = "test"

[source]
path = "src/lib.linnet"
root = "Model"
entry = "states"

[generics]
D = {DIM}
Layers = {LAYERS}
T = "f32"

[check]
B = 2
S = 5

[weights]
repo = "linnet/collect-stack"
revision = "{'0' * 40}"
files = ["model.safetensors"]
bindings = "bindings.json"
"""


def line_of(text: str, source: str = SOURCE) -> int:
    """The 1-based line of the only line of `source` containing `text`."""
    hits = [i for i, line in enumerate(source.splitlines(), start=1) if text in line]
    assert len(hits) == 1, (text, hits)
    return hits[0]


@pytest.fixture(scope="module")
def stack_entry(tmp_path_factory):
    """The entry folder, its weights file, and the weights as numpy arrays by Linnet path."""
    from safetensors.numpy import save_file

    root = tmp_path_factory.mktemp("collect")
    entry = root / "collect-stack"
    (entry / "src").mkdir(parents=True)
    (entry / "src" / "lib.linnet").write_text(SOURCE, encoding="utf-8")
    (entry / "nest.toml").write_text(MANIFEST, encoding="utf-8")
    (entry / "linnet.toml").write_text('[package]\nname = "stacks"\nversion = "0.1.0"\nlanguage = "0.1"\n')
    rng = np.random.default_rng(7)
    weights = {}
    for i in range(LAYERS):
        weights[f"steps.{i}.dense.weight"] = rng.standard_normal((DIM, DIM)).astype(np.float32)
        weights[f"steps.{i}.dense.bias"] = rng.standard_normal(DIM).astype(np.float32)
        weights[f"steps.{i}.gain"] = rng.standard_normal(DIM).astype(np.float32)
    (entry / "bindings.json").write_text(json.dumps({k: f"ckpt.{k}" for k in weights}))
    save_file({f"ckpt.{k}": v for k, v in weights.items()}, str(root / "model.safetensors"))
    return entry, root / "model.safetensors", weights


def numpy_states(weights: dict, x: np.ndarray) -> np.ndarray:
    """[Layers + 1, B, S, D]: x, then x after each residual step, in float64."""
    h = x.astype(np.float64)
    states = [h]
    for i in range(LAYERS):
        w, b, gain = (weights[f"steps.{i}.{name}"].astype(np.float64)
                      for name in ("dense.weight", "dense.bias", "gain"))
        h = h + np.tanh(h @ w.T + b) * gain
        states.append(h)
    return np.stack(states)


@pytest.fixture(scope="module", params=["torch", "jax", "stablehlo", "onnx"])
def loaded(request, stack_entry):
    from linnet import nest

    entry, weights_file, weights = stack_entry
    return request.param, nest.load(entry, backend=request.param, weights=weights_file), weights


# ----------------------------------------------------------------------- every backend


@pytest.mark.parametrize("batch,seq", [(2, 5), (1, 1), (3, 8)])
def test_collected_states_match_numpy(loaded, batch, seq):
    backend, model, weights = loaded
    x = np.random.default_rng(batch * 10 + seq).standard_normal((batch, seq, DIM)).astype(np.float32)
    expected = numpy_states(weights, x)

    states = np.asarray(model.states(x))
    assert states.shape == (LAYERS + 1, batch, seq, DIM) and states.dtype == np.float32
    diff = np.abs(states - expected).max()
    print(f"{backend} B={batch} S={seq}: states max|diff| {diff:.3g}")
    assert diff <= 1e-5
    np.testing.assert_array_equal(states[0], x)  # the value as the loop starts, untouched

    firsts = np.asarray(model.firsts(x))
    assert firsts.shape == (LAYERS, batch, DIM)
    assert np.abs(firsts - expected[1:, :, 0, :]).max() <= 1e-5

    # The body's `let h` shadows the var: the collected h stays x in every pass.
    shadowed = np.asarray(model.shadowed(x))
    np.testing.assert_allclose(shadowed, 2.0 * np.stack([x] * (LAYERS + 1)), rtol=0, atol=0)


# ------------------------------------------------------------------ what the checker proves


def check_source(tmp_path: Path, source: str, name: str = "prog.linnet"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source).lstrip(), encoding="utf-8")
    return compile_target(locate(path)), path


def check_errors(tmp_path: Path, source: str, name: str = "prog.linnet") -> tuple[LinnetError, Path]:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source).lstrip(), encoding="utf-8")
    with pytest.raises(LinnetError) as caught:
        compile_target(locate(path))
    return caught.value, path


HALVES = """
    use std.nn.linear::{Linear}

    block Halves<D: Dim, Layers: Dim, Half: Dim>
    WHERE {
        sub layers: [Linear<D, D, f32>; Layers]

        fn run<B: Dim>(x: Tensor[B, D; f32]) -> Tensor[1 + 2 * Half, B, D; f32] {
            var h = x
            let states = static for layer in layers collect h {
                h = layer.forward(h)
            }
            return states
        }

        fn after<B: Dim>(x: Tensor[B, D; f32]) -> Tensor[Layers, B, D; f32] {
            return run(x)[1:]
        }
    }
"""


def test_the_first_axis_is_proven_from_where_clauses(tmp_path):
    """`Layers + 1` is a dim like any other: `1 + 2 * Half` equals it given `Layers == 2 * Half`,
    and a slice `[1:]` of it is `Layers`. Without the clause nothing proves it."""
    compiled, _ = check_source(tmp_path, HALVES.replace("WHERE", "where Layers == 2 * Half"))
    assert compiled.checked.find_block("Halves").functions["run"].checked
    err, _ = check_errors(tmp_path, HALVES.replace("WHERE", "where Layers >= 2 * Half"), "unproven.linnet")
    assert [d.code for d in err.diagnostics] == ["E0307", "E0307"]  # `run`'s result, and `after`'s
    assert "axis 0: Layers + 1 is not 2 * Half + 1" in err.render()


def test_a_miscounted_result_is_a_compile_error_with_its_place(tmp_path):
    err, path = check_errors(tmp_path, """
        use std.nn.linear::{Linear}

        block Stack<D: Dim, Layers: Dim> {
            sub layers: [Linear<D, D, f32>; Layers]

            fn run<B: Dim>(x: Tensor[B, D; f32]) -> Tensor[Layers, B, D; f32] {
                var h = x
                let states = static for layer in layers collect h {
                    h = layer.forward(h)
                }
                return states
            }
        }
    """)
    (d,) = err.diagnostics
    assert d.code == "E0307" and (d.span.line, d.span.col) == (11, 16)
    assert "Tensor[Layers + 1, B, D; f32]" in d.message and "axis 0: Layers + 1 is not Layers" in err.render()
    assert f"{path}:11:16" in err.render()


def test_an_annotation_says_how_many_values_a_loop_collects(tmp_path):
    err, path = check_errors(tmp_path, """
        use std.nn.linear::{Linear}

        block Stack<D: Dim, N: Dim> {
            sub layers: [Linear<D, D, f32>; N]

            fn run<B: Dim>(x: Tensor[B, D; f32]) -> Tensor[B, D; f32] {
                var h = x
                let states: Tensor[N, B, D; f32] = static for layer in layers collect h {
                    h = layer.forward(h)
                }
                return h
            }
        }
    """)
    (d,) = err.diagnostics
    assert d.code == "E0307" and (d.span.line, d.span.col) == (8, 9)
    assert "each of its N passes: N + 1 values" in err.render()


@pytest.mark.parametrize("declare,collected,what", [
    ("let h = x", "h", "bound with `let`"),
    ("let h = x", "x", "a parameter of the function"),
    ("var n = D", "n", "only tensors are collected"),
    ("var s = 0.5", "s", "a literal scalar without a dtype of its own"),
    ("let h = x", "inner", "declared inside the loop"),
    ("let h = x", "layer", "this loop's sub-block"),
    ("let h = x", "w", "a param of block `Stack`"),
])
def test_collecting_what_is_not_a_tensor_var_is_e0318(tmp_path, declare, collected, what):
    err, path = check_errors(tmp_path, f"""
        use std.nn.linear::{{Linear}}

        block Stack<D: Dim, N: Dim> {{
            sub layers: [Linear<D, D, f32>; N]
            param w: Tensor[D; f32]

            fn run<B: Dim>(x: Tensor[B, D; f32]) -> Tensor[B, D; f32] {{
                {declare}
                let states = static for layer in layers collect {collected} {{
                    var inner = layer.forward(x)
                }}
                return x
            }}
        }}
    """)
    (d,) = err.diagnostics
    col = 9 + len("let states = static for layer in layers collect ")
    assert (d.code, d.span.line, d.span.col) == ("E0318", 9, col), err.render()
    assert what in d.message
    assert f"{path}:9:{col}" in err.render()


def test_errors_in_the_body_and_in_collect_are_both_reported(tmp_path):
    err, _ = check_errors(tmp_path, """
        use std.nn.linear::{Linear}

        block Stack<D: Dim, N: Dim> {
            sub layers: [Linear<D, D, f32>; N]

            fn run<B: Dim>(x: Tensor[B, D; f32]) -> Tensor[B, D; f32] {
                let h = x
                let states = static for layer in layers collect h {
                    let y = layer.forward(x) + undefined
                }
                return states[0] + missing
            }
        }
    """)
    # `collect h`, the body's unknown name, and the unknown name after the loop: one run reports
    # all three, and `states` itself (whose type is unknown) adds nothing.
    assert [(d.code, d.span.line) for d in err.diagnostics] == [("E0318", 8), ("E0201", 9), ("E0201", 11)]


def test_collect_is_a_keyword_only_in_its_place(tmp_path):
    check_source(tmp_path, """
        fn f<N: Dim>(collect: Tensor[N; f32]) -> Tensor[N; f32] {
            let x = collect * 2.0
            return x
        }
    """)
    err, _ = check_errors(tmp_path, """
        use std.nn.linear::{Linear}

        block Stack<D: Dim, N: Dim> {
            sub layers: [Linear<D, D, f32>; N]

            fn run<B: Dim>(x: Tensor[B, D; f32]) -> Tensor[B, D; f32] {
                var h = x
                let states = static for layer in layers {
                    h = layer.forward(h)
                }
                return h
            }
        }
    """, "forgot.linnet")
    (d,) = err.diagnostics
    assert d.code == "E0002" and "expected 'collect'" in d.message and (d.span.line, d.span.col) == (8, 49)


# ---------------------------------------------------------------- what a reader sees


def test_generated_torch_and_jax_code_show_the_list_and_one_stack(stack_entry):
    from linnet.backends import jax_source as jax_backend
    from linnet.backends import torch_source as pytorch

    entry, _, _ = stack_entry
    program = lower(compile_target(locate(entry)).instance)
    ir.verify(program)
    line = line_of("let states = static for step in steps collect h")
    where = f"lib.linnet:{line}"
    torch_source = pytorch.emit(program)
    torch_lines = [text.strip() for text in torch_source.splitlines()]
    for expected in ("states = [h]", "states.append(h)", "states = torch.stack(states)"):
        assert any(text.startswith(expected + "  # ") and text.endswith(where) for text in torch_lines), expected
    # The loop reads as written: the list, the loop, the append at the end of the body.
    start = torch_lines.index(next(t for t in torch_lines if t.startswith("states = [h]")))
    assert torch_lines[start + 1].startswith("for step in self.steps:")
    assert torch_lines[start + 2].startswith("h = step(h)")
    assert torch_lines[start + 3].startswith("states.append(h)")
    assert torch_lines[start + 4].startswith("states = torch.stack(states)")
    # The shadowing `let h` in `shadowed` gets a name of its own; the collected h is untouched.
    assert any(t.startswith("h_2 = step(h)") for t in torch_lines)
    jax_lines = [text.strip() for text in jax_backend.emit(program).splitlines()]
    assert any(t.startswith("states = jnp.stack(states)  # ") and t.endswith(where) for t in jax_lines)


def test_onnx_stacks_with_unsqueeze_and_one_concat(stack_entry):
    import onnx

    from linnet import nest
    from linnet.backends import onnx_graph as onnx_backend

    entry, weights_file, _ = stack_entry
    ctx, _ = nest.prepare(entry, weights=weights_file)
    files = onnx_backend.emit(ctx.program, ctx.tensors("numpy"), name="stack",
                              outputs={"states": "states", "firsts": "firsts", "shadowed": "shadowed"})
    (model_file,) = files
    onnx.checker.check_model(model_file.model, full_check=True)
    line = line_of("let states = static for step in steps collect h")
    concats = [n for n in model_file.model.graph.node if n.op_type == "Concat" and n.name.startswith("states/")]
    (concat,) = concats
    assert len(concat.input) == LAYERS + 1
    assert f"lib.linnet:{line}" in concat.doc_string and "collect h into states" in concat.doc_string
    producers = {o: n for n in model_file.model.graph.node for o in n.output}
    assert all(producers[i].op_type == "Unsqueeze" for i in concat.input)
    # `shadowed` collects one unchanged value: one Unsqueeze, read Layers + 1 times.
    (shadow_concat,) = [n for n in model_file.model.graph.node
                        if n.op_type == "Concat" and n.name.startswith("shadowed/")]
    assert len(set(shadow_concat.input)) == 1 and len(shadow_concat.input) == LAYERS + 1


def test_the_ir_verifier_rejects_a_wrong_count(stack_entry):
    entry, _, _ = stack_entry
    program = lower(compile_target(locate(entry)).instance)
    fn = program.functions[program.entries["states"].function]
    index, loop = next((i, s) for i, s in enumerate(fn.body) if isinstance(s, ir.Loop))
    assert loop.collect.type.dims[0].as_int() == LAYERS + 1
    wrong = ir.Collect(loop.collect.into, loop.collect.var,
                       ir.TensorType((loop.collect.type.dims[0] - const(1),) + loop.collect.type.dims[1:], "f32"))
    fn.body[index] = ir.Loop(loop.var, loop.member, loop.body, loop.line, wrong)
    with pytest.raises(InternalError, match="collects 4 values"):
        ir.verify(program)


SHADOWING = """
    use std.nn.linear::{Linear}

    // Names inside a loop body shadow the ones outside; outside, the outer ones keep their values.
    pub block Shadows<D: Dim, N: Dim> {
        sub layers: [Linear<D, D, f32>; N]

        pub entry forward<B: Dim>(a: Tensor[B, D; f32]) -> Tensor[2, B, D; f32] {
            let layer = a * 2.0
            var h = a
            let x = a + 1.0
            static for layer in layers {
                let x = layer.forward(h)
                h = x
            }
            let states = static for step in layers collect h {
                let states = step.forward(h)
                h = states
            }
            return reshape(layer, [1, B, D]) + reshape(x, [1, B, D]) + states[N - 1:]
        }
    }
"""


def test_shadowed_names_keep_their_values_in_generated_code(tmp_path):
    """Generated Python has one namespace per function: a name that a loop body shadows (a
    `let`, the loop variable, the stack's own name) is renamed there, never overwritten."""
    import torch

    from linnet.backends import torch_source as pytorch
    from linnet.backends.pysource import import_generated
    from linnet.backends.torch_runtime import torch_param_name
    from linnet.middle.instantiate import instantiate

    compiled, _ = check_source(tmp_path, SHADOWING, "shadows.linnet")
    program = lower(instantiate(compiled.checked, "Shadows", {"D": 3, "N": 2}))
    ir.verify(program)
    (tmp_path / "gen").mkdir()
    (tmp_path / "gen" / "model.py").write_text(pytorch.emit(program))
    module = import_generated(tmp_path / "gen" / "model.py", "linnet_test_collect_shadows")
    rng = np.random.default_rng(5)
    weights = {p: rng.standard_normal(tuple(d.as_int() for d in t.dims)).astype(np.float32)
               for p, t in program.param_paths()}
    model = module.Shadows()
    model.load_state_dict({torch_param_name(k): torch.from_numpy(v) for k, v in weights.items()})
    a = rng.standard_normal((2, 3)).astype(np.float32)
    with torch.no_grad():
        got = model.forward(torch.from_numpy(a)).numpy()

    def linear(i, v):
        return v @ weights[f"layers.{i}.weight"].T.astype(np.float64) + weights[f"layers.{i}.bias"]

    h = a.astype(np.float64)
    for i in range(2):
        h = linear(i, h)
    states = [h]
    for i in range(2):
        h = linear(i, h)
        states.append(h)
    expected = 2 * a + (a + 1) + np.stack(states)[1:]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


NESTED = """
pub block Scale<D: Dim> {
    param w: Tensor[D; f32]

    pub fn forward<*S: Shape>(x: Tensor[*S, D; f32]) -> Tensor[*S, D; f32] {
        return x * w + 1.0
    }
}

pub block Group<D: Dim, K: Dim> {
    sub inner: [Scale<D>; K]

    // Any leading dims: [K + 1, *S, D].
    pub fn trace<*S: Shape>(x: Tensor[*S, D; f32]) -> Tensor[K + 1, *S, D; f32] {
        var h = x
        let hs = static for s in inner collect h {
            h = s.forward(h)
        }
        return hs
    }
}

pub block Nest<D: Dim, G: Dim, K: Dim> {
    sub groups: [Group<D, K>; G]
    sub extra: [Scale<D>; K]

    pub entry forward<B: Dim>(x: Tensor[B, D; f32], bias: Tensor[D; f32]) -> Tensor[G + 1, K + 1, B, D; f32] {
        var last = reshape(x, [1, B, D])
        // x repeated K + 1 times: the shape of one group's trace.
        var traces = last + reshape(cast<f32>(iota<i32>(K + 1)), [K + 1, 1, 1]) * 0.0
        let all = static for g in groups collect traces {
            var h = last[0]
            let per = static for s in extra collect h {
                h = s.forward(h) + bias
            }
            traces = g.trace(h) + per[K] * 0.0
            last = traces[K:]
        }
        return all
    }
}
"""


def test_nested_collects_over_any_leading_dims_on_torch_jax_and_onnx(tmp_path):
    """A collect inside a collecting loop, one in a sub-block function over `*S` dims, and a
    stack named `all` (a Python builtin): every emitter against numpy."""
    import jax
    import onnx
    import onnxruntime as ort
    import torch

    from linnet.backends import jax_source as jax_backend
    from linnet.backends import onnx_graph as onnx_backend
    from linnet.backends import torch_source as pytorch
    from linnet.backends.pysource import import_generated
    from linnet.backends.torch_runtime import torch_param_name
    from linnet.middle.instantiate import instantiate

    compiled, _ = check_source(tmp_path, NESTED, "nested.linnet")
    groups, inner = 2, 3
    program = lower(instantiate(compiled.checked, "Nest", {"D": 3, "G": groups, "K": inner}))
    ir.verify(program)
    rng = np.random.default_rng(11)
    weights = {p: rng.standard_normal(tuple(d.as_int() for d in t.dims)).astype(np.float32)
               for p, t in program.param_paths()}
    x, bias = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)

    def scale(prefix, v):
        return v * weights[prefix + "w"].astype(np.float64) + 1.0

    last, traces = x[None].astype(np.float64), np.stack([x.astype(np.float64)] * (inner + 1))
    expected = [traces]
    for g in range(groups):
        h = last[0]
        for k in range(inner):
            h = scale(f"extra.{k}.", h) + bias
        trace = [h]
        for k in range(inner):
            h = scale(f"groups.{g}.inner.{k}.", h)
            trace.append(h)
        traces = np.stack(trace)
        last = traces[inner:]
        expected.append(traces)
    expected = np.stack(expected)

    (tmp_path / "gen").mkdir()
    (tmp_path / "gen" / "model.py").write_text(pytorch.emit(program))
    model = import_generated(tmp_path / "gen" / "model.py", "linnet_test_collect_nested").Nest()
    model.load_state_dict({torch_param_name(k): torch.from_numpy(v) for k, v in weights.items()})
    with torch.no_grad():
        got = {"torch": model.forward(torch.from_numpy(x), torch.from_numpy(bias)).numpy()}
    namespace: dict = {}
    exec(compile(jax_backend.emit(program), "nested_jax.py", "exec"), namespace)
    tree = jax_backend.params_tree(program, weights)
    got["jax"] = np.asarray(jax.jit(namespace["ENTRIES"]["forward"])(tree, x, bias))
    (model_file,) = onnx_backend.emit(program, weights, name="nested", outputs={"forward": "all"})
    onnx.checker.check_model(model_file.model, full_check=True)
    session = ort.InferenceSession(model_file.model.SerializeToString(), providers=["CPUExecutionProvider"])
    got["onnx"] = session.run(None, {"x": x, "bias": bias})[0]
    for backend, value in got.items():
        assert value.shape == (groups + 1, inner + 1, 2, 3), backend
        np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-5, err_msg=backend)
