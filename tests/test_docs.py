"""docs/language.md (and the README's example) stay true to the code.

* Every primitive in `linnet.prims.PRIMS` has a row in the primitives table, with its
  signature exactly as `PRIMS` spells it, and the table lists nothing else.
* Every diagnostic code the package can raise (`E` and four digits in `linnet/**/*.py`) has a
  row in the diagnostics table, and the table lists no code the package no longer raises.
* Every ```linnet example in docs/language.md and README.md is a complete file that the checker accepts, unless the line
  before its fence says `<!-- fails: E0402 E0401 -->`, in which case checking it must report
  exactly those codes, each as often as listed (in any order).  `<!-- fragment -->` marks a snippet that is not a
  whole file and is not checked.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from linnet.compiler import compile_target, locate
from linnet.diagnostics import LinnetError
from linnet.prims import PRIMS

REPO = Path(__file__).resolve().parent.parent
LANGUAGE = REPO / "docs" / "language.md"
README = REPO / "README.md"

_ROW = re.compile(r"^\|(.*)\|\s*$")
_CODE_IN_SOURCE = re.compile(r"\bE\d{4}\b")
_MARKER = re.compile(r"^<!--\s*(fails:\s*(?P<codes>(E\d{4}\s*)+)|fragment)\s*-->\s*$")


def _text() -> str:
    return LANGUAGE.read_text(encoding="utf-8")


def _section(title: str) -> list[str]:
    """The lines under a `## title` heading, up to the next heading of the same level."""
    lines = _text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == f"## {title}")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start + 1:end]


def _table_rows(lines: list[str]) -> list[list[str]]:
    """Cells of every markdown table row, separator rows dropped, `\\|` unescaped."""
    rows = []
    for line in lines:
        match = _ROW.match(line.strip())
        if not match or set(match.group(1)) <= set("-:| "):
            continue
        cells = re.split(r"(?<!\\)\|", match.group(1))
        rows.append([c.strip().replace("\\|", "|") for c in cells])
    return rows


def _unquote(cell: str) -> str:
    return cell[1:-1] if cell.startswith("`") and cell.endswith("`") else cell


# ------------------------------------------------------------------------ primitives


def _primitive_rows() -> dict[str, str]:
    rows = _table_rows(_section("Primitives"))
    header, body = rows[0], rows[1:]
    assert [h.lower() for h in header[:2]] == ["primitive", "signature"], header
    table = {}
    for cells in body:
        name = _unquote(cells[0])
        assert name not in table, f"{name} has two rows in the primitives table"
        table[name] = _unquote(cells[1])
    return table


def test_every_primitive_is_documented_with_its_signature():
    table = _primitive_rows()
    missing = sorted(set(PRIMS) - set(table))
    assert not missing, f"primitives without a row in docs/language.md: {missing}"
    unknown = sorted(set(table) - set(PRIMS))
    assert not unknown, f"the primitives table lists names PRIMS does not have: {unknown}"
    for name, prim in PRIMS.items():
        assert table[name] == prim.signature, f"{name}: docs say {table[name]!r}, PRIMS says {prim.signature!r}"


# ----------------------------------------------------------------------- diagnostics


def _codes_in_source() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted((REPO / "linnet").rglob("*.py")):
        for code in _CODE_IN_SOURCE.findall(path.read_text(encoding="utf-8")):
            found.setdefault(code, []).append(path.relative_to(REPO).as_posix())
    return found


def _documented_codes() -> dict[str, str]:
    codes = {}
    for cells in _table_rows(_section("Diagnostics")):
        code = _unquote(cells[0])
        if re.fullmatch(r"E\d{4}", code):
            assert code not in codes, f"{code} has two rows in the diagnostics table"
            assert len(cells) > 1 and cells[1], f"{code} has no description"
            codes[code] = cells[1]
    return codes


def test_every_diagnostic_code_is_documented():
    used, documented = _codes_in_source(), _documented_codes()
    missing = {code: sorted(set(files)) for code, files in used.items() if code not in documented}
    assert not missing, f"codes raised in linnet/ but missing from the table in docs/language.md: {missing}"


def test_the_code_table_lists_no_retired_code():
    stale = sorted(set(_documented_codes()) - set(_codes_in_source()))
    assert not stale, f"docs/language.md documents codes nothing in linnet/ raises any more: {stale}"


# -------------------------------------------------------------------------- examples


def _examples(doc: Path) -> list[tuple[str, list[str] | None, str]]:
    """(`file:line`, expected codes or None for a clean check, source) of each checked example."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    examples = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```linnet":
            start = i + 1
            end = next(j for j in range(start, len(lines)) if lines[j].strip() == "```")
            marker = _MARKER.match(lines[i - 1].strip()) if i > 0 else None
            if marker is None or marker.group("codes") is not None:
                codes = marker.group("codes").split() if marker else None
                where = f"{doc.relative_to(REPO).as_posix()}:{start + 1}"
                examples.append((where, codes, "\n".join(lines[start:end]) + "\n"))
            i = end
        i += 1
    return examples


EXAMPLES = _examples(LANGUAGE) + _examples(README)


def test_the_docs_have_examples():
    assert sum(where.startswith("docs/") for where, _, _ in EXAMPLES) >= 10
    assert any(where.startswith("README") for where, _, _ in EXAMPLES)


@pytest.mark.parametrize("where, codes, source", EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_example_checks_as_the_docs_say(tmp_path, where, codes, source):
    path = tmp_path / "example.linnet"
    path.write_text(source, encoding="utf-8")
    try:
        compile_target(locate(path))
    except LinnetError as exc:
        found = [d.code for d in exc.diagnostics]
        assert codes is not None, f"{where}: the example should check, but:\n{exc.render()}"
        assert sorted(found) == sorted(codes), \
            f"{where}: expected {codes}, found {found}:\n{exc.render()}"
    else:
        assert codes is None, f"{where}: the example should fail with {codes}, but it checks"
