"""GGUF checkpoints (llama.cpp's format) as a weights source: `nest.load("path/to/x.gguf")`.

The file is read with PyPI `gguf`, llama.cpp's own reader (no hand-written parser), and turned
once into a folder laid out as transformers' `save_pretrained` writes one, which `nest.load`
then reads like any other (`linnet.nest.hf.folder_manifest`), so the Llama family's adapter,
layout and binding checks apply unchanged:

* `config.json` from the file's metadata (`llama.block_count`, `llama.embedding_length`, ...;
  tied embeddings when the file has no `output.weight`);
* `model.safetensors`: every tensor dequantised to float32 with gguf's own `quants` module
  (F32, F16, Q4_0, Q4_1, Q8_0; any other type is refused by name), renamed to transformers'
  keys, and the Q/K rows put back in transformers' order (llama.cpp's converter interleaves
  each head's two RoPE halves; `unpermute` undoes it, as transformers' GGUF loader does);
* `tokenizer.json`: the file's byte-level BPE vocabulary and merges as a `tokenizers`
  pipeline, built as transformers builds it from a GGUF (ByteLevel, its control tokens
  special); `tokenizer_config.json` holds the chat template and the special tokens.

The folder lives in the Linnet cache under the file's sha256, written to a temporary name
and renamed when complete, so a failed conversion leaves nothing half-written behind.
Anything the file says that cannot be loaded exactly (another architecture, scaled RoPE, a
missing or unknown tensor, a truncated file) is `E1113` before anything is written.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

from .. import codes
from ..backends import cache_dir
from ..diagnostics import LinnetError, Note, error
from .weights import sha256_of

SUFFIX = ".gguf"
#: Tensor types dequantised here (gguf's GGMLQuantizationType names).
TYPES = ("F32", "F16", "Q4_0", "Q4_1", "Q8_0")
ARCHITECTURES = ("llama",)
#: Per-layer GGUF tensor names -> transformers' LlamaForCausalLM keys.
LAYER_TENSORS = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
GLOBAL_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
#: Bumped when the converted folder's contents change, so old conversions are not reused.
FORMAT = 1


def is_gguf(path) -> bool:
    return isinstance(path, (str, Path)) and str(path).endswith(SUFFIX) and Path(path).is_file()


def gguf_folder(path: str | Path) -> Path:
    """The transformers-style folder converted from the GGUF file at `path` (made once)."""
    path = Path(path).resolve()
    digest = sha256_of(path)
    folder = cache_dir() / "gguf" / f"{path.stem}-{digest[:16]}-v{FORMAT}"
    if (folder / "config.json").is_file() and (folder / "model.safetensors").is_file():
        return folder
    reader = _reader(path)
    config = read_config(reader, path)
    tensors = read_tensors(reader, path, config)
    tokenizer, tokenizer_config = read_tokenizer(reader, path)
    tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        _write_folder(tmp, tensors, config, tokenizer, tokenizer_config)
    except BaseException:  # a full disk, an interrupt: no half-written folder stays behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        os.replace(tmp, folder)
    except OSError:  # another process converted it first
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _write_folder(tmp: Path, tensors: dict, config: dict, tokenizer: str, tokenizer_config: dict) -> None:
    from safetensors.numpy import save_file

    save_file(tensors, str(tmp / "model.safetensors"))
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (tmp / "tokenizer.json").write_text(tokenizer)
    (tmp / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")



def _bad(path: Path, message: str, *notes: str) -> LinnetError:
    return error(codes.BAD_GGUF, f"{path.name}: {message}", None, Note(f"the file is {path}"),
                 *(Note(n) for n in notes))


def _reader(path: Path):
    try:
        from gguf import GGUFReader
    except ImportError:
        raise _bad(path, "reading a GGUF file needs PyPI `gguf` (llama.cpp's reader)", "pip install gguf") from None
    try:
        return GGUFReader(str(path))
    except Exception as exc:  # gguf raises ValueError, struct errors, ... on a damaged file
        raise _bad(path, f"gguf cannot read it: {type(exc).__name__}: {exc}",
                   "a GGUF file that was cut short (an interrupted download) reads like this") from None


def _field(reader, key: str, default=None):
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


# ------------------------------------------------------------------------- metadata


def read_config(reader, path: Path) -> dict:
    """config.json, as transformers' LlamaConfig names the fields, from the file's metadata."""
    arch = _field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise _bad(path, f"general.architecture is {json.dumps(arch)}; Linnet loads GGUF files of architecture "
                         f"{', '.join(map(json.dumps, ARCHITECTURES))} only")

    def need(key: str):
        value = _field(reader, f"{arch}.{key}")
        if value is None:
            raise _bad(path, f"the metadata has no {arch}.{key}, which a {arch} model needs")
        return value

    heads = int(need("attention.head_count"))
    width = int(need("embedding_length"))
    scaling = _field(reader, f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        raise _bad(path, f"{arch}.rope.scaling.type is {json.dumps(scaling)}; the Llama source computes the "
                         f"default RoPE only (no scaling)")
    rope_dims = _field(reader, f"{arch}.rope.dimension_count", width // heads)
    if heads <= 0 or width % heads or rope_dims != width // heads:
        raise _bad(path, f"{arch}.rope.dimension_count is {rope_dims}; the Llama source rotates whole heads of "
                         f"width embedding_length / head_count = {width}/{heads}")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    names = {t.name for t in reader.tensors}
    config = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "dtype": "float32",
        "vocab_size": int(_field(reader, f"{arch}.vocab_size", len(tokens) if tokens else 0)),
        "max_position_embeddings": int(need("context_length")),
        "hidden_size": width,
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_field(reader, f"{arch}.attention.head_count_kv", heads)),
        "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        "hidden_act": "silu",
        "tie_word_embeddings": "output.weight" not in names,
    }
    for key, name in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                      ("padding_token_id", "pad_token_id")):
        value = _field(reader, f"tokenizer.ggml.{key}")
        if value is not None:
            config[name] = int(value)
    return config


def read_tokenizer(reader, path: Path) -> tuple[str, dict]:
    """tokenizer.json (text) and tokenizer_config.json: the byte-level BPE pipeline transformers
    builds from a GGUF `gpt2` vocabulary, and the chat template and special tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokens = _field(reader, "tokenizer.ggml.tokens")
    kind = _field(reader, "tokenizer.ggml.model")
    merges = _field(reader, "tokenizer.ggml.merges")
    if kind != "gpt2" or not tokens or not merges:
        raise _bad(path, f"tokenizer.ggml.model is {json.dumps(kind)}; Linnet builds byte-level BPE tokenizers "
                         f"(\"gpt2\", with tokens and merges) from GGUF metadata only")
    alphabet = set(pre_tokenizers.ByteLevel.alphabet())
    spelling = _bytes_to_unicode()
    vocab = {(t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8"))): i
             for i, t in enumerate(tokens)}
    bpe = models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges], fuse_unk=False, byte_fallback=False)
    tokenizer = Tokenizer(bpe)
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    types = _field(reader, "tokenizer.ggml.token_type") or []
    control = [AddedToken(t, normalized=False, special=True) for t, kind in zip(tokens, types)
               if kind == 3 and set(t) <= alphabet]  # 3: CONTROL
    tokenizer.add_special_tokens(control)
    user = [AddedToken(t, normalized=False, special=False) for t, kind in zip(tokens, types) if kind == 4]
    if user:
        tokenizer.add_tokens(user)
    tokenizer_config = {"chat_template": _field(reader, "tokenizer.chat_template"),
                        "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", False))}
    for name, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                      ("pad_token", "padding_token_id"), ("unk_token", "unknown_token_id")):
        index = _field(reader, f"tokenizer.ggml.{key}")
        tokenizer_config[name] = tokens[index] if index is not None and 0 <= index < len(tokens) else None
    return tokenizer.to_str(), tokenizer_config


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (what byte-level BPE vocabularies spell bytes with)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


# -------------------------------------------------------------------------- tensors


def read_tensors(reader, path: Path, config: dict) -> dict[str, np.ndarray]:
    """Every tensor as float32 [Out, In] under its transformers key, Q/K rows unpermuted."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    layers = config["num_hidden_layers"]
    expected = {f"{k}.weight": v for k, v in GLOBAL_TENSORS.items()}
    for i in range(layers):
        expected.update({f"blk.{i}.{k}.weight": f"model.layers.{i}.{v}" for k, v in LAYER_TENSORS.items()})
    present = {t.name: t for t in reader.tensors}
    unknown = sorted(set(present) - set(expected))
    if unknown:
        raise _bad(path, f"it holds tensors the Llama source has no place for: {', '.join(unknown[:6])}"
                         + (f" and {len(unknown) - 6} more" if len(unknown) > 6 else ""),
                   "rope_freqs.weight would mean Llama 3's scaled RoPE, which the source does not compute")
    missing = [name for name in expected if name not in present and name != "output.weight"]
    if missing:
        raise _bad(path, f"it lacks {len(missing)} tensor{'s' if len(missing) > 1 else ''} a {layers}-layer model "
                         f"needs: {', '.join(missing[:6])}" + (f" and {len(missing) - 6} more" if len(missing) > 6 else ""))
    for name, tensor in present.items():
        if tensor.tensor_type.name not in TYPES:
            raise _bad(path, f"tensor {name} is stored as {tensor.tensor_type.name}; Linnet dequantises "
                             f"{', '.join(TYPES)} only")
    out = {}
    for name, tensor in present.items():
        shape = tuple(int(d) for d in reversed(tensor.shape))  # GGUF lists dims innermost first
        if tensor.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            array = np.asarray(tensor.data).astype(np.float32).reshape(shape)
        else:
            array = np.asarray(dequantize(tensor.data, tensor.tensor_type), np.float32).reshape(shape)
        key = expected[name]
        if key.endswith("q_proj"):
            array = unpermute(array, config["num_attention_heads"])
        elif key.endswith("k_proj"):
            array = unpermute(array, config["num_key_value_heads"])
        out[key + ".weight"] = np.ascontiguousarray(array)
    return out


def unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter stores each head's q/k rows as (pair, half) interleaved,
    `w.reshape(heads, 2, Dh / 2, In).swapaxes(1, 2)`; this is its inverse, transformers' order
    (the two RoPE halves of each head one after the other)."""
    rows = weight.shape[0]
    return weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
