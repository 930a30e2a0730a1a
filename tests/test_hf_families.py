"""GPT-2 and ViT checkpoints through `hf:` and folders (linnet/nest/families/gpt2.py, vit.py).

Each model is written by transformers' own `save_pretrained` (tests/fixtures/hf_families.py:
small random configs, every parameter moved off its initial value), once into the offline
test hub cache and once as a plain folder.  Each model runs on torch, ONNX, JAX and StableHLO,
from the hub on two of them and from its folder on the other two (PARITY), so every model is
read both ways, every backend reads both ways, and no model is loaded twice for one backend:

* GPT2LMHeadModel, GPT2Model (an explicit `n_inner`, a tokenizer.json) and a distilgpt2-shaped
  6-layer one: logits within 1e-5 of transformers' on a left-padded batch at the real positions
  (transformers given the positions its generate uses), GPT2Model's hidden state too;
* ViTForImageClassification: logits on a random image batch within 1e-5;
* greedy `generate` token-identical to transformers' `generate(do_sample=False)`, stopping at
  config.json's `eos_token_id` (chosen so that a row does end early) and padding with it;
* a non-default LayerNorm epsilon gives transformers' outputs (and a large one shows it is
  not the default under another name);
* what the sources cannot compute is refused by name, with its code.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fixtures.gpt2 import END_OF_TEXT, train_byte_bpe
from fixtures.hf_checkpoints import state_arrays, write_raw_repo
from fixtures.hf_families import (
    DISTILGPT2_TINY,
    GPT2_TINY,
    VIT_LABELS,
    VIT_TINY,
    gpt2_model,
    save_both,
    vit_model,
    vit_processor,
)
from fixtures.parity import max_diff
from linnet import nest
from linnet.diagnostics import LinnetError
from linnet.nest.families import FAMILIES

TOLERANCE = 1e-5
BACKENDS = ["torch", "onnx", "jax", "stablehlo"]
WHERE = ["hub", "folder"]
GPT2_MODELS = ("lm", "bare", "distil")
#: GPT2Model's repo ships a byte-level BPE tokenizer of this many ids (256 bytes, the end of
#: text as id 0, merges), which is its vocab_size.
BPE_VOCAB = 300
#: The left-padded prompt `generate` is compared on (and the fixture picks the eos from).
PROMPT_LENGTHS, PROMPT_SEED, NEW_TOKENS = (6, 3, 1), 6, 12


def raises(code: str, call, *args, **kwargs) -> str:
    with pytest.raises(LinnetError) as caught:
        call(*args, **kwargs)
    assert caught.value.code == code, caught.value.render()
    return caught.value.render()


def left_padded(lengths, seed: int, vocab: int, pad: int):
    """Random ids (never `pad`) left-padded with `pad`, the mask, and the positions transformers'
    generate gives them (a running count of real tokens), as in tests/test_gpt2.py."""
    rng = np.random.default_rng(seed)
    width = max(lengths)
    tokens = rng.integers(0, vocab - 1, (len(lengths), width))
    tokens[tokens >= pad] += 1
    mask = np.zeros((len(lengths), width), np.int64)
    for row, n in enumerate(lengths):
        mask[row, width - n:] = 1
    tokens[mask == 0] = pad
    return tokens, mask, np.maximum(np.cumsum(mask, 1) - 1, 0)


def transformers_greedy(model, tokens, mask, new: int, eos: int | None) -> np.ndarray:
    with torch.no_grad():
        return model.generate(torch.tensor(tokens), attention_mask=torch.tensor(mask), max_new_tokens=new,
                              do_sample=False, eos_token_id=eos, pad_token_id=eos if eos is not None else 0).numpy()


def _lm_with_an_early_eos():
    """GPT2LMHeadModel whose config.json `eos_token_id` is a token transformers' greedy search
    gives the first prompt row after some other tokens, preferably one the other rows never
    give: that row then ends early while the others run on, so the stop is tested."""
    model = gpt2_model("GPT2LMHeadModel", seed=2)
    tokens, mask, _ = left_padded(PROMPT_LENGTHS, PROMPT_SEED, GPT2_TINY["vocab_size"], GPT2_TINY["eos_token_id"])
    model.generation_config.eos_token_id = None
    trial = transformers_greedy(model, tokens, mask, NEW_TOKENS, None)[:, tokens.shape[1]:]
    first, others = trial[0], set(trial[1:].ravel().tolist())
    later = [int(t) for i, t in enumerate(first[:-1]) if i > 0 and t not in first[:i]]
    assert later, f"the trial continuation {first.tolist()} repeats one token; pick another seed"
    eos = next((t for t in later if t not in others), later[0])
    for settings in (model.config, model.generation_config):
        settings.eos_token_id = settings.pad_token_id = eos
    return model


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    return train_byte_bpe(tmp_path_factory.mktemp("bpe"), BPE_VOCAB) / "tokenizer.json"


@pytest.fixture(scope="module")
def saved(hf_cache, tmp_path_factory, bpe):
    """The four models, each saved once into the hub cache and once as a folder."""
    def save(name, model, *extra, **options):
        return save_both(hf_cache, tmp_path_factory.mktemp(name), f"linnet-tests/families-{name}", model, *extra,
                         tag=name, **options)

    from tokenizers import Tokenizer

    assert Tokenizer.from_file(str(bpe)).get_vocab_size() == BPE_VOCAB
    bare = gpt2_model("GPT2Model", seed=5, vocab_size=BPE_VOCAB, n_inner=80, bos_token_id=0, eos_token_id=0)
    return {
        "lm": save("lm", _lm_with_an_early_eos()),
        "bare": save("bare", bare, files={"tokenizer.json": bpe.read_bytes()}),
        "distil": save("distil", gpt2_model("GPT2LMHeadModel", seed=3, **DISTILGPT2_TINY)),
        "vit": save("vit", vit_model(seed=4), vit_processor(VIT_TINY["image_size"])),
    }


@pytest.fixture(scope="module")
def loaded(saved):
    """`loaded(name, where, backend)`: each model loaded once per source and backend."""
    models = {}

    def load(name, where, backend):
        key = (name, where, backend)
        if key not in models:
            models[key] = nest.load(saved[name].source(where), backend=backend)
        return models[key]

    return load


# --------------------------------------------------------------------------- parity


def gpt2_pairs(name: str, model, reference) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(ours, transformers') at the real positions of a left-padded batch."""
    vocab, pad = reference.config.vocab_size, reference.config.eos_token_id
    tokens, mask, positions = left_padded([9, 5, 2], seed=3, vocab=vocab, pad=pad)
    real = mask.astype(bool)
    with torch.no_grad():
        out = reference(torch.tensor(tokens), attention_mask=torch.tensor(mask), position_ids=torch.tensor(positions))
    logits = np.asarray(model(tokens, attention_mask=mask))
    if name != "bare":
        return {"logits": (logits[real], out.logits.numpy()[real])}
    # GPT2Model has no head: the source's is the tied one, scores against wte.
    hidden = out.last_hidden_state
    with torch.no_grad():
        tied = (hidden @ reference.wte.weight.T).numpy()
    last = np.asarray(model.hidden_states(tokens, attention_mask=mask))[:, -1]
    return {"logits": (logits[real], tied[real]), "hidden": (last[real], hidden.numpy()[real])}


def vit_pairs(model, reference) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    images = np.random.default_rng(5).uniform(-1, 1, (3, 3, VIT_TINY["image_size"], VIT_TINY["image_size"]))
    images = images.astype(np.float32)
    with torch.no_grad():
        logits = reference(pixel_values=torch.from_numpy(images)).logits.numpy()
    return {"logits": (np.asarray(model(images)), logits)}


#: (model, source, backend): each model on every backend, from the hub on two backends and from
#: its folder on the other two, the pairs shifted from model to model, so that every backend
#: also reads both sources (each from two models).  Both sources build the same program; what
#: differs is how the manifest finds the files, which every one of these loads checks.
PARITY = [(name, where, backend)
          for i, name in enumerate(GPT2_MODELS + ("vit",))
          for j, backend in enumerate(BACKENDS)
          for where in [WHERE[(i + j // 2) % 2]]]


@pytest.mark.parametrize("name, where, backend", PARITY, ids=["-".join(case) for case in PARITY])
def test_outputs_match_transformers(saved, loaded, name, where, backend):
    model, reference = loaded(name, where, backend), saved[name].model
    family = "vit" if name == "vit" else "gpt2"
    assert model.manifest.family == family and model.manifest.source.zoo == FAMILIES[family].source_entry
    pairs = vit_pairs(model, reference) if name == "vit" else gpt2_pairs(name, model, reference)
    for output, (ours, theirs) in pairs.items():
        assert ours.shape == theirs.shape, output
        diff = max_diff(ours, theirs)
        print(f"hf families {name} {output} {where} {backend}: max |diff| {diff:.2e}")  # shown with -s
        assert diff <= TOLERANCE, f"{name} {output} from {where} on {backend}: max |diff| {diff:.3g}"


def test_config_fields_become_the_generics(loaded):
    distil = loaded("distil", "hub", "torch").manifest
    assert distil.generics == {"Vocab": 97, "MaxPositions": 32, "D": 32, "Heads": 4, "Inner": 128, "Layers": 6,
                               "Eps": 1e-5, "T": "f32"}
    assert distil.source.root == "Model" and distil.architecture == "GPT2LMHeadModel"
    assert distil.check == {"B": 1, "S": 8, "P": 8}
    bare = loaded("bare", "folder", "torch")
    assert bare.manifest.generics["Inner"] == 80 and bare.manifest.architecture == "GPT2Model"
    vit = loaded("vit", "hub", "torch").manifest
    assert vit.generics == {"Image": 32, "Patch": 8, "Channels": 3, "D": 32, "Heads": 4, "Inner": 64, "Layers": 2,
                            "Labels": 3, "Eps": 1e-12, "T": "f32"}
    assert vit.source.root == "ImageClassification" and vit.check == {"B": 1, "H": 32, "W": 32}


def test_gpt2_keys_are_found_under_either_prefix(loaded):
    """GPT2LMHeadModel stores `transformer.h.0...`, GPT2Model `h.0...`: both bind every param."""
    lm, bare = loaded("lm", "hub", "torch"), loaded("bare", "hub", "torch")
    assert lm.info.report.bound["h.1.attn.c_attn.weight"].key == "transformer.h.1.attn.c_attn.weight"
    assert bare.info.report.bound["h.1.attn.c_attn.weight"].key == "h.1.attn.c_attn.weight"
    assert lm.info.report.unused_keys == [] and bare.info.report.unused_keys == []


# --------------------------------------------------------------------------- generate, tokenizer, images


@pytest.mark.parametrize("where", WHERE)
def test_greedy_generate_is_token_identical_to_transformers(saved, loaded, where):
    """Ours stops at config.json's eos_token_id without being told it; transformers is given the
    same id, read back from the same config, to stop at and pad with."""
    reference = saved["lm"].model
    eos = reference.config.eos_token_id
    model = loaded("lm", where, "torch")
    assert model.manifest.generation.eos_token_id == eos
    tokens, mask, _ = left_padded(PROMPT_LENGTHS, PROMPT_SEED, GPT2_TINY["vocab_size"], GPT2_TINY["eos_token_id"])
    theirs = transformers_greedy(reference, tokens, mask, NEW_TOKENS, eos)
    ours = np.asarray(model.generate(tokens, NEW_TOKENS, attention_mask=mask))
    np.testing.assert_array_equal(ours, theirs)
    first = ours[0, tokens.shape[1]:].tolist()
    ended = first.index(eos) if eos in first else None
    assert ended and ended < NEW_TOKENS - 1 and set(first[ended:]) == {eos}, \
        f"the first row should end early and be padded with {eos}: {first}"


def test_the_tokenizer_is_the_repos_padding_left_with_the_end_of_text(saved, loaded, bpe):
    from transformers import GPT2TokenizerFast

    texts = ["Return a new list.", "Open the file, then close it.", "x"]  # within n_positions = 32 tokens
    reference = GPT2TokenizerFast(tokenizer_file=str(bpe), pad_token=END_OF_TEXT, padding_side="left")
    expected = reference(texts, padding=True)
    for where in WHERE:
        model = loaded("bare", where, "torch")
        assert model.manifest.tokenizer.padding_side == "left"
        batch = model.tokenizer(texts)
        assert batch["tokens"].tolist() == expected["input_ids"], where
        assert batch["attention_mask"].tolist() == expected["attention_mask"], where
        assert batch["tokens"][2, 0] == 0  # padded before the text, with <|endoftext|>


def test_vit_labels_and_preprocessing_come_from_the_repo(saved, loaded):
    rng = np.random.default_rng(9)
    pictures = [rng.integers(0, 256, (40, 52, 3), dtype=np.uint8), rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)]
    processor = vit_processor(VIT_TINY["image_size"])
    expected = processor(images=pictures, return_tensors="np")["pixel_values"]
    for where in WHERE:
        model = loaded("vit", where, "torch")
        assert model.labels == VIT_LABELS
        assert model.manifest.image.preprocessor == "preprocessor_config.json"
        assert max_diff(model.preprocess(pictures), expected) <= 1e-5, where


# --------------------------------------------------------------------------- LayerNorm epsilon


EPSILONS = (1e-6, 5e-2)


@pytest.mark.parametrize("eps", EPSILONS)
@pytest.mark.parametrize("family", ["gpt2", "vit"])
def test_a_configured_layer_norm_epsilon_gives_transformers_outputs(hf_cache, tmp_path, family, eps):
    """`layer_norm_epsilon` / `layer_norm_eps` is the root's `Eps`: the outputs are transformers'
    with it, and at 5e-2 they are not those of the same weights at the default epsilon."""
    if family == "gpt2":
        reference, field, default = gpt2_model("GPT2LMHeadModel", seed=7, layer_norm_epsilon=eps), \
            "layer_norm_epsilon", gpt2_model("GPT2LMHeadModel", seed=7)
    else:
        reference, field, default = vit_model(seed=7, layer_norm_eps=eps), "layer_norm_eps", vit_model(seed=7)
    default.load_state_dict(reference.state_dict())
    written = save_both(hf_cache, tmp_path, f"linnet-tests/families-{family}-eps-{eps:g}", reference, tag=str(eps))
    model = nest.load(written.source("hub"), backend="torch")
    assert model.manifest.generics["Eps"] == eps
    pairs = vit_pairs(model, reference) if family == "vit" else gpt2_pairs("lm", model, reference)
    (ours, theirs), = pairs.values()
    assert max_diff(ours, theirs) <= TOLERANCE, field
    if eps == EPSILONS[-1]:
        (_, at_default), = (vit_pairs(model, default) if family == "vit" else gpt2_pairs("lm", model, default)).values()
        assert max_diff(ours, at_default) > 1e-3


# --------------------------------------------------------------------------- refusals


def gpt2_config(architecture: str = "GPT2LMHeadModel", **overrides) -> dict:
    from transformers import GPT2Config

    config = GPT2Config(**GPT2_TINY).to_dict()
    config.update(architectures=[architecture], **overrides)
    return config


def vit_config(architecture: str = "ViTForImageClassification", **overrides) -> dict:
    from transformers import ViTConfig

    config = ViTConfig(**VIT_TINY).to_dict()
    config.update(architectures=[architecture], **overrides)
    return config


def config_only(hf_cache, name: str, config: dict):
    """A repo with only config.json: its problems are found before any checkpoint is read."""
    return write_raw_repo(hf_cache, f"linnet-tests/families-{name}", config).name


REFUSALS = [
    ("activation", gpt2_config(activation_function="relu"), "E1106",
     'sets activation_function = "relu"; the GPT-2 source (GELU\'s tanh approximation) computes '
     '"gelu_new", "gelu_pytorch_tanh" only'),
    ("inverse-layer-idx", gpt2_config(scale_attn_by_inverse_layer_idx=True), "E1106",
     "sets scale_attn_by_inverse_layer_idx = true"),
    ("upcast", gpt2_config(reorder_and_upcast_attn=True), "E1106", "sets reorder_and_upcast_attn = true"),
    ("unscaled", gpt2_config(scale_attn_weights=False), "E1106", "sets scale_attn_weights = false"),
    ("cross-attention", gpt2_config(add_cross_attention=True), "E1106",
     "sets add_cross_attention = true (cross-attention layers)"),
    ("heads", gpt2_config(n_head=5), "E1106", "n_embd 32, which 5 attention heads cannot share equally"),
    ("untied", gpt2_config(tie_word_embeddings=False), "E1108", "sets tie_word_embeddings = false"),
    ("n-inner", gpt2_config(n_inner="wide"), "E1103", "`n_inner` must be a positive integer"),
    ("eps-zero", gpt2_config(layer_norm_epsilon=0.0), "E1103", "`layer_norm_epsilon` must be a positive number"),
    ("eos", gpt2_config(eos_token_id=97), "E1103", "`eos_token_id` must be one token id (0 <= id < vocab_size = 97)"),
    ("vit-activation", vit_config(hidden_act="gelu_new"), "E1106",
     'sets hidden_act = "gelu_new"; the ViT source (exact GELU) computes "gelu" only'),
    ("vit-patches", vit_config(image_size=30), "E1106",
     "has image_size 30, which patches of 8 do not tile (image_size must be a multiple of patch_size"),
    ("vit-oblong", vit_config(image_size=[32, 48]), "E1106",
     "sets image_size = [32, 48] ([height, width]); the ViT source takes square sizes only"),
    ("vit-qkv-bias", vit_config(qkv_bias=False), "E1106", "sets qkv_bias = false"),
    ("vit-heads", vit_config(num_attention_heads=3), "E1106",
     "hidden_size 32, which 3 attention heads cannot share equally"),
]


@pytest.mark.parametrize("case, config, code, says", REFUSALS, ids=[case for case, *_ in REFUSALS])
def test_what_the_sources_cannot_compute_is_refused_by_name(hf_cache, case, config, code, says):
    text = raises(code, nest.load, config_only(hf_cache, f"refused-{case}", config))
    assert says in text and "config.json" in text


def test_every_problem_in_one_config_is_reported_at_once(hf_cache):
    name = config_only(hf_cache, "several", gpt2_config(activation_function="gelu_fast", n_layer=0,
                                                        add_cross_attention=True))
    with pytest.raises(LinnetError) as caught:
        nest.load(name)
    messages = [(d.code, d.message) for d in caught.value.diagnostics]
    assert any(code == "E1103" and "`n_layer` must be a positive integer" in m for code, m in messages)
    assert any(code == "E1106" and 'activation_function = "gelu_fast"' in m for code, m in messages)
    assert any(code == "E1106" and "add_cross_attention = true" in m for code, m in messages)


@pytest.mark.parametrize("config, says", [
    (gpt2_config("GPT2ForSequenceClassification"),
     'names architecture "GPT2ForSequenceClassification", which hf: cannot build'),
    (vit_config("ViTModel"), 'names architecture "ViTModel", which hf: cannot build'),
], ids=["gpt2", "vit"])
def test_an_architecture_the_family_does_not_build_is_refused(hf_cache, config, says):
    family = FAMILIES[config["model_type"]]
    text = raises("E1105", nest.load, config_only(hf_cache, f"arch-{config['architectures'][0].lower()}", config))
    assert says in text
    assert f"supported {family.title} architectures: {', '.join(family.architectures)}" in text


def _with_lm_head(hf_cache, name: str, shift: float):
    """A tied GPT2LMHeadModel's tensors plus a stored `lm_head.weight` = wte + shift."""
    model = gpt2_model("GPT2LMHeadModel", seed=8)
    arrays = state_arrays(model)  # the tied head is stored once, as transformer.wte.weight
    assert "lm_head.weight" not in arrays
    arrays["lm_head.weight"] = arrays["transformer.wte.weight"] + np.float32(shift)
    return model, write_raw_repo(hf_cache, f"linnet-tests/families-{name}", gpt2_config(), arrays).name


def test_a_stored_lm_head_that_differs_from_wte_is_refused(hf_cache):
    _, name = _with_lm_head(hf_cache, "untied-head", 0.5)
    text = raises("E1108", nest.load, name)
    assert "the checkpoint's lm_head.weight differs from its embeddings transformer.wte.weight" in text


def test_a_stored_lm_head_equal_to_wte_is_bound_once(hf_cache):
    model, name = _with_lm_head(hf_cache, "tied-head", 0.0)
    loaded = nest.load(name, backend="torch")
    assert "lm_head.weight" in loaded.info.report.unused_keys
    (ours, theirs), = gpt2_pairs("lm", loaded, model).values()
    assert max_diff(ours, theirs) <= TOLERANCE
