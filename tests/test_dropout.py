"""Dropout: the `dropout` primitive on every backend, and `Real` generics that carry its rates.

A tiny entry applies `dropout(x, Rate)` with a `Real` generic of its root block passed down
to a sub-block; the tests run it in eval mode (the identity on torch, JAX and ONNX Runtime)
and in train mode (torch `.train()`, a JAX key source), where the share of zeros over many
elements must be the rate within 1% and the kept elements scaled by 1 / (1 - rate).  The BERT
source's rates come from hf: configs and `--set`, and show in the generated code.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

from linnet import nest
from linnet.diagnostics import LinnetError

SOURCE = """
module drops

block Inner<D: Dim, T: Float, Rate: Real> {
    param gain: Tensor[D; T]

    pub fn forward<B: Dim>(x: Tensor[B, D; T]) -> Tensor[B, D; T] {
        return dropout(x * gain, Rate)
    }
}

pub block Model<D: Dim, T: Float = f32, Rate: Real = 0.25, Twice: Real = Rate> {
    sub inner: Inner<D, T, Rate>
    sub fixed: Inner<D, T, 0.5>

    pub entry forward<B: Dim>(x: Tensor[B, D; T]) -> Tensor[B, D; T] {
        return inner.forward(x)
    }

    pub entry halves<B: Dim>(x: Tensor[B, D; T]) -> Tensor[B, D; T] {
        return fixed.forward(x) + dropout(x, Twice) * 0.0
    }
}
"""

MANIFEST = """
[model]
name = "drops"
title = "Dropout"
summary = "A test model that drops."
license = "Apache-2.0"
family = "test"

[source]
path = "src/lib.linnet"
root = "Model"
entry = "forward"

[generics]
D = 4096
{extra}
[check]
B = 2
"""


def write_entry(root: Path, extra: str = "") -> Path:
    (root / "src").mkdir(parents=True)
    (root / "src" / "lib.linnet").write_text(textwrap.dedent(SOURCE).lstrip())
    (root / "nest.toml").write_text(MANIFEST.replace("{extra}", extra).lstrip())
    (root / "linnet.toml").write_text('[package]\nname = "drops"\nversion = "0.1.0"\nlanguage = "0.1"\n')
    return root


def _program(tmp_path, extra: str = "", overrides=None):
    ctx, _ = nest.prepare(write_entry(tmp_path / "entry", extra), need_weights=False, overrides=overrides)
    return ctx.program


def _torch_model(program, tmp_path):
    import torch

    from linnet.backends.pysource import import_generated
    from linnet.backends.torch_source import write

    module = import_generated(write(program, tmp_path / "torch"), f"linnet_test_drops_{id(program)}")
    model = module.Model()
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(1.0)
    return model


def _x(rows: int = 64, width: int = 4096) -> np.ndarray:
    return np.random.default_rng(0).uniform(1.0, 2.0, size=(rows, width)).astype(np.float32)


def _drop_share(out: np.ndarray, x: np.ndarray, rate: float) -> float:
    """The share of zeros, after checking every kept element is x / (1 - rate)."""
    kept = out != 0
    np.testing.assert_allclose(out[kept], x[kept] / (1.0 - rate), rtol=1e-6)
    return 1.0 - kept.mean()


def test_eval_mode_is_the_identity_and_train_mode_drops_at_the_rate(tmp_path):
    import torch

    model = _torch_model(_program(tmp_path), tmp_path)
    x = _x()
    with torch.no_grad():
        model.eval()  # what nest.load's runtime does; a new nn.Module starts in train mode
        eval_out = model.forward(torch.from_numpy(x)).numpy()
        assert np.array_equal(eval_out, x)  # the identity, bit for bit
        model.train()
        first = model.forward(torch.from_numpy(x)).numpy()
        second = model.forward(torch.from_numpy(x)).numpy()
        halves = model.halves(torch.from_numpy(x)).numpy()
        model.eval()
        assert np.array_equal(model.forward(torch.from_numpy(x)).numpy(), x)
    assert abs(_drop_share(first, x, 0.25) - 0.25) < 0.01
    assert abs(_drop_share(halves, x, 0.5) - 0.5) < 0.01  # the literal passed to `fixed`
    assert not np.array_equal(first, second)  # a fresh mask per call


def test_set_and_manifest_values_reach_the_rate(tmp_path):
    import torch

    program = _program(tmp_path, extra="Rate = 0.125\n")
    model = _torch_model(program, tmp_path)
    model.train()
    x = _x()
    with torch.no_grad():
        out = model.forward(torch.from_numpy(x)).numpy()
    assert abs(_drop_share(out, x, 0.125) - 0.125) < 0.01
    overridden = _program(tmp_path / "b", overrides={"Rate": 0.5})
    from linnet.backends.torch_source import emit

    text = emit(overridden)
    assert "F.dropout(x * self.gain, 0.5, self.training)" in text
    # `Twice: Real = Rate` follows the overridden Rate, and `inner` and `fixed` are now one
    # instantiation, Inner<D, T, 0.5>: one class, one dropout in it, one in `halves`.
    assert text.count(", 0.5, self.training)") == 2 and "class Inner(nn.Module)" in text


def test_jax_is_the_identity_without_keys_and_drops_with_them(tmp_path):
    import jax

    from linnet.backends.jax_source import params_tree, write
    from linnet.backends.pysource import import_generated

    program = _program(tmp_path)
    module = import_generated(write(program, tmp_path / "jax"), "linnet_test_drops_jax")
    params = params_tree(program, lambda path, t: np.ones(tuple(d.as_int() for d in t.dims), np.float32))
    x = _x()
    assert np.array_equal(np.asarray(jax.jit(module.ENTRIES["forward"])(params, x)), x)

    def train(params, x, key):
        return module.ENTRIES["forward"](params, x, module._linnet_keys(key))

    out = np.asarray(jax.jit(train)(params, x, jax.random.PRNGKey(0)))
    again = np.asarray(jax.jit(train)(params, x, jax.random.PRNGKey(0)))
    other = np.asarray(jax.jit(train)(params, x, jax.random.PRNGKey(1)))
    assert abs(_drop_share(out, x, 0.25) - 0.25) < 0.01
    assert np.array_equal(out, again) and not np.array_equal(out, other)  # the key decides


def test_onnx_graph_is_the_identity(tmp_path):
    import onnxruntime as ort

    from linnet.backends.onnx_graph import emit

    program = _program(tmp_path)
    params = {path: np.ones(tuple(d.as_int() for d in t.dims), np.float32) for path, t in program.param_paths()}
    model = emit(program, params, name="drops", outputs={"forward": "y", "halves": "h"})[0].model
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = _x(4)
    out = session.run(["y"], {session.get_inputs()[0].name: x})[0]
    assert np.array_equal(out, x)
    assert any(n.op_type == "Identity" and "lib.linnet" in n.doc_string for n in model.graph.node)


def test_real_generics_refuse_what_is_not_a_number(tmp_path):
    bad = SOURCE.replace("sub fixed: Inner<D, T, 0.5>", "sub fixed: Inner<D, T, D>")
    root = write_entry(tmp_path / "bad")
    (root / "src" / "lib.linnet").write_text(textwrap.dedent(bad).lstrip())
    with pytest.raises(LinnetError) as caught:
        nest.prepare(root, need_weights=False)
    assert caught.value.code == "E0308"
    assert "generic `Rate` of block `Inner` is Real and needs a number" in caught.value.render()
    assert "sub fixed: Inner<D, T, D>" in caught.value.render()  # points at the argument
    with pytest.raises(LinnetError) as caught:
        _program(tmp_path / "c", overrides={"Rate": "f32"})
    assert caught.value.code == "E0503" and "Real and needs a finite number" in caught.value.render()
    on_fn = SOURCE.replace("block Inner<D: Dim, T: Float, Rate: Real> {",
                           "fn twice<R: Real>(x: Tensor[; f32]) -> Tensor[; f32] { return x }\n"
                           "block Inner<D: Dim, T: Float, Rate: Real> {")
    root = write_entry(tmp_path / "fn")
    (root / "src" / "lib.linnet").write_text(textwrap.dedent(on_fn).lstrip())
    with pytest.raises(LinnetError) as caught:
        nest.prepare(root, need_weights=False)
    assert caught.value.code == "E0204" and "belongs to a block" in caught.value.render()


# ------------------------------------------------------------------------ BERT's rates


def test_hf_config_rates_show_where_transformers_applies_them(hf_cache):
    from fixtures.hf_checkpoints import write_transformers_repo
    from linnet.backends.torch_source import emit

    repo = write_transformers_repo(hf_cache, "linnet-tests/dropout-rates", "BertForSequenceClassification",
                                   hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.3,
                                   classifier_dropout=0.4)
    ctx, _ = nest.prepare(repo.name)
    text = emit(ctx.program)
    assert "return F.dropout(self.norm(summed), 0.2, self.training)" in text  # embeddings
    # + the embeddings of vectors (`inputs_embeds`), and both residual branches of EncoderLayer
    # in `forward` and in `forward_head_masked`
    assert text.count(", 0.2, self.training)") == 6
    assert "mask, 0.3, self.training)" in text  # attention probabilities
    # the classifier's input: the pooled vector, in the function every `logits*` entry shares
    assert "self.classifier(F.dropout(self.bert.pool_hidden(hidden), 0.4, self.training))" in text


def test_bert_classifier_rate_defaults_to_the_hidden_rate(hf_cache):
    from fixtures.hf_checkpoints import write_transformers_repo
    from linnet.backends.torch_source import emit

    repo = write_transformers_repo(hf_cache, "linnet-tests/dropout-null", "BertForTokenClassification",
                                   hidden_dropout_prob=0.15, classifier_dropout=None)
    ctx, _ = nest.prepare(repo.name)
    text = emit(ctx.program)
    # every position's hidden state, in the function every `logits*` entry shares
    assert "def scores(self, hidden):" in text
    assert "self.classifier(F.dropout(hidden, 0.15, self.training))" in text


def test_hf_rate_outside_zero_one_is_refused(hf_cache):
    from fixtures.hf_checkpoints import config_dict, write_raw_repo

    repo = write_raw_repo(hf_cache, "linnet-tests/dropout-bad", config_dict("BertModel", hidden_dropout_prob=1.5))
    with pytest.raises(LinnetError) as caught:
        nest.prepare(repo.name)
    assert caught.value.code == "E1103"
    assert "`hidden_dropout_prob` must be a probability in [0, 1), found 1.5" in caught.value.render()
