"""The workload every method runs, its inputs, and a description of the machine."""
from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import asdict, dataclass
from importlib import metadata
from statistics import NormalDist

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
    # The variable-length batch: sentences of real-looking lengths padded to the longest.
    varlen_batch: int = 32     # sentences in the batch
    varlen_mean: float = 27.0  # mean length in tokens ([CLS] and [SEP] included)
    varlen_max: int = 60       # the longest sentence (the padded width)
    varlen_iters: int = 2      # timed calls per method per round
    # The corpus: model.encode / sentence-transformers' encode over standard-library docstrings.
    corpus_size: int = 2000    # texts
    corpus_batch: int = 32     # encode's batch_size, the same for every method
    corpus_max_length: int = 256  # tokens per text (sentence-transformers' cut for all-MiniLM-L6-v2)
    corpus_rounds: int = 2     # the first corpus_rounds rounds also time one encode of the corpus
    workloads: tuple[str, ...] = ("fixed", "varlen", "corpus")

    def describe(self) -> dict:
        d = asdict(self)
        d["latency"] = (f"median wall time of one call at B={self.latency_batch}, S={self.seq}, over "
                        f"{self.rounds} rounds x {self.latency_iters} calls")
        d["throughput"] = (f"sequences/s at B={self.throughput_batch}, S={self.seq}: per round "
                           f"{self.throughput_iters} calls timed together, median over rounds")
        d["inputs"] = ("random token ids (seeded), [CLS] first and [SEP] last, token types 0 then 1 from the "
                       "middle, attention_mask all ones passed explicitly to every method; no padding")
        if "varlen" in self.workloads:
            lengths = varlen_lengths(self.varlen_batch, self.varlen_mean, self.varlen_max)
            d["varlen_inputs"] = (f"{self.varlen_batch} sentences of random token ids, lengths at the quantiles of a "
                                  f"lognormal (mean {self.varlen_mean:g}, longest {self.varlen_max}) shuffled with "
                                  f"seed {self.seed}: mean {lengths.mean():.1f} tokens, "
                                  f"{padding_share(lengths):.0%} of the [{self.varlen_batch}, {lengths.max()}] "
                                  "positions are padding (mask 0, token id 0); one call per timing")
            d["varlen"] = (f"median wall time of one call on that batch, over {self.rounds} rounds x "
                           f"{self.varlen_iters} calls; outputs compared at real tokens only")
        if "corpus" in self.workloads:
            d["corpus"] = (f"texts/s of one encode of {self.corpus_size} texts at batch_size {self.corpus_batch} "
                           f"(max_length {self.corpus_max_length}), in each of the first {self.corpus_rounds} "
                           "rounds, median; sentence-transformers' encode is the anchor (normalized embeddings)")
        return d

    @classmethod
    def quick(cls, device: str = "cpu") -> Workload:
        return cls(device=device, warmup=1, rounds=1, latency_iters=2, throughput_iters=1, triton_concurrency=2,
                   perf_concurrency=(1,), perf_measurement_ms=3000, varlen_iters=1, corpus_size=64, corpus_rounds=1)


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


def varlen_lengths(batch: int, mean: float, longest: int) -> np.ndarray:
    """Sentence lengths at the midpoint quantiles of a lognormal with the given mean whose top
    quantile is `longest` (so the spread follows from mean and maximum; no sampling noise)."""
    z = np.array([NormalDist().inv_cdf((i + 0.5) / batch) for i in range(batch)])
    # log-mean mu and spread s with exp(mu + s^2/2) = mean and exp(mu + s * z_max) = longest.
    a, b = z[-1], np.log(longest) - np.log(mean)
    s = a - np.sqrt(max(a * a - 2 * b, 0.0)) if batch > 1 else 0.0
    mu = np.log(mean) - s * s / 2
    return np.clip(np.round(np.exp(mu + s * z)), 3, longest).astype(np.int64)


def padding_share(lengths: np.ndarray) -> float:
    return float(1 - lengths.sum() / (len(lengths) * lengths.max()))


def make_varlen_batch(batch: int, mean: float, longest: int, seed: int) -> Batch:
    """`batch` sentences of random ids, [CLS] ... [SEP], padded with id 0 to the longest."""
    rng = np.random.default_rng(seed)
    lengths = rng.permutation(varlen_lengths(batch, mean, longest))
    width = int(lengths.max())
    tokens = np.zeros((batch, width), np.int32)
    mask = np.zeros((batch, width), np.int32)
    for row, n in enumerate(lengths):
        tokens[row, :n] = rng.integers(1000, 30000, n)
        tokens[row, 0], tokens[row, n - 1] = CLS, SEP
        mask[row, :n] = 1
    return Batch(tokens, np.zeros((batch, width), np.int32), mask)


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _cpu_isa() -> list[str]:
    """The CPU's AVX-512 / AMX flags that matter for reduced-precision kernels (Linux)."""
    wanted = ("avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_int8")
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            flags = next((line.split(":", 1)[1].split() for line in info if line.startswith("flags")), [])
    except OSError:
        return []
    return [f for f in wanted if f in flags]


def environment(device: str) -> dict:
    import torch

    from linnet.backends.measured import cpu_model

    env = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "torch": torch.__version__,
        "jax": _version("jax"),
        "transformers": _version("transformers"),
        "onnxruntime": _version("onnxruntime") or _version("onnxruntime-gpu"),
        "onnx": _version("onnx"),
        "openvino": _version("openvino"),
        # What decides bf16 and int8 speed (and OpenVINO's default precision) on this CPU.
        "cpu_isa": _cpu_isa(),
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
