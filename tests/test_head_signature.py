"""The rest of transformers' forward signature on the BERT source's task-head roots:
`<main>_positioned` (`position_ids`), `<main>_embeds` (`inputs_embeds`) and
`<main>_head_masked` (`head_mask`), `<main>` being the head's own output entry (`mlm` on
MaskedLm, `logits` on the others).

Each head is a small random `BertFor*` model written by transformers' `save_pretrained` into
the test hub cache and loaded through `hf:` (so the root is the one `hf:` picks for its
architecture), and the same model in eval mode is the reference, called with
`position_ids=` and `inputs_embeds=`; `head_mask`, which transformers 5 dropped, is compared
with test_forward_signature.py's reference (eager attention with 4.x's extra product,
registered as an attention function). Right-padded batches; per-token outputs are compared
at real positions only (ONNX Runtime runs packed and returns 0 at padding). Every head on
torch and ONNX Runtime, MultipleChoice (the one whose inputs are [B, C, S]) on JAX and
StableHLO too; f32 on CPU, within 1e-5.
"""
from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from fixtures.hf_checkpoints import SMALL, write_transformers_repo
from fixtures.parity import max_diff
from linnet import nest
from test_forward_signature import _HEAD_ROWS, HEAD_MASKED, _head_masked_attention
from test_heads import _right_padded

BOUND = 1e-5
#: Outputs must spread at least this much, so a bound of 1e-5 is a small fraction of them.
SPREAD = 0.01
LAYERS, HEADS, WIDTH = SMALL["num_hidden_layers"], SMALL["num_attention_heads"], SMALL["hidden_size"]
VOCAB, MAX_POSITIONS = SMALL["vocab_size"], SMALL["max_position_embeddings"]
SUFFIXES = ("positioned", "embeds", "head_masked")

#: root block -> (the architecture `hf:` builds it from, config overrides, its main entry)
ROOTS = {
    "MaskedLm": ("BertForMaskedLM", {}, "mlm"),
    "SequenceClassification": ("BertForSequenceClassification", {}, "logits"),
    # num_labels = 1: transformers' regression, which hf: runs as a root of its own
    "SequenceRegression": ("BertForSequenceClassification", {"id2label": {0: "score"}, "label2id": {"score": 0}},
                           "logits"),
    "TokenClassification": ("BertForTokenClassification", {}, "logits"),
    "QuestionAnswering": ("BertForQuestionAnswering", {}, "logits"),
    "MultipleChoice": ("BertForMultipleChoice", {}, "logits"),
}
CASES = [(root, backend) for root in ROOTS for backend in ("torch", "onnx")]
CASES += [("MultipleChoice", "jax"), ("MultipleChoice", "stablehlo")]


def _np(x) -> np.ndarray:
    return x.detach().numpy() if hasattr(x, "detach") else np.asarray(x)


@pytest.fixture(scope="module")
def repos(hf_cache):
    """root -> the hf: repo written for it (its `model` is the eval-mode reference)."""
    return {root: write_transformers_repo(hf_cache, f"linnet-tests/signature-{root.lower()}", arch, seed=50 + i,
                                          **overrides)
            for i, (root, (arch, overrides, _)) in enumerate(ROOTS.items())}


_LOADED: dict[tuple[str, str], object] = {}


@pytest.fixture(params=CASES, ids=[f"{r}-{b}" for r, b in CASES])
def case(request, repos):
    """(root, loaded model, reference, main entry): one load per root and backend."""
    root, backend = request.param
    if (root, backend) not in _LOADED:
        _LOADED[root, backend] = nest.load(repos[root].name, backend=backend)
    model = _LOADED[root, backend]
    assert model.manifest.source.root == root  # hf: chose the root this case is about
    return root, model, repos[root].model, ROOTS[root][2]


def _batch(root: str, seed: int):
    """tokens, token_types, attention_mask: [B, S], or [B, C, S] for multiple choice (two
    questions of three choices each), right-padded to sequences of different lengths."""
    if root == "MultipleChoice":
        arrays = _right_padded([10, 6, 8, 3, 10, 5], VOCAB, seed)
        return tuple(a.reshape(2, 3, -1) for a in arrays)
    return _right_padded([11, 6, 9], VOCAB, seed)


def _main_output(root: str, out) -> np.ndarray:
    """transformers' output under our main entry: QA's start and end logits stacked last."""
    if root == "QuestionAnswering":
        return torch.stack([out.start_logits, out.end_logits], -1).numpy()
    return out.logits.numpy()


def _transformers(root: str, reference, **inputs) -> np.ndarray:
    with torch.no_grad():
        return _main_output(root, reference(**{k: torch.from_numpy(np.asarray(v)) for k, v in inputs.items()}))


def _diff(ours: np.ndarray, expected: np.ndarray, mask: np.ndarray) -> float:
    """Largest difference, over real positions only where the output has one row per token."""
    assert ours.shape == expected.shape
    if ours.ndim > mask.ndim:  # [B, S, ...]: per token
        real = mask.astype(bool)
        return max_diff(ours[real], expected[real])
    return max_diff(ours, expected)


def test_explicit_position_ids(case):
    root, model, reference, main = case
    tokens, types, mask = _batch(root, seed=11)
    positions = np.random.default_rng(4).integers(0, MAX_POSITIONS, size=tokens.shape)
    expected = _transformers(root, reference, input_ids=tokens, token_type_ids=types, attention_mask=mask,
                             position_ids=positions)
    ours = _np(model.run(f"{main}_positioned", input_ids=tokens, token_type_ids=types, attention_mask=mask,
                         position_ids=positions))
    diff = _diff(ours, expected, mask)
    print(f"{root}.{main}_positioned {model.backend}: {diff:.2e} (spread {expected.std():.2g})")
    assert expected.std() > SPREAD and diff <= BOUND
    # they are used: the counted positions give other scores
    counted = _np(model.run(main, tokens, types, attention_mask=mask))
    assert _diff(counted, ours, mask) > 1e-3


def test_inputs_embeds(case):
    root, model, reference, main = case
    tokens, types, mask = _batch(root, seed=12)
    embeds = np.random.default_rng(5).standard_normal((*tokens.shape, WIDTH)).astype(np.float32)
    expected = _transformers(root, reference, inputs_embeds=embeds, token_type_ids=types, attention_mask=mask)
    ours = _np(model.run(f"{main}_embeds", embeds, token_type_ids=types, attention_mask=mask))
    diff = _diff(ours, expected, mask)
    print(f"{root}.{main}_embeds {model.backend}: {diff:.2e} (spread {expected.std():.2g})")
    assert expected.std() > SPREAD and diff <= BOUND
    # the word table's own rows as embeddings give the main entry of the ids
    table = reference.bert.embeddings.word_embeddings.weight.detach().numpy()
    assert _diff(_np(model.run(f"{main}_embeds", table[tokens], types, attention_mask=mask)),
                 _np(model.run(main, tokens, types, attention_mask=mask)), mask) <= BOUND


@pytest.fixture(scope="module")
def head_masked_references(repos):
    """root -> a function of (head_mask, **inputs) giving transformers 4.x's head-masked output."""
    import transformers
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(HEAD_MASKED, _head_masked_attention)
    AttentionMaskInterface.register(HEAD_MASKED, ALL_MASK_ATTENTION_FUNCTIONS["eager"])
    made = {}
    for root, (arch, _, _) in ROOTS.items():
        masked = getattr(transformers, arch).from_pretrained(repos[root].snapshot,
                                                             attn_implementation=HEAD_MASKED).eval()

        def run(head_mask: np.ndarray, masked=masked, root=root, **inputs) -> np.ndarray:
            _HEAD_ROWS.update({i: head_mask[i].astype(np.float32).copy() for i in range(LAYERS)})
            return _transformers(root, masked, **inputs)

        # With nothing masked it is the reference model itself.
        tokens, types, mask = _batch(root, seed=14)
        inputs = dict(input_ids=tokens, token_type_ids=types, attention_mask=mask)
        assert _diff(run(np.ones((LAYERS, HEADS)), **inputs), _transformers(root, repos[root].model, **inputs),
                     mask) <= 1e-6
        made[root] = run
    return made


def test_head_mask(case, head_masked_references):
    root, model, _, main = case
    tokens, types, mask = _batch(root, seed=13)
    head_mask = np.random.default_rng(6).choice([0.0, 0.5, 1.0], size=(LAYERS, HEADS)).astype(np.float32)
    head_mask[0, 0], head_mask[1, 1] = 0.0, 1.0
    expected = head_masked_references[root](head_mask, input_ids=tokens, token_type_ids=types, attention_mask=mask)
    ours = _np(model.run(f"{main}_head_masked", tokens, types, mask, head_mask))
    diff = _diff(ours, expected, mask)
    print(f"{root}.{main}_head_masked {model.backend}: {diff:.2e} (spread {expected.std():.2g})")
    assert expected.std() > SPREAD and diff <= BOUND
    unmasked = _np(model.run(main, tokens, types, attention_mask=mask))
    ones = _np(model.run(f"{main}_head_masked", tokens, types, mask, np.ones((LAYERS, HEADS), np.float32)))
    assert _diff(ones, unmasked, mask) <= BOUND and _diff(ours, unmasked, mask) > 1e-3


@pytest.fixture(scope="module")
def eager_references(repos):
    """root -> the head in transformers' eager attention, the one that returns probabilities."""
    import transformers

    return {root: getattr(transformers, arch).from_pretrained(repos[root].snapshot, attn_implementation="eager").eval()
            for root, (arch, _, _) in ROOTS.items()}


def test_attentions(case, eager_references):
    """`attentions` on a head is transformers' `output_attentions` of that head, stacked on
    dim 1 ([B, C, ...] for multiple choice, whose transformers batch is B * C); rows of padded
    queries are left out (transformers numbers padding positions differently)."""
    root, model, _, _ = case
    tokens, types, mask = _batch(root, seed=15)
    with torch.no_grad():
        out = eager_references[root](input_ids=torch.from_numpy(tokens), token_type_ids=torch.from_numpy(types),
                                     attention_mask=torch.from_numpy(mask), output_attentions=True)
    expected = torch.stack(out.attentions, dim=1).numpy()
    ours = _np(model.attentions(input_ids=tokens, token_type_ids=types, attention_mask=mask))
    width = tokens.shape[-1]
    assert ours.shape == (*tokens.shape[:-1], LAYERS, HEADS, width, width)
    ours, flat_mask = ours.reshape(-1, LAYERS, HEADS, width, width), mask.reshape(-1, width).astype(bool)
    assert ours.shape == expected.shape
    real_queries = np.broadcast_to(flat_mask[:, None, None, :, None], ours.shape)
    diff = max_diff(ours[real_queries], expected[real_queries])
    print(f"{root}.attentions {model.backend}: {diff:.2e}")
    assert diff <= BOUND
    assert np.all(ours[np.broadcast_to(~flat_mask[:, None, None, None, :], ours.shape)] == 0)  # padded keys


# ------------------------------------------------------------------ serving and packing


@pytest.mark.parametrize("root", list(ROOTS))
def test_triton_serves_the_main_entry_and_leaves_these_out(repos, root):
    """The default Triton entry set is the entries that take the first one's inputs; these
    take position_ids, embeddings or a head mask, so a client names them to get them."""
    from linnet.serving.triton import triton_io

    ctx, _ = nest.prepare(repos[root].name, need_weights=False)
    main = ROOTS[root][2]
    every = set(ctx.program.entries)
    new = {f"{main}_{suffix}" for suffix in SUFFIXES}
    assert new <= every
    served = {output.entry for output in triton_io(ctx).outputs}
    assert main in served and not served & new
    # named, one of them is served on its own
    assert [o.entry for o in triton_io(ctx, entries=[f"{main}_positioned"]).outputs] == [f"{main}_positioned"]


@pytest.mark.parametrize("root", list(ROOTS))
def test_packing_takes_the_same_decision_as_for_the_main_entry(repos, root):
    """The padding-free pass packs each new entry when it packs the head's main entry, and
    otherwise refuses it with a reason (the refused entry runs padded)."""
    from linnet.middle.optimize import optimize

    ctx, _ = nest.prepare(repos[root].name, need_weights=False)
    packing = optimize(ctx.program, passes=("pack_tokens",))
    applied, notes = "\n".join(packing.applied), "\n".join(packing.notes)
    main = ROOTS[root][2]
    main_packed = f"\n{main}: " in f"\n{applied}"
    for suffix in SUFFIXES:
        entry = f"{main}_{suffix}"
        packed, refused = f"\n{entry}: " in f"\n{applied}", f"\n{entry}: not packed" in f"\n{notes}"
        print(f"{root}.{entry}: {'packed' if packed else 'refused: ' + notes.split(entry + ': ')[-1].splitlines()[0]}")
        assert packed != refused, entry
        assert packed == main_packed, entry


# ------------------------------------------------------------------ one encoder per program

#: A block whose method runs at two batch dims: `[B, D]` and the flattened `[B * C, D]`.
TWO_SPECIALISATIONS = """\
module twice

use std.nn.linear::{Linear}

pub block Model<D: Dim, T: Float = f32> {
    sub query: Linear<D, D, T>
    sub key: Linear<D, D, T>

    fn both<N: Dim>(x: Tensor[N, D; T]) -> Tensor[N, D; T] {
        return query.forward(x) * key.forward(x)
    }

    pub entry rows<B: Dim>(x: Tensor[B, D; T]) -> Tensor[B, D; T] {
        return both(x)
    }

    pub entry grid<B: Dim, C: Dim>(x: Tensor[B, C, D; T]) -> Tensor[B, C, D; T] {
        return reshape(both(reshape(x, [B * C, D])), [B, C, D])
    }

    pub entry grid_again<B: Dim, C: Dim>(x: Tensor[B, C, D; T]) -> Tensor[B, C, D; T] {
        return reshape(both(reshape(x, [B * C, D])), [B, C, D]) + 1.0
    }
}
"""


def test_the_multiple_choice_entries_share_one_encoder_and_its_fused_qkv(repos):
    """Every MultipleChoice entry flattens [B, C, S] to B * C sequences; the encoder they call
    is specialised once for that product, not once per entry, so fusing Q, K and V in it holds
    for all of them (the parity tests above run the fused program)."""
    from linnet.middle.optimize import optimize

    ctx, _ = nest.prepare(repos["MultipleChoice"].name, need_weights=False)
    contexts = [f for f in ctx.program.functions.values() if f.block == "Attention" and f.name == "context"]
    assert len(contexts) == 1
    applied = optimize(ctx.program, passes=("fuse_linears",)).applied
    assert any(line.startswith("Attention.context: fused query, key, value") for line in applied), applied


def test_a_linear_called_from_two_specialisations_is_fused_in_both(tmp_path):
    """Lowering specialises `both` for B and for B * C; the fusion must rewrite every
    specialisation's calls (a copy left calling the removed Linears would not run), and the
    fused program gives what the unfused one gives."""
    import torch

    from linnet.backends.pysource import py_name
    from linnet.backends.torch_source import emit
    from linnet.cli.targets import locate
    from linnet.compiler import compile_target
    from linnet.middle.instantiate import instantiate
    from linnet.middle.lower import lower
    from linnet.middle.optimize import optimize

    path = tmp_path / "twice.linnet"
    path.write_text(TWO_SPECIALISATIONS, encoding="utf-8")
    program = lower(instantiate(compile_target(locate(path)).checked, "Model", {"D": 4}))
    assert len([f for f in program.functions.values() if f.name == "both"]) == 2  # grid and grid_again share one
    out = optimize(program, passes=("fuse_linears",))
    assert {s.name for s in out.program.blocks["Model"].subs} == {"query_key"}
    assert len([line for line in out.applied if line.startswith("Model.both: ")]) == 2, out.applied

    def built(prog, name):
        module = types.ModuleType(name)
        exec(compile(emit(prog), "<generated>", "exec"), module.__dict__)
        with torch.device("meta"):
            return getattr(module, py_name(prog.root))()

    plain, fused = built(program, "linnet_test_two_plain"), built(out.program, "linnet_test_two_fused")
    rng = np.random.default_rng(0)
    state = {k: torch.from_numpy(rng.standard_normal(tuple(v.shape)).astype(np.float32))
             for k, v in plain.state_dict().items()}
    plain.load_state_dict(state, strict=True, assign=True)
    fused.load_state_dict({f"query_key.{p}": torch.cat([state[f"query.{p}"], state[f"key.{p}"]])
                           for p in ("weight", "bias")}, strict=True, assign=True)
    x = torch.from_numpy(rng.standard_normal((2, 3, 4)).astype(np.float32))
    with torch.no_grad():
        expected = plain.rows(x.reshape(6, 4)).reshape(2, 3, 4)
        assert torch.allclose(plain.grid(x), expected, atol=1e-6)
        for model in (plain, fused):
            assert torch.allclose(model.grid(x), expected, atol=1e-6)
            assert torch.allclose(model.grid_again(x), expected + 1.0, atol=1e-6)
