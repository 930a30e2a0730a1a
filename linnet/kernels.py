"""The std functions that backends and the optimiser recognise, by their checked keys.

Lowering keeps calls of std functions as calls, so a backend may write one as a fused
kernel of its own (`F.layer_norm`, ONNX's LayerNormalization) instead of its Linnet body,
and `linnet.middle.optimize` finds the Linears and attention calls it rewrites.  Each key is
`<module>::<function>` or `<module>::<Block>.<method>`, as `ir.Function.source` holds it;
they are spelled here once, and tests/test_ops.py checks that each names a function of std/.
"""
from __future__ import annotations

LAYER_NORM = "std.nn.norm::layer_norm"
ATTENTION = "std.nn.attention::attention"
#: `attention` with fewer key/value heads than query heads (a Llama-style decoder's).
GROUPED_ATTENTION = "std.nn.attention::grouped_attention"
#: `attention` with dropout on its probabilities (training); the same kernel with a rate.
ATTENTION_DROPOUT = "std.nn.attention::attention_with_dropout"
#: `attention` under a bidirectional sliding window of a run-time width over a key-padding mask;
#: every backend computes only the band of scores a query can see (docs/backends.md).
WINDOWED_ATTENTION = "std.nn.attention::windowed_attention"
#: std.nn.attention's `OUTSIDE`, the score a key outside the window gets, for the kernels that
#: build the band themselves (tests/test_ops.py checks it against the std source).
WINDOW_OUTSIDE = -65504.0
#: The probabilities `attention` weights the values by (`output_attentions`); no backend fuses
#: it, but `linnet.middle.optimize` folds a scale into its queries as into `attention`'s.
ATTENTION_PROBABILITIES = "std.nn.attention::attention_probabilities"
LINEAR = "std.nn.linear::Linear.forward"
EMBEDDING = "std.nn.embedding::embedding"
#: GELU through erf, as the paper defines it (BERT's `hidden_act = "gelu"`).
GELU_ERF = "std.nn.activations::gelu_erf"
#: The tanh approximation of GELU ("gelu_new"); std calls it plain `gelu`.
GELU_TANH = "std.nn.activations::gelu"
RELU = "std.nn.activations::relu"
SILU = "std.nn.activations::silu"

#: Every key above.
ALL = (LAYER_NORM, ATTENTION, GROUPED_ATTENTION, ATTENTION_DROPOUT, WINDOWED_ATTENTION, ATTENTION_PROBABILITIES,
       LINEAR, EMBEDDING, GELU_ERF, GELU_TANH, RELU, SILU)
