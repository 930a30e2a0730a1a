"""The registry of diagnostic codes (`linnet/codes.py`) and the sources that raise them.

* The registry refuses, at import, two records with one code or one slug, and a record not
  bound to the constant its slug names; a `Diagnostic` refuses a code it does not hold.
* No module outside the registry writes a code as a bare string literal, and every
  `codes.NAME` a module uses exists.
* Every registered code is raised somewhere, unless it is marked `reserved` with a reason,
  and a reserved one is raised nowhere.
"""
from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from linnet import codes
from linnet.codes import ErrorCode
from linnet.diagnostics import Diagnostic, InternalError, LinnetError, error

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "linnet"
REGISTRY = PACKAGE / "codes.py"

_CODE = re.compile(r"E\d{4}")


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p != REGISTRY)


def _literal_codes(path: Path) -> list[tuple[int, str]]:
    """(line, code) of every string constant that is exactly a code, f-string pieces included."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _CODE.fullmatch(node.value)]


def _registry_names(path: Path) -> list[tuple[int, str]]:
    """(line, NAME) of every `codes.NAME` in a module."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [(node.lineno, node.attr) for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "codes"]


def _raised_codes() -> dict[str, list[str]]:
    """Code -> the modules that use it: through its constant, or as a literal where not yet converted."""
    used: dict[str, list[str]] = {}
    for path in _sources():
        where = path.relative_to(REPO).as_posix()
        found = [codes.BY_CODE[c].code for _, c in _literal_codes(path) if c in codes.BY_CODE]
        found += [getattr(codes, name).code for _, name in _registry_names(path)
                  if isinstance(getattr(codes, name, None), ErrorCode)]
        for code in found:
            used.setdefault(code, []).append(where)
    return used


# ------------------------------------------------------------------------ the sources


def test_no_module_spells_a_code_as_a_literal():
    bare = [f"{path.relative_to(REPO).as_posix()}:{line}: \"{code}\""
            for path in _sources() for line, code in _literal_codes(path)]
    assert not bare, "write codes.<NAME> from linnet/codes.py instead of a literal code:\n" + "\n".join(bare)


def test_every_registry_name_a_module_uses_exists():
    missing = [f"{path.relative_to(REPO).as_posix()}:{line}: codes.{name}"
               for path in _sources() for line, name in _registry_names(path) if not hasattr(codes, name)]
    assert not missing, "\n".join(missing)


def test_every_registered_code_is_raised_unless_reserved():
    used = _raised_codes()
    unraised = [f"{r.code} ({r.constant})" for r in codes.BY_CODE.values() if r.reserved is None and r.code not in used]
    assert not unraised, f"registered codes nothing raises; mark them reserved=\"why\" or drop them: {unraised}"
    revived = {r.code: used[r.code] for r in codes.BY_CODE.values() if r.reserved is not None and r.code in used}
    assert not revived, f"codes marked reserved are raised again (give the new meaning a new code): {revived}"


# ------------------------------------------------------------------------ the registry


def test_the_registry_holds_the_known_codes():
    assert len(codes.BY_CODE) >= 126
    assert codes.BY_CODE["E0701"] is codes.BAD_INPUT
    assert codes.BAD_INPUT.slug == "bad-input" and codes.BAD_INPUT.stage == "runtime"
    assert list(codes.BY_CODE) == sorted(codes.BY_CODE)


def test_a_code_renders_and_compares_as_its_string():
    assert str(codes.WHERE_UNPROVEN) == "E0402" and f"[{codes.WHERE_UNPROVEN}]" == "[E0402]"
    assert codes.WHERE_UNPROVEN == "E0402" and "E0402" == codes.WHERE_UNPROVEN
    assert codes.WHERE_UNPROVEN != "E0401" and codes.WHERE_UNPROVEN != codes.WHERE_VIOLATED
    assert {"E0402": 1}[codes.WHERE_UNPROVEN] == 1


def test_a_diagnostic_keeps_the_code_string_and_renders_as_before():
    err = error(codes.BAD_INPUT, "x is missing")
    assert err.code == "E0701" and type(err.code) is str
    assert err.render() == "error[E0701]: x is missing"
    assert Diagnostic("E0701", "x is missing").to_json()["code"] == "E0701"


@pytest.mark.parametrize("code", ["E9999", "E0302", "e0701", "", codes.BAD_INPUT.slug])
def test_a_diagnostic_with_an_unregistered_code_cannot_be_made(code):
    with pytest.raises(InternalError, match="not a registered diagnostic code"):
        Diagnostic(code, "message")


def test_an_unregistered_code_is_not_a_user_error():
    with pytest.raises(InternalError):
        error("E9999", "message")
    assert not issubclass(InternalError, LinnetError)


def test_index_refuses_a_code_or_slug_registered_twice():
    first = ErrorCode("E0001", "first", "parse", "one")
    with pytest.raises(ValueError, match="'E0001' is registered twice"):
        codes.index([first, ErrorCode("E0001", "second", "parse", "two")])
    with pytest.raises(ValueError, match="'first' is registered twice"):
        codes.index([first, ErrorCode("E0002", "first", "parse", "two")])


@pytest.mark.parametrize("fields, problem", [
    (("E001", "x", "parse", "s"), "E and four digits"),
    (("E0001", "Bad_Slug", "parse", "s"), "slug"),
    (("E0001", "x", "typing", "s"), "unknown stage"),
    (("E0001", "x", "parse", " "), "one non-empty line"),
])
def test_a_malformed_record_is_refused(fields, problem):
    with pytest.raises(ValueError, match=problem):
        ErrorCode(*fields)


def _import_registry_with(extra: str, tmp_path: Path):
    """linnet/codes.py as a fresh module, with `extra` registered after its own records."""
    text = REGISTRY.read_text(encoding="utf-8")
    cut = text.index("\ndef index(")
    path = tmp_path / "codes_copy.py"
    path.write_text(text[:cut] + "\n" + extra + "\n" + text[cut:], encoding="utf-8")
    spec = importlib.util.spec_from_file_location("codes_copy", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def test_a_duplicate_registration_fails_at_import(tmp_path):
    assert len(_import_registry_with("", tmp_path).BY_CODE) == len(codes.BY_CODE)
    with pytest.raises(ValueError, match="'E0701' is registered twice"):
        _import_registry_with('INPUT_AGAIN: Final = _register("E0701", "input-again", "runtime", "s")', tmp_path)
    with pytest.raises(ValueError, match="'bad-input' is registered twice"):
        _import_registry_with('BAD_INPUT_TOO: Final = _register("E0799", "bad-input", "runtime", "s")', tmp_path)


def test_a_record_bound_to_another_name_fails_at_import(tmp_path):
    with pytest.raises(ValueError, match="must be bound to the name SPARE_CODE"):
        _import_registry_with('SPARE: Final = _register("E0799", "spare-code", "runtime", "s")', tmp_path)


def test_each_stage_module_lists_its_stage_codes():
    from linnet.cli import run
    from linnet.nest import hf, images, manifest, tokenizer, weights
    for module, prefix in ((manifest, "E09"), (weights, "E10"), (hf, "E11"), (tokenizer, "E12"), (run, "E13"),
                           (images, "E14")):
        assert module.CODES and all(code.startswith(prefix) for code in module.CODES), module.__name__
        assert module.CODES == {c: r.summary for c, r in codes.BY_CODE.items() if c.startswith(prefix)}


# --------------------------------------------------------------------- the docs table


def test_a_reserved_code_says_so_in_the_table():
    retired = ErrorCode("E0302", "old-rule", "check", "an old rule", reserved="merged into E0301")
    table = codes.markdown_table([retired, codes.ARGUMENT_COUNT])
    assert table.splitlines()[2:] == [
        "| `E0301` | `argument-count` | check | wrong number of arguments |",
        "| `E0302` | `old-rule` | check | reserved, not raised any more: merged into E0301 (it meant: an old rule) |",
    ]


def test_python_dash_m_prints_the_table():
    done = subprocess.run([sys.executable, "-m", "linnet.codes", "--markdown"], cwd=REPO,
                          capture_output=True, text=True, check=True)
    assert done.stdout == codes.markdown_table()
    assert done.stderr == ""
    assert "| `E0320` | `bad-operand` | check |" in done.stdout
