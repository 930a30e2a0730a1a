"""Block templates (a block with a `Block` generic) and the block aliases that instantiate them.

The resolver expands `pub block X<...> = Template<Enc<...>, ...>` into an ordinary block
(front/templates.py, `Templates`), so the checker, lowering and every backend see a block as if
written out: these tests compare an instance with the same block written by hand, down to the
generated code, and run one on torch, JAX and ONNX. The invalid forms are golden cases
(`tests/golden/errors/alias_*`, `template_*`, `block_generic_as_dim`).
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from linnet.cli.targets import locate
from linnet.compiler import compile_target
from linnet.diagnostics import LinnetError
from linnet.front import ast
from linnet.front.resolve import load_file
from linnet.middle import ir
from linnet.middle.instantiate import instantiate
from linnet.middle.lower import lower

ENCODER = """\
use std.nn.linear::{Linear}

pub block Encoder<D: Dim, MaxLen: Dim> {
    sub proj: Linear<D, D, f32>

    pub entry forward<B: Dim, S: Dim>(x: Tensor[B, S, D; f32], mask: Tensor[B, S; f32] = ones) -> Tensor[B, S, D; f32]
    where S <= MaxLen {
        return tanh(proj.forward(x)) * reshape(mask, [B, S, 1])
    }
}
"""

TEMPLATE = """\
block Tagger<Enc: Block, D: Dim, Labels: Dim, MaxLen: Dim> {
    sub encoder: Enc
    sub classifier: Linear<D, Labels, f32>

    pub use encoder.forward as logits then scores

    pub entry best<B: Dim, S: Dim>(x: Tensor[B, S, D; f32], mask: Tensor[B, S; f32]) -> Tensor[B, S, 1; f32]
    where S <= MaxLen {
        return max(logits(x, mask), -1) * cast<f32>(Labels)
    }

    fn scores<B: Dim, S: Dim>(hidden: Tensor[B, S, D; f32]) -> Tensor[B, S, Labels; f32] {
        return classifier.forward(hidden)
    }
}
"""

BY_HAND = """\
pub block EncoderTagger<W: Dim, Labels: Dim, MaxLen: Dim = 8>
where W > 0 {
    sub encoder: Encoder<W, MaxLen>
    sub classifier: Linear<W, Labels, f32>

    pub use encoder.forward as logits then scores

    pub entry best<B: Dim, S: Dim>(x: Tensor[B, S, W; f32], mask: Tensor[B, S; f32]) -> Tensor[B, S, 1; f32]
    where S <= MaxLen {
        return max(logits(x, mask), -1) * cast<f32>(Labels)
    }

    fn scores<B: Dim, S: Dim>(hidden: Tensor[B, S, W; f32]) -> Tensor[B, S, Labels; f32] {
        return classifier.forward(hidden)
    }
}
"""

# The alias renames D to W on purpose: the template's generics are replaced by the alias's
# arguments in types, generic arguments and expressions (`cast<f32>(Labels)`).
ALIAS = """\
pub block EncoderTagger<W: Dim, Labels: Dim, MaxLen: Dim = 8> = Tagger<Encoder<W, MaxLen>, W, Labels, MaxLen>
where W > 0
"""

SIZES = {"W": 4, "Labels": 3}


def _compile(tmp_path: Path, name: str, text: str):
    path = tmp_path / f"{name}.linnet"
    path.write_text(text, encoding="utf-8")
    return compile_target(locate(str(path)))


def _without_locations(source: str) -> str:
    """Generated code without its `file:line` comments (which name the text each line came from)
    and its module names."""
    source = re.sub(r"\S+\.linnet:\d+", "<loc>", source)
    return re.sub(r"\S*\b(by_hand|alias)\b", "<m>", source)  # the two files' module names and paths


def test_an_alias_is_the_block_written_out_down_to_the_generated_code(tmp_path):
    from linnet.backends import jax_source, torch_source

    programs = {}
    for name, text in (("by_hand", ENCODER + BY_HAND), ("alias", ENCODER + TEMPLATE + ALIAS)):
        checked = _compile(tmp_path, name, text).checked
        block = checked.find_block("EncoderTagger")
        assert [g.name for g in block.generics] == ["W", "Labels", "MaxLen"]
        assert [str(c) for c in block.where] == ["W > 0"]
        assert list(block.functions) == ["logits", "best", "scores"]
        instance = instantiate(checked, "EncoderTagger", SIZES)
        programs[name] = (instance, lower(instance))
    (hand, hand_ir), (alias, alias_ir) = programs["by_hand"], programs["alias"]
    assert [(p.name, p.shape) for p in alias.params] == [(p.name, p.shape) for p in hand.params] == [
        ("encoder.proj.weight", (4, 4)), ("encoder.proj.bias", (4,)),
        ("classifier.weight", (3, 4)), ("classifier.bias", (3,))]
    assert {k: str(v) for k, v in alias.entries.items()} == {k: str(v) for k, v in hand.entries.items()}
    assert str(alias.entries["logits"]) == (
        "logits<B, S>(x: Tensor[B, S, 4; f32], mask: Tensor[B, S; f32] = ones) -> Tensor[B, S, 3; f32] where S <= 8")
    for emit in (torch_source.emit, jax_source.emit):
        assert _without_locations(emit(alias_ir)) == _without_locations(emit(hand_ir))


def test_an_instance_runs_on_torch_jax_and_onnx(tmp_path):
    import jax
    import onnxruntime as ort
    import torch

    from linnet.backends import jax_source, onnx_graph, torch_source
    from linnet.backends.pysource import import_generated
    from linnet.backends.torch_runtime import torch_param_name

    program = lower(instantiate(_compile(tmp_path, "alias", ENCODER + TEMPLATE + ALIAS).checked,
                                "EncoderTagger", SIZES))
    ir.verify(program)
    rng = np.random.default_rng(5)
    weights = {p: rng.standard_normal(tuple(d.as_int() for d in t.dims)).astype(np.float32)
               for p, t in program.param_paths()}
    x = rng.standard_normal((2, 5, 4)).astype(np.float32)
    mask = np.ones((2, 5), np.float32)
    hidden = np.tanh(x @ weights["encoder.proj.weight"].T + weights["encoder.proj.bias"])
    expected = hidden @ weights["classifier.weight"].T + weights["classifier.bias"]

    (tmp_path / "model.py").write_text(torch_source.emit(program))
    model = import_generated(tmp_path / "model.py", "linnet_test_templates").EncoderTagger()
    model.load_state_dict({torch_param_name(k): torch.from_numpy(v) for k, v in weights.items()})
    with torch.no_grad():
        got = {"torch": model.logits(torch.from_numpy(x), torch.from_numpy(mask)).numpy()}
    namespace: dict = {}
    exec(compile(jax_source.emit(program), "templates_jax.py", "exec"), namespace)
    got["jax"] = np.asarray(jax.jit(namespace["ENTRIES"]["logits"])(jax_source.params_tree(program, weights), x, mask))
    files = onnx_graph.emit(program, weights, name="tagger", outputs={"logits": "logits", "best": "best"})
    model_file = next(f for f in files if "logits" in [o.name for o in f.model.graph.output])
    session = ort.InferenceSession(model_file.model.SerializeToString(), providers=["CPUExecutionProvider"])
    got["onnx"] = session.run(None, {"x": x, "mask": mask})[0]
    for backend, value in got.items():
        np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-5, err_msg=backend)


def test_one_template_has_many_instances_and_an_alias_can_be_passed_on(tmp_path):
    text = ENCODER + TEMPLATE + """
pub block Small<Labels: Dim> = Tagger<Encoder<2, 4>, 2, Labels, 4>
pub block Wide<D: Dim> = Tagger<Encoder<D, 16>, D, 7, 16>

// A template over a block that is itself an instance.
block Twice<Enc: Block, D: Dim, MaxLen: Dim> {
    sub inner: Enc
    pub entry logits<B: Dim, S: Dim>(x: Tensor[B, S, D; f32]) -> Tensor[B, S, 7; f32] where S <= MaxLen {
        return inner.logits(x, ones_like(x)) * 2.0
    }
}
fn ones_like<B: Dim, S: Dim, D: Dim>(x: Tensor[B, S, D; f32]) -> Tensor[B, S; f32] {
    return x[:, :, 0] * 0.0 + 1.0
}
pub block WideTwice<D: Dim> = Twice<Wide<D>, D, 16>
"""
    checked = _compile(tmp_path, "many", text).checked
    small = instantiate(checked, "Small", {"Labels": 5})
    assert str(small.entries["logits"]).endswith("-> Tensor[B, S, 5; f32] where S <= 4")
    wide = instantiate(checked, "Wide", {"D": 3})
    assert [p.name for p in wide.params][-2:] == ["classifier.weight", "classifier.bias"]
    twice = instantiate(checked, "WideTwice", {"D": 3})
    assert [p.name for p in twice.params] == ["inner.encoder.proj.weight", "inner.encoder.proj.bias",
                                              "inner.classifier.weight", "inner.classifier.bias"]
    assert str(twice.entries["logits"]) == "logits<B, S>(x: Tensor[B, S, 3; f32]) -> Tensor[B, S, 7; f32] where S <= 16"


def test_a_template_module_is_imported_and_its_names_resolve_where_it_is_written(tmp_path):
    # The template's module imports Linear and has a private helper, `double`; the alias's
    # module imports neither, and the instance still finds both.
    heads = "use std.nn.linear::{Linear}\n" + TEMPLATE.replace("block Tagger", "pub block Tagger").replace(
        "return classifier.forward(hidden)", "return double(classifier.forward(hidden))")
    heads += "fn double<*S: Shape>(x: Tensor[*S; f32]) -> Tensor[*S; f32] {\n    return x * 2.0\n}\n"
    (tmp_path / "heads.linnet").write_text(heads, encoding="utf-8")
    text = "use heads::{Tagger}\n" + ENCODER + ALIAS
    checked = _compile(tmp_path, "model", text).checked
    block = checked.find_block("EncoderTagger")
    assert block.key == "model::EncoderTagger"
    assert block.module.expanded_from.name == "heads"
    assert [p.name for p in instantiate(checked, "EncoderTagger", SIZES).params][:1] == ["encoder.proj.weight"]


def test_the_template_is_not_checked_alone_and_the_alias_parses_into_its_own_node(tmp_path):
    path = tmp_path / "t.linnet"
    path.write_text(ENCODER + TEMPLATE + ALIAS, encoding="utf-8")
    program = load_file(path)
    items = {i.name: i for i in program.roots[0].tree.items}
    assert isinstance(items["EncoderTagger"], ast.BlockAlias)
    assert items["EncoderTagger"].target.name == "Tagger"
    assert [type(a).__name__ for a in items["EncoderTagger"].target.args] == ["BlockRef", "DimName", "DimName",
                                                                               "DimName"]
    # The template alone: no instance, nothing to check, no error (its body uses `encoder.forward`,
    # which only an instance can resolve).
    alone = _compile(tmp_path, "alone", ENCODER + TEMPLATE)
    with pytest.raises(KeyError):
        alone.checked.find_block("Tagger")


def test_bert_heads_are_instances_of_the_std_templates():
    checked = compile_target(locate("nest/bert-base-uncased")).checked
    for name, template in (("SequenceClassification", "SequenceClassifier"), ("TokenClassification", "TokenClassifier"),
                           ("QuestionAnswering", "SpanExtractor"), ("MultipleChoice", "ChoiceClassifier"),
                           ("SequenceRegression", "SequenceRegressor"), ("MaskedLm", "MaskedLmModel")):
        block = checked.find_block(name)
        assert block.key == f"bert::{name}"
        assert block.node.instance_of[0] == template
        assert block.module.expanded_from.name == "std.nn.heads"


def test_an_error_in_an_instance_names_the_alias(tmp_path):
    text = ENCODER + TEMPLATE.replace("return classifier.forward(hidden)", "return hidden") + ALIAS
    with pytest.raises(LinnetError) as caught:
        _compile(tmp_path, "bad", text)
    (diagnostic,) = caught.value.diagnostics
    assert diagnostic.code == "E0307"
    assert diagnostic.notes[-1].message == "in `EncoderTagger`, the instance of template `Tagger` declared here"
    assert diagnostic.notes[-1].span.line == ENCODER.count("\n") + TEMPLATE.count("\n") + 1


def test_a_splice_declares_a_blocks_generics_and_clauses_and_passes_them_by_name(tmp_path):
    text = ENCODER.replace("pub block Encoder<D: Dim, MaxLen: Dim>", "pub block Encoder<D: Dim, MaxLen: Dim = 8>\n"
                           "where D > 1") + TEMPLATE + """
pub block Spliced<..Encoder, Labels: Dim, Extra: Dim = D + Labels> = Tagger<Encoder<..>, D, Labels, MaxLen>
where Labels > 0
pub block Again<..Spliced> = Tagger<Encoder<D, MaxLen>, D, Labels, MaxLen>
"""
    checked = _compile(tmp_path, "spliced", text).checked
    for name in ("Spliced", "Again"):
        block = checked.find_block(name)
        assert [(g.name, str(g.default)) for g in block.generics] == [
            ("D", "None"), ("MaxLen", "8"), ("Labels", "None"), ("Extra", "D + Labels")]
        assert [str(c) for c in block.where] == ["D > 1", "Labels > 0"]
    instance = instantiate(checked, "Spliced", {"D": 4, "Labels": 3})
    assert str(instance.entries["logits"]).endswith("-> Tensor[B, S, 3; f32] where S <= 8")


def test_the_tree_walk_visits_every_node_depth_first_and_reads_fields_as_it_reaches_them():
    """`_nodes` keeps a stack instead of recursing; it must visit what the recursive walk did, in
    the same order, and see a field the caller replaced on the node it was just given."""
    import dataclasses

    from linnet.diagnostics import Span
    from linnet.front.parser import parse_file
    from linnet.front.templates import _nodes
    from linnet.paths import std_dir, zoo_dir

    def recursive(node):
        if isinstance(node, list):
            for n in node:
                yield from recursive(n)
        elif dataclasses.is_dataclass(node) and not isinstance(node, Span):
            yield node
            for f in dataclasses.fields(node):
                yield from recursive(getattr(node, f.name))

    files = [zoo_dir() / "bert-base-uncased" / "src" / "lib.linnet", *sorted(std_dir().rglob("*.linnet"))]
    for file in files:
        tree = parse_file(file)
        assert [id(n) for n in _nodes(tree)] == [id(n) for n in recursive(tree)], file
    ref = ast.BlockRef("Model", [ast.DimName("D", None)], None)
    seen = []
    for node in _nodes([ref]):
        seen.append(node)
        if node is ref:
            ref.args = [ast.DimName("E", None)]
    assert [getattr(n, "name", None) for n in seen] == ["Model", "E"]
