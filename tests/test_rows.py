"""Dead-row elimination (linnet/middle/rows.py): where it applies, that it changes no number, and
where it must leave a program alone.

* ViT's `forward` and `embed` read the class token only: the last encoder layer's query, output
  projection, MLP and norms run on that one row (its keys and values on every row), the loop's
  last pass peeled off; `hidden_states` reads every row and is not touched.
* BERT's `pool` and a sequence classifier's `logits` likewise; `forward` and `hidden_states` not.
* With the pass on, every entry equals the program with it off within 1e-5 on torch, ONNX and
  JAX (small random models saved by transformers' own `save_pretrained`, and padded batches for
  BERT, so that it composes with packing).
* A small program of our own: an index behind a cumsum or a mean over the tokens is not pushed
  through them; behind attention it reaches the query only.
"""
from __future__ import annotations

import numpy as np
import pytest

from fixtures.hf_checkpoints import write_transformers_repo
from fixtures.parity import max_diff
from fixtures.programs import lowered, torch_model
from fixtures.vit_checkpoints import write_small_vit_repo
from linnet import nest
from linnet.middle import ir
from linnet.middle.optimize import PASSES, optimize

TOL = 1e-5
BACKENDS = ["torch", "onnx", "jax"]


def _np(x):
    return x.detach().numpy() if hasattr(x, "detach") else np.asarray(x)


def _ops(stmts):
    return [e for e in ir.exprs(stmts) if isinstance(e, ir.Op)]


def _loops(stmts):
    return [s for s in stmts if isinstance(s, ir.Loop)]


# ------------------------------------------------------------------------- what it rewrites


def test_vit_forward_and_embed_compute_the_last_layer_for_the_class_token_only():
    ctx, _ = nest.prepare("vit-base-patch16-224", need_weights=False)
    out = optimize(ctx.program)
    applied = [line for line in out.applied if "dead rows" in line]
    assert sorted(line.split(":")[0] for line in applied) == ["embed", "forward"]
    assert "reads position 0 of axis 1" in applied[0] and "the pass 11 over `layers`" in applied[0]
    program = out.program
    # hidden_states reads every row: its function is the one lowering made.
    assert program.entries["hidden_states"].function == ctx.program.entries["hidden_states"].function
    # The model's forward runs passes 0..10 as written and pass 11 on its own, restricted.
    model = next(f for f in program.functions.values() if f.id.startswith("Model.forward_rows"))
    ranges = [(loop.start, loop.stop) for loop in _loops(model.body)]
    assert ranges == [(0, 11), (11, 12)]
    last = program.functions[model.body[2].body[0].value.function]
    assert last.result.dims[1].as_int() == 1  # [B, 1, 768]: the class token's row
    # Attention in the last layer: one query row, every key and value row.
    attention = next(f for f in program.functions.values() if f.id.startswith("attention_rows"))
    (_, q), (_, k), (_, v) = attention.params[:3]
    assert q.dims[2].as_int() == 1 and k.dims[2].as_int() == 197 and v.dims[2].as_int() == 197


def test_the_pass_is_listed_and_each_backend_runs_it():
    from linnet.backends import RECORDS

    assert "dead_rows" in PASSES
    for backend in ("torch", "onnx", "jax"):
        assert "dead_rows" in RECORDS[backend].passes


# --------------------------------------------------------------- parity, pass on against off


def _without_dead_rows(monkeypatch, backend: str):
    from dataclasses import replace

    from linnet.backends import RECORDS

    record = RECORDS[backend]
    monkeypatch.setitem(RECORDS, backend, replace(record, passes=tuple(p for p in record.passes if p != "dead_rows")))


def _pair(monkeypatch, name: str, backend: str, **options):
    on = nest.load(name, backend=backend, **options)
    with monkeypatch.context() as patch:
        _without_dead_rows(patch, backend)
        off = nest.load(name, backend=backend, **options)
    return on, off


@pytest.fixture(scope="module")
def small_vit(hf_cache, tmp_path_factory):
    return write_small_vit_repo(hf_cache, tmp_path_factory.mktemp("zoo") / "vit-small")


def _entry_functions(model) -> dict[str, str]:
    return {name: entry.function for name, entry in model.program.entries.items()}


@pytest.mark.parametrize("backend", BACKENDS)
def test_vit_entries_equal_the_program_without_the_pass(small_vit, backend, monkeypatch):
    on, off = _pair(monkeypatch, small_vit.entry, backend)
    assert any("_rows" in fn for fn in _entry_functions(on).values())
    assert not any("_rows" in fn for fn in _entry_functions(off).values())
    images = np.random.default_rng(3).uniform(-1, 1, (3, 3, 32, 32)).astype(np.float32)
    for entry in ("forward", "embed", "hidden_states"):
        a, b = _np(on.run(entry, images)), _np(off.run(entry, images))
        assert a.shape == b.shape and np.abs(b).max() > 0.1
        assert max_diff(a, b) <= TOL, (entry, backend, max_diff(a, b))


@pytest.fixture(scope="module")
def bert_classifier(hf_cache):
    return write_transformers_repo(hf_cache, "linnet-tests/rows-classifier", "BertForSequenceClassification",
                                   seed=4, num_hidden_layers=3)


def _bert_batch():
    rng = np.random.default_rng(5)
    tokens = rng.integers(5, 1000, (3, 12)).astype(np.int32)
    mask = np.ones_like(tokens)
    mask[1, 7:] = 0  # padding on the right
    mask[2, :1] = 0  # and a row whose position 0 is padding
    mask[2, 9:] = 0
    return tokens, np.zeros_like(tokens), mask


def test_bert_pool_and_logits_are_rewritten_not_forward_or_hidden_states(bert_classifier):
    ctx, _ = nest.prepare(bert_classifier.name, need_weights=False)
    out = optimize(ctx.program, passes=("fuse_linears", "fold_attention_scale", "dead_rows"))
    rewritten = {line.split(":")[0] for line in out.applied if "dead rows" in line}
    assert {"pool", "logits"} <= rewritten
    assert not {"forward", "hidden_states"} & rewritten
    for entry in ("forward", "hidden_states"):
        assert out.program.entries[entry].function == ctx.program.entries[entry].function


@pytest.mark.parametrize("backend", BACKENDS)
def test_bert_entries_equal_the_program_without_the_pass(bert_classifier, backend, monkeypatch):
    on, off = _pair(monkeypatch, bert_classifier.name, backend)
    assert "_rows" in on.program.entries["logits"].function
    if backend != "torch":  # packed by default there: packing packs what the pass left, position 0 kept
        assert on.program.entries["logits"].packed_by == ("attention_mask", (0,))
    tokens, kinds, mask = _bert_batch()
    for entry in ("logits", "pool", "forward"):
        a = _np(on.run(entry, tokens, kinds, attention_mask=mask))
        b = _np(off.run(entry, tokens, kinds, attention_mask=mask))
        assert a.shape == b.shape and np.abs(b).max() > 0.05
        if a.ndim == 3:  # per-token output: compare where the mask is 1 (packing zeroes the rest)
            a, b = a[mask.astype(bool)], b[mask.astype(bool)]
        assert max_diff(a, b) <= TOL, (entry, backend, max_diff(a, b))
    # And against transformers, on the rows padded on the right (transformers counts positions
    # from 0 at a left pad, Linnet from the first real token; both programs above agree).
    import torch

    with torch.no_grad():
        ref = bert_classifier.model(input_ids=torch.from_numpy(tokens[:2]).long(),
                                    attention_mask=torch.from_numpy(mask[:2]).long()).logits.numpy()
    assert max_diff(_np(on.run("logits", tokens, kinds, attention_mask=mask))[:2], ref) <= TOL


# --------------------------------------------------------- the decisions, on a small program

SOURCE = """\
// One attention layer over embedded ids, and entries that read row 0 after different ops.
module rows

use std.nn.attention::{attention}
use std.nn.linear::{Linear}

pub block Model<V: Dim, D: Dim, T: Float = f32> {
    param table: Tensor[V, D; T]
    sub up: Linear<D, D, T>
    sub down: Linear<D, D, T>

    // Row 0 of per-token work after attention: the query reads row 0 only.
    pub entry first<B: Dim, S: Dim>(ids: Tensor[B, S; i32]) -> Tensor[B, D; T] {
        let h = up.forward(take(table, ids))
        return down.forward(h + attention(h, h, h, 0.5, none))[:, 0, :]
    }

    // Row 0 of a running sum over the tokens: the sum mixes the rows, so `up` runs on all
    // of them, and there is nothing after the sum to restrict: left alone.
    pub entry running<B: Dim, S: Dim>(ids: Tensor[B, S; i32]) -> Tensor[B, D; T] {
        return cumsum(up.forward(take(table, ids)), 1)[:, 0, :]
    }

    // A mean over the tokens reads every row: left alone.
    pub entry averaged<B: Dim, S: Dim>(ids: Tensor[B, S; i32]) -> Tensor[B, D; T] {
        return mean(up.forward(take(table, ids)), 1)[:, 0, :]
    }

    // Per-token work after the running sum runs on row 0; the sum itself on every row.
    pub entry after_running<B: Dim, S: Dim>(ids: Tensor[B, S; i32]) -> Tensor[B, D; T] {
        return down.forward(cumsum(up.forward(take(table, ids)), 1))[:, 0, :]
    }

    // Every row is returned: nothing to remove.
    pub entry every<B: Dim, S: Dim>(ids: Tensor[B, S; i32]) -> Tensor[B, S, D; T] {
        return down.forward(up.forward(take(table, ids)))
    }
}
"""


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return lowered(tmp_path_factory.mktemp("rows"), SOURCE, "Model", {"V": 50, "D": 8}, "rows")


def test_the_pass_stops_at_ops_that_mix_positions(small):
    out = optimize(small, passes=("dead_rows",))
    rewritten = {line.split(":")[0]: line for line in out.applied}
    assert set(rewritten) == {"first", "after_running"}
    assert "`first` line" in rewritten["first"] and "reads position 0 of axis 1" in rewritten["first"]
    for entry in ("running", "averaged", "every"):
        assert out.program.entries[entry].function == small.entries[entry].function
    # In `first`, attention gets one query row and every key and value row.
    attention = next(f for f in out.program.functions.values() if f.id.startswith("attention_rows"))
    dims = [str(t.dims[1]) for _, t in attention.params[:3]]
    assert dims == ["1", "S", "S"]
    # The embedding lookup and `up` run on every row (the keys need them); `down` on row 0.
    first = out.program.functions[out.program.entries["first"].function]
    assert "take" in {op.op for op in _ops(first.body)}
    # After the running sum: the sum reads every row of `up`'s output, and its row 0 is taken.
    after = out.program.functions[out.program.entries["after_running"].function]
    (cumsum,) = [op for op in _ops(after.body) if op.op == "cumsum"]
    assert str(cumsum.type.dims[1]) == "S" and str(cumsum.args[0].type.dims[1]) == "S"


def _torch(program: ir.Program, seed: int = 0):
    return torch_model(program, seed, "linnet_test_rows_model")


def test_the_small_program_computes_the_same_numbers(small):
    import torch

    out = optimize(small, passes=("dead_rows",))
    on, off = _torch(out.program), _torch(small)
    ids = torch.from_numpy(np.random.default_rng(2).integers(0, 50, (4, 7)).astype(np.int32))
    with torch.inference_mode():
        for entry in ("first", "running", "averaged", "after_running"):
            a, b = getattr(on, entry)(ids).numpy(), getattr(off, entry)(ids).numpy()
            assert np.abs(b).max() > 0.1 and max_diff(a, b) <= TOL, entry


def test_packed_logits_keep_the_position_pool_reads(bert_classifier):
    """`logits` reaches `hidden[:, 0, :]` through `pool`, which packing specialised first: the
    position it reads must be kept for `logits` too (it was not: a row whose position 0 is
    padding got another row's garbage there)."""
    tokens, kinds, mask = _bert_batch()
    packed = nest.load(bert_classifier.name, backend="onnx", packing=True)
    padded = nest.load(bert_classifier.name, backend="onnx", packing=False)
    assert packed.program.entries["logits"].packed_by == ("attention_mask", (0,))
    a = _np(packed.run("logits", tokens, kinds, attention_mask=mask))
    b = _np(padded.run("logits", tokens, kinds, attention_mask=mask))
    assert max_diff(a, b) <= TOL
