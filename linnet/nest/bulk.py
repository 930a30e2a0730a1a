"""Embedding a whole corpus into resumable Parquet shards (`linnet embed`).

The input is a `.txt` file (one text per line), a `.jsonl` file (one JSON object per line,
the text under `text_column`, every other field kept) or a `.parquet` file.  The output is
a folder:

    OUTPUT/_linnet-embed.json   the job: input file (size, mtime), model, backend, settings
    OUTPUT/part-00000.parquet   input rows [0, shard_rows), in input order, every input
    OUTPUT/part-00001.parquet   column plus `embedding` (a fixed-size list of float32)
    ...

A shard is written under a temporary name and renamed when complete, so a run killed at any
point leaves only whole shards; running the same job again embeds only the shards that are
missing, and refuses (E1303) a folder that holds another job's shards rather than mix two
embeddings.  `pandas.read_parquet(OUTPUT)` or `pyarrow.dataset.dataset(OUTPUT)` reads the
rows back in input order (the shard names sort in row order).

The vectors are `model.encode`'s, with the same arguments; `run_ray` gets them from Ray
Data actors (`linnet.nest.ray.Embedder`) instead of this process.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from .. import codes
from ..diagnostics import Diagnostic, LinnetError

FORMATS = (".txt", ".jsonl", ".parquet")
JOB_FILE = "_linnet-embed.json"  # "_": pyarrow.dataset passes it over
SHARD_PATTERN = "part-{:05d}.parquet"
#: Rows a shard holds unless told otherwise: a shard is the unit a rerun redoes.
DEFAULT_SHARD_ROWS = 10_000
#: The settings of `encode` a job records (and a rerun must repeat), with their defaults.
ENCODE_SETTINGS = {"normalize_embeddings": False, "prompt_name": None, "prompt": None,
                   "max_length": None, "truncate_dim": None}


def pyarrow():
    """pyarrow, or E1304 saying how to get it."""
    try:
        import pyarrow as pa
        import pyarrow.parquet  # noqa: F401 - the submodule this module writes with
    except ModuleNotFoundError:
        raise LinnetError(Diagnostic(codes.MISSING_EXTRA,
                                     "Parquet shards need the package `pyarrow`, which is not installed: "
                                     "pip install 'linnet[ray]' (or pip install pyarrow)")) from None
    return pa


def bad_input(path: Path, what: str) -> LinnetError:
    return LinnetError(Diagnostic(codes.EMBED_BAD_INPUT, f"{path}: {what}"))


@dataclass(frozen=True)
class Job:
    """What an output folder holds; a rerun into the folder must describe the same job."""
    input: str
    input_bytes: int
    input_mtime_ns: int
    model: str
    backend: str
    text_column: str = "text"
    embedding_column: str = "embedding"
    shard_rows: int = DEFAULT_SHARD_ROWS
    encode: dict = field(default_factory=dict)

    @classmethod
    def describe(cls, input_path: str | Path, model: str, backend: str, **settings) -> "Job":
        path = Path(input_path).resolve()
        if path.suffix not in FORMATS:
            raise bad_input(path, f"unknown input format {path.suffix or '(no suffix)'!r}; "
                                  f"expected one of {', '.join(FORMATS)}")
        if not path.is_file():
            raise bad_input(path, "no such file")
        stat = path.stat()
        encode = {k: settings.pop(k, v) for k, v in ENCODE_SETTINGS.items()}
        shard_rows = int(settings.get("shard_rows", DEFAULT_SHARD_ROWS))
        if shard_rows < 1:
            raise bad_input(path, f"shard_rows must be at least 1, found {shard_rows}")
        return cls(str(path), stat.st_size, stat.st_mtime_ns, model, backend, encode=encode,
                   **{k: v for k, v in settings.items() if k in {f.name for f in fields(cls)}})

    @property
    def path(self) -> Path:
        return Path(self.input)


# ------------------------------------------------------------------------------ reading


def read_shards(job: Job) -> Iterator[tuple[int, Any]]:
    """(shard index, pyarrow table of its rows) in input order, streamed: the file is never
    held whole."""
    pa = pyarrow()
    index, pending = 0, []
    count = 0
    for table in _read_tables(job, pa):
        pending.append(table)
        count += table.num_rows
        while count >= job.shard_rows:
            whole = pa.concat_tables(pending, promote_options="default")
            yield index, whole.slice(0, job.shard_rows)
            index += 1
            rest = whole.slice(job.shard_rows)
            pending, count = [rest], rest.num_rows
    if count:
        yield index, pa.concat_tables(pending, promote_options="default")


def count_rows(job: Job) -> int:
    """The rows the input holds (Parquet's metadata, else its lines), for the progress bar."""
    if job.path.suffix == ".parquet":
        return pyarrow().parquet.ParquetFile(job.path).metadata.num_rows
    with open(job.path, "rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b"")) + _unterminated(job.path)


def _unterminated(path: Path) -> int:
    """1 when the file's last line has no newline (it is still a row), else 0."""
    size = path.stat().st_size
    if not size:
        return 0
    with open(path, "rb") as f:
        f.seek(size - 1)
        return int(f.read(1) != b"\n")


def _read_tables(job: Job, pa) -> Iterator[Any]:
    path, column = job.path, job.text_column
    if path.suffix == ".parquet":
        try:
            reader = pa.parquet.ParquetFile(path)
        except (OSError, pa.ArrowException) as exc:
            raise bad_input(path, f"not a readable Parquet file ({exc})") from None
        if column not in reader.schema_arrow.names:
            raise bad_input(path, f"no column {column!r}; the file has {', '.join(reader.schema_arrow.names)}")
        start = 0
        for batch in reader.iter_batches(batch_size=max(job.shard_rows, 1024)):
            table = pa.Table.from_batches([batch])
            _check_texts(path, table.column(column).to_pylist(), start, "row")
            start += table.num_rows
            yield table
        return
    rows: list = []
    with open(path, encoding="utf-8", newline="") as f:
        for number, line in enumerate(_lines(f, path), 1):
            rows.append(_row(path, number, line, job))
            if len(rows) == 4096:
                yield pa.Table.from_pylist(rows)
                rows = []
    if rows:
        yield pa.Table.from_pylist(rows)


def _lines(f, path: Path) -> Iterator[str]:
    try:
        for line in f:
            yield line[:-1] if line.endswith("\n") else line
    except UnicodeDecodeError as exc:
        raise bad_input(path, f"not UTF-8 text ({exc.reason} at byte {exc.start} of a block)") from None


def _row(path: Path, number: int, line: str, job: Job) -> dict:
    if path.suffix == ".txt":
        return {job.text_column: line.removesuffix("\r")}
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise bad_input(path, f"line {number} is not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(row, dict):
        raise bad_input(path, f"line {number} is a JSON {type(row).__name__}, not an object")
    if job.text_column not in row:
        raise bad_input(path, f"line {number} has no {job.text_column!r} field; it has "
                              f"{', '.join(map(repr, row)) or 'no fields'}")
    _check_texts(path, [row[job.text_column]], number - 1, "line")
    if job.embedding_column in row:
        raise bad_input(path, f"line {number} already has a field {job.embedding_column!r}, "
                              "the column the embeddings are written to")
    return row


def _check_texts(path: Path, texts: list, start: int, unit: str) -> None:
    for offset, text in enumerate(texts):
        if not isinstance(text, str):
            raise bad_input(path, f"{unit} {start + offset + 1}: the text is {type(text).__name__} "
                                  f"{text!r}, not a string")


# ------------------------------------------------------------------------------ output


class Output:
    """The shard folder of one job: which shards are done, and writing one atomically."""

    def __init__(self, folder: str | Path, job: Job):
        self.folder = Path(folder)
        self.job = job
        self.folder.mkdir(parents=True, exist_ok=True)
        self._claim()

    def _claim(self) -> None:
        recorded = self.folder / JOB_FILE
        mine = asdict(self.job)
        if recorded.exists():
            try:
                theirs = json.loads(recorded.read_text(encoding="utf-8"))["job"]
            except (OSError, ValueError, KeyError, TypeError):
                raise LinnetError(Diagnostic(codes.EMBED_OUTPUT_MISMATCH,
                                             f"{recorded} is not a job description linnet wrote")) from None
            differ = [k for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)]
            if differ:
                said = "; ".join(f"{k}: {theirs.get(k)!r} there, {mine.get(k)!r} now" for k in differ)
                raise LinnetError(Diagnostic(codes.EMBED_OUTPUT_MISMATCH,
                                             f"{self.folder} holds the shards of another job ({said}); "
                                             "write to a new folder, or delete this one to start over"))
            return
        strays = [p.name for p in self.folder.iterdir() if not p.name.startswith(".")]
        if strays:
            raise LinnetError(Diagnostic(codes.EMBED_OUTPUT_MISMATCH,
                                         f"{self.folder} is not empty and holds no {JOB_FILE} "
                                         f"({', '.join(sorted(strays)[:5])}); write to a new folder"))
        self._write_json(recorded, {"job": mine, "complete": False})

    def shard(self, index: int) -> Path:
        return self.folder / SHARD_PATTERN.format(index)

    def done(self, index: int, rows: int) -> bool:
        """Whether shard `index` is on disk whole (`rows` rows); a shard of another length is redone."""
        path = self.shard(index)
        if not path.exists():
            return False
        try:
            return pyarrow().parquet.ParquetFile(path).metadata.num_rows == rows
        except Exception:  # noqa: BLE001 - an unreadable shard is simply redone
            return False

    def write(self, index: int, table, vectors: np.ndarray) -> None:
        pa = pyarrow()
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.shape[0] != table.num_rows:
            raise AssertionError(f"shard {index}: {vectors.shape[0]} vectors for {table.num_rows} rows")
        column = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), vectors.shape[1])
        table = table.append_column(self.job.embedding_column, column)
        path = self.shard(index)
        partial = path.with_name(f".{path.name}.partial")
        pa.parquet.write_table(table, partial)
        os.replace(partial, path)

    def finish(self, rows: int, seconds: float) -> None:
        self._write_json(self.folder / JOB_FILE, {"job": asdict(self.job), "complete": True, "rows": rows,
                                                  "shards": -(-rows // self.job.shard_rows),
                                                  "last_run_seconds": round(seconds, 3)})

    @staticmethod
    def _write_json(path: Path, data: dict) -> None:
        partial = path.with_name(f".{path.name}.partial")
        partial.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        os.replace(partial, path)


# ------------------------------------------------------------------------------ running


@dataclass
class Report:
    rows: int          # rows in the input
    embedded: int      # rows embedded by this run (the rest were on disk)
    shards: int
    seconds: float
    folder: Path

    def __str__(self) -> str:
        kept = self.rows - self.embedded
        resumed = f", {kept:,} kept from an earlier run" if kept else ""
        return (f"embedded {self.embedded:,} of {self.rows:,} rows into {self.shards} shard"
                f"{'s' if self.shards != 1 else ''} in {self.folder} ({self.seconds:.1f} s{resumed})")


def embed_file(model_name: str, input_path: str | Path, output: str | Path, *, backend: str = "torch",
               text_column: str = "text", embedding_column: str = "embedding",
               shard_rows: int = DEFAULT_SHARD_ROWS, batch_size: int = 32, progress: bool | None = None,
               use_ray: bool = False, concurrency: int = 1, threads: int | None = None,
               load_options: dict | None = None, **encode_settings) -> Report:
    """Embed every row of `input_path` into shards under `output`, resuming what is there.

    encode_settings: normalize_embeddings, prompt_name, prompt, max_length, truncate_dim, as
    `model.encode` takes them.  use_ray: the vectors come from `concurrency` Ray Data actors
    (`threads` torch threads each) on the cluster `RAY_ADDRESS` names, else a local one.
    """
    unknown = set(encode_settings) - set(ENCODE_SETTINGS)
    if unknown:
        raise TypeError(f"embed_file() got unknown encode settings: {', '.join(sorted(unknown))}")
    pyarrow()  # before any folder is made
    job = Job.describe(input_path, model_name, backend, text_column=text_column,
                       embedding_column=embedding_column, shard_rows=shard_rows, **encode_settings)
    out = Output(output, job)
    started = time.perf_counter()
    total = count_rows(job)
    pending = ((i, t) for i, t in read_shards(job) if not out.done(i, t.num_rows))
    bar = _bar(total, progress, f"embed {model_name}")
    bar.update(total - _pending_rows(job, out, total))
    options = dict(load_options or {})
    if use_ray:
        from .ray import embed_shards

        embedded = embed_shards(job, out, pending, bar, batch_size=batch_size, concurrency=concurrency,
                                threads=threads, load_options=options)
    else:
        embedded = _embed_here(job, out, pending, bar, batch_size=batch_size, threads=threads,
                               load_options=options)
    bar.close()
    seconds = time.perf_counter() - started
    out.finish(total, seconds)
    return Report(total, embedded, -(-total // job.shard_rows), seconds, out.folder)


def _pending_rows(job: Job, out: Output, total: int) -> int:
    """Rows of the shards not yet on disk (a shard's length follows from its index)."""
    shards = -(-total // job.shard_rows)
    rows = [min(job.shard_rows, total - i * job.shard_rows) for i in range(shards)]
    return sum(n for i, n in enumerate(rows) if not out.done(i, n))


def _embed_here(job: Job, out: Output, pending, bar, *, batch_size: int, threads: int | None,
                load_options: dict) -> int:
    from . import load

    if threads:
        import torch

        torch.set_num_threads(threads)
    model = None
    embedded = 0
    for index, table in pending:
        if model is None:  # nothing to do loads nothing
            model = load(job.model, backend=job.backend, **load_options)
        texts = table.column(job.text_column).to_pylist()
        vectors = model.encode(texts, batch_size=batch_size, show_progress_bar=False, **job.encode)
        out.write(index, table, vectors)
        embedded += table.num_rows
        bar.update(table.num_rows)
    return embedded


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _bar(total: int, progress: bool | None, description: str):
    show = total > 1000 if progress is None else bool(progress)
    if not show:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=description, unit="row")
