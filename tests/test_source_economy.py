"""The language earns its keep (issue 26's "done when"), pinned so a later change cannot undo it:
the BERT family fits in 600 lines, no Linnet definition is copied between files (a shared one
belongs in std/), and the middle end keeps no table of op names of its own (what a pass needs to
know about an op is a trait in `linnet/ops.py`)."""
from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

from linnet import ops
from linnet.front import ast as linnet_ast
from linnet.front.parser import parse_file

REPO = Path(__file__).resolve().parent.parent
LINNET_FILES = sorted([*REPO.glob("std/**/*.linnet"), *REPO.glob("nest/*/src/**/*.linnet")])
#: Top-level items whose text is a definition (a `use` line may well repeat).
DEFINITIONS = (linnet_ast.Block, linnet_ast.Function, linnet_ast.Const, linnet_ast.BlockAlias)


def _item_text(lines: list[str], span) -> str:
    """The item's source with comments dropped and whitespace collapsed."""
    text = "\n".join(lines[span.line - 1:span.end_line])
    text = re.sub(r"//[^\n]*", "", text)
    return " ".join(text.split())


def test_the_bert_family_source_is_at_most_600_lines():
    """transformers' modeling_bert.py has 1,374 lines; the Linnet source had 1,385 before std's heads."""
    lines = sum(len(f.read_text().splitlines()) for f in (REPO / "nest/bert-base-uncased/src").rglob("*.linnet"))
    assert 0 < lines <= 600, f"nest/bert-base-uncased/src has {lines} lines"


def test_no_definition_is_written_in_two_linnet_files():
    assert len(LINNET_FILES) > 10, LINNET_FILES
    places: dict[str, list[str]] = defaultdict(list)
    for path in LINNET_FILES:
        lines = path.read_text().splitlines()
        for item in parse_file(path).items:
            if isinstance(item, DEFINITIONS):
                places[_item_text(lines, item.span)].append(f"{path.relative_to(REPO)}:{item.span.line}")
    copies = {text[:80]: where for text, where in places.items() if len({w.split(":")[0] for w in where}) > 1}
    assert not copies, f"the same definition in several files (move it to std/): {copies}"


def test_the_duplicate_check_sees_a_copied_block(tmp_path):
    """The check above reads real items: a block pasted into a second file is found."""
    source = "block Twice<D: Dim> {\n    param w: Tensor[D; f32]  // a comment\n}\n"
    items = []
    for name, text in [("a", source), ("b", source.replace("  // a comment", ""))]:
        (tmp_path / f"{name}.linnet").write_text(text)
        module = parse_file(tmp_path / f"{name}.linnet")
        items += [_item_text(text.splitlines(), i.span) for i in module.items if isinstance(i, DEFINITIONS)]
    assert len(items) == 2 and items[0] == items[1]


def test_the_middle_end_names_no_ops_in_its_own_tables():
    """A set, tuple, list or dict literal in linnet/middle/ holding two or more op names is a
    private table of the kind the traits in linnet/ops.py replaced (a new op missing from one
    was refused there, silently slower)."""
    names = set(ops.OPS) | set(ops.PRIMS)
    assert {"add", "exp", "matmul"} <= names
    tables = []
    for path in sorted((REPO / "linnet/middle").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            elements = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", None)
            if not isinstance(node, (ast.Set, ast.Tuple, ast.List, ast.Dict)) or elements is None:
                continue
            named = [e.value for e in elements if isinstance(e, ast.Constant) and e.value in names]
            if len(named) >= 2:
                tables.append(f"{path.relative_to(REPO)}:{node.lineno}: {named}")
    assert not tables, "op names listed in the middle end instead of as traits in linnet/ops.py:\n" + \
        "\n".join(tables)
