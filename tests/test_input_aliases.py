"""transformers' input names (`input_ids`, `token_type_ids`) as aliases of `tokens` and
`token_types`, on every entry of MiniLM, on torch and ONNX Runtime."""
from __future__ import annotations

import numpy as np
import pytest

from linnet import LinnetError, codes, nest


def _np(x):
    return x.detach().numpy() if hasattr(x, "detach") else np.asarray(x)


def _batch():
    rng = np.random.default_rng(7)
    tokens = rng.integers(1000, 30000, size=(3, 9))
    types = rng.integers(0, 2, size=(3, 9))
    mask = np.ones_like(tokens)
    mask[1, 6:] = 0
    mask[2, 2:] = 0
    return tokens, types, mask


@pytest.fixture(scope="module", params=["torch", "onnx"])
def minilm(request, minilm_checkpoint):
    return nest.load("all-minilm-l6-v2", backend=request.param)


def test_aliases_give_the_same_outputs_on_every_entry(minilm):
    tokens, types, mask = _batch()
    # The entries for transformers' other inputs take one more; forward_embeds takes vectors
    # instead of ids, so only its token_type_ids alias applies.
    more = {"forward_positioned": {"position_ids": np.maximum(np.cumsum(mask, 1) - 1, 0)},
            "forward_head_masked": {"head_mask": np.ones((6, 12), np.float32)}}
    for entry in minilm.entries:
        run = getattr(minilm, entry)
        if entry == "forward_embeds":
            vectors = np.random.default_rng(0).standard_normal((*tokens.shape, 384)).astype(np.float32)
            assert np.array_equal(_np(run(vectors, token_type_ids=types, attention_mask=mask)),
                                  _np(run(vectors, token_types=types, attention_mask=mask)))
            continue
        extra = more.get(entry, {})
        by_name = _np(run(tokens=tokens, token_types=types, attention_mask=mask, **extra))
        by_alias = _np(run(input_ids=tokens, token_type_ids=types, attention_mask=mask, **extra))
        mixed = _np(run(input_ids=tokens, token_types=types, attention_mask=mask, **extra))
        assert by_alias.shape == by_name.shape and np.array_equal(by_alias, by_name), entry
        assert np.array_equal(mixed, by_name), entry
    # the root entry through __call__, and the token types left to their zeros default
    assert np.array_equal(_np(minilm(input_ids=tokens, attention_mask=mask)),
                          _np(minilm(tokens, attention_mask=mask)))


def test_alias_and_name_together_is_refused(minilm):
    tokens, types, mask = _batch()
    with pytest.raises(LinnetError) as info:
        minilm(tokens=tokens, input_ids=tokens, attention_mask=mask)
    assert info.value.code == codes.ALIAS_AND_NAME
    assert "`input_ids` and `tokens` both given" in info.value.render()
    with pytest.raises(LinnetError) as info:
        minilm.pool(tokens, token_types=types, token_type_ids=types)
    assert info.value.code == codes.ALIAS_AND_NAME
    # positional `tokens` plus the alias is the "given twice" error
    with pytest.raises(LinnetError) as info:
        minilm(tokens, input_ids=tokens)
    assert info.value.code == codes.BAD_INPUT and "given twice" in info.value.render()


def test_unknown_keywords_are_still_refused(minilm):
    tokens, _, _ = _batch()
    with pytest.raises(LinnetError) as info:
        minilm(tokens, position_idz=tokens)
    assert info.value.code == codes.BAD_INPUT and "no input `position_idz`" in info.value.render()


def test_the_tokenizers_output_still_runs(minilm):
    features = minilm.tokenizer(["A man is playing a guitar.", "Hi!"])
    out = _np(minilm(**features))
    renamed = {INPUT: features[name] for INPUT, name in
               (("input_ids", "tokens"), ("token_type_ids", "token_types"), ("attention_mask", "attention_mask"))
               if name in features}
    assert np.array_equal(_np(minilm(**renamed)), out)
