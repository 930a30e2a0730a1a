"""The checker package keeps its shape: modules split by concern, no state hidden in classes.

Per-body state (facts, broadcasts, locals) lives in a `BodyContext` passed explicitly. It
once lived in class attributes assigned halfway down the `Checker` class, where it was
shared by every instance and set as a side effect of checking a body; these tests keep that
from coming back.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

CHECK = Path(__file__).resolve().parent.parent / "linnet" / "check"
MODULES = sorted(CHECK.glob("*.py"))
MAX_LINES = 500


def test_the_checker_is_a_package_of_modules():
    assert not (CHECK.parent / "check.py").exists()
    assert len(MODULES) > 1


@pytest.mark.parametrize("module", MODULES, ids=lambda p: p.name)
def test_module_is_not_too_long(module: Path):
    lines = len(module.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{module.name} has {lines} lines; split it by concern"


def _class_level_state(tree: ast.Module) -> list[str]:
    """Class-body assignments that hold state: any value but a constant or a dataclass
    `field(...)`, and any assignment after the first method."""
    found = []
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        seen_method = False
        for stmt in cls.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                seen_method = True
                continue
            if isinstance(stmt, ast.Assign):
                value = stmt.value
            elif isinstance(stmt, ast.AnnAssign):
                value = stmt.value
                if value is None and not seen_method:
                    continue  # a field declaration
            else:
                continue
            is_field = (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                        and value.func.id == "field")
            if seen_method:
                found.append(f"{cls.name}, line {stmt.lineno}: attribute assigned after the methods")
            elif value is not None and not isinstance(value, ast.Constant) and not is_field:
                found.append(f"{cls.name}, line {stmt.lineno}: class-level value {ast.unparse(value)}")
    return found


@pytest.mark.parametrize("module", MODULES, ids=lambda p: p.name)
def test_no_class_level_state(module: Path):
    assert _class_level_state(ast.parse(module.read_text(encoding="utf-8"))) == []


def test_the_state_rule_catches_what_it_is_for():
    """The shape the old checker had: per-body facts as class attributes, set mid-class."""
    old = ast.parse("class Checker:\n"
                    "    def run(self): ...\n"
                    "    facts: Facts = Facts()\n"
                    "    broadcast_facts: list = []\n")
    assert len(_class_level_state(old)) == 2
    shared = ast.parse("class C:\n    cache = {}\n")
    assert _class_level_state(shared) == ["C, line 2: class-level value {}"]
