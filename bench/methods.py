"""The benchmarked methods: one small class each, registered by the reference bench's keys.

A method is driven in phases by `bench.cli`, each of which may fail on its own (the error is
recorded, the method is dropped from later phases, the other methods go on):

    build()          untimed one-off work outside the model's load (an ONNX export, a Triton
                     repository); its wall time is reported as `build_s` where there is any
    load() -> float  seconds from the call to a usable model, weights cached (`load_s`)
    prepare(batch)   converts a Batch to what `run` takes, outside the timed region
    run(prepared)    one timed call, synchronised (the result is ready when it returns)
    hidden(output)   the `forward` hidden state as float32 numpy, for max_abs_diff
    throughput(prepared, n) -> seconds for n calls (Triton overrides it to keep several
                     requests in flight)
    encode(texts)    the corpus workload: [N, D] float32 numpy sentence embeddings at the
                     workload's corpus_batch and corpus_max_length, normalized

The reference methods are one small class each; the Linnet ones are generated, one class per
(backend, dtype, mode) of `LINNET_F32` and `LINNET_CUDA`, from a class per backend and the
`MODES` table (`linnet_method`).  All are registered in one list (`ALL`).

`workloads` names what a method runs: "fixed" (B=1 latency and B=8 throughput at S=128),
"varlen" (the padded 32-sentence batch), "corpus" (`encode` over many texts); `supports`
says whether it runs one.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .weights import Weights
from .workload import Batch, Workload


@dataclass
class Context:
    weights: Weights
    workload: Workload
    workdir: Path  # exports and repositories go here (per model, per device)
    probe: bool = False  # in a memory probe: load once, no untimed first load

    @property
    def device(self) -> str:
        return self.workload.device


class Method:
    key: str = ""
    name: str = ""
    kind: str = "linnet"
    devices: tuple[str, ...] = ("cpu", "cuda")
    dtype: str = "f32"
    workloads: tuple[str, ...] = ("fixed", "varlen")

    def supports(self, workload: str) -> bool:
        return workload in self.workloads

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.notes: list[str] = []
        self.extra_metrics: dict = {}

    # ---- phases
    def build(self) -> None:
        pass

    def load(self) -> float:
        raise NotImplementedError

    def prepare(self, batch: Batch):
        return batch

    def run(self, prepared):
        raise NotImplementedError

    def hidden(self, output) -> np.ndarray:
        return np.asarray(output, dtype=np.float32)

    def throughput(self, prepared, n: int) -> float:
        started = time.perf_counter()
        for _ in range(n):
            self.run(prepared)
        return time.perf_counter() - started

    def encode(self, texts: list[str]) -> np.ndarray:
        raise NotImplementedError

    def memory(self) -> dict | None:
        """Memory this method measures itself (Triton: the server's processes); None = the probe's."""
        return None

    def close(self) -> None:
        pass

    # ---- helpers
    def _sync(self) -> None:
        if self.ctx.device == "cuda":
            import torch

            torch.cuda.synchronize()


# --------------------------------------------------------------------------- transformers

class TransformersEager(Method):
    key, name, kind = "transformers-eager", "transformers (eager)", "reference"

    def _from_pretrained(self):
        from transformers import BertModel
        from transformers.utils import logging as hf_logging

        from linnet import dtypes

        hf_logging.disable_progress_bar()
        w = self.ctx.weights
        kwargs = {"revision": w.revision} if w.revision else {}
        # transformers' default attention (SDPA), as users get it from from_pretrained.
        model = BertModel.from_pretrained(w.source, dtype=dtypes.by_name(self.dtype).torch_type(), **kwargs)
        return model.to(self.ctx.device).eval()

    def load(self) -> float:
        # A first, untimed load pays for imports and brings the files into the page cache, as
        # Linnet's first load does; the second is the number reported.
        if not self.ctx.probe:
            self._from_pretrained()
        started = time.perf_counter()
        self.model = self._from_pretrained()
        self._sync()
        seconds = time.perf_counter() - started
        self.fn = self.model
        self.notes.append("load_s: second BertModel.from_pretrained in the process (files cached)")
        return seconds

    def prepare(self, batch: Batch):
        import torch

        to = lambda a: torch.from_numpy(a.astype(np.int64)).to(self.ctx.device)  # noqa: E731
        return to(batch.tokens), to(batch.token_types), to(batch.mask)

    def run(self, prepared):
        import torch

        tokens, types, mask = prepared
        with torch.inference_mode():
            out = self.fn(input_ids=tokens, token_type_ids=types, attention_mask=mask).last_hidden_state
        self._sync()
        return out

    def hidden(self, output) -> np.ndarray:
        return output.float().cpu().numpy()


class TransformersCompile(TransformersEager):
    key, name = "transformers-compile", "transformers (torch.compile)"

    def load(self) -> float:
        import torch

        seconds = super().load()
        # Default torch.compile settings; compilation happens at the first calls (first_call_s).
        self.fn = torch.compile(self.model)
        self.notes.append("torch.compile(model) with default settings; compiled during warm-up, not in load_s")
        return seconds


class TransformersEagerBF16(TransformersEager):
    key, name, dtype, devices = "transformers-eager-bf16", "transformers (eager, bf16)", "bf16", ("cuda",)


class OnnxReference(Method):
    """transformers -> torch.onnx (TorchScript exporter) -> ONNX Runtime."""

    key, name, kind = "onnx-reference", "transformers -> torch.onnx -> ONNX Runtime", "reference"
    def _path(self) -> Path:
        return self.ctx.workdir / "reference.onnx"

    def build(self) -> None:
        import warnings

        import torch
        from transformers import BertModel

        path = self._path()
        self.extra_metrics["build_s"] = None
        if path.exists():
            self.notes.append(f"ONNX file reused from {path}")
            return
        started = time.perf_counter()
        w = self.ctx.weights
        kwargs = {"revision": w.revision} if w.revision else {}
        model = BertModel.from_pretrained(w.source, dtype=torch.float32, **kwargs).eval()

        class LastHidden(torch.nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, input_ids, attention_mask, token_type_ids):
                return self.inner(input_ids=input_ids, attention_mask=attention_mask,
                                  token_type_ids=token_type_ids).last_hidden_state

        # The example carries a padded row: traced with an all-ones mask, transformers skips
        # the mask and the graph would ignore attention_mask at run time.
        ids = torch.randint(1000, 30000, (2, 16))
        mask = torch.ones_like(ids)
        mask[1, -3:] = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.onnx")
        names = ["input_ids", "attention_mask", "token_type_ids"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(LastHidden(model), (ids, mask, torch.zeros_like(ids)), str(tmp), input_names=names,
                              output_names=["last_hidden_state"], opset_version=17, dynamo=False,
                              dynamic_axes={n: {0: "B", 1: "S"} for n in names})
        tmp.replace(path)
        self.extra_metrics["build_s"] = time.perf_counter() - started

    def _providers(self):
        if self.ctx.device == "cuda":
            return ["CUDAExecutionProvider", "CPUExecutionProvider"]
        return ["CPUExecutionProvider"]

    def load(self) -> float:
        import onnxruntime as ort

        started = time.perf_counter()
        self.session = ort.InferenceSession(str(self._path()), providers=self._providers())
        seconds = time.perf_counter() - started
        self.notes.append("f32; TorchScript exporter (opset 17, dynamic B and S); load_s: InferenceSession "
                          "from the exported file (the export is build_s)")
        self.notes.append(f"providers: {', '.join(self.session.get_providers())}")
        return seconds

    def prepare(self, batch: Batch):
        return {"input_ids": batch.tokens.astype(np.int64), "attention_mask": batch.mask.astype(np.int64),
                "token_type_ids": batch.token_types.astype(np.int64)}

    def run(self, prepared):
        return self.session.run(["last_hidden_state"], prepared)[0]


def reference_encode(method: Method, texts: list[str], hidden) -> np.ndarray:
    """sentence-transformers' encode around a reference's own graph (`hidden(feeds)`: the last
    hidden state): texts sorted longest first, batches of the workload's corpus_batch cut at its
    corpus_max_length by the checkpoint's tokenizer, mean pooling over the real tokens, L2
    normalisation (the pipeline of all-MiniLM-L6-v2, and what a plain BERT folder gets)."""
    wl = method.ctx.workload
    tokenizer = getattr(method, "_tokenizer", None)
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = method._tokenizer = AutoTokenizer.from_pretrained(str(method.ctx.weights.snapshot()))
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    parts = []
    for start in range(0, len(order), wl.corpus_batch):
        batch = [texts[i] for i in order[start:start + wl.corpus_batch]]
        enc = tokenizer(batch, padding=True, truncation=True, max_length=wl.corpus_max_length, return_tensors="np")
        feeds = {"input_ids": enc["input_ids"].astype(np.int64), "attention_mask": enc["attention_mask"].astype(np.int64),
                 "token_type_ids": enc["token_type_ids"].astype(np.int64)}
        last = np.asarray(hidden(feeds), dtype=np.float32)
        mask = enc["attention_mask"][:, :, None].astype(np.float32)
        mean = (last * mask).sum(1) / np.maximum(mask.sum(1), 1e-9)
        parts.append(mean / np.maximum(np.linalg.norm(mean, axis=1, keepdims=True), 1e-12))
    result = np.empty((len(texts), parts[0].shape[1] if parts else 0), np.float32)
    result[order] = np.concatenate(parts) if parts else result
    return result


class OpenVinoReference(OnnxReference):
    """transformers -> torch.onnx (the onnx-reference file) -> OpenVINO's CPU plugin, the f32
    inference precision hint set and read back (its default on a CPU with AVX512_BF16 is bf16).
    Also runs the corpus: sentence-transformers' pipeline around the graph (`reference_encode`)."""

    key, name, kind = "openvino-reference", "transformers -> torch.onnx -> OpenVINO (f32 hint)", "reference"
    devices = ("cpu",)
    workloads = ("fixed", "varlen", "corpus")
    #: The compile config; None: OpenVINO's own defaults (the default-precision anchor).
    config: dict | None = {"INFERENCE_PRECISION_HINT": "f32"}

    def load(self) -> float:
        import openvino as ov

        started = time.perf_counter()
        core = ov.Core()
        self.compiled = core.compile_model(core.read_model(str(self._path())), "CPU", dict(self.config or {}))
        self.request = self.compiled.create_infer_request()
        seconds = time.perf_counter() - started
        self.notes.append(f"openvino {ov.__version__}; compile config {self.config or 'OpenVINO defaults'}; "
                          f"INFERENCE_PRECISION_HINT read back: {self.compiled.get_property('INFERENCE_PRECISION_HINT')}, "
                          f"NUM_STREAMS {self.compiled.get_property('NUM_STREAMS')}, "
                          f"INFERENCE_NUM_THREADS {self.compiled.get_property('INFERENCE_NUM_THREADS')}; "
                          "load_s: read_model + compile_model of the exported file (the export is build_s)")
        return seconds

    def run(self, prepared):
        self.request.infer(prepared)
        return self.request.get_output_tensor(0).data.copy()

    def encode(self, texts: list[str]) -> np.ndarray:
        return reference_encode(self, texts, self.run)


class OpenVinoReferenceDefault(OpenVinoReference):
    """The same, compiled with OpenVINO's defaults: what a user of OpenVINO gets when asking for
    nothing (bf16 arithmetic on a CPU with AVX512_BF16 or AMX)."""

    key, name = "openvino-reference-default", "transformers -> torch.onnx -> OpenVINO (its default precision)"
    config = None


class SentenceTransformers(Method):
    """The corpus workload's anchor: sentence-transformers' `encode` on the same files.

    A folder without sentence-transformers' own configuration (bert-base-uncased) gets its
    default pipeline, mean pooling over the real tokens, which is what the zoo's `embed`
    computes; `normalize_embeddings=True` on both sides."""

    key, name, kind = "sentence-transformers", "sentence-transformers encode", "reference"
    workloads = ("corpus",)

    def load(self) -> float:
        import logging

        from sentence_transformers import SentenceTransformer

        # A plain BERT folder makes sentence-transformers warn that it creates mean pooling.
        logging.getLogger("sentence_transformers").setLevel(logging.ERROR)
        folder = str(self.ctx.weights.snapshot())
        if not self.ctx.probe:
            SentenceTransformer(folder, device=self.ctx.device)
        started = time.perf_counter()
        self.model = SentenceTransformer(folder, device=self.ctx.device)
        seconds = time.perf_counter() - started
        self.model.max_seq_length = self.ctx.workload.corpus_max_length
        self.notes.append(f"SentenceTransformer(folder): {' -> '.join(type(m).__name__ for m in self.model)}; "
                          "load_s: the second load in the process")
        return seconds

    def encode(self, texts: list[str]) -> np.ndarray:
        return self.model.encode(texts, batch_size=self.ctx.workload.corpus_batch, normalize_embeddings=True,
                                 convert_to_numpy=True, show_progress_bar=False)


# --------------------------------------------------------------------------- Linnet


class LinnetMethod(Method):
    backend = "torch"
    options: dict = {}
    #: Whether the corpus workload runs `model.encode` on this method (f32 only: the anchor is f32).
    encodes = False

    def supports(self, workload: str) -> bool:
        if workload == "corpus":
            return self.encodes and self.dtype == "f32"
        return super().supports(workload)

    def encode(self, texts: list[str]) -> np.ndarray:
        wl = self.ctx.workload
        return self.model.encode(texts, batch_size=wl.corpus_batch, max_length=wl.corpus_max_length,
                                 normalize=True, progress=False)

    def _load_args(self) -> dict:
        args = {"backend": self.backend, **self.options}
        if self.dtype != "f32":
            args["dtype"] = self.dtype
        if self.ctx.weights.linnet_weights is not None:
            args["weights"] = self.ctx.weights.linnet_weights
        return args

    def _device_args(self) -> dict:
        return {"device": self.ctx.device}

    def build(self) -> None:
        """The first nest.load writes the caches (generated source, ONNX export, StableHLO
        artifact); done here, so the peak-RSS probe measures a warm start as users see it
        rather than a one-off export."""
        from linnet import nest

        started = time.perf_counter()
        model = nest.load(self.ctx.weights.model, **self._load_args(), **self._device_args())
        del model
        self.extra_metrics["build_s"] = time.perf_counter() - started

    def load(self) -> float:
        from linnet import nest

        args = {**self._load_args(), **self._device_args()}
        # The first load writes the generated source (or artifact) to the Linnet cache; the
        # second, timed, is what a user sees on every later start.
        if not self.ctx.probe:
            nest.load(self.ctx.weights.model, **args)
        started = time.perf_counter()
        self.model = nest.load(self.ctx.weights.model, **args)
        seconds = time.perf_counter() - started
        self.notes.append("load_s: second nest.load in the process (generated-source cache warm)")
        return seconds

    def run(self, prepared: Batch):
        out = self.model(prepared.tokens, prepared.token_types, attention_mask=prepared.mask)
        self._sync()
        return out


class LinnetTorch(LinnetMethod):
    """`nest.load(backend="torch")`: a torch tensor out."""

    def hidden(self, output) -> np.ndarray:
        return output.float().cpu().numpy()


class LinnetJax(LinnetMethod):
    """`nest.load(backend="stablehlo" or "jax")`: a jax array out, ready only when blocked on."""

    def run(self, prepared: Batch):
        out = self.model(prepared.tokens, prepared.token_types, attention_mask=prepared.mask)
        out.block_until_ready()
        return out

    def hidden(self, output) -> np.ndarray:
        return np.asarray(output, dtype=np.float32)

    def load(self) -> float:
        seconds = super().load()
        choice = getattr(self.model.runtime, "xla_choice", None)
        if choice is not None:
            self.notes.append(f"XLA compiler options: {choice.describe()}"
                              + (f", measured at load: {choice.measured}" if choice.measured else ""))
        return seconds

    def _device_args(self) -> dict:
        return {"device": "gpu" if self.ctx.device == "cuda" else "cpu"}


class LinnetOnnx(LinnetMethod):
    """`nest.load(backend="onnx")`: given `providers` when the variant names them, else the device."""

    providers: tuple | None = None

    def _device_args(self) -> dict:
        if self.providers is not None:
            return {"providers": list(self.providers)}
        return {"device": self.ctx.device}

    def load(self) -> float:
        seconds = super().load()
        self.notes.append(f"{self.dtype}; providers: {', '.join(self.model.runtime.providers)}")
        choice = getattr(self.model.runtime, "session_choice", None)
        if choice is not None:
            self.notes.append(f"session options: {choice.describe()}"
                              + (f", measured at load: {choice.measured}" if choice.measured else ""))
        return seconds

    def hidden(self, output) -> np.ndarray:
        return np.asarray(output, dtype=np.float32)


class LinnetOpenVino(LinnetMethod):
    """`nest.load(backend="openvino")`: the ONNX export compiled by OpenVINO (CPU only)."""

    devices = ("cpu",)

    def _device_args(self) -> dict:
        return {}

    def load(self) -> float:
        seconds = super().load()
        compiled = self.model.runtime.compiled["forward"]
        self.notes.append(f"{self.dtype}; INFERENCE_PRECISION_HINT read back: "
                          f"{compiled.get_property('INFERENCE_PRECISION_HINT')}, NUM_STREAMS "
                          f"{compiled.get_property('NUM_STREAMS')}, INFERENCE_NUM_THREADS "
                          f"{compiled.get_property('INFERENCE_NUM_THREADS')}")
        return seconds

    def hidden(self, output) -> np.ndarray:
        return np.asarray(output, dtype=np.float32)


_TRT = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")


@dataclass(frozen=True)
class Mode:
    """One way of loading a backend that the bench compares: what it adds to the method's key
    and name, the `nest.load` options it passes, and what it says about itself."""

    key: str            # the key's stem (torch, jax) or suffix (onnx, after the dtype)
    label: str          # in the name's parentheses
    options: tuple = ()  # (option, value) pairs for nest.load
    note: str = ""      # appended to the notes after loading
    encodes: bool = True  # runs the corpus (f32 only): each new batch width without minutes of compiling
    cuda_only: bool = False
    providers: tuple | None = None  # onnx: the providers it names instead of a device


#: (backend, mode) -> how the bench loads it; the backend a family's class runs is the record's name.
MODES: dict[tuple[str, str], Mode] = {
    ("torch", "eager"): Mode("linnet-torch", "generated source"),
    ("torch", "packed"): Mode("linnet-torch-packed", "generated source, padding-free", (("packing", True),),
                              "packing=True: per-token work on the real tokens only (linnet.middle.packing)"),
    # Static shapes: every batch width of the corpus would compile again, past torch.compile's
    # recompile limit, after which it silently runs eager; so no corpus.
    ("torch", "compile"): Mode("linnet-inductor", "torch.compile, inductor", (("mode", "compile"),),
                               "mode='compile' (torch.compile, inductor freezing the weights; static shapes at the "
                               "bench's fixed B and S); compiled during warm-up, not in load_s", encodes=False),
    ("torch", "cudagraphs"): Mode("linnet-cudagraphs", "CUDA graphs", (("mode", "cudagraphs"),), cuda_only=True),
    # JAX compiles once per batch width, in the corpus warm-up.
    ("stablehlo", "export"): Mode("linnet-jax", "XLA, StableHLO"),
    # linnet-jax runs the corpus for JAX: this is its program again, from the generated source.
    ("jax", "source"): Mode("linnet-jax-source", "XLA, generated source", encodes=False),
    # XLA's default compiler options, not the ones measured at load: what the option search buys.
    ("stablehlo", "default-options"): Mode("linnet-jax-default-options", "XLA, StableHLO, kernels='default'",
                                           (("kernels", "default"),), encodes=False),
    ("onnx", "default"): Mode("", ""),
    ("onnx", "padded"): Mode("-padded", "padded, packing=False", (("packing", False),),
                             "packing=False: the padded program, every position computed"),
    # The default session, not the one measured at load: what the option search buys.
    ("onnx", "default-session"): Mode("-default-session", "kernels='default'", (("kernels", "default"),),
                                      encodes=False),
    # TensorRT builds an engine per new shape profile (minutes each): no corpus.
    ("onnx", "trt"): Mode("-trt", "TensorRT", encodes=False, cuda_only=True, providers=_TRT),
    # precision="int8": the measured int8 plan (bench.precision runs it; not in LINNET_F32).
    ("onnx", "int8"): Mode("-int8", "precision='int8'", (("precision", "int8"),),
                           "precision='int8': the measured int8 plan (model.info.precision)"),
    ("openvino", "default"): Mode("", ""),
    # The f32 model with bf16 arithmetic: what OpenVINO's own default would run, asked for by name.
    ("openvino", "bf16-hint"): Mode("-bf16-hint", "precision_hint='bf16'", (("precision_hint", "bf16"),),
                                    "precision_hint='bf16': bf16 products in an f32 model (not exact: compare "
                                    "max_abs_diff)"),
    # precision="int8" on OpenVINO: static int8 after SmoothQuant, the rest f32 (or bf16 by hint).
    ("openvino", "int8"): Mode("-int8", "precision='int8'", (("precision", "int8"),),
                               "precision='int8': the measured static int8 plan (model.info.precision)"),
    ("openvino", "int8-bf16-hint"): Mode("-int8-bf16-hint", "precision='int8', precision_hint='bf16'",
                                         (("precision", "int8"), ("precision_hint", "bf16")),
                                         "precision='int8' with bf16 arithmetic for the products kept f32"),
}
_FAMILY = {"torch": (LinnetTorch, "Linnet torch"), "jax": (LinnetJax, "Linnet JAX"),
           "stablehlo": (LinnetJax, "Linnet JAX"), "onnx": (LinnetOnnx, "Linnet ONNX"),
           "openvino": (LinnetOpenVino, "Linnet ONNX")}


def linnet_method(backend: str, dtype: str, mode: str) -> type[LinnetMethod]:
    """The bench method for `nest.load(backend=..., dtype=...)` loaded as `mode` says; any dtype
    but f32 runs on CUDA only (the CPU has no fast bf16/f16 path the bench compares)."""
    spec = MODES[(backend, mode)]
    family, title = _FAMILY[backend]
    if backend in ("onnx", "openvino"):
        runtime = "ONNX Runtime" if backend == "onnx" else "OpenVINO"
        key = f"linnet-{backend}-{dtype}{spec.key}"
        name = f"{title} {dtype} -> {runtime}" + (f" ({spec.label})" if spec.label else "")
    else:
        key = spec.key if dtype == "f32" else f"{spec.key}-{dtype}"
        name = f"{title} ({spec.label})" if dtype == "f32" else f"{title} ({spec.label}, {dtype})"
    attrs = {"key": key, "name": name, "backend": backend, "dtype": dtype, "options": dict(spec.options),
             "encodes": spec.encodes,
             "devices": ("cuda",) if spec.cuda_only or dtype != "f32" else family.devices,
             "mode": mode, "__doc__": f"{name}: generated from ({backend!r}, {dtype!r}, {mode!r})."}
    if spec.providers is not None:
        attrs["providers"] = spec.providers
    if spec.note:
        attrs["load"] = _noting(family, spec.note)
    class_name = "Linnet" + "".join(w.capitalize() for w in f"{backend}-{mode}-{dtype}".split("-"))
    return type(class_name, (family,), attrs)


def _noting(family: type[LinnetMethod], note: str):
    def load(self) -> float:
        seconds = family.load(self)
        self.notes.append(note)
        return seconds

    return load


#: The Linnet methods as (backend, dtype, mode), in the order a round runs them: f32 on every
#: device, then the CUDA-only ones.
LINNET_F32 = [("torch", "f32", "eager"), ("torch", "f32", "packed"), ("torch", "f32", "compile"),
              ("torch", "f32", "cudagraphs"), ("stablehlo", "f32", "export"), ("jax", "f32", "source"),
              ("stablehlo", "f32", "default-options"), ("onnx", "f32", "default"), ("onnx", "f32", "padded"),
              ("onnx", "f32", "default-session"), ("openvino", "f32", "default"), ("openvino", "f32", "bf16-hint")]
LINNET_CUDA = [("torch", "bf16", "eager"), ("torch", "bf16", "compile"), ("torch", "bf16", "cudagraphs"),
               ("stablehlo", "bf16", "export"), ("jax", "bf16", "source"), ("onnx", "f16", "default"),
               ("onnx", "bf16", "default"), ("onnx", "f32", "trt"), ("onnx", "f16", "trt")]


# --------------------------------------------------------------------------- Triton


class TritonMethod(Method):
    """A model served by a real tritonserver 2.51 on loopback: HTTP for the bench's own timed
    calls, and perf_analyzer (Triton's load client, `linnet.testing.perf_analyzer`) for its
    throughput and p50/p99 at `workload.perf_concurrency` requests in flight, B = 8."""

    max_batch_size = 8
    workloads = ("fixed",)  # the 32-sentence batch is past max_batch_size; encode is not served
    runtime = "python"  # which backends the server needs: "onnxruntime" builds that one too
    model_name = ""
    output = "hidden"
    input_names = ("tokens", "token_types", "attention_mask")
    input_dtype = np.int32
    layout = ""

    def build(self) -> None:
        from linnet.testing.perf_analyzer import provision_perf_analyzer
        from linnet.testing.triton_ort import provision_for

        started = time.perf_counter()
        self.tools = provision_for(self.runtime)
        self.repo = self.ctx.workdir / f"triton-repo-{self.key}"
        self.model_name = self.write_repository(self.repo)
        provision_perf_analyzer(self.tools)
        self.extra_metrics["build_s"] = time.perf_counter() - started

    def write_repository(self, repo: Path) -> str:
        """Write the model repository; return the name of the model to call."""
        raise NotImplementedError

    def load(self) -> float:
        from tritonclient import http

        from linnet.testing.triton_server import TritonServer

        self.http = http
        self.server = TritonServer(self.repo, self.tools, log_path=self.ctx.workdir / f"tritonserver-{self.key}.log")
        self.server.start()
        # tritonclient.http runs on gevent, so one client keeps several requests in flight
        # (async_infer) instead of one client per thread.
        self.client = http.InferenceServerClient(self.server.http_url,
                                                 concurrency=self.ctx.workload.triton_concurrency)
        self.notes.append(f"{self.layout}; over HTTP to tritonserver 2.51 on loopback; f32; throughput with "
                          f"{self.ctx.workload.triton_concurrency} requests of batch "
                          f"{self.ctx.workload.throughput_batch} in flight; max_batch_size {self.max_batch_size}, "
                          "dynamic batching on; load_s: server launch to model ready (the export is build_s); "
                          "peak_rss_mib: the server's and its Python-backend stubs' peak RSS, summed; "
                          "perf_cN_*: perf_analyzer 2.51 over gRPC, N requests of B rows in flight, its own "
                          "Inferences/Second (rows/s) and p50/p99 latency")
        return self.server.start_seconds

    def _arrays(self, batch: Batch) -> dict:
        arrays = (batch.tokens, batch.token_types, batch.mask)
        return {n: a.astype(self.input_dtype) for n, a in zip(self.input_names, arrays)}

    def prepare(self, batch: Batch):
        inputs = []
        for name, array in self._arrays(batch).items():
            tensor = self.http.InferInput(name, list(array.shape), "INT32" if array.dtype == np.int32 else "INT64")
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        return inputs

    def _outputs(self):
        return [self.http.InferRequestedOutput(self.output, binary_data=True)]

    def run(self, prepared):
        return self.client.infer(self.model_name, prepared, outputs=self._outputs())

    def hidden(self, output) -> np.ndarray:
        return np.asarray(output.as_numpy(self.output), dtype=np.float32)

    def throughput(self, prepared, n: int) -> float:
        from collections import deque

        concurrency = self.ctx.workload.triton_concurrency
        total = self.throughput_calls(n)
        # A sliding window: as soon as the oldest request is answered, the next one is sent.
        started = time.perf_counter()
        window: deque = deque()
        for _ in range(total):
            if len(window) == concurrency:
                window.popleft().get_result()
            window.append(self.client.async_infer(self.model_name, prepared, outputs=self._outputs()))
        while window:
            window.popleft().get_result()
        return time.perf_counter() - started

    def throughput_calls(self, n: int) -> int:
        return n * self.ctx.workload.triton_concurrency

    def load_client_figures(self, batch: Batch) -> dict:
        """perf_analyzer at each of the workload's concurrencies (bench.cli's last phase)."""
        from linnet.testing.perf_analyzer import measure

        figures = {}
        for concurrency in self.ctx.workload.perf_concurrency:
            found = measure(self.tools, self.server.grpc_url, self.model_name, self._arrays(batch),
                            concurrency=concurrency, batch=batch.tokens.shape[0],
                            measurement_ms=self.ctx.workload.perf_measurement_ms)
            figures.update({f"perf_c{concurrency}_infer_per_s": found.infer_per_s,
                            f"perf_c{concurrency}_p50_ms": found.p50_ms, f"perf_c{concurrency}_p99_ms": found.p99_ms})
        return figures

    def memory(self) -> dict | None:
        if self.ctx.device != "cpu" or self.server.pid is None:
            return None
        return {"peak_rss_mib": round(_tree_peak_rss_kib(self.server.pid) / 1024, 1)}

    def close(self) -> None:
        if getattr(self, "client", None) is not None:
            self.client.close()
        if getattr(self, "server", None) is not None:
            self.server.stop()


class TritonLinnet(TritonMethod):
    """`export_triton` of the entry's `forward` alone (perf_analyzer asks for every output a
    model has, so the repository serves the one output the bench compares) with the export's
    own defaults, what a user of `linnet export-triton` serves: one instance (Triton's CPU
    default, two instances of ONNX Runtime at one thread per core each, oversubscribes the
    cores; the reference keeps it, as a plain export gets it).  The per-core recipe of
    docs/triton.md (`--instances <cores> --threads 1`) is not what is measured here."""

    def serving_options(self) -> dict:
        return {}

    def write_repository(self, repo: Path) -> str:
        from linnet.nest import prepare
        from linnet.serving.triton import export_triton

        ctx, _ = prepare(self.ctx.weights.model, weights=self.ctx.weights.linnet_weights)
        options = self.serving_options()
        export_triton(ctx, repo, runtime=self.runtime, entries=["forward"], max_batch_size=self.max_batch_size,
                      **options)
        self.notes.append("export-triton's default serving settings (one instance, ONNX Runtime's own threads)")
        return ctx.name


class TritonLinnetPython(TritonLinnet):
    key, name = "triton-linnet-python", "Triton Inference Server (Python backend, Linnet ONNX)"
    runtime, layout = "python", "export-triton --runtime python --entries forward"


class TritonLinnetOnnx(TritonLinnet):
    key, name = "triton-linnet-onnx", "Triton Inference Server (ONNX Runtime backend, Linnet ONNX)"
    runtime, layout = "onnxruntime", ("export-triton --entries forward: ensemble of the validating Python step "
                                      "and the ONNX Runtime model")


class TritonOnnx(TritonMethod):
    """The reference: transformers -> torch.onnx (the onnx-reference file) on Triton's ONNX
    Runtime backend, one plain model, no validation, Triton's default scheduling (on CPU two
    instances, ONNX Runtime's threads)."""

    key, name, kind = "triton-onnx", "Triton Inference Server (ONNX Runtime backend, transformers -> torch.onnx)", \
        "reference"
    runtime, layout = "onnxruntime", "one onnxruntime_onnx model of the torch.onnx export"
    output = "last_hidden_state"
    input_names = ("input_ids", "token_type_ids", "attention_mask")
    input_dtype = np.int64

    def write_repository(self, repo: Path) -> str:
        import shutil

        import onnx

        exporter = OnnxReference(self.ctx)
        exporter.build()  # reuses the file when onnx-reference already wrote it
        version = repo / "reference" / "1"
        version.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(exporter._path(), version / "model.onnx")
        inputs = ",\n".join(f'  {{ name: "{n}" data_type: TYPE_INT64 dims: [ -1 ] }}' for n in self.input_names)
        shape = onnx.load(str(exporter._path()), load_external_data=False).graph.output[0].type.tensor_type.shape
        width = shape.dim[-1].dim_value or -1  # [B, S, hidden]: Triton's dims leave the batch dim out
        (repo / "reference" / "config.pbtxt").write_text(
            f'name: "reference"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {self.max_batch_size}\n'
            f'input [\n{inputs}\n]\noutput [\n  {{ name: "last_hidden_state" data_type: TYPE_FP32 dims: [ -1, {width} ] }}\n]\n'
            "dynamic_batching { }\n", encoding="utf-8")
        return "reference"


def _tree_peak_rss_kib(pid: int) -> int:
    """Sum of VmHWM (each process's own peak RSS) over `pid` and its descendants."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo.extend(children.get(p, []))
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


# --------------------------------------------------------------------------- registry

#: Every method, in the order a round runs them (the reference first).
ALL = [TransformersEager, TransformersCompile, OnnxReference, OpenVinoReference, OpenVinoReferenceDefault,
       SentenceTransformers,
       *(linnet_method(*m) for m in LINNET_F32),
       TritonOnnx, TritonLinnetOnnx, TritonLinnetPython,
       # CUDA only
       TransformersEagerBF16, *(linnet_method(*m) for m in LINNET_CUDA)]
REFERENCE = TransformersEager.key
#: The corpus workload's reference: what `encode` is compared with, in speed and embeddings.
CORPUS_ANCHOR = SentenceTransformers.key
BY_KEY = {m.key: m for m in ALL}


def methods_for(device: str, keys: list[str] | None = None, *, corpus: bool = True) -> list[type[Method]]:
    """The methods to run: the requested keys (the reference always added first, and the corpus
    anchor when `corpus` and a chosen method encodes), or all for the device."""
    if keys:
        unknown = [k for k in keys if k not in BY_KEY]
        if unknown:
            raise ValueError(f"unknown method(s) {', '.join(unknown)}; known: {', '.join(BY_KEY)}")
        chosen = [BY_KEY[k] for k in keys]
        if REFERENCE not in keys:
            chosen.insert(0, BY_KEY[REFERENCE])
        if corpus and CORPUS_ANCHOR not in keys and any(_encodes(m) for m in chosen):
            chosen.append(BY_KEY[CORPUS_ANCHOR])
        return [m for m in ALL if m in chosen]
    return [m for m in ALL if device in m.devices and (corpus or m.key != CORPUS_ANCHOR)]


def _encodes(method: type[Method]) -> bool:
    """Whether a method class runs the corpus (without an instance: `supports` reads only class data)."""
    return method.supports(method.__new__(method), "corpus")
