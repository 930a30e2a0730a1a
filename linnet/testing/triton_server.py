"""A real Triton Inference Server for tests and benchmarks, provisioned from PyPI.

Triton is not a Python package, but PyPI's `nvidia-pytriton` wheel bundles the real
`tritonserver` binary (Triton 2.51 in 0.7.0) with its Python backend (no ONNX Runtime
backend).  Two facts shape everything below:

* The wheel declares `numpy<2`, while Linnet's environment needs numpy 2.  The binary needs
  none of the wheel's Python dependencies, so it is installed with `--no-deps --target` into
  a tool folder, never into the running environment, and is never imported.
* The Python backend's stub (the process that runs a model's `model.py`) returns empty
  outputs under numpy 2, so it runs from a small venv of its own with `numpy<2` and the same
  onnxruntime as the main environment.  That venv's `bin` goes first on the server's `PATH`.

`provision()` does both once per machine into `$LINNET_TOOLS` (default
`~/.cache/linnet/tools/triton-2.51`), under a lock so parallel test runs do not race, and
raises `ProvisionError` with the failing step and its output when something goes wrong.
`TritonServer(repo, tools)` starts the server on free loopback ports, waits for readiness,
keeps its log in a file and always stops it.
"""
from __future__ import annotations

import contextlib
import ctypes.util
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

PYTRITON = "nvidia-pytriton==0.7.0"
TRITON_VERSION = "2.51"
#: numpy for the stub's venv: the Triton 2.51 stub needs the numpy 1 C API.
STUB_NUMPY = "numpy<2"
STUB_PYTHONS = ("3.8", "3.9", "3.10", "3.11", "3.12", "3.13")
#: Bump when the layout of the tool folder changes, so old folders are redone.
LAYOUT = 1


class ProvisionError(RuntimeError):
    """The Triton tools could not be installed; the message says which step failed and why."""


class ServerError(RuntimeError):
    """The server did not start or become ready; the message carries the end of its log."""


@dataclass(frozen=True)
class ServerTools:
    root: Path
    tritonserver: Path  # the binary
    backends: Path  # --backend-directory: python/ with libtriton_python.so and the stub
    libs: Path  # the wheel's bundled shared libraries (libtritonserver, ...)
    stub_venv: Path  # Python with numpy<2 and onnxruntime, for the Python backend's stub
    seconds: float  # time provision() took in this process (0 when already done)

    def env(self) -> dict[str, str]:
        """The environment the server needs: bundled libs + libpython found, stub venv first."""
        env = dict(os.environ)
        libdirs = [str(self.libs), sysconfig.get_config_var("LIBDIR") or ""]
        if env.get("LD_LIBRARY_PATH"):
            libdirs.append(env["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = os.pathsep.join(d for d in libdirs if d)
        env["PATH"] = os.pathsep.join([str(self.stub_venv / "bin"), env.get("PATH", "")])
        env["VIRTUAL_ENV"] = str(self.stub_venv)
        # The stub must see the venv's packages only, not the main environment's numpy 2.
        for name in ("PYTHONPATH", "PYTHONHOME"):
            env.pop(name, None)
        env["PYTHONNOUSERSITE"] = "1"
        return env


def tools_dir() -> Path:
    default = Path.home() / ".cache" / "linnet" / "tools" / f"triton-{TRITON_VERSION}"
    return Path(os.environ.get("LINNET_TOOLS") or default)


def _run(step: str, cmd: list[str], log: Path, **kwargs) -> None:
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        result = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, **kwargs)
    if result.returncode != 0:
        tail = log.read_text(encoding="utf-8", errors="replace")[-3000:]
        raise ProvisionError(f"provisioning Triton failed at step '{step}' (exit {result.returncode}); "
                             f"full log: {log}\n{tail}")


def _ort_requirement() -> str:
    """The same onnxruntime the main environment has, so served and local numbers agree."""
    try:
        from importlib.metadata import version

        return f"onnxruntime=={version('onnxruntime')}"
    except Exception:  # noqa: BLE001 - not installed here: any release with a 3.11 wheel
        return "onnxruntime"


def _tools(root: Path, seconds: float) -> ServerTools:
    return ServerTools(root=root, tritonserver=root / "pytriton" / "pytriton" / "tritonserver" / "bin" / "tritonserver",
                       backends=root / "backends", libs=root / "pytriton" / "nvidia_pytriton.libs",
                       stub_venv=root / "stub-venv", seconds=seconds)


def provision(root: Path | None = None) -> ServerTools:
    """Install the Triton binary and the stub's venv once; later calls return at once."""
    root = Path(root) if root is not None else tools_dir()
    started = time.perf_counter()
    # The stub links against libpython; the running interpreter's is the one known to be
    # here (sysconfig LIBDIR), so the stub and its venv use this Python's version.
    minor = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if minor not in STUB_PYTHONS:
        raise ProvisionError(f"{PYTRITON} ships Python-backend stubs for Python {', '.join(STUB_PYTHONS)}, "
                             f"not for this Python {minor}")
    libdir = Path(sysconfig.get_config_var("LIBDIR") or "/nonexistent")
    if not (libdir / f"libpython{minor}.so.1.0").exists() and ctypes.util.find_library(f"python{minor}") is None:
        raise ProvisionError(f"the Python-backend stub needs libpython{minor}.so.1.0, which this Python lacks "
                             f"(not in {libdir}; a Python built without --enable-shared)")
    try:
        return _provision(root, minor, started)
    except OSError as exc:  # a folder that cannot be written, a full disk: say where
        raise ProvisionError(f"provisioning Triton into {root} failed: {exc} "
                             "(set LINNET_TOOLS to a writable folder)") from exc


def _provision(root: Path, minor: str, started: float) -> ServerTools:
    root.mkdir(parents=True, exist_ok=True)
    marker = root / "ready.json"
    want = {"layout": LAYOUT, "pytriton": PYTRITON, "python": minor, "onnxruntime": _ort_requirement(),
            "numpy": STUB_NUMPY}
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second run waits here until the first is done
        if marker.exists() and json.loads(marker.read_text()) == want:
            return _tools(root, 0.0)
        log = root / "provision.log"
        log.write_text(f"provisioning {want}\n", encoding="utf-8")
        for stale in ("pytriton", "backends", "stub-venv"):
            shutil.rmtree(root / stale, ignore_errors=True)
        marker.unlink(missing_ok=True)
        tools = _tools(root, 0.0)

        _run("pip install nvidia-pytriton", [sys.executable, "-m", "pip", "install", "--no-deps",
                                             "--disable-pip-version-check", "--target", str(root / "pytriton"),
                                             PYTRITON], log)
        package = root / "pytriton" / "pytriton" / "tritonserver"
        stub = package / "python_backend_stubs" / minor / "triton_python_backend_stub"
        for needed in (tools.tritonserver, package / "backends" / "python", stub, tools.libs):
            if not needed.exists():
                raise ProvisionError(f"{PYTRITON} installed, but {needed} is missing: the wheel's layout changed")
        shutil.copytree(package / "backends", tools.backends)
        shutil.copy2(stub, tools.backends / "python" / "triton_python_backend_stub")
        for exe in (tools.tritonserver, tools.backends / "python" / "triton_python_backend_stub"):
            exe.chmod(exe.stat().st_mode | 0o111)

        _run("create the stub venv", [sys.executable, "-m", "venv", str(tools.stub_venv)], log)
        _run("install numpy<2 and onnxruntime into the stub venv",
             [str(tools.stub_venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check",
              STUB_NUMPY, want["onnxruntime"]], log)
        _run("import check in the stub venv",
             [str(tools.stub_venv / "bin" / "python"), "-c", "import numpy, onnxruntime; "
              "assert numpy.__version__ < '2', numpy.__version__"], log)
        marker.write_text(json.dumps(want), encoding="utf-8")
        return _tools(root, time.perf_counter() - started)


# --------------------------------------------------------------------------- server


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening_sockets(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state held by `pid` or its children.

    Read from /proc (Linux), so it needs no tool and sees exactly what the kernel sees.
    """
    pids = {pid}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    pids.add(int(entry.name))
    inodes = set()
    for p in pids:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{p}/fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
    found = []
    for table, width in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] != "0A" or fields[9] not in inodes:  # 0A: TCP_LISTEN
                    continue
                hexaddr, hexport = fields[1].split(":")
                raw = bytes.fromhex(hexaddr)
                # /proc prints each 32-bit word in host (little-endian) order.
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                family = socket.AF_INET if width == 4 else socket.AF_INET6
                found.append((socket.inet_ntop(family, raw), int(hexport, 16)))
    return found


class TritonServer:
    """`with TritonServer(repo, tools) as server:` a ready server on free 127.0.0.1 ports.

    `server.http_url` / `server.grpc_url` are "127.0.0.1:PORT" (what tritonclient takes),
    `server.start_seconds` the time from launch to ready, `server.log_path` its log.  The
    server is stopped on exit (SIGTERM, then SIGKILL) whatever happened.  Close clients
    before leaving the block: an open keep-alive connection holds up shutdown.
    """

    def __init__(self, repo: Path, tools: ServerTools, *, log_path: Path | None = None,
                 ready_timeout: float = 120.0, exit_timeout: int = 5, extra_args: tuple[str, ...] = ()):
        self.repo = Path(repo)
        self.tools = tools
        self.log_path = Path(log_path) if log_path is not None else self.repo.parent / "tritonserver.log"
        self.ready_timeout = ready_timeout
        self.exit_timeout = exit_timeout
        self.extra_args = tuple(extra_args)
        self.process: subprocess.Popen | None = None
        self.start_seconds: float | None = None
        self.http_port = self.grpc_port = self.metrics_port = 0

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def command(self) -> list[str]:
        return [str(self.tools.tritonserver), f"--model-repository={self.repo}",
                f"--backend-directory={self.tools.backends}",
                "--http-address=127.0.0.1", f"--http-port={self.http_port}",
                "--grpc-address=127.0.0.1", f"--grpc-port={self.grpc_port}",
                "--metrics-address=127.0.0.1", f"--metrics-port={self.metrics_port}",
                # Serve each config exactly as written: a config Triton had to complete
                # would pass here and differ elsewhere.
                "--disable-auto-complete-config",
                "--allow-gpu-metrics=false", f"--exit-timeout-secs={self.exit_timeout}",
                "--log-verbose=0", *self.extra_args]

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def start(self) -> "TritonServer":
        self.http_port, self.grpc_port, self.metrics_port = free_port(), free_port(), free_port()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        with open(self.log_path, "w", encoding="utf-8") as log:
            # A session of its own, so stopping it never signals the test runner.
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                            env=self.tools.env(), start_new_session=True)
        try:
            self._wait_ready(started)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.perf_counter() - started
        return self

    def _wait_ready(self, started: float) -> None:
        url = f"http://{self.http_url}/v2/health/ready"
        while True:
            code = self.process.poll()
            if code is not None:
                raise ServerError(f"tritonserver exited with {code} before it was ready; log {self.log_path}:\n"
                                  f"{self.log_tail()}")
            with contextlib.suppress(OSError, urllib.error.URLError):
                with urllib.request.urlopen(url, timeout=2) as answer:
                    if answer.status == 200:
                        return
            if time.perf_counter() - started > self.ready_timeout:
                raise ServerError(f"tritonserver was not ready after {self.ready_timeout:.0f} s; "
                                  f"log {self.log_path}:\n{self.log_tail()}")
            time.sleep(0.2)

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=self.exit_timeout + 15)
        except subprocess.TimeoutExpired:
            # Its own process group: the Python backend's stubs go with it.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def __enter__(self) -> "TritonServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
