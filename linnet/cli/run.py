"""`linnet run NAME TEXT...`: tokenise some texts (or read some images), run a model, print what
its entry is for.

What gets printed depends on the model, unless `--task` says otherwise:

* fill-mask: the model has an `mlm` entry and a text holds `[MASK]`: the top candidates
  for every masked position, with their probabilities;
* similarity: a sentence encoder (`embed` entry, tagged sentence-similarity, or a
  sentence-transformers model's pipeline): its similarity function's (cosine by default)
  similarity of every pair of texts;
* classify: a classifier loaded with `hf:` (a `logits` entry and labels): each text's labels
  ranked by probability;
* pool: anything else with a `pool` entry: a summary of each text's pooled vector;
* classify-image: an image model (`[image]` in nest.toml): the arguments are image files,
  preprocessed as the repo says, and each image's labels are ranked by probability;
* generate: a decoder (`prefill` and `decode` entries, as GPT-2): each text is
  a prompt, continued greedily by `--max-new-tokens` tokens (fewer when it reaches the
  entry's end of text), and the continuation is printed under it;
* chat: a decoder with a chat template (tokenizer_config.json beside its files, as a GGUF
  file's conversion writes it): each text is a user's message, answered with `model.chat`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import codes
from ..diagnostics import Diagnostic, LinnetError

TASKS = ("auto", "fill-mask", "similarity", "classify", "pool", "classify-image", "generate", "chat")
#: The entries a decoder generates with: linnet.nest.generate.DECODER_ENTRIES, repeated
#: so that building the parser loads no zoo code (tests/test_gpt2_text.py checks they agree).
DECODER_ENTRIES = ("prefill", "decode")
#: New tokens `--task generate` adds to each prompt unless told otherwise.
DEFAULT_NEW_TOKENS = 20

#: The codes of `linnet run`, with what they mean (a view of the registry in linnet/codes.py).
CODES = codes.summaries("cli")


@dataclass
class Options:
    name: str
    texts: list[str]
    backend: str = "torch"
    task: str = "auto"
    top: int = 5
    weights: str | None = None
    revision: str | None = None
    max_new_tokens: int = DEFAULT_NEW_TOKENS


def load_model(options: Options):
    """nest.load; a zoo entry's packaged copy of its weights is found by the loader itself."""
    from .. import nest

    return nest.load(options.name, backend=options.backend, weights=options.weights, revision=options.revision)


def choose_task(model, texts: list[str]) -> str:
    entries, tags = set(model.entries), set(model.manifest.tags)
    if getattr(model.manifest, "image", None) is not None:
        return "classify-image"
    if all(e in entries for e in DECODER_ENTRIES):
        return "chat" if _has_chat_template(model) else "generate"
    if "mlm" in entries and any("[MASK]" in t for t in texts):
        return "fill-mask"
    if "embed" in entries and ("sentence-similarity" in tags or getattr(model.manifest, "pipeline", None) is not None):
        return "similarity"
    if "logits" in entries and model.labels:
        return "classify"
    return "pool"


def _has_chat_template(model) -> bool:
    from ..nest.chat import chat_template

    try:
        chat_template(model)
    except LinnetError:
        return False
    return True


def answer(model, texts: list[str], max_new_tokens: int) -> list[str]:
    """Each message, then the model's reply to it alone, indented by two spaces."""
    lines = []
    for text in texts:
        reply = model.chat([{"role": "user", "content": text}], max_new_tokens=max_new_tokens)
        lines.append(f"{text!r} ->")
        lines += [f"  {line}" for line in reply.split("\n")]
    return lines


def _needs(model, entry: str, task: str) -> None:
    if entry not in model.entries:
        raise LinnetError(Diagnostic(codes.TASK_UNAVAILABLE, f"--task {task} needs the entry `{entry}`, which "
                                                             f"{model.manifest.name} does not have; its entries: "
                                                             f"{', '.join(model.entries)}"))


def _numpy(value) -> np.ndarray:
    if hasattr(value, "detach"):
        value = value.detach().cpu().float().numpy()
    return np.asarray(value, dtype=np.float64)


def _softmax(x: np.ndarray) -> np.ndarray:
    shifted = np.exp(x - x.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def fill_mask(model, texts: list[str], top: int) -> list[str]:
    _needs(model, "mlm", "fill-mask")
    tokenizer = model.tokenizer
    if not any("[MASK]" in t for t in texts):
        raise LinnetError(Diagnostic(codes.TASK_UNAVAILABLE, "--task fill-mask needs a text with [MASK] in it, e.g. "
                                                             "\"the capital of france is [MASK].\""))
    encoded = tokenizer(texts)
    probabilities = _softmax(_numpy(model.mlm(**encoded)))
    lines = []
    for row, text in enumerate(texts):
        positions = np.flatnonzero(encoded.tokens[row] == tokenizer.mask_id)
        for n, position in enumerate(positions, 1):
            lines.append(f"{text!r}: [MASK] {n} of {len(positions)}")
            best = np.argsort(-probabilities[row, position])[:top]
            lines += [f"  {probabilities[row, position, i]:6.3f}  {tokenizer.id_to_token(i)}" for i in best]
    return lines


def similarity(model, texts: list[str]) -> list[str]:
    _needs(model, "embed", "similarity")
    # encode and similarity as the model's own files say: its prompts, length, pooling and
    # similarity function (a sentence-transformers model's may be dot or a distance).
    vectors = model.encode(texts, show_progress_bar=False)
    matrix = np.asarray(model.similarity(vectors, vectors), np.float64)
    lines = [f"{model.similarity_fn_name} similarity:"]
    for i, text in enumerate(texts):
        lines.append(f"  [{i}] " + "  ".join(f"{matrix[i, j]:5.2f}" for j in range(len(texts))) + f"   {text}")
    return lines


def classify(model, texts: list[str], top: int) -> list[str]:
    _needs(model, "logits", "classify")
    probabilities = _softmax(_numpy(model.logits(**model.tokenizer(texts))))
    if probabilities.ndim != 2:
        raise LinnetError(Diagnostic(codes.TASK_UNAVAILABLE, f"--task classify reads one row of logits per text; "
                                                             f"{model.manifest.name}'s `logits` has shape "
                                                             f"{list(probabilities.shape)}"))
    return _ranked(model, [repr(text) for text in texts], probabilities, top)


def classify_images(model, paths: list[str], top: int) -> list[str]:
    """Each image's `top` labels: the root entry's logits (`forward` of an image classifier)."""
    if getattr(model.manifest, "image", None) is None:
        raise LinnetError(Diagnostic(codes.TASK_UNAVAILABLE, f"--task classify-image needs an image model; "
                                                             f"{model.manifest.name} declares no [image] table"))
    probabilities = _softmax(_numpy(model(model.preprocess(paths))))
    return _ranked(model, list(paths), probabilities, top)


def _ranked(model, headings: list[str], probabilities: np.ndarray, top: int) -> list[str]:
    """Under each heading, that row's `top` labels by probability (LABEL_i where none are known)."""
    labels = model.labels or tuple(f"LABEL_{i}" for i in range(probabilities.shape[1]))
    lines = []
    for row, heading in enumerate(headings):
        lines.append(f"{heading}:")
        lines += [f"  {probabilities[row, i]:6.3f}  {labels[i]}" for i in np.argsort(-probabilities[row])[:top]]
    return lines


def continue_texts(model, texts: list[str], max_new_tokens: int) -> list[str]:
    """Each prompt, then its greedy continuation indented by two spaces (a line of it per line)."""
    for entry in DECODER_ENTRIES:
        _needs(model, entry, "generate")
    tokenizer = model.tokenizer
    # Left padding, so every prompt's last token is the one generation continues from.
    encoded = tokenizer(texts, padding_side="left")
    ids = model.generate(encoded.tokens, max_new_tokens, attention_mask=encoded.attention_mask)
    continuations = tokenizer.decode(ids[:, encoded.tokens.shape[1]:])
    lines = []
    for text, continuation in zip(texts, continuations):
        lines.append(f"{text!r} ->")
        lines += [f"  {line}" for line in continuation.split("\n")]
    return lines


def pool(model, texts: list[str]) -> list[str]:
    _needs(model, "pool", "pool")
    vectors = _numpy(model.pool(**model.tokenizer(texts)))
    lines = [f"pooled vectors, {vectors.shape[1]} values each:"]
    for row, text in enumerate(texts):
        v = vectors[row]
        head = ", ".join(f"{x:+.4f}" for x in v[:4])
        lines.append(f"  [{row}] norm {np.linalg.norm(v):7.4f}  mean {v.mean():+.4f}  std {v.std():.4f}  "
                     f"[{head}, ...]   {text}")
    return lines


def run(options: Options) -> list[str]:
    """The lines `linnet run` prints."""
    model = load_model(options)
    task = choose_task(model, options.texts) if options.task == "auto" else options.task
    header = f"{model.manifest.name} ({model.backend}), {task}:"
    if task == "fill-mask":
        return [header, *fill_mask(model, options.texts, options.top)]
    if task == "similarity":
        return [header, *similarity(model, options.texts)]
    if task == "classify":
        return [header, *classify(model, options.texts, options.top)]
    if task == "classify-image":
        return [header, *classify_images(model, options.texts, options.top)]
    if task == "generate":
        return [header, *continue_texts(model, options.texts, options.max_new_tokens)]
    if task == "chat":
        return [header, *answer(model, options.texts, options.max_new_tokens)]
    return [header, *pool(model, options.texts)]
