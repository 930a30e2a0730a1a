"""The parser: real sources parse, every construct of the language becomes the right node, and
spans point at the right text (1-based line and column, end column exclusive)."""
from __future__ import annotations

from pathlib import Path

import pytest

from linnet.front import ast
from linnet.diagnostics import LinnetError, SourceMap, Span
from linnet.front.parser import parse, parse_file
from linnet.paths import std_dir

REPO = Path(__file__).resolve().parent.parent
BERT = REPO / "nest" / "bert-base-uncased" / "src" / "lib.linnet"
REFERENCE_BERT = Path("/work/shared/reference/nest-bert-base-uncased/src/lib.linnet")
STD_FILES = sorted(std_dir().rglob("*.linnet"))


def text_of(source: str, span) -> str:
    """The source text a single-line span covers."""
    assert span.line == span.end_line, f"{span} spans several lines"
    return source.splitlines()[span.line - 1][span.col - 1:span.end_col - 1]


def only(items, kind):
    found = [i for i in items if isinstance(i, kind)]
    assert len(found) == 1, found
    return found[0]


def walk(node):
    """Every syntax node reachable from `node` (dataclass fields, lists, tuples)."""
    if isinstance(node, (list, tuple)):
        for item in node:
            yield from walk(item)
        return
    if not hasattr(node, "__dataclass_fields__") or isinstance(node, Span):
        return
    yield node
    for name in node.__dataclass_fields__:
        if name not in ("span", "name_span", "path_span", "iterable_span"):
            yield from walk(getattr(node, name))


# ------------------------------------------------------------------------ real sources


def test_bert_source_parses_into_its_blocks_and_functions():
    module = parse_file(BERT)
    assert module.name == "bert"
    assert [".".join(u.path) for u in module.uses] == [
        "std.nn.attention", "std.nn.embedding", "std.nn.heads", "std.nn.linear", "std.nn.losses",
        "std.nn.masks", "std.nn.norm"]
    blocks = {i.name: i for i in module.items if isinstance(i, ast.Block)}
    assert list(blocks) == ["Embeddings", "Attention", "EncoderLayer", "Pooler", "Encoder", "Model", "PreTraining"]
    # The task heads are std.nn.heads' templates, instantiated by block aliases.
    aliases = {i.name: i for i in module.items if isinstance(i, ast.BlockAlias)}
    assert {name: a.target.name for name, a in aliases.items()} == {
        "MaskedLm": "MaskedLmModel", "SequenceClassification": "SequenceClassifier",
        "SequenceRegression": "SequenceRegressor", "TokenClassification": "TokenClassifier",
        "QuestionAnswering": "SpanExtractor", "MultipleChoice": "ChoiceClassifier"}
    # `..Encoder` declares the encoder's generics, `Encoder<..>` passes them on by name.
    qa = aliases["QuestionAnswering"]
    assert [(type(g).__name__, g.name) for g in qa.generics] == [("GenericSplice", "Encoder")]
    assert [type(a).__name__ for a in qa.target.args[0].args] == ["SpliceArg"]
    assert [f.name for f in module.items if isinstance(f, ast.Function)] == []
    model = blocks["Model"]
    assert [g.name for g in model.generics] == ["Vocab", "MaxPositions", "TypeVocab", "D", "Heads", "Inner",
                                                "Layers", "T", "HiddenDropout", "AttentionDropout", "HiddenAct",
                                                "Eps"]
    assert [g.kind for g in model.generics][-3:] == ["Real", "Activation", "Real"]
    assert [(f.name, f.is_entry, f.public) for f in model.functions] == [("pool", True, True),
                                                                         ("embed", True, True),
                                                                         ("pool_hidden", False, True)]
    # The encoder's entries are delegated (`pub use encoder.{...}`); the resolver expands them.
    assert [(d.field, d.callee, d.name, d.public) for d in model.delegates] == [
        ("encoder", "forward", "forward", True), ("encoder", "hidden_states", "hidden_states", True),
        ("encoder", "forward_positioned", "forward_positioned", True),
        ("encoder", "forward_embedded", "forward_embeds", True),
        ("encoder", "forward_head_masked", "forward_head_masked", True),
        ("encoder", "forward_full", "forward_full", True),
        ("encoder", "attentions", "attentions", True), ("encoder", "word_table", "word_table", True)]
    # Each where its `use` stands: two before `pool`, the rest after `embed`.
    assert [d.position for d in model.delegates] == [0, 0, 2, 2, 2, 2, 2, 2]
    assert len(model.where) == 2
    pretraining = blocks["PreTraining"]
    assert [(f.name, f.is_entry) for f in pretraining.functions] == [
        ("mlm", True), ("nsp", True), ("mlm_loss", True), ("nsp_loss", True), ("pretraining_loss", True)]
    assert [(d.field, d.name) for d in pretraining.delegates] == [
        ("bert", "forward"), ("bert", "hidden_states"), ("bert", "pool"), ("bert", "embed"),
        ("bert", "forward_positioned"), ("bert", "forward_embeds"), ("bert", "forward_head_masked"), ("bert", "forward_full"),
        ("bert", "attentions")]


@pytest.mark.skipif(not REFERENCE_BERT.is_file(), reason="the shared reference checkout is not present")
def test_reference_bert_source_parses():
    module = parse_file(REFERENCE_BERT)
    assert module.name == "bert"
    assert {i.name for i in module.items} >= {"Model", "Attention", "heads", "EPS"}


@pytest.mark.parametrize("path", STD_FILES, ids=lambda p: str(p.relative_to(std_dir())))
def test_every_std_file_parses_and_declares_its_module(path):
    module = parse_file(path)
    expected = ".".join(["std", *path.relative_to(std_dir()).with_suffix("").parts])
    assert module.name == expected
    assert module.items, "a std module without items"


def test_std_is_not_empty():
    assert len(STD_FILES) >= 5


def test_every_node_of_the_bert_source_has_a_valid_span():
    source = BERT.read_text(encoding="utf-8")
    lines = source.splitlines()
    module = parse(source, "lib.linnet")
    count = 0
    for node in walk(module):
        span = node.span
        assert span is not None and span.file == "lib.linnet", node
        assert 1 <= span.line <= span.end_line <= len(lines), (node, span)
        assert span.col >= 1 and span.end_col >= 1, (node, span)
        if span.line == span.end_line:
            assert span.col < span.end_col <= len(lines[span.line - 1]) + 1, (node, span)
        count += 1
    assert count > 300


# ------------------------------------------------------------------------------- spans

SPANS = """\
module demo.spans
use std.nn.norm::{layer_norm}

pub const EPS: f32 = 1e-12

pub block Norm<D: Dim, T: Float = f32> where D > 0 {
    param weight: Tensor[D; T]
    pub fn forward<*S: Shape>(x: Tensor[*S, D; T]) -> Tensor[*S, D; T] {
        let y = layer_norm(x, weight, none, EPS)
        return y * 2.0
    }
}
"""


def test_spans_of_selected_nodes():
    m = parse(SPANS, "spans.linnet")
    assert m.name == "demo.spans"
    assert (m.name_span.line, m.name_span.col, m.name_span.end_col) == (1, 8, 18)
    use = m.uses[0]
    assert (use.span.line, use.span.col) == (2, 1)
    assert text_of(SPANS, use.path_span) == "std.nn.norm"
    assert [(n, text_of(SPANS, s)) for n, s in use.names] == [("layer_norm", "layer_norm")]

    const = only(m.items, ast.Const)
    assert (const.span.line, const.span.col) == (4, 1)
    assert text_of(SPANS, const.name_span) == "EPS"
    assert text_of(SPANS, const.value.span) == "1e-12"

    block = only(m.items, ast.Block)
    assert (block.name_span.line, block.name_span.col) == (6, 11)
    assert text_of(SPANS, block.generics[1].span) == "T: Float = f32"
    assert text_of(SPANS, block.where[0].span) == "D > 0"
    assert text_of(SPANS, block.params[0].span) == "param weight: Tensor[D; T]"
    assert text_of(SPANS, block.params[0].type.span) == "Tensor[D; T]"

    fn = block.functions[0]
    assert (fn.name_span.line, fn.name_span.col, fn.name_span.end_col) == (8, 12, 19)
    assert text_of(SPANS, fn.generics[0].span) == "*S: Shape"
    assert text_of(SPANS, fn.params[0].span) == "x: Tensor[*S, D; T]"
    assert text_of(SPANS, fn.params[0].type.dims[0].span) == "*S"
    assert text_of(SPANS, fn.result.span) == "Tensor[*S, D; T]"
    assert (fn.span.line, fn.span.col, fn.span.end_line) == (8, 5, 11)

    let, ret = fn.body
    assert (let.span.line, let.span.col) == (9, 9)
    assert text_of(SPANS, let.name_span) == "y"
    call = let.value
    assert text_of(SPANS, call.span) == "layer_norm(x, weight, none, EPS)"
    assert text_of(SPANS, call.name_span) == "layer_norm"
    assert [text_of(SPANS, a.span) for a in call.args] == ["x", "weight", "none", "EPS"]
    assert isinstance(call.args[2], ast.NoneLit)
    assert text_of(SPANS, ret.span) == "return y * 2.0"
    assert text_of(SPANS, ret.value.span) == "y * 2.0"
    assert (ret.value.right.span.col, ret.value.right.span.end_col) == (20, 23)


def test_the_bert_pool_index_span():
    source = BERT.read_text(encoding="utf-8")
    module = parse(source, "lib.linnet")
    model = next(i for i in module.items if isinstance(i, ast.Block) and i.name == "Model")
    pool = next(f for f in model.functions if f.name == "pool")
    index = pool.body[-1].value.args[0]
    assert isinstance(index, ast.Index)
    assert text_of(source, index.span) == "hidden[:, 0, :]"
    line = source.splitlines()[index.span.line - 1]
    assert index.span.col == line.index("hidden[") + 1


def test_multi_line_expression_spans_its_lines():
    source = BERT.read_text(encoding="utf-8")
    module = parse(source, "lib.linnet")
    emb = next(i for i in module.items if isinstance(i, ast.Block) and i.name == "Embeddings")
    let = emb.functions[0].body[0]
    assert let.name == "summed"
    assert let.value.span.end_line == let.value.span.line + 2  # three lookups on three lines
    assert isinstance(let.value, ast.Binary) and let.value.op == "+"


# ------------------------------------------------------------------------ every construct

EVERYTHING = """\
// A file that uses every construct of the language once.
module everything
use std.nn.linear::{Linear, }
use std.nn.norm::layer_norm
use std.nn.activations::{gelu, relu}

pub const EPS: f32 = 1e-12
const NEG: i32 = -3
const NEG_FLOAT: f64 = -2.5
const BIG: f32 = 3e5

block Private<D: Dim> {
    param w: Tensor[D; f32]
}

pub block Stack<D: Dim, Heads: Dim, Layers: Dim, T: Float = f32>
where
    Heads > 0, D % Heads == 0, D >= Heads, Layers <= 48, Layers < 49, D != 0,
{
    param scale: Tensor[D; T]
    sub first: Linear<D, D, T>
    sub layers: [Linear<D, D, T>; Layers]

    fn helper<B: Dim>(x: Tensor[B, D; T]) -> Tensor[B, D; T] {
        return x
    }

    pub entry forward<B: Dim, S: Dim>(x: Tensor[B, S, D; T], mask: Option[Tensor[S, S; T]])
        -> Tensor[B, S, D; T]
    where S <= 512 {
        var h = first.forward(x)
        static for layer in layers {
            h = layer.forward(h)
        }
        let ids = iota<i32>(S)
        let parts = split<B, S, Heads, D / Heads, T>(h)
        let first_token = h[:, 0, :]
        let middle = h[1:3]
        let head = h[:2]
        let tail = h[2:]
        let all = h[:]
        let perm = [0, 2, 1]
        let arith = -(h * 2.0 + h / 3.0 - h) % 1
        if let some(m) = mask {
            return h
        } else {
            return h
        }
    }
}

fn split<B: Dim, S: Dim, Heads: Dim, Dh: Dim, T: Float>(
    x: Tensor[B, S, Heads * Dh; T],
) -> Tensor[B, Heads, S, Dh; T] {
    return permute(reshape(x, [B, S, Heads, Dh]), [0, 2, 1, 3])
}

fn scalar() -> f32 {
    return 1.0
}
fn uses_some<D: Dim>(x: Tensor[D; f32]) -> Tensor[D; f32] {
    return layer_norm(x, x, some(x), EPS)
}
"""


@pytest.fixture(scope="module")
def everything() -> ast.Module:
    return parse(EVERYTHING, "everything.linnet")


def items(module, kind):
    return {i.name: i for i in module.items if isinstance(i, kind)}


def test_module_and_uses(everything):
    assert everything.name == "everything"
    assert [(u.path, [n for n, _ in u.names]) for u in everything.uses] == [
        (["std", "nn", "linear"], ["Linear"]),
        (["std", "nn", "norm"], ["layer_norm"]),
        (["std", "nn", "activations"], ["gelu", "relu"]),
    ]


def test_consts_with_floats_exponents_and_negatives(everything):
    consts = items(everything, ast.Const)
    assert consts["EPS"].public and consts["EPS"].value.value == 1e-12
    assert consts["EPS"].value.text == "1e-12" and consts["EPS"].type.name == "f32"
    assert not consts["NEG"].public
    assert isinstance(consts["NEG"].value, ast.IntLit) and consts["NEG"].value.value == -3
    assert isinstance(consts["NEG_FLOAT"].value, ast.FloatLit) and consts["NEG_FLOAT"].value.value == -2.5
    assert consts["BIG"].value.value == 3e5


def test_pub_and_private_items(everything):
    blocks = items(everything, ast.Block)
    assert blocks["Stack"].public and not blocks["Private"].public
    fns = items(everything, ast.Function)
    assert not fns["split"].public


def test_block_generics_defaults_and_variadics(everything):
    stack = items(everything, ast.Block)["Stack"]
    assert [(g.name, g.kind, g.variadic) for g in stack.generics] == [
        ("D", "Dim", False), ("Heads", "Dim", False), ("Layers", "Dim", False), ("T", "Float", False)]
    default = stack.generics[-1].default
    assert isinstance(default, ast.DimName) and default.name == "f32"
    variadic = parse("fn f<*S: Shape>(x: Tensor[*S; f32]) -> Tensor[*S; f32] { return x }", "v.linnet")
    g = variadic.items[0].generics[0]
    assert (g.name, g.kind, g.variadic) == ("S", "Shape", True)
    assert isinstance(variadic.items[0].params[0].type.dims[0], ast.Variadic)


def test_where_clauses_with_every_comparison(everything):
    stack = items(everything, ast.Block)["Stack"]
    assert [c.op for c in stack.where] == [">", "==", ">=", "<=", "<", "!="]
    mod = stack.where[1].left
    assert isinstance(mod, ast.DimBinary) and mod.op == "%"
    forward = stack.functions[1]
    assert [(c.left.name, c.op, c.right.value) for c in forward.where] == [("S", "<=", 512)]


def test_params_subs_and_sub_arrays(everything):
    stack = items(everything, ast.Block)["Stack"]
    assert [p.name for p in stack.params] == ["scale"]
    first, layers = stack.subs
    assert isinstance(first.type, ast.BlockRef) and first.type.name == "Linear"
    assert [a.name for a in first.type.args] == ["D", "D", "T"]
    assert isinstance(layers.type, ast.SubArrayType)
    assert layers.type.element.name == "Linear" and layers.type.count.name == "Layers"


def test_functions_entries_and_option_params(everything):
    stack = items(everything, ast.Block)["Stack"]
    helper, forward = stack.functions
    assert not helper.is_entry and not helper.public
    assert forward.is_entry and forward.public
    mask = forward.params[1]
    assert isinstance(mask.type, ast.OptionTypeNode)
    assert isinstance(mask.type.inner, ast.TensorTypeNode)
    scalar = items(everything, ast.Function)["scalar"]
    assert scalar.params == [] and isinstance(scalar.result, ast.NamedTypeNode)


def test_statements(everything):
    body = items(everything, ast.Block)["Stack"].functions[1].body
    kinds = [type(s).__name__ for s in body]
    assert kinds == ["Let"] + ["StaticFor"] + ["Let"] * 9 + ["IfSome"]
    var = body[0]
    assert var.mutable and var.name == "h"
    assert not body[2].mutable
    loop = body[1]
    assert (loop.var, loop.iterable) == ("layer", "layers")
    assign = loop.body[0]
    assert isinstance(assign, ast.Assign) and assign.name == "h"
    assert isinstance(assign.value, ast.MethodCall)
    assert (assign.value.receiver.name, assign.value.method) == ("layer", "forward")
    if_some = body[-1]
    assert (if_some.binding, if_some.option.name) == ("m", "mask")
    assert [type(s).__name__ for s in if_some.then_body] == ["Return"]
    assert [type(s).__name__ for s in if_some.else_body] == ["Return"]


def test_if_let_without_else():
    m = parse("fn f(x: Option[Tensor[; f32]]) -> f32 { if let some(y) = x { return y } return 1.0 }", "f.linnet")
    if_some, ret = m.items[0].body
    assert isinstance(if_some, ast.IfSome) and if_some.else_body == []
    assert isinstance(ret, ast.Return)


def test_generic_calls_iota_and_method_calls(everything):
    body = items(everything, ast.Block)["Stack"].functions[1].body
    ids = body[2].value
    assert isinstance(ids, ast.Call) and ids.name == "iota"
    assert [a.name for a in ids.generic_args] == ["i32"]
    assert [a.name for a in ids.args] == ["S"]
    parts = body[3].value
    assert parts.name == "split"
    assert [type(a).__name__ for a in parts.generic_args] == ["DimName"] * 3 + ["DimBinary", "DimName"]
    div = parts.generic_args[3]
    assert (div.op, div.left.name, div.right.name) == ("/", "D", "Heads")
    first = body[0].value
    assert isinstance(first, ast.MethodCall) and first.receiver.name == "first"


def test_indexing_and_slicing(everything):
    body = items(everything, ast.Block)["Stack"].functions[1].body
    by_name = {s.name: s.value for s in body if isinstance(s, ast.Let)}

    def shape(index):
        out = []
        for item in index.items:
            if isinstance(item, ast.Slice):
                out.append(("slice", getattr(item.start, "value", None), getattr(item.stop, "value", None)))
            else:
                out.append(("index", item.value))
        return out

    assert shape(by_name["first_token"]) == [("slice", None, None), ("index", 0), ("slice", None, None)]
    assert shape(by_name["middle"]) == [("slice", 1, 3)]
    assert shape(by_name["head"]) == [("slice", None, 2)]
    assert shape(by_name["tail"]) == [("slice", 2, None)]
    assert shape(by_name["all"]) == [("slice", None, None)]


def test_lists_literals_and_operators(everything):
    body = items(everything, ast.Block)["Stack"].functions[1].body
    by_name = {s.name: s.value for s in body if isinstance(s, ast.Let)}
    perm = by_name["perm"]
    assert isinstance(perm, ast.ListLit) and [i.value for i in perm.items] == [0, 2, 1]
    arith = by_name["arith"]
    # -(h * 2.0 + h / 3.0 - h) % 1: unary minus binds tighter than %, + and - are left-assoc.
    assert isinstance(arith, ast.Binary) and arith.op == "%"
    neg = arith.left
    assert isinstance(neg, ast.Unary) and neg.op == "-"
    inner = neg.operand
    assert inner.op == "-" and inner.left.op == "+"
    assert inner.left.left.op == "*" and inner.left.right.op == "/"
    assert isinstance(inner.left.left.right, ast.FloatLit)


def test_some_none_and_split_dims(everything):
    uses_some = items(everything, ast.Function)["uses_some"]
    call = uses_some.body[0].value
    some = call.args[2]
    assert isinstance(some, ast.Call) and some.name == "some" and len(some.args) == 1
    split = items(everything, ast.Function)["split"]
    dim = split.params[0].type.dims[2]
    assert isinstance(dim, ast.DimBinary) and dim.op == "*"


def test_comments_are_ignored_anywhere():
    m = parse("// leading\nfn f(x: Tensor[; f32]) // after the header\n -> f32 { // open\n"
              "return x // trailing\n} // end", "c.linnet")
    assert [i.name for i in m.items] == ["f"]


def test_negative_literals_fold_and_negated_names_stay_unary():
    m = parse("fn f(x: Tensor[; f32]) -> f32 { let a = -1 let b = -x return -1.5 }", "n.linnet")
    a, b, ret = m.items[0].body
    assert isinstance(a.value, ast.IntLit) and a.value.value == -1
    assert isinstance(b.value, ast.Unary)
    assert isinstance(ret.value, ast.FloatLit) and ret.value.value == -1.5


def test_consecutive_functions_and_entries_parse():
    # `fn` right after a function body used to be lexed as a name (a parse error).
    source = ("fn a() -> f32 { return 1.0 }\nfn b() -> f32 { return 2.0 }\n"
              "block K { fn c() -> f32 { return 1.0 } fn d() -> f32 { return 1.0 }"
              " entry e<B: Dim>(x: Tensor[B; f32]) -> Tensor[B; f32] { return x } }")
    m = parse(source, "k.linnet")
    assert [i.name for i in m.items] == ["a", "b", "K"]
    assert [(f.name, f.is_entry) for f in m.items[2].functions] == [("c", False), ("d", False), ("e", True)]


def test_names_that_start_with_keywords_are_names():
    m = parse("fn fnord(entry_point: Tensor[; f32], letter: Tensor[; f32]) -> f32 { return entry_point }", "k.linnet")
    assert m.items[0].name == "fnord"
    assert [p.name for p in m.items[0].params] == ["entry_point", "letter"]


def test_empty_module_parses():
    m = parse("", "empty.linnet")
    assert m.items == [] and m.uses == [] and m.name is None
    assert parse("// only a comment\n", "c.linnet").items == []


# ------------------------------------------------------------------------------ errors


@pytest.mark.parametrize("source, code, line, col, needle", [
    ("fn f() -> f32 { return $ }", "E0001", 1, 24, "'$'"),
    ("fn f() f32 { return 1.0 }", "E0002", 1, 8, "expected '->'"),
    ("fn f() -> f32 {\n  return 1.0\n", "E0002", 2, 13, "expected `}`"),
    ("block B {\n  param w: Tensor[3; f32]\n  fn f() -> f32 { return 1.0 }\n", "E0002", 3, 31, "the `{` at line 1"),
    ("fn f() -> f32 { return (1.0 }", "E0002", 1, 29, "unexpected '}'"),
    ("use std.nn.norm::{}", "E0002", 1, 19, "unexpected '}'"),
    ("const X: f32 = abc", "E0002", 1, 16, "unexpected 'abc'"),
])
def test_syntax_errors_are_diagnostics_with_positions(source, code, line, col, needle):
    sources = SourceMap()
    with pytest.raises(LinnetError) as info:
        parse(source, "bad.linnet", sources)
    (d,) = info.value.diagnostics
    assert (d.code, d.span.line, d.span.col) == (code, line, col)
    assert needle in d.message
    rendered = info.value.render()
    assert f"--> bad.linnet:{line}:{col}" in rendered
    assert "__anon" not in rendered.lower()


# ------------------------------------------------------------------------- source files


def test_a_byte_order_mark_is_not_source(tmp_path):
    path = tmp_path / "bom.linnet"
    path.write_bytes(b"\xef\xbb\xbffn f() -> f32 {\n    return 1.0\n}\n")
    module = parse_file(path)
    assert module.items[0].name == "f"
    assert module.items[0].name_span.col == 4  # columns count from after the mark


def test_a_file_that_is_not_utf8_is_a_diagnostic(tmp_path):
    path = tmp_path / "latin1.linnet"
    path.write_bytes(b"fn f() -> f32 {\n    return 1.0 // caf\xe9\n}\n")
    with pytest.raises(LinnetError) as info:
        parse_file(path, display_name="latin1.linnet")
    (d,) = info.value.diagnostics
    assert (d.code, d.span.line, d.span.col) == ("E0003", 2, 22)
    assert "not UTF-8" in d.message and "0xe9" in d.message


def test_a_missing_file_is_a_diagnostic(tmp_path):
    with pytest.raises(LinnetError) as info:
        parse_file(tmp_path / "gone.linnet", display_name="gone.linnet")
    assert info.value.code == "E0003" and "cannot read gone.linnet" in info.value.diagnostics[0].message


def test_carets_line_up_under_tabs():
    sources = SourceMap()
    with pytest.raises(LinnetError) as info:
        parse("fn f() -> f32 {\n\treturn\t$\n}\n", "tabs.linnet", sources)
    lines = info.value.render().splitlines()
    source_line, caret_line = lines[-2], lines[-1]
    assert source_line.endswith("| \treturn\t$")
    assert caret_line.endswith("| \t      \t^")


def test_a_very_deep_expression_is_a_diagnostic_not_a_recursion_error():
    ok = "fn f(x: Tensor[4; f32]) -> Tensor[4; f32] {\n    return x" + " + x" * 150 + "\n}\n"
    assert parse(ok, "ok.linnet").items[0].name == "f"
    deep = "fn f(x: Tensor[4; f32]) -> Tensor[4; f32] {\n    return x" + " + x" * 3000 + "\n}\n"
    with pytest.raises(LinnetError) as info:
        parse(deep, "deep.linnet")
    (d,) = info.value.diagnostics
    assert d.code == "E0004" and d.span.line == 2 and "let" in d.notes[0].message
    # Parentheses alone do not deepen the tree.
    parens = "fn f(x: Tensor[4; f32]) -> Tensor[4; f32] {\n    return " + "(" * 2000 + "x" + ")" * 2000 + "\n}\n"
    assert parse(parens, "parens.linnet").items[0].body[0].value.name == "x"
