"""Concurrency: one loaded model shared by threads, and a real Triton server under load.

A model from `nest.load` is called from 8 threads at once (released together by a barrier)
with inputs of different shapes and entries; every result must equal the serial call's. The
Triton part (both export-triton layouts) sends 200 requests, 8 in flight, a third of them invalid, over HTTP and gRPC
(`linnet.testing.triton_load`, which `python -m linnet.testing.triton_load --requests 2000
--concurrency 16` runs at scale): none may be lost, every valid one must match the ONNX
backend, every invalid one must be refused naming its input, and the server must be
healthy afterwards.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from linnet import nest

MINILM = "all-minilm-l6-v2"
THREADS = 8


def _np(x) -> np.ndarray:
    return x.detach().numpy() if hasattr(x, "detach") else np.asarray(x)


def _calls(seed: int = 0):
    """(entry, tokens, mask) for 16 calls of different shapes and entries."""
    rng = np.random.default_rng(seed)
    calls = []
    for i in range(16):
        b, s = int(rng.integers(1, 5)), int(rng.integers(1, 40))
        tokens = rng.integers(0, 30522, (b, s)).astype(np.int32)
        mask = (np.arange(s)[None, :] < rng.integers(1, s + 1, b)[:, None]).astype(np.int32)
        calls.append((("forward", "pool", "embed")[i % 3], tokens, mask))
    return calls


@pytest.mark.parametrize("backend", ["torch", "onnx", "jax"])
def test_one_model_called_from_8_threads_matches_serial_calls(minilm_checkpoint, backend):
    model = nest.load(MINILM, backend=backend)
    calls = _calls()
    serial = [_np(model.run(entry, tokens, attention_mask=mask)) for entry, tokens, mask in calls]
    barrier = threading.Barrier(THREADS)

    def worker(offset: int):
        barrier.wait()  # all threads enter the model together
        out = {}
        for k in range(len(calls)):  # each thread runs every call, starting at its own offset
            i = (k + offset) % len(calls)
            entry, tokens, mask = calls[i]
            out.setdefault(i, []).append(_np(model.run(entry, tokens, attention_mask=mask)))
        return out

    with ThreadPoolExecutor(THREADS) as pool:
        results = list(pool.map(worker, range(0, 2 * THREADS, 2)))
    assert len(results) == THREADS
    for out in results:
        for i, got in out.items():
            for array in got:
                assert array.shape == serial[i].shape
                np.testing.assert_allclose(array, serial[i], rtol=0, atol=1e-6)


@pytest.mark.parametrize("runtime", ["onnxruntime", "python"])
def test_triton_under_concurrent_mixed_load(minilm_checkpoint, tmp_path, runtime):
    from linnet.testing.triton_load import ServedModel, run_load

    with ServedModel(MINILM, tmp_path, runtime=runtime) as served:
        report = run_load(served, requests=200, concurrency=8, seed=1, pool_size=24)
    print(report.to_json())
    assert report.problems == []
    assert report.answered == report.requests == 200
    assert report.valid_ok + report.invalid_refused == 200
    assert report.invalid_refused >= 30 and report.valid_ok >= 100
    assert report.max_in_flight == 8
    assert report.healthy_after
