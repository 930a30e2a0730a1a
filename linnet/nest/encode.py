"""`model.encode(texts)` and `model.similarity(a, b)`: sentence embeddings as sentence-transformers
gives them, with its names and defaults.

The texts are sorted by length so each batch pads to a similar width (less compute wasted
on padding), tokenised and run through the `embed` entry a batch at a time, and put back in
the order they came in.  The result is one `[N, D]` array.

What the model's own sentence-transformers files say applies (`linnet.nest.sentence`): the
prompts of `config_sentence_transformers.json` (`prompt_name=`, and its `default_prompt_name`),
the tokenizer's `max_seq_length`, a Pooling that leaves the prompt out (`include_prompt`), and
whether vectors come out unit length, which only a Normalize module in the pipeline or
`normalize_embeddings=True` decides, never a default of Linnet's.  `truncate_dim` keeps the
first dimensions of each vector (Matryoshka models), before `normalize_embeddings` applies, as
in sentence-transformers.
"""
from __future__ import annotations

import warnings
from typing import Any, Sequence

import numpy as np

from .. import codes
from ..arrays import framework_of
from ..diagnostics import Diagnostic, LinnetError, Note, error

#: What `output=` accepts (Linnet's older spelling of convert_to_numpy / convert_to_tensor).
OUTPUTS = ("numpy", "tensor")
#: `model.similarity`'s functions, by sentence-transformers' `similarity_fn_name`.
SIMILARITY_FUNCTIONS = ("cosine", "dot", "euclidean", "manhattan")
#: The input a pipeline's embed entry takes when its Pooling leaves the prompt out.
PROMPT_LENGTH = "prompt_length"


def encode(model, sentences: str | Sequence[str], prompt_name: str | None = None, prompt: str | None = None,
           batch_size: int = 32, show_progress_bar: bool | None = None, *, output_value: str = "sentence_embedding",
           precision: str = "float32", convert_to_numpy: bool = True, convert_to_tensor: bool = False,
           normalize_embeddings: bool = False, truncate_dim: int | None = None, max_length: int | None = None,
           entry: str = "embed", normalize: bool | None = None, progress: bool | None = None,
           output: str | None = None) -> Any:
    """Embed `sentences` with `model.<entry>`, `batch_size` texts at a time.

    sentences: one string (returns one `[D]` vector) or a sequence of strings (`[N, D]`).
    prompt_name / prompt: a prompt of the model's (`config_sentence_transformers.json`) or a
    string, put before every text; `prompt` wins; neither: the model's default prompt, if any.
    show_progress_bar: a progress bar (tqdm, on stderr); None shows it when there are more
    than 8 batches.  convert_to_numpy (default) gives a float32 numpy array;
    convert_to_tensor the backend's tensor type (a torch.Tensor, a jax.Array); both False a
    list of per-text vectors.  normalize_embeddings scales each vector to unit length.
    truncate_dim keeps the first `truncate_dim` dimensions.  max_length: tokens per text,
    special tokens included; default the model's `max_seq_length` (else its positions).
    Linnet's older names still work: `normalize=` (normalize_embeddings), `progress=`
    (show_progress_bar), `output="numpy" | "tensor"`.
    """
    normalize_embeddings = normalize_embeddings if normalize is None else bool(normalize)
    show_progress_bar = show_progress_bar if progress is None else progress
    form = _form(output, convert_to_numpy, convert_to_tensor)
    _check_options(model, batch_size, entry, output_value, precision, truncate_dim)
    single = isinstance(sentences, str)
    rows = [sentences] if single else _texts(sentences)
    prompt = resolve_prompt(model, prompt, prompt_name)
    _warn_without_pipeline(model, entry)
    if not rows:
        return _empty(model, entry, form, truncate_dim)
    extra = _prompt_inputs(model, entry, prompt)
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))  # longest first, as sentence-transformers
    batches = [order[start:start + batch_size] for start in range(0, len(order), batch_size)]
    tokenizer = model.tokenizer
    outputs = []
    for batch in _progress(batches, show_progress_bar, f"encode {model.manifest.name}"):
        texts = [(prompt or "") + rows[i] for i in batch]
        features = dict(tokenizer(texts, max_length=max_length))
        features.update({name: np.full((len(batch),), value, np.int32) for name, value in extra.items()})
        outputs.append(model.run(entry, **features))
    vectors = _restore_order(outputs, order, form)
    if truncate_dim is not None:
        vectors = vectors[:, :truncate_dim]
    if normalize_embeddings:
        vectors = _normalized(vectors)
    if form == "list":
        vectors = list(vectors)
    return vectors[0] if single else vectors


def _warn_without_pipeline(model, entry: str) -> None:
    """A model read from a repo or folder without sentence-transformers files has no
    sentence embedding of its own: say what `embed` computes, once per model, rather than
    let it pass for what sentence-transformers' fallback would give."""
    if entry != "embed" or getattr(model.manifest, "pipeline", "zoo") is not None or \
            model.__dict__.get("_warned_no_pipeline"):
        return
    model.__dict__["_warned_no_pipeline"] = True
    warnings.warn(f"{model.manifest.name} has no sentence-transformers files (no modules.json), so encode runs "
                  f"its source's `embed` entry: the mean of the real tokens' vectors, scaled to unit length. "
                  f"sentence-transformers, given such a model, mean-pools without normalising "
                  f"(normalize_embeddings=False); compare with care.", UserWarning, stacklevel=3)


def resolve_prompt(model, prompt: str | None, prompt_name: str | None) -> str | None:
    """The prompt to put before each text, as sentence-transformers chooses it."""
    if prompt is not None:
        if not isinstance(prompt, str):
            raise error(codes.BAD_INPUT, f"encode: prompt must be a string, found {type(prompt).__name__}")
        return prompt
    pipeline = getattr(model.manifest, "pipeline", None)
    prompts = pipeline.prompts if pipeline is not None else {}
    if prompt_name is not None:
        if prompt_name not in prompts:
            known = ", ".join(map(repr, prompts)) or "none"
            raise error(codes.BAD_INPUT, f"encode: {model.manifest.name} has no prompt named {prompt_name!r}; "
                                         f"its prompts: {known}", None,
                        Note("prompts come from the model's config_sentence_transformers.json; pass prompt= "
                             "a string to use one of your own"))
        return prompts[prompt_name]
    if pipeline is not None and pipeline.default_prompt_name is not None:
        return prompts.get(pipeline.default_prompt_name)
    return None


def _prompt_inputs(model, entry: str, prompt: str | None) -> dict[str, int]:
    """`prompt_length` for an entry whose pooling leaves the prompt out: the prompt's tokens
    without a special token that closes it (sentence-transformers' `_get_prompt_length`)."""
    taken = {name for name, _ in model.program.entries[entry].inputs}
    if PROMPT_LENGTH not in taken or not prompt:
        return {}
    tokenizer = model.tokenizer
    ids = tokenizer([prompt]).tokens[0].tolist()
    specials = set(tokenizer.special_ids.values())
    return {PROMPT_LENGTH: len(ids) - (1 if ids and ids[-1] in specials else 0)}


def similarity(model, a, b):
    """`[N, M]` scores between the rows of `a` and of `b` by the model's similarity function
    (`similarity_fn_name` of its sentence-transformers files; cosine when it names none):
    cosine, dot, or euclidean / manhattan as negative distances, as sentence-transformers
    scores them.  Vectors ([D]) count as one row.  Returns a float32 numpy array."""
    name = similarity_fn_name(model)
    left, right = _matrix(a, "a"), _matrix(b, "b")
    if left.shape[1] != right.shape[1]:
        raise error(codes.BAD_INPUT, f"similarity: the rows of a are {left.shape[1]} wide and those of b "
                                     f"{right.shape[1]}; both must be embeddings of one model")
    if name == "cosine":
        return _unit(left) @ _unit(right).T
    if name == "dot":
        return left @ right.T
    difference = left[:, None, :] - right[None, :, :]
    if name == "euclidean":
        return -np.sqrt((difference * difference).sum(-1))
    return -np.abs(difference).sum(-1)


def similarity_fn_name(model) -> str:
    pipeline = getattr(model.manifest, "pipeline", None)
    return pipeline.similarity_fn_name if pipeline is not None else "cosine"


def _matrix(value, name: str) -> np.ndarray:
    if isinstance(value, (list, tuple)) and value and not np.isscalar(value[0]):
        value = np.stack([_to_numpy(v) for v in value])
    array = _to_numpy(value).astype(np.float32, copy=False)
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2:
        raise error(codes.BAD_INPUT, f"similarity: {name} must be embeddings ([N, D] or [D]), found shape "
                                     f"{list(array.shape)}")
    return array


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def _form(output: str | None, convert_to_numpy: bool, convert_to_tensor: bool) -> str:
    """"numpy", "tensor" or "list": what encode returns."""
    if output is not None:
        if output not in OUTPUTS:
            raise error(codes.BAD_INPUT, f"encode: output must be one of {', '.join(map(repr, OUTPUTS))}, "
                                         f"found {output!r}")
        return output
    if convert_to_tensor:
        return "tensor"
    return "numpy" if convert_to_numpy else "list"


def _texts(texts) -> list[str]:
    if isinstance(texts, (bytes, dict)) or not isinstance(texts, Sequence) and not hasattr(texts, "__iter__"):
        raise error(codes.BAD_INPUT, f"encode takes a string or a list of strings, found {type(texts).__name__}")
    rows = list(texts)
    for index, text in enumerate(rows):
        if not isinstance(text, str):
            raise error(codes.BAD_INPUT, f"encode: text {index} is a {type(text).__name__}, not a string")
    return rows


def _check_options(model, batch_size, entry: str, output_value: str, precision: str,
                   truncate_dim: int | None) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise error(codes.BAD_INPUT, f"encode: batch_size must be a whole number >= 1, found {batch_size!r}")
    if output_value != "sentence_embedding":
        raise error(codes.BAD_INPUT, f"encode: output_value={output_value!r} is not computed; encode returns "
                                     f"sentence embeddings (\"sentence_embedding\")",
                    None, Note("token vectors are the `forward` entry: model.forward(**model.tokenizer(texts))"))
    if precision != "float32":
        raise error(codes.BAD_INPUT, f"encode: precision={precision!r} (quantised embeddings) is not computed; "
                                     f"encode returns float32")
    if truncate_dim is not None and (isinstance(truncate_dim, bool) or not isinstance(truncate_dim, (int, np.integer))
                                     or truncate_dim < 1):
        raise error(codes.BAD_INPUT, f"encode: truncate_dim must be a whole number >= 1, found {truncate_dim!r}")
    if entry not in model.entries:
        raise LinnetError(Diagnostic(codes.UNKNOWN_MODEL_ENTRY,
                                     f"{model.manifest.name} has no entry `{entry}` to encode with; "
                                     f"entries: {', '.join(model.entries)}",
                                     notes=(Note("encode runs a sentence-embedding entry: pass entry= one "
                                                 "returning [B, D]"),)))
    result = model.program.entries[entry].result
    if getattr(result, "rank", None) != 2:  # several results (a tuple type) have no rank
        raise error(codes.UNKNOWN_MODEL_ENTRY, f"encode needs an entry returning one vector per text ([B, D]); "
                                               f"`{entry}` returns {result}")


def _empty(model, entry: str, form: str, truncate_dim: int | None):
    width = model.program.entries[entry].result.dims[1].as_int()
    empty = np.zeros((0, min(width, truncate_dim or width)), np.float32)
    if form == "list":
        return []
    return empty if form == "numpy" else _from_numpy(model, empty)


def _progress(batches: list, progress: bool | None, description: str):
    show = len(batches) > 8 if progress is None else bool(progress)
    if not show:
        return batches
    from tqdm.auto import tqdm

    return tqdm(batches, desc=description, unit="batch")


def _restore_order(outputs: list, order: list[int], form: str):
    """One array in the callers' order from per-batch outputs in sorted order."""
    inverse = np.empty(len(order), np.int64)
    inverse[np.asarray(order)] = np.arange(len(order))
    if form == "numpy":
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
