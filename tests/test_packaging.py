"""The project as users install it: a non-editable wheel in a fresh virtual environment.

A source checkout finds `std/` and `nest/` beside `linnet/`; an installed wheel must carry
them as `linnet._std` and `linnet._nest` (see pyproject.toml), along with every other file
the package reads at run time, such as `grammar.lark`.  These tests build and install the
project once per module, then run the installed `linnet` from a folder outside the
checkout with no PYTHONPATH, so nothing can quietly fall back to the repository.

The virtual environment is made `--system-site-packages --without-pip`: heavy dependencies
(lark, numpy, torch) come from the Python running the tests, and so do pip and setuptools.
A venv's own bundled setuptools (65.x on Python 3.11) would shadow the system one and cannot
build wheels with current `wheel` releases, so pip runs as `DIR/bin/python -m pip`, which
installs into the venv but builds with the system's setuptools (`--no-build-isolation`).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

#: Paths never copied into the build tree: VCS data, caches, earlier build output.
_NOT_SOURCES = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".venv",
                                      ".pytest_cache", ".hypothesis", ".benchmarks", "out")


def _run(cmd: list, cwd: Path, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _clean_env() -> dict:
    """The test process's environment without anything that could point Python at the checkout."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONSAFEPATH", "VIRTUAL_ENV")}
    env["PYTHONNOUSERSITE"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


class Installed:
    """A venv with the project installed, and a working folder outside the checkout."""

    def __init__(self, venv: Path, workdir: Path, env: dict):
        self.venv, self.workdir, self.env = venv, workdir, env
        self.python = venv / "bin" / "python"
        self.linnet = venv / "bin" / "linnet"
        self.site_packages = Path(_run(
            [self.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            workdir, env).stdout.strip())

    def run(self, *args) -> subprocess.CompletedProcess:
        return _run(list(args), self.workdir, self.env)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    root = tmp_path_factory.mktemp("packaging")
    # Build from a copy, so the build writes its build/ and egg-info there and stale build
    # output in the checkout cannot leak into the wheel.
    source = root / "source"
    shutil.copytree(REPO, source, ignore=_NOT_SOURCES)
    venv, workdir = root / "venv", root / "work"
    workdir.mkdir()
    env = _clean_env()
    made = _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv], root, env)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    done = _run([python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-input",
                 "--quiet", source], root, env)
    assert done.returncode == 0, (
        "building and installing the project into a fresh venv failed (the build uses this Python's "
        "setuptools, which must be >= 68 and able to build wheels):\n" + done.stdout + done.stderr)
    return Installed(venv, workdir, env)


def _files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and not p.name.startswith(".")}


def test_the_venv_is_not_the_checkout(installed):
    assert REPO not in installed.workdir.parents and installed.workdir != REPO
    site = installed.site_packages
    assert installed.venv in site.parents, site
    where = installed.run(installed.python, "-c", "import linnet; print(linnet.__file__)")
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).parent == site / "linnet"


def test_std_and_zoo_are_found_inside_site_packages(installed):
    shown = installed.run(installed.python, "-c", "import linnet.paths as p; print(p.std_dir(), p.zoo_dir())")
    assert shown.returncode == 0, shown.stderr
    std, zoo = (Path(p) for p in shown.stdout.split())
    assert std == installed.site_packages / "linnet" / "_std"
    assert zoo == installed.site_packages / "linnet" / "_nest"
    for path in (std, zoo):
        assert REPO not in path.parents


@pytest.mark.parametrize("folder, installed_as", [("linnet", "linnet"), ("std", "linnet/_std"),
                                                  ("nest", "linnet/_nest")])
def test_the_wheel_carries_every_file(installed, folder, installed_as):
    """Every file of the package, the standard library and the zoo ships; a new data file
    (a grammar, a template, a zoo entry's README) needs a package-data pattern."""
    missing = _files(REPO / folder) - _files(installed.site_packages / installed_as)
    assert not missing, f"not in the installed package (add them to pyproject.toml's package data): {sorted(missing)}"


@pytest.mark.parametrize("entry, params, tensors", [("bert-base-uncased", "110,106,428", 206),
                                                    ("all-minilm-l6-v2", "22,713,216", 103)])
def test_installed_linnet_checks_zoo_entries_by_name(installed, entry, params, tensors):
    done = installed.run(installed.linnet, "check", entry)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{entry}: ok" in done.stdout
    assert f"params: {params} in {tensors} tensors" in done.stdout, done.stdout
    assert "S <= 512" in done.stdout  # the entry precondition came through instantiation


def test_installed_linnet_reports_errors_with_source_lines(installed):
    """Diagnostics quote the installed source, so the wheel's .linnet files are readable."""
    done = installed.run(installed.linnet, "check", "bert-base-uncased", "--set", "S=600")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "error[E0403]" in done.stderr
    assert "where S <= MaxPositions" in done.stderr
    assert str(REPO) not in done.stderr
