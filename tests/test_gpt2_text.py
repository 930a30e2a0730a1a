"""GPT-2 with text: its byte-level BPE tokenizer, the end of text from nest.toml, `linnet run`.

* The tokenizer: a GPT-2-style byte-level BPE trained here with the `tokenizers` trainer on
  the docstrings of some standard-library modules (tests/fixtures/gpt2.py says which), saved
  as tokenizer.json and as vocab.json + merges.txt.  Ours, read from tokenizer.json, gives
  the ids of transformers' GPT2TokenizerFast built from either form, on the docstrings of
  other modules (a few hundred texts) and on hand-picked hard cases, one by one and as a
  left-padded batch; decoding gives the text back.
* A zoo entry with that tokenizer and `[generate] eos_token_id`: `model.tokenizer` yields
  only the inputs GPT-2's entries take, so `model(**model.tokenizer(texts))` runs and equals
  transformers' logits; `generate` stops at the declared end of text as transformers'
  generate does with the same eos id.
* `linnet run ENTRY PROMPT...` prints transformers' greedy continuation, decoded.
"""
from __future__ import annotations


import numpy as np
import pytest
import torch

from fixtures.gpt2 import END_OF_TEXT, HELD_OUT_MODULES, docstrings, save_gpt2, train_byte_bpe, write_tiny_entry
from linnet import LinnetError, nest
from linnet.cli import main
from linnet.nest.manifest import load_manifest
from linnet.nest.tokenizer import Tokenizer

BOUND = 1e-5
BPE_VOCAB = 600
EOS = 0  # the trainer gives the one special token the first id

HARD_CASES = [
    "", " ", "Hello world!", "   leading and trailing   ", "many     spaces\tand\ttabs\n\nand lines",
    "café naïve Ångström Dvořák Łódź", "中文 日本語 한국어", "Привет мир", "emoji 😀👍🏽 🇫🇷 👨‍👩‍👧",
    "x = {'a': [1, 2.5e-3]}  # comment", "don't won't it's we'll I'd y'all", "3.14159 1,000,000 0x1F",
    f"two texts{END_OF_TEXT}glued", f"{END_OF_TEXT} at the start", "ctrl\x00nul\x07bel\x7fdel", "\ufeffbom\u200bzw",
]


@pytest.fixture(scope="module")
def bpe_folder(tmp_path_factory):
    return train_byte_bpe(tmp_path_factory.mktemp("bpe"), BPE_VOCAB)


@pytest.fixture(scope="module")
def texts():
    held_out = docstrings(HELD_OUT_MODULES)
    assert len(held_out) >= 300, f"only {len(held_out)} held-out docstrings on this Python"
    return held_out + HARD_CASES


@pytest.fixture(scope="module")
def ours(bpe_folder):
    return Tokenizer.from_json(bpe_folder / "tokenizer.json", fallback_pad_id=EOS, fields=("tokens", "attention_mask"))


def references(folder):
    """GPT2TokenizerFast.from_pretrained over a folder holding only vocab.json + merges.txt, and
    over one holding only tokenizer.json (what transformers reads from a GPT-2 repo)."""
    import shutil

    from transformers import GPT2TokenizerFast

    found = {}
    for form, names, subfolder in [("vocab.json + merges.txt", ("vocab.json", "merges.txt"), "two-files"),
                                   ("tokenizer.json", ("tokenizer.json",), "json-only")]:
        only = folder / subfolder
        only.mkdir(exist_ok=True)
        for name in names:
            shutil.copy(folder / name, only / name)
        found[form] = GPT2TokenizerFast.from_pretrained(str(only))
    return found


# ----------------------------------------------------------------------------- the tokenizer


def test_ids_equal_gpt2_tokenizer_fast_from_either_form_of_the_files(bpe_folder, ours, texts):
    for form, reference in references(bpe_folder).items():
        assert reference.vocab_size == BPE_VOCAB, form
        for text in texts:
            expected = reference(text)["input_ids"]
            encoded = ours(text)
            assert encoded.tokens[0].tolist() == expected, (form, text)
    # Real merges were used: far fewer tokens than bytes.
    total_bytes = sum(len(t.encode("utf-8")) for t in texts)
    total_tokens = sum(len(ours.tokenize(t)) for t in texts)
    assert total_tokens < 0.6 * total_bytes


def test_decoding_gives_the_text_back_as_transformers_does(bpe_folder, ours, texts):
    reference = references(bpe_folder)["tokenizer.json"]
    for text in texts:
        ids = ours(text).tokens[0]
        assert ours.decode(ids, skip_special_tokens=False) == text
        assert ours.decode(ids) == reference.decode(ids.tolist(), skip_special_tokens=True) == text.replace(END_OF_TEXT, "")


def test_a_batch_is_left_padded_with_the_end_of_text_as_transformers_pads_it(bpe_folder, ours, texts):
    reference = references(bpe_folder)["tokenizer.json"]
    reference.pad_token, reference.padding_side = END_OF_TEXT, "left"
    batch = texts[:40:3]
    encoded = ours(batch, padding_side="left")
    expected = reference(batch, padding=True, return_tensors="np")
    assert encoded.tokens.shape[0] == len(batch) and encoded.tokens.shape[1] > 20
    assert (encoded.tokens == expected["input_ids"]).all()
    assert (encoded.attention_mask == expected["attention_mask"]).all()
    assert list(encoded) == ["tokens", "attention_mask"]
    assert (ours(batch).attention_mask[:, 0] == 1).all()  # the default side stays right


def test_a_tokenizer_without_a_padding_token_and_no_fallback_is_a_named_error(bpe_folder):
    with pytest.raises(LinnetError) as caught:
        Tokenizer.from_json(bpe_folder / "tokenizer.json")
    assert caught.value.code == "E1201" and "eos_token_id" in caught.value.render()


def test_bad_padding_sides_and_fields_are_named_errors(ours):
    for call in (lambda: ours("x", padding_side="middle"),
                 lambda: Tokenizer(ours.backend, fallback_pad_id=EOS, fields=("tokens", "token_type"))):
        with pytest.raises(LinnetError) as caught:
            call()
        assert caught.value.code == "E1204"


# -------------------------------------------------------------------------- the zoo entry


def entry_tables(eos: int) -> str:
    return f'[tokenizer]\nfiles = ["tokenizer.json"]\npadding_side = "left"\n\n[generate]\neos_token_id = {eos}\n'


@pytest.fixture(scope="module")
def tiny_text(tmp_path_factory, bpe_folder):
    """A tiny GPT-2 whose vocabulary is the trained tokenizer's, with that tokenizer.json beside
    its checkpoint (where `model.tokenizer` looks first)."""
    base = tmp_path_factory.mktemp("tiny-gpt2-text")
    config = dict(vocab_size=BPE_VOCAB, bos_token_id=EOS, eos_token_id=EOS)
    reference = save_gpt2(base / "hf", seed=3, **config)
    (base / "hf" / "tokenizer.json").write_bytes((bpe_folder / "tokenizer.json").read_bytes())
    entry = write_tiny_entry(base / "entry", config, extra=entry_tables(EOS))
    return entry, base / "hf" / "model.safetensors", reference


def test_the_gpt2_entry_declares_its_end_of_text_and_left_padding():
    manifest = load_manifest("gpt2")
    assert manifest.generation.eos_token_id == 50256  # <|endoftext|>, the last of GPT-2's 50257 ids
    assert manifest.tokenizer.padding_side == "left"


def test_model_tokenizer_yields_only_gpt2s_inputs_and_the_model_runs_on_it(tiny_text, texts):
    entry, weights, reference = tiny_text
    model = nest.load(entry, weights=weights)
    batch = [t[:120] for t in texts[5:9]]
    encoded = model.tokenizer(batch)
    assert list(encoded) == ["tokens", "attention_mask"]
    assert model.tokenizer.pad_id == EOS and (encoded.attention_mask[:, -1] == 1).all()  # left-padded
    ours = np.asarray(model(**encoded))
    positions = np.maximum(np.cumsum(encoded.attention_mask, 1) - 1, 0)
    with torch.no_grad():
        theirs = reference(torch.tensor(encoded.tokens, dtype=torch.long),
                           attention_mask=torch.tensor(encoded.attention_mask),
                           position_ids=torch.tensor(positions)).logits.numpy()
    real = encoded.attention_mask.astype(bool)
    assert np.abs(ours - theirs)[real].max() < BOUND


def test_generate_stops_at_the_declared_end_of_text_by_default(tiny_text, tmp_path):
    entry, weights, reference = tiny_text
    model = nest.load(entry, weights=weights)
    encoded = model.tokenizer(["The quick brown fox", "Return a new"])
    # eos_token_id=-1: an id no token has, so this run never stops early.
    free = model.generate(encoded.tokens, 16, attention_mask=encoded.attention_mask, eos_token_id=-1)
    width = encoded.tokens.shape[1]
    # Declare as end of text a token row 0 produces mid-way, in an entry of its own.
    stop = int(free[0, width + 3])
    row0_end = width + 1 + list(free[0, width:]).index(stop)
    declared = nest.load(write_tiny_entry(tmp_path / "e", dict(vocab_size=BPE_VOCAB, bos_token_id=EOS,
                                                               eos_token_id=stop), extra=entry_tables(stop)),
                         weights=weights)
    assert declared.manifest.generation.eos_token_id == stop
    ours = declared.generate(encoded.tokens, 16, attention_mask=encoded.attention_mask)
    with torch.no_grad():
        theirs = reference.generate(torch.tensor(encoded.tokens, dtype=torch.long),
                                    attention_mask=torch.tensor(encoded.attention_mask), max_new_tokens=16,
                                    do_sample=False, eos_token_id=stop, pad_token_id=stop).numpy()
    assert ours.shape == theirs.shape and (ours == theirs).all()
    assert ours[0, row0_end - 1] == stop and (ours[0, row0_end:] == stop).all()
    # Without the declaration, the same model runs on past that token.
    assert free.shape[1] == width + 16
    assert ours.shape[1] < free.shape[1] or (ours[0] != free[0]).any()


def test_a_bad_end_of_text_or_padding_side_in_nest_toml_is_a_named_error(tmp_path):
    cases = [("[generate]\neos_token_id = 600\n", "E0912", "eos_token_id must be a token id (0 <= id < Vocab = 600)"),
             ("[generate]\neos_token_id = -1\n", "E0912", "found -1"),
             ("[generate]\neos_token_id = \"<|endoftext|>\"\n", "E0905", "[generate].eos_token_id must be an integer"),
             ("[generate]\neos = 1\n", "E0906", "unknown field `eos`"),
             ('[tokenizer]\nfiles = ["tokenizer.json"]\npadding_side = "top"\n', "E0912", "padding_side must be")]
    for n, (tables, code, says) in enumerate(cases):
        entry = write_tiny_entry(tmp_path / str(n), dict(vocab_size=BPE_VOCAB), extra=tables)
        with pytest.raises(LinnetError) as caught:
            load_manifest(entry)
        rendered = caught.value.render()
        assert f"error[{code}]" in rendered and says in rendered, rendered


# ------------------------------------------------------------------------------ linnet run


def test_linnet_run_prints_transformers_greedy_continuation(tiny_text, bpe_folder, capsys):
    entry, weights, reference = tiny_text
    prompts = ["Return the number of", "A list of"]
    code = main(["run", str(entry), *prompts, "--weights", str(weights), "--max-new-tokens", "12"])
    out = capsys.readouterr().out
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "tiny-gpt2 (torch), generate:"
    printed = _continuations(lines[1:])
    tokenizer = references(bpe_folder)["tokenizer.json"]
    tokenizer.pad_token, tokenizer.padding_side = END_OF_TEXT, "left"
    batch = tokenizer(prompts, padding=True, return_tensors="pt")
    with torch.no_grad():
        ids = reference.generate(**batch, max_new_tokens=12, do_sample=False, pad_token_id=EOS, eos_token_id=EOS)
    expected = tokenizer.batch_decode(ids[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    assert list(printed) == prompts
    assert [printed[p] for p in prompts] == expected
    assert all(len(c) > 0 for c in expected)


def test_no_new_tokens_prints_empty_continuations_and_the_decoder_entries_agree(tiny_text, capsys):
    from linnet.cli import run as run_command
    from linnet.nest import generate

    assert run_command.DECODER_ENTRIES == generate.DECODER_ENTRIES
    entry, weights, _ = tiny_text
    assert main(["run", str(entry), "Return", "A list of", "--weights", str(weights), "--max-new-tokens", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert _continuations(lines[1:]) == {"Return": "", "A list of": ""}


def _continuations(lines: list[str]) -> dict[str, str]:
    """`'prompt' ->` followed by the continuation's lines, each indented by two spaces."""
    import ast

    result, current = {}, None
    for line in lines:
        if line.endswith(" ->") and not line.startswith("  "):
            current = ast.literal_eval(line[:-3])
            result[current] = []
        else:
            assert line.startswith("  "), line
            result[current].append(line[2:])
    return {prompt: "\n".join(parts) for prompt, parts in result.items()}
