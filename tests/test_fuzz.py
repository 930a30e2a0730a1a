"""A sample of the compiler fuzzer (`linnet.testing.fuzz`) in the normal suite, and the bugs it found.

The dedicated run is `python -m linnet.testing.fuzz --cases 100000 --jobs 2`; here a few
hundred cases (hypothesis-drawn and seeded) go through the same harness: mutated BERT,
std and golden sources, parse -> check -> instantiate -> lower -> torch/JAX source (compiled
as Python) -> ONNX graph. Each must succeed or fail with a LinnetError whose spans lie inside
their files. Then each bug the fuzzer found is pinned by its reproducing program.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from linnet.testing.fuzz import (BERT_ENTRY, Case, Outcome, Workspace, case_from_random, corpus, make_case,
                                 run_case, span_problems)

#: Only a guard against a runaway case stopping the suite (CPU seconds); not a speed assertion.
GUARD_S = 60.0


@pytest.fixture(scope="module")
def workspace():
    ws = Workspace()
    yield ws
    ws.close()


@pytest.fixture(scope="module")
def targets():
    return corpus()


def assert_acceptable(outcome: Outcome, case: Case) -> None:
    assert outcome.status in ("ok", "error"), (
        f"{outcome.status} at {outcome.stage} for {case.target.label} ({', '.join(case.ops)}):\n{outcome.detail}")


def test_the_corpus_covers_bert_std_and_golden_programs(targets):
    labels = [t.label for t in targets]
    assert "bert" in labels
    assert sum(label.startswith("std/") for label in labels) >= 5
    assert sum(label.startswith("golden/") for label in labels) >= 50


def test_unmutated_sources_compile_through_every_emitter(workspace, targets):
    bert = next(t for t in targets if t.label == "bert")
    outcome = run_case(Case(0, bert, {}), workspace, timeout=GUARD_S)
    assert (outcome.status, outcome.stage) == ("ok", "onnx-checker"), outcome.detail


@settings(max_examples=200, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(rng=st.randoms(use_true_random=False))
def test_hypothesis_mutations(workspace, targets, rng):
    case = case_from_random(rng, targets, workspace)
    assert_acceptable(run_case(case, workspace, timeout=GUARD_S), case)


@pytest.mark.parametrize("block", range(3))
def test_seeded_cases(workspace, targets, block):
    """Cases 0..299 of seed 2026, as the dedicated run draws them."""
    statuses = set()
    for index in range(block * 100, block * 100 + 100):
        case = make_case(2026, index, targets, workspace)
        outcome = run_case(case, workspace, timeout=GUARD_S)
        assert_acceptable(outcome, case)
        statuses.add(outcome.status)
    assert "error" in statuses  # the mutations do break programs


# --------------------------------------------------------------------------- bugs the fuzzer found


BERT_FILE = f"zoo/{BERT_ENTRY}/src/lib.linnet"
NEST_FILE = f"zoo/{BERT_ENTRY}/nest.toml"


def run_bert(workspace, targets, *, source=None, manifest=None, std=None) -> Outcome:
    bert = next(t for t in targets if t.label == "bert")
    files = {}
    if source is not None:
        text = workspace.text(BERT_FILE)
        for old, new in source:
            assert old in text, old
            text = text.replace(old, new)
        files[BERT_FILE] = text.encode("utf-8")
    if manifest is not None:
        text = workspace.text(NEST_FILE)
        old, new = manifest
        assert old in text
        files[NEST_FILE] = text.replace(old, new).encode("utf-8")
    for rel, (old, new) in (std or {}).items():
        text = workspace.text(rel)
        assert old in text
        files[rel] = text.replace(old, new).encode("utf-8")
    return run_case(Case(0, bert, files), workspace, timeout=GUARD_S)


def test_a_dim_named_like_a_python_keyword_emits_valid_code(workspace, targets):
    """Was: `lambda = x.shape[0]` in the generated source (SyntaxError)."""
    outcome = run_bert(workspace, targets, source=[("B", "lambda")])
    assert (outcome.status, outcome.stage) == ("ok", "onnx-checker"), outcome.detail


@pytest.mark.parametrize("where, old, new", [
    # std's positions-from-a-mask, which BERT's embeddings call
    ("std/nn/masks.linnet", "cast<i32>(equal(attention_mask, 0)), 1) - 1",
     "cast<i32>(equal(attention_mask, 0)), 1) - 2147483648"),
    (BERT_FILE, "equal(attention_mask, 0), -10000.0", "equal(attention_mask, 9223372036854775807), -10000.0"),
])
def test_an_integer_literal_that_does_not_fit_its_dtype_is_E0330(workspace, targets, where, old, new):
    """Was: OverflowError while the ONNX backend built its constant."""
    if where == BERT_FILE:
        outcome = run_bert(workspace, targets, source=[(old, new)])
    else:
        outcome = run_bert(workspace, targets, std={where: (old, new)})
    assert (outcome.status, outcome.codes) == ("error", ("E0330",)), outcome.detail


def test_a_constant_that_does_not_fit_its_dtype_is_E0330(workspace, targets):
    # std's constant, which the BERT source imports (its own LayerNorm epsilon is a generic now).
    outcome = run_bert(workspace, targets, std={"std/nn/losses.linnet": ("pub const IGNORE_INDEX: i32 = -100",
                                                                         "pub const IGNORE_INDEX: i8 = 300")})
    assert outcome.status == "error" and "E0330" in outcome.codes, outcome.detail


def test_a_dim_too_large_for_the_float_it_is_cast_to_is_refused(workspace, targets):
    """Was: OverflowError from float() when `cast<T>(D / Heads)` met D = 10^400 (then E0330);
    now the value itself is refused, as no tensor dim can pass 2^63 - 1."""
    outcome = run_bert(workspace, targets, manifest=("D = 16", "D = 1" + "0" * 400))
    assert (outcome.status, outcome.codes) == ("error", ("E0503",)), outcome.detail


@pytest.mark.parametrize("value", ["1" + "0" * 400, "1e999"])
def test_a_real_generic_default_past_a_float_is_E0330(workspace, targets, value):
    """Was: OverflowError from float() in the checker (hypothesis 6.170 found the integer)."""
    # Every root block of the BERT source declares this default: one error for each.
    outcome = run_bert(workspace, targets, source=[("HiddenDropout: Real = 0.1,", f"HiddenDropout: Real = {value},")])
    assert outcome.status == "error" and set(outcome.codes) == {"E0330"}, outcome.detail


def test_an_index_no_tensor_can_have_is_E0326(workspace, targets):
    """Was: OverflowError building an int64 Slice bound in the ONNX graph."""
    outcome = run_bert(workspace, targets, source=[("hidden[:, 0, :]", "hidden[:, 9223372036854775807, :]")])
    assert (outcome.status, outcome.codes) == ("error", ("E0326",)), outcome.detail


@pytest.mark.parametrize("layers, code", [("100000000000000000000", "E0503"), ("1000000", "E0505")])
def test_an_enormous_sub_array_is_an_error_not_a_hang(workspace, targets, layers, code):
    """Was: instantiation building 10^20 sub-blocks (the case never ended).  10^20 is past any
    dim (E0503); a million is a dim, but more sub-blocks than instantiation builds (E0505)."""
    outcome = run_bert(workspace, targets, manifest=("Layers = 2", f"Layers = {layers}"))
    assert (outcome.status, outcome.codes) == ("error", (code,)), outcome.detail


def test_an_empty_sub_array_is_E0505(workspace, targets):
    """Was: IndexError in lowering, which named the array's block after its first element. An
    empty array is allowed now (no params, loops of no pass); BERT's `hidden_states` collects
    over its layers, which an empty array cannot give a pass to stack."""
    outcome = run_bert(workspace, targets, manifest=("Layers = 2", "Layers = 0"))
    assert (outcome.status, outcome.codes) == ("error", ("E0505",)), outcome.detail


def test_the_fused_onnx_linear_falls_back_when_std_linear_is_not_the_shipped_one(workspace, targets):
    """Was: KeyError 'bias' in the ONNX backend's fused Linear after std's `bias` was renamed."""
    linear = "std/nn/linear.linnet"
    text = workspace.text(linear).replace("bias", "offset")
    bert = next(t for t in targets if t.label == "bert")
    outcome = run_case(Case(0, bert, {linear: text.encode("utf-8")}), workspace, timeout=GUARD_S)
    assert (outcome.status, outcome.stage) == ("ok", "onnx-checker"), outcome.detail


def test_a_sub_named_self_is_not_taken_for_the_block_itself(workspace, targets):
    """Was: E0830 without a span from the ONNX emitter (seed 11, case 397,203): the IR marked a
    sibling call with the receiver "self", so `self.forward` on a sub named `self` read as the
    block's own method. tests/test_codegen_safety.py checks the numbers for a loop variable."""
    outcome = run_bert(workspace, targets, source=[("sub embeddings:", "sub self:"),
                                                   ("embeddings.", "self.")])
    assert (outcome.status, outcome.stage) == ("ok", "onnx-checker"), outcome.detail


def test_a_rank_0_param_emits_valid_torch_code(workspace, targets):
    """Was: `torch.empty(, dtype=...)` (SyntaxError) for `param bias: Tensor[; T]`."""
    outcome = run_bert(workspace, targets, std={"std/nn/linear.linnet": ("param bias: Tensor[Out; T]",
                                                                         "param bias: Tensor[; T]")})
    assert (outcome.status, outcome.stage) == ("ok", "onnx-checker"), outcome.detail


@pytest.mark.parametrize("expr", ["rsqrt(0.0)", "log(-1.0)", "sqrt(-4.0)", "exp(1000.0)", "log(0.0)"])
def test_folding_a_constant_follows_ieee_instead_of_raising(workspace, targets, expr):
    """Was: ZeroDivisionError / ValueError / OverflowError while lowering folded a constant."""
    outcome = run_bert(workspace, targets, std={"std/nn/activations.linnet": ("0.7071067811865476", expr)})
    assert (outcome.status, outcome.stage) == ("ok", "onnx-checker"), outcome.detail


@pytest.mark.parametrize("separator", ["\x0c", "\u2028", "\r", "\x0b", "\x1c"])
def test_diagnostics_quote_the_line_the_parser_counted(workspace, targets, separator):
    """Was: the renderer split lines at form feeds, U+2028, ... (str.splitlines), the parser
    only at newlines, so the quoted line and the caret were wrong."""
    from linnet.cli.targets import locate
    from linnet.compiler import compile_target
    from linnet.diagnostics import LinnetError

    path = workspace.root / "golden" / "linebreaks.linnet"
    path.write_text(f"// a{separator}b\nfn f() -> $\n", encoding="utf-8")
    with pytest.raises(LinnetError) as caught:
        compile_target(locate(path))
    assert not span_problems(caught.value, workspace.root)
    assert "2 | fn f() -> $" in caught.value.render()


@pytest.mark.parametrize("separator", ["\x0c", "\u2028", "\x1d"])
def test_an_unclosed_brace_at_eof_is_located_as_the_parser_counts_lines(workspace, separator):
    """Was: the end-of-file position and the unclosed `{` were found by str.splitlines, so a
    form feed earlier in the file put them on lines or columns that do not exist."""
    from linnet.cli.targets import locate
    from linnet.compiler import compile_target
    from linnet.diagnostics import LinnetError

    path = workspace.root / "golden" / "unclosed.linnet"
    path.write_text(f"// a{separator}b\nfn f(x: Tensor[2; f32]) -> Tensor[2; f32] {{\n    return x\n",
                    encoding="utf-8")
    with pytest.raises(LinnetError) as caught:
        compile_target(locate(path))
    d = caught.value.diagnostics[0]
    assert d.code == "E0002" and "close the `{` at line 2" in d.message
    assert (d.span.line, d.span.col) == (3, 13)
    assert (d.notes[0].span.line, d.notes[0].span.col) == (2, 43)
    assert not span_problems(caught.value, workspace.root)


@pytest.mark.parametrize("data, col", [("隒".encode() + b"\xef", 2), (b"\xef\xbb\xbf" + "ŧё".encode() + b"\xc8", 3),
                                       (b"fn\n  \xff", 3)])
def test_an_undecodable_byte_is_located_by_characters(workspace, data, col):
    """Was (seed 11, cases 11847 and 45323): the column of a byte that is not UTF-8 counted
    bytes, so after a multi-byte character it pointed past the end of the line as shown."""
    from linnet.cli.targets import locate
    from linnet.compiler import compile_target
    from linnet.diagnostics import LinnetError

    path = workspace.root / "golden" / "bytes.linnet"
    path.write_bytes(data)
    with pytest.raises(LinnetError) as caught:
        compile_target(locate(path))
    d = caught.value.diagnostics[0]
    assert d.code == "E0003" and d.span.col == col and f"column {col}" in d.message
    assert not span_problems(caught.value, workspace.root)



@pytest.mark.parametrize("old, new, code", [
    # the default reading a later parameter, its own, and one of another type
    ("= positions(attention_mask),", "= positions(position_ids),", "E0114"),
    ("position_ids: Tensor[B, S; i32] = positions(attention_mask),",
     "position_ids: Tensor[B, S; i32] = cast<f32>(positions(attention_mask)),", "E0307"),
    ("head_mask: Tensor[Layers, Heads; T] = ones,", "head_mask: Tensor[Layers, Heads; T],", "E0113"),
])
def test_a_broken_computed_default_in_bert_is_a_diagnostic(workspace, targets, old, new, code):
    """Computed defaults (`= positions(attention_mask)`) mutated in the BERT source the fuzzer runs."""
    outcome = run_bert(workspace, targets, source=[(old, new)])
    assert outcome.status == "error" and code in outcome.codes, outcome.detail


def test_bert_with_computed_defaults_goes_through_every_emitter(workspace, targets):
    """The unmutated BERT source, `forward_full`'s computed defaults included."""
    outcome = run_bert(workspace, targets, source=[])
    assert (outcome.status, outcome.stage) == ("ok", "onnx-checker"), outcome.detail


def _structure(node):
    """A syntax tree as nested tuples, for comparing two trees by value."""
    import dataclasses

    if dataclasses.is_dataclass(node):
        return (type(node).__name__,) + tuple((f.name, _structure(getattr(node, f.name)))
                                              for f in dataclasses.fields(node))
    if isinstance(node, (list, tuple)):
        return tuple(_structure(item) for item in node)
    if isinstance(node, dict):
        return tuple(sorted((k, _structure(v)) for k, v in node.items()))
    return node


def test_a_reused_syntax_tree_is_handed_out_as_parsed():
    """The workspace reuses the trees of unmutated files, which the resolver edits in place
    (delegated entries, computed defaults); an edit made in one case, perhaps from a file that
    case mutated, must not reach the next. After cases that resolve BERT, std and golden
    programs, every reused tree equals a fresh parse of its file."""
    import linnet.front.resolve as resolve
    from linnet.front.parser import parse_file

    ws = Workspace()
    try:
        cached = resolve.parse_file
        targets = corpus()
        run_case(Case(-1, next(t for t in targets if t.label == "bert"), {}), ws, timeout=GUARD_S)
        for index in range(40):
            run_case(make_case(2026, index, targets, ws), ws, timeout=GUARD_S)
        trees = cached.trees
        assert any("pub use" in ws.text(rel) for rel, _ in trees)  # trees the resolver does edit
        for (rel, display), _ in trees.items():
            path = ws.root / rel
            again = cached(path, None, None if display == str(path) else display)
            fresh = parse_file(path, None, None if display == str(path) else display)
            assert _structure(again) == _structure(fresh), rel
    finally:
        ws.close()


def test_a_byte_order_mark_is_not_source_text(workspace):
    from linnet.cli.targets import locate
    from linnet.compiler import compile_target

    path = workspace.root / "golden" / "bom.linnet"
    path.write_bytes(b"\xef\xbb\xbf" + b"fn f(x: Tensor[2; f32]) -> Tensor[2; f32] {\n    return x\n}\n")
    assert compile_target(locate(path)).checked is not None


def test_a_deep_model_is_given_time_in_proportion_to_its_instances(workspace, targets):
    """Was: "hang at emit-onnx" (seed 11, case 204411: `Layers = 1024`). Emission is linear in the
    block instances, so a legal deep model outgrew the fixed per-case budget; the fuzzer now adds
    time per instance once a case is lowered. 64 layers already take more than the fixed budget."""
    from linnet.testing.fuzz import CASE_TIMEOUT_S

    bert = next(t for t in targets if t.label == "bert")
    files = {NEST_FILE: workspace.text(NEST_FILE).replace("Layers = 2", "Layers = 64").encode("utf-8")}
    outcome = run_case(Case(0, bert, files), workspace, timeout=CASE_TIMEOUT_S)
    assert outcome.status == "ok", f"{outcome.status} at {outcome.stage}: {outcome.detail}"
