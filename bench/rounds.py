"""What one round of one method does in each workload, and the checks of each workload's outputs.

`bench.cli` drives the phases; these are the per-workload pieces it calls: `run_round` (the
timed calls of one method in one round), `check_varlen` and `check_corpus` (outputs against
the reference's and the anchor's), and the CUDA allocator bookkeeping every phase shares.
`r` is a `bench.cli.Record`.
"""
from __future__ import annotations

import contextlib
import time

import numpy as np

log = print


# ------------------------------------------------------------------ CUDA memory bookkeeping


def cuda_allocated() -> int:
    import torch

    torch.cuda.synchronize()
    return torch.cuda.memory_allocated()


@contextlib.contextmanager
def cuda_phase(record, device: str):
    """Peak torch allocator bytes of one phase of one method, over what was allocated before it."""
    if device != "cuda":
        yield
        return
    import torch

    start = cuda_allocated()
    torch.cuda.reset_peak_memory_stats()
    yield
    torch.cuda.synchronize()
    record.cuda_peak = max(record.cuda_peak, torch.cuda.max_memory_allocated() - start)


def run_round(r, round_: int, workload, fixed, varlen, texts: list[str]) -> None:
    """One round of one method: each workload it runs, in turn."""
    device = workload.device
    if r.runs("fixed"):
        small_p, big_p = fixed
        try:
            with cuda_phase(r, device):
                for _ in range(workload.latency_iters):
                    t = time.perf_counter()
                    r.method.run(small_p)
                    r.latencies.append(time.perf_counter() - t)
                seconds = r.method.throughput(big_p, workload.throughput_iters)
                calls = getattr(r.method, "throughput_calls", lambda n: n)(workload.throughput_iters)
                r.throughputs.append(calls * workload.throughput_batch / seconds)
        except Exception as exc:  # noqa: BLE001
            r.fail(f"round {round_ + 1}", exc)
    if r.runs("varlen"):
        try:
            with cuda_phase(r, device):
                for _ in range(workload.varlen_iters):
                    t = time.perf_counter()
                    r.method.run(varlen)
                    r.varlen_times.append(time.perf_counter() - t)
        except Exception as exc:  # noqa: BLE001
            r.drop("varlen", f"round {round_ + 1}", exc)
    if r.runs("corpus") and round_ < workload.corpus_rounds:
        try:
            with cuda_phase(r, device):
                t = time.perf_counter()
                r.method.encode(texts)
                r.corpus_rates.append(len(texts) / (time.perf_counter() - t))
        except Exception as exc:  # noqa: BLE001
            r.drop("corpus", f"round {round_ + 1}", exc)


def max_diff(got: np.ndarray, want: np.ndarray, where: np.ndarray | None = None) -> float:
    """max |got - want| in float64, over the positions `where` (a [B, S] mask) when given."""
    if got.shape != want.shape:
        raise ValueError(f"output has shape {got.shape}, the reference's is {want.shape}")
    got = got.astype(np.float64)
    if where is not None:
        got, want = got[where], want[where]
    return float(np.max(np.abs(got - want)))


def check_varlen(records: list, prepared: dict, mask: np.ndarray) -> None:
    """varlen_max_abs_diff: each method's hidden state at the real tokens of the variable-length
    batch against the reference's (padded positions differ by design: packing returns 0 there)."""
    from .methods import REFERENCE

    reference = next((r for r in records if r.method.key == REFERENCE and r.runs("varlen")), None)
    if reference is None:
        return
    try:
        want = reference.method.hidden(reference.method.run(prepared[REFERENCE])).astype(np.float64)
    except Exception as exc:  # noqa: BLE001
        reference.drop("varlen", "check", exc)
        return
    for r in records:
        if r.runs("varlen"):
            try:
                got = r.method.hidden(r.method.run(prepared[r.method.key]))
                r.metrics["varlen_max_abs_diff"] = max_diff(got, want, mask)
            except Exception as exc:  # noqa: BLE001
                r.drop("varlen", "check", exc)


def check_corpus(records: list, texts: list[str], anchor_key: str) -> None:
    """One untimed encode of the corpus per method (the warm-up; JAX compiles each batch width
    here); corpus_max_abs_diff is the largest embedding difference from the anchor's."""
    encoders = [r for r in records if r.runs("corpus")]
    anchor = next((r for r in encoders if r.method.key == anchor_key), None)
    want = None
    for r in ([anchor] if anchor else []) + [r for r in encoders if r is not anchor]:
        t = time.perf_counter()
        try:
            got = np.asarray(r.method.encode(texts), dtype=np.float64)
            if r is anchor:
                want = got
            if want is not None:
                r.metrics["corpus_max_abs_diff"] = max_diff(got, want)
        except Exception as exc:  # noqa: BLE001
            r.drop("corpus", "corpus warm-up", exc)
            continue
        log(f"  encoded the corpus with {r.method.key} ({time.perf_counter() - t:.1f} s, untimed)")
