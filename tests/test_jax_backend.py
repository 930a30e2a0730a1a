"""The JAX backend end to end: generated source, parity with transformers, what recompiles.

Parity is measured against transformers' BertModel on the same files, f32 on CPU.  On the
real MiniLM weights the issue's bounds hold as stated (1e-5 hidden, 1e-6 pooled).  On the
synthetic full-size bert-base they hold for the hidden state, but the pooled output differs
from transformers by 2-3e-6: both are f32 computations of the same model, and transformers'
own f32 pooled output is 1-1.5e-6 away from the same model run in f64.  So the bert-base
pooled bound here is 5e-6, and `test_bert_base_float64_error_is_comparable` checks the claim
behind it (JAX is about as far from the f64 result as transformers' f32 is).  The issue's
1e-6 is met on the real MiniLM weights and asserted there.
"""
from __future__ import annotations

import ast
import re
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")

from linnet import LinnetError, nest  # noqa: E402
from linnet.cli import main as cli_main  # noqa: E402
from fixtures.parity import max_diff, random_inputs, reference  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
BERT_SOURCE = REPO / "nest" / "bert-base-uncased" / "src" / "lib.linnet"

BERT_SHAPES = [(1, 1), (2, 7), (3, 64)]
MINILM_SHAPES = [(1, 1), (2, 33), (1, 512)]
#: See the module docstring: the f32 noise floor of bert-base's pooled output.
BERT_POOLED_TOL = 5e-6


@pytest.fixture(scope="module")
def bert_jax(bert_base_checkpoint):
    return nest.load("bert-base-uncased", backend="jax")


@pytest.fixture(scope="module")
def minilm_jax(minilm_checkpoint):
    return nest.load("all-minilm-l6-v2", backend="jax")


# ------------------------------------------------------------------------------ parity


@pytest.mark.parametrize("batch,seq", BERT_SHAPES)
def test_bert_base_matches_transformers(bert_jax, transformers_bert_base, batch, seq):
    tokens, token_types = random_inputs(batch, seq)
    hidden, pooled = bert_jax(tokens, token_types), bert_jax.pool(tokens, token_types)
    ref_hidden, ref_pooled = reference(transformers_bert_base, tokens, token_types)
    hidden_diff, pooled_diff = max_diff(hidden, ref_hidden), max_diff(pooled, ref_pooled)
    print(f"jax bert-base B={batch} S={seq}: hidden {hidden_diff:.3g} pooled {pooled_diff:.3g}")
    assert isinstance(hidden, jax.Array) and hidden.dtype == np.float32
    assert hidden.shape == (batch, seq, 768) and pooled.shape == (batch, 768)
    assert hidden_diff <= 1e-5
    assert pooled_diff <= BERT_POOLED_TOL


def test_bert_base_float64_error_is_comparable(bert_jax, bert_base_checkpoint, transformers_bert_base):
    """JAX f32 and transformers f32 are both compared to transformers run in f64."""
    from transformers import BertModel

    exact = BertModel.from_pretrained(bert_base_checkpoint.repo, revision=bert_base_checkpoint.revision,
                                      dtype=torch.float64).eval()
    tokens, token_types = random_inputs(2, 7)
    hidden64, pooled64 = reference(exact, tokens, token_types)
    torch_hidden, torch_pooled = reference(transformers_bert_base, tokens, token_types)
    ours_hidden = max_diff(bert_jax(tokens, token_types), hidden64)
    ours_pooled = max_diff(bert_jax.pool(tokens, token_types), pooled64)
    theirs_hidden, theirs_pooled = max_diff(torch_hidden, hidden64), max_diff(torch_pooled, pooled64)
    print(f"vs f64: jax hidden {ours_hidden:.3g} pooled {ours_pooled:.3g}; "
          f"transformers f32 hidden {theirs_hidden:.3g} pooled {theirs_pooled:.3g}")
    assert ours_hidden <= 3 * theirs_hidden
    assert ours_pooled <= 3 * theirs_pooled


@pytest.mark.parametrize("batch,seq", MINILM_SHAPES)
def test_minilm_real_weights_match_transformers(minilm_jax, transformers_minilm, batch, seq):
    tokens, token_types = random_inputs(batch, seq, seed=7)
    started = time.perf_counter()
    hidden = minilm_jax(tokens, token_types).block_until_ready()
    first = time.perf_counter() - started
    started = time.perf_counter()
    minilm_jax(tokens, token_types).block_until_ready()
    again = time.perf_counter() - started
    pooled = minilm_jax.pool(tokens, token_types)
    ref_hidden, ref_pooled = reference(transformers_minilm, tokens, token_types)
    hidden_diff, pooled_diff = max_diff(hidden, ref_hidden), max_diff(pooled, ref_pooled)
    print(f"jax minilm B={batch} S={seq}: hidden {hidden_diff:.3g} pooled {pooled_diff:.3g}; "
          f"forward first call (trace + compile) {first:.2f} s, again {again * 1000:.1f} ms")
    assert hidden_diff <= 1e-5
    assert pooled_diff <= 1e-6


def test_jit_compiles_once_per_input_shape(minilm_jax):
    """The documented cost model: one compilation per distinct (B, S), none for a repeat."""
    jitted = minilm_jax.runtime._entries["pool"]
    before = jitted._cache_size()
    for batch, seq in [(2, 5), (2, 5), (2, 6), (2, 5), (3, 5)]:
        minilm_jax.pool(*random_inputs(batch, seq))
    assert jitted._cache_size() - before == 3


# ------------------------------------------------------------------------------ source


def test_generated_source_is_readable(minilm_jax):
    path = minilm_jax.info.generated
    source = path.read_text()
    tree = ast.parse(source)
    names = [node.name for node in tree.body if isinstance(node, ast.FunctionDef)]
    assert not any(isinstance(node, ast.ClassDef) for node in tree.body)  # pure functions only
    # One function per block method, named after the Linnet block and method; packed (the
    # default, linnet.middle.packing) a method called only on the kept tokens is its clone
    # `<name>_packed` (`_packed_2` for a second packing, the one keeping position 0 for pool).
    defined = {re.sub(r"(_padded)?_packed(_\d+)?$", "", name) for name in names}
    assert "Model_forward_packed" in names and "Model_forward" in names
    program = minilm_jax.program
    for block in program.blocks.values():
        for method in block.methods:
            assert f"{block.name}_{method}" in defined, (block.name, method)
    assert {"split_heads", "attention_with_dropout", "layer_norm"} <= defined
    # the activation primitive, on the up projection (its packed copy once packing is on)
    assert re.search(r'jax\.nn\.gelu\(Linear_forward\w*\(params\["up"\], h\), approximate=False\)', source)
    assert 'for layer in params["layers"]:' in source
    # Every statement points at a Linnet line that holds code, not a blank or a comment.
    lines = {}
    # The dropout helpers (`_linnet_keys`, `_linnet_dropout`) are Linnet's own, not the source's.
    generated = re.sub(r"^def _linnet_\w+\(.*?(?=^\S)", "", source, flags=re.M | re.S)
    assert "def _linnet_dropout(" in source and "def _linnet_dropout(" not in generated
    statements = [line for line in generated.splitlines() if re.match(r"\s+(return |\w+ = (?!\w+\.shape)|for )", line)]
    assert statements
    for line in statements:
        if re.search(r"# fused form of std\.nn\.\w+::[\w.]+$", line):
            continue  # its function's comment line points at the std source
        match = re.search(r"# (\S+\.linnet):(\d+)$", line)
        assert match, line
        file = REPO / match.group(1)
        text = lines.setdefault(file, file.read_text().splitlines())[int(match.group(2)) - 1].strip()
        assert text and not text.startswith("//"), (line, text)
    assert "# nest/bert-base-uncased/src/lib.linnet:" in source


def test_generated_source_is_cached(minilm_jax, minilm_checkpoint):
    again = nest.load("all-minilm-l6-v2", backend="jax")
    assert again.info.generated == minilm_jax.info.generated


def test_unknown_and_missing_devices_are_clear_errors(minilm_checkpoint):
    with pytest.raises(LinnetError) as info:
        nest.load("all-minilm-l6-v2", backend="jax", device="tpu")
    assert "E0801" in str(info.value) and "'tpu'" in str(info.value)
    if any(d.platform == "gpu" for d in jax.devices()):
        return
    with pytest.raises(LinnetError) as info:
        nest.load("all-minilm-l6-v2", backend="jax", device="cuda")
    assert "E0801" in str(info.value) and "no GPU" in str(info.value)


def test_backend_takes_no_options(minilm_checkpoint):
    with pytest.raises(LinnetError) as info:
        nest.load("all-minilm-l6-v2", backend="jax", mode="compile")
    assert "E0807" in str(info.value)


def test_cli_build_writes_jax_source(tmp_path, capsys):
    assert cli_main(["build", "all-minilm-l6-v2", "--backend", "jax", "-o", str(tmp_path)]) == 0
    source = (tmp_path / "model.py").read_text()
    assert "def Model_forward(params, tokens, token_types, attention_mask, rng=None):" in source
    assert f"wrote {tmp_path / 'model.py'}" in capsys.readouterr().out
    compile(source, "model.py", "exec")


# ------------------------------------------------------------------- every primitive

# A model that uses every primitive and std function the emitters have templates for.
ALL_OPS = """
module allops

use std.nn.activations::{gelu, gelu_erf, relu, silu}
use std.nn.attention::{attention}
use std.nn.norm::{layer_norm, rms_norm}

pub block Model<D: Dim, Heads: Dim, Rows: Dim, MaxPositions: Dim, T: Float = f32>
where
    Heads > 0,
    D % Heads == 0
{
    param table: Tensor[Rows, D; T]
    param weight: Tensor[D; T]
    param mask: Tensor[4, 4; T]

    pub entry forward<B: Dim, S: Dim>(ids: Tensor[B, S; i32], x: Tensor[B, S, D; T]) -> Tensor[B, S, D; T]
    where S <= MaxPositions {
        let looked = take(table, ids) + x
        let a = erf(looked) + tanh(looked) + exp(-looked) + sigmoid(looked)
        let b = log(sqrt(looked * looked + 1.0)) * rsqrt(looked * looked + 2.0)
        let c = maximum(a, 0.5) + minimum(a, b) - relu(b) / (silu(a) + 3.0) + select(less(a, b), a, b) +
            cast<T>(reshape(cumsum(ids, 1) - 1, [B, S, 1]))
        let d = a * cast<T>(less(a, b)) + c * cast<T>(greater(a, c)) + cast<T>(equal(a, a)) * gelu(a) + gelu_erf(b)
        let e = softmax(d, -1) + sum(d, -1) - mean(d, -1) * max(d, 1)
        let f = layer_norm(e, weight, none, 1e-5) + rms_norm(e, weight, 1e-6)
        let heads = permute(reshape(f, [B, S, Heads, D / Heads]), [0, 2, 1, 3])
        let g = matmul(heads, transpose(heads))
        let pos = cast<T>(iota<i32>(S)) * cast<T>(S) / cast<T>(D / Heads)
        let h = reshape(permute(attention(heads, heads, heads, 0.5, none), [0, 2, 1, 3]), [B, S, D])
        return h + sum(sum(g, -1), 1)[:, 0, :, :] + reshape(pos, [1, S, 1])
    }

    pub entry masked<B: Dim>(x: Tensor[B, 4, D; T]) -> Tensor[B, 4, D; T] {
        return attention(x, x, x, 0.25, some(mask))
    }
}
"""

ALL_OPS_MANIFEST = """
[model]
name = "all-ops"
title = "Every primitive"
summary = "A test model that uses every primitive the emitters handle."
license = "Apache-2.0"
family = "test"

[source]
path = "src/lib.linnet"
root = "Model"
entry = "forward"

[generics]
D = 8
Heads = 2
Rows = 11
MaxPositions = 16
T = "f32"

[check]
B = 2
S = 5
"""


def write_all_ops_entry(root: Path) -> Path:
    (root / "src").mkdir(parents=True)
    (root / "src" / "lib.linnet").write_text(textwrap.dedent(ALL_OPS).lstrip())
    (root / "nest.toml").write_text(ALL_OPS_MANIFEST.lstrip())
    (root / "linnet.toml").write_text('[package]\nname = "allops"\nversion = "0.1.0"\nlanguage = "0.1"\n')
    return root


def all_ops_params(program) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {path: rng.normal(size=tuple(d.as_int() for d in t.dims)).astype(np.float32)
            for path, t in program.param_paths()}


@pytest.fixture(scope="module")
def all_ops(tmp_path_factory):
    from linnet.nest import prepare

    ctx, _ = prepare(write_all_ops_entry(tmp_path_factory.mktemp("all-ops")), need_weights=False)
    return ctx


def torch_outputs(program, params, inputs_by_entry, tmp_path):
    from linnet.backends.torch_source import write
    from linnet.backends.pysource import import_generated
    from linnet.backends.torch_runtime import torch_param_name

    module = import_generated(write(program, tmp_path / "torch"), "linnet_test_all_ops_torch")
    with torch.device("meta"):
        model = module.Model()
    model.load_state_dict({torch_param_name(k): torch.from_numpy(v) for k, v in params.items()}, assign=True)
    with torch.no_grad():
        return {name: getattr(model, name)(*map(torch.from_numpy, inputs)).numpy()
                for name, inputs in inputs_by_entry.items()}


def all_ops_inputs(batch: int, seq: int) -> dict[str, list[np.ndarray]]:
    rng = np.random.default_rng(batch * 100 + seq)
    return {"forward": [rng.integers(0, 11, size=(batch, seq)).astype(np.int32),
                        rng.normal(size=(batch, seq, 8)).astype(np.float32)],
            "masked": [rng.normal(size=(batch, 4, 8)).astype(np.float32)]}


def test_every_primitive_matches_the_torch_backend(all_ops, tmp_path):
    from linnet.backends.jax_source import params_tree, write
    from linnet.backends.pysource import import_generated

    program = all_ops.program
    params = all_ops_params(program)
    module = import_generated(write(program, tmp_path / "jax"), "linnet_test_all_ops_jax")
    tree = params_tree(program, params)
    for batch, seq in [(1, 1), (2, 5)]:
        inputs = all_ops_inputs(batch, seq)
        expected = torch_outputs(program, params, inputs, tmp_path)
        for name, args in inputs.items():
            got = np.asarray(jax.jit(module.ENTRIES[name])(tree, *args))
            # Relative: the sums of this made-up model reach ~300, where f32 spacing is 3e-5.
            np.testing.assert_allclose(got, expected[name], rtol=1e-5, atol=1e-5, err_msg=f"{name} {batch}x{seq}")


def test_unfused_source_matches_fused(minilm_jax):
    """The fused templates compute what the Linnet bodies do."""
    from linnet.backends.jax_source import emit

    source = emit(minilm_jax.program, fused=False)
    # Linear's body instead of its template (GELU is the `activation` primitive, not a std call)
    assert '@ params["weight"].T + params["bias"]' not in source and 'jnp.swapaxes(params["weight"], -2, -1)' in source
    namespace: dict = {}
    exec(compile(source, "unfused.py", "exec"), namespace)
    tokens, token_types = random_inputs(2, 9)
    unfused = jax.jit(namespace["ENTRIES"]["forward"])(minilm_jax.runtime.params, tokens.astype(np.int32),
                                                       token_types.astype(np.int32), np.ones_like(tokens, np.int32))
    assert max_diff(unfused, minilm_jax(tokens, token_types)) <= 1e-5
