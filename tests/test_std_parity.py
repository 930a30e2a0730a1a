"""Parity of std.nn's blocks against torch's own functions (issue 26, item 2).

One tiny package uses each block in an entry; every row runs it on torch and on ONNX
Runtime (and JAX) and compares with the torch reference at 1e-5. The max|diff| printed here
is what docs/std.md's parity table reports (run with `-s` to see it).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

D, INNER, HEADS, HALF, WINDOW = 8, 12, 2, 2, 2
DH = 2 * HALF

SOURCE = """\
module parity

use std.nn.attention::{attention, grouped_attention, merge_heads, split_heads, windowed_attention}
use std.nn.masks::{causal_mask, padding_mask, positions, sliding_window_mask}
use std.nn.mlp::{GatedMlp}
use std.nn.norm::{LayerNorm, RMSNorm}
use std.nn.pooling::{ClsOrMean}
use std.nn.rotary::{RotaryEmbedding, rope_half, rope_interleaved}

pub block Parity<D: Dim, Inner: Dim, Heads: Dim, Half: Dim, Window: Dim, T: Float = f32, Eps: Real = 0.00001>
where Heads > 0, D % Heads == 0 {
    sub ln: LayerNorm<D, T, Eps>
    sub rms: RMSNorm<D, T, Eps>
    sub swiglu: GatedMlp<D, Inner, T, silu>
    sub geglu: GatedMlp<D, Inner, T, gelu_erf>
    sub cls_pool: ClsOrMean<D, T, 0>
    sub mean_pool: ClsOrMean<D, T, 1>
    sub rope: RotaryEmbedding<16, T, 1000000.0>

    pub entry layer_norm<B: Dim, S: Dim>(x: Tensor[B, S, D; T]) -> Tensor[B, S, D; T] {
        return ln.forward(x)
    }

    pub entry rms_norm<B: Dim, S: Dim>(x: Tensor[B, S, D; T]) -> Tensor[B, S, D; T] {
        return rms.forward(x)
    }

    pub entry swiglu_mlp<B: Dim, S: Dim>(x: Tensor[B, S, D; T]) -> Tensor[B, S, D; T] {
        return swiglu.forward(x)
    }

    pub entry geglu_mlp<B: Dim, S: Dim>(x: Tensor[B, S, D; T]) -> Tensor[B, S, D; T] {
        return geglu.forward(x)
    }

    pub entry rotary_half<B: Dim, S: Dim>(
        x: Tensor[B, Heads, S, 2 * Half; T],
        cos: Tensor[B, S, 2 * Half; T],
        sin: Tensor[B, S, 2 * Half; T],
    ) -> Tensor[B, Heads, S, 2 * Half; T] {
        return rope_half<B, Heads, S, Half, T>(x, cos, sin)
    }

    pub entry rotary_interleaved<B: Dim, S: Dim>(
        x: Tensor[B, Heads, S, 2 * Half; T],
        cos: Tensor[B, S, Half; T],
        sin: Tensor[B, S, Half; T],
    ) -> Tensor[B, Heads, S, 2 * Half; T] {
        return rope_interleaved<B, Heads, S, Half, T>(x, cos, sin)
    }

    // Self-attention of x [B, S, D] split into heads, under each kind of mask.
    pub entry causal<B: Dim, S: Dim>(x: Tensor[B, S, D; T], attention_mask: Tensor[B, S; i32]) -> Tensor[B, S, D; T] {
        let h = split_heads<B, S, Heads, D / Heads, T>(x)
        let mask = causal_mask<B, S, T>(attention_mask)
        return merge_heads(attention(h, h * 0.5, h + 1.0, rsqrt(cast<f32>(D / Heads)), some(mask)))
    }

    pub entry windowed<B: Dim, S: Dim>(x: Tensor[B, S, D; T], attention_mask: Tensor[B, S; i32]) -> Tensor[B, S, D; T] {
        let h = split_heads<B, S, Heads, D / Heads, T>(x)
        let mask = sliding_window_mask<B, S, Window, T>(attention_mask)
        return merge_heads(attention(h, h * 0.5, h + 1.0, rsqrt(cast<f32>(D / Heads)), some(mask)))
    }

    // A bidirectional window of `Window` keys either side, given as a value, over key padding.
    pub entry bidirectional<B: Dim, S: Dim>(x: Tensor[B, S, D; T], attention_mask: Tensor[B, S; i32]) -> Tensor[B, S, D; T] {
        let h = split_heads<B, S, Heads, D / Heads, T>(x)
        let mask = padding_mask<B, S, T>(attention_mask)
        return merge_heads(windowed_attention(h, h * 0.5, h + 1.0, rsqrt(cast<f32>(D / Heads)), mask,
                                              cast<i32>(Window)))
    }

    // The same with the window given at run time: a value no backend knows when it compiles.
    pub entry bidirectional_at<B: Dim, S: Dim>(x: Tensor[B, S, D; T], attention_mask: Tensor[B, S; i32],
                                               window: Tensor[; i32]) -> Tensor[B, S, D; T] {
        let h = split_heads<B, S, Heads, D / Heads, T>(x)
        let mask = padding_mask<B, S, T>(attention_mask)
        return merge_heads(windowed_attention(h, h * 0.5, h + 1.0, rsqrt(cast<f32>(D / Heads)), mask, window))
    }

    pub entry padded<B: Dim, S: Dim>(x: Tensor[B, S, D; T], attention_mask: Tensor[B, S; i32]) -> Tensor[B, S, D; T] {
        let h = split_heads<B, S, Heads, D / Heads, T>(x)
        let mask = padding_mask<B, S, T>(attention_mask)
        return merge_heads(attention(h, h * 0.5, h + 1.0, rsqrt(cast<f32>(D / Heads)), some(mask)))
    }

    // Two query heads per key/value head.
    pub entry grouped<B: Dim, S: Dim>(
        q: Tensor[B, Heads * 2, S, Half; T],
        k: Tensor[B, Heads, S, Half; T],
        v: Tensor[B, Heads, S, Half; T],
        attention_mask: Tensor[B, S; i32],
    ) -> Tensor[B, Heads * 2, S, Half; T] {
        let mask = causal_mask<B, S, T>(attention_mask)
        return grouped_attention<B, Heads, 2, S, S, Half, T>(q, k, v, rsqrt(cast<f32>(Half)), mask)
    }

    // transformers' `classifier_pooling`: "cls" (Mean = 0) and "mean" (Mean = 1).
    pub entry pool_cls<B: Dim, S: Dim>(x: Tensor[B, S, D; T], attention_mask: Tensor[B, S; i32]) -> Tensor[B, D; T] {
        return cls_pool.forward(x, attention_mask)
    }

    pub entry pool_mean<B: Dim, S: Dim>(x: Tensor[B, S, D; T], attention_mask: Tensor[B, S; i32]) -> Tensor[B, D; T] {
        return mean_pool.forward(x, attention_mask)
    }

    pub entry rotary_angles<B: Dim, S: Dim>(positions: Tensor[B, S; i32]) -> Tensor[B, S, 32; T] {
        return rope.angles(positions)
    }

    pub entry position_ids<B: Dim, S: Dim>(attention_mask: Tensor[B, S; i32]) -> Tensor[B, S; i32] {
        return positions(attention_mask)
    }
}
"""

MANIFEST = """\
[model]
name = "parity"
title = "std.nn parity block"
summary = "Each std.nn block in one entry."
license = "MIT"
family = "test"

[source]
path = "src/lib.linnet"
root = "Parity"
entry = "layer_norm"

[generics]
D = {D}
Inner = {INNER}
Heads = {HEADS}
Half = {HALF}
Window = {WINDOW}
T = "f32"

[check]
B = 2
S = 5

[weights]
repo = "linnet/parity"
revision = "{revision}"
files = ["model.safetensors"]
bindings = "bindings.json"
"""

RNG = np.random.default_rng(26)
PARAMS = {
    "ln.weight": RNG.standard_normal(D), "ln.bias": RNG.standard_normal(D), "rms.weight": RNG.standard_normal(D),
    **{f"{mlp}.{proj}.weight": RNG.standard_normal(shape) * 0.5
       for mlp in ("swiglu", "geglu")
       for proj, shape in (("gate_proj", (INNER, D)), ("up_proj", (INNER, D)), ("down_proj", (D, INNER)))},
}
PARAMS = {name: value.astype(np.float32) for name, value in PARAMS.items()}
B, S = 2, 5
X = RNG.standard_normal((B, S, D)).astype(np.float32) * 2.0 + 0.5
MASK = np.array([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1]], np.int32)  # right- and left-padded
# Causal rows: right padding only, so every query keeps a key (a query with none is NaN in
# torch's boolean-mask sdpa and uniform under an additive mask).
RIGHT = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], np.int32)


@pytest.fixture(scope="module")
def entry(tmp_path_factory):
    from safetensors.numpy import save_file

    folder = tmp_path_factory.mktemp("parity") / "parity"
    (folder / "src").mkdir(parents=True)
    (folder / "src" / "lib.linnet").write_text(SOURCE, encoding="utf-8")
    (folder / "nest.toml").write_text(MANIFEST.format(D=D, INNER=INNER, HEADS=HEADS, HALF=HALF, WINDOW=WINDOW,
                                                      revision="0" * 40), encoding="utf-8")
    (folder / "linnet.toml").write_text('[package]\nname = "parity"\nversion = "0.1.0"\nlanguage = "0.1"\n')
    (folder / "bindings.json").write_text(json.dumps({name: f"ckpt.{name}" for name in PARAMS}))
    weights = folder.parent / "model.safetensors"
    save_file({f"ckpt.{name}": value for name, value in PARAMS.items()}, str(weights))
    return folder, weights


def _t(name: str):
    return torch.from_numpy(PARAMS[name])


def _gated(mlp: str, act, x):
    gate, up, down = (_t(f"{mlp}.{p}.weight") for p in ("gate_proj", "up_proj", "down_proj"))
    return F.linear(act(F.linear(x, gate)) * F.linear(x, up), down)


def _rotate_half(x):  # transformers' Llama `rotate_half`
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def _angles(width: int):
    position = torch.arange(S, dtype=torch.float32)[None, :] + torch.tensor([0.0, 3.0])[:, None]  # [B, S], row 1 offset
    freq = 1.0 / (10000.0 ** (torch.arange(0, width, dtype=torch.float32) / width))
    return position[..., None] * freq  # [B, S, width]


def _heads(x):
    return x.reshape(B, S, HEADS, D // HEADS).permute(0, 2, 1, 3)


def _merged(x):
    return x.permute(0, 2, 1, 3).reshape(B, S, D)


def _sdpa(x, **kw):
    h = _heads(x)
    return _merged(F.scaled_dot_product_attention(h, h * 0.5, h + 1.0, **kw))


XH = RNG.standard_normal((B, HEADS, S, DH)).astype(np.float32)
ANG_HALF = _angles(HALF)
COS_H, SIN_H = torch.cat([ANG_HALF, ANG_HALF], -1).cos(), torch.cat([ANG_HALF, ANG_HALF], -1).sin()
COS_I, SIN_I = ANG_HALF.cos(), ANG_HALF.sin()


def _interleaved_reference(x, cos, sin):  # GPT-J / RoFormer: rotate neighbouring pairs
    even, odd = x[..., 0::2], x[..., 1::2]
    c, s = cos[:, None], sin[:, None]
    return torch.stack([even * c - odd * s, odd * c + even * s], dim=-1).flatten(-2)


def _keys(mask):  # [B, 1, 1, S]: True over real keys
    return torch.from_numpy(mask != 0)[:, None, None, :]


def _window_mask():
    q, k = torch.arange(S)[:, None], torch.arange(S)[None, :]
    return (k <= q) & (k > q - WINDOW)  # True = attend


def _bidirectional_mask(length: int = S):
    q, k = torch.arange(length)[:, None], torch.arange(length)[None, :]
    return (k - q).abs() <= WINDOW  # True = attend


x_t = torch.from_numpy(X)
ROWS = {
    # entry: (inputs, torch reference)
    "layer_norm": ((X,), lambda: F.layer_norm(x_t, (D,), _t("ln.weight"), _t("ln.bias"), eps=1e-5)),
    "rms_norm": ((X,), lambda: F.rms_norm(x_t, (D,), _t("rms.weight"), eps=1e-5)),
    "swiglu_mlp": ((X,), lambda: _gated("swiglu", F.silu, x_t)),
    "geglu_mlp": ((X,), lambda: _gated("geglu", F.gelu, x_t)),
    "rotary_half": ((XH, COS_H.numpy(), SIN_H.numpy()),
                    lambda: torch.from_numpy(XH) * COS_H[:, None] + _rotate_half(torch.from_numpy(XH)) * SIN_H[:, None]),
    "rotary_interleaved": ((XH, COS_I.numpy(), SIN_I.numpy()),
                           lambda: _interleaved_reference(torch.from_numpy(XH), COS_I, SIN_I)),
    "causal": ((X, RIGHT), lambda: _sdpa(x_t, attn_mask=torch.tril(torch.ones(S, S, dtype=torch.bool)) & _keys(RIGHT))),
    "windowed": ((X, RIGHT), lambda: _sdpa(x_t, attn_mask=_window_mask() & _keys(RIGHT))),
    "bidirectional": ((X, MASK), lambda: _sdpa(x_t, attn_mask=_bidirectional_mask() & _keys(MASK))),
    "padded": ((X, MASK), lambda: _sdpa(x_t, attn_mask=torch.from_numpy(MASK != 0)[:, None, None, :])),
}

# ClsOrMean in numpy: "cls" is position 0 whatever the mask (MASK's second row is left-padded,
# so it is a padding position there, as transformers takes it); "mean" averages the real tokens.
ROWS["pool_cls"] = ((X, MASK), lambda: torch.from_numpy(X[:, 0, :].copy()))
ROWS["pool_mean"] = ((X, MASK), lambda: torch.from_numpy(
    (X * MASK[..., None]).sum(1) / MASK.sum(1, keepdims=True).astype(np.float32)))

MASKED_ROWS = {"causal": RIGHT, "windowed": RIGHT, "bidirectional": MASK, "padded": MASK, "grouped": RIGHT}
QG = RNG.standard_normal((B, 2 * HEADS, S, HALF)).astype(np.float32)
KG, VG = (RNG.standard_normal((B, HEADS, S, HALF)).astype(np.float32) for _ in range(2))
ROWS["grouped"] = ((QG, KG, VG, RIGHT), lambda: F.scaled_dot_product_attention(
    torch.from_numpy(QG), torch.from_numpy(KG), torch.from_numpy(VG),
    attn_mask=torch.tril(torch.ones(S, S, dtype=torch.bool)) & _keys(RIGHT), enable_gqa=True))


@pytest.mark.parametrize("backend", ["torch", "onnx", "jax"])
@pytest.mark.parametrize("row", sorted(ROWS))
def test_std_block_matches_torch(entry, backend, row):
    from linnet import nest

    folder, weights = entry
    model = nest.load(folder, backend=backend, weights=weights)
    inputs, reference = ROWS[row]
    got = np.asarray(getattr(model, row)(*inputs))
    expected = reference().numpy()
    assert got.shape == expected.shape and got.dtype == np.float32
    if row in MASKED_ROWS:
        # A padded query's row is left out: the optimiser may zero-fill it (dead-row
        # elimination), and no caller reads it; every real token's row must match.
        real = MASKED_ROWS[row] != 0
        if row == "grouped":  # [B, Heads, S, Dh]: the query axis is third
            got, expected = got.transpose(0, 2, 1, 3)[real], expected.transpose(0, 2, 1, 3)[real]
        else:
            got, expected = got[real], expected[real]
    diff = float(np.abs(got - expected).max())
    print(f"\nPARITY {row} {backend} max|diff| {diff:.3g}")
    assert diff <= 1e-5


def _long_padded_batch(length: int):
    x = RNG.standard_normal((B, length, D)).astype(np.float32)
    mask = np.ones((B, length), np.int32)
    mask[0, length - 60:] = 0  # 60 padding keys at the end: the last rows see no real key within 2
    mask[1, :7] = 0  # left padding
    return x, mask


def _jaxpr_shapes(jaxpr) -> set[tuple]:
    """The shape of every value a jaxpr computes, inside its loops and conds as well."""
    import jax

    shapes = set()
    for eqn in jaxpr.eqns:
        shapes |= {tuple(v.aval.shape) for v in eqn.outvars}
        for sub in jax.core.jaxprs_in_params(eqn.params):
            shapes |= _jaxpr_shapes(sub)
    return shapes


def test_windowed_attention_in_chunks_equals_its_body_at_every_row(entry):
    """torch, ONNX, JAX and StableHLO compute `windowed_attention` a chunk of queries at a time
    over the band of keys each chunk can see (chunks of 64, 256, 256 and 256 queries).  At S =
    600 (ten torch chunks, three of the others, the last short) with a run of padding longer
    than the window, every row agrees, padded queries whose window holds no real key included,
    and real rows equal SDPA.  Packed (the default on ONNX and JAX), the real rows agree and
    the padded ones read 0.  The JAX trace holds no [S, S] value, and the ONNX graph is the
    band Loop."""
    from linnet import nest

    folder, weights = entry
    length = 600
    x, mask = _long_padded_batch(length)
    # Not packed: a packed program reads 0 at padded positions, and those rows are compared here.
    models = {backend: nest.load(folder, backend=backend, weights=weights, packing=False)
              for backend in ("torch", "onnx", "jax", "stablehlo")}
    got = {backend: np.asarray(model.bidirectional(x, mask)) for backend, model in models.items()}
    for backend in ("onnx", "jax", "stablehlo"):
        assert float(np.abs(got["torch"] - got[backend]).max()) <= 1e-5, backend
    import jax

    runtime = models["jax"].runtime
    traced = jax.make_jaxpr(runtime.module.ENTRIES["bidirectional"])(runtime.params, x, mask)
    shapes = _jaxpr_shapes(traced.jaxpr)
    assert (256, 256 + 2 * WINDOW) in shapes and not any(shape[-2:] == (length, length) for shape in shapes)
    h = torch.from_numpy(x).reshape(B, length, HEADS, D // HEADS).permute(0, 2, 1, 3)
    keep = _bidirectional_mask(length) & _keys(mask)
    expected = F.scaled_dot_product_attention(h, h * 0.5, h + 1.0, attn_mask=keep)
    expected = expected.permute(0, 2, 1, 3).reshape(B, length, D).numpy()
    real = mask != 0
    assert float(np.abs(got["torch"][real] - expected[real]).max()) <= 1e-5
    packed = np.asarray(nest.load(folder, backend="onnx", weights=weights).bidirectional(x, mask))
    assert float(np.abs(packed[real] - expected[real]).max()) <= 1e-5 and not packed[~real].any()
    # The unpacked ONNX graph is the band form: one Loop building each chunk's band of keys.
    import onnx

    graph = onnx.load(str(nest.load(folder, backend="onnx", weights=weights, packing=False).runtime.folder
                          / "model.bidirectional.onnx")).graph
    loops = [n for n in graph.node if n.op_type == "Loop"]
    assert len(loops) == 1 and {"Range", "Greater", "Where"} <= {n.op_type for n in loops[0].attribute[0].g.node}


@pytest.mark.parametrize("window", [0, 2, 300, 599, 5000])
def test_a_window_given_at_run_time_is_the_same_band_on_every_backend(entry, window):
    """A window that arrives as an input is known to no compiler: torch reads it per call, ONNX
    builds its band from it, JAX and StableHLO trace it and so take the body's [S, S] band.
    From no neighbour (0) to every key (599 and beyond), each equals SDPA under the same band."""
    from linnet import nest

    folder, weights = entry
    length = 600
    x, mask = _long_padded_batch(length)
    h = torch.from_numpy(x).reshape(B, length, HEADS, D // HEADS).permute(0, 2, 1, 3)
    q, k = torch.arange(length)[:, None], torch.arange(length)[None, :]
    keep = ((k - q).abs() <= window) & _keys(mask)
    expected = F.scaled_dot_product_attention(h, h * 0.5, h + 1.0, attn_mask=keep)
    expected = expected.permute(0, 2, 1, 3).reshape(B, length, D).numpy()
    real = mask != 0
    for backend in ("torch", "onnx", "jax", "stablehlo"):
        model = nest.load(folder, backend=backend, weights=weights, packing=False)
        got = np.asarray(model.bidirectional_at(x, mask, np.asarray(window, np.int32)))
        assert float(np.abs(got[real] - expected[real]).max()) <= 1e-5, backend
    # A rank-0 input stays rank 0 through validation (np.ascontiguousarray made it [1]).
    assert model.validate("bidirectional_at", x, mask, window)[2].shape == ()


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_positions_count_real_tokens(entry, backend):
    from linnet import nest

    folder, weights = entry
    model = nest.load(folder, backend=backend, weights=weights)
    got = np.asarray(model.position_ids(MASK))
    # Written out by hand: right padding keeps the last real position, left padding starts at 0.
    np.testing.assert_array_equal(got, [[0, 1, 2, 2, 2], [0, 0, 1, 2, 3]])


def test_llama_decoder_layer_in_std_terms_checks_in_under_150_lines():
    from pathlib import Path

    from linnet.cli.targets import locate
    from linnet.compiler import compile_target

    path = Path(__file__).resolve().parents[1] / "examples" / "llama_layer.linnet"
    checked = compile_target(locate(path)).checked
    # The layer's own code and every std block it leans on were checked.
    for key in ("llama_layer::DecoderLayer.forward", "std.nn.attention::grouped_attention",
                "std.nn.rotary::rope_half", "std.nn.mlp::GatedMlp.forward", "std.nn.norm::RMSNorm.forward"):
        assert key in checked.functions, key
    assert len(path.read_text(encoding="utf-8").splitlines()) < 150


@pytest.mark.parametrize("backend", ["torch", "onnx", "jax", "stablehlo"])
def test_rotary_frequencies_are_computed_in_f64_as_the_source_says(entry, backend):
    """`RotaryEmbedding.angles` computes inv_freq = Theta^(-2i/width) in f64 and rounds it once.
    JAX computes f64 as f32 unless x64 is on, so the JAX source used to compute it in f32
    (several ulps off at Theta = 10^6, which positions in the tens of thousands multiply); a
    value no input reaches is now computed by numpy when traced, at the source's precision."""
    from linnet import nest

    folder, weights = entry
    model = nest.load(folder, backend=backend, weights=weights)
    positions = np.array([[0, 1, 2, 3, 4], [30000, 31000, 32000, 60000, 65000]], np.int32)
    got = np.asarray(model.rotary_angles(positions))
    inv_freq = (1.0 / np.power(1e6, np.arange(16) * 2.0 / 32)).astype(np.float32)  # f64, rounded once
    angles = positions.astype(np.float32)[..., None] * inv_freq
    expected = np.concatenate([angles, angles], -1)
    ulps = np.abs(got - expected) / np.spacing(np.abs(expected).astype(np.float32))
    print(f"\nrotary angles {backend}: worst {ulps.max():.3g} ulp")
    assert got.dtype == np.float32 and ulps.max() <= 1.0
