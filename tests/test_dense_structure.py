"""Dense layers recognised by structure (linnet/middle/linears.py): a hand-written GPT-2-style
`Conv1D` (weight [In, Out]) and a bias-free layer (weight [Out, In]), neither std's `Linear`,
are fused by `fuse_linears`, and the fused program gives torch's own numbers."""
from __future__ import annotations

import numpy as np
import pytest

from linnet.cli.targets import locate
from linnet.compiler import compile_target
from linnet.dims import const
from linnet.middle import ir
from linnet.middle.linears import SWITCH, dense_form
from linnet.middle.lower import lower
from linnet.middle.optimize import bind_params, optimize

D = 8

SOURCE = """\
module dense

pub block Conv1D<In: Dim, Out: Dim, T: Float> {
    param weight: Tensor[In, Out; T]
    param bias: Tensor[Out; T]

    pub fn forward<*S: Shape>(x: Tensor[*S, In; T]) -> Tensor[*S, Out; T] {
        return bias + matmul(x, weight)
    }
}

pub block Plain<In: Dim, Out: Dim, T: Float> {
    param kernel: Tensor[Out, In; T]

    pub fn forward<*S: Shape>(x: Tensor[*S, In; T]) -> Tensor[*S, Out; T] {
        return matmul(x, transpose(kernel))
    }
}

pub block Model<D: Dim, T: Float = f32> {
    sub a: Conv1D<D, D, T>
    sub b: Conv1D<D, D, T>
    sub p: Plain<D, D, T>
    sub q: Plain<D, D, T>

    pub entry mix<B: Dim, S: Dim>(x: Tensor[B, S, D; T]) -> Tensor[B, S, D; T] {
        return a.forward(x) * p.forward(x) + q.forward(x) - b.forward(x)
    }
}
"""

MANIFEST = f"""\
[model]
name = "dense-structure"
title = "Dense layers by structure"
summary = "Conv1D-layout and bias-free dense layers."
license = "MIT"
family = "test"

[source]
path = "src/lib.linnet"
root = "Model"
entry = "mix"

[generics]
D = {D}
T = "f32"

[check]
B = 2
S = 3
"""


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    entry = tmp_path_factory.mktemp("dense") / "dense-structure"
    (entry / "src").mkdir(parents=True)
    (entry / "src" / "lib.linnet").write_text(SOURCE, encoding="utf-8")
    (entry / "nest.toml").write_text(MANIFEST, encoding="utf-8")
    (entry / "linnet.toml").write_text('[package]\nname = "dense"\nversion = "0.1.0"\nlanguage = "0.1"\n')
    return lower(compile_target(locate(entry)).instance)


def _forward(program: ir.Program, block: str) -> ir.Function:
    return program.functions[program.blocks[block].methods["forward"]]


def test_both_layouts_are_dense_layers(program):
    a = dense_form(program, _forward(program, program.blocks["Model"].subs[0].block))
    p = dense_form(program, _forward(program, program.blocks["Model"].subs[2].block))
    assert (a.weight, a.bias, a.out_in) == ("weight", "bias", False)
    assert (p.weight, p.bias, p.out_in) == ("kernel", None, True)


def test_siblings_of_each_layout_fuse(program):
    out = optimize(program, passes=("fuse_linears",))
    ir.verify(out.program)
    subs = {s.name: out.program.blocks[s.block] for s in out.program.blocks["Model"].subs}
    assert set(subs) == {"a_b", "p_q"}
    assert [(n, t.dims) for n, t in subs["a_b"].params] == [
        ("weight", (const(D), const(2 * D))), ("bias", (const(2 * D),))]
    assert [(n, t.dims) for n, t in subs["p_q"].params] == [("weight", (const(2 * D), const(D)))]
    assert out.plan["a_b.weight"].sources == ("a.weight", "b.weight") and out.plan["a_b.weight"].axis == 1
    assert out.plan["p_q.weight"].sources == ("p.kernel", "q.kernel") and out.plan["p_q.weight"].axis == 0


def test_switched_off_nothing_fuses(program, monkeypatch):
    monkeypatch.setenv(SWITCH, "0")
    out = optimize(program, passes=("fuse_linears",))
    assert [s.name for s in out.program.blocks["Model"].subs] == ["a", "b", "p", "q"]
    assert out.plan == {}


def test_fused_program_matches_torch(program):
    torch = pytest.importorskip("torch", reason="this test compares with torch, which must be installed")
    from test_optimize import _torch_model

    rng = np.random.default_rng(3)
    params = {path: rng.standard_normal([d.as_int() for d in t.dims]).astype(np.float32)
              for path, t in program.param_paths()}
    out = optimize(program, passes=("fuse_linears",))
    model = _torch_model(out.program, bind_params(out, params))
    x = rng.standard_normal((2, 3, D)).astype(np.float32)
    t = {k: torch.from_numpy(v) for k, v in params.items()}
    xt = torch.from_numpy(x)
    expected = ((xt @ t["a.weight"] + t["a.bias"]) * torch.nn.functional.linear(xt, t["p.kernel"])
                + torch.nn.functional.linear(xt, t["q.kernel"]) - (xt @ t["b.weight"] + t["b.bias"]))
    with torch.inference_mode():
        got = model.mix(xt)
    assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5)


def test_onednn_runs_a_conv1d_layout_weight_and_gives_it_back_as_stored():
    torch = pytest.importorskip("torch", reason="this test compares with torch, which must be installed")
    if not torch.backends.mkldnn.is_available():
        pytest.fail("this test needs torch built with oneDNN (mkldnn)")
    from linnet.backends import torch_kernels
    from linnet.middle.linears import DenseForm

    class Conv1D(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(16, 24))  # [In, Out]
            self.bias = torch.nn.Parameter(torch.randn(24))

        def forward(self, x):
            return torch.matmul(x, self.weight) + self.bias

    module = Conv1D()
    stored = module.weight.detach().clone()
    torch_kernels.install_onednn(module, DenseForm("weight", "bias", False, const(16), const(24), "f32"))
    x = torch.randn(5, 16)
    with torch.inference_mode():
        got = module(x)
    assert torch.allclose(got, x @ stored + module.bias, atol=1e-5, rtol=1e-5)
    assert torch.equal(module.weight, stored) and torch.equal(module.state_dict()["weight"], stored)


# ------------------------------------------- std's MaybeBiasLinear (Qwen2's and Llama's q/k/v)

MAYBE_SOURCE = """\
module maybe

use std.nn.linear::{MaybeBiasLinear}

pub block Model<D: Dim, Biased: Dim, T: Float = f32>
where Biased <= 1 {
    sub q: MaybeBiasLinear<D, D, Biased, T>
    sub k: MaybeBiasLinear<D, 2 * D, Biased, T>
    sub v: MaybeBiasLinear<D, D, Biased, T>

    pub entry mix<B: Dim, S: Dim>(x: Tensor[B, S, D; T]) -> Tensor[B, S, D; T] {
        return q.forward(x) * k.forward(x)[:, :, :D] + v.forward(x)
    }
}
"""


def _maybe_program(tmp_path_factory, biased: int) -> ir.Program:
    entry = tmp_path_factory.mktemp(f"maybe{biased}") / "maybe-bias"
    (entry / "src").mkdir(parents=True)
    (entry / "src" / "lib.linnet").write_text(MAYBE_SOURCE, encoding="utf-8")
    manifest = MANIFEST.replace('name = "dense-structure"', 'name = "maybe-bias"').replace(
        'entry = "mix"', 'entry = "mix"').replace(f"D = {D}\n", f"D = {D}\nBiased = {biased}\n")
    (entry / "nest.toml").write_text(manifest, encoding="utf-8")
    (entry / "linnet.toml").write_text('[package]\nname = "maybe"\nversion = "0.1.0"\nlanguage = "0.1"\n')
    return lower(compile_target(locate(entry)).instance)


@pytest.mark.parametrize("biased", [0, 1])
def test_maybe_bias_linear_is_a_dense_layer_with_its_bias_in_the_array(tmp_path_factory, biased):
    """`var y = matmul(x, transpose(weight)); static for b in bias { y = b.forward(y) }; return y`
    is `x W^T (+ b)`: with one Bias element its param `bias.0.bias`, with none no bias."""
    program = _maybe_program(tmp_path_factory, biased)
    for sub in program.blocks["Model"].subs:
        form = dense_form(program, _forward(program, sub.block))
        assert form is not None, sub.name
        assert (form.weight, form.bias, form.out_in) == ("weight", "bias.0.bias" if biased else None, True)
    paths = {p for p, _ in program.param_paths()}
    assert ("q.bias.0.bias" in paths) == bool(biased)


@pytest.mark.parametrize("biased", [0, 1])
def test_maybe_bias_siblings_fuse_and_match_torch(tmp_path_factory, biased):
    torch = pytest.importorskip("torch", reason="this test compares with torch, which must be installed")
    from test_optimize import _torch_model

    program = _maybe_program(tmp_path_factory, biased)
    out = optimize(program, passes=("fuse_linears",))
    ir.verify(out.program)
    (fused,) = out.program.blocks["Model"].subs
    assert fused.name == "q_k_v"
    params = dict(out.program.blocks[fused.block].params)
    assert params["weight"].dims == (const(4 * D), const(D)) and ("bias" in params) == bool(biased)
    assert out.plan["q_k_v.weight"].sources == ("q.weight", "k.weight", "v.weight")
    if biased:
        assert out.plan["q_k_v.bias"].sources == ("q.bias.0.bias", "k.bias.0.bias", "v.bias.0.bias")
    rng = np.random.default_rng(5)
    original = {path: rng.standard_normal([d.as_int() for d in t.dims]).astype(np.float32)
                for path, t in program.param_paths()}
    model = _torch_model(out.program, bind_params(out, original))
    x = torch.from_numpy(rng.standard_normal((2, 3, D)).astype(np.float32))
    t = {k: torch.from_numpy(v) for k, v in original.items()}

    def linear(name):
        return torch.nn.functional.linear(x, t[f"{name}.weight"], t.get(f"{name}.bias.0.bias"))

    expected = linear("q") * linear("k")[:, :, :D] + linear("v")
    with torch.inference_mode():
        got = model.mix(x)
    assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5)


SPLIT_SOURCE = """\
module split

use std.nn.linear::{{MaybeBiasLinear}}

pub block Model<D: Dim, Biased: Dim, T: Float = f32>
where Biased <= 1 {{
    sub q: MaybeBiasLinear<D, D, Biased, T>
    sub k: MaybeBiasLinear<D, D, Biased, T>
    sub v: MaybeBiasLinear<D, D, Biased, T>

{entry}
}}
"""

#: k and v in statements of their own, on the entry's argument (the Llama source's
#: `key_value`); q on a value the method computes, which is not the argument.
SPLIT_MIX = """\
    pub entry mix<B: Dim, S: Dim>(x: Tensor[B, S, D; T]) -> Tensor[B, S, D; T] {
        let a = tanh(k.forward(x))
        let b = v.forward(x) * a
        let y = x * 2.0
        return b + q.forward(y)
    }"""

#: k and v on a local reassigned between the calls: two different values.
SPLIT_MOVED = """\
    pub entry moved<B: Dim, S: Dim>(x: Tensor[B, S, D; T]) -> Tensor[B, S, D; T] {
        var h = x
        let a = k.forward(h)
        h = h * 2.0
        return a + v.forward(h) + q.forward(x)
    }"""


def _split_program(tmp_path_factory, entry_name: str, body: str) -> ir.Program:
    entry = tmp_path_factory.mktemp(f"split-{entry_name}") / "split"
    (entry / "src").mkdir(parents=True)
    (entry / "src" / "lib.linnet").write_text(SPLIT_SOURCE.format(entry=body), encoding="utf-8")
    manifest = MANIFEST.replace('name = "dense-structure"', 'name = "split"').replace(
        'entry = "mix"', f'entry = "{entry_name}"').replace(f"D = {D}\n", f"D = {D}\nBiased = 1\n")
    (entry / "nest.toml").write_text(manifest, encoding="utf-8")
    (entry / "linnet.toml").write_text('[package]\nname = "split"\nversion = "0.1.0"\nlanguage = "0.1"\n')
    return lower(compile_target(locate(entry)).instance)


def test_calls_on_one_argument_fuse_across_statements_into_one_call(tmp_path_factory):
    torch = pytest.importorskip("torch", reason="this test compares with torch, which must be installed")
    from test_optimize import _torch_model

    program = _split_program(tmp_path_factory, "mix", SPLIT_MIX)
    out = optimize(program, passes=("fuse_linears",))
    ir.verify(out.program)
    assert sorted(s.name for s in out.program.blocks["Model"].subs) == ["k_v", "q"]
    mix = out.program.functions[out.program.entries["mix"].function]
    fused_calls = [e for e in ir.exprs(mix.body) if isinstance(e, ir.Call) and e.receiver == "k_v"]
    assert len(fused_calls) == 1  # one GEMM for both statements, not one per statement
    rng = np.random.default_rng(7)
    original = {path: rng.standard_normal([d.as_int() for d in t.dims]).astype(np.float32)
                for path, t in program.param_paths()}
    model = _torch_model(out.program, bind_params(out, original))
    x = torch.from_numpy(rng.standard_normal((2, 3, D)).astype(np.float32))
    t = {k: torch.from_numpy(v) for k, v in original.items()}

    def linear(name, h):
        return torch.nn.functional.linear(h, t[f"{name}.weight"], t[f"{name}.bias.0.bias"])

    expected = linear("v", x) * torch.tanh(linear("k", x)) + linear("q", x * 2.0)
    with torch.inference_mode():
        got = model.mix(x)
    assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5)


def test_calls_on_a_reassigned_local_do_not_fuse(tmp_path_factory):
    program = _split_program(tmp_path_factory, "moved", SPLIT_MOVED)
    out = optimize(program, passes=("fuse_linears",))
    assert sorted(s.name for s in out.program.blocks["Model"].subs) == ["k", "q", "v"]
