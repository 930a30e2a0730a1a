"""`model.generate`: text continuation for a decoder entry with a typed key/value cache.

A decoder's Linnet source exposes three entries (GPT-2's, `nest/gpt2/src/lib.linnet`):
`prefill(tokens, attention_mask)` returns the cache after the prompt, `next_logits(cache)`
the scores for the token after its last position, and `decode(token, cache, attention_mask)`
the cache one position longer.  The loop here is the same on every backend: it runs those
entries through the model's own validated `run`, so each step is checked against the
entry's signature (a cache of the wrong shape, an id outside the vocabulary) before compute.

Choosing a token follows transformers' `generate`: greedy is the first maximum of the logits;
sampling divides by `temperature`, keeps the `top_k` largest, then the smallest set whose
probability reaches `top_p`, and draws from a numpy Generator seeded with `seed`, so a seed
gives the same tokens on every run.  Prompts are batched left-padded (`attention_mask` 0 on
the left), and a sequence that has produced `eos_token_id` continues with it as padding
until every sequence has, when the loop stops.
"""
from __future__ import annotations

import numpy as np

from .. import codes
from ..diagnostics import Diagnostic, LinnetError

#: The entries a model needs to generate.
DECODER_ENTRIES = ("prefill", "decode", "next_logits")


def generate(model, prompt, max_new_tokens: int, *, do_sample: bool = False, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
             attention_mask=None, eos_token_id: int | None = None) -> np.ndarray:
    """The prompt's tokens followed by up to `max_new_tokens` generated ones: int64 [B, S + n]."""
    missing = [e for e in DECODER_ENTRIES if e not in model.entries]
    if missing:
        raise LinnetError(Diagnostic(codes.UNKNOWN_MODEL_ENTRY, f"{model.manifest.name} cannot generate: it has no "
                                     f"{', '.join(f'`{e}`' for e in missing)} entry ({', '.join(DECODER_ENTRIES)} needed)"))
    tokens = _as_batch(prompt)
    mask = np.ones_like(tokens) if attention_mask is None else _as_batch(attention_mask)
    if mask.shape != tokens.shape:
        raise _bad(f"attention_mask has shape {mask.shape}, but the prompt has {tokens.shape}")
    if max_new_tokens < 0:
        raise _bad(f"max_new_tokens must be at least 0, found {max_new_tokens}")
    _check_length(model, tokens.shape, max_new_tokens)
    choose = _sampler(do_sample, temperature, top_k, top_p, seed)
    out = [tokens]
    finished = np.zeros(tokens.shape[0], bool)
    cache = model.prefill(tokens, attention_mask=mask) if max_new_tokens else None
    for step in range(max_new_tokens):
        logits = np.asarray(_numpy(model.next_logits(cache)), np.float32)
        token = choose(logits)
        if eos_token_id is not None:
            token = np.where(finished, eos_token_id, token)
            finished |= token == eos_token_id
        out.append(token[:, None].astype(np.int64))
        mask = np.concatenate([mask, np.ones((mask.shape[0], 1), mask.dtype)], axis=1)
        if finished.all() or step == max_new_tokens - 1:
            break
        cache = model.decode(token[:, None], cache, attention_mask=mask)
    return np.concatenate(out, axis=1)


def _as_batch(value) -> np.ndarray:
    array = np.asarray(_numpy(value))
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2 or array.dtype.kind not in "iu":
        raise _bad(f"a prompt is [B, S] integer token ids (or one sequence [S]), found {array.dtype} {array.shape}")
    return array.astype(np.int64)


def _numpy(value):
    if hasattr(value, "detach"):  # a torch tensor, without importing torch
        return value.detach().cpu().numpy()
    return value


def _bad(message: str) -> LinnetError:
    return LinnetError(Diagnostic(codes.BAD_INPUT, f"generate: {message}"))


def _check_length(model, shape: tuple[int, int], new: int) -> None:
    """Prompt plus new tokens must fit the positions `decode` accepts, checked before any compute:
    the last decode would hold a cache of S + new - 1 positions."""
    batch, length = shape
    entry = model.program.entries["decode"]
    dims = {"B": batch, "P": length + new - 1}
    for left, op, right, span in entry.preconditions:
        if op == "<=" and left.evaluate(dims) > right.evaluate(dims):
            limit = right.evaluate(dims)
            raise LinnetError(Diagnostic(
                codes.PRECONDITION_FAILED,
                f"generate: a prompt of {length} tokens plus max_new_tokens = {new} needs {length + new} positions, "
                f"but {model.manifest.name} has {limit} (decode requires {left} {op} {right})", span))


def _sampler(do_sample: bool, temperature: float, top_k: int | None, top_p: float | None, seed: int | None):
    if not do_sample:
        return lambda logits: logits.argmax(axis=-1)
    if temperature <= 0:
        raise _bad(f"temperature must be positive when sampling, found {temperature}")
    rng = np.random.default_rng(seed)

    def sample(logits: np.ndarray) -> np.ndarray:
        scores = logits.astype(np.float64) / temperature
        if top_k is not None and 0 < top_k < scores.shape[-1]:
            kth = np.sort(scores, axis=-1)[:, -top_k][:, None]
            scores = np.where(scores < kth, -np.inf, scores)
        if top_p is not None and top_p < 1.0:
            scores = _nucleus(scores, top_p)
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        return np.array([rng.choice(probs.shape[-1], p=row) for row in probs])

    return sample


def _nucleus(scores: np.ndarray, top_p: float) -> np.ndarray:
    """Keep the most probable tokens whose cumulative probability reaches `top_p` (at least one)."""
    order = np.argsort(-scores, axis=-1, kind="stable")
    ranked = np.take_along_axis(scores, order, axis=-1)
    probs = np.exp(ranked - ranked[:, :1])
    probs /= probs.sum(axis=-1, keepdims=True)
    before = np.cumsum(probs, axis=-1) - probs  # the mass of the better-ranked tokens
    drop_ranked = before >= top_p
    drop = np.zeros_like(drop_ranked)
    np.put_along_axis(drop, order, drop_ranked, axis=-1)
    return np.where(drop, -np.inf, scores)
