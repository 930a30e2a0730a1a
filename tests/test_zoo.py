"""`nest.list()` and `linnet zoo`: every entry, with sizes that agree with a hand count.

Parameter counts are recomputed here from each manifest's generics with BERT's formula
(embeddings, then per layer four D×D projections, two LayerNorms and the D→Inner→D MLP,
then the pooler and any pre-training heads), written out independently of the compiler.
"""
from __future__ import annotations

import json
import re
import shutil
import tomllib
from pathlib import Path

import pytest

from fixtures.checkpoints import _Snapshot
from linnet import nest
from linnet.cli import main
from linnet.nest import zoo
from linnet.nest.zoo import list_zoo

REPO = Path(__file__).resolve().parent.parent
ZOO = REPO / "nest"


def entry_dirs() -> list[str]:
    return sorted(p.name for p in ZOO.iterdir() if (p / "nest.toml").is_file())


def generics(name: str, folder: Path = ZOO) -> dict:
    return tomllib.loads((folder / name / "nest.toml").read_text())["generics"]


def bert_param_count(g: dict, *, heads: bool) -> int:
    """BERT's parameter count from its sizes; `heads`: BertForPreTraining's cls.* heads."""
    V, P, T, D, I, L = g["Vocab"], g["MaxPositions"], g["TypeVocab"], g["D"], g["Inner"], g["Layers"]
    embeddings = (V + P + T) * D + 2 * D
    layer = 4 * (D * D + D) + (D * I + I) + (I * D + D) + 2 * (2 * D)
    pooler = D * D + D
    pretraining = (D * D + D) + 2 * D + V + (2 * D + 2)  # transform, its LayerNorm, bias, NSP
    return embeddings + L * layer + pooler + (pretraining if heads else 0)


@pytest.fixture(scope="module")
def listing():
    return {entry.name: entry for entry in nest.list()}


def test_every_entry_folder_is_listed_in_order():
    assert [e.name for e in nest.list()] == entry_dirs()
    assert {"bert-base-uncased", "all-minilm-l6-v2", "bert-large-uncased", "bert-base-chinese"} <= set(entry_dirs())


def test_no_entry_reports_a_problem(listing):
    assert {name: e.problem for name, e in listing.items() if e.problem} == {}


def test_bert_base_is_110m_by_the_formula(listing):
    expected = bert_param_count(generics("bert-base-uncased"), heads=True)
    assert 109e6 < expected < 111e6
    entry = listing["bert-base-uncased"]
    assert entry.params == expected
    assert entry.size_bytes == 4 * expected  # f32
    assert entry.param_tensors == 5 + 16 * 12 + 2 + 7  # embeddings, layers, pooler, heads


@pytest.mark.parametrize("name", ["all-minilm-l6-v2", "bert-base-cased", "bert-large-uncased",
                                  "bert-base-multilingual-cased", "bert-base-multilingual-uncased",
                                  "bert-base-chinese", "bert-large-cased"])
def test_every_bert_entry_matches_the_formula(listing, name):
    root = listing[name].root
    assert listing[name].params == bert_param_count(generics(name), heads=root == "PreTraining")


def test_rows_carry_the_manifest_fields(listing):
    large = listing["bert-large-uncased"]
    manifest = tomllib.loads((ZOO / "bert-large-uncased" / "nest.toml").read_text())
    assert large.title == manifest["model"]["title"] and large.license == "Apache-2.0"
    assert large.tags == tuple(manifest["model"]["tags"]) and large.family == "bert"
    assert (large.weights_repo, large.weights_revision) == ("google-bert/bert-large-uncased",
                                                            manifest["weights"]["revision"])


def test_cached_means_every_checkpoint_file_is_in_the_hf_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    assert not any(e.weights_cached for e in nest.list())
    revision = tomllib.loads((ZOO / "bert-base-chinese" / "nest.toml").read_text())["weights"]["revision"]
    _Snapshot(tmp_path, "google-bert/bert-base-chinese", revision).add_bytes("model.safetensors", b"x")
    cached = {e.name for e in nest.list() if e.weights_cached}
    assert cached == {"bert-base-chinese"}
    # Another revision of the same repo is not the pinned checkpoint.
    _Snapshot(tmp_path, "google-bert/bert-base-cased", "0" * 40).add_bytes("model.safetensors", b"x")
    assert {e.name for e in nest.list() if e.weights_cached} == {"bert-base-chinese"}


# --------------------------------------------------------------------------- bindings vs transformers

#: The transformers class whose checkpoints each root block is bound to.
TRANSFORMERS_CLASS = {"PreTraining": "BertForPreTraining", "Model": "BertModel",
                      "ImageClassification": "ViTForImageClassification"}
#: Families whose entries bind one class whatever the root (GPT2Model: the original,
#: unprefixed checkpoints' keys).
FAMILY_CLASS = {"gpt2": "GPT2Model", "llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                "modernbert": "ModernBertForMaskedLM"}
#: Small sizes for the checkpoint transformers writes, per family (the layer count stays the entry's).
TINY = {
    "bert": {"Vocab": 11, "MaxPositions": 16, "TypeVocab": 2, "D": 8, "Heads": 2, "Inner": 16},
    "vit": {"Image": 8, "Patch": 4, "Channels": 3, "D": 8, "Heads": 2, "Inner": 16, "Labels": 5, "H": 8, "W": 8},
    "gpt2": {"Vocab": 11, "MaxPositions": 16, "D": 8, "Heads": 2, "Inner": 32},
    "llama": {"Vocab": 11, "MaxPositions": 16, "D": 8, "Heads": 2, "KvHeads": 1, "Inner": 12},
    "qwen2": {"Vocab": 11, "MaxPositions": 16, "D": 8, "Heads": 2, "KvHeads": 1, "Inner": 12},
    "modernbert": {"Vocab": 11, "MaxPositions": 16, "D": 8, "Heads": 2, "Inner": 12, "Window": 2},
}


def _transformers_config(family: str, layers: int):
    import transformers

    tiny = TINY[family]
    if family == "gpt2":
        return transformers.GPT2Config(vocab_size=tiny["Vocab"], n_positions=tiny["MaxPositions"], n_embd=tiny["D"],
                                       n_head=tiny["Heads"], n_layer=layers)
    if family == "llama":  # tied, as the zoo's entry: the checkpoint stores the token table once
        return transformers.LlamaConfig(vocab_size=tiny["Vocab"], max_position_embeddings=tiny["MaxPositions"],
                                        hidden_size=tiny["D"], num_attention_heads=tiny["Heads"],
                                        num_key_value_heads=tiny["KvHeads"], intermediate_size=tiny["Inner"],
                                        num_hidden_layers=layers, tie_word_embeddings=True)
    if family == "qwen2":  # tied, as the zoo's entry; q/k/v with biases (Qwen2Attention's own)
        return transformers.Qwen2Config(vocab_size=tiny["Vocab"], max_position_embeddings=tiny["MaxPositions"],
                                        hidden_size=tiny["D"], num_attention_heads=tiny["Heads"],
                                        num_key_value_heads=tiny["KvHeads"], intermediate_size=tiny["Inner"],
                                        num_hidden_layers=layers, tie_word_embeddings=True)
    if family == "modernbert":
        return transformers.ModernBertConfig(
            vocab_size=tiny["Vocab"], max_position_embeddings=tiny["MaxPositions"], hidden_size=tiny["D"],
            num_attention_heads=tiny["Heads"], intermediate_size=tiny["Inner"], num_hidden_layers=layers,
            local_attention=2 * tiny["Window"], pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
            sep_token_id=2)
    if family == "vit":
        return transformers.ViTConfig(
            image_size=tiny["Image"], patch_size=tiny["Patch"], num_channels=tiny["Channels"], hidden_size=tiny["D"],
            num_attention_heads=tiny["Heads"], intermediate_size=tiny["Inner"], num_hidden_layers=layers,
            num_labels=tiny["Labels"])
    return transformers.BertConfig(
        vocab_size=tiny["Vocab"], max_position_embeddings=tiny["MaxPositions"], type_vocab_size=tiny["TypeVocab"],
        hidden_size=tiny["D"], num_attention_heads=tiny["Heads"], intermediate_size=tiny["Inner"],
        num_hidden_layers=layers)


def transformers_checkpoint(folder: Path, family: str, root: str, layers: int) -> Path:
    """The model.safetensors transformers' own `save_pretrained` writes for a tiny config of
    the root's class: its key layout, with no download."""
    import transformers

    name = FAMILY_CLASS.get(family) or TRANSFORMERS_CLASS[root]
    getattr(transformers, name)(_transformers_config(family, layers)).save_pretrained(folder)
    return folder / "model.safetensors"


def torch_spelling(key: str) -> str:
    """A LayerNorm key as torch names it today (the TF-era `gamma`/`beta` as `weight`/`bias`)."""
    return re.sub(r"\.LayerNorm\.gamma$", ".LayerNorm.weight", re.sub(r"\.LayerNorm\.beta$", ".LayerNorm.bias", key))


@pytest.mark.parametrize("name", entry_dirs())
def test_each_entrys_bindings_are_the_layout_transformers_writes(tmp_path, name):
    """Every param of the entry is bound, and the keys bound are exactly those transformers'
    own class writes for that architecture (LayerNorm spelling aside), at the same shapes."""
    from linnet.cli.targets import locate
    from linnet.compiler import compile_target
    from linnet.nest.manifest import load_manifest
    from linnet.nest.weights import entry_bindings, read_index, verify_bindings

    manifest = load_manifest(name)
    params = compile_target(locate(str(ZOO / name)), TINY[manifest.family]).instance.params
    bindings, _ = entry_bindings(manifest.weights, [p.name for p in params])
    assert list(bindings) == [p.name for p in params]
    written = transformers_checkpoint(tmp_path, manifest.family, manifest.source.root, manifest.generics["Layers"])
    index = read_index([written])
    assert {torch_spelling(key) for key in bindings.values()} == set(index)
    report = verify_bindings(params, bindings, index)
    assert set(report.bound) == {p.name for p in params} and report.unused_keys == []


def copy_entries(folder: Path, *names: str) -> Path:
    for name in names:
        shutil.copytree(ZOO / name, folder / name)
    return folder


def test_sizes_are_cached_and_follow_the_manifest(tmp_path, monkeypatch):
    folder = copy_entries(tmp_path / "zoo", "bert-base-uncased", "bert-base-chinese")
    first = {e.name: e.params for e in list_zoo(folder)}
    assert first["bert-base-chinese"] == bert_param_count(generics("bert-base-chinese"), heads=True)

    def no_compiling(manifest):
        raise AssertionError(f"{manifest.name} was compiled again")

    monkeypatch.setattr(zoo, "_count_params", no_compiling)
    assert {e.name: e.params for e in list_zoo(folder)} == first
    monkeypatch.undo()

    toml = folder / "bert-base-chinese" / "nest.toml"
    toml.write_text(toml.read_text().replace("Layers = 12", "Layers = 6"))
    changed = {e.name: e.params for e in list_zoo(folder)}
    assert changed["bert-base-chinese"] == bert_param_count(generics("bert-base-chinese", folder), heads=True)
    assert changed["bert-base-chinese"] < first["bert-base-chinese"]
    assert changed["bert-base-uncased"] == first["bert-base-uncased"]


def test_a_broken_entry_is_listed_with_its_problem(tmp_path):
    folder = copy_entries(tmp_path / "zoo", "bert-base-uncased", "bert-base-cased")
    toml = folder / "bert-base-cased" / "nest.toml"
    toml.write_text(toml.read_text().replace("D = 768", "D = 770"))  # 770 % 12 != 0
    rows = {e.name: e for e in list_zoo(folder)}
    assert rows["bert-base-uncased"].problem is None and rows["bert-base-uncased"].params
    broken = rows["bert-base-cased"]
    assert broken.params is None and broken.problem.startswith("error[E")
    (folder / "nameless").mkdir()
    (folder / "nameless" / "nest.toml").write_text("[model]\n")
    last = list_zoo(folder)[-1]
    assert last.name == "nameless" and last.params is None
    assert last.problem.startswith("error[E0902]: linnet.toml:")  # the first of its manifest errors


def test_linnet_zoo_prints_a_table(capsys):
    assert main(["zoo"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "TITLE", "PARAMS", "SIZE", "LICENSE", "WEIGHTS", "TAGS"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert sorted(rows) == entry_dirs()
    assert "110.1M" in rows["bert-base-uncased"] and "440.4 MB" in rows["bert-base-uncased"]
    assert "336.2M" in rows["bert-large-uncased"] and "1.3 GB" in rows["bert-large-uncased"]
    assert "multilingual" in rows["bert-base-multilingual-cased"]


def test_linnet_zoo_json(capsys, listing):
    assert main(["zoo", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["name"] for row in rows] == entry_dirs()
    by_name = {row["name"]: row for row in rows}
    assert by_name["bert-base-uncased"]["params"] == bert_param_count(generics("bert-base-uncased"), heads=True)
    assert by_name["all-minilm-l6-v2"]["weights_repo"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert by_name["bert-base-chinese"]["tags"] == list(listing["bert-base-chinese"].tags)


def test_human_units():
    assert zoo.human_count(110_106_428) == "110.1M" and zoo.human_count(999) == "999"
    assert zoo.human_bytes(1_344_904_432) == "1.3 GB" and zoo.human_bytes(512) == "512 B"
