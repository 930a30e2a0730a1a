"""Triton model repositories (`linnet.serving.triton`, `linnet export-triton`) and a real Triton server.

Configs are parsed with Triton's own protobuf schema (tritonclient's `model_config_pb2`) and
compared with what the Linnet signatures say, independently of the writer.  The server is
the real `tritonserver` 2.51 binary from PyPI's nvidia-pytriton, provisioned once per
machine by `linnet.testing.triton_server`; it serves repositories exported with
`runtime="python"` (that build has no ONNX Runtime backend).  If provisioning or startup
fails the tests fail: a skipped server test would pass for a server nobody ran.
"""
from __future__ import annotations

import importlib.util
import ipaddress
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from linnet.cli import main
from linnet.diagnostics import LinnetError
from linnet.nest import load, prepare
from linnet.runtime import index_bounds
from linnet.testing.triton_server import (ProvisionError, ServerError, TritonServer, listening_sockets,
                                          provision)
from linnet.serving.triton import config_text, export_triton, triton_io

MINILM = "all-minilm-l6-v2"
BERT = "bert-base-uncased"
#: Served models and the fixture that puts each one's checkpoint into the test cache.
SERVED = {MINILM: "minilm_checkpoint", BERT: "bert_base_checkpoint"}

#: Linnet dtype -> Triton enum, written out here rather than imported from linnet.serving.triton.
PB_TYPES = {"i32": model_config_pb2.TYPE_INT32, "f32": model_config_pb2.TYPE_FP32,
            "f16": model_config_pb2.TYPE_FP16, "bf16": model_config_pb2.TYPE_BF16}


def parse_config(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


# ---------------------------------------------------------------- configs (no weights)


def expected_io(name: str, dtype: str | None, batched: bool):
    """(name, TYPE_*, dims) of every input and output, from the entries' signatures."""
    ctx, _ = prepare(name, dtype=dtype, need_weights=False)
    program = ctx.program
    root = program.entries[ctx.manifest.source.entry]

    def dims(t):
        shown = t.dims[1:] if batched else t.dims
        return [d.as_int() if d.as_int() is not None else -1 for d in shown]

    inputs = [(n, PB_TYPES[t.dtype], dims(t)) for n, t in root.inputs]
    outputs = [(ctx.output_name(e.name), PB_TYPES[e.result.dtype], dims(e.result)) for e in program.entries.values()]
    return ctx, inputs, outputs


@pytest.mark.parametrize("runtime", ["onnxruntime", "python"])
@pytest.mark.parametrize("name,dtype,width", [(MINILM, None, 384), (BERT, None, 768), (MINILM, "f16", 384)])
def test_config_parses_with_tritons_schema(name, dtype, width, runtime):
    ctx, inputs, outputs = expected_io(name, dtype, batched=True)
    config = parse_config(config_text(triton_io(ctx), max_batch_size=8, runtime=runtime))
    assert config.name == name
    assert config.max_batch_size == 8
    if runtime == "onnxruntime":
        assert (config.platform, config.backend) == ("onnxruntime_onnx", "")
        assert config.default_model_filename == "model.onnx"
    else:
        assert (config.platform, config.backend) == ("", "python")
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == inputs
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == outputs
    assert config.HasField("dynamic_batching")
    # Spelled out once, so a change in the derivation above cannot hide a wrong config.
    float_type = PB_TYPES[dtype or "f32"]
    assert inputs == [("tokens", model_config_pb2.TYPE_INT32, [-1]), ("token_types", model_config_pb2.TYPE_INT32, [-1]),
                      ("attention_mask", model_config_pb2.TYPE_INT32, [-1])]
    # bert-base-uncased also serves its pre-training heads: per-token vocabulary scores and
    # the two next-sentence scores.
    heads = [("mlm_logits", float_type, [-1, 30522]), ("nsp_logits", float_type, [2])] if name == BERT else []
    layers = 13 if name == BERT else 7  # hidden_states: the embeddings' output and each layer's
    assert outputs == [("hidden", float_type, [-1, width]), ("hidden_states", float_type, [layers, -1, width]),
                       ("pooled", float_type, [width]), ("embedding", float_type, [width]), *heads]
    # Inputs with a Linnet default may be left out where model.py can fill them (python
    # runtime); ONNX Runtime needs every graph input.
    optional = {i.name: i.optional for i in config.input}
    assert optional == {"tokens": False, "token_types": runtime == "python", "attention_mask": runtime == "python"}


def test_config_without_batching_keeps_the_batch_dim():
    ctx, inputs, outputs = expected_io(MINILM, None, batched=False)
    config = parse_config(config_text(triton_io(ctx), max_batch_size=0))
    assert config.max_batch_size == 0 and not config.HasField("dynamic_batching")
    assert [list(i.dims) for i in config.input] == [[-1, -1]] * 3
    assert [(o.name, list(o.dims)) for o in config.output] == [
        ("hidden", [-1, -1, 384]), ("hidden_states", [-1, 7, -1, 384]), ("pooled", [-1, 384]), ("embedding", [-1, 384])]


def test_bf16_config_and_python_runtime_refusal():
    ctx, inputs, outputs = expected_io(MINILM, "bf16", batched=True)
    config = parse_config(config_text(triton_io(ctx), runtime="onnxruntime"))
    assert [o.data_type for o in config.output] == [model_config_pb2.TYPE_BF16] * 4
    # numpy has no bfloat16, so the Python backend could not hand the outputs over.
    with pytest.raises(LinnetError) as info:
        config_text(triton_io(ctx), runtime="python")
    assert info.value.code == "E0844" and "bf16" in str(info.value)


@pytest.mark.parametrize("options,code,words", [
    ({"runtime": "tensorrt"}, "E0840", "tensorrt"),
    ({"max_batch_size": -1}, "E0840", "max_batch_size"),
    ({"max_batch_size": 2.5}, "E0840", "max_batch_size"),
])
def test_bad_export_options(options, code, words):
    ctx, _ = prepare(MINILM, need_weights=False)
    with pytest.raises(LinnetError) as info:
        config_text(triton_io(ctx), **options)
    assert info.value.code == code and words in str(info.value)


def test_export_refuses_before_building(tmp_path):
    # None of these get as far as the ONNX build (which would need weights: ctx has none).
    ctx, _ = prepare(MINILM, need_weights=False)
    with pytest.raises(LinnetError) as info:
        export_triton(ctx, tmp_path, dtype="f16")
    assert info.value.code == "E0844" and "dtype='f16'" in str(info.value)
    (tmp_path / "file").write_text("x")
    with pytest.raises(LinnetError) as info:
        export_triton(ctx, tmp_path / "file")
    assert info.value.code == "E0845"
    (tmp_path / "repo" / MINILM).mkdir(parents=True)
    (tmp_path / "repo" / MINILM / "notes.txt").write_text("mine")
    with pytest.raises(LinnetError) as info:
        export_triton(ctx, tmp_path / "repo")
    assert info.value.code == "E0845" and (tmp_path / "repo" / MINILM / "notes.txt").exists()
    with pytest.raises(LinnetError) as info:
        export_triton(ctx, tmp_path / "other", runtime="python", max_batch_size=-3)
    assert info.value.code == "E0840" and not (tmp_path / "other").exists()


def test_unservable_signatures():
    import dataclasses

    ctx, _ = prepare(MINILM, need_weights=False)
    # A result named like an input: one Triton model could not tell them apart.
    clashing = dataclasses.replace(ctx, manifest=dataclasses.replace(ctx.manifest, outputs={"forward": "tokens"}))
    with pytest.raises(LinnetError) as info:
        triton_io(clashing)
    assert info.value.code == "E0843" and "`tokens`" in str(info.value)
    # No shared leading batch dim: only an unbatched config can describe it.
    io = dataclasses.replace(triton_io(ctx), batch_dim=None)
    with pytest.raises(LinnetError) as info:
        config_text(io, max_batch_size=8)
    assert info.value.code == "E0842" and "max_batch_size=0" in str(info.value)
    assert parse_config(config_text(io, max_batch_size=0)).max_batch_size == 0
    with pytest.raises(LinnetError) as info:
        export_triton(dataclasses.replace(ctx, name="../escape"), "unused")
    assert info.value.code == "E0841"


# ---------------------------------------------------------------- exported repositories


@pytest.fixture(scope="session")
def minilm_repos(tmp_path_factory, minilm_checkpoint):
    """MiniLM exported in both layouts (real weights, the ONNX backend's real build)."""
    root = tmp_path_factory.mktemp("triton-export")
    ctx, _ = prepare(MINILM)
    return {runtime: export_triton(ctx, root / runtime, runtime=runtime) for runtime in ("onnxruntime", "python")}


def test_exported_layouts(minilm_repos):
    import onnx

    for runtime, folder in minilm_repos.items():
        assert folder.name == MINILM
        files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
        expected = ["1/model.onnx", "config.pbtxt"]
        if runtime == "python":
            # One cut-down model per output (ONNX Runtime runs every node of a graph whatever
            # output is asked for), all reading weights.bin with model.onnx.
            per_output = [f"1/model.{o}.onnx" for o in ("embedding", "hidden", "hidden_states", "pooled")]
            expected = ["1/linnet_io.json", *per_output, "1/model.onnx", "1/model.py", "1/weights.bin",
                        "config.pbtxt"]
            for output in ("embedding", "hidden", "hidden_states", "pooled"):
                cut = onnx.load(str(folder / "1" / f"model.{output}.onnx"), load_external_data=False).graph
                assert [o.name for o in cut.output] == [output]
                assert len(cut.node) < len(onnx.load(str(folder / "1" / "model.onnx"),
                                                      load_external_data=False).graph.node)
        assert files == sorted(expected), runtime
        config = parse_config((folder / "config.pbtxt").read_text())
        graph = onnx.load(str(folder / "1" / "model.onnx"), load_external_data=False).graph
        # The graph the server loads has exactly the tensors the config declares.
        assert [i.name for i in graph.input] == [i.name for i in config.input]
        assert [o.name for o in graph.output] == [o.name for o in config.output]
        assert [len(v.type.tensor_type.shape.dim) for v in graph.output] == [len(o.dims) + 1 for o in config.output]
    assert not list(minilm_repos["python"].parent.glob(".*.tmp*")), "staging folder left behind"


def test_python_spec_comes_from_the_program(minilm_repos):
    spec = json.loads((minilm_repos["python"] / "1" / "linnet_io.json").read_text())
    ctx, _ = prepare(MINILM, need_weights=False)
    entry = ctx.program.entries["forward"]
    bounds = {n: b.rows for n, b in index_bounds(ctx.program, entry).items()}
    assert bounds == {"tokens": 30522, "token_types": 2}  # Vocab and TypeVocab of nest.toml
    hidden = next(o for o in spec["outputs"] if o["name"] == "hidden")
    assert hidden["bounds"] == bounds
    assert hidden["preconditions"] == [[str(l), op, str(r)] for l, op, r, _ in entry.preconditions] == [["S", "<=", "512"]]
    assert [(i["name"], i["dtype"], i["dims"], i["default"]) for i in spec["inputs"]] == [
        ("tokens", "i32", ["B", "S"], None), ("token_types", "i32", ["B", "S"], 0),
        ("attention_mask", "i32", ["B", "S"], 1)]


def _model_py(folder: Path):
    """model.py imported outside Triton: its validation is plain Python."""
    module_spec = importlib.util.spec_from_file_location("linnet_triton_model", folder / "1" / "model.py")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module, json.loads((folder / "1" / "linnet_io.json").read_text())


def _ids(b, s, high=30522, seed=0):
    return np.random.default_rng(seed).integers(0, high, (b, s)).astype(np.int32)


@pytest.mark.parametrize("change,names", [
    (lambda t, y: (t[:, :0], y[:, :0]), ["tokens", "S = 0"]),
    (lambda t, y: (t[0], y[0]), ["tokens", "rank 2"]),
    (lambda t, y: (t.astype(np.int64), y), ["tokens", "i32", "int64"]),
    (lambda t, y: (t, y[:, :3]), ["token_types", "S = 3", "'tokens' has S = 4"]),
    (lambda t, y: (np.zeros((1, 600), np.int32), np.zeros((1, 600), np.int32)), ["tokens", "S <= 512", "S = 600"]),
    (lambda t, y: (np.where(t == t[0, 2], 40000, t), y), ["tokens", "40000", "[0, 30522)"]),
    (lambda t, y: (np.where(t == t[1, 1], -1, t), y), ["tokens", "-1", "[0, 30522)"]),
    (lambda t, y: (t, np.full_like(y, 2)), ["token_types", "holds 2", "[0, 2)"]),
])
def test_model_py_validation(minilm_repos, change, names):
    module, spec = _model_py(minilm_repos["python"])
    tokens, types = _ids(2, 4), np.zeros((2, 4), np.int32)
    assert module.validate(spec, {"tokens": tokens, "token_types": types}, ["hidden", "pooled"]) is None
    bad_tokens, bad_types = change(tokens, types)
    message = module.validate(spec, {"tokens": bad_tokens, "token_types": bad_types}, ["pooled"])
    assert message is not None
    for word in names:
        assert word in message, message


def test_model_py_dim_expressions(minilm_repos):
    module, _ = _model_py(minilm_repos["python"])
    # Linnet's `/` on dims is floor division.
    assert module.dim_value("S / 2 + 1", {"S": 7}) == 4
    assert module.dim_value("512", {}) == 512
    with pytest.raises(ValueError):
        module.dim_value("__import__('os')", {"S": 1})


def test_cli_export_triton(tmp_path, minilm_checkpoint, capsys):
    repo = tmp_path / "repo"
    assert main(["export-triton", MINILM, "-o", str(repo), "--max-batch-size", "4"]) == 0
    out = capsys.readouterr().out
    assert "exported all-minilm-l6-v2 for Triton (onnxruntime)" in out
    config = parse_config((repo / MINILM / "config.pbtxt").read_text())
    assert (config.platform, config.max_batch_size) == ("onnxruntime_onnx", 4)
    assert main(["export-triton", MINILM, "-o", str(repo), "--runtime", "python", "--max-batch-size", "-1"]) == 1
    assert "E0840" in capsys.readouterr().err
    # The failed export left the earlier one alone.
    assert parse_config((repo / MINILM / "config.pbtxt").read_text()).max_batch_size == 4
    with pytest.raises(SystemExit) as exit_info:
        main(["export-triton", str(Path(__file__).parents[1] / "std" / "nn" / "linear.linnet"), "-o", str(repo)])
    assert exit_info.value.code == 2


# ---------------------------------------------------------------- a real Triton server


@dataclass
class Served:
    server: TritonServer
    figures: dict = field(default_factory=dict)


@pytest.fixture(scope="session")
def triton_tools():
    started = time.perf_counter()
    try:
        tools = provision()
    except ProvisionError as exc:
        pytest.fail(f"could not provision the Triton server for the tests: {exc}", pytrace=False)
    print(f"\nTriton tools at {tools.root}: provisioned in {tools.seconds:.1f} s "
          f"(0 = already there; this call {time.perf_counter() - started:.1f} s)")
    return tools


@pytest.fixture(scope="session")
def served(request, tmp_path_factory, triton_tools):
    """One server for the session, on a repository with every model of SERVED (python runtime)."""
    root = tmp_path_factory.mktemp("triton-serve")
    figures: dict = {"export_seconds": {}, "export_mb": {}}
    for name, checkpoint_fixture in SERVED.items():
        request.getfixturevalue(checkpoint_fixture)
        ctx, _ = prepare(name)
        started = time.perf_counter()
        folder = export_triton(ctx, root / "repo", runtime="python")
        figures["export_seconds"][name] = round(time.perf_counter() - started, 2)
        figures["export_mb"][name] = round(sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 1e6, 1)
    server = TritonServer(root / "repo", triton_tools, log_path=root / "tritonserver.log")
    try:
        server.start()
    except ServerError as exc:
        pytest.fail(str(exc), pytrace=False)
    figures["start_seconds"] = round(server.start_seconds, 2)
    print(f"\nTriton server ready in {server.start_seconds:.2f} s on {server.http_url} (HTTP), "
          f"{server.grpc_url} (gRPC); exports: {figures['export_mb']} MB in {figures['export_seconds']} s")
    try:
        yield Served(server, figures)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def onnx_models(served):
    return {name: load(name, backend="onnx") for name in SERVED}


class Client:
    """tritonclient.http or .grpc behind one small interface."""

    def __init__(self, protocol: str, url: str):
        if protocol == "http":
            import tritonclient.http as module
        else:
            import tritonclient.grpc as module
        self.protocol, self.module = protocol, module
        self.client = module.InferenceServerClient(url)

    def infer(self, model: str, tokens: np.ndarray, types: np.ndarray | None, outputs=("hidden", "pooled"),
              attention_mask: np.ndarray | None = None):
        inputs = []
        given = (("tokens", tokens), ("token_types", types), ("attention_mask", attention_mask))
        for name, array in ((n, a) for n, a in given if a is not None):
            tensor = self.module.InferInput(name, list(array.shape), "INT32")
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        requested = [self.module.InferRequestedOutput(o) for o in outputs]
        return self.client.infer(model, inputs, outputs=requested)

    def close(self):
        self.client.close()


@pytest.fixture(params=["http", "grpc"])
def client(request, served):
    c = Client(request.param, served.server.http_url if request.param == "http" else served.server.grpc_url)
    yield c
    c.close()  # before the server stops: an open keep-alive connection holds shutdown up


@pytest.mark.parametrize("name", list(SERVED))
@pytest.mark.parametrize("batch,length", [(1, 7), (4, 64)])
def test_served_outputs_match_onnx_backend(client, served, onnx_models, name, batch, length):
    tokens, types = _ids(batch, length, seed=batch * 1000 + length), np.zeros((batch, length), np.int32)
    types[:, length // 2:] = 1
    result = client.infer(name, tokens, types)
    model = onnx_models[name]
    want = {"hidden": model(tokens, types), "pooled": model.pool(tokens, types)}
    for output, expected in want.items():
        got = result.as_numpy(output)
        assert got.shape == expected.shape and got.dtype == expected.dtype
        diff = float(np.max(np.abs(got.astype(np.float64) - expected)))
        served.figures.setdefault("max_abs_diff", {})[f"{name} {client.protocol} {batch}x{length} {output}"] = diff
        print(f"{name} {client.protocol} B={batch} S={length} {output}: max|diff| = {diff:.3g}")
        assert diff <= 1e-5


def test_padded_batch_through_triton_matches_onnx_backend(client, served, onnx_models):
    lengths = [3, 20, 11]
    tokens = _ids(len(lengths), max(lengths), seed=77)
    mask = np.zeros_like(tokens)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
    tokens = np.where(mask == 1, tokens, 0).astype(np.int32)
    result = client.infer(MINILM, tokens, None, outputs=("hidden", "embedding"), attention_mask=mask)
    model = onnx_models[MINILM]
    want_hidden, want_embed = model(tokens, attention_mask=mask), model.embed(tokens, attention_mask=mask)
    real = mask.astype(bool)
    hidden_diff = float(np.abs(result.as_numpy("hidden")[real] - want_hidden[real]).max())
    embed_diff = float(np.abs(result.as_numpy("embedding") - want_embed).max())
    served.figures.setdefault("max_abs_diff", {})[f"padded {client.protocol}"] = max(hidden_diff, embed_diff)
    assert hidden_diff <= 1e-5 and embed_diff <= 1e-5


def test_only_requested_outputs_come_back(client, served):
    result = client.infer(MINILM, _ids(2, 5), np.zeros((2, 5), np.int32), outputs=("pooled",))
    assert result.as_numpy("pooled").shape == (2, 384)
    assert result.as_numpy("hidden") is None


@pytest.mark.parametrize("case,names", [
    ("long", ["tokens", "S <= 512", "S = 600"]),
    ("big id", ["tokens", "40000"]),
    ("type id", ["token_types", "holds 2"]),
])
def test_bad_requests_get_an_error_and_the_server_keeps_serving(client, case, names):
    from tritonclient.utils import InferenceServerException

    tokens, types = _ids(1, 9), np.zeros((1, 9), np.int32)
    if case == "long":
        tokens, types = _ids(1, 600), np.zeros((1, 600), np.int32)
    elif case == "big id":
        tokens[0, 3] = 40000
    else:
        types[0, 5] = 2
    with pytest.raises(InferenceServerException) as info:
        client.infer(MINILM, tokens, types)
    message = info.value.message()
    for word in names:
        assert word in message, message
    # INVALID_ARG: the client's fault, which HTTP shows as 400.
    if client.protocol == "http":
        assert info.value.status() == "400", info.value.status()
    else:
        assert "INVALID_ARGUMENT" in str(info.value.status()), info.value.status()
    good = client.infer(MINILM, _ids(1, 9), np.zeros((1, 9), np.int32))
    assert good.as_numpy("pooled").shape == (1, 384)


def test_triton_rejects_batches_over_max_batch_size(client):
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException) as info:
        client.infer(MINILM, _ids(9, 4), np.zeros((9, 4), np.int32))
    assert "batch" in info.value.message().lower()


def test_server_listens_on_loopback_only(served):
    server = served.server
    sockets = listening_sockets(server.pid)
    ports = {port for _, port in sockets}
    assert {server.http_port, server.grpc_port, server.metrics_port} <= ports, sockets
    for address, port in sockets:
        ip = ipaddress.ip_address(address)
        mapped = getattr(ip, "ipv4_mapped", None)
        assert ip.is_loopback or (mapped is not None and mapped.is_loopback), (address, port)


def test_server_figures(served):
    """Prints what the session measured (run with -s or -rP to see it)."""
    figures = served.figures
    assert figures["start_seconds"] < 60
    print(json.dumps(figures, indent=1))
