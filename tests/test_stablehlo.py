"""The StableHLO artifact: exported once with symbolic (B, S), reloaded, run without Linnet.

Parity bounds are test_jax_backend's (the artifact is the same JAX functions, exported):
1e-5 hidden everywhere, 1e-6 pooled on MiniLM, and the documented 5e-6 pooled on the
synthetic bert-base.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")

from jax import export as jax_export  # noqa: E402

from linnet import LinnetError, nest  # noqa: E402
from linnet.cli import main as cli_main  # noqa: E402

from fixtures.parity import max_diff, random_inputs, reference  # noqa: E402
from test_jax_backend import (  # noqa: E402
    BERT_POOLED_TOL, BERT_SHAPES, MINILM_SHAPES, all_ops_inputs, all_ops_params, write_all_ops_entry)


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """Every `jax.export.export` call made while this module runs, by function name; and a
    fresh Linnet cache, so the first load of each model really exports."""
    calls: list[str] = []
    original = jax_export.export

    def counting(fun, *args, **kwargs):
        calls.append(getattr(fun, "__name__", repr(fun)))
        return original(fun, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(jax_export, "export", counting)
        patch.setenv("LINNET_CACHE", str(tmp_path_factory.mktemp("stablehlo-cache")))
        yield calls


@pytest.fixture(scope="module")
def minilm_hlo(exports, minilm_checkpoint):
    started = time.perf_counter()
    model = nest.load("all-minilm-l6-v2", backend="stablehlo")
    print(f"\nstablehlo minilm: load {time.perf_counter() - started:.2f} s, "
          f"of which export {model.runtime.export_seconds:.2f} s")
    return model


@pytest.fixture(scope="module")
def bert_hlo(exports, bert_base_checkpoint):
    model = nest.load("bert-base-uncased", backend="stablehlo")
    print(f"\nstablehlo bert-base: export {model.runtime.export_seconds:.2f} s")
    return model


# ------------------------------------------------------------------------------ parity


@pytest.mark.parametrize("batch,seq", BERT_SHAPES)
def test_bert_base_artifact_matches_transformers(bert_hlo, transformers_bert_base, batch, seq):
    tokens, token_types = random_inputs(batch, seq)
    hidden, pooled = bert_hlo(tokens, token_types), bert_hlo.pool(tokens, token_types)
    ref_hidden, ref_pooled = reference(transformers_bert_base, tokens, token_types)
    hidden_diff, pooled_diff = max_diff(hidden, ref_hidden), max_diff(pooled, ref_pooled)
    print(f"stablehlo bert-base B={batch} S={seq}: hidden {hidden_diff:.3g} pooled {pooled_diff:.3g}")
    assert hidden.shape == (batch, seq, 768) and pooled.shape == (batch, 768)
    assert hidden_diff <= 1e-5
    assert pooled_diff <= BERT_POOLED_TOL


@pytest.mark.parametrize("batch,seq", MINILM_SHAPES)
def test_minilm_artifact_matches_transformers(minilm_hlo, transformers_minilm, batch, seq):
    tokens, token_types = random_inputs(batch, seq, seed=7)
    started = time.perf_counter()
    hidden = minilm_hlo(tokens, token_types).block_until_ready()
    first = time.perf_counter() - started
    started = time.perf_counter()
    minilm_hlo(tokens, token_types).block_until_ready()
    again = time.perf_counter() - started
    pooled = minilm_hlo.pool(tokens, token_types)
    ref_hidden, ref_pooled = reference(transformers_minilm, tokens, token_types)
    hidden_diff, pooled_diff = max_diff(hidden, ref_hidden), max_diff(pooled, ref_pooled)
    print(f"stablehlo minilm B={batch} S={seq}: hidden {hidden_diff:.3g} pooled {pooled_diff:.3g}; "
          f"first call (compile) {first:.2f} s, again {again * 1000:.1f} ms")
    assert hidden_diff <= 1e-5
    assert pooled_diff <= 1e-6


def test_one_export_serves_every_shape(minilm_hlo, exports, minilm_checkpoint):
    minilm_exports = lambda: [c for c in exports if c in ("Model_forward", "Model_pool")]  # noqa: E731
    seen = len(minilm_exports())
    for batch, seq in [(1, 3), (4, 17)]:
        out = minilm_hlo(*random_inputs(batch, seq))
        assert out.shape == (batch, seq, 384)
    assert len(minilm_exports()) == seen  # no re-export for new shapes
    again = nest.load("all-minilm-l6-v2", backend="stablehlo")
    assert again.info.generated == minilm_hlo.info.generated
    assert again.runtime.export_seconds is None and len(minilm_exports()) == seen
    assert exports.count("Model_forward") >= 1 and exports.count("Model_forward") == exports.count("Model_pool")


BERT_ENTRIES = ("forward", "hidden_states", "pool", "embed", "forward_positioned", "forward_embeds",
                "forward_head_masked", "forward_full", "attentions", "mlm", "nsp", "mlm_loss", "nsp_loss",
                "pretraining_loss")


def test_a_load_exports_its_root_entry_and_each_other_on_its_first_use(bert_hlo, exports, bert_base_checkpoint):
    folder = bert_hlo.info.generated
    signature = json.loads((folder / "signature.json").read_text())
    assert tuple(signature["entries"]) == BERT_ENTRIES  # every entry described from the start
    assert (folder / "forward.jax_export").exists()
    assert not (folder / "nsp_loss.jax_export").exists()  # no test here calls it before this one
    before = exports.count("PreTraining_nsp_loss")
    bert_hlo.runtime.exported_entry("nsp_loss")
    assert (folder / "nsp_loss.jax_export").exists() and (folder / "nsp_loss.mlir").exists()
    assert exports.count("PreTraining_nsp_loss") == before + 1
    again = nest.load("bert-base-uncased", backend="stablehlo")  # reads it back, exports nothing
    again.runtime.exported_entry("nsp_loss")
    assert exports.count("PreTraining_nsp_loss") == before + 1 and again.runtime.export_seconds is None
    assert not list(folder.glob("*.tmp*"))


def test_artifact_holds_no_weights(bert_hlo):
    folder = bert_hlo.info.generated
    blobs = {p.name: p.stat().st_size for p in folder.glob("*.jax_export")}
    assert "forward.jax_export" in blobs and set(blobs) <= {f"{e}.jax_export" for e in BERT_ENTRIES}
    assert max(blobs.values()) < 2_000_000  # the checkpoint is 440 MB
    mlir = (folder / "forward.mlir").read_text()
    assert "func.func public @main" in mlir and "tensor<?x?xi32>" in mlir  # symbolic B and S
    assert "shape_assertion" in mlir and "S <= 512" in mlir


def test_signature_describes_the_call(bert_hlo):
    signature = json.loads((bert_hlo.info.generated / "signature.json").read_text())
    assert signature["jax"] == jax.__version__
    pool = signature["entries"]["pool"]
    assert pool["inputs"] == [{"name": "tokens", "dtype": "int32", "dims": ["B", "S"]},
                              {"name": "token_types", "dtype": "int32", "dims": ["B", "S"]},
                              {"name": "attention_mask", "dtype": "int32", "dims": ["B", "S"]}]
    assert pool["result"] == {"name": "pooled", "dtype": "float32", "dims": ["B", 768]}
    assert [p["constraint"] for p in pool["preconditions"]] == ["S <= 512"]
    # Params are listed in the order jax flattens the tree the runtime passes.
    leaves = jax.tree_util.tree_leaves(bert_hlo.runtime.params)
    assert [tuple(p["shape"]) for p in signature["params"]] == [tuple(leaf.shape) for leaf in leaves]
    exported = bert_hlo.runtime.exported_entry("pool")
    assert [tuple(a.shape) for a in exported.in_avals[:len(leaves)]] == [tuple(leaf.shape) for leaf in leaves]
    by_path = {p["path"]: p for p in signature["params"]}
    assert by_path["bert.encoder.layers.11.up.weight"]["shape"] == [3072, 768]
    assert by_path["bert.encoder.embeddings.norm.weight"]["checkpoint_key"] == "bert.embeddings.LayerNorm.gamma"
    assert len(signature["params"]) == 206


# --------------------------------------------------------------------- preconditions


def test_raw_artifact_refuses_too_long_sequences(minilm_hlo):
    """No Linnet code on the call path: jax deserializes and calls the artifact itself."""
    blob = (minilm_hlo.info.generated / "forward.jax_export").read_bytes()
    exported = jax_export.deserialize(bytearray(blob))
    params = minilm_hlo.runtime.params
    # Packed by default: the last argument's length is the packed rows' (signature.json, `packing`).
    assert json.loads((minilm_hlo.info.generated / "signature.json").read_text())["entries"]["forward"]["packing"]
    rows = np.zeros(512, np.bool_)
    ok = exported.call(params, np.zeros((1, 512), np.int32), np.zeros((1, 512), np.int32), np.ones((1, 512), np.int32),
                       rows)
    assert ok.shape == (1, 512, 384)
    with pytest.raises(Exception) as info:
        exported.call(params, np.zeros((1, 513), np.int32), np.zeros((1, 513), np.int32), np.ones((1, 513), np.int32),
                      rows)
    chain, exc = [], info.value
    while exc is not None:
        chain.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    text = "\n".join(chain)
    assert "symbolic shape constraint S <= 512" in text and "'S' = 513" in text, text[:2000]


def test_runtime_names_the_where_clause(minilm_hlo):
    with pytest.raises(LinnetError) as info:
        minilm_hlo.runtime.run("pool", [np.zeros((1, 600), np.int32), np.zeros((1, 600), np.int32)])
    message = str(info.value)
    assert "E0702" in message and "S <= 512" in message and "S = 600" in message and "lib.linnet" in message


def test_runtime_translates_the_artifacts_own_refusal(minilm_hlo):
    # Inputs that disagree on S reach the artifact (the Model API would stop them earlier);
    # its shape assertion becomes a LinnetError carrying jax's explanation.
    with pytest.raises(LinnetError) as info:
        minilm_hlo.runtime.run("forward", [np.zeros((1, 5), np.int32), np.zeros((1, 6), np.int32),
                                           np.ones((1, 5), np.int32)])
    message = str(info.value)
    assert "E0820" in message and "Input shapes do not match" in message and "(1, 5), (1, 6)" in message


# ------------------------------------------------------------------- without Linnet

STANDALONE = textwrap.dedent('''
    import importlib.abc, json, sys
    from pathlib import Path

    class NoLinnet(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "linnet" or name.startswith("linnet."):
                raise ImportError("this script must run without Linnet")

    sys.meta_path.insert(0, NoLinnet())
    import jax, numpy as np
    from safetensors.numpy import load_file

    artifact, checkpoint, out = map(Path, sys.argv[1:4])
    signature = json.loads((artifact / "signature.json").read_text())
    stored = load_file(str(checkpoint))

    def insert(tree, parts, value):
        head, rest = parts[0], parts[1:]
        if isinstance(tree, list):
            head = int(head)
            while len(tree) <= head:
                tree.append(None)
        if not rest:
            tree[head] = value
            return
        if (tree[head] if isinstance(tree, list) else tree.get(head)) is None:
            tree[head] = [] if rest[0].isdigit() else {}
        insert(tree[head], rest, value)

    params = {}
    for p in signature["params"]:
        insert(params, p["path"].split("."), np.asarray(stored[p["checkpoint_key"]], dtype=p["dtype"]))
    exported = jax.export.deserialize(bytearray((artifact / "forward.jax_export").read_bytes()))
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 30522, size=(2, 9)).astype(np.int32)
    token_types = rng.integers(0, 2, size=(2, 9)).astype(np.int32)
    hidden = exported.call(params, tokens, token_types, np.ones_like(tokens))
    np.savez(out, tokens=tokens, token_types=token_types, hidden=np.asarray(hidden))
    assert not any(m == "linnet" or m.startswith("linnet.") for m in sys.modules)
''')


def test_built_artifact_runs_with_only_jax(tmp_path, minilm_checkpoint, transformers_minilm, capsys):
    artifact = tmp_path / "artifact"
    started = time.perf_counter()
    assert cli_main(["build", "all-minilm-l6-v2", "--backend", "stablehlo", "-o", str(artifact)]) == 0
    built = time.perf_counter() - started
    printed = capsys.readouterr().out
    for name in ("forward.jax_export", "forward.mlir", "pool.jax_export", "pool.mlir", "signature.json"):
        assert f"wrote {artifact / name}" in printed
    script = tmp_path / "run_artifact.py"
    script.write_text(STANDALONE)
    out = tmp_path / "out.npz"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # -I: isolated mode, so neither the checkout nor PYTHONPATH is importable.
    result = subprocess.run([sys.executable, "-I", str(script), str(artifact),
                             str(minilm_checkpoint / "model.safetensors"), str(out)],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    data = np.load(out)
    ref_hidden, _ = reference(transformers_minilm, data["tokens"].astype(np.int64), data["token_types"].astype(np.int64))
    diff = max_diff(data["hidden"], ref_hidden)
    print(f"standalone artifact (built in {built:.1f} s) vs transformers: hidden {diff:.3g}")
    assert diff <= 1e-5


def test_every_primitive_exports_with_symbolic_dims(tmp_path):
    """iota(S), cast(S), reshape to [B, S, ...] and slicing all survive symbolic export."""
    from linnet.backends.jax_source import params_tree
    from linnet.backends.stablehlo_export import write_artifact
    from linnet.nest import prepare

    ctx, _ = prepare(write_all_ops_entry(tmp_path / "entry"), need_weights=False)
    write_artifact(ctx, tmp_path / "artifact")
    params = params_tree(ctx.program, all_ops_params(ctx.program))
    namespace: dict = {}
    exec(compile((tmp_path / "artifact" / "model.py").read_text(), "model.py", "exec"), namespace)
    for name in ("forward", "masked"):
        exported = jax_export.deserialize(bytearray((tmp_path / "artifact" / f"{name}.jax_export").read_bytes()))
        for batch, seq in [(1, 1), (3, 7)]:
            args = all_ops_inputs(batch, seq)[name]
            got = exported.call(params, *args)
            expected = jax.jit(namespace["ENTRIES"][name])(params, *args)
            np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-6, atol=1e-6)


def test_device_the_artifact_cannot_use_is_refused(minilm_checkpoint):
    with pytest.raises(LinnetError) as info:
        nest.load("all-minilm-l6-v2", backend="stablehlo", device="metal")
    assert "E0801" in str(info.value)
