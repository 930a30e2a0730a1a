"""Padding-free execution (linnet/middle/packing.py): what the pass proves and refuses, and that a
packed model computes the padded model's numbers at every real token.

MiniLM with its real weights runs packed and unpacked on torch, ONNX, JAX and StableHLO,
against transformers, on batches whose rows have very different lengths (1 token, a few, the
full width), padded on the right and on the left, for every entry (forward, hidden_states,
pool, embed).  JAX runs the token count rounded up to a bucket (static shapes for jax.jit), so
it compiles once per bucket; StableHLO exports each packed entry once with a symbolic token
count and compiles once per bucket too.  A
small Linnet program of our own checks the decisions: attention behind a key-padding mask is
packed across; a cumsum or an unmasked mean over the tokens is not.
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from fixtures.programs import lowered, torch_model
from linnet import nest
from linnet.middle import ir
from linnet.middle.optimize import optimize

LENGTHS = [1, 9, 40, 23, 1]  # a row of one token, and the row of 40 has no padding
TOL = 1e-5


def _batch(side: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    width = max(LENGTHS)
    tokens = np.zeros((len(LENGTHS), width), np.int32)
    kinds, mask = np.zeros_like(tokens), np.zeros_like(tokens)
    for row, n in enumerate(LENGTHS):
        cols = slice(0, n) if side == "right" else slice(width - n, width)
        tokens[row, cols] = rng.integers(1000, 30000, n)
        kinds[row, cols] = rng.integers(0, 2, n)
        mask[row, cols] = 1
    return tokens, kinds, mask


def _np(x):
    return x.detach().numpy() if hasattr(x, "detach") else np.asarray(x)


# ---------------------------------------------------------------- MiniLM, real weights


@pytest.fixture(scope="module", params=["torch", "onnx", "jax", "stablehlo"])
def minilm_pair(request, minilm_checkpoint):
    packed = nest.load("all-minilm-l6-v2", backend=request.param, packing=True)
    plain = nest.load("all-minilm-l6-v2", backend=request.param, packing=False)
    return packed, plain


@pytest.fixture(scope="module")
def reference(transformers_minilm):
    """transformers' outputs for both paddings: hidden states (every layer) and the pooler."""
    import torch

    out = {}
    for side in ("right", "left"):
        tokens, kinds, mask = _batch(side)
        positions = np.maximum(np.cumsum(mask, 1) - 1, 0)  # ours count real tokens only
        with torch.no_grad():
            res = transformers_minilm(input_ids=torch.from_numpy(tokens).long(),
                                      token_type_ids=torch.from_numpy(kinds).long(),
                                      attention_mask=torch.from_numpy(mask).long(),
                                      position_ids=torch.from_numpy(positions).long(), output_hidden_states=True)
        out[side] = (np.stack([h.numpy() for h in res.hidden_states], 1), res.pooler_output.numpy())
    return out


def test_the_program_is_packed_where_it_should_be(minilm_pair):
    packed, plain = minilm_pair
    if packed.backend == "torch":
        text = packed.info.generated.read_text()
        assert "packing (linnet.middle.packing)" in text and "def forward_packed" in text
        assert "packing" not in plain.info.generated.read_text()
    if packed.backend == "onnx":
        import onnx

        graph = onnx.load(str(packed.info.generated), load_external_data=False).graph
        assert {"NonZero", "Gather", "Pad"} <= {n.op_type for n in graph.node}
        # The packed rows' count is the NonZero's length, known only at run time.
        assert any(n.op_type == "NonZero" and n.name.startswith("kept_rows") for n in graph.node)
    ops = {op.op for fn in packed.program.functions.values() for op in _ops(fn.body)}
    assert {"pack_index", "pack_rows", "unpack_rows"} <= ops
    assert not {"pack_index", "pack_rows"} & {op.op for fn in plain.program.functions.values() for op in _ops(fn.body)}


def _ops(stmts):
    return [e for e in ir.exprs(stmts) if isinstance(e, ir.Op)]


@pytest.mark.parametrize("side", ["right", "left"])
def test_packed_equals_padded_and_transformers_at_real_tokens(minilm_pair, reference, side):
    packed, plain = minilm_pair
    tokens, kinds, mask = _batch(side)
    real = mask.astype(bool)
    states, pooled_ref = reference[side]
    worst = {}

    hidden = _np(packed(tokens, kinds, attention_mask=mask))
    worst["forward vs padded"] = np.abs(hidden - _np(plain(tokens, kinds, attention_mask=mask)))[real].max()
    worst["forward vs transformers"] = np.abs(hidden - states[:, -1])[real].max()
    assert np.all(hidden[~real] == 0.0), "padded positions of a packed forward hold exactly 0"

    every = _np(packed.hidden_states(tokens, kinds, attention_mask=mask))  # [B, L + 1, S, D]
    at_real = lambda a: a.transpose(0, 2, 1, 3)[real]  # noqa: E731  [tokens, L + 1, D]
    worst["hidden_states vs padded"] = np.abs(
        at_real(every) - at_real(_np(plain.hidden_states(tokens, kinds, attention_mask=mask)))).max()
    worst["hidden_states vs transformers"] = np.abs(at_real(every) - at_real(states)).max()

    pooled = _np(packed.pool(tokens, kinds, attention_mask=mask))
    # Position 0 is padding in left-padded rows: the pass keeps it, so pool equals the padded
    # program there too (transformers pools a padded position as well, with its own position id).
    worst["pool vs padded"] = np.abs(pooled - _np(plain.pool(tokens, kinds, attention_mask=mask))).max()
    if side == "right":
        worst["pool vs transformers"] = np.abs(pooled - pooled_ref).max()

    embedded = _np(packed.embed(tokens, kinds, attention_mask=mask))
    weights = mask[..., None].astype(np.float64)
    mean = (states[:, -1] * weights).sum(1) / weights.sum(1)
    worst["embed vs padded"] = np.abs(embedded - _np(plain.embed(tokens, kinds, attention_mask=mask))).max()
    worst["embed vs transformers"] = np.abs(embedded - mean / np.linalg.norm(mean, axis=1, keepdims=True)).max()
    print(f"packed minilm {packed.backend} {side}-padded, max |d|: " + ", ".join(f"{k} {v:.2g}" for k, v in worst.items()))
    assert max(worst.values()) <= TOL, worst


@pytest.mark.parametrize("minilm_pair", ["jax"], indirect=True)  # torch and ONNX take any count
def test_jax_compiles_once_per_token_bucket(minilm_pair):
    packed, plain = minilm_pair
    assert ("jnp.nonzero(keep.reshape(-1), size=token_bucket or keep.reshape(-1).shape[0], fill_value=0)"
            in packed.info.generated.read_text())
    jitted = packed.runtime._entries["forward"]
    rng = np.random.default_rng(3)
    tokens = rng.integers(1000, 30000, (4, 16)).astype(np.int32)
    kinds = np.zeros_like(tokens)

    def run(lengths):
        mask = (np.arange(16)[None, :] < np.array(lengths)[:, None]).astype(np.int32)
        out = _np(packed(tokens, kinds, attention_mask=mask))
        real = mask.astype(bool)
        assert np.abs(out - _np(plain(tokens, kinds, attention_mask=mask)))[real].max() <= TOL
        assert np.all(out[~real] == 0.0)

    before = jitted._cache_size()
    run([5, 3, 7, 2])  # 17 kept tokens: bucket 24
    run([8, 8, 4, 4])  # 24: the same bucket, no compilation
    assert jitted._cache_size() == before + 1
    run([16, 16, 1, 1])  # 34: bucket 48, one more
    assert jitted._cache_size() == before + 2


def test_token_buckets_cover_the_count_and_waste_at_most_a_third():
    from linnet.middle.packing import token_bucket

    seen = set()
    for count in range(1, 5000):
        bucket = token_bucket(count, 10**9)
        assert count <= bucket and (bucket <= 16 or bucket * 2 <= count * 3), (count, bucket)
        seen.add(bucket)
    assert len(seen) < 30  # few programs to compile over the whole range
    assert token_bucket(195, 200) == 200 and token_bucket(5, 4) == 4  # capped at B * S


@pytest.mark.parametrize("minilm_pair", ["stablehlo"], indirect=True)
def test_stablehlo_exports_once_for_every_token_count(minilm_pair):
    """The packed artifact takes the packed rows' length from an argument of symbolic length
    (jax.export cannot read it from the mask's values), so one export serves every count."""
    import jax
    import json

    packed, plain = minilm_pair
    folder = packed.info.generated
    exported = packed.runtime.exported["forward"]
    rows = exported.in_avals[-1]
    assert rows.dtype == np.bool_ and len(rows.shape) == 1 and not isinstance(rows.shape[0], int)
    assert str(rows.shape[0]) == "Tokens"
    assert len(plain.runtime.exported["forward"].in_avals) == len(exported.in_avals) - 1
    record = json.loads((folder / "signature.json").read_text())["entries"]
    assert record["forward"]["packing"]["dims"] == ["Tokens"]
    assert record["pool"]["packing"]["kept_positions"] == {"mask": "attention_mask", "fixed": [0]}
    mlir = (folder / "forward.mlir").read_text()
    assert "tensor<?xi1>" in mlir  # the token rows' length is a dynamic dim of the module

    # The raw artifact, called without Linnet, at two lengths of the token rows: any length at
    # or above the kept count gives the same result at real tokens.
    tokens, kinds, mask = _batch("right")
    params = packed.runtime.params
    real = mask.astype(bool)
    want = _np(plain(tokens, kinds, attention_mask=mask))
    for length in (int(mask.sum()), mask.size):
        got = np.asarray(jax.jit(exported.call)(params, tokens, kinds, mask, np.zeros(length, np.bool_)))
        assert np.abs(got - want)[real].max() <= TOL and np.all(got[~real] == 0.0)

    # Through the runtime: one compilation per (B, S) and token bucket, as on the jax backend.
    jitted = packed.runtime._calls["forward"]
    rng = np.random.default_rng(3)
    tokens = rng.integers(1000, 30000, (4, 16)).astype(np.int32)
    kinds = np.zeros_like(tokens)
    before = jitted._cache_size()
    for lengths in ([5, 3, 7, 2], [8, 8, 4, 4], [16, 16, 1, 1]):  # 17 and 24 kept: bucket 24; 34: 48
        mask = (np.arange(16)[None, :] < np.array(lengths)[:, None]).astype(np.int32)
        out = _np(packed(tokens, kinds, attention_mask=mask))
        assert np.abs(out - _np(plain(tokens, kinds, attention_mask=mask)))[mask.astype(bool)].max() <= TOL
    assert jitted._cache_size() == before + 2


def test_packing_defaults_per_backend():
    from linnet.backends import integration

    # On for ONNX, JAX and StableHLO (measured faster on padded batches, no slower without),
    # off for torch (measured no faster there); each can be changed.
    for backend in ("onnx", "jax", "stablehlo"):
        assert "pack_tokens" in nest.backend_passes(backend, integration(backend))
        assert "pack_tokens" not in nest.backend_passes(backend, integration(backend), packing=False)
    assert "pack_tokens" not in nest.backend_passes("torch", integration("torch"))
    assert "pack_tokens" in nest.backend_passes("torch", integration("torch"), packing=True)
    # StableHLO's params stay the checkpoint's (signature.json maps each to its key): no fusion.
    assert nest.backend_passes("stablehlo", integration("stablehlo"), packing=True) == ("pack_tokens",)


# ------------------------------------------------------------- the decisions, on a small program

SOURCE = """\
// A one-layer encoder over embedded ids, with the mask made from the input the way BERT does,
// and entries that mix the tokens in other ways than attention.
module packs

use std.nn.attention::{attention}
use std.nn.linear::{Linear}

pub block Model<V: Dim, D: Dim, T: Float = f32> {
    param table: Tensor[V, D; T]
    sub up: Linear<D, D, T>
    sub down: Linear<D, D, T>

    fn masked<B: Dim, S: Dim>(mask: Tensor[B, S; i32]) -> Tensor[B, 1, S; T] {
        return reshape(cast<T>(select(equal(mask, 0), -10000.0, 0.0)), [B, 1, S])
    }

    // Attention behind a key-padding mask: packed across.
    pub entry mixed<B: Dim, S: Dim>(ids: Tensor[B, S; i32], attention_mask: Tensor[B, S; i32]) -> Tensor[B, S, D; T] {
        let h = up.forward(take(table, ids))
        return down.forward(h + attention(h, h, h, 0.5, some(masked(attention_mask))))
    }

    // Each position's halves put side by side again (a concat along D, as RoPE's angles): packed.
    pub entry paired<B: Dim, S: Dim>(ids: Tensor[B, S; i32], attention_mask: Tensor[B, S; i32]) -> Tensor[B, S, D; T] {
        let h = up.forward(take(table, ids))
        let swapped = concat(h[:, :, D / 2:], h[:, :, :D / 2], 2)
        return down.forward(swapped + attention(h, h, h, 0.5, some(masked(attention_mask))))
    }

    // A concat along S moves positions (the second copy starts at S): not packed.
    pub entry doubled<B: Dim, S: Dim>(ids: Tensor[B, S; i32], attention_mask: Tensor[B, S; i32]) -> Tensor[B, S + S, D; T] {
        let h = up.forward(take(table, ids))
        return down.forward(concat(h, h, 1))
    }

    // A running sum over the tokens reads padded positions: not packed.
    pub entry running<B: Dim, S: Dim>(ids: Tensor[B, S; i32], attention_mask: Tensor[B, S; i32]) -> Tensor[B, S, D; T] {
        return down.forward(cumsum(up.forward(take(table, ids)), 1))
    }

    // A mean over every position, padding included: not packed.
    pub entry averaged<B: Dim, S: Dim>(ids: Tensor[B, S; i32], attention_mask: Tensor[B, S; i32]) -> Tensor[B, 1, D; T] {
        return mean(up.forward(take(table, ids)), 1)
    }

    // The same attention, its mask made from another input: that input does not declare
    // padding, so its zeros may be real positions: not packed.
    pub entry undeclared<B: Dim, S: Dim>(ids: Tensor[B, S; i32], keep: Tensor[B, S; i32]) -> Tensor[B, S, D; T] {
        let h = up.forward(take(table, ids))
        return down.forward(h + attention(h, h, h, 0.5, some(masked(keep))))
    }

    // Attention without a mask attends to padding: not packed.
    pub entry unmasked<B: Dim, S: Dim>(ids: Tensor[B, S; i32], attention_mask: Tensor[B, S; i32]) -> Tensor[B, S, D; T] {
        let h = up.forward(take(table, ids))
        return attention(h, h, h, 0.5, none)
    }
}
"""


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return lowered(tmp_path_factory.mktemp("packs"), SOURCE, "Model", {"V": 50, "D": 8}, "packs")


def test_the_pass_packs_across_attention_and_refuses_other_token_mixing(small):
    out = optimize(small, passes=("pack_tokens",))
    applied, notes = "\n".join(out.applied), "\n".join(out.notes)
    assert "mixed: per-token work runs on the kept tokens (attention_mask != 0)" in applied
    assert "paired: per-token work runs on the kept tokens (attention_mask != 0)" in applied
    assert "undeclared: not packed: no [B, S] integer input named `attention_mask`" in notes
    for entry in ("running", "averaged", "unmasked", "undeclared", "doubled"):
        assert entry + ":" not in applied
    assert "doubled: not packed" in notes and "`concat` mixes token positions" in notes
    assert "running: not packed" in notes and "`cumsum` mixes token positions" in notes
    assert "averaged: not packed" in notes and "`mean` mixes token positions" in notes
    assert "unmasked: not packed" in notes and "its mask is not proven" in notes
    # Refused entries still run their padded program.
    assert out.program.entries["running"].function == small.entries["running"].function


def _torch(program: ir.Program, seed: int = 0):
    return torch_model(program, seed, "linnet_test_packing_model")


@pytest.mark.parametrize("side", ["right", "left"])
def test_the_small_program_computes_the_same_at_real_tokens(small, side):
    import torch

    out = optimize(small, passes=("pack_tokens",))
    packed, plain = _torch(out.program), _torch(small)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 50, (4, 7)).astype(np.int32)
    mask = np.zeros_like(ids)
    for row, n in enumerate([1, 7, 3, 5]):
        mask[row, slice(0, n) if side == "right" else slice(7 - n, 7)] = 1
    real = mask.astype(bool)
    for entry in ("mixed", "paired"):
        with torch.inference_mode():
            a = getattr(packed, entry)(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
            b = getattr(plain, entry)(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        assert np.abs(a - b)[real].max() <= TOL, entry
        assert np.all(a[~real] == 0.0), entry


def test_linnet_build_shows_what_was_packed(tmp_path, capsys):
    from linnet.cli import main

    assert main(["build", "all-minilm-l6-v2", "--optimize", "--packing", "-o", str(tmp_path / "packed")]) == 0
    assert main(["build", "all-minilm-l6-v2", "--optimize", "-o", str(tmp_path / "padded")]) == 0  # torch: off
    text = (tmp_path / "packed" / "model.py").read_text()
    # The entry computes the packing once and says so; the clones say what they hold.
    assert ("# packing (linnet.middle.packing): per-token work runs on the Tokens positions where "
            "attention_mask != 0, as [Tokens, ...]; attention sees [B, S, ...] (unpacked per call)") in text
    assert "# positions that are not kept hold exactly 0 in the result" in text
    assert "def forward_packed(self, x, mask, token_rows, token_slots):" in text
    assert "torch.nonzero(keep.reshape(-1)).squeeze(1)" in text
    assert "packing" not in (tmp_path / "padded" / "model.py").read_text()


# ------------------------------------------------------------------ Triton exports


@pytest.fixture(scope="module")
def triton_repos(minilm_checkpoint, tmp_path_factory):
    """`linnet export-triton` of MiniLM: both layouts packed (the default), one padded."""
    from linnet.cli import main

    root = tmp_path_factory.mktemp("triton-packing")
    repos = {}
    for layout, flags in [("onnxruntime", []), ("python", []), ("onnxruntime-padded", ["--no-packing"])]:
        runtime = layout.split("-")[0]
        assert main(["export-triton", "all-minilm-l6-v2", "-o", str(root / layout), "--runtime", runtime,
                     *flags]) == 0
        repos[layout] = root / layout
    yield repos
    shutil.rmtree(root, ignore_errors=True)


def _served_graphs(repo, layout: str) -> dict:
    """Output name -> the ONNX file Triton runs for it, in either layout."""
    if layout.startswith("onnxruntime"):
        return {p.parent.parent.name.rsplit(".", 1)[1]: p for p in repo.glob("all-minilm-l6-v2.*/1/model.onnx")}
    return {p.name.split(".")[1]: p for p in (repo / "all-minilm-l6-v2" / "1").glob("model.*.onnx")}


def _run_onnx(path, tokens, kinds, mask) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"tokens": tokens, "token_types": kinds, "attention_mask": mask})[0]


@pytest.mark.parametrize("layout", ["onnxruntime", "python"])
def test_triton_exports_the_packed_graph_and_it_equals_the_padded_one(triton_repos, layout):
    import onnx

    packed, padded = _served_graphs(triton_repos[layout], layout), _served_graphs(triton_repos["onnxruntime-padded"],
                                                                                  "onnxruntime")
    assert set(packed) == set(padded) == {"hidden", "hidden_states", "pooled", "embedding"}
    if layout == "python":  # its model.py runs model.onnx (every output) when a request asks for all
        whole = onnx.load(str(triton_repos[layout] / "all-minilm-l6-v2" / "1" / "model.onnx"), load_external_data=False)
        assert "NonZero" in {n.op_type for n in whole.graph.node}
    tokens, kinds, mask = _batch("right")
    real = mask.astype(bool)
    worst = {}
    for output, path in packed.items():
        nodes = onnx.load(str(path), load_external_data=False).graph.node
        # The kept rows: NonZero over the mask, then the Gather of those rows for per-token work.
        assert any(n.op_type == "NonZero" and n.name.startswith("kept_rows") for n in nodes), output
        assert "NonZero" not in {n.op_type for n in onnx.load(str(padded[output]), load_external_data=False).graph.node}
        got, want = _run_onnx(path, tokens, kinds, mask), _run_onnx(padded[output], tokens, kinds, mask)
        if output == "hidden":
            worst[output] = np.abs(got - want)[real].max()
            assert np.all(got[~real] == 0.0), "padded positions of a packed per-token output hold exactly 0"
        elif output == "hidden_states":  # [B, L + 1, S, D]
            worst[output] = np.abs(got - want).transpose(0, 2, 1, 3)[real].max()
            assert np.all(got.transpose(0, 2, 1, 3)[~real] == 0.0)
        else:
            worst[output] = np.abs(got - want).max()
    print(f"triton {layout} packed vs padded export, max |d|: " + ", ".join(f"{k} {v:.2g}" for k, v in worst.items()))
    assert max(worst.values()) <= TOL, worst


def test_triton_configs_do_not_change_with_packing(triton_repos):
    # The packed graph keeps the [B, S] interface, so every model's config is the same.
    packed, padded = triton_repos["onnxruntime"], triton_repos["onnxruntime-padded"]
    configs = sorted(p.relative_to(packed) for p in packed.glob("*/config.pbtxt"))
    assert len(configs) == 6  # the ensemble, its validating step, one model per output
    for config in configs:
        assert (packed / config).read_text() == (padded / config).read_text(), config


def test_each_backend_record_names_registered_passes_in_an_order_they_allow():
    """A backend's record owns its passes (nest only asks it): each is a pass of the registry,
    after the ones it requires."""
    from linnet.backends import RECORDS
    from linnet.middle.optimize import REGISTRY

    assert set(RECORDS) == {"torch", "jax", "stablehlo", "onnx", "openvino"}
    for name, record in RECORDS.items():
        assert set(record.passes) <= set(REGISTRY), name
        for i, p in enumerate(record.passes):
            assert not set(REGISTRY[p].requires) & set(record.passes[i + 1:]), (name, p)
        assert record.passes_for(optimize=False) == ()
