"""`model.generate`: text continuation for a decoder entry with a typed key/value cache.

A decoder's Linnet source exposes two cache steps (GPT-2's, `nest/gpt2/src/lib.linnet`), each
returning two results, the scores for the next token [B, Vocab] and the cache:
`prefill(tokens, attention_mask)` over the prompt, and `decode(token, cache, attention_mask)`
one position further.  The loop here is the same on every backend: it runs those
entries through the model's own validated `run`, so each step is checked against the
entry's signature (a cache of the wrong shape, an id outside the vocabulary) before compute.
A runtime may step on its own instead (`decoder_steps()`: ONNX Runtime runs optimum-style
graphs with a key and a value per layer, `linnet/backends/onnx_decoder.py`; `cache_buffer_steps(total)`:
torch and JAX run the entries on one cache preallocated for the whole call and written in
place, `linnet/backends/torch_cache.py` and `JaxRingSteps`, docs/llama.md "The cache"); the
prompt is still validated against `prefill` first.

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
from ..middle import ir

#: The entries a model needs to generate.
DECODER_ENTRIES = ("prefill", "decode")


def generate(model, prompt, max_new_tokens: int, *, do_sample: bool = False, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
             attention_mask=None, eos_token_id: int | None = None) -> np.ndarray:
    """The prompt's tokens followed by up to `max_new_tokens` generated ones: int64 [B, S + n]."""
    missing = [e for e in DECODER_ENTRIES if e not in model.entries]
    if missing:
        raise LinnetError(Diagnostic(codes.UNKNOWN_MODEL_ENTRY, f"{model.manifest.name} cannot generate: it has no "
                                     f"{', '.join(f'`{e}`' for e in missing)} entry ({', '.join(DECODER_ENTRIES)} needed)"))
    _check_steps(model)
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
    steps = _steps(model, tokens, mask, max_new_tokens) if max_new_tokens else None
    try:
        logits = steps.start(tokens, mask) if steps else None
        for step in range(max_new_tokens):
            token = choose(np.asarray(logits, np.float32))
            if eos_token_id is not None:
                token = np.where(finished, eos_token_id, token)
                finished |= token == eos_token_id
            out.append(token[:, None].astype(np.int64))
            mask = np.concatenate([mask, np.ones((mask.shape[0], 1), mask.dtype)], axis=1)
            if finished.all() or step == max_new_tokens - 1:
                break
            logits = steps.step(token[:, None], mask)
    finally:
        if steps is not None:
            getattr(steps, "close", lambda: None)()
    return np.concatenate(out, axis=1)


class EntrySteps:
    """The loop's two calls on the model's own entries, each validated against its signature:
    `start` runs `prefill` and `step` `decode`, each returning the next token's scores
    [B, Vocab] and keeping the cache, which stays in the backend's array type between steps."""

    def __init__(self, model):
        self.model = model
        self.cache = None

    def start(self, tokens, mask):
        logits, self.cache = self.model.prefill(tokens, attention_mask=mask)
        return _numpy(logits)

    def step(self, token, mask):
        logits, self.cache = self.model.decode(token, self.cache, attention_mask=mask)
        return _numpy(logits)


class WindowSteps(EntrySteps):
    """The entries on a cache of one length throughout, for runtimes that compile per shape
    (JAX, StableHLO): the prompt is left-padded (mask 0) to `total - 1` positions, and after
    each `decode` the oldest position, always padding, is dropped. Padding is never attended
    to and positions count real tokens only, so the scores are those of the growing cache,
    and `prefill` and `decode` each compile once per generate shape."""

    def __init__(self, model, total: int):
        super().__init__(model)
        self.total = total  # prompt plus new tokens

    def start(self, tokens, mask):
        pad = self.total - 1 - tokens.shape[1]
        return super().start(_left_pad(tokens, pad), _left_pad(mask, pad))

    def step(self, token, mask):
        # The loop's mask covers the real history; the window's first positions are padding.
        window = _left_pad(mask, self.total - mask.shape[1])
        logits, grown = self.model.decode(token, self.cache, attention_mask=window)
        self.cache = grown[:, :, :, :, 1:]
        return _numpy(logits)


def _left_pad(array: np.ndarray, width: int) -> np.ndarray:
    """`width` columns of zeros (padding, or token id 0 under a zero mask) on the left."""
    return np.concatenate([np.zeros((array.shape[0], width), array.dtype), array], axis=1)


def _steps(model, tokens: np.ndarray, mask: np.ndarray, new: int):
    """A runtime's own stepping where it has one (ONNX Runtime: the per-layer past-key-value
    graphs with IOBinding; torch: the entries on a cache preallocated for prompt plus new
    tokens and written in place, `linnet/backends/torch_cache.py`), else the entries. The prompt is validated against `prefill`'s
    signature first either way (ids inside the vocabulary), so bad input fails before compute."""
    own = getattr(model.runtime, "decoder_steps", None)
    steps = own() if own is not None else None
    buffered = getattr(model.runtime, "cache_buffer_steps", None)
    if steps is None and buffered is not None:  # torch: the cache in one buffer, written in place
        steps = buffered(tokens.shape[1] + new)
    if steps is None and getattr(model.runtime, "compiles_per_shape", False) and new > 1:
        model.validate("prefill", tokens, attention_mask=mask)  # before the padding, so errors name the prompt
        return WindowSteps(model, tokens.shape[1] + new)
    if steps is None:
        return EntrySteps(model)
    model.validate("prefill", tokens, attention_mask=mask)
    return steps


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


def _check_steps(model) -> None:
    """`prefill` and `decode` each return (scores [B, Vocab], cache), and `decode` takes that
    cache: said by name here, not as an unpacking error in the middle of the loop."""
    decode = model.program.entries["decode"]
    cache = decode.inputs[1][1] if len(decode.inputs) > 1 else None
    for name in DECODER_ENTRIES:
        result = model.program.entries[name].result
        fits = (isinstance(result, ir.TupleType) and len(result.items) == 2 and result.items[0].rank == 2
                and cache is not None and result.items[1].rank == cache.rank)
        if not fits:
            raise LinnetError(Diagnostic(
                codes.NOT_A_DECODER, f"{model.manifest.name} cannot generate: its `{name}` returns {result}, where "
                f"generate needs two results, the next token's scores [B, Vocab] and the cache that `decode` "
                f"takes as its second input"))


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
