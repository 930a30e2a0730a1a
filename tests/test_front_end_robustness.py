"""Robustness: whatever the source text, the front end answers with a result or diagnostics.

Random mutations of the BERT entry's source (tokens deleted, duplicated, swapped or
replaced, stray text inserted) go through the whole front end -- parse, resolve, check,
instantiate, the [check] dims -- as `linnet check` runs it. The outcome must be success or
a `LinnetError` whose every diagnostic has a span at line >= 1, column >= 1 and renders;
any other exception is a bug in the compiler, not in the program.
"""
from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from linnet.cli.targets import locate
from linnet.compiler import compile_target
from linnet.diagnostics import LinnetError

REPO = Path(__file__).resolve().parent.parent
ENTRY = REPO / "nest" / "bert-base-uncased"
SOURCE = (ENTRY / "src" / "lib.linnet").read_text(encoding="utf-8")

# Whitespace and comments stay attached to the token before them, so a mutation moves code.
TOKEN = re.compile(r"//[^\n]*|[A-Za-z_][A-Za-z0-9_]*|[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|::|->|<=|>=|==|!=|\S")
TOKENS = [m.group(0) + SOURCE[m.end():next_start]
          for m, next_start in zip(TOKEN.finditer(SOURCE),
                                   [m.start() for m in TOKEN.finditer(SOURCE)][1:] + [len(SOURCE)])]
PREFIX = SOURCE[:next(TOKEN.finditer(SOURCE)).start()]
NAMES = sorted({t.strip() for t in TOKENS if re.fullmatch(r"[A-Za-z_]\w*", t.strip())})
SNIPPETS = ["fn ", "entry ", "block ", "sub ", "param ", "let ", "var ", "return ", "static for ", "if let ",
            "some(", "none", "where ", "<", ">", "(", ")", "{", "}", "[", "]", ",", ";", ":", "*", "/", "%",
            "-", "+", "=", "== ", "Tensor[", "Option[", "0", "-1", "1.5", "1e-3", "$", "use ", "module ", "pub ",
            "const ", "::", ".", "f32 ", "i32 ", "Dim", "Float", "Shape", "*S", "\n", "// c\n", "\t", "\u00e9"]

EXAMPLES = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                    derandomize=True)


@pytest.fixture(scope="module")
def entry_copy():
    """A private copy of the zoo entry whose source each example overwrites."""
    folder = Path(tempfile.mkdtemp(prefix="linnet-robust-"))
    shutil.copytree(ENTRY, folder / "entry")
    yield folder / "entry"
    shutil.rmtree(folder, ignore_errors=True)


mutation = st.one_of(
    st.tuples(st.just("delete"), st.integers(0, len(TOKENS) - 1)),
    st.tuples(st.just("duplicate"), st.integers(0, len(TOKENS) - 1)),
    st.tuples(st.just("swap"), st.integers(0, len(TOKENS) - 1), st.integers(0, len(TOKENS) - 1)),
    st.tuples(st.just("insert"), st.integers(0, len(TOKENS)), st.sampled_from(SNIPPETS)),
    st.tuples(st.just("rename"), st.integers(0, len(TOKENS) - 1), st.sampled_from(NAMES)),
    st.tuples(st.just("text"), st.integers(0, len(TOKENS)), st.text(max_size=8)),
)


def mutate(ops) -> str:
    tokens = list(TOKENS)
    for op, index, *rest in ops:
        index = min(index, len(tokens) - 1) if tokens else 0
        if not tokens:
            break
        if op == "delete":
            del tokens[index]
        elif op == "duplicate":
            tokens.insert(index, tokens[index])
        elif op == "swap":
            other = min(rest[0], len(tokens) - 1)
            tokens[index], tokens[other] = tokens[other], tokens[index]
        elif op == "rename":
            tokens[index] = rest[0] + tokens[index][len(tokens[index].rstrip()):] \
                if re.match(r"[A-Za-z_]", tokens[index]) else tokens[index]
        else:  # insert a snippet or arbitrary text
            tokens.insert(index, rest[0])
    return PREFIX + "".join(tokens)


def test_tokens_reassemble_the_source():
    assert PREFIX + "".join(TOKENS) == SOURCE
    assert len(TOKENS) > 500


def run_front_end(entry: Path, text: str) -> None:
    (entry / "src" / "lib.linnet").write_text(text, encoding="utf-8")
    try:
        compile_target(locate(entry))
    except LinnetError as err:
        assert err.diagnostics
        for d in err.diagnostics:
            assert d.span is not None, f"{d.code} without a span: {d.message}"
            assert d.span.line >= 1 and d.span.col >= 1, (d.code, d.span, d.message)
            for note in d.notes:
                assert note.span is None or (note.span.line >= 1 and note.span.col >= 1), note
        assert "error[" in err.render()


def test_the_unmutated_source_checks(entry_copy):
    run_front_end(entry_copy, SOURCE)
    compile_target(locate(entry_copy))


@EXAMPLES
@given(ops=st.lists(mutation, min_size=1, max_size=4))
def test_mutated_sources_give_results_or_diagnostics(entry_copy, ops):
    run_front_end(entry_copy, mutate(ops))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(text=st.text(max_size=60))
def test_arbitrary_text_gives_results_or_diagnostics(entry_copy, text):
    run_front_end(entry_copy, text)
