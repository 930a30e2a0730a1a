"""Where the standard library and the zoo live, from a source checkout or an installed wheel."""
from __future__ import annotations

import importlib.util
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
