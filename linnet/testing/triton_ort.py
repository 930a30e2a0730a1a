"""Triton's ONNX Runtime backend, built from the vendored upstream sources for the test server.

No registry ships `libtriton_onnxruntime.so` for this kind of machine, and the `tritonserver`
from `nvidia-pytriton` (see `triton_server`) carries only the Python backend.  The upstream
sources of the matching release (Triton r24.10, backend API 1.19) and ONNX Runtime's C
headers lie in `../shared/vendor` beside the repository (`$LINNET_TRITON_VENDOR` overrides
it); `build_onnxruntime_backend(tools)` compiles the backend from there with cmake and ninja
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
import json
import os
import shutil
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


def _check_build_tools(vendor: Path) -> None:
    missing = [tool for tool in ("cmake", "ninja", "g++") if shutil.which(tool) is None]
    rapidjson = [Path("/usr/include/rapidjson/rapidjson.h"), Path("/usr/local/include/rapidjson/rapidjson.h")]
    if not any(p.is_file() for p in rapidjson):
        missing.append("rapidjson headers")
    if missing:
        raise ProvisionError(f"building Triton's ONNX Runtime backend needs {', '.join(missing)}, not found on "
                             f"this machine; install them with: {INSTALL_HINT}")
    needed = [vendor / "triton-r24.10" / part for part in ("onnxruntime_backend", "backend", "core", "common")]
    needed.append(vendor / "onnxruntime-headers-1.21" / "onnxruntime_c_api.h")
    absent = [str(p) for p in needed if not p.exists()]
    if absent:
        raise ProvisionError(f"the vendored Triton {TRITON_BRANCH} sources are not where expected ({vendor}); "
                             f"missing {', '.join(absent)}. Set LINNET_TRITON_VENDOR to the folder that "
                             "holds triton-r24.10/ and onnxruntime-headers-1.21/")


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
    vendor = Path(vendor) if vendor is not None else vendor_dir()
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
                _check_build_tools(vendor)
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
