"""A decoder's ONNX graphs in the form optimum exports them: a key and a value per layer.

Linnet's decoder entries (`prefill`, `decode` and `extend`, GPT-2's in `nest/gpt2/src/lib.linnet`)
return the next token's scores `[B, Vocab]` and one typed cache `[Layers, 2, B, Heads, P, Dh]`
(a grouped-query decoder's with its key/value heads). Tools
built around ONNX decoders (optimum, onnxruntime-genai, hand-written serving loops) expect
instead, per layer `i`, `past_key_values.{i}.key` / `.value` `[B, Heads, P, Dh]` in and
`present.{i}.key` / `.value` `[B, Heads, P + 1, Dh]` out, beside `input_ids`,
`attention_mask` (int64) and `logits`. This module emits two such graphs from the same
lowered program, weights included, with one `GraphEmitter` each:

* `decoder_model` (prefill): `input_ids [B, S]`, `attention_mask [B, S]` ->
  `logits [B, 1, Vocab]`, `present.{i}.key/value [B, Heads, S, Dh]`;
* `decoder_with_past_model` (one step): `input_ids [B, 1]`, `attention_mask [B, P + 1]`,
  `past_key_values.{i}.key/value [B, Heads, P, Dh]` -> `logits [B, 1, Vocab]`, `present.*`.
  Where the source has an `extend` entry (S tokens after P cached ones: GPT-2's and Llama's do),
  the step graph is emitted from it instead: `input_ids [B, S]`, `attention_mask [B, P + S]`,
  `present.*` `[B, Heads, P + S, Dh]`, as optimum's own with-past graph takes them. Run with an
  empty cache (P = 0) it computes the prompt, so `generate` needs this one graph, one session
  and one pre-packed copy of the weights (`takes_prompt`, `PastKeyValueSteps`).

`logits` holds the scores of the last position only (what a generate loop reads; optimum's
prefill returns every position, which costs an [S, Vocab] matmul that generate discards).
No `position_ids` input: the entries count positions from `attention_mask`, as transformers'
generate does for left padding. Inside, the per-layer inputs are stacked into the cache, the
entry runs, and each layer's key and value are sliced out of the cache it returns.
"""
from __future__ import annotations

import numpy as np

from .onnx_files import PREFILL_FILE, STEP_FILE
from .onnx_graph import IR_VERSION, OPSET, GraphEmitter, ModelFile, elem_type, graph_inputs_used
from .onnx_views import forward_views
from ..middle import ir


def past_names(layers: int) -> list[str]:
    """The per-layer cache inputs, in the order optimum lists them."""
    return [f"past_key_values.{i}.{part}" for i in range(layers) for part in ("key", "value")]


def present_names(layers: int) -> list[str]:
    return [f"present.{i}.{part}" for i in range(layers) for part in ("key", "value")]


def _cache_type(program: ir.Program) -> ir.TensorType:
    return program.entries["decode"].inputs[1][1]  # [Layers, 2, B, Heads, P, Dh]


#: The cache dtypes an empty past can be fed in from numpy (ORT's Python API has no bf16 array).
EMPTY_PAST = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64}


def takes_prompt(program: ir.Program) -> bool:
    """Whether the step graph is emitted from `extend`, so it runs the prompt too (P = 0)."""
    return "extend" in program.entries


def prompt_on_step(program: ir.Program, step_session) -> bool:
    """Whether generate runs the prompt on the step session (one session): the step graph takes
    it and its cache inputs are of a dtype numpy can make empty ones of."""
    return takes_prompt(program) and all(i.type in EMPTY_PAST for i in step_session.get_inputs()
                                         if i.name.startswith("past_key_values."))


def cache_layers(program: ir.Program) -> int:
    """How many layers' keys and values the cache holds: its first dim."""
    return _cache_type(program).dims[0].as_int()


def _emit(program: ir.Program, tensors: dict, name: str, past: bool, params_in_place: bool = False,
          defer_weights: bool = False) -> ModelFile:
    """One of the two graphs; defer_weights: its params' bytes not copied in (`ModelFile.weights`)."""
    from onnx import TensorProto, helper

    cache_t = _cache_type(program)
    layers = cache_layers(program)
    float_type = elem_type(cache_t.dtype)
    em = GraphEmitter(program, tensors, params_in_place=params_in_place, defer_weights=defer_weights)
    extend = past and takes_prompt(program)
    entry = program.entries["extend" if extend else "decode" if past else "prefill"]
    scope, doc = ("decode", "one step with a per-layer cache") if past else ("prefill", "the prompt")
    if extend:
        doc = "S more tokens after a per-layer cache (P = 0: the prompt)"
    new = "S" if extend or not past else 1  # the new positions: the prompt's, a step's one, or extend's S
    ids_dims = ["B", new]
    mask_dims = ["B", "P + S" if extend else "P + 1" if past else "S"]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ids_dims),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, mask_dims)]
    for input_name in ("input_ids", "attention_mask"):
        em.reserve(input_name)
        em.types[input_name] = TensorProto.INT64
    i32 = elem_type("i32")
    token = em.node("Cast", ["input_ids"], i32, scope=scope, doc="the token ids as the entry takes them", to=i32)
    mask = em.node("Cast", ["attention_mask"], i32, scope=scope, doc="the mask as the entry takes it", to=i32)
    kv_dims = ["B", cache_t.dims[3].as_int(), "P", cache_t.dims[5].as_int()]
    if past:
        for past_name in past_names(layers):
            em.reserve(past_name)
            em.types[past_name] = float_type
            inputs.append(helper.make_tensor_value_info(past_name, float_type, kv_dims))
        args = [token, _stacked_cache(em, layers, float_type), mask]
    else:
        args = [token, mask]
    params = [n for n, _ in entry.inputs]
    # The entry's dims (B, S or P) read from the values it is called with.
    em._dim_sources = {dim: (args[params.index(param)], axis) for dim, (param, axis) in entry.dim_sources.items()}
    if past:  # the stacked cache's dims read from the first layer's keys, [B, Heads, P, Dh] = its axes 2..5
        em._dim_sources = {dim: ("past_key_values.0.key", axis - 2) if value == args[1] and axis >= 2 else (value, axis)
                           for dim, (value, axis) in em._dim_sources.items()}
    scores, cache = em.call(entry.function, args, "")
    em.reserve("logits")
    em.node("Unsqueeze", [scores, em.constant([1], "i64", (1,))], float_type, scope="logits",
            doc="the last position's scores, [B, 1, Vocab]", output="logits")
    vocab = entry.result.items[0].dims[1].as_int()
    outputs = [helper.make_tensor_value_info("logits", float_type, ["B", 1, vocab])]
    present_dims = ["B", kv_dims[1], mask_dims[1], kv_dims[3]]
    for out_name, (layer, part) in zip(present_names(layers), ((i, p) for i in range(layers) for p in (0, 1))):
        em.reserve(out_name)
        _slot(em, cache, layer, part, float_type, out_name)
        outputs.append(helper.make_tensor_value_info(out_name, float_type, present_dims))
    used = graph_inputs_used(em.nodes)
    initializers = [t for t in em.initializers if t.name in used]
    graph = helper.make_graph(em.nodes, f"{name}-{scope}", inputs, outputs, initializer=initializers,
                              doc_string=f"{name}: {doc}, inputs and outputs as optimum names them")
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="linnet")
    model.ir_version = IR_VERSION
    forward_views(model)  # the cache's stacking, slot slices and growth concat: one copy a layer
    return ModelFile(STEP_FILE if past else PREFILL_FILE, [], model,
                     {t.name: em.weights[t.name] for t in model.graph.initializer if t.name in em.weights})


def _stacked_cache(em: GraphEmitter, layers: int, float_type: int) -> str:
    """[Layers, 2, B, Heads, P, Dh] from the per-layer inputs."""
    doc = "the per-layer keys and values stacked as the entry's cache"
    axes = em.constant([0, 1], "i64", (2,))
    slots = []
    for layer in range(layers):
        key, value = (em.node("Unsqueeze", [f"past_key_values.{layer}.{part}", axes], float_type, scope="cache",
                              doc=doc) for part in ("key", "value"))
        slots.append(em.node("Concat", [key, value], float_type, scope="cache", doc=doc, axis=1))
    return em.node("Concat", slots, float_type, scope="cache", doc=doc, axis=0)


def _slot(em: GraphEmitter, cache: str, layer: int, part: int, float_type: int, output: str) -> str:
    doc = f"layer {layer}'s {'keys' if part == 0 else 'values'}, [B, Heads, P, Dh]"
    slot = layer
    sliced = em.node("Slice", [cache, em.constant([slot, part], "i64", (2,)), em.constant([slot + 1, part + 1], "i64", (2,)),
                               em.constant([0, 1], "i64", (2,))], float_type, scope="present", doc=doc)
    return em.node("Squeeze", [sliced, em.constant([0, 1], "i64", (2,))], float_type, scope="present", doc=doc,
                   output=output)


# ------------------------------------------------------------------------ running them


def write_decoder_models(program: ir.Program, tensors: dict, name: str, out_dir, share,
                         params_in_place: bool = False) -> list:
    """Save both graphs into `out_dir`, one emitted and written before the other;
    `share(model_file, path, data_file)` saves one, its weights deferred (`ModelFile.weights`),
    pointing at bytes already written where they are the same (the runtime's weights file)."""
    paths = []
    for index, file in enumerate((PREFILL_FILE, STEP_FILE)):
        model_file = _emit(program, tensors, name, past=file == STEP_FILE, params_in_place=params_in_place,
                           defer_weights=True)
        paths.append(share(model_file, out_dir / file, f"decoder.{index}.bin"))
        del model_file
    return paths


class PastKeyValueSteps:
    """generate's two calls on the optimum-style graphs, through IOBinding: each step's
    `present.*` OrtValues are bound as the next step's `past_key_values.*` as they are, so
    the cache never leaves ONNX Runtime's memory between steps. `prefill_session` None: the
    step graph takes the prompt (`takes_prompt`), run over an empty cache (P = 0)."""

    def __init__(self, prefill_session, step_session, layers: int, device: str = "cpu"):
        self.prefill, self.one_step = prefill_session, step_session
        self.past, self.present = past_names(layers), present_names(layers)
        self.device = device
        self._cache: list = []

    def start(self, tokens, mask):
        """The prompt's cache, kept; returns the next token's scores [B, Vocab] (numpy)."""
        if self.prefill is None:
            return self._run(self.one_step, tokens, mask, list(zip(self.past, self._empty(len(tokens)))))
        return self._run(self.prefill, tokens, mask, [])

    def _empty(self, batch: int) -> list:
        """Zero-length past keys and values [B, Heads, 0, Dh], one per cache input."""
        inputs = {i.name: i for i in self.one_step.get_inputs()}
        return [np.zeros((batch, inputs[n].shape[1], 0, inputs[n].shape[3]), EMPTY_PAST[inputs[n].type]) for n in self.past]

    def step(self, token, mask):
        """One more token [B, 1] with the mask over every position so far."""
        return self._run(self.one_step, token, mask, list(zip(self.past, self._cache)))

    def _run(self, session, tokens, mask, past: list):
        binding = session.io_binding()
        binding.bind_cpu_input("input_ids", np.ascontiguousarray(tokens, dtype=np.int64))
        binding.bind_cpu_input("attention_mask", np.ascontiguousarray(mask, dtype=np.int64))
        for name, value in past:
            if isinstance(value, np.ndarray):
                binding.bind_cpu_input(name, value)
            else:
                binding.bind_ortvalue_input(name, value)
        binding.bind_output("logits", "cpu")  # read on the host each step; the cache stays on the device
        for name in self.present:
            binding.bind_output(name, self.device)
        session.run_with_iobinding(binding)
        logits, *self._cache = binding.get_outputs()
        return logits.numpy()[:, 0]
