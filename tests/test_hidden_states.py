"""The `hidden_states` entry: every layer's output, as transformers' `output_hidden_states`.

The entry stacks the embeddings' output and each encoder layer's output batch first,
[B, Layers + 1, S, D]; the reference is transformers' tuple of Layers + 1 [B, S, D]
tensors from `BertModel(..., output_hidden_states=True)` on the same checkpoint.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fixtures.parity import max_diff, random_inputs
from linnet import nest


def _np(x) -> np.ndarray:
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def _padded_batch(seed: int = 2):
    """Three sequences of lengths 9, 4 and 1, right-padded to 9."""
    tokens, types = random_inputs(3, 9, seed=seed)
    mask = np.ones_like(tokens)
    for row, length in enumerate((9, 4, 1)):
        mask[row, length:] = 0
        tokens[row, length:] = 0
    return tokens, types, mask


def _reference(model, tokens, types, mask) -> np.ndarray:
    with torch.inference_mode():
        out = model(input_ids=torch.from_numpy(tokens).long(), token_type_ids=torch.from_numpy(types).long(),
                    attention_mask=torch.from_numpy(mask).long(), output_hidden_states=True)
    return torch.stack(out.hidden_states, dim=1).numpy()


def _real_positions(states: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """[B, L, S, D] -> the vectors of real tokens only, [N, L, D]."""
    return np.stack([states[b, :, s] for b, s in zip(*np.nonzero(mask))])


@pytest.mark.parametrize("backend", ["torch", "jax", "onnx"])
def test_minilm_hidden_states_match_transformers(backend, minilm_checkpoint, transformers_minilm):
    # torch with torch's own matmul, as transformers runs it, so the two are bit-identical.
    model = nest.load("all-minilm-l6-v2", backend=backend, **({"kernels": "default"} if backend == "torch" else {}))
    tokens, types, mask = _padded_batch()
    ours = _np(model.hidden_states(tokens, types, attention_mask=mask))
    expected = _reference(transformers_minilm, tokens, types, mask)
    assert ours.shape == expected.shape == (3, 7, 9, 384)
    diff = max_diff(_real_positions(ours, mask), _real_positions(expected, mask))
    print(f"minilm hidden_states {backend}: {diff:.3g}")
    assert diff <= (0 if backend == "torch" else 1e-5)
    # The last state is the forward entry's result, to the bit.
    np.testing.assert_array_equal(ours[:, -1], _np(model(tokens, types, attention_mask=mask)))


def test_bert_base_hidden_states_match_transformers(bert_base_checkpoint, transformers_bert_base):
    model = nest.load("bert-base-uncased", backend="torch")
    tokens, types = random_inputs(2, 16, seed=4)
    ours = _np(model.hidden_states(tokens, types))
    expected = _reference(transformers_bert_base, tokens, types, np.ones_like(tokens))
    assert ours.shape == (2, 13, 16, 768)
    diff = max_diff(ours, expected)
    print(f"bert-base hidden_states torch: {diff:.3g}")
    assert diff <= 1e-5
