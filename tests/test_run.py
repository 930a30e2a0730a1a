"""`linnet run NAME TEXT...`: what it prints is what the reference libraries compute.

The expected numbers come from sentence-transformers and transformers run on the same files,
never from Linnet itself; the CLI prints two to four decimals, so the bounds are the
printing precision.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from linnet.cli import main

TEXTS = ["A cat sleeps on the sofa.", "A kitten naps on the couch.", "Stocks fell sharply today."]


def _run(capsys, *argv) -> tuple[int, str, str]:
    status = main(["run", *argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_a_sentence_encoder_prints_the_cosine_similarity_matrix(capsys, minilm_checkpoint):
    from sentence_transformers import SentenceTransformer

    status, out, _ = _run(capsys, "all-minilm-l6-v2", *TEXTS)
    assert status == 0 and "similarity" in out.splitlines()[0]
    rows = [line for line in out.splitlines() if re.match(r"\s+\[\d\]", line)]
    printed = np.array([[float(x) for x in re.findall(r"-?\d+\.\d\d", row.split("]", 1)[1])[:3]] for row in rows])
    st = SentenceTransformer(str(minilm_checkpoint), device="cpu")
    vectors = st.encode(TEXTS, convert_to_numpy=True, normalize_embeddings=True)
    expected = vectors @ vectors.T
    assert printed.shape == (3, 3)
    assert np.abs(printed - expected).max() <= 0.005 + 1e-6
    assert [row.rstrip().endswith(text) for row, text in zip(rows, TEXTS)] == [True] * 3


def test_pool_prints_the_norm_of_transformers_pooled_output(capsys, minilm_checkpoint, transformers_minilm):
    import torch
    from transformers import BertTokenizer

    status, out, _ = _run(capsys, "all-minilm-l6-v2", "--task", "pool", *TEXTS[:2])
    assert status == 0
    norms = [float(m) for m in re.findall(r"norm\s+(\d+\.\d{4})", out)]
    tokenizer = BertTokenizer.from_pretrained(str(minilm_checkpoint))
    batch = tokenizer(TEXTS[:2], padding=True, return_tensors="pt")
    with torch.inference_mode():
        pooled = transformers_minilm(**batch).pooler_output.numpy()
    assert norms == pytest.approx(np.linalg.norm(pooled, axis=1), abs=6e-5)


def test_a_task_the_model_cannot_do_is_a_named_error(capsys, minilm_checkpoint):
    status, _, err = _run(capsys, "all-minilm-l6-v2", "--task", "fill-mask", "the [MASK] sat")
    assert status == 1
    assert "E1301" in err and "`mlm`" in err and "forward, hidden_states, pool, embed" in err


def test_generate_on_an_encoder_is_a_named_error(capsys, minilm_checkpoint):
    status, _, err = _run(capsys, "all-minilm-l6-v2", "--task", "generate", "a prompt")
    assert status == 1
    assert "E1301" in err and "`prefill`" in err


def test_a_negative_max_new_tokens_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as caught:
        main(["run", "gpt2", "a prompt", "--max-new-tokens", "-1"])
    assert caught.value.code == 2 and "--max-new-tokens must be at least 0" in capsys.readouterr().err


def test_an_unknown_model_is_a_named_error_not_a_traceback(capsys):
    status, _, err = _run(capsys, "bert-base-uncasd", "hello")
    assert status == 1 and "Traceback" not in err
    assert "bert-base-uncased" in err  # the did-you-mean


def test_no_text_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "all-minilm-l6-v2"])
    assert exit_info.value.code == 2


def test_fill_mask_ranks_candidates_like_transformers(capsys, bert_base_checkpoint):
    """The synthetic checkpoint's weights are random, but its ranking is still a function of
    them: transformers' BertForPreTraining on the same files must rank the same tokens."""
    import torch
    from transformers import BertForPreTraining, BertTokenizer

    text = "the capital of france is [MASK] ."
    status, out, _ = _run(capsys, "bert-base-uncased", "--top", "3", text)
    assert status == 0 and "fill-mask" in out.splitlines()[0]
    printed = [(float(p), token) for p, token in re.findall(r"^\s+(\d\.\d{3})\s+(\S+)$", out, re.M)]
    assert len(printed) == 3

    repo, revision = bert_base_checkpoint.repo, bert_base_checkpoint.revision
    model = BertForPreTraining.from_pretrained(repo, revision=revision).eval()
    tokenizer = BertTokenizer.from_pretrained(repo, revision=revision)
    batch = tokenizer([text], return_tensors="pt")
    position = batch["input_ids"][0].tolist().index(tokenizer.mask_token_id)
    with torch.inference_mode():
        probabilities = model(**batch).prediction_logits[0, position].softmax(-1)
    best = probabilities.topk(3)
    assert [token for _, token in printed] == tokenizer.convert_ids_to_tokens(best.indices.tolist())
    assert [p for p, _ in printed] == pytest.approx(best.values.tolist(), abs=6e-4)


def test_fill_mask_without_a_mask_is_a_named_error(capsys, bert_base_checkpoint):
    status, _, err = _run(capsys, "bert-base-uncased", "--task", "fill-mask", "no mask here")
    assert status == 1 and "E1301" in err and "[MASK]" in err
