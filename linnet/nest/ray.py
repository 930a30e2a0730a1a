"""Embedding on Ray Data: a callable class for `Dataset.map_batches`, and `linnet embed --ray`.

    import ray
    from linnet.nest.ray import Embedder

    ds = ray.data.read_parquet("corpus.parquet")
    ds = ds.map_batches(Embedder, fn_constructor_kwargs={"name": "all-minilm-l6-v2", "threads": 1},
                        compute=ray.data.ActorPoolStrategy(size=4), batch_size=256)

Each actor loads the model once, in its constructor, and embeds the batches it is given with
`model.encode` (the same numbers as calling `encode` in one process); the text column is read,
every other column passes through unchanged, and the vectors land in `embedding_column`.
Needs the optional extra `linnet[ray]`.
"""
from __future__ import annotations

import logging
from typing import Any

import numpy as np

from .. import codes
from ..diagnostics import Diagnostic, LinnetError

#: The row-number column `embed_shards` adds so every vector finds its shard.
ROW_COLUMN = "__linnet_row"
#: Shards handed to one Ray Data run: bounds what the driver holds (a run starts its actors,
#: so larger windows load the model fewer times).
WINDOW_ROWS = 200_000


def ray_module():
    """`ray` with Ray Data, or E1304 saying how to install it."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ModuleNotFoundError:
        raise LinnetError(Diagnostic(codes.MISSING_EXTRA,
                                     "Ray Data is not installed: pip install 'linnet[ray]'")) from None
    return ray


class Embedder:
    """`model.encode` as a Ray Data batch function (an actor class for `map_batches`).

    name, backend and load_options: what `nest.load` takes.  threads: torch's intra-op
    threads in this actor (set before the model loads; with N actors on a node, N x threads
    should not exceed its cores).  batch_size, normalize_embeddings, prompt_name, prompt,
    max_length, truncate_dim: passed to `encode`.
    """

    def __init__(self, name: str, backend: str = "torch", *, text_column: str = "text",
                 embedding_column: str = "embedding", threads: int | None = None, batch_size: int = 32,
                 normalize_embeddings: bool = False, prompt_name: str | None = None, prompt: str | None = None,
                 max_length: int | None = None, truncate_dim: int | None = None, **load_options: Any):
        if threads:
            import torch

            torch.set_num_threads(int(threads))
        from . import load

        self.model = load(name, backend=backend, **load_options)
        self.text_column = text_column
        self.embedding_column = embedding_column
        self.encode_options = {"batch_size": batch_size, "normalize_embeddings": normalize_embeddings,
                               "prompt_name": prompt_name, "prompt": prompt, "max_length": max_length,
                               "truncate_dim": truncate_dim}

    def __call__(self, batch):
        texts = _column(batch, self.text_column)
        bad = next((t for t in texts if not isinstance(t, str)), None)
        if bad is not None:
            raise LinnetError(Diagnostic(codes.EMBED_BAD_INPUT,
                                         f"column {self.text_column!r} holds {type(bad).__name__} {bad!r}, "
                                         "not a string"))
        vectors = self.model.encode(texts, show_progress_bar=False, **self.encode_options)
        return _with_column(batch, self.embedding_column, np.asarray(vectors, np.float32))


def _column(batch, name: str) -> list:
    """A batch's column as a list, whatever the batch format (numpy dict, pandas, pyarrow)."""
    try:
        column = batch[name]
    except KeyError:
        columns = list(batch.keys()) if isinstance(batch, dict) else list(batch.columns)
        raise LinnetError(Diagnostic(codes.EMBED_BAD_INPUT,
                                     f"the batch has no column {name!r}; it has {', '.join(map(str, columns))}")) from None
    if hasattr(column, "to_pylist"):
        return column.to_pylist()
    return list(column)


def _with_column(batch, name: str, vectors: np.ndarray):
    if isinstance(batch, dict):
        return {**batch, name: vectors}
    if hasattr(batch, "append_column"):  # pyarrow.Table
        import pyarrow as pa

        return batch.append_column(name, pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)),
                                                                           vectors.shape[1]))
    out = batch.copy()  # pandas.DataFrame
    out[name] = list(vectors)
    return out


def embed_shards(job, out, pending, bar, *, batch_size: int, concurrency: int, threads: int | None,
                 load_options: dict) -> int:
    """Embed the `pending` (index, table) shards of `job` on Ray Data actors, writing each into
    `out` as soon as all its rows are back; returns the rows embedded."""
    ray = ray_module()
    import pyarrow as pa

    if not ray.is_initialized():
        ray.init(log_to_driver=False, include_dashboard=False)  # RAY_ADDRESS, else a local cluster
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True
    context.enable_progress_bars = False  # ours counts rows
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    kwargs = {"name": job.model, "backend": job.backend, "text_column": job.text_column,
              "embedding_column": job.embedding_column, "threads": threads, "batch_size": batch_size,
              **job.encode, **load_options}
    embedded = 0
    for window in _windows(pending, job.shard_rows):
        tables = [t.append_column(ROW_COLUMN, pa.array(np.arange(t.num_rows, dtype=np.int64) + i * job.shard_rows))
                  for i, t in window]
        # Blocks of a few batches each, so every actor has work even when one shard is left.
        block = batch_size * 8
        blocks = [t.slice(start, block) for t in tables for start in range(0, t.num_rows, block)]
        ds = ray.data.from_arrow(blocks).map_batches(Embedder, fn_constructor_kwargs=kwargs,
                                                     compute=ray.data.ActorPoolStrategy(size=concurrency),
                                                     batch_size=batch_size * 8)
        embedded += _collect(job, out, dict(window), ds, bar)
    return embedded


def _windows(pending, shard_rows: int):
    window, rows = [], 0
    for item in pending:
        window.append(item)
        rows += item[1].num_rows
        if rows >= WINDOW_ROWS:
            yield window
            window, rows = [], 0
    if window:
        yield window


def _collect(job, out, shards: dict, ds, bar) -> int:
    """Gather the actors' batches into their shards (rows come back in order; the row column
    places them either way) and write each shard when it is whole."""
    got: dict[int, dict[int, np.ndarray]] = {i: {} for i in shards}
    written = 0
    for batch in ds.iter_batches(batch_format="pyarrow", batch_size=None):
        rows = batch.column(ROW_COLUMN).to_numpy()
        vectors = np.concatenate([c.to_numpy() for c in batch.column(job.embedding_column).chunks])
        for row, vector in zip(rows, vectors):
            index = int(row) // job.shard_rows
            got[index][int(row) % job.shard_rows] = vector
        for index in [i for i in got if len(got[i]) == shards[i].num_rows]:
            parts = got.pop(index)
            out.write(index, shards[index], np.stack([parts[r] for r in range(shards[index].num_rows)]))
            bar.update(shards[index].num_rows)
            written += shards[index].num_rows
    if got:
        missing = {i: shards[i].num_rows - len(v) for i, v in got.items()}
        raise RuntimeError(f"Ray Data returned too few rows for shards {missing}")
    return written
