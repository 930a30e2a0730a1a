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
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from linnet import codes
from linnet.cli import main
from linnet.diagnostics import LinnetError
from linnet.nest import load, prepare
from linnet.runtime import index_bounds
from linnet.testing.triton_server import (ProvisionError, ServerError, TritonServer, listening_sockets,
                                          provision)
from linnet.serving.triton import config_text, export_passes, export_triton, layout_configs, triton_io

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
    # Served by default: the entries taking the root's inputs (not the loss entries, which take labels too),
    # except `attentions`, whose [B, Layers, Heads, S, S] probabilities grow with the square of S.
    outputs = [(ctx.output_name(e.name), PB_TYPES[e.result.dtype], dims(e.result)) for e in program.entries.values()
               if e.inputs == root.inputs and e.name != "attentions"]
    return ctx, inputs, outputs


def test_loss_entries_are_served_only_when_named():
    ctx, _ = prepare(BERT, need_weights=False)
    served = [o.entry for o in triton_io(ctx).outputs]
    assert "forward" in served and not [e for e in served if e.endswith("loss")]
    assert "mlm_loss" in ctx.program.entries
    # named, a loss entry is served alone (its inputs include the labels) ...
    io = triton_io(ctx, entries=["mlm_loss"])
    assert [i.name for i in io.inputs] == ["tokens", "token_types", "attention_mask", "labels"]
    assert [(o.entry, o.dims) for o in io.outputs] == [("mlm_loss", ())]
    # ... and refused beside an entry without labels, as any two entries with different inputs
    with pytest.raises(LinnetError) as info:
        triton_io(ctx, entries=["forward", "mlm_loss"])
    assert info.value.code == codes.TRITON_INCOMPATIBLE_ENTRIES


def test_attentions_are_served_only_when_named():
    """`attentions` takes the same inputs and batches along B, but a result per pair of
    positions is no default: named, it is served beside `forward`, batched."""
    ctx, _ = prepare(MINILM, need_weights=False)
    assert "attentions" in ctx.program.entries
    assert "attentions" not in [o.entry for o in triton_io(ctx).outputs]
    io = triton_io(ctx, entries=["forward", "attentions"])
    assert [(o.entry, o.dims) for o in io.outputs] == [("forward", ("B", "S", "384")),
                                                       ("attentions", ("B", "6", "12", "S", "S"))]
    assert io.batch_dim == "B"


@pytest.mark.parametrize("runtime", ["onnxruntime", "python"])
@pytest.mark.parametrize("name,dtype,width", [(MINILM, None, 384), (BERT, None, 768), (MINILM, "f16", 384)])
def test_config_parses_with_tritons_schema(name, dtype, width, runtime):
    ctx, inputs, outputs = expected_io(name, dtype, batched=True)
    config = parse_config(config_text(triton_io(ctx), max_batch_size=8, runtime=runtime))
    assert config.name == name
    assert config.max_batch_size == 8
    if runtime == "onnxruntime":  # an ensemble; the steps batch, the ensemble passes requests on
        assert (config.platform, config.backend) == ("ensemble", "")
        assert not config.HasField("dynamic_batching")
    else:
        assert (config.platform, config.backend) == ("", "python")
        assert config.HasField("dynamic_batching")
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == inputs
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == outputs
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
    # Inputs with a Linnet default may be left out: model.py (the python model, or the
    # ensemble's validating step) fills them.
    optional = {i.name: i.optional for i in config.input}
    assert optional == {"tokens": False, "token_types": True, "attention_mask": True}


@pytest.mark.parametrize("name", [MINILM, BERT])
def test_onnxruntime_layout_configs(name):
    ctx, inputs, outputs = expected_io(name, None, batched=True)
    configs = {n: parse_config(t) for n, t in layout_configs(triton_io(ctx)).items()}
    names = [o[0] for o in outputs]
    assert list(configs) == [name, f"{name}.validate", *(f"{name}.{o}" for o in names)]
    for config_name, config in configs.items():
        assert config.name == config_name and config.max_batch_size == 8
    # The validating step takes the client's inputs (defaults optional) and gives them back checked.
    check = configs[f"{name}.validate"]
    assert check.backend == "python" and check.HasField("dynamic_batching")
    assert [(i.name, i.data_type, list(i.dims), i.optional) for i in check.input] == [
        (n, t, d, n != "tokens") for n, t, d in inputs]
    assert [(o.name, o.data_type, list(o.dims)) for o in check.output] == [("checked_" + n, t, d) for n, t, d in inputs]
    # One ONNX Runtime model per output; ONNX Runtime needs every graph input.
    for output in outputs:
        step = configs[f"{name}.{output[0]}"]
        assert (step.platform, step.default_model_filename) == ("onnxruntime_onnx", "model.onnx")
        assert [(i.name, i.data_type, list(i.dims), i.optional) for i in step.input] == [(*i, False) for i in inputs]
        assert [(o.name, o.data_type, list(o.dims)) for o in step.output] == [output]
        assert step.HasField("dynamic_batching")
    # The ensemble: validate first, then each output's model reads the checked tensors.
    steps = configs[name].ensemble_scheduling.step
    assert [s.model_name for s in steps] == [f"{name}.validate", *(f"{name}.{o}" for o in names)]
    assert dict(steps[0].input_map) == {n: n for n, _, _ in inputs}
    assert dict(steps[0].output_map) == {f"checked_{n}": f"checked_{n}" for n, _, _ in inputs}
    for step, output in zip(steps[1:], names):
        assert dict(step.input_map) == {n: f"checked_{n}" for n, _, _ in inputs}
        assert dict(step.output_map) == {output: output}


@pytest.mark.parametrize("runtime", ["onnxruntime", "python"])
def test_serving_options_reach_every_model_that_runs_work(runtime):
    ctx, _, _ = expected_io(MINILM, None, batched=True)
    configs = layout_configs(triton_io(ctx), runtime=runtime, max_batch_size=16, preferred_batch_sizes=(4, 16),
                             max_queue_delay_us=250, instances=3, threads=2)
    working = [parse_config(t) for t in configs.values()]
    working = [c for c in working if c.platform != "ensemble"]
    assert len(working) == (1 if runtime == "python" else 5)
    for config in working:
        assert list(config.dynamic_batching.preferred_batch_size) == [4, 16]
        assert config.dynamic_batching.max_queue_delay_microseconds == 250
        assert [g.count for g in config.instance_group] == [3]
        # Threads are the ONNX Runtime backend's parameter; the Python backend's sessions read
        # them from linnet_io.json (test_exported_python_layout).
        threads = {k: v.string_value for k, v in config.parameters.items()}
        assert threads == ({"intra_op_thread_count": "2"} if config.platform == "onnxruntime_onnx" else {})
    plain = [parse_config(t) for t in layout_configs(triton_io(ctx), runtime=runtime).values()]
    plain = [c for c in plain if c.platform != "ensemble"]
    # One instance per device unless asked (Triton would give ONNX Runtime two on a CPU), and
    # ONNX Runtime's own thread count.
    assert all([g.count for g in c.instance_group] == [1] and not c.parameters for c in plain)
    unset = [parse_config(t) for t in layout_configs(triton_io(ctx), runtime=runtime, instances=None).values()]
    assert not any(c.instance_group for c in unset)  # Triton's default


def test_entry_set_to_serve():
    ctx, _, _ = expected_io(BERT, None, batched=True)
    io = triton_io(ctx, entries=["embed", "pooled"])  # an entry's name or its output's
    assert [o.name for o in io.outputs] == ["pooled", "embedding"]  # program order
    assert list(layout_configs(io)) == [BERT, f"{BERT}.validate", f"{BERT}.pooled", f"{BERT}.embedding"]
    with pytest.raises(LinnetError) as info:
        triton_io(ctx, entries=["embed", "nope"])
    assert info.value.code == "E0840" and "'nope'" in str(info.value) and "mlm_logits" in str(info.value)


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
    ({"preferred_batch_sizes": (4, 9)}, "E0840", "[1, max_batch_size = 8]"),
    ({"preferred_batch_sizes": (0,)}, "E0840", "preferred"),
    ({"max_batch_size": 0, "preferred_batch_sizes": (1,)}, "E0840", "batching is off"),
    ({"max_queue_delay_us": -5}, "E0840", "max_queue_delay_us"),
    ({"max_batch_size": 0, "max_queue_delay_us": 100}, "E0840", "max_batch_size > 0"),
    ({"instances": 0}, "E0840", "instances"),
    ({"threads": 0}, "E0840", "threads must be a whole number >= 1"),
    ({"threads": 1.5}, "E0840", "threads"),
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


OUTPUTS = ("hidden", "hidden_states", "pooled", "embedding")


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def _graph(path: Path):
    import onnx

    return onnx.load(str(path), load_external_data=False).graph


def test_exported_python_layout(minilm_repos):
    folder = minilm_repos["python"]
    assert folder.name == MINILM
    # One cut-down model per output (ONNX Runtime runs every node of a graph whatever output
    # is asked for), all reading weights.bin with model.onnx.
    assert _files(folder) == sorted(["1/linnet_io.json", *(f"1/model.{o}.onnx" for o in OUTPUTS), "1/model.onnx",
                                     "1/model.py", "1/weights.bin", "config.pbtxt", "linnet_export.json"])
    whole = _graph(folder / "1" / "model.onnx")
    for output in OUTPUTS:
        cut = _graph(folder / "1" / f"model.{output}.onnx")
        assert [o.name for o in cut.output] == [output]
        assert len(cut.node) < len(whole.node)
    config = parse_config((folder / "config.pbtxt").read_text())
    # The graph the server loads has exactly the tensors the config declares.
    assert [i.name for i in whole.input] == [i.name for i in config.input]
    assert [o.name for o in whole.output] == [o.name for o in config.output]
    assert [len(v.type.tensor_type.shape.dim) for v in whole.output] == [len(o.dims) + 1 for o in config.output]
    assert not list(folder.parent.glob(".*.tmp*")), "staging folder left behind"


def test_exported_onnxruntime_layout(minilm_repos):
    folder = minilm_repos["onnxruntime"]
    repo = folder.parent
    assert folder.name == MINILM
    assert sorted(p.name for p in repo.iterdir()) == sorted([MINILM, f"{MINILM}.validate",
                                                             *(f"{MINILM}.{o}" for o in OUTPUTS)])
    assert _files(folder) == ["config.pbtxt", "linnet_export.json"] and (folder / "1").is_dir()
    assert _files(repo / f"{MINILM}.validate") == ["1/linnet_io.json", "1/model.py", "config.pbtxt"]
    weights = set()
    for output in OUTPUTS:
        step = repo / f"{MINILM}.{output}"
        assert _files(step) == ["1/model.onnx", "1/weights.bin", "config.pbtxt"]
        config = parse_config((step / "config.pbtxt").read_text())
        graph = _graph(step / "1" / "model.onnx")
        assert [i.name for i in graph.input] == [i.name for i in config.input]
        assert [o.name for o in graph.output] == [o.name for o in config.output] == [output]
        weights.add((step / "1" / "weights.bin").stat().st_ino)
    # The weights are written once and hard-linked into every output's folder.
    assert len(weights) == 1
    spec = json.loads((repo / f"{MINILM}.validate" / "1" / "linnet_io.json").read_text())
    assert spec["role"] == "validate" and [o["name"] for o in spec["outputs"]] == list(OUTPUTS)


def test_re_export_replaces_the_companions(tmp_path, minilm_checkpoint):
    ctx, _ = prepare(MINILM)
    repo = tmp_path / "repo"
    (repo / "someone-else").mkdir(parents=True)
    (repo / "someone-else" / "config.pbtxt").write_text("name: \"someone-else\"\n")
    export_triton(ctx, repo)
    export_triton(ctx, repo, entries=["embed"])
    assert sorted(p.name for p in repo.iterdir()) == sorted([MINILM, f"{MINILM}.validate", f"{MINILM}.embedding",
                                                             "someone-else"])
    assert [o.name for o in parse_config((repo / MINILM / "config.pbtxt").read_text()).output] == ["embedding"]
    export_triton(ctx, repo, runtime="python", entries=["pool", "embed"])
    assert sorted(p.name for p in repo.iterdir()) == [MINILM, "someone-else"]
    assert [o.name for o in _graph(repo / MINILM / "1" / "model.onnx").output] == ["pooled", "embedding"]


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


@pytest.mark.parametrize("threads", [None, 1])
def test_model_py_sessions_take_the_exported_threads(minilm_repos, tmp_path, threads):
    """The python layout's sessions use `--threads` intra-op threads (linnet_io.json), else ONNX
    Runtime's default (0: one per core)."""
    source = minilm_repos["python"] / "1"
    version = tmp_path / MINILM / "1"
    version.mkdir(parents=True)
    for path in source.iterdir():  # links, not copies: only linnet_io.json differs
        if path.name != "linnet_io.json":
            (version / path.name).symlink_to(path)
    spec = json.loads((source / "linnet_io.json").read_text())
    assert spec["threads"] is None  # exported without --threads
    (version / "linnet_io.json").write_text(json.dumps({**spec, "threads": threads}))
    module, _ = _model_py(tmp_path / MINILM)
    model = module.TritonPythonModel()
    model.initialize({"model_repository": str(tmp_path / MINILM), "model_version": "1"})
    session = model._session(["embedding"])
    assert session.get_session_options().intra_op_num_threads == (threads or 0)


def test_cli_export_triton(tmp_path, minilm_checkpoint, capsys):
    repo = tmp_path / "repo"
    assert main(["export-triton", MINILM, "-o", str(repo), "--max-batch-size", "4"]) == 0
    out = capsys.readouterr().out
    assert "exported all-minilm-l6-v2 for Triton (onnxruntime)" in out
    assert f"{MINILM}.embedding/1/model.onnx" in out and f"{MINILM}.validate/1/model.py" in out
    config = parse_config((repo / MINILM / "config.pbtxt").read_text())
    assert (config.platform, config.max_batch_size) == ("ensemble", 4)
    assert main(["export-triton", MINILM, "-o", str(repo), "--runtime", "python", "--max-batch-size", "-1"]) == 1
    assert "E0840" in capsys.readouterr().err
    # The failed export left the earlier one alone.
    assert parse_config((repo / MINILM / "config.pbtxt").read_text()).max_batch_size == 4
    with pytest.raises(SystemExit) as exit_info:
        main(["export-triton", str(Path(__file__).parents[1] / "std" / "nn" / "linear.linnet"), "-o", str(repo)])
    assert exit_info.value.code == 2


def test_cli_serving_options(tmp_path, minilm_checkpoint, capsys):
    repo = tmp_path / "repo"
    assert main(["export-triton", MINILM, "-o", str(repo), "--entries", "embed,pooled", "--max-batch-size", "16",
                 "--preferred-batch-sizes", "8,16", "--max-queue-delay-us", "500", "--instances", "2", "--threads", "1"]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in repo.iterdir()) == [MINILM, f"{MINILM}.embedding", f"{MINILM}.pooled",
                                                      f"{MINILM}.validate"]
    config = parse_config((repo / f"{MINILM}.embedding" / "config.pbtxt").read_text())
    assert config.max_batch_size == 16 and list(config.dynamic_batching.preferred_batch_size) == [8, 16]
    assert config.dynamic_batching.max_queue_delay_microseconds == 500 and config.instance_group[0].count == 2
    assert config.parameters["intra_op_thread_count"].string_value == "1"
    with pytest.raises(SystemExit):
        main(["export-triton", MINILM, "-o", str(repo), "--preferred-batch-sizes", "8,x"])
    assert "whole numbers" in capsys.readouterr().err
    assert main(["export-triton", MINILM, "-o", str(repo), "--entries", "nope"]) == 1
    err = capsys.readouterr().err
    assert "E0840" in err and "'nope'" in err


# ---------------------------------------------------------------- a real Triton server

LAYOUTS = ("onnxruntime", "python")


@dataclass
class Served:
    server: TritonServer
    runtime: str
    figures: dict = field(default_factory=dict)


def test_missing_build_tools_fail_with_what_to_install(tmp_path, monkeypatch):
    """No cmake on PATH and no earlier build: the error says which Debian packages to install."""
    from linnet.testing.triton_ort import build_onnxruntime_backend
    from linnet.testing.triton_server import ServerTools

    (tmp_path / "backends").mkdir()
    tools = ServerTools(root=tmp_path, tritonserver=tmp_path / "none", backends=tmp_path / "backends",
                        libs=tmp_path, stub_venv=tmp_path, seconds=0.0)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    with pytest.raises(ProvisionError) as info:
        build_onnxruntime_backend(tools)
    message = str(info.value)
    assert "cmake" in message and "apt-get install -y cmake g++ ninja-build rapidjson-dev libb64-0d" in message


@pytest.fixture(scope="session")
def triton_tools():
    from linnet.testing.triton_ort import build_onnxruntime_backend

    started = time.perf_counter()
    try:
        tools = provision()
        build_started = time.perf_counter()
        backend = build_onnxruntime_backend(tools)
    except ProvisionError as exc:
        pytest.fail(f"could not provision the Triton server for the tests: {exc}", pytrace=False)
    print(f"\nTriton tools at {tools.root}: provisioned in {tools.seconds:.1f} s "
          f"(0 = already there), ONNX Runtime backend {backend} ready in {time.perf_counter() - build_started:.1f} s; "
          f"this call {time.perf_counter() - started:.1f} s")
    return tools


@pytest.fixture(scope="session", params=LAYOUTS)
def served(request, tmp_path_factory, triton_tools):
    """One server per layout, on a repository with every model of SERVED (the layouts' two
    servers run one after the other: pytest finishes one parameter's tests first)."""
    runtime = request.param
    root = tmp_path_factory.mktemp(f"triton-serve-{runtime}")
    figures: dict = {"export_seconds": {}, "export_mb": {}}
    for name, checkpoint_fixture in SERVED.items():
        request.getfixturevalue(checkpoint_fixture)
        ctx, _ = prepare(name, optimize=export_passes())  # what `linnet export-triton` serves: packed
        started = time.perf_counter()
        export_triton(ctx, root / "repo", runtime=runtime)
        figures["export_seconds"][name] = round(time.perf_counter() - started, 2)
        # Hard links are counted once: they are one file on disk.
        inodes = {p.stat().st_ino: p.stat().st_size for p in (root / "repo").rglob("*")
                  if p.is_file() and p.parts[len(root.parts) + 1].startswith(name)}
        figures["export_mb"][name] = round(sum(inodes.values()) / 1e6, 1)
    server = TritonServer(root / "repo", triton_tools, log_path=root / "tritonserver.log")
    try:
        server.start()
    except ServerError as exc:
        pytest.fail(str(exc), pytrace=False)
    figures["start_seconds"] = round(server.start_seconds, 2)
    print(f"\nTriton server ({runtime} layout) ready in {server.start_seconds:.2f} s on {server.http_url} (HTTP), "
          f"{server.grpc_url} (gRPC); exports: {figures['export_mb']} MB in {figures['export_seconds']} s")
    try:
        yield Served(server, runtime, figures)
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)  # ~1-2.5 GB of exports; the suite's disk is finite


@pytest.fixture(scope="session")
def onnx_models(minilm_checkpoint, bert_base_checkpoint):
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
        from tritonclient.utils import np_to_triton_dtype

        inputs = []
        given = (("tokens", tokens), ("token_types", types), ("attention_mask", attention_mask))
        for name, array in ((n, a) for n, a in given if a is not None):
            tensor = self.module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        requested = [self.module.InferRequestedOutput(o) for o in outputs]
        return self.client.infer(model, inputs, outputs=requested)

    def executions(self, model: str) -> int:
        """How many times the server has run `model` (its inference statistics)."""
        stats = self.client.get_inference_statistics(model)
        if self.protocol == "http":
            return int(stats["model_stats"][0]["inference_count"])
        return int(stats.model_stats[0].inference_count)

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
        print(f"{served.runtime}: {name} {client.protocol} B={batch} S={length} {output}: max|diff| = {diff:.3g}")
        assert diff <= 1e-5


def test_every_output_is_served(client, served, onnx_models):
    tokens = _ids(2, 6, seed=3)
    result = client.infer(BERT, tokens, None, outputs=("hidden_states", "embedding", "mlm_logits", "nsp_logits"))
    model = onnx_models[BERT]
    for output, entry in (("hidden_states", "hidden_states"), ("embedding", "embed"), ("mlm_logits", "mlm"),
                          ("nsp_logits", "nsp")):
        want = model.run(entry, tokens)
        got = result.as_numpy(output)
        assert got.shape == want.shape, output
        assert float(np.max(np.abs(got.astype(np.float64) - want))) <= 1e-4, output


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


def test_an_embedding_request_runs_no_other_head(served):
    """onnxruntime layout: Triton runs only the ensemble steps whose outputs were asked for,
    counted by its own statistics; python layout: model.py opens only the cut model."""
    client = Client("grpc", served.server.grpc_url)
    try:
        heads = [f"{BERT}.{o}" for o in ("hidden", "hidden_states", "pooled", "mlm_logits", "nsp_logits")]
        if served.runtime == "onnxruntime":
            before = {m: client.executions(m) for m in [*heads, f"{BERT}.embedding", f"{BERT}.validate"]}
        result = client.infer(BERT, _ids(3, 8), None, outputs=("embedding",))
        assert result.as_numpy("embedding").shape == (3, 768)
        if served.runtime == "onnxruntime":
            # Triton may update its statistics a moment after the response has left, so the
            # counts are read until the two asked-for steps show their run (at most 5 s).
            deadline = time.monotonic() + 5
            while True:
                after = {m: client.executions(m) for m in before}
                ran = {m: after[m] - before[m] for m in before}
                if min(ran[f"{BERT}.embedding"], ran[f"{BERT}.validate"]) >= 3 or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert ran == {**{m: 0 for m in heads}, f"{BERT}.embedding": 3, f"{BERT}.validate": 3}, ran
    finally:
        client.close()
    if served.runtime == "python":
        module, _ = _model_py(served.server.repo / BERT)
        model = module.TritonPythonModel()
        model.initialize({"model_repository": str(served.server.repo / BERT), "model_version": "1"})
        session = model._session(["embedding"])
        assert [o.name for o in session.get_outputs()] == ["embedding"]
        assert list(model.sessions) == ["model.embedding.onnx"]


BAD_REQUESTS = {
    # case: (what is changed, words the error must hold: the input and its bound)
    "long": ["tokens", "S <= 512", "S = 600"],
    "big id": ["tokens", "40000", "[0, 30522)"],
    "type id": ["token_types", "holds 2", "[0, 2)"],
    "int64 tokens": ["tokens", "INT32"],
    "float types": ["token_types", "INT32"],
    "rank 3": ["tokens", "[-1,-1]"],
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_requests_get_an_error_and_the_server_keeps_serving(client, served, case):
    from tritonclient.utils import InferenceServerException

    tokens, types = _ids(1, 9), np.zeros((1, 9), np.int32)
    if case == "long":
        tokens, types = _ids(1, 600), np.zeros((1, 600), np.int32)
    elif case == "big id":
        tokens[0, 3] = 40000
    elif case == "type id":
        types[0, 5] = 2
    elif case == "int64 tokens":
        tokens = tokens.astype(np.int64)
    elif case == "float types":
        types = types.astype(np.float32)
    else:
        tokens, types = tokens[:, :, None], None
    with pytest.raises(InferenceServerException) as info:
        client.infer(MINILM, tokens, types)
    message = info.value.message()
    for word in BAD_REQUESTS[case]:
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


def test_server_healthy_after_the_session(served):
    """Runs after the requests above (pytest keeps file order within a layout)."""
    client = Client("http", served.server.http_url)
    try:
        assert client.client.is_server_live() and client.client.is_server_ready()
        for name in SERVED:
            assert client.client.is_model_ready(name)
    finally:
        client.close()


def test_server_figures(served):
    """Prints what the session measured (run with -s or -rP to see it)."""
    figures = served.figures
    assert figures["start_seconds"] < 60
    print(json.dumps({"layout": served.runtime, **figures}, indent=1))
