"""The tree shows the pipeline, and imports point one way along it.

Each module of `linnet/` belongs to one layer; a module may import from its own layer and the
layers below it, never from a layer above (lazy imports inside functions count too: a cycle
dodged by a late import is still a cycle).  The shared vocabulary at the bottom (diagnostics,
codes, dtypes, types, dims, the op registry, paths) imports no stage at all.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "linnet"

#: Bottom to top. A module may import only from its own layer or an earlier one.
LAYERS = (
    ("core", ("diagnostics", "codes", "dtypes", "arrays", "paths", "types", "dims", "prims", "ops", "kernels", "contention")),
    ("front", ("front",)),
    ("check", ("check",)),
    ("middle", ("middle", "compiler")),
    ("run", ("runtime", "backends")),
    ("zoo", ("nest",)),
    ("serving", ("serving",)),
    ("commands", ("cli", "testing")),
)
_RANK = {top: rank for rank, (_, tops) in enumerate(LAYERS) for top in tops}


def _module(path: Path, package: Path = PACKAGE) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, root: Path = PACKAGE) -> list[tuple[int, str]]:
    """(line, module) of every `linnet.*` module the file imports, at any depth of the file."""
    module = _module(path, root)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("linnet")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "linnet":  # `from .. import codes, ir`: the names are the modules
                found += [(node.lineno, f"linnet.{a.name}") for a in node.names]
            elif target.startswith("linnet."):
                found.append((node.lineno, target))
    return found


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return _RANK.get(parts[1]) if len(parts) > 1 else None


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_module_has_a_layer():
    unplaced = [_module(p) for p in _sources() if p.name != "__init__.py" or p.parent != PACKAGE
                if _layer(_module(p)) is None]
    assert not unplaced, f"add these to LAYERS in {Path(__file__).name}: {unplaced}"


def _upward(root: Path) -> list[str]:
    upward = []
    for path in sorted(root.rglob("*.py")):
        own = _layer(_module(path, root))
        if own is None:
            continue
        for line, target in _imports(path, root):
            theirs = _layer(target)
            if theirs is not None and theirs > own:
                upward.append(f"{path.relative_to(root.parent)}:{line} imports {target} "
                              f"({LAYERS[own][0]} -> {LAYERS[theirs][0]})")
    return upward


def test_imports_point_down_the_pipeline():
    upward = _upward(PACKAGE)
    assert not upward, "imports against the pipeline:\n" + "\n".join(upward)


@pytest.mark.parametrize("where, text", [
    ("compiler.py", "def locate():\n    from .nest.manifest import load_manifest\n"),  # the old lazy cycle
    ("backends/stablehlo_export.py", "from ..nest.weights import entry_bindings\n"),
    ("front/resolve.py", "from .. import nest\n"),
])
def test_an_upward_import_is_caught(tmp_path, where, text):
    """The rule can fail: the upward imports this tree used to have are each reported."""
    file = tmp_path / "linnet" / where
    file.parent.mkdir(parents=True)
    file.write_text(text)
    [report] = _upward(tmp_path / "linnet")
    assert "imports linnet.nest" in report


def test_backend_modules_do_not_shadow_their_frameworks():
    names = {p.stem for p in (PACKAGE / "backends").glob("*.py")}
    assert not names & {"torch", "pytorch", "jax", "onnx", "onnxruntime", "stablehlo"}, names


#: No module past this many lines (issue 26): one that grows past it holds two concerns.
MAX_MODULE_LINES = 800
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"


def _line_count(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_module_passes_the_line_limit():
    long = {str(p.relative_to(PACKAGE.parent)): _line_count(p) for p in _sources()
            if _line_count(p) > MAX_MODULE_LINES}
    assert not long, f"split these by concern (at most {MAX_MODULE_LINES} lines each): {long}"


def _documented_tree() -> dict[str, int]:
    """docs/architecture.md's module tree: path -> the line count written beside it."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    block = text.split("## The tree", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    listed, folders = {}, []
    for line in block.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        depth = (len(line) - len(line.lstrip())) // 4
        name, *count = line.split()
        folders = folders[:depth]
        if name.endswith("/"):
            folders.append(name.rstrip("/"))
        else:
            listed["/".join(folders + [name])] = int(count[0])
    return listed


def test_the_documented_tree_is_the_tree():
    """Every module is in docs/architecture.md's tree, nothing gone is, and each count is near."""
    listed = _documented_tree()
    actual = {str(p.relative_to(PACKAGE.parent)): _line_count(p) for p in _sources()}
    assert sorted(set(actual) - set(listed)) == [], "modules missing from docs/architecture.md's tree"
    gone = [path for path in listed if not (PACKAGE.parent / path).is_file()]
    assert gone == [], "docs/architecture.md lists files that are gone"
    actual.update({path: _line_count(PACKAGE.parent / path) for path in listed if path not in actual})
    stale = {path: (count, actual[path]) for path, count in listed.items()
             if abs(count - actual[path]) > max(40, actual[path] // 5)}
    assert not stale, f"(documented, actual) line counts that drifted: {stale}"
