"""Entry delegation: `pub use sub.{entry, other as name}` inside a block (front/resolve.py)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from linnet.diagnostics import LinnetError
from linnet.front import ast
from linnet.front.resolve import load_file

REPO = Path(__file__).resolve().parents[1]

INNER = """
block Inner<D: Dim, T: Float> {
    param w: Tensor[D, D; T]
    pub entry forward<B: Dim>(x: Tensor[B, D; T], y: Tensor[B, D; T] = zeros) -> Tensor[B, D; T]
    where B <= 4 {
        return x + y
    }
    pub fn table() -> Tensor[D, D; T] {
        return w
    }
}
"""


def _blocks(tmp_path: Path, text: str) -> dict[str, ast.Block]:
    path = tmp_path / "m.linnet"
    path.write_text(text, encoding="utf-8")
    program = load_file(path)
    return {i.name: i for i in program.roots[0].tree.items if isinstance(i, ast.Block)}


def _type_text(node) -> str:
    if isinstance(node, ast.TensorTypeNode):
        return "[" + ", ".join(_type_text(d) for d in node.dims) + "; " + node.dtype.name + "]"
    if isinstance(node, ast.DimName):
        return node.name
    if isinstance(node, ast.DimInt):
        return str(node.value)
    if isinstance(node, ast.DimBinary):
        return f"{_type_text(node.left)} {node.op} {_type_text(node.right)}"
    raise AssertionError(node)


def test_a_delegated_entry_has_the_callees_signature_in_the_outer_blocks_generics(tmp_path):
    blocks = _blocks(tmp_path, INNER + """
pub block Outer<E: Dim, U: Float = f32> {
    sub inner: Inner<E * 2, U>
    pub use inner.forward
}
""")
    (forward,) = blocks["Outer"].functions
    assert (forward.name, forward.is_entry, forward.public) == ("forward", True, True)
    assert [g.name for g in forward.generics] == ["B"]
    assert [(p.name, _type_text(p.type), p.default) for p in forward.params] == [
        ("x", "[B, E * 2; U]", None), ("y", "[B, E * 2; U]", "zeros")]
    assert _type_text(forward.result) == "[B, E * 2; U]"
    (clause,) = forward.where
    assert (_type_text(clause.left), clause.op, _type_text(clause.right)) == ("B", "<=", "4")
    # The clause keeps the callee's span, so a precondition message points where it is written.
    assert clause.span.line == 5  # `    where B <= 4` in INNER
    call = forward.body[0].value
    assert (call.receiver.name, call.method, [a.name for a in call.args]) == ("inner", "forward", ["x", "y"])
    # The callee itself is untouched by the substitution.
    assert _type_text(blocks["Inner"].functions[0].params[0].type) == "[B, D; T]"


def test_as_renames_and_the_written_order_is_kept(tmp_path):
    blocks = _blocks(tmp_path, INNER + """
pub block Outer<D: Dim> {
    sub inner: Inner<D, f32>
    pub entry first<B: Dim>(x: Tensor[B, D; f32]) -> Tensor[B, D; f32] {
        return weights_forward(x, x)
    }
    pub use inner.{forward as weights_forward, table}
    pub entry last<B: Dim>(x: Tensor[B, D; f32]) -> Tensor[B, D; f32] {
        return x
    }
}
""")
    functions = blocks["Outer"].functions
    assert [(f.name, f.is_entry) for f in functions] == [
        ("first", True), ("weights_forward", True), ("table", False), ("last", True)]
    assert functions[1].body[0].value.method == "forward"


def test_a_delegation_may_name_a_delegated_entry(tmp_path):
    blocks = _blocks(tmp_path, INNER + """
block Middle<D: Dim> {
    sub inner: Inner<D, f32>
    pub use inner.forward
}
pub block Outer<K: Dim> {
    sub middle: Middle<K>
    pub use middle.forward
}
""")
    (forward,) = blocks["Outer"].functions
    assert _type_text(forward.params[0].type) == "[B, K; f32]"
    assert forward.body[0].value.receiver.name == "middle"


def test_a_file_with_delegations_checks_and_a_bad_one_is_refused(tmp_path):
    good = tmp_path / "good.linnet"
    good.write_text(INNER + "pub block Outer<D: Dim> {\n    sub inner: Inner<D, f32>\n    pub use inner.{forward, table}\n}\n")
    run = subprocess.run([sys.executable, "-m", "linnet.cli", "check", str(good)], capture_output=True, text=True,
                         cwd=REPO)
    assert run.returncode == 0, run.stderr
    bad = tmp_path / "bad.linnet"
    bad.write_text(INNER + "pub block Outer<D: Dim> {\n    sub inner: Inner<D, f32>\n    pub use inner.nothing\n}\n")
    with pytest.raises(LinnetError) as err:
        load_file(bad)
    assert [d.code for d in err.value.diagnostics] == ["E0109"]


def test_bert_delegated_entries_report_preconditions_at_the_callees_clause():
    run = subprocess.run([sys.executable, "-m", "linnet.cli", "check", "bert-base-uncased", "--set", "S=600",
                          "--format", "json"], capture_output=True, text=True, cwd=REPO)
    report = json.loads(run.stdout)
    source = (REPO / "nest/bert-base-uncased/src/lib.linnet").read_text(encoding="utf-8").splitlines()
    encoder_forward = next(i for i, line in enumerate(source, 1) if line.strip().startswith("pub entry forward<")
                           and any("pub block Encoder<" in s for s in source[:i]))
    by_entry = {}
    for d in report["diagnostics"]:
        if d["code"] == "E0403":
            name = d["message"].split("`")[1]
            by_entry[name] = d["span"]["line"] if "span" in d else d["line"]
    # PreTraining.forward delegates to Model.forward, which delegates to Encoder.forward.
    assert source[by_entry["forward"] - 1].strip().startswith("where S <= MaxPositions")
    assert encoder_forward < by_entry["forward"] < encoder_forward + 10


def test_a_tree_resolved_twice_gains_its_delegated_entries_once(tmp_path):
    """Was: E0110 for every delegation when a harness resolved the same parsed tree again (test_fuzz)."""
    from linnet.front.resolve import _Delegations
    path = tmp_path / "m.linnet"
    path.write_text(INNER + "pub block Outer<D: Dim> {\n    sub inner: Inner<D, f32>\n    pub use inner.forward\n}\n")
    program = load_file(path)
    errors = []
    _Delegations(errors).expand(program.modules.values())
    assert errors == []
    outer = next(i for i in program.roots[0].tree.items if i.name == "Outer")
    assert [f.name for f in outer.functions] == ["forward"]


THEN = INNER + """
pub block Outer<E: Dim, L: Dim> {
    sub inner: Inner<E, f32>
    param head: Tensor[E, L; f32]
    pub use inner.{forward as logits} then scores
    pub entry written<B: Dim>(x: Tensor[B, E; f32], y: Tensor[B, E; f32] = zeros) -> Tensor[B, L; f32]
    where B <= 4 {
        return scores(inner.forward(x, y))
    }
    fn scores<N: Dim>(hidden: Tensor[N, E; f32]) -> Tensor[N, L; f32] {
        return matmul(hidden, head)
    }
}
"""


def test_then_lifts_the_result_through_the_blocks_function(tmp_path):
    blocks = _blocks(tmp_path, THEN)
    logits = next(f for f in blocks["Outer"].functions if f.name == "logits")
    assert [(p.name, _type_text(p.type), p.default) for p in logits.params] == [
        ("x", "[B, E; f32]", None), ("y", "[B, E; f32]", "zeros")]
    # `scores`' N is read off `forward`'s result [B, E]: the lifted result is [B, L].
    assert _type_text(logits.result) == "[B, L; f32]"
    assert [g.name for g in logits.generics] == ["B"]
    call = logits.body[0].value
    assert (call.name, call.args[0].receiver.name, call.args[0].method) == ("scores", "inner", "forward")


MANIFEST = """\
[model]
name = "lifted-head"
title = "Lifted delegation test"
summary = "A head whose logits are a lifted delegation."
license = "MIT"
family = "test"

[source]
path = "src/lib.linnet"
root = "Outer"
entry = "logits"

[generics]
E = 3
L = 2

[check]
B = 2

[weights]
repo = "linnet/lifted-head"
revision = "0000000000000000000000000000000000000000"
files = ["model.safetensors"]
bindings = "bindings.json"
"""


@pytest.fixture(scope="module")
def lifted_entry(tmp_path_factory):
    """A zoo entry of `THEN` with random weights: its folder, weights file and the weights."""
    np = pytest.importorskip("numpy", reason="numpy is needed to build the weights")
    safetensors = pytest.importorskip("safetensors.numpy", reason="safetensors is needed to write the weights")
    root = tmp_path_factory.mktemp("lifted")
    entry = root / "lifted-head"
    (entry / "src").mkdir(parents=True)
    (entry / "src" / "lib.linnet").write_text("module heads\n" + THEN, encoding="utf-8")
    (entry / "nest.toml").write_text(MANIFEST, encoding="utf-8")
    (entry / "linnet.toml").write_text('[package]\nname = "heads"\nversion = "0.1.0"\nlanguage = "0.1"\n')
    rng = np.random.default_rng(3)
    weights = {"inner.w": rng.standard_normal((3, 3)).astype(np.float32),
               "head": rng.standard_normal((3, 2)).astype(np.float32)}
    (entry / "bindings.json").write_text(json.dumps({k: f"ckpt.{k}" for k in weights}))
    safetensors.save_file({f"ckpt.{k}": v for k, v in weights.items()}, str(root / "model.safetensors"))
    return entry, root / "model.safetensors", weights


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_a_lifted_entry_computes_what_the_written_one_does(lifted_entry, backend):
    """Both against numpy by hand: (x + y) @ head, the sum being `Inner.forward`."""
    import numpy as np

    from linnet import nest

    entry, weights_file, weights = lifted_entry
    model = nest.load(entry, backend=backend, weights=weights_file)
    rng = np.random.default_rng(5)
    x, y = (rng.standard_normal((2, 3)).astype(np.float32) for _ in range(2))
    expected = (x.astype(np.float64) + y) @ weights["head"].astype(np.float64)
    np.testing.assert_allclose(np.asarray(model.logits(x, y)), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(model.written(x, y)), expected, rtol=1e-5, atol=1e-5)
    # `y` defaults to zeros, as on the delegated entry.
    np.testing.assert_allclose(np.asarray(model.logits(x)), x.astype(np.float64) @ weights["head"], rtol=1e-5,
                               atol=1e-5)


def test_then_refuses_a_function_whose_input_does_not_fit(tmp_path):
    bad = tmp_path / "bad.linnet"
    bad.write_text(THEN.replace("fn scores<N: Dim>(hidden: Tensor[N, E; f32])",
                                "fn scores<N: Dim, S: Dim>(hidden: Tensor[N, S, E; f32])")
                   .replace("Tensor[N, L; f32]", "Tensor[N, S, L; f32]"), encoding="utf-8")
    with pytest.raises(LinnetError) as err:
        load_file(bad)
    assert [d.code for d in err.value.diagnostics] == ["E0112"]
