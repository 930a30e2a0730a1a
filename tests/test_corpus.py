"""The corpus of invalid programs: each must fail with exactly the diagnostics it declares.

`tests/golden/errors/<case>.linnet` is a small program whose first lines are comments

    // expect: E0321 at 12:17
    // expect: E0103 at helpers/cycle_b.linnet:3:5

naming, in order, the code and primary `line:col` of every diagnostic the front end must
report (the file, when given, is relative to the case's folder; without it the case file
itself). `<case>.txt` beside it holds the exact rendering. Files under `errors/helpers/`
are modules the cases `use`; they are not cases themselves.

`tests/golden/packages/<case>/` is a zoo entry (nest.toml, linnet.toml, src/lib.linnet)
for what only instantiation can find: a root `where` clause violated by the manifest's
values, an entry precondition violated by its [check] dims, a bad or unknown generic. Its
`src/lib.linnet` starts with the same `// expect:` lines (files relative to the entry
folder), and may add `// set: NAME=VALUE` lines, the `--set` overrides to compile with;
`packages/<case>.txt` holds the rendering.

Renderings are made with the repository root as working directory, so every path in them
is relative. Run with `LINNET_UPDATE_GOLDEN=1` to rewrite the `.txt` files after a
deliberate change to messages, then review the diff.
"""
from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

import pytest

from linnet.cli.targets import locate
from linnet.compiler import compile_target
from linnet.diagnostics import LinnetError

REPO = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"
ERRORS = GOLDEN / "errors"
PACKAGES = GOLDEN / "packages"
UPDATE = os.environ.get("LINNET_UPDATE_GOLDEN") == "1"

EXPECT = re.compile(r"^//\s*expect:\s*(?P<code>E\d{4})\s+at\s+(?:(?P<file>[^\s:]+):)?(?P<line>\d+):(?P<col>\d+)\s*$")
SET = re.compile(r"^//\s*set:\s*(?P<name>\w+)=(?P<value>\S+)\s*$")

ERROR_CASES = sorted(ERRORS.glob("*.linnet"))
PACKAGE_CASES = sorted(p for p in PACKAGES.iterdir() if (p / "nest.toml").is_file()) if PACKAGES.is_dir() else []


def header(source: Path) -> tuple[list[tuple[str, str | None, int, int]], dict[str, int | str]]:
    """The `// expect:` and `// set:` lines at the top of a case."""
    expects, overrides = [], {}
    lines = source.read_text(encoding="utf-8").splitlines()
    assert lines and EXPECT.match(lines[0]), f"{source}: the first line must be `// expect: CODE at LINE:COL`"
    for line in lines:
        if m := EXPECT.match(line):
            expects.append((m["code"], m["file"], int(m["line"]), int(m["col"])))
        elif m := SET.match(line):
            value = m["value"]
            overrides[m["name"]] = int(value) if value.lstrip("-").isdigit() else value
        elif not line.startswith("//"):
            break
    return expects, overrides


def compile_failing(path: Path, overrides: dict, monkeypatch) -> LinnetError:
    """Compile a case from the repository root by its relative path; it must fail cleanly."""
    monkeypatch.chdir(REPO)
    target = locate(str(path.relative_to(REPO)))
    try:
        compile_target(target, overrides)
    except LinnetError as err:
        return err
    pytest.fail(f"{path.name}: compiled without errors, but the case expects some")


def normalise(text: str) -> str:
    """The rendering as stored: no absolute paths, one trailing newline."""
    return text.replace(str(REPO) + os.sep, "").replace(str(REPO), ".").rstrip() + "\n"


def check_golden(rendered: str, golden: Path) -> None:
    if UPDATE:
        golden.write_text(rendered, encoding="utf-8")
        return
    assert golden.is_file(), f"{golden} is missing; run with LINNET_UPDATE_GOLDEN=1 to write it"
    assert rendered == golden.read_text(encoding="utf-8"), (
        f"the rendering differs from {golden.relative_to(REPO)}; if the change is deliberate, "
        "rerun with LINNET_UPDATE_GOLDEN=1 and review the diff")


def check_case(target: Path, case_file: Path, base: Path, golden: Path, monkeypatch) -> None:
    """Compile `target` (a file or an entry folder); compare with `case_file`'s header and `golden`."""
    expects, overrides = header(case_file)
    err = compile_failing(target, overrides, monkeypatch)
    found = []
    for d in err.diagnostics:
        assert d.span is not None, f"{d.code} has no span: {d.message}"
        found.append((d.code, (REPO / d.span.file).resolve(), d.span.line, d.span.col))
    wanted = [(code, (case_file if file is None else base / file).resolve(), line, col)
              for code, file, line, col in expects]

    def show(items):
        return [f"{c} at {p.relative_to(REPO) if p.is_relative_to(REPO) else p}:{l}:{k}" for c, p, l, k in items]

    assert show(found) == show(wanted), err.render()
    rendered = normalise(err.render())
    assert str(REPO) not in rendered
    check_golden(rendered, golden)


@pytest.mark.parametrize("case", ERROR_CASES, ids=lambda p: p.stem)
def test_error_case(case: Path, monkeypatch):
    check_case(case, case, case.parent, case.with_suffix(".txt"), monkeypatch)


@pytest.mark.parametrize("package", PACKAGE_CASES, ids=lambda p: p.name)
def test_package_case(package: Path, monkeypatch):
    check_case(package, package / "src" / "lib.linnet", package, PACKAGES / f"{package.name}.txt", monkeypatch)


# ------------------------------------------------------------------- the corpus itself


def test_the_corpus_is_large_and_varied():
    assert len(ERROR_CASES) >= 45
    codes = Counter(expect[0] for case in ERROR_CASES + [p / "src" / "lib.linnet" for p in PACKAGE_CASES]
                    for expect in header(case)[0])
    # Syntax, resolution, names/types, calls/shapes/dtypes, where clauses, instantiation.
    for family in ("E00", "E01", "E02", "E03", "E04", "E05"):
        assert any(code.startswith(family) for code in codes), f"no case reports an {family}xx error"
    several = [case.stem for case in ERROR_CASES if len(header(case)[0]) > 1]
    assert len(several) >= 2, "at least two cases must report several errors in one run"


def test_every_golden_file_belongs_to_a_case():
    stems = {p.stem for p in ERROR_CASES}
    orphans = [p.name for p in ERRORS.glob("*.txt") if p.stem not in stems]
    orphans += [p.name for p in PACKAGES.glob("*.txt") if not (PACKAGES / p.stem / "nest.toml").is_file()]
    assert not orphans, f"golden files without a case: {orphans}"
