"""Where the standard library and the zoo live, from a source checkout or an installed wheel,
and how generated code names their files."""
from __future__ import annotations

import importlib.util
import os
from functools import cache
from pathlib import Path

_REPO_ROOT = Path(__file__).resolve().parent.parent


def _installed_package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _locate(folder: str, package: str) -> Path:
    # A source checkout keeps std/ and nest/ beside linnet/; a wheel ships them as
    # linnet._std and linnet._nest (see pyproject.toml's package-dir).
    beside = _REPO_ROOT / folder
    if beside.is_dir() and (_REPO_ROOT / "pyproject.toml").is_file():
        return beside
    installed = _installed_package_dir(package)
    if installed is not None and installed.is_dir():
        return installed
    raise FileNotFoundError(f"cannot find Linnet's {folder}/ folder (looked beside {_REPO_ROOT} "
                            f"and for the installed package {package})")


@cache
def std_dir() -> Path:
    """The folder whose files are the `std.*` modules."""
    return _locate("std", "linnet._std")


@cache
def zoo_dir() -> Path:
    """The folder holding one sub-folder per zoo entry (`bert-base-uncased/`, ...)."""
    return _locate("nest", "linnet._nest")


def source_label(file: str) -> str:
    """A Linnet source file as generated code names it (`# file:line`, ONNX doc strings).

    Spans name files relative to the working directory when that is shorter (as diagnostics
    want); generated code should read the same wherever it was built from, so a file of the
    standard library or of the zoo is named from the folder that holds `std/` and `nest/`:
    `std/nn/linear.linnet`, `nest/bert-base-uncased/src/lib.linnet`, in a checkout and in an
    installed wheel alike.  Any other file keeps the span's name.
    """
    return _source_label(file, os.getcwd())


@cache
def _source_label(file: str, cwd: str) -> str:
    path = (Path(cwd) / file).resolve()  # an absolute `file` replaces cwd
    for folder, name in ((std_dir(), "std"), (zoo_dir(), "nest")):
        root = folder.resolve()
        if path.is_relative_to(root):
            return "/".join((name, *path.relative_to(root).parts))
    return file
