"""nest.toml `[outputs]`: the names entries' results get in exported graphs (ONNX, Triton)."""
from __future__ import annotations

from pathlib import Path

import pytest

from linnet.diagnostics import LinnetError
from linnet.nest import prepare
from linnet.nest.manifest import load_manifest

TINY = """\
[model]
name = "tiny-bert"
title = "Tiny BERT"
summary = "The zoo's BERT source at a toy size."
license = "MIT"
family = "bert"

[source]
zoo = "bert-base-uncased"
root = "Model"
entry = "forward"

[outputs]
{outputs}

[generics]
Vocab = 50
MaxPositions = 16
TypeVocab = 2
D = 8
Heads = 2
Inner = 16
Layers = 1
T = "f32"
"""


def tiny_entry(tmp_path: Path, outputs: str) -> Path:
    entry = tmp_path / "tiny-bert"
    entry.mkdir()
    (entry / "nest.toml").write_text(TINY.format(outputs=outputs))
    (entry / "linnet.toml").write_text('[package]\nname = "bert"\nversion = "0.1.0"\nlanguage = "0.1"\n')
    return entry


def test_zoo_entries_name_their_outputs():
    encoder = {"forward": "hidden", "pool": "pooled", "embed": "embedding", "hidden_states": "hidden_states"}
    heads = {"mlm": "mlm_logits", "nsp": "nsp_logits"}  # bert-base-uncased keeps its pre-training heads
    for name, outputs in (("bert-base-uncased", {**encoder, **heads}), ("all-minilm-l6-v2", encoder)):
        manifest = load_manifest(name)
        assert manifest.outputs == outputs
        assert manifest.output_name("forward") == "hidden"


def test_an_entry_not_listed_keeps_its_own_name(tmp_path):
    ctx, _ = prepare(tiny_entry(tmp_path, 'forward = "hidden"'), need_weights=False)
    assert [ctx.output_name(e) for e in ctx.program.entries] == [
        "hidden", "hidden_states", "pool", "embed", "forward_positioned", "forward_embeds", "forward_head_masked",
        "forward_full", "attentions"]


def test_outputs_must_name_real_entries(tmp_path):
    with pytest.raises(LinnetError) as info:
        prepare(tiny_entry(tmp_path, 'forward = "hidden"\nclassify = "logits"'), need_weights=False)
    (diagnostic,) = info.value.diagnostics
    assert diagnostic.code == "E0913" and "classify" in diagnostic.message and "forward, hidden_states, pool, embed, forward_positioned" in diagnostic.message


def test_two_entries_may_not_share_an_output_name(tmp_path):
    with pytest.raises(LinnetError) as info:
        prepare(tiny_entry(tmp_path, 'forward = "out"\npool = "out"'), need_weights=False)
    assert info.value.diagnostics[0].code == "E0913" and "out" in info.value.diagnostics[0].message


def test_output_names_must_be_identifiers(tmp_path):
    with pytest.raises(LinnetError) as info:
        load_manifest(tiny_entry(tmp_path, 'forward = "hidden state"'))
    text = info.value.render()
    assert "outputs" in text and "forward" in text and "identifier" in text


def test_dtype_errors_quote_the_dtype_argument(tmp_path):
    with pytest.raises(LinnetError) as info:
        prepare(tiny_entry(tmp_path, 'forward = "hidden"'), dtype="i32", need_weights=False)
    text = info.value.render()
    assert "dtype=" in text and "--set" not in text
