"""Embedding on Ray Data: `Dataset.map_batches(Embedder, ...)` and `linnet embed --ray`, on a
local two-CPU Ray cluster, against `model.encode` in this process (real all-MiniLM-L6-v2).

Every batch goes through an actor that loaded the model once; the vectors must be encode's
(1e-6) and come back in input order with the other columns unchanged.
"""
from __future__ import annotations

import sys

import numpy as np
import pytest

import ray  # the [ray] extra; the test extra installs it
from bench.corpus import corpus
from fixtures.killed_jobs import kill_after_shards
from linnet import nest
from linnet.diagnostics import LinnetError
from linnet.nest.bulk import embed_file
from linnet.nest.ray import Embedder
from linnet.testing.ray_probe import CountingEmbedder

TEXTS = corpus(5000, seed=11)


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True
    context.enable_progress_bars = False
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def expected(minilm_checkpoint):
    model = nest.load("all-minilm-l6-v2", backend="torch", weights=minilm_checkpoint)
    return model.encode(TEXTS, progress=False)


def test_map_batches_with_two_actors_equals_encode(cluster, minilm_checkpoint, expected, tmp_path):
    log = tmp_path / "loads.txt"
    ds = ray.data.from_items([{"text": t, "i": i} for i, t in enumerate(TEXTS)])
    kwargs = {"name": "all-minilm-l6-v2", "weights": str(minilm_checkpoint), "threads": 1, "load_log": str(log)}
    out = ds.map_batches(CountingEmbedder, fn_constructor_kwargs=kwargs, compute=ray.data.ActorPoolStrategy(size=2), batch_size=256)
    rows = out.take_all()
    assert [r["i"] for r in rows] == list(range(len(TEXTS)))
    assert [r["text"] for r in rows] == TEXTS
    vectors = np.stack([r["embedding"] for r in rows])
    assert vectors.shape == (5000, 384)
    assert np.abs(vectors - expected).max() < 1e-6
    loads = log.read_text().split()
    assert len(loads) == 2 and len(set(loads)) == 2, f"expected one load in each of 2 actors, found {loads}"


def test_embedder_takes_pandas_batches(cluster, minilm_checkpoint, expected):
    ds = ray.data.from_items([{"text": t, "i": i} for i, t in enumerate(TEXTS[:300])])
    kwargs = {"name": "all-minilm-l6-v2", "weights": str(minilm_checkpoint), "threads": 1}
    frame = ds.map_batches(Embedder,
                           fn_constructor_kwargs=kwargs, compute=ray.data.ActorPoolStrategy(size=1), batch_size=100,
                           batch_format="pandas").to_pandas()
    assert frame["i"].tolist() == list(range(300))
    assert np.abs(np.stack(frame["embedding"]) - expected[:300]).max() < 1e-6


def test_cli_job_on_ray_equals_the_local_one(cluster, minilm_checkpoint, expected, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"text": TEXTS[:700], "id": list(range(700))}), source)
    options = {"load_options": {"weights": str(minilm_checkpoint)}, "progress": False, "shard_rows": 200}
    report = embed_file("all-minilm-l6-v2", source, tmp_path / "ray", use_ray=True, concurrency=2, threads=1,
                        **options)
    assert (report.rows, report.embedded, report.shards) == (700, 700, 4)  # the last shard is short
    table = pq.read_table(tmp_path / "ray")
    assert table.column("id").to_pylist() == list(range(700))
    vectors = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
    assert np.abs(vectors - expected[:700]).max() < 1e-6
    (tmp_path / "ray" / "part-00001.parquet").unlink()
    again = embed_file("all-minilm-l6-v2", source, tmp_path / "ray", use_ray=True, concurrency=2, threads=1,
                       **options)
    assert again.embedded == 200
    table = pq.read_table(tmp_path / "ray")
    assert table.column("id").to_pylist() == list(range(700))
    assert np.abs(np.stack(table.column("embedding").to_numpy(zero_copy_only=False)) - expected[:700]).max() < 1e-6


def test_cli_job_on_ray_killed_mid_run_resumes_without_losing_or_doubling_rows(cluster, minilm_checkpoint,
                                                                               expected, tmp_path):
    """`linnet embed --ray` as its own process, attached to this test's cluster (RAY_ADDRESS),
    killed with SIGKILL once a few shards are on disk, then run again to the end."""
    import os
    import subprocess

    import pyarrow as pa
    import pyarrow.parquet as pq

    source = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"text": TEXTS[:600], "id": list(range(600))}), source)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "linnet.cli", "embed", "all-minilm-l6-v2", str(source), "-o", str(out), "--ray",
               "--concurrency", "2", "--shard-rows", "30", "--weights", str(minilm_checkpoint), "--no-progress",
               "--threads", "1"]
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    written = kill_after_shards(command, out, env=env)
    assert written < 20, "the run finished before it was killed, so nothing was resumed"
    finished = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert "kept from an earlier run" in finished.stdout
    table = pq.read_table(out)
    assert table.column("id").to_pylist() == list(range(600))
    vectors = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
    assert np.abs(vectors - expected[:600]).max() < 1e-6
    assert not list(out.glob(".*partial"))


def test_missing_ray_says_what_to_install(monkeypatch):
    from linnet.nest.ray import ray_module

    monkeypatch.setitem(sys.modules, "ray", None)
    monkeypatch.setitem(sys.modules, "ray.data", None)
    with pytest.raises(LinnetError) as err:
        ray_module()
    assert err.value.code == "E1304" and "pip install 'linnet[ray]'" in str(err.value)
