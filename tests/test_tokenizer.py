"""`model.tokenizer`: ids, token types and masks equal transformers' BERT tokenizers.

Two references, both built from bert-base-uncased's vocab.txt (the synthetic snapshot
carries the real file) in uncased and cased mode:

* `BertTokenizerLegacy`, transformers' pure-Python WordPiece: an implementation that shares
  no code with the `tokenizers` library ours is built on;
* `BertTokenizer` (transformers' fast one, on `tokenizers`), what users get from
  `AutoTokenizer`.

They are compared on a few hundred generated sentences and on hand-picked hard cases
(accents, CJK, emoji, punctuation runs, URLs, numbers, special tokens written in the
text, odd whitespace, control characters, words over 100 characters), as single texts,
pairs, padded batches and truncated rows.  The real all-MiniLM-L6-v2 then runs on our
encoding and must give sentence-transformers' embeddings.
"""
from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest

from linnet import LinnetError, nest
from linnet.nest.manifest import load_manifest
from linnet.nest.tokenizer import Encoded, Tokenizer, load_tokenizer
from linnet.paths import zoo_dir

# --------------------------------------------------------------------------- the texts

HARD_CASES = [
    "", " ", "Hello world!", "The quick brown fox jumps over the lazy dog.",
    # accents, cased and not
    "café naïve Ångström résumé jalapeño Zürich São Paulo façade Dvořák Łódź crème brûlée",
    "CAFÉ NAÏVE ÅNGSTRÖM", "x\u0301y e\u0301 combining marks",
    # CJK and other scripts
    "中文 日本語 東京タワー 한국어 ひらがな カタカナ", "我爱北京天安门。", "English中文mixed日本語text",
    "Привет мир", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "ภาษาไทย", "Ελληνικά",
    # emoji, symbols
    "emoji 😀👍🏽 🇫🇷 ❤️ 👨‍👩‍👧 ok", "ﬁ ligature ① ² ½ ™ © ℃", "Ｆｕｌｌ ｗｉｄｔｈ ＡＢＣ １２３",
    # punctuation runs
    "wait!!! ... ?!? ---- ((( ))) »quoted« “curly” — dash", "!!!???...,,,;;;:::", "a.b,c;d:e!f?g",
    # URLs, e-mail, code
    "see https://example.com/a/b?c=d&e=f#frag or www.test.co.uk", "mail me: first.last+tag@mail.example.org",
    "C++ std::vector<int> x = {1, 2}; // comment", "<b>html</b> &amp; snake_case CamelCase #hashtag @user",
    # numbers
    "3.14159 1,000,000 2e-5 -17 42nd 10% $5.99 12:30 1/2 0x1F", "In 1969, 600,000,000 people watched.",
    # special tokens written in the text
    "The capital of France is [MASK].", "[CLS] x [SEP] y [PAD] [UNK]", "lowercase [mask] and [cls] are plain text",
    "[MASK][MASK] glued[MASK]words", "[ MASK ] with spaces",
    # whitespace oddities
    "tab\there\nnewline\r\ncarriage", "nbsp\u00a0between\u00a0words", "zero\u200bwidth\u200dspace\u200cjoiner",
    "ideographic\u3000space", "line\u2028separator\u2029paragraph", "\ufeffbyte order mark",
    "   leading and trailing   ", "many     spaces      inside",
    # control characters
    "ctrl\x00nul\x01soh\x07bel\x1besc\x7fdel", "vertical\x0btab\x0cformfeed", "\x85next line",
    # long words: WordPiece leaves a word over 100 characters as [UNK]
    "a" * 99 + " end", "b" * 100 + " end", "c" * 101 + " end", "pneumono" * 20,
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "don't won't it's y'all rock'n'roll", "e.g. U.S.A. Ph.D. i.e.",
]

#: Texts whose lowercasing differs between the two references, and why: Python's
#: `str.lower` (slow) turns a word-final capital sigma into `ς`, `tokenizers` (fast and
#: ours) lowercases character by character and gives `σ`.  Compared to the fast one only.
SIGMA_CASES = ["ΣΊΣΥΦΟΣ ΟΔΟΣ", "İstanbul ΣΊΣΥΦΟΣ ß"]

_WORDS = {
    "plain": "the a of model language token sentence running quickly played encoder attention "
             "transformer layer weights vocabulary unbelievable photosynthesis Hello WORLD Data".split(),
    "accents": "café naïve résumé jalapeño Zürich São façade Ångström Dvořák Łódź crème brûlée "
               "Españа über ÉCOLE".split(),
    "cjk": "中文 日本語 東京 한국어 ひらがな カタカナ 北京 漢字 学生".split(),
    "script": "Привет мир مرحبا שלום नमस्ते ภาษา Ελληνικά".split(),
    "emoji": "😀 👍🏽 🇫🇷 ❤️ 👨‍👩‍👧 🚀 ☃".split(),
    "punct": ["!!!", "?!", "...", "---", "(((", ")))", "»", "«", "“", "”", "—", ",", ".", ";", ":", "'",
              "\"", "&", "*", "#", "@", "/", "\\", "|", "~", "^", "`", "{", "}", "<", ">"],
    "number": "3.14 1,000,000 42nd -17 2e-5 10% $5.99 12:30 1/2 0x1F 2024 007".split(),
    "url": "https://example.com/path?q=1&r=2 user@mail.org www.test.co.uk ftp://files.net/x.tar.gz".split(),
    "special": "[MASK] [CLS] [SEP] [UNK] [PAD] [mask] [Mask]".split(),
    "odd": ["don't", "e.g.", "U.S.A.", "C++", "#hashtag", "@user", "<b>", "snake_case", "CamelCase",
            "x\u0301", "ﬁ", "①", "Ｆｕｌｌ", "\ufeffbom", "ctrl\x00x", "bel\x07", "del\x7f"],
}
_SEPARATORS = [" "] * 12 + ["", "  ", "\t", "\n", "\u00a0", "\u200b", "\u3000", " \x01 ", "\r\n"]


def generated_sentences(count: int = 300, seed: int = 0) -> list[str]:
    """Random sentences over every kind of word above, a long word now and then."""
    rng = np.random.default_rng(seed)
    kinds = list(_WORDS)
    sentences = []
    for _ in range(count):
        words = []
        for _ in range(int(rng.integers(1, 26))):
            if rng.random() < 0.02:
                words.append("".join(rng.choice(list("abcdefghij"), size=int(rng.integers(90, 130)))))
                continue
            pool = _WORDS[kinds[int(rng.integers(len(kinds)))] if rng.random() < 0.5 else "plain"]
            words.append(pool[int(rng.integers(len(pool)))])
        text = words[0]
        for word in words[1:]:
            text += _SEPARATORS[int(rng.integers(len(_SEPARATORS)))] + word
        sentences.append(text)
    return sentences


CORPUS = HARD_CASES + generated_sentences()
PAIRS = list(zip(CORPUS[::2], CORPUS[1::2]))


# --------------------------------------------------------------------------- tokenizers


@pytest.fixture(scope="module")
def bert_vocab(hf_cache) -> Path:
    """bert-base-uncased's real vocab.txt in the test cache, at the zoo's pinned revision."""
    from fixtures.checkpoints import BERT_BASE_REPO, BERT_BASE_REVISION, _add_bert_tokenizer, _Snapshot

    snapshot = _Snapshot(hf_cache, BERT_BASE_REPO, BERT_BASE_REVISION)
    if not (snapshot.dir / "vocab.txt").is_file():  # the synthetic checkpoint's fixture writes it too
        _add_bert_tokenizer(snapshot)
    return snapshot.dir / "vocab.txt"


@dataclasses.dataclass
class References:
    slow: object
    fast: object


@pytest.fixture(scope="module", params=[True, False], ids=["uncased", "cased"])
def case(request, bert_vocab, tmp_path_factory):
    """(lowercase, ours, references), all built from the same vocab.txt."""
    from transformers import BertTokenizer
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

    lowercase = request.param
    folder = tmp_path_factory.mktemp("vocab")
    shutil.copyfile(bert_vocab, folder / "vocab.txt")
    fast = BertTokenizer.from_pretrained(str(folder), do_lower_case=lowercase)
    slow = BertTokenizerLegacy(str(folder / "vocab.txt"), do_lower_case=lowercase)
    ours = Tokenizer.from_vocab(bert_vocab, lowercase=lowercase, max_length=512)
    return lowercase, ours, References(slow, fast)


def _reference(tokenizer, *args, **kwargs) -> dict[str, list]:
    out = tokenizer(*args, return_token_type_ids=True, return_attention_mask=True, **kwargs)
    return {"tokens": out["input_ids"], "token_types": out["token_type_ids"],
            "attention_mask": out["attention_mask"]}


def _row(encoded: Encoded, row: int = 0) -> dict[str, list]:
    return {key: encoded[key][row].tolist() for key in encoded}


def _compare_singles(ours: Tokenizer, refs: References, texts, make_input=lambda t: (t,)):
    """Every text alone: ours must equal the fast reference, and the slow one unless the
    text is a known case where the two references themselves differ.  Returns the count
    compared with both, and the texts where slow and fast differed."""
    differing = []
    for text in texts:
        args = make_input(text)
        got = _row(ours(*args))
        fast, slow = _reference(refs.fast, *args), _reference(refs.slow, *args)
        assert got == fast, f"{args!r}: ours {got} fast {fast}"
        if slow != fast:
            differing.append(args)
        else:
            assert got == slow
    return len(texts) - len(differing), differing


# --------------------------------------------------------------------------- parity


def test_the_corpus_is_varied():
    assert len(CORPUS) >= 300 and len(set(CORPUS)) >= 300
    joined = "".join(CORPUS)
    for needle in ("é", "中", "😀", "!!!", "https://", "1,000,000", "[MASK]", "\t", "\u00a0", "\u200b",
                   "\x00", "c" * 101):
        assert needle in joined, needle


def test_single_texts_equal_both_references(case):
    lowercase, ours, refs = case
    both, differing = _compare_singles(ours, refs, CORPUS + SIGMA_CASES)
    print(f"{'uncased' if lowercase else 'cased'}: {both} texts equal slow and fast; "
          f"slow differs from fast on {differing}")
    # The references disagree only where lowercasing meets a capital sigma.
    assert all("Σ" in text and lowercase for (text,) in differing)
    assert len(differing) == (len(SIGMA_CASES) if lowercase else 0)


def test_pairs_equal_both_references(case):
    lowercase, ours, refs = case
    both, differing = _compare_singles(ours, refs, PAIRS, make_input=lambda pair: pair)
    print(f"pairs: {both} equal slow and fast, {len(differing)} differ between them")
    assert both >= len(PAIRS) - 2 and all("Σ" in a + b for a, b in differing)


def test_pairs_given_four_ways_encode_alike(case):
    _, ours, _ = case
    firsts, seconds = [a for a, _ in PAIRS[:20]], [b for _, b in PAIRS[:20]]
    expected = ours(list(zip(firsts, seconds)))
    assert ours(firsts, seconds) == expected
    assert ours((firsts, seconds)) == expected
    assert ours([list(pair) for pair in zip(firsts, seconds)]) == expected
    assert ours(firsts[3], seconds[3]) == ours((firsts[3], seconds[3])) == ours([(firsts[3], seconds[3])])


@pytest.mark.parametrize("pairs", [False, True], ids=["single", "pair"])
def test_padded_batch_equals_the_references(case, pairs):
    lowercase, ours, refs = case
    batch = PAIRS[:60] if pairs else CORPUS[:60]
    batch = [p for p in batch if "Σ" not in str(p)]
    got = ours(batch)
    for ref in (refs.fast, refs.slow):
        expected = _reference(ref, batch, padding=True)
        for key in got:
            assert got[key].dtype == np.int32 and got[key].shape == (len(batch), got.tokens.shape[1])
            assert got[key].tolist() == expected[key], key
    assert got.attention_mask.min() == 0 and got.tokens[got.attention_mask == 0].tolist() == \
        [refs.fast.pad_token_id] * int((got.attention_mask == 0).sum())


@pytest.mark.parametrize("max_length", [2, 3, 5, 8, 13, 32, 100])
def test_truncated_singles_equal_the_references(case, max_length):
    _, ours, refs = case
    texts = [t for t in CORPUS[:120] if "Σ" not in t]
    got = ours(texts, max_length=max_length)
    assert got.tokens.shape[1] <= max_length
    for ref in (refs.fast, refs.slow):
        expected = _reference(ref, texts, padding=True, truncation=True, max_length=max_length)
        assert {k: got[k].tolist() for k in got} == expected


@pytest.mark.parametrize("max_length", [3, 4, 7, 12, 25, 64])
def test_truncated_pairs_equal_the_references(case, max_length):
    """`longest_first`: tokens come off the longer text of a pair first.  Ours equals the
    fast reference on every row, and the slow one except where the references split an
    odd budget differently: when both texts must be cut and the second is at least as long
    as the first, `tokenizers` gives the odd token to the second text (the longer, or the
    second on a tie), transformers' Python code to the first."""
    _, ours, refs = case
    pairs = [p for p in PAIRS[:100] if "Σ" not in str(p)]
    got = ours(pairs, max_length=max_length)
    assert got.tokens.shape[1] <= max_length
    fast = _reference(refs.fast, pairs, padding=True, truncation="longest_first", max_length=max_length)
    assert {k: got[k].tolist() for k in got} == fast
    budget, split_differently = max_length - 3, 0
    for row, (first, second) in enumerate(pairs):
        mine = {k: v[:int(got.lengths[row])] for k, v in _row(got, row).items()}
        slow = _reference(refs.slow, first, second, truncation="longest_first", max_length=max_length)
        if mine == slow:
            continue
        n_first, n_second = len(refs.slow.tokenize(first)), len(refs.slow.tokenize(second))
        assert budget % 2 == 1 and budget // 2 < n_first <= n_second, (first, second)
        assert mine["token_types"].count(0) - 2 == budget // 2
        assert slow["token_types"].count(0) - 2 == budget // 2 + 1
        split_differently += 1
    print(f"max_length {max_length}: {split_differently} of {len(pairs)} rows split an odd budget differently")


def test_padding_to_max_length(case):
    _, ours, refs = case
    got = ours(CORPUS[2:6], padding="max_length", max_length=48)
    expected = _reference(refs.fast, CORPUS[2:6], padding="max_length", truncation=True, max_length=48)
    assert got.tokens.shape == (4, 48) and {k: got[k].tolist() for k in got} == expected


def test_decode_equals_the_fast_reference(case):
    lowercase, ours, refs = case
    for text in CORPUS[::5]:
        ids = ours(text).tokens[0]
        assert ours.decode(ids) == refs.fast.decode(ids.tolist(), skip_special_tokens=True)
        assert ours.decode(ids, skip_special_tokens=False) == refs.fast.decode(ids.tolist())
    batch = ours(CORPUS[:4])
    assert ours.decode(batch.tokens) == refs.fast.batch_decode(batch.tokens.tolist(), skip_special_tokens=True)


def test_vocabulary_and_special_ids_equal_the_references(case):
    _, ours, refs = case
    assert ours.vocab_size == len(refs.fast) == len(refs.slow) == 30522
    for name in ("cls", "sep", "pad", "mask", "unk"):
        assert getattr(ours, f"{name}_id") == getattr(refs.slow, f"{name}_token_id") \
            == getattr(refs.fast, f"{name}_token_id")
    assert ours.special_ids == {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}
    text = "Ångström unaffable [MASK] 中文"
    assert ours.tokenize(text) == refs.fast.tokenize(text)
    assert ours.id_to_token(ours.token_to_id("##able")) == "##able"


def test_tokenizer_json_equals_the_vocab_pipeline(minilm_checkpoint, bert_vocab):
    """MiniLM's tokenizer.json describes the same uncased pipeline: same ids, and its
    stored truncation (128) and padding (to 128) are not applied."""
    from_json = Tokenizer.from_file(minilm_checkpoint / "tokenizer.json", max_length=512)
    from_vocab = Tokenizer.from_vocab(bert_vocab, lowercase=True, max_length=512)
    for texts in (CORPUS[:150], PAIRS[:50]):
        assert from_json(texts) == from_vocab(texts)
    long = from_json(" ".join(["word"] * 300))
    assert long.tokens.shape == (1, 302)
    assert from_json("hi").tokens.tolist() == [[101, 7632, 102]]


# --------------------------------------------------------------------------- the API


@pytest.fixture(scope="module")
def uncased(bert_vocab) -> Tokenizer:
    return Tokenizer.from_vocab(bert_vocab, lowercase=True, max_length=512)


def raises(code: str, call, *args, **kwargs) -> LinnetError:
    with pytest.raises(LinnetError) as caught:
        call(*args, **kwargs)
    assert caught.value.code == code, caught.value.render()
    return caught.value


def test_a_single_string_is_a_batch_of_one(uncased):
    encoded = uncased("A man is playing a guitar.")
    assert set(encoded) == {"tokens", "token_types", "attention_mask"}
    for key in encoded:
        assert encoded[key].shape == (1, 9) and encoded[key].dtype == np.int32
    assert encoded.lengths.tolist() == [9]
    assert encoded == uncased.encode(["A man is playing a guitar."])


def test_default_truncation_is_max_positions(bert_vocab):
    from transformers import BertTokenizer

    tokenizer = load_tokenizer("bert-base-uncased")
    assert tokenizer.max_length == load_manifest("bert-base-uncased").generics["MaxPositions"] == 512
    text = " ".join(CORPUS[10:120])
    reference = BertTokenizer.from_pretrained(str(bert_vocab.parent))
    expected = reference(text)["input_ids"]
    assert len(expected) > 512, "the text should be longer than the model's limit"
    got = tokenizer(text).tokens[0].tolist()
    assert len(got) == 512 and got == reference(text, truncation=True, max_length=512)["input_ids"]


def test_too_long_without_truncation_is_an_error(uncased):
    text = " ".join(["word"] * 600)
    err = raises("E1203", uncased, text, truncation=False)
    assert "602 tokens" in str(err) and "MaxPositions = 512" in str(err)
    err = raises("E1203", uncased, ["short", "a b c d e f"], truncation=False, max_length=5)
    assert "row 1 is 8 tokens long" in str(err) and "max_length = 5" in str(err)
    assert uncased(["short", "a b c"], truncation=False, max_length=5).tokens.shape == (2, 5)


@pytest.mark.parametrize("args, kwargs, needle", [
    ((42,), {}, "must be a string"),
    (([],), {}, "empty list"),
    ((["ok", 3],), {}, "holding int, str"),
    ((["a", "b"], ["c"]), {}, "2 items but pair has 1"),
    ((["a"], [None]), {}, "pair[0] must be a string"),
    (("text",), {"max_length": 1}, "at least 2"),
    ((("a", "b"),), {"max_length": 2}, "at least 3"),
    (("text",), {"max_length": 5.0}, "whole number"),
    (("text",), {"padding": "longest_first"}, "padding must be"),
    ((["a", "a b c"],), {"padding": False}, "different lengths (3, 5)"),
    ((["fine", "lone \ud800 surrogate"],), {}, "row 1 is not valid Unicode text"),
])
def test_bad_arguments_are_clear_errors(uncased, args, kwargs, needle):
    err = raises("E1204", uncased, *args, **kwargs)
    assert needle in str(err), str(err)


def test_decode_refuses_non_ids(uncased):
    assert "integer ids" in str(raises("E1204", uncased.decode, [0.5, 1.5]))
    assert "3-D" in str(raises("E1204", uncased.decode, np.zeros((1, 1, 1), int)))


def test_a_vocabulary_without_bert_specials_is_refused(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\nhello\n")
    err = raises("E1201", Tokenizer.from_file, vocab, lowercase=True)
    assert "[CLS], [SEP], [MASK]" in str(err)
    (tmp_path / "tokenizer.json").write_text("{not json")
    raises("E1201", Tokenizer.from_file, tmp_path / "tokenizer.json")
    raises("E1204", Tokenizer.from_file, vocab)  # lowercase not given
    raises("E1201", Tokenizer.from_file, tmp_path / "absent.txt", lowercase=True)


# --------------------------------------------------------------------------- zoo entries


def test_both_zoo_entries_name_the_uncased_vocabulary():
    for name in ("bert-base-uncased", "all-minilm-l6-v2"):
        spec = load_manifest(name).tokenizer
        assert spec.files == ("vocab.txt",) and spec.lowercase is True and spec.kind == "vocab"


def test_an_entry_without_a_tokenizer_says_so():
    manifest = dataclasses.replace(load_manifest("bert-base-uncased"), tokenizer=None)
    err = raises("E1202", load_tokenizer, manifest)
    assert "declares no [tokenizer]" in str(err) and "lowercase = true" in err.render()


def test_a_file_missing_offline_is_e1001(tmp_path, hf_cache):
    manifest = load_manifest("bert-base-uncased")
    spec = dataclasses.replace(manifest.tokenizer, files=("absent/vocab.txt",))
    err = raises("E1001", load_tokenizer, dataclasses.replace(manifest, tokenizer=spec))
    text = err.render()
    assert "tokenizer file google-bert/bert-base-uncased/absent/vocab.txt at revision 86b5e09" in text
    assert "HF_HUB_OFFLINE=1" in text and "Tokenizer.from_file" in text


def _entry_with_tokenizer(tmp_path: Path, table: str, *, weights: bool = True) -> Path:
    """A copy of the MiniLM entry whose [tokenizer] table is `table`."""
    entry = tmp_path / "all-minilm-l6-v2"
    entry.mkdir()
    text = (zoo_dir() / "all-minilm-l6-v2" / "nest.toml").read_text()
    text = text[:text.index("[tokenizer]")] + table
    if not weights:
        text = text[:text.index("[weights]")] + text[text.index("[tokenizer]"):]
    (entry / "nest.toml").write_text(text)
    shutil.copyfile(zoo_dir() / "all-minilm-l6-v2" / "linnet.toml", entry / "linnet.toml")
    return entry


def test_tokenizer_json_form_is_accepted(tmp_path):
    entry = _entry_with_tokenizer(tmp_path, '[tokenizer]\nfiles = ["tokenizer.json"]\n')
    spec = load_manifest(entry).tokenizer
    assert spec.files == ("tokenizer.json",) and spec.lowercase is None and spec.kind == "json"


@pytest.mark.parametrize("table, code, needle", [
    ('[tokenizer]\nfiles = ["vocab.txt"]\n', "E0904", "missing required field `lowercase`"),
    ('[tokenizer]\nlowercase = true\n', "E0904", "[tokenizer] is missing required field `files`"),
    ('[tokenizer]\nfiles = ["tokenizer.json"]\nlowercase = false\n', "E0912", "lowercase is not given with tokenizer.json"),
    ('[tokenizer]\nfiles = ["vocab.txt", "tokenizer.json"]\nlowercase = true\n', "E0912", "must be [\"vocab.txt\"]"),
    ('[tokenizer]\nfiles = ["merges.txt"]\n', "E0912", "found ['merges.txt']"),
    ('[tokenizer]\nfiles = ["../vocab.txt"]\nlowercase = true\n', "E0907", "inside the repository"),
    ('[tokenizer]\nfiles = ["vocab.txt"]\nlowercase = "yes"\n', "E0905", "[tokenizer].lowercase must be a boolean"),
    ('[tokenizer]\nfiles = "vocab.txt"\nlowercase = true\n', "E0905", "[tokenizer].files must be an array"),
    ('[tokenizer]\nfiles = ["vocab.txt"]\nlowercase = true\nlower = true\n', "E0906", "unknown field `lower`"),
    ('[tokenizers]\nfiles = ["vocab.txt"]\n', "E0906", "did you mean [tokenizer]"),
])
def test_tokenizer_table_mistakes(tmp_path, table, code, needle):
    entry = _entry_with_tokenizer(tmp_path, table)
    err = raises(code, load_manifest, entry)
    assert len(err.diagnostics) == 1 and needle in err.diagnostics[0].message, err.render()
    assert err.diagnostics[0].span is not None  # points at the line


def test_tokenizer_needs_weights(tmp_path):
    entry = _entry_with_tokenizer(tmp_path, '[tokenizer]\nfiles = ["vocab.txt"]\nlowercase = true\n', weights=False)
    err = raises("E0904", load_manifest, entry)
    assert "no [weights] table" in str(err)


# --------------------------------------------------------------------------- the real model


SENTENCES = ["A man is playing a guitar.", "Stock markets fell sharply on Monday after the report.", "Hi!",
             "Ångström's café served 中文 menus 😀 at https://example.com — [MASK] included."]


@pytest.fixture(scope="module")
def minilm(minilm_checkpoint):
    return nest.load("all-minilm-l6-v2", backend="torch")


def _np(x):
    return x.detach().numpy() if hasattr(x, "detach") else np.asarray(x)


def test_minilm_embeds_like_sentence_transformers(minilm, minilm_checkpoint):
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(minilm_checkpoint), device="cpu")
    expected = st.encode(SENTENCES, convert_to_numpy=True, batch_size=len(SENTENCES))
    encoded = minilm.tokenizer(SENTENCES)
    reference = st.tokenizer(SENTENCES, padding=True, return_tensors="np")
    assert encoded.tokens.tolist() == reference["input_ids"].tolist()
    assert encoded.attention_mask.min() == 0, "the batch should hold padding"
    got = _np(minilm.embed(**encoded))
    diff = float(np.abs(got - expected).max())
    print(f"minilm tokenizer + embed vs sentence-transformers encode: max|diff| {diff:.3g}")
    assert diff <= 1e-5
    # Positional arguments in the entry's order bind the same way.
    hidden = _np(minilm(**encoded))
    assert np.array_equal(hidden, _np(minilm(encoded.tokens, encoded.token_types, encoded.attention_mask)))


def test_model_tokenizer_is_built_on_first_use(minilm_checkpoint, tmp_path):
    """Loading never reads the tokenizer files: an entry naming a file the cache lacks loads,
    and only `model.tokenizer` reports it."""
    entry = _entry_with_tokenizer(tmp_path, '[tokenizer]\nfiles = ["absent/vocab.txt"]\nlowercase = true\n')
    model = nest.load(entry, backend="torch")
    assert model.__dict__["_tokenizer"] is None
    raises("E1001", getattr, model, "tokenizer")
    model.manifest = load_manifest("all-minilm-l6-v2")
    # all-minilm-l6-v2's [tokenizer].max_length: sentence-transformers' max_seq_length, 256.
    assert model.tokenizer is model.tokenizer and model.tokenizer.max_length == 256


def test_a_model_loaded_from_a_local_folder_reads_its_tokenizer_there(tmp_path, monkeypatch):
    """A model loaded with `weights=<folder>` takes its tokenizer from that folder, never
    from the hub (which an offline machine with only the folder does not have)."""
    import shutil

    from linnet.nest import weights

    from fixtures.checkpoints import _minilm_package_dir
    from transformers import BertTokenizer

    folder = tmp_path / "minilm"
    shutil.copytree(_minilm_package_dir(), folder)
    model = nest.load("all-minilm-l6-v2", backend="torch", weights=folder)

    def no_download(*args, **kwargs):
        raise AssertionError(f"the tokenizer was fetched from the hub: {args}")

    monkeypatch.setattr(weights, "fetch_file", no_download)
    encoded = model.tokenizer(["Where is the cat?", "Out of the window."])
    reference = BertTokenizer.from_pretrained(str(folder), do_lower_case=True)(
        ["Where is the cat?", "Out of the window."], padding=True)
    assert encoded.tokens.tolist() == reference["input_ids"]
    assert encoded.attention_mask.tolist() == reference["attention_mask"]
