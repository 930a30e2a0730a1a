"""The optimisation stage (linnet/middle/optimize.py): what it rewrites, the bind-time param plan,
and that the optimised program computes the same numbers as the program as written.
"""
from __future__ import annotations

import re
import types

import numpy as np
import pytest

from linnet.middle import ir
from linnet import nest
from linnet.middle.optimize import ParamTransform, bind_params, optimize


@pytest.fixture(scope="module")
def bert_program():
    ctx, _ = nest.prepare("bert-base-uncased", need_weights=False)
    return ctx.program


@pytest.fixture(scope="module")
def minilm_program():
    ctx, _ = nest.prepare("all-minilm-l6-v2", need_weights=False)
    return ctx.program


def test_qkv_fused_and_power_of_two_scale_folded(bert_program):
    before = [p for p, _ in bert_program.param_paths()]
    out = optimize(bert_program)
    ir.verify(out.program)
    attention = out.program.blocks["Attention"]
    assert [s.name for s in attention.subs] == ["query_key_value", "out"]
    fused = out.program.blocks[attention.subs[0].block]
    assert fused.source == "std.nn.linear::Linear" and dict(fused.params)["weight"].dims[0].as_int() == 2304
    assert out.plan["bert.encoder.layers.0.attention.query_key_value.weight"] == ParamTransform(
        "bert.encoder.layers.0.attention.query_key_value.weight",
        tuple(f"bert.encoder.layers.0.attention.{p}.weight" for p in ("query", "key", "value")),
        0, ((0, 768, 0.125),))
    assert len(out.plan) == 2 * 12
    # 1 / sqrt(64) = 0.125 is a power of two, so the call now passes scale 1.
    call = out.program.functions["Attention.context"].body[1].value  # where BERT calls attention
    assert call.args[3] == ir.Scalar(1.0, call.args[3].type)
    # The input program is left as it was.
    assert [p for p, _ in bert_program.param_paths()] == before
    assert "query_key_value" not in {s.name for s in bert_program.blocks["Attention"].subs}


def test_second_reads_of_the_projections_become_rows_of_the_fused_matmul(bert_program):
    """`Attention.probabilities` (the `attentions` entry) calls query and key again: each call
    site computes the fused matmul on its own input and slices it, and the folded scale holds
    for both attention paths, since every read of the query rows is an attention's queries."""
    out = optimize(bert_program)
    assert "Attention.context: fused query, key, value into one Linear<768, 2304> `query_key_value`" in out.applied
    assert "Attention.probabilities: query, key read as rows of the fused `query_key_value`" in out.applied
    assert [line for line in out.applied if "folded" in line] == [
        f"Attention.{fn}: folded the attention scale 0.125 into `query_key_value` rows [0, 768)"
        for fn in ("context", "probabilities")]
    probabilities = out.program.functions["Attention.probabilities"]
    let, ret = probabilities.body
    assert isinstance(let, ir.Let) and let.value.receiver == "query_key_value"
    rows = [e.attr("items")[-1][1:] for e in _exprs(ret.value) if isinstance(e, ir.Op) and e.op == "index"]
    assert [(a.as_int(), b.as_int()) for a, b in rows] == [(0, 768), (768, 1536)]
    assert ret.value.args[2] == ir.Scalar(1.0, ret.value.args[2].type)
    assert not any(isinstance(e, ir.Call) and e.receiver in ("query", "key") for e in _exprs(ret.value))


def _exprs(e):
    yield e
    for a in getattr(e, "args", ()):
        yield from _exprs(a)


def test_scale_stays_when_the_query_rows_are_read_elsewhere(bert_program):
    """A read of the query projection that is not an attention's queries (here: the rows
    returned by a method of their own) would see the folded scale, so nothing is folded."""
    import copy

    program = copy.deepcopy(bert_program)
    context = program.functions["Attention.context"]
    query_call = next(e for e in _exprs(context.body[-1].value) if isinstance(e, ir.Call) and e.receiver == "query")
    program.functions["Attention.raw_query"] = ir.Function(
        "Attention.raw_query", "raw_query", context.source, "Attention", context.params[:1],
        [ir.Return(query_call, context.body[-1].line)], query_call.type, context.span, dict(context.generics),
        dict(context.dim_sources))
    program.blocks["Attention"].methods["raw_query"] = "Attention.raw_query"
    out = optimize(program, passes=("fuse_linears", "fold_attention_scale"))
    assert any("Attention.raw_query: query read as rows" in line for line in out.applied)
    assert not any("folded" in line for line in out.applied)
    assert all(not t.row_scales for t in out.plan.values())


def test_scale_that_is_not_a_power_of_two_is_kept_unless_inexact_allowed(minilm_program):
    exact = optimize(minilm_program)  # Dh = 32: scale 1 / sqrt(32)
    assert all(not t.row_scales for t in exact.plan.values())
    assert any("fused query, key, value" in line for line in exact.applied)
    assert "Attention.probabilities: query, key read as rows of the fused `query_key_value`" in exact.applied
    loose = optimize(minilm_program, exact=False)
    assert loose.plan["encoder.layers.0.attention.query_key_value.bias"].row_scales[0][:2] == (0, 384)


def test_passes_can_be_chosen(bert_program):
    only_scale = optimize(bert_program, passes=("fold_attention_scale",))
    assert {s.name for s in only_scale.program.blocks["Attention"].subs} == {"query", "key", "value", "out"}
    assert only_scale.plan["bert.encoder.layers.3.attention.query.weight"].row_scales == ((0, 768, 0.125),)
    assert not optimize(bert_program, passes=()).plan


def _random_params(program: ir.Program, seed=0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {path: (rng.standard_normal(tuple(d.as_int() for d in t.dims)) * 0.05).astype(np.float32)
            for path, t in program.param_paths()}


def test_bind_params_applies_the_plan_once(bert_program):
    out = optimize(bert_program)
    params = _random_params(bert_program)
    bound = bind_params(out, params)
    assert set(bound) == {p for p, _ in out.program.param_paths()}
    w = bound["bert.encoder.layers.2.attention.query_key_value.weight"]
    np.testing.assert_array_equal(w[:768],
                                  params["bert.encoder.layers.2.attention.query.weight"] * np.float32(0.125))
    np.testing.assert_array_equal(w[768:1536], params["bert.encoder.layers.2.attention.key.weight"])
    np.testing.assert_array_equal(w[1536:], params["bert.encoder.layers.2.attention.value.weight"])
    # Untouched params are not copied.
    assert bound["bert.encoder.layers.2.up.weight"] is params["bert.encoder.layers.2.up.weight"]
    assert params["bert.encoder.layers.2.attention.query.weight"].max() > 0  # the originals are not modified in place


def _torch_model(program: ir.Program, params: dict):
    import torch

    from linnet.backends.torch_source import emit
    from linnet.backends.torch_runtime import torch_param_name
    from linnet.backends.pysource import py_name

    module = types.ModuleType("linnet_test_optimize_model")
    exec(compile(emit(program), "<generated>", "exec"), module.__dict__)
    with torch.device("meta"):
        model = getattr(module, py_name(program.root))()
    state = {torch_param_name(k): torch.from_numpy(np.ascontiguousarray(v)) for k, v in params.items()}
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval()


@pytest.mark.parametrize("batch,seq", [(1, 1), (2, 7), (1, 128)])
def test_optimised_torch_program_is_bit_identical(bert_program, batch, seq):
    torch = pytest.importorskip("torch")
    # The weight-level passes; packing changes the GEMM sizes (held to 1e-5 in test_packing.py).
    out = optimize(bert_program, passes=("fuse_linears", "fold_attention_scale"))
    params = _random_params(bert_program, seed=1)
    plain, fused = _torch_model(bert_program, params), _torch_model(out.program, bind_params(out, params))
    rng = np.random.default_rng(seq)
    tokens = torch.from_numpy(rng.integers(0, 30522, (batch, seq), dtype=np.int32))
    types_ = torch.from_numpy(rng.integers(0, 2, (batch, seq), dtype=np.int32))
    mask = torch.ones((batch, seq), dtype=torch.int32)
    if seq > 1:
        mask[0, -2:] = 0
    with torch.inference_mode():
        a, b = plain.pool(tokens, types_, mask), fused.pool(tokens, types_, mask)
        h1, h2 = plain(tokens, types_, mask), fused(tokens, types_, mask)
        # The probabilities read Q and K as rows of the fused matmul, Q scaled in the weights.
        p1, p2 = plain.attentions(tokens, types_, mask), fused.attentions(tokens, types_, mask)
    assert (h1 - h2).abs().max().item() == 0.0
    assert (a - b).abs().max().item() == 0.0
    assert (p1 - p2).abs().max().item() == 0.0


def test_nest_load_optimises_by_default_and_can_opt_out(minilm_checkpoint):
    # Without packing, whose smaller GEMMs round differently (within 1e-5: test_packing.py), and
    # with the default kernels: kernels="auto" measures per shape, and may pick oneDNN for the fused
    # QKV product but not for the three separate ones, which rounds differently (2.3e-6 in CI).
    optimised = nest.load("all-minilm-l6-v2", backend="torch", packing=False, kernels="default")
    plain = nest.load("all-minilm-l6-v2", backend="torch", optimize=False, kernels="default")
    assert "query_key_value" in optimised.info.generated.read_text()
    assert "query_key_value" not in plain.info.generated.read_text()
    tokens = np.random.default_rng(3).integers(0, 30522, (2, 33))
    assert (optimised(tokens) - plain(tokens)).abs().max().item() == 0.0
    assert (optimised.embed(tokens) - plain.embed(tokens)).abs().max().item() == 0.0
    # The second load reads the compiled program and the fused weights from the cache.
    again = nest.load("all-minilm-l6-v2", backend="torch", packing=False, kernels="default")
    assert (again(tokens) - optimised(tokens)).abs().max().item() == 0.0


# ------------------------------------------------------------- pass infrastructure


def test_every_default_pass_is_a_registered_record_in_an_order_it_allows():
    from linnet.middle.optimize import PASSES, REGISTRY

    assert set(PASSES) <= set(REGISTRY)
    for i, name in enumerate(PASSES):
        assert set(REGISTRY[name].requires) <= set(PASSES[:i]), name
    # The two that compute some values over fewer rows are the ones not claimed bit-exact.
    assert {name for name, p in REGISTRY.items() if not p.exact} == {"dead_rows", "pack_tokens"}


def test_the_runner_refuses_a_pass_before_one_it_requires(bert_program):
    from linnet.diagnostics import InternalError

    with pytest.raises(InternalError, match="`dead_rows` must run after `fuse_linears`"):
        optimize(bert_program, passes=("dead_rows", "fuse_linears"))
    with pytest.raises(ValueError, match="no optimisation pass 'fuse'"):
        optimize(bert_program, passes=("fuse",))


def test_verify_between_passes_names_the_pass_that_broke_the_program(bert_program):
    from linnet.diagnostics import InternalError

    def drop_a_let(state, exact):  # a broken pass: a variable read but no longer defined
        fn = next(f for f in state.program.functions.values() if any(isinstance(s, ir.Let) for s in f.body))
        fn.body[:] = [s for s in fn.body if not isinstance(s, ir.Let)]

    state = types.SimpleNamespace(program=__import__("copy").deepcopy(bert_program))
    with pytest.raises(InternalError, match="reference to undefined") as caught:
        ir.run_passes(state, [ir.Pass("fine", lambda s, e: None), ir.Pass("broken", drop_a_let)], verify_each=True)
    assert caught.value.__notes__ == ["found by ir.verify after the pass `broken`"]


def test_verify_checks_call_arity_and_the_types_variables_are_read_at(bert_program):
    import copy
    from dataclasses import replace

    from linnet.diagnostics import InternalError

    program = copy.deepcopy(bert_program)
    fn = next(f for f in program.functions.values()
              if any(isinstance(e, ir.Call) and e.args for e in ir.exprs(f.body)) and f.body
              and isinstance(f.body[-1], ir.Return) and isinstance(f.body[-1].value, ir.Call))
    call = fn.body[-1].value
    fn.body[-1] = replace(fn.body[-1], value=replace(call, args=call.args[:-1]))
    with pytest.raises(InternalError, match=f"a call of {call.function} with {len(call.args) - 1} arguments"):
        ir.verify(program)

    program = copy.deepcopy(bert_program)
    fn = program.functions[program.entries["forward"].function]
    name, t = next((n, t) for n, t in fn.params if t is not None)
    wrong = ir.TensorType(t.dims, "f64" if t.dtype != "f64" else "f32")
    fn.body = ir.map_stmts(fn.body, lambda e: ir.Ref(name, wrong) if isinstance(e, ir.Ref) and e.name == name else None)
    with pytest.raises(InternalError, match=re.escape(f"`{name}` is read as {wrong}, but it holds {t}")):
        ir.verify(program)


def test_fresh_names_and_clone_ids_never_collide(bert_program):
    assert ir.fresh("x", {"x", "x_2"}) == "x_3"
    assert ir.fresh_id("f_rows", {"f_rows": 1}, {"f_rows_"}) == "f_rows__"
    clones = ir.Specialisations(bert_program, "rows")
    fn = bert_program.functions["Attention.context"]
    first = clones.clone(fn, fn.params, fn.body, fn.result, dict(fn.dim_sources), "a note")
    second = clones.clone(fn, fn.params, fn.body, fn.result, dict(fn.dim_sources), "a note")
    assert (first, second) == ("Attention.context_rows", "Attention.context_rows_")
    assert clones.made[first].name == "context_rows" and clones.made[first].notes == ["a note"]
    assert first not in bert_program.functions  # the pass decides what to install
