"""`linnet export-triton --ragged` served by a real tritonserver with the ONNX Runtime backend.

Ragged: one unpadded sequence per request, Triton's dynamic batcher concatenating requests of
any length into one flat batch (allow_ragged_batch + BATCH_ACCUMULATED_ELEMENT_COUNT).  The
references are the torch backend's results for each sequence alone (`nest.load(...).run`),
never values from the export under test.
"""
from __future__ import annotations

import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from fixtures.triton import serving
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from linnet import codes
from linnet.cli import main
from linnet.diagnostics import LinnetError
from linnet.nest import load, prepare
from linnet.serving.triton import RAGGED_ENDS, export_passes, export_triton, layout_configs, ragged_io, triton_io
from linnet.testing.triton_server import ProvisionError, provision

MINILM = "all-minilm-l6-v2"
VOCAB = 30522


def parse(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


# ------------------------------------------------------------------ configs (no server)


@pytest.fixture(scope="module")
def minilm_io(minilm_checkpoint):
    ctx, _ = prepare(MINILM, need_weights=False)
    return triton_io(ctx)


def test_ragged_config_fields(minilm_io):
    io = ragged_io(minilm_io)
    # A row per request (pooled, embedding) or per token (hidden [B, S, D]) comes back per
    # request; hidden_states [B, Layers + 1, S, D] has neither and is left out.
    assert [o.name for o in io.outputs] == ["hidden", "pooled", "embedding"]
    assert [t.name for t in io.inputs] == ["tokens", "token_types"]  # the mask is implied
    configs = {name: parse(text) for name, text in layout_configs(io, max_queue_delay_us=500).items()}
    for output, dims in (("hidden", [-1, 384]), ("pooled", [384]), ("embedding", [384])):
        step = configs[f"{MINILM}.{output}"]
        assert step.max_batch_size == 8 and step.HasField("dynamic_batching")
        assert [(i.name, list(i.dims), i.allow_ragged_batch) for i in step.input] == [
            ("tokens", [-1], True), ("token_types", [-1], True)]
        [batch_input] = step.batch_input
        assert batch_input.kind == model_config_pb2.BatchInput.BATCH_ACCUMULATED_ELEMENT_COUNT
        assert list(batch_input.target_name) == [RAGGED_ENDS] and list(batch_input.source_input) == ["tokens"]
        assert batch_input.data_type == model_config_pb2.TYPE_INT32
        assert [(o.name, list(o.dims)) for o in step.output] == [(output, dims)]
    # hidden's batch rows [S_max, D] per request are cut to [S_i, D] by a step that runs each
    # request alone (no dynamic batcher), after the ragged one.
    rows = configs[f"{MINILM}.hidden.rows"]
    assert not rows.HasField("dynamic_batching") and rows.max_batch_size == 8
    assert [(i.name, list(i.dims)) for i in rows.input] == [("linnet_rows_hidden", [-1, 384]), ("tokens", [-1])]
    ensemble = configs[MINILM]
    assert [(i.name, list(i.dims)) for i in ensemble.input] == [("tokens", [-1]), ("token_types", [-1])]
    assert [(o.name, list(o.dims)) for o in ensemble.output] == [("hidden", [-1, 384]), ("pooled", [384]),
                                                                ("embedding", [384])]
    steps = [step.model_name for step in ensemble.ensemble_scheduling.step]
    assert steps == [f"{MINILM}.{name}" for name in ("validate", "hidden", "hidden.rows", "pooled", "embedding")]


def test_ragged_refusals(minilm_io):
    with pytest.raises(LinnetError) as info:
        ragged_io(minilm_io, named=True)  # hidden_states named explicitly: refused, not dropped
    assert info.value.code == codes.TRITON_RAGGED_UNSUPPORTED.code and "`hidden_states`" in str(info.value)
    io = ragged_io(minilm_io)
    for options in ({"max_batch_size": 0}, {}):
        runtime = "onnxruntime" if options else "python"
        with pytest.raises(LinnetError) as info:
            layout_configs(io, runtime=runtime, **options)
        assert info.value.code == codes.TRITON_RAGGED_UNSUPPORTED.code
    with pytest.raises(LinnetError) as info:
        layout_configs(minilm_io, max_batch_tokens=4096)  # not ragged
    assert info.value.code == codes.TRITON_BAD_OPTION.code
    with pytest.raises(LinnetError) as info:
        layout_configs(io, max_batch_tokens=100)  # below one request of S = 512
    assert info.value.code == codes.TRITON_BAD_OPTION.code and "512" in str(info.value)
    # max_batch_tokens: the batch size that keeps every batch within it, at S <= 512 per request.
    assert parse(layout_configs(io, max_batch_tokens=16384)[f"{MINILM}.embedding"]).max_batch_size == 32


# ------------------------------------------------------------------ a real server


@pytest.fixture(scope="module")
def ragged_server(tmp_path_factory, minilm_checkpoint):
    from linnet.testing.triton_ort import build_onnxruntime_backend

    try:
        tools = provision()
        build_onnxruntime_backend(tools)
    except ProvisionError as exc:
        pytest.fail(f"could not provision the Triton server for the tests: {exc}", pytrace=False)
    root = tmp_path_factory.mktemp("triton-ragged")
    ctx, _ = prepare(MINILM, optimize=export_passes())  # what `linnet export-triton` serves: packed
    export_triton(ctx, root / "repo", ragged=True, max_batch_tokens=16384, max_queue_delay_us=2000)
    try:
        with serving(root / "repo", tools, log_path=root / "tritonserver.log") as server:
            yield server
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def torch_model(minilm_checkpoint):
    return load(MINILM)


def _sequences(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 96, size=n)
    lengths[:3] = (1, 2, 512)  # the shortest and the longest a request may be
    return [rng.integers(0, VOCAB, size=int(s)).astype(np.int32) for s in lengths]


def _reference(model, seq: np.ndarray) -> dict[str, np.ndarray]:
    """The torch backend on the sequence alone, unpadded: embedding and pooled, [D] each."""
    return {"embedding": np.asarray(model.run("embed", seq[None].astype(np.int64)))[0],
            "pooled": np.asarray(model.run("pool", seq[None].astype(np.int64)))[0]}


def _infer(client, module, seq: np.ndarray, outputs=("embedding", "pooled"), types: np.ndarray | None = None):
    tensors = []
    for name, array in (("tokens", seq), ("token_types", types)):
        if array is None:
            continue
        array = array[None] if array.ndim == 1 else array
        tensor = module.InferInput(name, list(array.shape), "INT32")
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return client.infer(MINILM, tensors, outputs=[module.InferRequestedOutput(o) for o in outputs])


def _stats(client, model: str) -> tuple[int, int]:
    stats = client.get_inference_statistics(model).model_stats[0]
    return int(stats.inference_count), int(stats.execution_count)


def _stats_after(client, model: str, before: tuple[int, int], requests: int) -> tuple[int, int]:
    """The (inferences, executions) since `before`, once the server has counted `requests`.

    Triton updates a model's statistics after it has sent the responses, so a read right
    after the last response can miss the last batch (seen on a loaded machine: 41 of 48).
    Waits up to 10 s for the count to settle; a count that never reaches `requests` stays
    wrong and fails the caller's assertion."""
    deadline = time.monotonic() + 10.0
    while True:
        now = _stats(client, model)
        counted = tuple(a - b for a, b in zip(now, before))
        if counted[0] >= requests or time.monotonic() > deadline:
            return counted
        time.sleep(0.05)


def test_served_config_has_the_ragged_fields(ragged_server):
    import tritonclient.grpc as grpc

    client = grpc.InferenceServerClient(ragged_server.grpc_url)
    config = client.get_model_config(f"{MINILM}.embedding").config  # what the server loaded
    assert all(i.allow_ragged_batch for i in config.input) and list(config.input[0].dims) == [-1]
    assert config.batch_input[0].kind == model_config_pb2.BatchInput.BATCH_ACCUMULATED_ELEMENT_COUNT
    client.close()


def test_concurrent_mixed_lengths_match_torch(ragged_server, torch_model):
    import tritonclient.grpc as grpc

    seqs = _sequences(48, seed=1)
    want = [_reference(torch_model, s) for s in seqs]
    local = threading.local()

    def one(i):
        if not hasattr(local, "client"):
            local.client = grpc.InferenceServerClient(ragged_server.grpc_url)
        result = _infer(local.client, grpc, seqs[i])
        return i, {o: result.as_numpy(o) for o in ("embedding", "pooled")}

    client = grpc.InferenceServerClient(ragged_server.grpc_url)
    before = _stats(client, f"{MINILM}.embedding")
    worst = 0.0
    with ThreadPoolExecutor(16) as pool:
        for i, got in pool.map(one, range(len(seqs))):
            for output, expected in want[i].items():
                assert got[output].shape == (1, 384), (output, got[output].shape)
                worst = max(worst, float(np.max(np.abs(got[output][0].astype(np.float64) - expected))))
    inferences, executions = _stats_after(client, f"{MINILM}.embedding", before, len(seqs))
    print(f"\nragged: {len(seqs)} requests of lengths {min(map(len, seqs))}..{max(map(len, seqs))}, "
          f"max|diff| vs torch = {worst:.3g}; {inferences} inferences in {executions} executions")
    assert worst <= 1e-5
    assert inferences == len(seqs)
    # Requests of different lengths were run together: ragged batching, not one run each.
    assert executions < inferences
    client.close()


def test_per_token_rows_come_back_per_request(ragged_server, torch_model):
    """`hidden` from concurrent requests of mixed lengths: each request gets its own [S_i, D]
    rows, the torch backend's for the sequence alone, although it ran in a batch with others."""
    import tritonclient.grpc as grpc

    seqs = _sequences(24, seed=3)
    local = threading.local()

    def one(i):
        if not hasattr(local, "client"):
            local.client = grpc.InferenceServerClient(ragged_server.grpc_url)
        return i, _infer(local.client, grpc, seqs[i], outputs=("hidden",)).as_numpy("hidden")

    client = grpc.InferenceServerClient(ragged_server.grpc_url)
    before = _stats(client, f"{MINILM}.hidden")
    worst = 0.0
    with ThreadPoolExecutor(12) as pool:
        for i, got in pool.map(one, range(len(seqs))):
            assert got.shape == (1, len(seqs[i]), 384), (len(seqs[i]), got.shape)
            want = np.asarray(torch_model.run("forward", seqs[i][None].astype(np.int64)))
            worst = max(worst, float(np.max(np.abs(got - want))))
    inferences, executions = _stats_after(client, f"{MINILM}.hidden", before, len(seqs))
    print(f"\nragged hidden: max|diff| vs torch = {worst:.3g}; {inferences} inferences in {executions} executions")
    assert worst <= 1e-5
    assert executions < inferences  # batched with requests of other lengths
    client.close()


def test_token_types_reach_the_graph(ragged_server, torch_model):
    import tritonclient.grpc as grpc

    client = grpc.InferenceServerClient(ragged_server.grpc_url)
    seq = _sequences(4, seed=5)[3]
    types = np.zeros_like(seq)
    types[len(seq) // 2:] = 1
    got = _infer(client, grpc, seq, outputs=("embedding",), types=types).as_numpy("embedding")[0]
    want = np.asarray(torch_model.run("embed", seq[None].astype(np.int64), types[None].astype(np.int64)))[0]
    assert float(np.max(np.abs(got - want))) <= 1e-5
    client.close()


@pytest.mark.parametrize("tokens,words", [
    (np.ones(513, np.int32), "requires S <= 512"),
    (np.array([5, VOCAB, 7], np.int32), f"values must be in [0, {VOCAB})"),
    (np.array([5, -1], np.int32), f"values must be in [0, {VOCAB})"),
    (np.zeros(0, np.int32), "at least one element"),
    (np.ones((2, 4), np.int32), "must hold one sequence"),  # two rows would be read as one sequence
])
def test_bad_requests_are_refused_and_the_server_stays_healthy(ragged_server, torch_model, tokens, words):
    import tritonclient.grpc as grpc
    from tritonclient.utils import InferenceServerException

    client = grpc.InferenceServerClient(ragged_server.grpc_url)
    with pytest.raises(InferenceServerException) as info:
        _infer(client, grpc, tokens)
    assert words in str(info.value) and "'tokens'" in str(info.value), str(info.value)
    assert client.is_server_live() and client.is_model_ready(MINILM)
    seq = np.array([101, 2023, 102], np.int32)
    got = _infer(client, grpc, seq, outputs=("embedding",)).as_numpy("embedding")[0]
    assert float(np.max(np.abs(got - _reference(torch_model, seq)["embedding"]))) <= 1e-5
    client.close()


def test_2000_requests_at_32_in_flight(ragged_server, torch_model):
    import tritonclient.grpc as grpc

    seqs = _sequences(100, seed=9)
    want = [_reference(torch_model, s)["embedding"] for s in seqs]
    local = threading.local()

    def one(i):
        if not hasattr(local, "client"):
            local.client = grpc.InferenceServerClient(ragged_server.grpc_url)
        try:
            got = _infer(local.client, grpc, seqs[i % len(seqs)], outputs=("embedding",)).as_numpy("embedding")
        except Exception as exc:  # noqa: BLE001 - a lost request is counted, not raised
            return "lost", repr(exc)
        ok = got.shape == (1, 384) and float(np.max(np.abs(got[0] - want[i % len(seqs)]))) <= 1e-5
        return ("ok" if ok else "wrong"), i

    started = time.perf_counter()
    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(one, range(2000)))
    seconds = time.perf_counter() - started
    counts = {k: sum(r[0] == k for r in results) for k in ("ok", "lost", "wrong")}
    print(f"\n2000 ragged requests at 32 in flight: {counts} in {seconds:.1f} s ({2000 / seconds:.0f} req/s)")
    assert counts == {"ok": 2000, "lost": 0, "wrong": 0}, [r for r in results if r[0] != "ok"][:3]


def test_cli_ragged_and_refusal(tmp_path, minilm_checkpoint, capsys):
    assert main(["export-triton", MINILM, "-o", str(tmp_path / "repo"), "--ragged", "--max-batch-tokens", "4096"]) == 0
    config = parse((tmp_path / "repo" / f"{MINILM}.embedding" / "config.pbtxt").read_text())
    assert config.max_batch_size == 8 and config.input[0].allow_ragged_batch
    assert (tmp_path / "repo" / f"{MINILM}.hidden.rows" / "1" / "model.onnx").is_file()
    assert not (tmp_path / "repo" / f"{MINILM}.hidden_states").exists()
    capsys.readouterr()
    code = main(["export-triton", MINILM, "-o", str(tmp_path / "repo2"), "--ragged", "--entries", "hidden_states"])
    assert code != 0 and codes.TRITON_RAGGED_UNSUPPORTED.code in capsys.readouterr().err
