"""The machine's fastest exact matmul for each Linear of a loaded torch model, chosen by measuring.

torch's default CPU matmul (MKL's sgemm) does not use AVX-512 on every CPU that has it;
oneDNN does, and runs a Linear with a weight packed once into its blocked layout about twice
as fast on such a machine (AMD Zen 5 here). Which is faster depends on the CPU, the thread
count and the shape, so nothing is assumed: at load, each distinct Linear shape is timed
both ways on the model's own weights (a few milliseconds), and oneDNN is taken only when it
is faster and its result is within `TOLERANCE` of the default kernel's (relative to the
output's magnitude). Decisions are cached per machine (CPU model, thread count, torch
version) and shape under `$LINNET_CACHE/kernels/`, so later loads do not time again.

A chosen Linear is packed when it is run with autograd off, not at load (`lazy=True`, what
`choose_and_apply` installs): a load then costs no packing at all, and a Linear no entry
calls (bert-base's pooler and MLM transform under `forward`) is never packed. Its first
`PLAIN_ROWS` rows (a short first request) run oneDNN over the plain weight, which gives the
packed weight's bits at 2 rows and more, so a first result waits for no reorder; one row, or a
call past them, packs. Packing is the same reorder whenever it runs, so the outputs are
bit-identical to packing at load; one lock
makes the first call from several threads pack each weight once, and `pack_pending` packs
every chosen Linear now (before forking workers, say). Once packed, a Linear holds its weight
once: the dense tensor is let go and its pages of the memory-mapped checkpoint handed back
(bert-base's Linear weights are ~340 MB; two copies put Linnet's peak RSS above
transformers'), and `weight` gives it back on demand, `packed.to_dense()`, which reproduces
the checkpoint's values exactly; so does `state_dict()`. The packed weight is used only while
autograd is off (`nest.load` runs entries under `torch.inference_mode`); anything else (or
`kernels="default"`) runs the generated `F.linear` over the dense weight, and never packs.
The inference model is inference-only: training uses `model.torch_module()`
(`linnet.nest.training`), built apart with parameters of its own, and saving a loaded model
reads the checkpoint.

A decoder (a program with a `decode` entry) is different. Its Linears run a prompt on torch's
default matmul, never oneDNN: oneDNN's f32 sums carry 1.6x MKL's rounding error, and a
decoder's deep residual stream carries that into the logits (SmolLM2's 30 layers: 1.3e-4 from
transformers' against 7.6e-5). Its steps are one-row products, which read the whole weight for
one row of output and so run at the memory's speed, not the cores': each shape is timed at one
row (`probe_one_row`) against `split_gemv`, one matrix-vector product per thread over its own
block of the weight, and where that wins the Linear's one-row calls split (`install_split_gemv`);
nothing is packed. The tied LM head, whose error stays in its own product, keeps the measured
choice between oneDNN and the default. An encoder is never timed at one row.
"""
from __future__ import annotations

import logging
import os
import threading
import types
from dataclasses import dataclass
from pathlib import Path

from ..middle.linears import DenseForm, dense_form, dense_method
from .measured import MIN_SPEEDUP, TOLERANCE, DecisionCache, cpu_model, median, seconds

log = logging.getLogger("linnet.torch")

#: Rows of the probe input: one sequence of 128 tokens, BERT's usual serving shape.
PROBE_ROWS = 128

#: The entry a decoder runs once per generated token: a program that has it also has its
#: products timed at one row (`probe_one_row`), the row count of a step at batch 1.
STEP_ENTRY = "decode"

#: Suffix of a shape's one-row choice in the cache and `choose_and_apply`'s result. ("v2": a
#: decoder's Linears time the split against the default matmul, no longer a packed oneDNN one,
#: so choices cached before are not read as these.)
ONE_ROW = "@1row.v2"


@dataclass(frozen=True)
class Choice:
    kernel: str        # "onednn" or "default"; at one row (`one_row_key`) also "split"
    speedup: float     # default's time / oneDNN's time in the probe (at one row: the rows' kernel / split's)
    max_error: float   # relative max |difference| in the probe


#: torch's own matmul, unmeasured: what a decoder's Linear runs on prompts.
DEFAULT = Choice("default", 1.0, 0.0)


def choose_and_apply(model, program, *, cache_dir: Path | None) -> dict[str, Choice]:
    """Measure each Linear shape of `model` (once per machine), install the faster kernel.

    Returns shape key ("768x3072:float32") -> Choice, for `model.info` and the logs.
    """
    import torch

    if not torch.backends.mkldnn.is_available():
        return {}
    from ..contention import ContentionMeter

    linears = [(_submodule(model, prefix), form) for prefix, form in dense_instances(program)]
    steps = STEP_ENTRY in program.entries
    cached = _CACHE.read(cache_dir)
    meter = ContentionMeter()
    choices: dict[str, Choice] = {}

    def choose(key: str, measure) -> Choice:
        if key not in choices:
            choices[key] = cached.get(key) or measure()
        return choices[key]

    for module, form in linears:
        if getattr(module, "linnet_kernel", None) is not None:
            continue  # once per module, should two instances name the same one
        weight = _out_in_weight(module, form)
        if weight.device.type != "cpu" or weight.dtype != torch.float32:
            continue
        bias = None if form.bias is None else _param(module, form.bias)
        key = shape_key(weight)
        if steps:  # a decoder: prompts on the default matmul (`install_split_gemv`), steps split where faster
            param = module._parameters[form.weight]
            if (_splittable(param)
                    and choose(one_row_key(key, form.out_in),
                               lambda: probe_one_row(param, bias, DEFAULT, form.out_in)).kernel == "split"):
                install_split_gemv(module, form)
        elif choose(key, lambda: probe(weight, bias)).kernel == "onednn":
            install_onednn(module, form, lazy=True)
    for module, method, form in dense_heads(model, program):
        weight = module._parameters[form.weight]
        if weight.device.type != "cpu" or weight.dtype != torch.float32:
            continue
        key = shape_key(weight)
        rows = choose(key, lambda: probe(weight, None))
        one_row = (steps and _splittable(weight)
                   and choose(one_row_key(key, True), lambda: probe_one_row(weight, None, rows)).kernel == "split")
        if rows.kernel == "onednn" or one_row:
            install_onednn_method(module, method, form, lazy=True, packed_rows=rows.kernel == "onednn",
                                  split_one_row=one_row)
    if cache_dir is not None and any(k not in cached for k in choices):
        _CACHE.record(cache_dir, {**cached, **choices}, meter.stop())
    log.info("torch Linear kernels: %s", ", ".join(f"{k} {c.kernel} x{c.speedup:.2f}" for k, c in choices.items()))
    return choices


def dense_instances(program) -> list[tuple[str, DenseForm]]:
    """(instance prefix, form) of every block instance whose `forward` is a dense layer,
    recognised by structure (`linnet.middle.linears`): std's Linear, a bias-free one, GPT-2's
    Conv1D with its [In, Out] weight."""
    out = []
    for block_id, prefix in program.instances():
        forward = program.blocks[block_id].methods.get("forward")
        form = None if forward is None else dense_form(program, program.functions[forward])
        # Both layouts. GPT-2's [In, Out] Conv1D layers on oneDNN once made decode slower
        # (nest/gpt2/structural-bench.json, 2 shared cores), but on a quiet Zen 5 oneDNN wins
        # at one row too (768 x 2304: 0.20 against 0.30 ms). A one-row probe was tried and
        # dropped: under contention oneDNN's 2-thread calls read 0.02-0.14x of the default at
        # one row (each waits for a descheduled thread), and that verdict would be cached.
        if form is not None:
            out.append((prefix, form))
    return out


def dense_heads(model, program) -> list[tuple[object, str, DenseForm]]:
    """(module, method name, form) of each method computing `x W^T` over an [Out, In] param of
    a block that holds more than the Linear would (`linears.dense_method`): the tied LM head
    of GPT-2 and Llama, `matmul(hidden, transpose(wte))` beside the embedding that reads
    `wte`. That one product is a decoder step's largest matmul (SmolLM2's 49152 x 576 is a
    fifth of its weights), and torch's default kernel runs it at about a third of oneDNN's
    speed on a Zen 5 (9 vs 2.5 ms per token)."""
    from .pysource import py_name

    out, seen = [], set()
    for block_id, prefix in program.instances():
        block = program.blocks[block_id]
        forward = block.methods.get("forward")
        if forward is not None and dense_form(program, program.functions[forward]) is not None:
            continue  # a whole Linear: `dense_instances`' business
        for fn in program.functions.values():
            if fn.block != block_id:
                continue
            form = dense_method(program, fn)
            if form is None or not form.out_in or form.bias is not None or (prefix, fn.name) in seen:
                continue
            seen.add((prefix, fn.name))
            out.append((_submodule(model, prefix), py_name(fn.name), form))
    return out


def install_onednn_method(module, method: str, form: DenseForm, *, lazy: bool = False,
                          packed_rows: bool = True, split_one_row: bool = False) -> None:
    """Run `module.method` (a bias-free `x W^T` over the [Out, In] param `form.weight`) through a
    packed oneDNN copy of the weight whenever autograd is off, packed at its first such call
    when `lazy`, else now. The dense weight stays: other methods read it (the embedding looks
    up its rows), so the packed copy is extra memory, the product's weight once more (SmolLM2:
    113 MB). `split_one_row`: a one-row call runs `split_gemv` over the dense weight instead
    (and packs nothing); `packed_rows` False: other calls run the generated method."""
    generated = getattr(module, method)
    holder: dict[str, object] = {}

    def packed(self):
        found = holder.get("packed")
        if found is None:
            with _PACK_LOCK:
                found = holder.get("packed")
                if found is None:
                    found = _reorder(self._parameters[form.weight])
                    holder["packed"] = found
                    self.linnet_packed_methods = {**self.__dict__.get("linnet_packed_methods", {}),
                                                  method: found}
        return found

    def rerouted(self, x):
        if _runs_generated(x):
            return generated(x)
        if split_one_row and _one_row(x):
            y = split_gemv(x, self._parameters[form.weight], None)
            if y is not None:
                return y
        return _onednn_linear(x, packed(self), None) if packed_rows else generated(x)

    setattr(module, method, types.MethodType(rerouted, module))
    if packed_rows:
        module.linnet_onednn_methods = {**getattr(module, "linnet_onednn_methods", {}), method: packed}
        if not lazy:
            packed(module)


#: What `install_onednn` assumes without a form: torch's Linear layout, `weight` [Out, In] and `bias`.
_TORCH_LINEAR = DenseForm("weight", "bias", True, None, None, "f32")


def _out_in_weight(module, form: DenseForm):
    """The module's weight as [Out, In], the layout oneDNN packs (a transposed view for [In, Out])."""
    return _as_out_in(module._parameters[form.weight], form.out_in)


def _as_out_in(weight, out_in: bool):
    """A weight stored [Out, In] (`out_in`) or [In, Out], as the [Out, In] F.linear and oneDNN read."""
    return weight if out_in else weight.t()


def _runs_generated(x) -> bool:
    """Whether a call runs the generated method, not a rerouted kernel: autograd on, or an input
    that is not f32 on the CPU."""
    import torch

    return torch.is_grad_enabled() or x.dtype != torch.float32 or x.device.type != "cpu"


def _param(module, path: str):
    """The param at a path under `module`: `bias`, or `bias.0.bias` in a one-element sub-block
    array (std's `MaybeBiasLinear`), read where it lives now, so a later `.to()` is seen."""
    *subs, name = path.split(".")
    return _submodule(module, "".join(f"{part}." for part in subs))._parameters[name]


def _submodule(model, prefix: str):
    """The module at a Linnet instance prefix ("layers.0.up."), through `_modules`: a sub may
    share its name with an entry method (`mlm`), which hides it from `getattr`."""
    from .torch_runtime import torch_param_name

    module = model
    path = prefix.rstrip(".")
    for part in torch_param_name(path).split(".") if path else ():
        module = module._modules[part]
    return module


def one_row_key(key: str, out_in: bool) -> str:
    """Where a shape's one-row choice is kept: `split_gemv` blocks an [In, Out] weight otherwise."""
    return key + ONE_ROW + ("" if out_in else ":in-out")


def shape_key(weight) -> str:
    out_features, in_features = weight.shape
    return f"{in_features}x{out_features}:{str(weight.dtype).removeprefix('torch.')}"


def probe(weight, bias, rounds: int = 7) -> Choice:
    """Time the default kernel and a packed oneDNN kernel on `weight`, interleaved."""
    import torch
    import torch.nn.functional as F

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(PROBE_ROWS, weight.shape[1], generator=generator, dtype=weight.dtype)
    with torch.inference_mode():
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, PROBE_ROWS)
        reference = F.linear(x, weight, bias)
        candidate = _onednn_linear(x, packed, bias)
        scale = max(1.0, float(reference.abs().max()))
        error = float((candidate - reference).abs().max()) / scale
        default_times, onednn_times = [], []
        for _ in range(rounds):
            default_times.append(seconds(lambda: F.linear(x, weight, bias)))
            onednn_times.append(seconds(lambda: _onednn_linear(x, packed, bias)))
    speedup = median(default_times) / median(onednn_times)
    kernel = "onednn" if error <= TOLERANCE and speedup >= MIN_SPEEDUP else "default"
    return Choice(kernel, round(speedup, 3), error)


#: Bytes of weights a one-row probe reads per timed pass: twice a Zen 4 chiplet's last-level
#: cache (32 MB), so each product reads its weight from memory, as a decoder step's do
#: (SmolLM2's step reads 538 MB). Timed on one weight over and over, the weight stays in cache
#: and the split's gain hides (576 x 576: 0.97x hot, 1.5-2x streamed).
STREAM_BYTES = 64 << 20
#: At most this many copies of a small weight (a test's tiny model).
STREAM_COPIES = 64


def probe_one_row(weight, bias, rows: Choice, out_in: bool = True, rounds: int = 5) -> Choice:
    """Time one row through `split_gemv` against `rows.kernel` (the default matmul for a
    decoder's Linear, the measured many-rows choice for its tied head), interleaved, each over
    copies of `weight` (as stored: [In, Out] unless `out_in`) enough to stream from memory:
    "split" when it is faster by `MIN_SPEEDUP` and within `TOLERANCE` of the default kernel,
    else `rows.kernel`."""
    import torch
    import torch.nn.functional as F

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1, _as_out_in(weight, out_in).shape[1], generator=generator, dtype=weight.dtype)
    with torch.inference_mode():
        reference = F.linear(x, _as_out_in(weight, out_in), bias)
        candidate = split_gemv(x, weight, bias, out_in)
        if candidate is None:
            return Choice(rows.kernel, 1.0, 0.0)
        error = float((candidate - reference).abs().max()) / max(1.0, float(reference.abs().max()))
        count = max(1, min(STREAM_COPIES, -(-STREAM_BYTES // (weight.numel() * weight.element_size()))))
        copies = [weight.clone() for _ in range(count)]
        if rows.kernel == "onednn":
            packed = [torch.ops.mkldnn._reorder_linear_weight(_as_out_in(w, out_in).contiguous(), PROBE_ROWS)
                      for w in copies]
            current = lambda: [_onednn_linear(x, p, bias) for p in packed]  # noqa: E731
        else:
            current = lambda: [F.linear(x, _as_out_in(w, out_in), bias) for w in copies]  # noqa: E731
        split = lambda: [split_gemv(x, w, bias, out_in) for w in copies]  # noqa: E731
        current_times, split_times = [], []
        for _ in range(rounds):
            current_times.append(seconds(current))
            split_times.append(seconds(split))
    speedup = median(current_times) / median(split_times)
    kernel = "split" if error <= TOLERANCE and speedup >= MIN_SPEEDUP else rows.kernel
    return Choice(kernel, round(speedup, 3), error)


def split_gemv(x, weight, bias, out_in: bool = True):
    """`x W^T (+ b)` for an `x` holding one row ([..., In], a decoder step at batch 1) and a
    contiguous weight, as one batched product over as many blocks of the weight as torch has
    threads: each thread streams its block through a one-thread matrix-vector product.
    Measured on a Zen 4 (2 threads, SmolLM2's shapes, weights read from memory as in a step),
    that reads 26-35 GB/s of weights where MKL's two-thread product reads 9-16 and a packed
    oneDNN weight 19-21. None when it does not apply (one thread; `In` not divisible).

    [Out, In] (`out_in`): blocks of output rows, the rows left over (an odd vocabulary) in one
    more product; the row goes in as an [In, 1] view with strides (1, In), since the same
    values as a contiguous column took MKL's batched product about 5x as long. [In, Out]
    (GPT-2's Conv1D): blocks of the inputs, whose partial products are summed.

    A decoder step makes over a hundred of these calls, each over weights that take tens of
    microseconds to stream, so the views cost as much as the product: a contiguous row
    becomes the blocks' shared column in one `as_strided`, and a weight that halves exactly is
    viewed without a slice (three dispatched ops a call where there were nine)."""
    import torch

    parts = torch.get_num_threads()
    if parts < 2:
        return None
    if out_in:
        out_features, in_features = weight.shape
        whole = out_features - out_features % parts
        if x.is_contiguous():
            columns = x.as_strided((parts, in_features, 1), (0, 1, in_features))
        else:
            columns = x.reshape(1, in_features).t().unsqueeze(0).expand(parts, in_features, 1)
        blocks = (weight if whole == out_features else weight[:whole]).view(parts, whole // parts, in_features)
        y = torch.bmm(blocks, columns).view(whole)
        if whole < out_features:
            y = torch.cat([y, (weight[whole:] @ columns[0]).view(-1)])
    else:
        in_features, out_features = weight.shape
        if in_features % parts:
            return None
        step = in_features // parts
        y = torch.bmm(x.reshape(parts, 1, step), weight.view(parts, step, out_features)).sum(0)
    y = y.reshape(*x.shape[:-1], out_features)
    return y if bias is None else y + bias


def _splittable(weight) -> bool:
    """Whether `split_gemv` can view `weight` (the param as stored) in blocks."""
    return weight.dim() == 2 and weight.is_contiguous()


def _one_row(x) -> bool:
    return x.numel() == x.shape[-1]


def install_split_gemv(module, form: DenseForm) -> None:
    """A decoder's Linear, whose one-row calls (each step at batch 1) `split_gemv` runs faster
    than torch's default matmul: those run `split_gemv` over the dense weight, every other call
    (a prompt) the generated matmul. Nothing is packed: the weight is held once, as loaded. Not
    oneDNN for the prompt, even over the plain weight: on SmolLM2's shapes (AVX2 EPYC, 128 rows)
    that ran no faster than MKL (259 against 257 ms for a prefill's products), and its f32 sums
    carry 1.6x MKL's rounding error, which 30 layers carried SmolLM2's logits to 1.3e-4 from
    transformers' (7.6e-5 with the default matmul)."""
    bias_name = form.bias

    def rerouted(generated):
        def forward(self, x):
            if not _runs_generated(x) and _one_row(x):
                bias = None if bias_name is None else _param(self, bias_name)
                y = split_gemv(x, self._parameters[form.weight], bias, form.out_in)
                if y is not None:
                    return y
            return generated(x)
        return forward

    for name in _linear_methods(module):
        setattr(module, name, types.MethodType(rerouted(getattr(module, name)), module))
    module.linnet_kernel = "split"
    module.linnet_form = form


def install_onednn(module, form: DenseForm | None = None, *, lazy: bool = False) -> None:
    """Run `module` through a packed oneDNN weight whenever autograd is off, and let its dense
    weight go once packed (see the module doc): `module.weight` is then rebuilt from the
    packed one when read. `lazy`: pack at the first call with autograd off (`_pack`), else now.

    Every method of a generated Linear is the same `F.linear` over the last axis (`forward`,
    and `forward_packed*`, the padding-free pass's copies for `[Tokens, In]` rows), so each is
    rerouted alike."""
    if form is None:  # a torch.nn.Linear, or std's Linear as generated
        form = _TORCH_LINEAR
    bias_name = form.bias

    def rerouted(generated):
        def forward(self, x):
            if _runs_generated(x):
                return generated(x)
            bias = None if bias_name is None else _param(self, bias_name)
            packed = self.__dict__.get("linnet_packed_weight")
            if packed is None:
                plain = _plain_weight(self, form, x.numel() // x.shape[-1]) if lazy else None
                if plain is not None:
                    return _onednn_linear(x, plain, bias)
                packed = _pack(self, form)
            return _onednn_linear(x, packed, bias)
        return forward

    for name in _linear_methods(module):
        setattr(module, name, types.MethodType(rerouted(getattr(module, name)), module))
    module.linnet_kernel = "onednn"
    module.linnet_form = form
    if not lazy:
        _pack(module, form)


#: Rows a lazily installed Linear runs on its plain weight before it packs it. Packing reads
#: and rewrites the whole weight out of cache (bert-base: 0.15-0.26 s for 50 weights, most of
#: a first result's time), while oneDNN over the plain weight gives the same bits at 2 rows and
#: more and costs about 3.6 us more per row at 16 rows (576 x 576; under 0.5 at 128): so a
#: short first request (a query, a sentence) runs unpacked, and a weight packs before the rows
#: it ran plain could have paid for its packing. A call whose rows would pass this packs first.
PLAIN_ROWS = 512


def _plain_weight(module, form: DenseForm, rows: int):
    """The [Out, In] dense weight for this call of `rows` rows to run on unpacked, or None to
    pack now: one row (whose bits differ between the plain and the packed weight) packs at
    once, as does a call past `PLAIN_ROWS`, or a weight another thread has packed meanwhile."""
    seen = module.__dict__.get("linnet_plain_rows", 0) + rows
    weight = module._parameters.get(form.weight)
    if rows < 2 or seen > PLAIN_ROWS or weight is None:
        return None
    module.linnet_plain_rows = seen
    return _as_out_in(weight, form.out_in)


def pack_pending(model) -> int:
    """Pack now every weight whose oneDNN kernel was installed lazily and has not run yet;
    returns how many were packed. The outputs are the same bits either way."""
    count = 0
    for module in model.modules():
        if getattr(module, "linnet_kernel", None) == "onednn" and "linnet_packed_weight" not in module.__dict__:
            _pack(module, module.linnet_form)
            count += 1
        for method, packed in module.__dict__.get("linnet_onednn_methods", {}).items():
            if method not in module.__dict__.get("linnet_packed_methods", {}):
                packed(module)
                count += 1
    return count


#: Held while a weight is packed, so threads whose first calls meet pack each weight once.
_PACK_LOCK = threading.Lock()


def _reorder(weight):
    """`weight` ([Out, In]) in oneDNN's blocked layout for `PROBE_ROWS`-row inputs, at torch's
    thread count. (One thread was tried: 3x faster with a busy neighbour on a 2-core machine,
    but about 2x slower on a quiet one, where bert-base's load + first forward rose from 0.24
    to 0.35 s, one interleaved run of 16; so the reorder keeps the threads every other op has.)"""
    import torch

    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), PROBE_ROWS)


def _pack(module, form: DenseForm):
    """Pack `module`'s weight (once, under `_PACK_LOCK`), then let the dense one go: the packed
    weight is set before the class that reads `weight` from it, and that before the dense
    param is removed, so a thread reading `module.weight` meanwhile finds one or the other."""
    with _PACK_LOCK:
        packed = module.__dict__.get("linnet_packed_weight")
        if packed is not None:
            return packed
        packed = _reorder(_out_in_weight(module, form))
        module.linnet_packed_weight = packed
        module.__class__ = _packed_class(type(module), form.weight, form.out_in)
        dense = module._parameters.pop(form.weight)
        _release_mapped_pages(dense)
        return packed


def _release_mapped_pages(tensor) -> None:
    """Hand back the resident pages of a tensor read from a memory-mapped checkpoint.

    Checkpoint tensors are views of one private mapping of the whole file, so letting one go
    frees nothing: the pages packing read stay resident (and in the RSS) while any other
    tensor of the file lives.  For a page still holding the file's bytes (never written, so
    never copied), `madvise(MADV_DONTNEED)` only drops it from memory; a later read maps the
    file's bytes again, so no value can change.  Only whole pages inside the tensor are
    released, and only when /proc/self/pagemap shows each of them is such a file page (an
    anonymous page would read back as zeros); anywhere else (another OS, a copy in memory,
    a page written to) nothing is done."""
    import sys

    if not sys.platform.startswith("linux") or tensor.device.type != "cpu":
        return
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    page = os.sysconf("SC_PAGE_SIZE")
    first, last = -(-start // page) * page, end // page * page
    if last <= first or not _file_mapping(first, last) or not _only_file_pages(first, last, page):
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    libc.madvise(first, last - first, 4)  # MADV_DONTNEED; a failure only keeps the pages


#: The file-backed ranges of /proc/self/maps at its last reading: the Linears of one checkpoint
#: lie in one mapping, so a model's packing reads the file once, not once per weight (bert-base:
#: 50 readings of ~1 ms each). A stale range (unmapped since, its addresses reused) can only
#: pass an anonymous range on to `_only_file_pages`, which refuses any anonymous page that holds
#: data (present or swapped); one never touched reads as zeros before and after.
_FILE_MAPPINGS: list[tuple[int, int]] = []


def _file_mapping(first: int, last: int) -> bool:
    """Whether [first, last) lies in one mapping of a file (/proc/self/maps)."""
    global _FILE_MAPPINGS
    if any(low <= first and last <= high for low, high in _FILE_MAPPINGS):
        return True
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return False
    ranges, found = [], False
    for line in lines:
        fields = line.split(maxsplit=5)
        low, high = (int(x, 16) for x in fields[0].split("-"))
        is_file = len(fields) == 6 and fields[5].startswith("/")
        if is_file:
            ranges.append((low, high))
        if low <= first and last <= high:
            found = is_file
    _FILE_MAPPINGS = ranges
    return found


def _only_file_pages(first: int, last: int, page: int) -> bool:
    """Whether every page of [first, last) is absent or a page of the file itself: per page,
    /proc/self/pagemap's bit 63 is "present", 62 "swapped" (only anonymous pages swap), 61
    "file page or shared"."""
    import numpy as np

    count = (last - first) // page
    try:
        with open("/proc/self/pagemap", "rb") as handle:
            handle.seek(first // page * 8)
            data = handle.read(count * 8)
    except OSError:
        return False
    if len(data) != count * 8:
        return False
    entries = np.frombuffer(data, dtype="<u8")
    present, swapped, file_page = (entries >> np.uint64(bit) & np.uint64(1) for bit in (63, 62, 61))
    return not bool((swapped | (present & (file_page ^ np.uint64(1)))).any())


_PACKED_CLASSES: dict[tuple[type, str, bool], type] = {}


def _packed_class(cls: type, name: str, out_in: bool) -> type:
    """`cls` whose weight param `name` is its packed weight made dense again (transposed back
    to [In, Out] where it was stored so), in `state_dict()` too."""
    key = (cls, name, out_in)
    if key not in _PACKED_CLASSES:
        def weight(self):
            dense = self.linnet_packed_weight.to_dense()
            return dense if out_in else dense.t().contiguous()

        def _save_to_state_dict(self, destination, prefix, keep_vars):
            destination[prefix + name] = getattr(self, name)  # first, where the dense weight stood
            cls._save_to_state_dict(self, destination, prefix, keep_vars)

        _PACKED_CLASSES[key] = type(cls.__name__, (cls,), {
            "__doc__": cls.__doc__, "__module__": cls.__module__, name: property(weight),
            "_save_to_state_dict": _save_to_state_dict})
    return _PACKED_CLASSES[key]


def _linear_methods(module) -> list[str]:
    """`forward` and the packed variants the generated Linear class defines."""
    return [name for name in vars(type(module)) if name == "forward" or name.startswith("forward_packed")]


def _onednn_linear(x, packed, bias):
    import torch

    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


# --------------------------------------------------------------------------- the per-machine cache


def machine_key() -> str:
    """What a timing depends on besides the shape: CPU model, threads, torch version."""
    import torch

    return f"{cpu_model()}|threads={torch.get_num_threads()}|torch={torch.__version__}"


_CACHE = DecisionCache("torch-linear.json", machine_key, Choice)
_cache_file = _CACHE.path
