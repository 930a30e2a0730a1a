"""`model.encode(texts)`: sentence embeddings for many texts, as sentence-transformers gives them.

The texts are sorted by length so each batch pads to a similar width (less compute wasted
on padding), tokenised and run through the entry a batch at a time, and put back in the
order they came in.  The result is one `[N, D]` array.

Like sentence-transformers, `normalize=True` scales each vector to unit length; for an
entry whose `embed` already ends in an L2 norm (all-minilm-l6-v2, whose sentence-transformers
pipeline ends in `Normalize`) that changes nothing beyond rounding, and `normalize=False`
returns the entry's output as it is.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .. import codes
from ..arrays import framework_of
from ..diagnostics import Diagnostic, LinnetError, Note, error

#: What `output=` accepts: a numpy array, or the backend's own tensor type.
OUTPUTS = ("numpy", "tensor")


def encode(model, texts: str | Sequence[str], *, batch_size: int = 32, normalize: bool = True,
           progress: bool | None = None, output: str = "numpy", entry: str = "embed",
           max_length: int | None = None) -> Any:
    """Embed `texts` with `model.<entry>`, `batch_size` texts at a time.

    texts: one string (returns one `[D]` vector) or a sequence of strings (`[N, D]`).
    progress: show a progress bar (tqdm, on stderr); None shows it when there are more than
    8 batches.  output: "numpy" (float32 numpy) or "tensor" (the backend's tensor type, e.g.
    a torch.Tensor on the model's device).  max_length: tokens per text, special tokens
    included (longer texts are truncated); defaults to the tokenizer's (the model's
    MaxPositions).  sentence-transformers cuts all-MiniLM-L6-v2 at 256: pass 256 to match it
    on texts longer than that.
    """
    single = isinstance(texts, str)
    rows = [texts] if single else _texts(texts)
    _check_options(model, batch_size, output, entry)
    if not rows:
        return _empty(model, entry, output)
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))  # longest first, as sentence-transformers
    batches = [order[start:start + batch_size] for start in range(0, len(order), batch_size)]
    tokenizer = model.tokenizer
    outputs = []
    for batch in _progress(batches, progress, f"encode {model.manifest.name}"):
        features = tokenizer([rows[i] for i in batch], max_length=max_length)
        outputs.append(model.run(entry, **features))
    vectors = _restore_order(outputs, order, output)
    if normalize:
        vectors = _normalized(vectors)
    return vectors[0] if single else vectors


def _texts(texts) -> list[str]:
    if isinstance(texts, (bytes, dict)) or not isinstance(texts, Sequence) and not hasattr(texts, "__iter__"):
        raise error(codes.BAD_INPUT, f"encode takes a string or a list of strings, found {type(texts).__name__}")
    rows = list(texts)
    for index, text in enumerate(rows):
        if not isinstance(text, str):
            raise error(codes.BAD_INPUT, f"encode: text {index} is a {type(text).__name__}, not a string")
    return rows


def _check_options(model, batch_size, output: str, entry: str) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise error(codes.BAD_INPUT, f"encode: batch_size must be a whole number >= 1, found {batch_size!r}")
    if output not in OUTPUTS:
        raise error(codes.BAD_INPUT, f"encode: output must be one of {', '.join(map(repr, OUTPUTS))}, found {output!r}")
    if entry not in model.entries:
        raise LinnetError(Diagnostic(codes.UNKNOWN_MODEL_ENTRY,
                                     f"{model.manifest.name} has no entry `{entry}` to encode with; "
                                     f"entries: {', '.join(model.entries)}",
                                     notes=(Note("encode runs a sentence-embedding entry: pass entry= one "
                                                 "returning [B, D]"),)))
    result = model.program.entries[entry].result
    if result.rank != 2:
        raise error(codes.UNKNOWN_MODEL_ENTRY, f"encode needs an entry returning one vector per text ([B, D]); "
                                               f"`{entry}` returns {result}")


def _empty(model, entry: str, output: str):
    width = model.program.entries[entry].result.dims[1].as_int()
    empty = np.zeros((0, width), np.float32)
    return empty if output == "numpy" else _from_numpy(model, empty)


def _progress(batches: list, progress: bool | None, description: str):
    show = len(batches) > 8 if progress is None else bool(progress)
    if not show:
        return batches
    from tqdm.auto import tqdm

    return tqdm(batches, desc=description, unit="batch")


def _restore_order(outputs: list, order: list[int], output: str):
    """One array in the callers' order from per-batch outputs in sorted order."""
    inverse = np.empty(len(order), np.int64)
    inverse[np.asarray(order)] = np.arange(len(order))
    if output == "numpy":
        return np.concatenate([_to_numpy(o) for o in outputs])[inverse]
    return framework_of(outputs[0]).concat(outputs, 0)[inverse]


def _normalized(vectors):
    kind = type(vectors).__module__.split(".")[0]
    if kind == "torch":
        import torch

        return torch.nn.functional.normalize(vectors, dim=1)
    if kind in ("jax", "jaxlib"):
        import jax.numpy as jnp

        return vectors / jnp.maximum(jnp.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


def _to_numpy(value) -> np.ndarray:
    if hasattr(value, "detach"):  # torch; numpy has no bfloat16, so those widen to f32
        value = value.detach().cpu()
        value = (value.float() if str(value.dtype) == "torch.bfloat16" else value).numpy()
    return np.asarray(value)


def _from_numpy(model, array: np.ndarray):
    """`array` as the backend's tensor type (numpy for ONNX Runtime)."""
    if model.backend == "torch":
        import torch

        return torch.from_numpy(array)
    if model.backend in ("jax", "stablehlo"):
        import jax.numpy as jnp

        return jnp.asarray(array)
    return array
