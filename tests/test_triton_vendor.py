"""Where the harness gets Triton's ONNX Runtime backend sources when ../shared/vendor is missing.

No C++ build here: these check the fetch (a local bare git repository stands in for github)
and the refusal when neither the vendor folder nor the network is there.
"""
from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from linnet.testing import triton_ort
from linnet.testing.triton_server import ProvisionError

#: The verified vendored trees (see ../shared/vendor/README.md), the reference for the fetch.
REFERENCE = Path(__file__).resolve().parents[1].parent / "shared" / "vendor"
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]


def _reference() -> Path:
    if not (REFERENCE / "triton-r24.10" / "common").is_dir():
        pytest.fail(f"this test builds its stand-in upstream from the vendored trees in {REFERENCE}, not found")
    return REFERENCE


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    empty = tmp_path / "vendor"
    empty.mkdir()
    monkeypatch.setenv("LINNET_TRITON_VENDOR", str(empty))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path


def _bare_repo(tree: Path, bare: Path, ref: str, *, tag: bool = False, decoy: bool = True) -> None:
    """A bare repository whose `ref` (branch or tag) holds `tree`; HEAD is a different `main`."""
    work = bare.with_suffix(".work")
    _writable_copy(tree, work)
    run = lambda *args: subprocess.run([*GIT, *args], cwd=work, check=True, capture_output=True)  # noqa: E731
    run("init", "-q")
    if decoy:  # the default branch holds something else: the fetch must take the pinned ref
        (work / "DECOY").write_text("not the pinned tree\n")
        run("add", "-A", "-f")
        run("commit", "-qm", "decoy")
        run("checkout", "-q", "-b", "pinned", "HEAD~0")
        (work / "DECOY").unlink()
    run("add", "-A", "-f")
    run("commit", "-qm", "pinned tree")
    if tag:
        run("tag", ref)
    else:
        run("branch", "-f", ref)
    if decoy:
        run("checkout", "-q", "main")
    subprocess.run([*GIT, "clone", "-q", "--bare", str(work), str(bare)], check=True, capture_output=True)
    shutil.rmtree(work)


def _writable_copy(src: Path, dest: Path) -> None:
    shutil.copytree(src, dest)  # the vendored files are read-only
    dest.chmod(0o755)
    for path in dest.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)


def _upstream(tmp_path: Path, edit=None) -> Path:
    """Stand-ins for the four triton-inference-server repositories and onnxruntime's."""
    ref = _reference()
    base = tmp_path / "upstream"
    base.mkdir()
    for part in triton_ort.TRITON_PARTS:
        tree = tmp_path / "src" / part
        _writable_copy(ref / "triton-r24.10" / part, tree)
        if part == "common":  # upstream's own file: the test subdirectory not yet commented out
            cmake = tree / "src" / "CMakeLists.txt"
            text = cmake.read_text()
            assert "# add_subdirectory(test)  # disabled: needs googletest download" in text
            cmake.write_text(text.replace("# add_subdirectory(test)  # disabled: needs googletest download",
                                          "add_subdirectory(test)"))
        if edit is not None:
            edit(part, tree)
        _bare_repo(tree, base / f"{part}.git", "r24.10")
    ort = tmp_path / "src" / "onnxruntime"
    (ort / "include" / "onnxruntime" / "core").mkdir(parents=True)
    _writable_copy(ref / "onnxruntime-headers-1.21", ort / "include" / "onnxruntime" / "core" / "session")
    (ort / "onnxruntime" / "core").mkdir(parents=True)
    (ort / "onnxruntime" / "core" / "big.cc").write_text("// not part of the sparse checkout\n")
    _bare_repo(ort, base / "onnxruntime.git", "v1.21.0", tag=True)
    return base


def test_no_vendor_and_no_network_names_both_ways(isolated, monkeypatch):
    fake = isolated / "bin"
    fake.mkdir()
    (fake / "git").write_text("#!/bin/sh\necho 'fatal: unable to access github.com' >&2\nexit 128\n")
    (fake / "git").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(ProvisionError) as err:
        triton_ort.vendor_sources()
    message = str(err.value)
    assert "LINNET_TRITON_VENDOR" in message and str(isolated / "vendor") in message  # way 1
    assert "network access to github.com" in message and "r24.10" in message  # way 2
    assert "exited 128" in message  # why the fetch failed
    cache = isolated / "cache" / "linnet" / "triton-vendor"
    assert not (cache / "triton-r24.10").exists() or not any((cache / "triton-r24.10").iterdir())


def test_unreachable_git_base_names_both_ways(isolated, monkeypatch):
    monkeypatch.setenv("LINNET_TRITON_GIT_BASE", f"file://{isolated}/nowhere")
    with pytest.raises(ProvisionError, match="LINNET_TRITON_VENDOR") as err:
        triton_ort.vendor_sources()
    assert "github.com" in str(err.value)


def test_fetch_clones_the_pinned_branch_patches_it_and_lands_in_the_cache(isolated, monkeypatch):
    base = _upstream(isolated)
    monkeypatch.setenv("LINNET_TRITON_GIT_BASE", f"file://{base}")
    monkeypatch.setenv("LINNET_ORT_GIT_URL", f"file://{base}/onnxruntime.git")
    got = triton_ort.vendor_sources()
    cache = isolated / "cache" / "linnet" / "triton-vendor"
    assert got == cache
    ref = _reference()
    for part in triton_ort.TRITON_PARTS:
        fetched = cache / "triton-r24.10" / part
        assert not (fetched / ".git").exists() and not (fetched / "DECOY").exists()
        # byte for byte the verified (patched) vendored tree, compared without the harness's hash
        pending = [filecmp.dircmp(fetched, ref / "triton-r24.10" / part)]
        while pending:
            cmp = pending.pop()
            assert not cmp.left_only and not cmp.right_only and not cmp.funny_files, (part, cmp.left)
            _, mismatch, errors = filecmp.cmpfiles(cmp.left, cmp.right, cmp.common_files, shallow=False)
            assert not mismatch and not errors, (part, cmp.left, mismatch, errors)
            pending.extend(cmp.subdirs.values())
    assert "# add_subdirectory(test)" in (cache / "triton-r24.10/common/src/CMakeLists.txt").read_text()
    headers = cache / "onnxruntime-headers-1.21"
    assert filecmp.cmp(headers / "onnxruntime_c_api.h", ref / "onnxruntime-headers-1.21" / "onnxruntime_c_api.h",
                       shallow=False)
    assert not (headers / "big.cc").exists()
    # the build reads its sources from here: nothing it checks for is missing
    assert triton_ort._missing(got) == []
    # a second call reuses the cache without git
    monkeypatch.setenv("LINNET_TRITON_GIT_BASE", f"file://{isolated}/nowhere")
    assert triton_ort.vendor_sources() == cache


def test_fetched_tree_that_differs_from_the_verified_one_is_refused(isolated, monkeypatch):
    def edit(part, tree):
        if part == "backend":
            (tree / "src" / "extra.cc").write_text("// a moved branch\n")

    base = _upstream(isolated, edit)
    monkeypatch.setenv("LINNET_TRITON_GIT_BASE", f"file://{base}")
    monkeypatch.setenv("LINNET_ORT_GIT_URL", f"file://{base}/onnxruntime.git")
    with pytest.raises(ProvisionError, match="backend tree .* content hash .* expected"):
        triton_ort.vendor_sources()
    assert not (isolated / "cache" / "linnet" / "triton-vendor" / "triton-r24.10" / "backend").exists()
