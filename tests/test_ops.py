"""The op registry (`linnet.ops`) and what is registered against it.

* Every op has an emission on every backend (torch, JAX, ONNX; StableHLO exports the JAX
  source, so it uses JAX's table), or a refusal whose reason reaches the user.
* `ir.verify` refuses an op the registry does not know and attrs that do not fit its schema.
* The std kernel keys (`linnet.kernels`) name real std functions, and the fused forms of
  every backend and the optimiser use only those keys.
* `gelu_tanh`, the primitive added as one record and one emission per backend, computes
  torch's `F.gelu(approximate="tanh")` on every backend, and folds on a constant.
"""
from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from linnet.middle import ir
from linnet import kernels, ops
from linnet.backends import jax_source as jax_backend
from linnet.backends import onnx_graph as onnx_backend
from linnet.backends import torch_source as pytorch
from linnet.cli.targets import locate
from linnet.compiler import compile_target
from linnet.diagnostics import InternalError, LinnetError
from linnet.dims import const
from linnet.middle.lower import lower

BACKEND_TABLES = {"torch": pytorch.EMISSIONS, "jax": jax_backend.EMISSIONS, "onnx": onnx_backend.EMISSIONS}

SOURCE = """\
module acts

pub block Acts<D: Dim, T: Float = f32> {
    param shift: Tensor[D; T]

    pub entry probs<B: Dim>(x: Tensor[B, D; T]) -> Tensor[B, D; T] {
        return softmax(x + shift, -1)
    }

    pub entry gelu<B: Dim>(x: Tensor[B, D; T]) -> Tensor[B, D; T] {
        return gelu_tanh(x + shift)
    }

    // A constant argument is folded when lowering: no backend sees gelu_tanh of a number.
    pub entry folded<B: Dim>(x: Tensor[B, D; T]) -> Tensor[B, D; T] {
        return x * gelu_tanh(1.5)
    }
}
"""

MANIFEST = """\
[model]
name = "acts"
title = "Activation test block"
summary = "One param and a primitive per entry."
license = "MIT"
family = "test"

[source]
path = "src/lib.linnet"
root = "Acts"
entry = "{entry}"

[generics]
D = 6
T = "f32"

[check]
B = 2

[weights]
repo = "linnet/acts"
revision = "{revision}"
files = ["model.safetensors"]
bindings = "bindings.json"
"""


def write_entry(folder, source: str = SOURCE, entry: str = "probs", shift: np.ndarray | None = None):
    """A zoo entry over `source` with its weights file beside it; returns (entry folder, weights file)."""
    from safetensors.numpy import save_file

    (folder / "src").mkdir(parents=True)
    (folder / "src" / "lib.linnet").write_text(source, encoding="utf-8")
    (folder / "nest.toml").write_text(MANIFEST.format(entry=entry, revision="0" * 40), encoding="utf-8")
    (folder / "linnet.toml").write_text('[package]\nname = "acts"\nversion = "0.1.0"\nlanguage = "0.1"\n')
    (folder / "bindings.json").write_text(json.dumps({"shift": "ckpt.shift"}))
    weights = folder.parent / "model.safetensors"
    save_file({"ckpt.shift": np.zeros(6, np.float32) if shift is None else shift}, str(weights))
    return folder, weights


@pytest.fixture
def program(tmp_path) -> ir.Program:
    entry, _ = write_entry(tmp_path / "acts")
    return lower(compile_target(locate(entry)).instance)


def _softmax_op(program: ir.Program) -> ir.Op:
    (stmt,) = program.functions[program.entries["probs"].function].body
    assert isinstance(stmt.value, ir.Op) and stmt.value.op == "softmax"
    return stmt.value


def _with_result(program: ir.Program, op: ir.Op) -> ir.Program:
    fn = program.functions[program.entries["probs"].function]
    fn.body = [replace(fn.body[0], value=op)]
    return program


# ------------------------------------------------------------- completeness


@pytest.mark.parametrize("backend", sorted(BACKEND_TABLES))
def test_every_op_has_an_emission_or_a_declared_refusal(backend):
    table = BACKEND_TABLES[backend]
    assert table.missing() == [], f"{backend} has no emission for {table.missing()}"
    for name, reason in table.refusals.items():
        assert reason.strip(), f"{backend} refuses `{name}` without saying why"


def test_stablehlo_exports_the_jax_source_so_it_uses_the_jax_table(program, tmp_path, monkeypatch):
    from linnet.backends import stablehlo_export as stablehlo

    refusing = ops.Emissions("jax", jax_backend.EMISSIONS)
    refusing.refuse("softmax", "not in this test's jax")
    monkeypatch.setattr(jax_backend.JaxEmitter, "EMISSIONS", refusing)
    with pytest.raises(InternalError, match="cannot express `softmax`: not in this test's jax"):
        stablehlo.write_artifact(SimpleNamespace(name="acts", program=program), tmp_path / "out")


def test_a_refusal_reaches_the_user_with_its_reason(program, monkeypatch):
    from linnet.backends import onnx_emissions

    refusing = ops.Emissions("onnx", onnx_backend.EMISSIONS)
    refusing.refuse("softmax", "no Softmax in this test's opset")
    monkeypatch.setattr(onnx_emissions, "EMISSIONS", refusing)  # the table an emitter reads
    tensors = {"shift": np.zeros(6, np.float32)}
    with pytest.raises(LinnetError) as caught:
        onnx_backend.emit(program, tensors, name="acts", outputs={e: e + "_out" for e in program.entries})
    (diagnostic,) = caught.value.diagnostics
    assert diagnostic.code == "E0830"
    assert "`softmax`: no Softmax in this test's opset" in diagnostic.message


def test_tables_take_only_registered_ops():
    table = ops.Emissions("test")
    with pytest.raises(KeyError, match="no op `softmaxx`"):
        table.register("softmaxx")(lambda *a: None)
    with pytest.raises(KeyError, match="no op `gelu_exact`"):
        table.refuse("gelu_exact", "why")
    assert "softmax" in table.missing()
    table.refuse("softmax", "a reason")
    assert "softmax" not in table.missing() and "softmax" not in table
    assert table.why_not("softmax") == "the test backend cannot express `softmax`: a reason"


# ----------------------------------------------------------------- registry


def test_primitives_are_the_records_with_a_signature():
    assert set(ops.PRIMS) == {name for name, op in ops.OPS.items() if op.signature is not None}
    for name, op in ops.PRIMS.items():
        assert op.signature.startswith(f"{name}(") or op.signature.startswith(f"{name}<"), op.signature
        assert op.rule is not None and op.arity, name
    # The operators and indexing are IR ops no program calls by name.
    assert {"add", "sub", "mul", "div", "neg", "index"} <= set(ops.OPS) - set(ops.PRIMS)


def test_the_checker_sees_the_registry_through_prims():
    from linnet import prims

    assert prims.PRIMS is ops.PRIMS


def test_folds_give_ieee_values_where_math_raises():
    assert ops.OPS["rsqrt"].fold(0.0) == float("inf")
    assert ops.OPS["log"].fold(0.0) == float("-inf")
    assert ops.OPS["exp"].fold(1000.0) == float("inf")
    assert ops.OPS["rsqrt"].fold(4.0) == 0.5


# ------------------------------------------------------------------ verify


def test_verify_accepts_what_lowering_makes(program):
    ir.verify(program)
    assert _softmax_op(program).attrs == (("axis", -1),)


def test_verify_refuses_an_op_the_registry_does_not_know(program):
    bad = _with_result(program, replace(_softmax_op(program), op="softmax_fast"))
    with pytest.raises(InternalError, match="the op `softmax_fast` is not in the registry"):
        ir.verify(bad)


@pytest.mark.parametrize("attrs,message", [
    ((), r"`softmax` has attrs \[\]; its schema is \(axis: int\)"),
    ((("axis", -1), ("keepdim", True)), r"has attrs \['axis', 'keepdim'\]"),
    ((("axis", "-1"),), "`softmax` attr `axis` is '-1', not a int"),
    ((("axis", True),), "attr `axis` is True, not a int"),
])
def test_verify_refuses_attrs_outside_the_schema(program, attrs, message):
    bad = _with_result(program, replace(_softmax_op(program), attrs=attrs))
    with pytest.raises(InternalError, match=message):
        ir.verify(bad)


def test_verify_checks_the_attrs_of_every_kind():
    assert ops.attr_problem("reshape", (("shape", (const(2), const(3))),)) is None
    assert "not a tuple[DimExpr]" in ops.attr_problem("reshape", (("shape", (2, 3)),))
    assert "not a tuple[int]" in ops.attr_problem("permute", (("perm", (const(1), const(0))),))
    assert "not a DType" in ops.attr_problem("cast", (("dtype", "float32"),))
    assert ops.attr_problem("index", (("items", (("slice", const(0), None), ("index", const(1)))),)) is None
    assert "not a tuple[IndexItem]" in ops.attr_problem("index", (("items", (("slice", 0, None),)),))


# ------------------------------------------------------------------ kernels


def test_every_kernel_key_names_a_std_function():
    # BERT imports every std module but the activations, which ViT imports.
    std = {key for entry in ("bert-base-uncased", "vit-base-patch16-224")
           for key in compile_target(locate(entry)).checked.functions if key.startswith("std.")}
    assert set(kernels.ALL) <= std, sorted(set(kernels.ALL) - std)


def test_the_window_outside_score_is_std_attentions_outside():
    import re

    from linnet.paths import std_dir

    source = (std_dir() / "nn" / "attention.linnet").read_text(encoding="utf-8")
    assert float(re.search(r"pub const OUTSIDE: f32 = (\S+)", source).group(1)) == kernels.WINDOW_OUTSIDE


@pytest.mark.parametrize("module", [pytorch, jax_backend, onnx_backend])
def test_fused_forms_are_keyed_by_kernel_keys(module):
    assert set(module.FUSED) <= set(kernels.ALL)


# ---------------------------------------------------------------- gelu_tanh


@pytest.fixture(scope="module")
def gelu_entry(tmp_path_factory):
    shift = np.random.default_rng(5).standard_normal(6).astype(np.float32) * 0.1
    entry, weights = write_entry(tmp_path_factory.mktemp("gelu") / "acts", entry="gelu", shift=shift)
    return entry, weights, shift


def _torch_gelu_tanh(x: np.ndarray) -> np.ndarray:
    import torch
    import torch.nn.functional as F

    return F.gelu(torch.from_numpy(x), approximate="tanh").numpy()


@pytest.mark.parametrize("backend", ["torch", "jax", "stablehlo", "onnx"])
def test_gelu_tanh_matches_torch_on_every_backend(gelu_entry, backend):
    from linnet import nest

    entry, weights, shift = gelu_entry
    model = nest.load(entry, backend=backend, weights=weights)
    x = np.random.default_rng(1).standard_normal((5, 6)).astype(np.float32) * 3.0
    x[0] = [-8.0, -2.7, -0.5, 0.0, 2.7, 8.0]  # both tails, the kink, zero
    x[0] -= shift
    got = np.asarray(model.gelu(x))
    expected = _torch_gelu_tanh(x + shift)
    assert got.shape == expected.shape and got.dtype == np.float32
    diff = float(np.abs(got - expected).max())
    print(f"{backend}: gelu_tanh max|diff| vs F.gelu(approximate='tanh') {diff:.3g}")
    assert diff <= 1e-6
    # A constant argument: folded in float64 when lowering, then rounded to f32 like any literal.
    folded = np.asarray(model.folded(x))
    np.testing.assert_allclose(folded, x * np.float32(_torch_gelu_tanh(np.array(1.5, np.float64))), rtol=0,
                               atol=1e-6)


def test_gelu_tanh_of_a_constant_is_folded(gelu_entry):
    entry, _, _ = gelu_entry
    program = lower(compile_target(locate(entry)).instance)
    (stmt,) = program.functions[program.entries["folded"].function].body
    scalar = stmt.value.args[1]
    assert isinstance(scalar, ir.Scalar)
    assert scalar.value == pytest.approx(float(_torch_gelu_tanh(np.array(1.5, np.float64))), abs=1e-15)
    (stmt,) = program.functions[program.entries["gelu"].function].body
    assert stmt.value.op == "gelu_tanh" and stmt.value.attrs == ()


def test_gelu_tanh_is_checked_like_the_other_float_primitives(tmp_path):
    source = SOURCE.replace("return gelu_tanh(x + shift)", "return gelu_tanh(cast<i32>(x))")
    entry, _ = write_entry(tmp_path / "acts", source=source)
    with pytest.raises(LinnetError) as caught:
        compile_target(locate(entry))
    (diagnostic,) = caught.value.diagnostics
    assert diagnostic.code == "E0330" and "`gelu_tanh` needs a float tensor, found dtype i32" in diagnostic.message


# ------------------------------------------------------------------- concat

CONCAT_SOURCE = """\
module acts

pub block Acts<D: Dim, T: Float = f32> {
    param shift: Tensor[D; T]

    // A [1, 1, D] row repeated over the batch and put in front of every sequence, then the
    // sequences joined with themselves along the last axis: both ways `concat` is used.
    pub entry joined<B: Dim, S: Dim>(x: Tensor[B, S, D; T]) -> Tensor[B, S + 1, 2 * D; T] {
        let first = concat(reshape(shift, [1, 1, D]), x, 1)
        return concat(first, first * 2.0, -1)
    }
}
"""


@pytest.mark.parametrize("backend", ["torch", "jax", "stablehlo", "onnx"])
def test_concat_repeats_a_one_axis_and_joins_on_every_backend(tmp_path, backend):
    from linnet import nest

    shift = np.arange(6, dtype=np.float32) - 2.5
    entry, weights = write_entry(tmp_path / "acts", source=CONCAT_SOURCE, entry="joined", shift=shift)
    model = nest.load(entry, backend=backend, weights=weights)
    x = np.random.default_rng(2).standard_normal((3, 4, 6)).astype(np.float32)
    got = np.asarray(model.joined(x))
    first = np.concatenate([np.broadcast_to(shift, (3, 1, 6)), x], axis=1)
    np.testing.assert_array_equal(got, np.concatenate([first, first * 2.0], axis=-1))


@pytest.mark.parametrize("body,message", [
    ("concat(x, y, 0)", r"axis 1 is 4 in Tensor\[2, 4; f32\] and 5 in Tensor\[3, 5; f32\]"),
    ("concat(x, z, 0)", r"joins tensors of one rank, found Tensor\[2, 4; f32\] \(rank 2\)"),
    ("concat(x, y, 2)", "axis 2 is out of range"),
])
def test_concat_refuses_axes_that_do_not_fit(tmp_path, body, message):
    source = tmp_path / "c.linnet"
    source.write_text("fn f(x: Tensor[2, 4; f32], y: Tensor[3, 5; f32], z: Tensor[4; f32]) -> Tensor[5, 4; f32] {\n"
                      f"    return {body}\n}}\n", encoding="utf-8")
    with pytest.raises(LinnetError, match=message):
        compile_target(locate(source))


ACTIVATION_SOURCE = """\
module acts

pub block Acts<D: Dim, T: Float = f32, Kind: Activation = gelu_erf> {
    param shift: Tensor[D; T]

    pub entry act<B: Dim>(x: Tensor[B, D; T]) -> Tensor[B, D; T] {
        return activation(x + shift, Kind)
    }
}
"""
#: The same block picking its activation by a number, as before the `Activation` kind: still accepted.
NUMBERED_ACTIVATION_SOURCE = ACTIVATION_SOURCE.replace("Kind: Activation = gelu_erf", "Kind: Real = 0")


@pytest.mark.parametrize("backend", ["torch", "jax", "stablehlo", "onnx"])
@pytest.mark.parametrize("kind", ["gelu_erf", "gelu_tanh", "relu", "silu", 0, 1, 2, 3])
def test_activation_computes_each_kind_as_torch_does(tmp_path, backend, kind):
    """Each member of `Activation`, set by name in the manifest; and each legacy number on a
    `Real` generic (0 gelu_erf, 1 gelu_tanh, 2 relu, 3 silu), which must compute the same."""
    import torch
    import torch.nn.functional as F
    from linnet import nest

    by_name = isinstance(kind, str)
    entry, weights = write_entry(tmp_path / "acts", source=ACTIVATION_SOURCE if by_name else NUMBERED_ACTIVATION_SOURCE,
                                 entry="act", shift=np.linspace(-1, 1, 6).astype(np.float32))
    toml = entry / "nest.toml"
    toml.write_text(toml.read_text().replace('T = "f32"', f'T = "f32"\nKind = {kind!r}'.replace("'", '"')))
    model = nest.load(entry, backend=backend, weights=weights)
    x = np.linspace(-6, 6, 48, dtype=np.float32).reshape(8, 6)
    shifted = torch.from_numpy(x + np.linspace(-1, 1, 6).astype(np.float32))
    expected = {"gelu_erf": F.gelu(shifted), "gelu_tanh": F.gelu(shifted, approximate="tanh"),
                "relu": F.relu(shifted), "silu": F.silu(shifted)}[kind if by_name else
                                                                   ("gelu_erf", "gelu_tanh", "relu", "silu")[kind]].numpy()
    np.testing.assert_allclose(np.asarray(model.act(x)), expected, atol=1e-6, rtol=0)


def test_the_activation_kind_list_is_the_activation_generic_kind():
    from linnet.types import MEMBER_KINDS
    assert ops.ACTIVATIONS is MEMBER_KINDS["Activation"]
    assert ops.ACTIVATION.accepts("silu") and not ops.ACTIVATION.accepts("gelu")


@pytest.mark.parametrize("value, found", [("2", "the number 2"), ("0.5", "the number 0.5"), ('"f32"', '"f32"')])
def test_a_manifest_activation_that_is_no_member_is_refused_naming_the_members(tmp_path, value, found):
    entry, _ = write_entry(tmp_path / "acts", source=ACTIVATION_SOURCE, entry="act")
    toml = entry / "nest.toml"
    toml.write_text(toml.read_text().replace('T = "f32"', f'T = "f32"\nKind = {value}'))
    with pytest.raises(LinnetError) as caught:
        compile_target(locate(entry))
    text = caught.value.render()
    assert caught.value.code == "E0507", text
    assert ("`Kind` is Activation and needs one of its members by name (gelu_erf, gelu_tanh, relu, silu), "
            f"found {found}") in text


def test_an_unknown_activation_kind_is_refused_at_the_call(tmp_path):
    entry, _ = write_entry(tmp_path / "acts", source=NUMBERED_ACTIVATION_SOURCE, entry="act")
    toml = entry / "nest.toml"
    toml.write_text(toml.read_text().replace('T = "f32"', 'T = "f32"\nKind = 7'))
    with pytest.raises(LinnetError) as caught:
        lower(compile_target(locate(entry)).instance)
    text = caught.value.render()
    assert caught.value.code == "E0602", text
    assert "takes a kind number in 0..3 (0 gelu_erf, 1 gelu_tanh, 2 relu, 3 silu), found 7" in text
    assert "lib.linnet:7" in text  # the call's line


# ------------------------------------------------------------------- traits


def test_every_op_says_what_it_is_for_the_passes():
    """A record without a kind (or with one a pass has no reading of) fails here, not silently
    in packing or dead-row elimination, which would treat the op as unknown and leave it slow."""
    for name, op in ops.OPS.items():
        assert op.kind in ops.KINDS, f"`{name}` has no kind; say which of {ops.KINDS} it is"
        assert op.zero_fill in (None, ops.ZERO_IF_ALL, ops.ZERO_IF_ANY), name
        if op.along_axis:  # the passes read the axis it acts along from its attrs
            assert dict(op.attrs).get("axis") is ops.INT, f"`{name}` acts along an axis but has no `axis` attr"
        if op.rearranges:
            assert op.moves_data, f"`{name}` rearranges its elements but is not data movement"
        if op.kind == ops.UNARY and op.is_primitive:
            assert op.arity[0] >= 1, name
        # Where the type rule lives names something importable.
        module, _, attr = op.rule_home.rpartition(".")
        import importlib

        home = importlib.import_module(op.rule_home) if op.rule is None else importlib.import_module(module)
        assert op.rule is None or getattr(home, attr) is op.rule


def test_the_passes_read_their_sets_from_the_registry():
    # The sets the passes used to keep by name, as the registry now derives them.
    assert ops.named(lambda op: op.elementwise) >= {"add", "mul", "exp", "select", "dropout", "cast", "activation"}
    assert ops.named(lambda op: op.along_axis) == {"softmax", "cumsum", "sum", "mean", "max"}
    assert ops.named(lambda op: op.moves_data) == {"reshape", "permute", "transpose", "index"}
    assert ops.named(lambda op: op.zero_fill is not None) == {"neg", "cast", "mul", "reshape", "permute",
                                                              "transpose", "index"}
    assert not ops.named(lambda op: op.elementwise) & ops.named(lambda op: op.moves_data or op.along_axis)


def _trait_source() -> str:
    """One entry per op whose claim is cheap to run: each elementwise primitive of one float
    tensor (or of two), each reduction and scan along axis 0, and the zero-fill claims."""
    entries = []
    for name, op in ops.PRIMS.items():
        if op.kind == ops.UNARY and op.arity == (1,) and op.dtype_generics == 0:
            entries.append(f"pub entry e_{name}<B: Dim>(x: Tensor[B, D; T]) -> Tensor[B, D; T] {{ return {name}(x) }}")
        elif op.kind == ops.ELEMENTWISE and op.arity == (2,) and name != "dropout":
            result = "bool" if "; bool]" in op.signature else "T"  # a comparison
            entries.append(f"pub entry e_{name}<B: Dim>(x: Tensor[B, D; T]) -> Tensor[B, D; {result}] "
                           f"{{ return {name}(x, x * 0.5 + shift) }}")
        elif op.kind == ops.REDUCE:
            entries.append(f"pub entry e_{name}<B: Dim>(x: Tensor[B, D; T]) -> Tensor[1, D; T] {{ return {name}(x, 0) }}")
        elif op.kind == ops.SCAN:
            entries.append(f"pub entry e_{name}<B: Dim>(x: Tensor[B, D; T]) -> Tensor[B, D; T] {{ return {name}(x, 0) }}")
    zero = {
        "neg": ("Tensor[B, D; T]", "-x"),
        "cast": ("Tensor[B, D; f64]", "cast<f64>(x)"),
        "mul": ("Tensor[B, D; T]", "x * (shift + 3.0)"),
        "reshape": ("Tensor[B, D, 1; T]", "reshape(x, [B, D, 1])"),
        "permute": ("Tensor[D, B; T]", "permute(x, [1, 0])"),
        "transpose": ("Tensor[D, B; T]", "transpose(x)"),
        "index": ("Tensor[B, 3; T]", "x[:, 1:4]"),
    }
    for name, (result, body) in zero.items():
        entries.append(f"pub entry z_{name}<B: Dim>(x: Tensor[B, D; T]) -> {result} {{ return {body} }}")
    body = "\n".join(f"    {e}" for e in entries)
    return f"module acts\n\npub block Acts<D: Dim, T: Float = f32> {{\n    param shift: Tensor[D; T]\n\n{body}\n}}\n"


@pytest.fixture(scope="module")
def trait_model(tmp_path_factory):
    from linnet import nest

    shift = np.linspace(-1.0, 1.5, 6).astype(np.float32)
    entry, weights = write_entry(tmp_path_factory.mktemp("traits") / "acts", source=_trait_source(), entry="z_neg",
                                 shift=shift)
    return nest.load(entry, backend="torch", weights=weights)


def _x(rows: int = 4) -> np.ndarray:
    return (np.random.default_rng(3).standard_normal((rows, 6)) * 0.8 + 0.3).astype(np.float32)


def test_elementwise_ops_act_on_each_element_alone(trait_model):
    """Changing row 0 of x changes row 0 of the result only (packing runs such ops per token)."""
    names = [n for n, op in ops.PRIMS.items() if op.elementwise and hasattr(trait_model, f"e_{n}")]
    assert {"exp", "erf", "maximum", "less"} <= set(names)
    x = np.abs(_x()) + 0.1  # inside every unary op's domain (log, sqrt, rsqrt)
    y = x.copy()
    y[0] += 0.7
    for name in names:
        fn = getattr(trait_model, f"e_{name}")
        a, b = np.asarray(fn(x)), np.asarray(fn(y))
        np.testing.assert_array_equal(a[1:], b[1:], err_msg=name)
        assert not np.array_equal(a[0], b[0]) or a.dtype == bool, name


def test_along_axis_ops_act_on_each_position_of_the_other_axes_alone(trait_model):
    """Along axis 0: changing column 0 changes column 0 of the result only."""
    names = [n for n, op in ops.PRIMS.items() if op.along_axis]
    x = _x()
    y = x.copy()
    y[:, 0] += np.array([0.5, -0.25, 1.0, 2.0], np.float32)
    for name in names:
        fn = getattr(trait_model, f"e_{name}")
        a, b = np.asarray(fn(x)), np.asarray(fn(y))
        np.testing.assert_array_equal(a[:, 1:], b[:, 1:], err_msg=name)
        assert not np.array_equal(a[:, 0], b[:, 0]), name


def test_ops_that_claim_to_keep_a_zero_fill_map_zero_rows_to_zero(trait_model):
    """Row 2 of x is zeros (a position packing did not compute); where it lands, the result is 0,
    and elsewhere it is not (so the check can fail)."""
    x = _x()
    x[2] = 0.0
    for name in ops.named(lambda op: op.zero_fill is not None):
        got = np.asarray(getattr(trait_model, f"z_{name}")(x))
        zero, rest = (got[:, 2], np.delete(got, 2, axis=1)) if name in ("permute", "transpose") else (
            got[2], np.delete(got, 2, axis=0))
        assert np.all(zero == 0), name
        assert np.all(rest != 0), name


def test_onnx_writes_the_registrys_data_movement_with_data_op_types(tmp_path):
    """The bf16 CPU variant leaves `DATA_OP_TYPES` nodes in bf16 (ONNX's names, not the
    registry's); each data-movement op of the registry must be written with those alone, or the
    variant would compute a pure copy in f32."""
    entry, _ = write_entry(tmp_path / "acts", source=_trait_source(), entry="z_neg")
    program = lower(compile_target(locate(entry)).instance)
    moves = ops.named(lambda op: op.moves_data)
    names = [f"z_{name}" for name in moves]
    assert len(names) == 4
    tensors = {"shift": np.zeros(6, np.float32)}
    for name in names:
        sub = replace(program, entries={name: program.entries[name]})
        (model_file,) = onnx_backend.emit(sub, tensors, name="acts", outputs={name: "out"})
        types = {node.op_type for node in model_file.model.graph.node}
        assert types <= onnx_backend.DATA_OP_TYPES, (name, types - onnx_backend.DATA_OP_TYPES)
