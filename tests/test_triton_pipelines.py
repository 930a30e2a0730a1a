"""`linnet export-triton` of sentence-transformers models, served by a real Triton.

The exported graphs carry the whole pipeline (pooling, Dense, Normalize) inside the model,
so a Triton client gets the vectors `SentenceTransformer.encode` gives, from token ids
alone: compared here for a BGE-style `hf:` repo, a LaBSE-style folder (Dense + Normalize)
and an INSTRUCTOR-style folder whose pooling leaves the prompt out (its `prompt_length`
input), on the ONNX Runtime layout, over HTTP.
"""
from __future__ import annotations

import contextlib
import io
import shutil

import numpy as np
import pytest
from fixtures.st_models import write_st_folder, write_st_repo
from fixtures.triton import serving
from test_sentence_pipelines import CASES, TEXTS
from test_triton import triton_tools  # noqa: F401 - the session's provisioned tools (a fixture)

from linnet.cli import main
from linnet.nest import load

SERVED = ("bge", "labse", "instructor")


@pytest.fixture(scope="module")
def pipelines(hf_cache, tmp_path_factory):
    """name -> (what export-triton takes, sentence-transformers' model)."""
    root = tmp_path_factory.mktemp("triton-st")
    made = {}
    for seed, name in enumerate(SERVED, start=50):
        if name == "bge":
            repo, reference = write_st_repo(hf_cache, "linnet-tests/triton-st-bge", CASES[name], seed=seed)
            made[name] = (repo.name, reference)
        else:
            made[name] = (str(root / name), write_st_folder(root / name, CASES[name], seed=seed))
    yield made
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def server(pipelines, tmp_path_factory, triton_tools):  # noqa: F811 - the imported fixture
    """One repository of the three, each exported by the command line, as a user would."""
    root = tmp_path_factory.mktemp("triton-st-repo")
    names = {}
    for name, (where, _) in pipelines.items():
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            assert main(["export-triton", where, "-o", str(root / "repo")]) == 0
        names[name] = printed.getvalue().split("exported ", 1)[1].split(" for Triton")[0]
    with serving(root / "repo", triton_tools, log_path=root / "tritonserver.log") as served:
        yield served, names
    shutil.rmtree(root, ignore_errors=True)


def _infer(server, model: str, features: dict) -> np.ndarray:
    from tritonclient import http
    from tritonclient.utils import np_to_triton_dtype

    client = http.InferenceServerClient(server.http_url)
    try:
        inputs = []
        for name, array in features.items():
            tensor = http.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        result = client.infer(model, inputs, outputs=[http.InferRequestedOutput("embedding")])
        return result.as_numpy("embedding")
    finally:
        client.close()


@pytest.mark.parametrize("name", SERVED)
def test_served_vectors_are_sentence_transformers(server, pipelines, name):
    served, names = server
    where, reference = pipelines[name]
    model = load(where, backend="onnx")
    prompt = model.prompts.get("query", "") if name == "instructor" else ""
    features = dict(model.tokenizer([prompt + text for text in TEXTS[:6]]))
    if name == "instructor":  # the prompt's tokens after [CLS], which its pooling leaves out
        length = model.tokenizer([prompt]).tokens.shape[1] - 1
        # One number per row: Triton takes it as [B, 1] (the config's `reshape` gives the model [B]).
        features["prompt_length"] = np.full((6, 1), length, np.int32)
    got = _infer(served, names[name], features)
    expected = reference.encode(TEXTS[:6])  # instructor: its default prompt, "query"
    diff = float(np.max(np.abs(got.astype(np.float64) - expected)))
    print(f"triton pipeline {name}: max |diff| {diff:.2e}")
    assert got.shape == expected.shape and diff <= 1e-5
