"""Triton's ONNX Runtime backend, built from the vendored upstream sources for the test server.

No registry ships `libtriton_onnxruntime.so` for this kind of machine, and the `tritonserver`
from `nvidia-pytriton` (see `triton_server`) carries only the Python backend.  The upstream
sources of the matching release (Triton r24.10, backend API 1.19) and ONNX Runtime's C
headers lie in `../shared/vendor` beside the repository (`$LINNET_TRITON_VENDOR` overrides
it).  Where that folder lacks them, `vendor_sources()` fetches them with git into
`~/.cache/linnet/triton-vendor` (`$XDG_CACHE_HOME` honoured): the four Triton trees from
branch r24.10 (`$LINNET_TRITON_GIT_BASE` overrides github.com/triton-inference-server), each
checked against the content hash of the verified tree after the one patch, and ONNX Runtime's
`include/onnxruntime/core/session` from tag v1.21.0 by sparse checkout (`$LINNET_ORT_GIT_URL`
overrides the repository); the onnxruntime wheel ships no headers.  `build_onnxruntime_backend(tools)` compiles the backend from there with cmake and ninja
(about 20 CPU-seconds), against the `libonnxruntime.so` of the installed `onnxruntime` wheel,
and lays it out where the server looks for it:

    <tools>/backends/onnxruntime  ->  <tools>/onnxruntime-backend/ort-<version>/
        libtriton_onnxruntime.so
        libonnxruntime.so.<version>, libonnxruntime.so.1 -> it
        libtritonserver.so -> the wheel's nvidia_pytriton.libs/libtritonserver-*.so

The build is keyed by the onnxruntime version because the backend binds that library's
versioned symbols (`OrtGetApiBase@VERS_1.32.0`); a new onnxruntime gets a new build.  The
vendored sources are read in place, never copied.  A missing tool raises `ProvisionError`
naming the Debian packages to install.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from .triton_server import ProvisionError, ServerTools, _run

#: Debian packages the build needs (and `libb64-0d` for perf_analyzer).
APT_PACKAGES = ("cmake", "g++", "ninja-build", "rapidjson-dev", "libb64-0d")
INSTALL_HINT = f"apt-get update && apt-get install -y {' '.join(APT_PACKAGES)}"
#: The Triton branch the vendored sources are from; it must match the server's 2.51.
TRITON_BRANCH = "r24.10"
#: Bump when the build's layout or flags change, so old builds are redone.
LAYOUT = 1


#: The four Triton trees the build reads, by folder under `triton-r24.10/`.
TRITON_PARTS = ("onnxruntime_backend", "backend", "core", "common")
#: Upstream records no commit for the vendored trees (they carry no `.git`), so the fetch pins
#: branch r24.10 and checks each tree (without `.git`, after the patch) against the content hash
#: (`tree_hash`) of the vendored tree that the verified build used.
TRITON_TREE_SHA256 = {
    "onnxruntime_backend": "e3d57a5a6ce08339d0ab0dae91351a769a8b6a6ab04aab507f1ea504a0aaf79c",
    "backend": "2700d47b656755ec8d0f147711ff867dff780176833d1affb5a4b8bc4558d368",
    "core": "c4e2eb33100b05a841a31e5b3521d5a57fee47382b43bf19db7203142504cda5",
    "common": "172de63d0a435fd6886079dc38e6ddccdbc5a185f7f3725dd02c38e258a8a47f",
}
#: The one patch: common's tests download googletest at configure time.
PATCH_FILE = "src/CMakeLists.txt"
PATCH_FROM = "add_subdirectory(test)"
PATCH_TO = "# add_subdirectory(test)  # disabled: needs googletest download"
#: ONNX Runtime's C API headers: this release tag's `include/onnxruntime/core/session`.
ORT_HEADERS_TAG = "v1.21.0"
ORT_HEADERS_DIR = "include/onnxruntime/core/session"
ORT_API_VERSION = 21
GIT_BASE = "https://github.com/triton-inference-server"
ORT_GIT_URL = "https://github.com/microsoft/onnxruntime"


def tree_hash(root: Path) -> str:
    """sha256 over every file under `root` but `.git`: its posix path, NUL, its content's sha256."""
    digest = hashlib.sha256()
    files = sorted(p for p in root.rglob("*") if ".git" not in p.relative_to(root).parts[:1]
                   and (p.is_file() or p.is_symlink()))
    for path in files:
        content = os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
        digest.update(path.relative_to(root).as_posix().encode() + b"\0"
                      + hashlib.sha256(content).hexdigest().encode() + b"\n")
    return digest.hexdigest()


def cache_dir() -> Path:
    """Where fetched sources go: `$XDG_CACHE_HOME/linnet/triton-vendor`, else `~/.cache/...`."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "linnet" / "triton-vendor"


def _missing(vendor: Path) -> list[Path]:
    needed = [vendor / "triton-r24.10" / part for part in TRITON_PARTS]
    needed.append(vendor / "onnxruntime-headers-1.21" / "onnxruntime_c_api.h")
    return [p for p in needed if not p.exists()]


def _ways(vendor: Path) -> str:
    return (f"Provide them either way: (1) put the upstream trees in {vendor} (or set LINNET_TRITON_VENDOR to a "
            "folder) holding triton-r24.10/{onnxruntime_backend,backend,core,common} (common's "
            f"'{PATCH_FROM}' commented out) and onnxruntime-headers-1.21/onnxruntime_c_api.h; or (2) allow network "
            f"access to github.com so the harness can fetch branch {TRITON_BRANCH} of "
            "triton-inference-server/{onnxruntime_backend,backend,core,common} and onnxruntime "
            f"{ORT_HEADERS_TAG}'s {ORT_HEADERS_DIR} with git into {cache_dir()}")


def _git(args: list[str], cwd: Path | None = None) -> None:
    try:
        result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=600)
    except FileNotFoundError as exc:
        raise _FetchFailed("git is not installed") from exc
    except subprocess.TimeoutExpired as exc:
        raise _FetchFailed(f"git {' '.join(args)} took over 600 s") from exc
    if result.returncode != 0:
        raise _FetchFailed(f"git {' '.join(args)} exited {result.returncode}: {result.stderr.strip()[-600:]}")


class _FetchFailed(Exception):
    pass


def _fetch_triton_part(part: str, dest: Path, scratch: Path) -> None:
    base = os.environ.get("LINNET_TRITON_GIT_BASE") or GIT_BASE
    tree = scratch / part
    _git(["clone", "--quiet", "--depth", "1", "--branch", TRITON_BRANCH, f"{base.rstrip('/')}/{part}.git", str(tree)])
    shutil.rmtree(tree / ".git")
    if part == "common":
        cmake = tree / PATCH_FILE
        text = cmake.read_text(encoding="utf-8") if cmake.is_file() else ""
        if text.count(PATCH_FROM) != 1 or PATCH_TO in text:
            raise ProvisionError(f"the fetched common tree's {PATCH_FILE} should hold '{PATCH_FROM}' once, to comment "
                                 f"out; found it {text.count(PATCH_FROM)} times: upstream {TRITON_BRANCH} changed")
        cmake.write_text(text.replace(PATCH_FROM, PATCH_TO), encoding="utf-8")
    found = tree_hash(tree)
    if found != TRITON_TREE_SHA256[part]:
        raise ProvisionError(f"the fetched {part} tree (branch {TRITON_BRANCH}, patched) has content hash {found}, "
                             f"expected {TRITON_TREE_SHA256[part]} (the tree of the verified build): the branch moved "
                             "or the source is not upstream's; refusing to build from it")
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(dest, ignore_errors=True)
    tree.rename(dest)


def _fetch_ort_headers(dest: Path, scratch: Path) -> None:
    url = os.environ.get("LINNET_ORT_GIT_URL") or ORT_GIT_URL
    repo = scratch / "onnxruntime"
    _git(["clone", "--quiet", "--depth", "1", "--branch", ORT_HEADERS_TAG, "--filter=blob:none", "--sparse",
          url, str(repo)])
    _git(["sparse-checkout", "set", ORT_HEADERS_DIR], cwd=repo)
    headers = repo / ORT_HEADERS_DIR
    api = headers / "onnxruntime_c_api.h"
    text = api.read_text(encoding="utf-8", errors="replace") if api.is_file() else ""
    version = re.search(r"^#define ORT_API_VERSION (\d+)", text, re.M)
    if version is None or int(version.group(1)) != ORT_API_VERSION:
        raise ProvisionError(f"onnxruntime {ORT_HEADERS_TAG}'s {ORT_HEADERS_DIR}/onnxruntime_c_api.h should define "
                             f"ORT_API_VERSION {ORT_API_VERSION}; found "
                             f"{version.group(1) if version else 'no such header or define'}")
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(headers, dest)


def vendor_sources() -> Path:
    """The folder holding `triton-r24.10/` and `onnxruntime-headers-1.21/` for the build.

    `vendor_dir()` when it holds them all, else the cache, fetching what it lacks there.
    Without them and without a working fetch: `ProvisionError` naming both ways to provide them.
    """
    vendor = vendor_dir()
    if not _missing(vendor):
        return vendor
    cache = cache_dir()
    if not _missing(cache):
        return cache
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with open(cache / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            with tempfile.TemporaryDirectory(dir=cache, prefix=".fetch-") as scratch:
                for part in TRITON_PARTS:
                    if not (cache / "triton-r24.10" / part).exists():
                        _fetch_triton_part(part, cache / "triton-r24.10" / part, Path(scratch))
                if _missing(cache):
                    _fetch_ort_headers(cache / "onnxruntime-headers-1.21", Path(scratch))
    except _FetchFailed as exc:
        absent = ", ".join(str(p) for p in _missing(vendor))
        raise ProvisionError(f"the Triton {TRITON_BRANCH} sources for the ONNX Runtime backend are not in {vendor} "
                             f"(missing {absent}) and fetching them failed: {exc}. {_ways(vendor)}") from exc
    except OSError as exc:
        raise ProvisionError(f"fetching the Triton {TRITON_BRANCH} sources into {cache} failed: {exc}. "
                             f"{_ways(vendor)}") from exc
    return cache


def vendor_dir() -> Path:
    """`$LINNET_TRITON_VENDOR`, else `../shared/vendor` from the repository root."""
    configured = os.environ.get("LINNET_TRITON_VENDOR")
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parents[2].parent / "shared" / "vendor"


def _onnxruntime_library() -> tuple[str, Path]:
    """(version, path of libonnxruntime.so.<version>) of the installed onnxruntime wheel."""
    try:
        import onnxruntime
    except ModuleNotFoundError as exc:
        raise ProvisionError("the ONNX Runtime backend is built against the onnxruntime wheel, which is not "
                             "installed: pip install onnxruntime") from exc
    version = onnxruntime.__version__
    library = Path(onnxruntime.__file__).parent / "capi" / f"libonnxruntime.so.{version}"
    if not library.is_file():
        raise ProvisionError(f"onnxruntime {version} has no {library.name} in {library.parent}: "
                             "its wheel's layout changed")
    return version, library


def _check_build_tools() -> None:
    missing = [tool for tool in ("cmake", "ninja", "g++") if shutil.which(tool) is None]
    rapidjson = [Path("/usr/include/rapidjson/rapidjson.h"), Path("/usr/local/include/rapidjson/rapidjson.h")]
    if not any(p.is_file() for p in rapidjson):
        missing.append("rapidjson headers")
    if missing:
        raise ProvisionError(f"building Triton's ONNX Runtime backend needs {', '.join(missing)}, not found on "
                             f"this machine; install them with: {INSTALL_HINT}")


def _check_sources(vendor: Path) -> None:
    absent = [str(p) for p in _missing(vendor)]
    if absent:
        raise ProvisionError(f"the Triton {TRITON_BRANCH} sources are not where expected ({vendor}); "
                             f"missing {', '.join(absent)}. {_ways(vendor_dir())}")


def _link(link: Path, target: str) -> None:
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target)


def _configure_and_build(vendor: Path, version: str, library: Path, out: Path, log: Path) -> None:
    """cmake + ninja exactly as the vendor README says, in a scratch folder inside `out`."""
    ortlib = out / "ortlib"  # the folder cmake links against: the library under its three names
    ortlib.mkdir(parents=True)
    shutil.copy2(library, ortlib / library.name)
    _link(ortlib / "libonnxruntime.so.1", library.name)
    _link(ortlib / "libonnxruntime.so", library.name)
    triton = vendor / "triton-r24.10"
    build = out / "build"
    _run("cmake configure (ONNX Runtime backend)",
         ["cmake", "-S", str(triton / "onnxruntime_backend"), "-B", str(build), "-G", "Ninja",
          "-DCMAKE_BUILD_TYPE=Release", "-DTRITON_ENABLE_GPU=OFF",
          # Debian's rapidjson 1.1 trips the backend's -Werror with deprecation warnings.
          "-DCMAKE_CXX_FLAGS=-Wno-deprecated-declarations",
          f"-DTRITON_ONNXRUNTIME_INCLUDE_PATHS={vendor / 'onnxruntime-headers-1.21'}",
          f"-DTRITON_ONNXRUNTIME_LIB_PATHS={ortlib}",
          "-DFETCHCONTENT_FULLY_DISCONNECTED=ON",  # never download: every dependency is vendored
          f"-DFETCHCONTENT_SOURCE_DIR_REPO-COMMON={triton / 'common'}",
          f"-DFETCHCONTENT_SOURCE_DIR_REPO-CORE={triton / 'core'}",
          f"-DFETCHCONTENT_SOURCE_DIR_REPO-BACKEND={triton / 'backend'}"], log)
    _run("ninja libtriton_onnxruntime.so", ["ninja", "-C", str(build), "libtriton_onnxruntime.so"], log)


def _lay_out(tools: ServerTools, library: Path, out: Path) -> None:
    """The files the server loads, as the vendor README describes, beside the build scratch."""
    shutil.copy2(out / "build" / "libtriton_onnxruntime.so", out / "libtriton_onnxruntime.so")
    shutil.copy2(library, out / library.name)
    _link(out / "libonnxruntime.so.1", library.name)
    # One copy of the core library in the process: the backend resolves against the wheel's.
    cores = sorted(tools.libs.glob("libtritonserver-*.so"))
    if not cores:
        raise ProvisionError(f"no libtritonserver-*.so in {tools.libs}: the nvidia-pytriton wheel's layout changed")
    _link(out / "libtritonserver.so", str(cores[0]))
    shutil.rmtree(out / "build")
    shutil.rmtree(out / "ortlib")


def build_onnxruntime_backend(tools: ServerTools, vendor: Path | None = None) -> Path:
    """Build the backend once per onnxruntime version and link it into `tools.backends`.

    Returns the backend's folder.  A later call with the same versions returns at once.
    """
    version, library = _onnxruntime_library()
    cache = tools.root / "onnxruntime-backend"
    out = cache / f"ort-{version}"
    # Not keyed by where the sources lie: a second checkout reuses the build.
    want = {"layout": LAYOUT, "triton": TRITON_BRANCH, "onnxruntime": version}
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with open(cache / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # parallel test runs wait for one build
            marker = out / "ready.json"
            if not (marker.exists() and json.loads(marker.read_text()) == want):
                _check_build_tools()  # before the sources: a fetch is wasted without the tools
                vendor = Path(vendor) if vendor is not None else vendor_sources()
                _check_sources(vendor)
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir(parents=True)
                log = cache / f"build-{version}.log"
                log.write_text(f"building {want}\n", encoding="utf-8")
                started = time.perf_counter()
                _configure_and_build(vendor, version, library, out, log)
                _lay_out(tools, library, out)
                with open(log, "a", encoding="utf-8") as out_log:
                    out_log.write(f"built in {time.perf_counter() - started:.1f} s\n")
                marker.write_text(json.dumps(want), encoding="utf-8")
            # The server takes one --backend-directory: the python backend and this one side by side.
            _link(tools.backends / "onnxruntime", str(out))
    except OSError as exc:
        raise ProvisionError(f"building Triton's ONNX Runtime backend into {out} failed: {exc}") from exc
    return out


def provision_for(runtime: str) -> ServerTools:
    """The server's tools for serving `runtime`'s layout (`linnet.serving.triton.RUNTIMES`): the
    wheel's server and python backend, plus this backend for the onnxruntime layout."""
    from .triton_server import provision

    tools = provision()
    if runtime == "onnxruntime":
        build_onnxruntime_backend(tools)
    return tools
