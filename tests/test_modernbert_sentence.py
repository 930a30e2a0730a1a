"""ModernBERT embedders as sentence-transformers saved them (gte-modernbert, modernbert-embed).

Both fixtures are written by sentence-transformers' own `save` (fixtures/st_models.py) over one
tiny random `ModernBertModel` saved by `save_pretrained` at test_modernbert.py's config (4
layers, full attention at layers 0 and 3, a window of 2 positions either side in layers 1 and
2) with a byte-level BPE tokenizer, as ModernBERT ships one:

* "gte": Transformer -> Pooling (cls) -> Normalize, as Alibaba-NLP/gte-modernbert-base; its
  config.json says `classifier_pooling = "mean"`, so only reading the Pooling module gives cls.
* "embed": Transformer -> Pooling (mean) -> Normalize with the prompts "search_query: " and
  "search_document: ", as nomic-ai/modernbert-embed-base; stored as a repo of the offline hub
  cache and loaded through `hf:`.

`encode` equals `SentenceTransformer(...).encode` on the same files within 1e-5 on torch and
ONNX Runtime, with and without prompts; texts longer than `max_seq_length` are cut.  JAX is
left out for time (its first trace alone is ~10 s here): the ModernBERT encoder is compared on
JAX and StableHLO in test_modernbert.py, the pooling functions in test_sentence_pipelines.py.  A Pooling mode or an encoder setting the source cannot compute is refused by name.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from fixtures.st_models import StCase, write_bpe_tokenizer, write_st_folder, write_st_repo
from linnet import nest
from linnet.diagnostics import LinnetError
from test_encode import corpus
from test_modernbert import TINY, _config

TOLERANCE = 1e-5
TEXTS = ["A short one.", "Two words", "search_query: already prompted", *corpus()[:6]]
PROMPTS = {"query": "search_query: ", "document": "search_document: "}
#: name -> (the pipeline, the encoder's own classifier_pooling, stored as an hf: repo)
CASES = {
    "gte": (StCase(modes=("cls",), normalize=True, max_seq_length=24), "mean", False),
    "embed": (StCase(modes=("mean",), normalize=True, prompts=PROMPTS, max_seq_length=24), "cls", True),
}
BACKENDS = ("torch", "onnx")
#: encode arguments beyond the defaults.
ARGUMENTS = {"embed": [{"prompt_name": "query"}, {"prompt": PROMPTS["document"]}]}


def modernbert_encoder(classifier_pooling: str):
    """An `encoder=` for write_st_folder: a random tiny ModernBertModel with a BPE tokenizer,
    its norms off 1 and its attention sharp (as test_modernbert.py), so the window, the mask
    and every norm change the vectors."""
    def write(folder, case, seed: int) -> int:
        import torch
        from transformers import ModernBertModel

        tokenizer = write_bpe_tokenizer(folder, corpus())
        ids = {name: tokenizer.token_to_id(f"[{name.upper()}]") for name in ("pad", "cls", "sep")}
        torch.manual_seed(seed)
        config = _config(vocab_size=tokenizer.get_vocab_size(), classifier_pooling=classifier_pooling,
                         pad_token_id=ids["pad"], cls_token_id=ids["cls"], sep_token_id=ids["sep"],
                         bos_token_id=ids["cls"], eos_token_id=ids["sep"])
        model = ModernBertModel(config).eval()
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "norm" in name:
                    param.add_(0.1 * torch.randn_like(param))
                if "Wqkv" in name:
                    param.mul_(10.0)
        model.save_pretrained(folder)
        return TINY["hidden_size"]
    return write


@pytest.fixture(scope="module")
def saved(hf_cache, tmp_path_factory):
    """name -> (what nest.load takes, the folder, sentence-transformers' model of it); one
    seed, so both pipelines pool the same encoder."""
    root = tmp_path_factory.mktemp("modernbert-st")
    made = {}
    for name, (case, pooling, as_repo) in CASES.items():
        encoder = modernbert_encoder(pooling)
        if as_repo:
            repo, reference = write_st_repo(hf_cache, f"linnet-tests/modernbert-st-{name}", case, 0, encoder)
            made[name] = (repo.name, repo.snapshot, reference)
        else:
            reference = write_st_folder(root / name, case, 0, encoder)
            made[name] = (str(root / name), root / name, reference)
    return made


_LOADED: dict[tuple[str, str], object] = {}


def _load(saved, name: str, backend: str):
    if (name, backend) not in _LOADED:
        _LOADED[name, backend] = nest.load(saved[name][0], backend=backend)
    return _LOADED[name, backend]


def _diff(ours, theirs) -> float:
    return float(np.max(np.abs(np.asarray(ours, np.float64) - np.asarray(theirs, np.float64))))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(CASES))
def test_encode_equals_sentence_transformers(saved, name, backend):
    model, reference = _load(saved, name, backend), saved[name][2]
    assert model.manifest.family == "modernbert" and model.manifest.pipeline is not None
    for arguments in [{}, *ARGUMENTS.get(name, [])]:
        ours = model.encode(TEXTS, batch_size=4, **arguments)
        theirs = reference.encode(TEXTS, batch_size=4, **arguments)
        assert ours.shape == theirs.shape == (len(TEXTS), TINY["hidden_size"]) and ours.dtype == np.float32
        diff = _diff(ours, theirs)
        print(f"modernbert pipeline {name} {backend} {arguments}: max |diff| {diff:.2e}")  # shown with -s
        assert diff <= TOLERANCE, (name, backend, arguments)


def test_the_fixtures_tell_pooling_prompts_and_length_apart(saved):
    """What the parity above must get right to pass: over one encoder, cls and mean pooling
    differ, a prompt changes the vectors, and some texts are longer than max_seq_length."""
    gte, embed = saved["gte"][2], saved["embed"][2]
    assert _diff(gte.encode(TEXTS), embed.encode(TEXTS)) > 1e-2
    assert _diff(embed.encode(TEXTS, prompt_name="query"), embed.encode(TEXTS)) > 1e-2
    model = _load(saved, "gte", "torch")
    assert model.tokenizer.max_length == 24 == gte.max_seq_length
    assert max(len(model.tokenizer.backend.encode(text).ids) for text in TEXTS) > 24


def _edited(saved, tmp_path, file: str, change) -> str:
    folder = tmp_path / "model"
    shutil.copytree(saved["gte"][1], folder)
    path = folder / file
    path.write_text(json.dumps(change(json.loads(path.read_text()))))
    return str(folder)


REFUSALS = {
    # A pooling sentence-transformers might add later: refused by the Pooling reader, as for BERT.
    "pooling mode": ("1_Pooling/config.json", lambda c: {**c, "pooling_mode": "attention"}, "E1111",
                     "asks for pooling mode 'attention'"),
    # An encoder the ModernBERT source cannot express: refused from its config.json.
    "layer pattern": ("config.json", lambda c: {**c, "layer_types": ["sliding_attention"] * 4}, "E1106",
                      "full attention at layers []"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_what_cannot_be_computed_is_refused(saved, tmp_path, case):
    file, change, code, message = REFUSALS[case]
    with pytest.raises(LinnetError) as caught:
        nest.load(_edited(saved, tmp_path, file, change), backend="torch")
    assert caught.value.code == code, caught.value.render()
    assert message in caught.value.render() and file in caught.value.render()
