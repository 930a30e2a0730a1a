"""The workload every method runs, its inputs, and a description of the machine."""
from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import asdict, dataclass
from importlib import metadata

import numpy as np

#: Token ids used for the start and end of each sequence ([CLS] and [SEP] of BERT's vocab).
CLS, SEP = 101, 102


@dataclass(frozen=True)
class Workload:
    device: str = "cpu"
    seq: int = 128
    latency_batch: int = 1
    throughput_batch: int = 8
    warmup: int = 3            # untimed calls per shape after loading (compilation happens here)
    rounds: int = 8            # interleaved rounds: every method once per round, in a fixed order
    latency_iters: int = 10    # timed B=latency_batch calls per method per round
    throughput_iters: int = 3  # timed B=throughput_batch calls per method per round
    seed: int = 0
    triton_concurrency: int = 2  # requests in flight while measuring Triton's throughput
    perf_concurrency: tuple[int, ...] = (1, 4, 16)  # perf_analyzer's requests in flight (Triton methods)
    perf_measurement_ms: int = 10000  # perf_analyzer's measurement window
    rss: bool = True           # peak RSS from a probe subprocess per method (CPU only)

    def describe(self) -> dict:
        d = asdict(self)
        d["latency"] = (f"median wall time of one call at B={self.latency_batch}, S={self.seq}, over "
                        f"{self.rounds} rounds x {self.latency_iters} calls")
        d["throughput"] = (f"sequences/s at B={self.throughput_batch}, S={self.seq}: per round "
                           f"{self.throughput_iters} calls timed together, median over rounds")
        d["inputs"] = ("random token ids (seeded), [CLS] first and [SEP] last, token types 0 then 1 from the "
                       "middle, attention_mask all ones passed explicitly to every method; no padding")
        return d

    @classmethod
    def quick(cls, device: str = "cpu") -> "Workload":
        return cls(device=device, warmup=1, rounds=1, latency_iters=2, throughput_iters=1, triton_concurrency=2,
                   perf_concurrency=(1,), perf_measurement_ms=3000)


@dataclass(frozen=True)
class Batch:
    tokens: np.ndarray       # [B, S] int32
    token_types: np.ndarray  # [B, S] int32
    mask: np.ndarray         # [B, S] int32, all ones

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])


def make_batch(batch: int, seq: int, seed: int) -> Batch:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1000, 30000, (batch, seq)).astype(np.int32)
    tokens[:, 0], tokens[:, -1] = CLS, SEP
    types = np.zeros((batch, seq), np.int32)
    types[:, seq // 2:] = 1
    return Batch(tokens, types, np.ones((batch, seq), np.int32))


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def environment(device: str) -> dict:
    import torch

    env = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "torch": torch.__version__,
        "jax": _version("jax"),
        "transformers": _version("transformers"),
        "onnxruntime": _version("onnxruntime") or _version("onnxruntime-gpu"),
        "onnx": _version("onnx"),
        "linnet": _version("linnet"),
        "load_average_at_start": load_average(),
    }
    if device == "cuda" and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["gpus"] = str(torch.cuda.device_count())
        try:
            env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                           capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
        except (OSError, IndexError, subprocess.SubprocessError):
            pass
    return env
