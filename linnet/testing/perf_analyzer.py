"""Triton's own load client, `perf_analyzer`, provisioned from PyPI and run on loopback.

`tritonclient==2.51.0` (the release of the `tritonserver` in `triton_server`) ships a
`bin/perf_analyzer` built for this glibc; the 2.58+ `perf-analyzer` wheels need glibc 2.38.
It is installed with `pip install --no-deps --target` into the tool folder, never into the
running environment (which keeps its own newer tritonclient).  It needs `libb64.so.0d`
(Debian's `libb64-0d`) and `libcudart.so.12`: the nvidia-pytriton wheel already bundles that
runtime (renamed by auditwheel), so a symlink under the expected name stands in for PyPI's
`nvidia-cuda-runtime-cu12`.

    figures = measure(tools, server.grpc_url, "all-minilm-l6-v2", inputs, concurrency=4, batch=8)
    figures.infer_per_s, figures.p50_ms, figures.p99_ms    # from perf_analyzer's own CSV report

`inputs` are real arrays (one batch row each), written to perf_analyzer's `--input-data`
JSON, so the validating step of a Linnet export sees in-range ids, not random ones.
"""
from __future__ import annotations

import csv
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .triton_server import ProvisionError, ServerTools, _run

TRITONCLIENT = "tritonclient==2.51.0"


@dataclass(frozen=True)
class LoadFigures:
    concurrency: int
    batch: int
    infer_per_s: float  # perf_analyzer's "Inferences/Second": batch rows per second
    p50_ms: float
    p99_ms: float

    def to_json(self) -> dict:
        return dict(self.__dict__)


def provision_perf_analyzer(tools: ServerTools) -> tuple[Path, dict[str, str]]:
    """(perf_analyzer, the environment it runs in), installed once into `tools.root`."""
    root = tools.root / "perf-analyzer"
    binary = root / "tritonclient-2.51.0.data" / "data" / "bin" / "perf_analyzer"
    libs = root / "lib"
    try:
        root.mkdir(parents=True, exist_ok=True)
        with open(root / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not binary.is_file():
                log = root / "provision.log"
                wheels = root / "wheel"
                _run("pip download tritonclient 2.51.0", [sys.executable, "-m", "pip", "download", "--no-deps",
                                                          "--disable-pip-version-check", "-d", str(wheels),
                                                          TRITONCLIENT], log)
                wheel = next(wheels.glob("tritonclient-2.51.0-*.whl"), None)
                if wheel is None:
                    raise ProvisionError(f"pip downloaded no {TRITONCLIENT} wheel into {wheels}")
                # Unpacked, not installed: only the binary is used.
                _run("unpack the wheel", [sys.executable, "-m", "zipfile", "-e", str(wheel), str(root)], log)
                shutil.rmtree(wheels)
                if not binary.is_file():
                    raise ProvisionError(f"{TRITONCLIENT} has no {binary.relative_to(root)}: its layout changed")
                binary.chmod(binary.stat().st_mode | 0o111)
            cudart = sorted(tools.libs.glob("libcudart-*.so.12*"))
            if not cudart:
                raise ProvisionError(f"no libcudart in {tools.libs}; pip install nvidia-cuda-runtime-cu12 and put its "
                                     "lib folder on LD_LIBRARY_PATH")
            libs.mkdir(exist_ok=True)
            link = libs / "libcudart.so.12"
            if not link.exists():
                link.symlink_to(cudart[0])
    except OSError as exc:
        raise ProvisionError(f"installing perf_analyzer into {root} failed: {exc}") from exc
    if not any(Path(d, "libb64.so.0d").exists() for d in ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu",
                                                          "/usr/lib", "/usr/local/lib")):
        raise ProvisionError("perf_analyzer needs libb64.so.0d: apt-get install -y libb64-0d")
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(libs), env.get("LD_LIBRARY_PATH", "")) if p)
    return binary, env


def _input_data(inputs, folder: Path) -> Path:
    """perf_analyzer's --input-data JSON: one entry per batch row (it sends `batch` of them).
    `inputs`: arrays whose rows are the entries, or a list of entries (name -> one row's
    array), which may differ in shape (variable-length texts for a ragged model)."""
    if isinstance(inputs, dict):
        rows = next(iter(inputs.values())).shape[0]
        inputs = [{name: array[row] for name, array in inputs.items()} for row in range(rows)]
    data = [{name: {"content": np.asarray(array).reshape(-1).tolist(), "shape": list(np.shape(array))}
             for name, array in entry.items()} for entry in inputs]
    path = folder / "input.json"
    path.write_text(json.dumps({"data": data}), encoding="utf-8")
    return path


def measure(tools: ServerTools, grpc_url: str, model: str, inputs, *, concurrency: int,
            batch: int, measurement_ms: int = 10000, timeout: float = 900, max_trials: int = 6) -> LoadFigures:
    """One perf_analyzer run at `concurrency` requests in flight, each of `batch` rows.
    RuntimeError when perf_analyzer fails, as when no `max_trials` windows agree within 60%."""
    binary, env = provision_perf_analyzer(tools)
    with tempfile.TemporaryDirectory(prefix="perf-analyzer-") as work:
        folder = Path(work)
        report = folder / "report.csv"
        command = [str(binary), "-m", model, "-u", grpc_url, "-i", "grpc", "-b", str(batch),
                   "--concurrency-range", f"{concurrency}:{concurrency}", "--input-data",
                   str(_input_data(inputs, folder)), "-p", str(measurement_ms),
                   # On 2 shared cores the default stability rule may never converge.
                   "-s", "60", "--max-trials", str(max_trials), "-f", str(report)]
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout, check=False)
        if result.returncode != 0 or not report.exists():
            raise RuntimeError(f"perf_analyzer failed (exit {result.returncode}): "
                               f"{(result.stdout + result.stderr)[-2000:]}")
        with open(report, newline="", encoding="utf-8") as f:
            row = next(csv.DictReader(f))
    return LoadFigures(concurrency, batch, round(float(row["Inferences/Second"]), 2),
                       round(float(row["p50 latency"]) / 1000, 2), round(float(row["p99 latency"]) / 1000, 2))
