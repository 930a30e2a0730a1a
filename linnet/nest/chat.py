"""`model.chat(messages)`: a chat template applied, the reply generated and decoded.

The template is the repo's own Jinja text (`chat_template` in tokenizer_config.json, which
`linnet.nest.gguf` writes from a GGUF file's `tokenizer.chat_template`), rendered as
transformers' `apply_chat_template` renders it: a sandboxed jinja2 environment with
`trim_blocks` and `lstrip_blocks`, `raise_exception` available to the template, the special
tokens as variables and `add_generation_prompt=True`. The rendered text is tokenized without
adding special tokens (the template writes them), generated from with the entry's end-of-text
id, and the new tokens decoded without special tokens.
"""
from __future__ import annotations

import json

import numpy as np

from .. import codes
from ..diagnostics import Diagnostic, LinnetError

TOKENIZER_CONFIG = "tokenizer_config.json"


def chat_template(model) -> tuple[str, dict]:
    """The template text and the special tokens it may use, from the model's files."""
    folder = model._beside()
    path = folder / TOKENIZER_CONFIG if folder is not None else None
    config = {}
    if path is not None and path.is_file():
        config = json.loads(path.read_text(encoding="utf-8"))
    template = config.get("chat_template")
    if isinstance(template, list):  # several named templates: the default one
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    if not isinstance(template, str):
        raise LinnetError(Diagnostic(codes.BAD_INPUT, f"{model.manifest.name} has no chat template: "
                                     f"{path or 'its folder'} gives no `chat_template`, so chat() cannot tell "
                                     f"how messages become a prompt; use generate() on token ids"))
    specials = {k: config.get(k) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
    return template, {k: (v.get("content") if isinstance(v, dict) else v) for k, v in specials.items()}


def render(template: str, messages, specials: dict, add_generation_prompt: bool = True) -> str:
    try:
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise LinnetError(Diagnostic(codes.BAD_INPUT, "chat() renders the chat template with jinja2, which is "
                                     "not installed (pip install jinja2)")) from None

    def raise_exception(message):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                            **specials)


def _check_messages(messages) -> list[dict]:
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    ok = isinstance(messages, (list, tuple)) and messages and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in messages)
    if not ok:
        raise LinnetError(Diagnostic(codes.BAD_INPUT, "chat() takes a non-empty list of messages, each a dict with "
                                     "a string `role` and `content` (or one string, the user's message)"))
    return list(messages)


def chat(model, messages, max_new_tokens: int, **options) -> str:
    template, specials = chat_template(model)
    prompt = render(template, _check_messages(messages), specials)
    tokenizer = model.tokenizer
    ids = np.asarray([tokenizer.backend.encode(prompt, add_special_tokens=False).ids], np.int64)
    out = model.generate(ids, max_new_tokens, **options)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()
