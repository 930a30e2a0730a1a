"""The checker and instantiation on programs that are right: what they prove and record.

The invalid programs live in the golden corpus (`test_corpus.py`); here the BERT entries
check, their signatures and parameter counts are exact, and the features the zoo relies
on (divisibility facts, right-aligned broadcasting, generic inference, dtype generics and
defaults, entry preconditions) do what they promise.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from linnet.front import ast
from linnet.check import CheckedProgram, check
from linnet.cli.targets import locate
from linnet.compiler import compile_target
from linnet.diagnostics import LinnetError
from linnet.dims import const, sym
from linnet.middle.instantiate import instantiate
from linnet.front.resolve import load_file
from linnet.types import SubArrayT, SubT, TensorT, Variadic

REPO = Path(__file__).resolve().parent.parent
BERT = REPO / "nest" / "bert-base-uncased"
MINILM = REPO / "nest" / "all-minilm-l6-v2"


def check_source(tmp_path: Path, source: str, name: str = "prog") -> CheckedProgram:
    path = tmp_path / f"{name}.linnet"
    path.write_text(source, encoding="utf-8")
    return check(load_file(path))


def check_fails(tmp_path: Path, source: str) -> LinnetError:
    with pytest.raises(LinnetError) as info:
        check_source(tmp_path, source)
    return info.value


def result_type(checked: CheckedProgram, key: str):
    """The type the checker recorded for the value of the last `return` of a function."""
    fn = checked.functions[key]
    ret = fn.node.body[-1]
    assert isinstance(ret, ast.Return)
    return checked.types[id(ret.value)]


def find_calls(node, name):
    """Every call (or method call) named `name` under a syntax node."""
    if isinstance(node, (list, tuple)):
        for item in node:
            yield from find_calls(item, name)
        return
    if not hasattr(node, "__dataclass_fields__"):
        return
    if isinstance(node, ast.Call) and node.name == name or isinstance(node, ast.MethodCall) and node.method == name:
        yield node
    for field in node.__dataclass_fields__:
        if field not in ("span", "name_span"):
            yield from find_calls(getattr(node, field), name)


# ------------------------------------------------------------------------------ the zoo


@pytest.fixture(scope="module")
def bert():
    return compile_target(locate(BERT))


def test_bert_checks_with_every_entry(bert):
    assert bert.target.kind == "entry"
    assert bert.instance.root.block.name == "PreTraining"
    assert list(bert.instance.entries) == ["forward", "hidden_states", "pool", "embed", "forward_positioned",
                                           "forward_embeds", "forward_head_masked", "forward_full", "attentions",
                                           "mlm", "nsp", "mlm_loss", "nsp_loss", "pretraining_loss"]
    assert bert.generics == {"Vocab": 30522, "MaxPositions": 512, "TypeVocab": 2, "D": 768, "Heads": 12,
                             "Inner": 3072, "Layers": 12, "T": "f32"}
    assert bert.check_dims == {"B": 1, "S": 8}


def test_bert_entry_signatures(bert):
    entries = bert.instance.entries
    inputs = ("(tokens: Tensor[B, S; i32], token_types: Tensor[B, S; i32] = zeros, "
              "attention_mask: Tensor[B, S; i32] = ones)")
    assert str(entries["forward"]) == f"forward<B, S>{inputs} -> Tensor[B, S, 768; f32] where S <= 512"
    assert str(entries["pool"]) == f"pool<B, S>{inputs} -> Tensor[B, 768; f32] where S <= 512"
    assert str(entries["embed"]) == f"embed<B, S>{inputs} -> Tensor[B, 768; f32] where S <= 512"
    assert str(entries["mlm"]) == f"mlm<B, S>{inputs} -> Tensor[B, S, 30522; f32] where S <= 512"
    assert str(entries["nsp"]) == f"nsp<B, S>{inputs} -> Tensor[B, 2; f32] where S <= 512"
    assert entries["forward"].dim_sources() == {"B": ("tokens", 0), "S": ("tokens", 1)}
    loss_inputs = ("(tokens: Tensor[B, S; i32], token_types: Tensor[B, S; i32], attention_mask: Tensor[B, S; i32], "
                   "labels: Tensor[B, S; i32], next_sentence_label: Tensor[B; i32])")
    assert str(entries["pretraining_loss"]) == f"pretraining_loss<B, S>{loss_inputs} -> Tensor[; f32] where S <= 512"


def test_bert_precondition_is_recorded_for_every_entry(bert):
    for name in ("forward", "hidden_states", "pool", "embed", "forward_positioned", "forward_embeds",
                 "forward_head_masked", "attentions", "mlm", "nsp", "mlm_loss", "nsp_loss", "pretraining_loss"):
        (pre,) = bert.instance.entries[name].preconditions
        assert str(pre) == "S <= 512"
        assert str(pre.clause) == "S <= MaxPositions"
        assert pre.clause.span.file.endswith("lib.linnet")
        assert bert.instance.check_dims(name, {"B": 2, "S": 512}) == []
        (problem,) = bert.instance.check_dims(name, {"B": 2, "S": 513})
        assert problem.code == "E0403" and "513 <= 512" in problem.message


def test_bert_parameter_count_and_tensors(bert):
    instance = bert.instance
    # Every value of the upstream model.safetensors (440,425,712 bytes of f32): the encoder,
    # pooler and both pre-training heads, with the masked-LM decoder tied, not stored twice.
    assert instance.param_count == 110_106_428 == 440_425_712 // 4
    assert len(instance.params) == 206
    shapes = {p.name: p.shape for p in instance.params}
    assert shapes["bert.encoder.embeddings.word_embeddings"] == (30522, 768)
    assert shapes["bert.encoder.embeddings.position_embeddings"] == (512, 768)
    assert shapes["bert.encoder.layers.0.attention.query.weight"] == (768, 768)
    assert shapes["bert.encoder.layers.11.up.weight"] == (3072, 768)
    assert shapes["bert.encoder.layers.11.down.bias"] == (768,)
    assert shapes["bert.pooler.dense.weight"] == (768, 768)
    assert shapes["mlm.transform.weight"] == (768, 768) and shapes["mlm.bias"] == (30522,)
    assert shapes["nsp.weight"] == (2, 768) and shapes["nsp.bias"] == (2,)
    assert [name for name, shape in shapes.items() if shape == (30522, 768)] == [
        "bert.encoder.embeddings.word_embeddings"]
    assert {p.dtype for p in instance.params} == {"f32"}


def test_minilm_parameter_count():
    compiled = compile_target(locate(MINILM))
    assert compiled.instance.param_count == 22_713_216
    assert len(compiled.instance.params) == 103
    assert str(compiled.instance.entries["forward"]).endswith("-> Tensor[B, S, 384; f32] where S <= 512")


def test_bert_generic_signatures(bert):
    functions = bert.checked.functions
    assert functions["std.nn.norm::LayerNorm.forward"].signature() == "forward<*S>(x: Tensor[*S, D; T]) -> Tensor[*S, D; T]"
    assert functions["std.nn.attention::attention"].signature().startswith("attention<*Lead, *M, Q, K, Dh, Dv, T>(")
    assert functions["bert::Model.forward"].is_entry
    assert [str(w) for w in functions["bert::Model.forward"].where] == ["S <= MaxPositions"]


def test_bert_sub_arrays_and_defaults(bert):
    encoder = bert.checked.find_block("Encoder")
    layers, _ = encoder.subs["layers"]
    assert isinstance(layers, SubArrayT) and layers.count == sym("Layers")
    linear = bert.checked.find_block("Attention").subs["query"][0]
    assert isinstance(linear, SubT) and dict(linear.bindings)["In"] == sym("D")


def test_overrides_change_generics_and_check_dims():
    compiled = compile_target(locate(BERT), {"S": 512, "Layers": 2, "T": "f16"})
    assert compiled.check_dims["S"] == 512
    assert len([p for p in compiled.instance.params if p.name.startswith("bert.encoder.layers.")]) == 2 * 16
    assert {p.dtype for p in compiled.instance.params} == {"f16"}


@pytest.mark.parametrize("overrides, code, needle", [
    ({"S": 600}, "E0403", "600 <= 512"),
    ({"Heads": 10}, "E0401", "D % Heads == 0"),
    ({"Heads": 0}, "E0401", "Heads > 0"),
    ({"D": -1}, "E0503", "non-negative"),
    ({"T": "i32"}, "E0503", "Float"),
    ({"Width": 3}, "E0504", "Width"),
    ({"B": "x"}, "E0503", "'x'"),
])
def test_bad_overrides_are_reported_not_crashes(overrides, code, needle):
    with pytest.raises(LinnetError) as info:
        compile_target(locate(BERT), overrides)
    first = info.value.diagnostics[0]
    assert first.code == code and needle in first.message
    # Values from --set are not blamed on line 1 of nest.toml.
    assert not (first.span.file.endswith("nest.toml") and first.span.line == 1)
    rendered = info.value.render()
    name = next(iter(overrides))
    assert f"--set {name}=" in rendered


def test_instantiation_errors_point_at_the_manifest_line_or_declaration():
    with pytest.raises(LinnetError) as info:
        compile_target(locate(BERT), {"Heads": 10})
    (d,) = info.value.diagnostics
    assert d.span.file.endswith("lib.linnet")  # the where clause
    assert any(n.span is not None and n.span.file.endswith("nest.toml") and n.span.line > 1 for n in d.notes)
    assert any("--set Heads=10" in n.message for n in d.notes)


# ----------------------------------------------------------------- divisibility facts

HEADS = """
block Split<D: Dim, Heads: Dim>{where} {{
    param w: Tensor[D; f32]

    fn forward<B: Dim, S: Dim>(x: Tensor[B, S, D; f32]) -> Tensor[B, Heads, S, D / Heads; f32] {{
        return heads<B, S, Heads, D / Heads>(x)
    }}
}}

fn heads<B: Dim, S: Dim, Heads: Dim, Dh: Dim>(x: Tensor[B, S, Heads * Dh; f32]) -> Tensor[B, Heads, S, Dh; f32] {{
    return permute(reshape(x, [B, S, Heads, Dh]), [0, 2, 1, 3])
}}
"""


def test_heads_times_head_width_is_d_with_the_divisibility_clause(tmp_path):
    checked = check_source(tmp_path, HEADS.format(where=" where Heads > 0, D % Heads == 0"))
    t = result_type(checked, "prog::Split.forward")
    assert t == TensorT((sym("B"), sym("Heads"), sym("S"), sym("D") // sym("Heads")), "f32")


def test_divisibility_alone_is_enough(tmp_path):
    check_source(tmp_path, HEADS.format(where=" where D % Heads == 0"))


@pytest.mark.parametrize("where", ["", " where Heads > 0", " where D >= Heads"])
def test_heads_times_head_width_is_rejected_without_it(tmp_path, where):
    err = check_fails(tmp_path, HEADS.format(where=where))
    (d,) = err.diagnostics
    assert d.code == "E0306"
    assert "Heads * (D / Heads)" in d.message
    assert "`where D % Heads == 0` would prove it" in d.notes[0].message


# ----------------------------------------------------------------------- broadcasting

BROADCAST = """
fn right_aligned<B: Dim, S: Dim, D: Dim>(x: Tensor[B, S, D; f32], p: Tensor[S, D; f32]) -> Tensor[B, S, D; f32] {
    return x + p
}
fn variadic<*S: Shape, D: Dim>(x: Tensor[*S, D; f32], b: Tensor[D; f32]) -> Tensor[*S, D; f32] {
    return x * b
}
fn same_variadic<*S: Shape>(x: Tensor[*S; f32], y: Tensor[*S; f32]) -> Tensor[*S; f32] {
    return x - y
}
fn ones<B: Dim, D: Dim>(x: Tensor[B, 1; f32], y: Tensor[1, D; f32]) -> Tensor[B, D; f32] {
    return x + y
}
fn kept_axis<*S: Shape, D: Dim>(x: Tensor[*S, D; f32]) -> Tensor[*S, D; f32] {
    return x - mean(x, -1)
}
fn scalar_literal<S: Dim>(x: Tensor[S; f16]) -> Tensor[S; f16] {
    return x * 0.5 + 1
}
"""


def test_broadcasting_is_right_aligned(tmp_path):
    checked = check_source(tmp_path, BROADCAST)
    B, S, D = sym("B"), sym("S"), sym("D")
    assert result_type(checked, "prog::right_aligned") == TensorT((B, S, D), "f32")
    assert result_type(checked, "prog::variadic") == TensorT((Variadic("S"), D), "f32")
    assert result_type(checked, "prog::same_variadic") == TensorT((Variadic("S"),), "f32")
    assert result_type(checked, "prog::ones") == TensorT((B, D), "f32")
    assert result_type(checked, "prog::kept_axis") == TensorT((Variadic("S"), D), "f32")
    # A literal takes the dtype of the tensor it meets.
    assert result_type(checked, "prog::scalar_literal") == TensorT((S,), "f16")


@pytest.mark.parametrize("generics, left, right, code", [
    ("B: Dim, S: Dim, D: Dim", "Tensor[B, S, D; f32]", "Tensor[S; f32]", "E0321"),  # D meets S on the right
    ("B: Dim, S: Dim", "Tensor[B, S; f32]", "Tensor[B; f32]", "E0321"),  # left-aligned is not broadcasting
    ("B: Dim, *S: Shape, *R: Shape", "Tensor[*S; f32]", "Tensor[*R; f32]", "E0321"),  # unrelated variadics
    ("B: Dim", "Tensor[B; i32]", "Tensor[B; f32]", "E0330"),
])
def test_broadcasting_rejects(tmp_path, generics, left, right, code):
    source = f"fn f<{generics}>(x: {left}, y: {right}) -> Tensor[B; f32] {{\n    let z = x + y\n    return z\n}}"
    err = check_fails(tmp_path, source)
    (d,) = err.diagnostics  # the failed `let` silences the `return`
    assert d.code == code
    assert (d.span.line, d.span.col, d.span.end_col) == (2, 13, 18)


# ------------------------------------------------------------------ generic inference


INFER = """
use std.nn.embedding::{embedding}
use std.nn.activations::{gelu_erf}
use std.nn.linear::{Linear}

fn lookup<B: Dim, S: Dim, V: Dim, D: Dim>(ids: Tensor[B, S; i32], table: Tensor[V, D; f16]) -> Tensor[B, S, D; f16] {
    return embedding(ids, table)
}

fn activate<S: Dim>(x: Tensor[S; bf16]) -> Tensor[S; bf16] {
    return gelu_erf(x)
}

fn zeros<N: Dim, T: Float = f32>(x: Tensor[N; f32]) -> Tensor[N; T] {
    return cast<T>(x)
}

fn use_default<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
    return zeros(x)
}

fn explicit<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f16] {
    return zeros<N, f16>(x)
}

block Proj<D: Dim> {
    sub lin: Linear<D, D>

    fn forward<B: Dim>(x: Tensor[B, D; f32]) -> Tensor[B, D; f32] {
        return lin.forward(x)
    }
}
"""


@pytest.fixture(scope="module")
def inferred(tmp_path_factory):
    return check_source(tmp_path_factory.mktemp("infer"), INFER)


def test_generics_are_inferred_from_arguments(inferred):
    fn = inferred.functions["prog::lookup"]
    (call,) = find_calls(fn.node.body, "embedding")
    info = inferred.calls[id(call)]
    assert info.kind == "fn" and info.target == "std.nn.embedding::embedding"
    assert info.env == {"S": (sym("B"), sym("S")), "V": sym("V"), "D": sym("D"), "T": "f16", "I": "i32"}
    assert result_type(inferred, "prog::lookup") == TensorT((sym("B"), sym("S"), sym("D")), "f16")


def test_dtype_generics_follow_the_argument(inferred):
    assert result_type(inferred, "prog::activate") == TensorT((sym("S"),), "bf16")
    (call,) = find_calls(inferred.functions["prog::activate"].node.body, "gelu_erf")
    assert inferred.calls[id(call)].env["T"] == "bf16"


def test_default_dtype_generic(inferred):
    (call,) = find_calls(inferred.functions["prog::use_default"].node.body, "zeros")
    assert inferred.calls[id(call)].env["T"] == "f32"
    (call,) = find_calls(inferred.functions["prog::explicit"].node.body, "zeros")
    assert inferred.calls[id(call)].env["T"] == "f16"


def test_default_block_generic_in_a_sub(inferred):
    lin, _ = inferred.find_block("Proj").subs["lin"]
    assert dict(lin.bindings) == {"In": sym("D"), "Out": sym("D"), "T": "f32"}
    (call,) = find_calls(inferred.functions["prog::Proj.forward"].node.body, "forward")
    info = inferred.calls[id(call)]
    assert info.kind == "sub" and info.receiver == "lin"
    assert info.env["S"] == (sym("B"),)


def test_inferred_dtype_must_fit_the_generic_kind(tmp_path):
    err = check_fails(tmp_path, "use std.nn.activations::{gelu_erf}\n"
                                "fn f<S: Dim>(x: Tensor[S; i32]) -> Tensor[S; i32] {\n    return gelu_erf(x)\n}\n")
    (d,) = err.diagnostics
    assert d.code == "E0330" and "`T` to be Float" in d.message and (d.span.line, d.span.col) == (3, 21)


# --------------------------------------------------------------------- other checks


def test_negative_slice_bounds_count_from_the_end(tmp_path):
    checked = check_source(tmp_path, """
fn f(x: Tensor[4, 3; f32]) -> Tensor[2, 3; f32] {
    return x[-2:]
}
fn g(x: Tensor[4, 3; f32]) -> Tensor[3, 2; f32] {
    return x[:-1, 1:]
}
fn h<S: Dim>(x: Tensor[S; f32]) -> Tensor[S - 1; f32] {
    return x[:-1]
}
""")
    assert result_type(checked, "prog::f") == TensorT((const(2), const(3)), "f32")
    assert result_type(checked, "prog::h") == TensorT((sym("S") - 1,), "f32")


def test_several_errors_are_reported_in_one_run_in_source_order(tmp_path):
    err = check_fails(tmp_path, """
fn f<S: Dim>(ids: Tensor[S; i32], x: Tensor[S; f32]) -> Tensor[S; f32] {
    let a = erf(ids)
    let b = x + ids
    let c = a * 2.0
    return x[0, 0]
}

block B<D: Dim> {
    param w: Tensor[D, E; f32]
}
""")
    assert [(d.code, d.span.line) for d in err.diagnostics] == [
        ("E0330", 3), ("E0330", 4), ("E0322", 6), ("E0201", 10)]
    assert err.render().count("error[") == 4


def test_a_checked_program_records_every_expression_type(tmp_path):
    checked = check_source(tmp_path, BROADCAST)
    fn = checked.functions["prog::right_aligned"]
    ret = fn.node.body[0].value
    for node in (ret, ret.left, ret.right):
        assert id(node) in checked.types


def test_instantiate_directly(tmp_path):
    checked = check_source(tmp_path, """
block Model<D: Dim, L: Dim> where D > 1 {
    param w: Tensor[D, D - 1; f32]
    sub layers: [Inner<D>; L]

    entry forward<B: Dim>(x: Tensor[B, D; f32]) -> Tensor[B, D; f32] where B <= 64 {
        return x
    }
}
block Inner<D: Dim> {
    param b: Tensor[D; f32]
}
""")
    instance = instantiate(checked, "Model", {"D": 4, "L": 3})
    assert [(p.name, p.shape) for p in instance.params] == [
        ("w", (4, 3)), ("layers.0.b", (4,)), ("layers.1.b", (4,)), ("layers.2.b", (4,))]
    assert instance.param_count == 24
    assert str(instance.entries["forward"]) == "forward<B>(x: Tensor[B, 4; f32]) -> Tensor[B, 4; f32] where B <= 64"
    with pytest.raises(LinnetError) as info:
        instantiate(checked, "Model", {"D": 1, "L": 3})
    assert [d.code for d in info.value.diagnostics] == ["E0401"]
    with pytest.raises(LinnetError) as info:
        instantiate(checked, "Model", {"D": 4})
    assert [d.code for d in info.value.diagnostics] == ["E0502"]
    with pytest.raises(LinnetError) as info:
        instantiate(checked, "Nope", {})
    assert [d.code for d in info.value.diagnostics] == ["E0501"]


def test_a_bad_shape_in_a_sub_array_is_reported_once_in_order(tmp_path):
    checked = check_source(tmp_path, """
block Model<D: Dim, L: Dim> {
    sub layers: [Inner<D>; L]
    param last: Tensor[D - 8; f32]
}
block Inner<D: Dim> {
    param a: Tensor[D - 5; f32]
    param b: Tensor[D - 6; f32]
}
""")
    with pytest.raises(LinnetError) as info:
        instantiate(checked, "Model", {"D": 4, "L": 3})
    found = [(d.code, d.span.line) for d in info.value.diagnostics]
    assert found == [("E0505", 4), ("E0505", 7), ("E0505", 8)]  # source order, each once
    assert "layers.0.a" in info.value.diagnostics[1].message
    assert "[-1]" in info.value.diagnostics[1].message


def test_too_many_block_instances_are_refused_before_any_is_built(tmp_path, monkeypatch):
    """Was (fuzz seed 11, case 698,602, "hang at check"): `Layers = 10,000` layers of 10 instances each
    were all built (7.6 s) before E0505 said the model passed 100,000. The array is now counted first,
    and identical layers are counted once."""
    from linnet.middle import instantiate as inst

    checked = check_source(tmp_path, """
block Model<D: Dim, L: Dim> {
    sub layers: [Layer<D>; L]
}
block Layer<D: Dim> {
    sub parts: [Part<D>; 9]
}
block Part<D: Dim> {
    param b: Tensor[D; f32]
}
""")
    built = []
    real = inst.BlockInstance
    monkeypatch.setattr(inst, "BlockInstance", lambda *a: built.append(a[2]) or real(*a))
    with pytest.raises(LinnetError) as info:
        instantiate(checked, "Model", {"D": 4, "L": 10_001})  # 1 + 10,001 * 10 instances
    assert [(d.code, d.span.line) for d in info.value.diagnostics] == [("E0505", 3)]
    assert "10,001 of 10 block instances each" in info.value.diagnostics[0].message
    assert built == [""]  # only the root
    built.clear()
    assert len(instantiate(checked, "Model", {"D": 4, "L": 9_999}).params) == 9_999 * 9  # 99,991 fit
    assert len(built) == 1 + 9_999 * 10


# ------------------------------------------------------------- masks and defaults


MASKED = """
use std.nn.attention::{attention}

fn causal<B: Dim, H: Dim, S: Dim, Dh: Dim>(q: Tensor[B, H, S, Dh; f32], mask: Tensor[S, S; f32])
    -> Tensor[B, H, S, Dh; f32] {
    return attention(q, q, q, 0.125, some(mask))
}

fn padded<B: Dim, H: Dim, S: Dim, Dh: Dim>(q: Tensor[B, H, S, Dh; f32], mask: Tensor[B, 1, 1, S; f32])
    -> Tensor[B, H, S, Dh; f32] {
    return attention(q, q, q, 0.125, some(mask))
}

fn full<B: Dim, H: Dim, S: Dim, Dh: Dim>(q: Tensor[B, H, S, Dh; f32], mask: Tensor[B, H, S, S; f32])
    -> Tensor[B, H, S, Dh; f32] {
    return attention(q, q, q, 0.125, some(mask))
}
"""


def test_attention_takes_any_mask_that_broadcasts_to_the_scores(tmp_path):
    checked = check_source(tmp_path, MASKED)
    for name in ("causal", "padded", "full"):
        assert str(result_type(checked, f"prog::{name}")) == "Tensor[B, H, S, Dh; f32]"


@pytest.mark.parametrize("mask,code", [
    ("Tensor[S, 5; f32]", "E0402"),  # 5 vs K = S: true only when S is 5
    ("Tensor[B, 2, 1, 1, S; f32]", "E0401"),  # more axes than the scores
    ("Tensor[B, 3, 1, S; f32]", "E0401"),  # 3 heads is neither 1 nor 4
    ("Tensor[B, 1, 1, S; f16]", "E0306"),  # the scores are f32
])
def test_attention_refuses_masks_that_do_not_fit(tmp_path, mask, code):
    source = f"""
use std.nn.attention::{{attention}}

fn bad<B: Dim, S: Dim>(q: Tensor[B, 4, S, 8; f32], mask: {mask}) -> Tensor[B, 4, S, 8; f32] {{
    return attention(q, q, q, 0.125, some(mask))
}}
"""
    error = check_fails(tmp_path, source)
    assert [d.code for d in error.diagnostics] == [code]
    assert "attention" in str(error)


def test_entry_defaults_are_recorded(tmp_path):
    checked = check_source(tmp_path, """
block M<D: Dim> {
    param w: Tensor[D; f32]
    entry forward<B: Dim>(x: Tensor[B, D; f32], scale: Tensor[B, D; f32] = ones, shift: Tensor[B, D; f32] = zeros)
        -> Tensor[B, D; f32] {
        return x * scale + shift
    }
}
""")
    assert checked.functions["prog::M.forward"].defaults == {"scale": 1, "shift": 0}


def test_a_defaulted_input_cannot_be_the_only_source_of_a_dim(tmp_path):
    error = check_fails(tmp_path, """
block M<D: Dim> {
    param w: Tensor[D; f32]
    entry forward<B: Dim, S: Dim>(x: Tensor[B, D; f32], mask: Tensor[B, S; i32] = ones) -> Tensor[B, D; f32] {
        return x
    }
}
""")
    assert [d.code for d in error.diagnostics] == ["E0210"]
    assert "without a default" in str(error)


EMPTY_ARRAY = """
block Shift<D: Dim> {
    param b: Tensor[D; f32]

    pub fn forward<B: Dim>(x: Tensor[B, D; f32]) -> Tensor[B, D; f32] {
        return x + b
    }
}
block Model<D: Dim, N: Dim> {
    param w: Tensor[D; f32]
    sub shifts: [Shift<D>; N]

    pub entry forward<B: Dim>(x: Tensor[B, D; f32]) -> Tensor[B, D; f32] {
        var y = x * w
        static for s in shifts {
            y = s.forward(y)
        }
        return y
    }

    pub entry stacked<B: Dim>(x: Tensor[B, D; f32]) -> Tensor[N + 1, B, D; f32] {
        var y = x
        let ys = static for s in shifts collect y {
            y = s.forward(y)
        }
        return ys
    }
}
"""


def test_an_empty_sub_array_has_no_params_and_its_loop_runs_no_pass(tmp_path):
    """`[Block; 0]` is how a generic switches a part off (std's MaybeBiasLinear): no params, the
    loop lowered to nothing, the rest of the function as written; collecting over it is E0505."""
    from linnet.middle import ir
    from linnet.middle.lower import lower

    checked = check_source(tmp_path, EMPTY_ARRAY)
    one, none = instantiate(checked, "Model", {"D": 4, "N": 1}), instantiate(checked, "Model", {"D": 4, "N": 0})
    assert [p.name for p in one.params] == ["w", "shifts.0.b"] and [p.name for p in none.params] == ["w"]
    with pytest.raises(LinnetError) as info:
        lower(none)
    assert [d.code for d in info.value.diagnostics] == ["E0505"]
    assert "collect" in info.value.diagnostics[0].message and "`shifts`" in info.value.diagnostics[0].message
    checked = check_source(tmp_path, EMPTY_ARRAY.split("    pub entry stacked")[0] + "}\n")
    program = lower(instantiate(checked, "Model", {"D": 4, "N": 0}))
    assert not any(isinstance(stmt, ir.Loop) for fn in program.functions.values() for stmt in fn.body)
    assert all(sub.count != 0 for block in program.blocks.values() for sub in block.subs)
