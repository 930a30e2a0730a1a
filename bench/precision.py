"""`python -m bench.precision`: reduced precision against f32 on `encode` (issue 27 item 5).

    python -m bench.precision --model all-minilm-l6-v2                 # nest/all-minilm-l6-v2/precision-bench.json
    python -m bench.precision --model all-minilm-l6-v2 --quick --out /tmp/p.json   # a smoke run, not numbers
    python -m bench.precision --model bert-base-uncased --rounds 2      # synthetic full-size bert-base

Two workloads of stdlib docstring text (`bench.corpus`), every method's `encode` at batch 32,
texts cut at 256 tokens, normalised embeddings:

* long:  ~300 multi-sentence paragraphs of 150-250 tokens (consecutive docstring paragraphs
         joined until a seeded target length in that range is reached; `long_texts`);
* short: ~200 one-line sentences (the first sentence of a paragraph, 20-120 characters;
         `short_texts`).

Per method: texts/s per workload (median over interleaved rounds: round r encodes each
workload once with every method in turn) and its ratio to sentence-transformers' f32; the
cosine of each embedding to sentence-transformers' f32 embedding of the same text (mean and
min over both workloads); peak RSS (VmHWM) of a fresh process that loads the method and
encodes one batch of 32 long texts (`--probe`); and nearest-neighbour agreement: the top-10
overlap between sentence-transformers' f32 ranking and the method's over `nn_queries`
first-sentence queries against `nn_docs` docstring paragraphs (the queries' paragraphs are
not among the docs).

The methods are generated from tuples: `REFERENCES` (the anchors: sentence-transformers,
transformers -> torch.onnx in ONNX Runtime f32 and dynamic int8, OpenVINO at the f32 hint, at
its default precision and NNCF's static int8) and `LINNET` ((backend, dtype, mode) through
`bench.methods.linnet_method`, run on the CPU whatever the dtype); `methods_for` picks them.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from .methods import (MODES, Context, LinnetMethod, Method, OnnxReference, OpenVinoReference,
                      OpenVinoReferenceDefault, SentenceTransformers, linnet_method, reference_encode)
from .weights import REPO_ROOT, bench_cache
from .workload import Workload

log = print

BATCH, MAX_LENGTH = 32, 256
ANCHOR = "sentence-transformers"
#: The targets of issue 27 item 5, checked in the result's `targets`.
TARGETS = {"int8": {"x_openvino_int8": 1.25, "mean_cosine": 0.995, "min_cosine": 0.98},
           "bf16": {"x_openvino_default": 1.15, "mean_cosine": 0.99998},
           "f32": {"x_openvino_f32": 1.0}}

# ------------------------------------------------------------------------------------ helpers


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine of two [N, D] arrays (float64; rows need not be normalised)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    num = (a * b).sum(1)
    den = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return num / np.maximum(den, 1e-300)


def top_k(queries: np.ndarray, docs: np.ndarray, k: int) -> np.ndarray:
    """[Q, k] indices of each query's k docs of highest dot product (ties: the lower index first)."""
    scores = np.asarray(queries, np.float64) @ np.asarray(docs, np.float64).T
    k = min(k, scores.shape[1])
    # A stable sort of the negated scores keeps equal scores in index order.
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


def top_k_overlap(reference: np.ndarray, other: np.ndarray) -> np.ndarray:
    """Per query, the share of `reference`'s top-k doc indices that `other`'s top-k also holds."""
    k = reference.shape[1]
    return np.array([len(set(r.tolist()) & set(o.tolist())) / k for r, o in zip(reference, other)])


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`'\"(])")


def first_sentence(paragraph: str) -> str:
    """The paragraph up to its first sentence end (". " followed by a capital or a quote)."""
    return _SENTENCE_END.split(paragraph.strip(), maxsplit=1)[0]


def long_texts(paragraphs: Sequence[str], count_tokens: Callable[[str], int], n: int, seed: int = 0,
               low: int = 150, high: int = 250) -> list[str]:
    """Up to `n` texts of `low`..`high` tokens: consecutive paragraphs (in their stdlib order)
    joined with a space until a seeded target length in [low, high] is reached; a join that
    overshoots `high` is dropped and the next starts after it.  A seeded sample of n if more."""
    rng = np.random.default_rng(seed)
    found, parts, tokens = [], [], 0
    target = int(rng.integers(low, high + 1))
    for paragraph in paragraphs:
        parts.append(paragraph)
        tokens = count_tokens(" ".join(parts))
        if tokens < target:
            continue
        if tokens <= high:
            found.append(" ".join(parts))
        parts, target = [], int(rng.integers(low, high + 1))
    if len(found) > n:
        picked = np.random.default_rng(seed).choice(len(found), size=n, replace=False)
        found = [found[i] for i in sorted(picked)]
    return found


def short_texts(paragraphs: Sequence[str], n: int, seed: int = 0, low: int = 20, high: int = 120,
                exclude: Sequence[str] = ()) -> list[str]:
    """`n` distinct one-line sentences (first sentences of paragraphs, `low`..`high` characters),
    a seeded sample, none of them in `exclude`."""
    skip = set(exclude)
    seen: dict[str, None] = {}
    for paragraph in paragraphs:
        sentence = first_sentence(paragraph)
        if low <= len(sentence) <= high and sentence not in skip:
            seen.setdefault(sentence)
    pool = list(seen)
    if len(pool) <= n:
        return pool
    picked = np.random.default_rng(seed).choice(len(pool), size=n, replace=False)
    return [pool[i] for i in sorted(picked)]


def nn_sets(paragraphs: Sequence[str], n_docs: int, n_queries: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """The neighbour search's docs (a seeded sample of paragraphs) and queries (first sentences
    of other paragraphs)."""
    rng = np.random.default_rng(seed + 1)
    order = rng.permutation(len(paragraphs))
    docs = [paragraphs[i] for i in sorted(order[:n_docs])]
    rest = [paragraphs[i] for i in sorted(order[n_docs:])]
    return docs, short_texts(rest, n_queries, seed, exclude=docs)


# ------------------------------------------------------------------------------------ methods


class OrtReferenceEncode(OnnxReference):
    """transformers -> torch.onnx -> ONNX Runtime f32, encoding with sentence-transformers'
    pipeline around the graph (`reference_encode`)."""

    key, name = "onnx-reference", "transformers -> torch.onnx -> ONNX Runtime (f32)"
    devices = ("cpu",)
    precision = "f32"

    def encode(self, texts: list[str]) -> np.ndarray:
        return reference_encode(self, texts, lambda feeds: self.session.run(["last_hidden_state"], feeds)[0])


class OrtReferenceInt8(OrtReferenceEncode):
    """The same export through ONNX Runtime's `quantize_dynamic` (per-channel int8 weights,
    QInt8, dynamic int8 activations: every MatMul of the graph)."""

    key, name = "onnx-reference-int8", "transformers -> torch.onnx -> ORT quantize_dynamic int8 (per-channel)"
    precision = "int8"

    def _path(self) -> Path:
        return self.ctx.workdir / "reference-int8-dynamic-pc.onnx"

    def build(self) -> None:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        exporter = OnnxReference(self.ctx)
        exporter.build()
        path = self._path()
        self.extra_metrics["build_s"] = None
        if path.exists():
            self.notes.append(f"quantized file reused from {path}")
            return
        started = time.perf_counter()
        tmp = path.with_suffix(".tmp.onnx")
        quantize_dynamic(str(exporter._path()), str(tmp), per_channel=True, weight_type=QuantType.QInt8)
        tmp.replace(path)
        self.extra_metrics["build_s"] = time.perf_counter() - started

    def load(self) -> float:
        seconds = super().load()
        self.notes.append("onnxruntime.quantization.quantize_dynamic(per_channel=True, weight_type=QInt8) of the "
                          "onnx-reference export: every MatMul with a weight initializer int8")
        return seconds


class OpenVinoF32Encode(OpenVinoReference):
    key = "openvino-reference"
    precision = "f32"


class OpenVinoDefaultEncode(OpenVinoReferenceDefault):
    key = "openvino-reference-default"
    precision = "default"


def calibration_texts(n: int = 100, seed: int = 7) -> list[str]:
    """NNCF's calibration set: `n` stdlib docstring paragraphs (another seed than the workloads')."""
    from .corpus import corpus

    return corpus(n, seed)


class OpenVinoNncfInt8(OpenVinoReference):
    """The onnx-reference export through NNCF's static post-training quantisation
    (`nncf.quantize`, model_type TRANSFORMER, 100 calibration texts, one per sample), compiled
    with OpenVINO's defaults (int8 where NNCF put FakeQuantize, the plugin's default precision,
    bf16 on this CPU, elsewhere)."""

    key, name = "openvino-reference-int8-nncf", "transformers -> torch.onnx -> NNCF static int8 -> OpenVINO"
    precision = "int8"
    config = None
    calibration = 100

    def _xml(self) -> Path:
        return self.ctx.workdir / f"reference-int8-nncf-{self.calibration}.xml"

    def build(self) -> None:
        import openvino as ov

        exporter = OnnxReference(self.ctx)
        exporter.build()
        self.extra_metrics["build_s"] = None
        if self._xml().exists():
            self.notes.append(f"NNCF model reused from {self._xml()}")
            return
        import nncf
        from transformers import AutoTokenizer

        started = time.perf_counter()
        tokenizer = AutoTokenizer.from_pretrained(str(self.ctx.weights.snapshot()))
        samples = []
        for text in calibration_texts(self.calibration):
            enc = tokenizer([text], truncation=True, max_length=MAX_LENGTH, return_tensors="np")
            samples.append({k: enc[k].astype(np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")})
        model = ov.Core().read_model(str(exporter._path()))
        quantized = nncf.quantize(model, nncf.Dataset(samples), model_type=nncf.ModelType.TRANSFORMER,
                                  subset_size=len(samples))
        ov.save_model(quantized, str(self._xml()))
        self.extra_metrics["build_s"] = time.perf_counter() - started

    def _path(self) -> Path:  # what load() reads
        return self._xml()

    def load(self) -> float:
        import nncf

        seconds = super().load()
        self.notes.append(f"nncf {nncf.__version__}: nncf.quantize(model_type=TRANSFORMER, subset_size="
                          f"{self.calibration}) on {self.calibration} stdlib paragraphs (bench.corpus seed 7), "
                          "one text per sample; compiled with OpenVINO's default config")
        return seconds


class PrecisionAnchor(SentenceTransformers):
    devices = ("cpu",)
    precision = "f32"


#: The anchors: (key, class); sentence-transformers first (what every ratio and cosine is to).
REFERENCES: list[tuple[str, type[Method]]] = [
    (ANCHOR, PrecisionAnchor), ("onnx-reference", OrtReferenceEncode),
    ("openvino-reference", OpenVinoF32Encode), ("openvino-reference-default", OpenVinoDefaultEncode),
    ("onnx-reference-int8", OrtReferenceInt8), ("openvino-reference-int8-nncf", OpenVinoNncfInt8)]

#: The Linnet methods as (backend, dtype, mode), in the order a round runs them.
LINNET: list[tuple[str, str, str]] = [
    ("onnx", "f32", "default"), ("torch", "f32", "eager"), ("torch", "bf16", "eager"), ("onnx", "f32", "int8"),
    ("openvino", "f32", "default"), ("openvino", "f32", "bf16-hint"),
    ("openvino", "f32", "int8"), ("openvino", "f32", "int8-bf16-hint"),
    # The other precisions the tree offers on a CPU: onnx's bf16 variant (f32 arithmetic per node,
    # bf16 between), OpenVINO's native bf16 graph and its f16 tensors.
    ("onnx", "bf16", "default"), ("openvino", "bf16", "default"), ("openvino", "f16", "default")]
#: Offered but left out of the default set: torch f16 on a CPU has no fast kernels (a smoke
#: encoded 64 corpus paragraphs at 5.7 texts/s against onnx f32's 59): `--methods linnet-torch-f16` runs it.
LINNET_EXTRA: list[tuple[str, str, str]] = [("torch", "f16", "eager")]


def precision_method(backend: str, dtype: str, mode: str) -> type[LinnetMethod]:
    """`linnet_method(backend, dtype, mode)` made to run `encode` on the CPU at any dtype."""
    base = linnet_method(backend, dtype, mode)
    options = dict(MODES[(backend, mode)].options)
    precision = options.get("precision") or options.get("precision_hint") or dtype

    def load(self) -> float:
        seconds = base.load(self)
        plan = getattr(getattr(self.model, "info", None), "precision", None)
        if isinstance(plan, dict) and plan:  # onnx precision="int8": which matrices went int8, measured how
            self.notes.append("int8 plan: " + json.dumps({k: v for k, v in plan.items() if k != "tried"},
                                                         default=str)[:1500])
        return seconds

    return type(base.__name__ + "Precision", (base,), {
        "devices": ("cpu",), "encodes": True, "precision": precision, "load": load,
        "supports": lambda self, workload: workload == "encode",
        "__doc__": base.__doc__})


def all_methods() -> list[type[Method]]:
    return [cls for _, cls in REFERENCES] + [precision_method(*t) for t in LINNET + LINNET_EXTRA]


def by_key() -> dict[str, type[Method]]:
    return {cls.key: cls for cls in all_methods()}


def default_keys() -> list[str]:
    return [key for key, _ in REFERENCES] + [precision_method(*t).key for t in LINNET]


def methods_for(keys: Sequence[str] | None = None) -> list[type[Method]]:
    """The chosen methods (the anchor always first), or the default set, in round order."""
    known = by_key()
    keys = list(keys) if keys else default_keys()
    unknown = [k for k in keys if k not in known]
    if unknown:
        raise ValueError(f"unknown method(s) {', '.join(unknown)}; known: {', '.join(known)}")
    ordered = [k for k in known if k in keys or k == ANCHOR]
    return [known[k] for k in ordered]


# ------------------------------------------------------------------------------------ the run


def workload_for(model: str) -> Workload:
    return Workload(device="cpu", corpus_batch=BATCH, corpus_max_length=MAX_LENGTH)


def texts_for(weights, n_long: int, n_short: int, seed: int = 0) -> dict[str, list[str]]:
    from transformers import AutoTokenizer

    from .corpus import stdlib_paragraphs

    tokenizer = AutoTokenizer.from_pretrained(str(weights.snapshot()))
    count = lambda text: len(tokenizer(text, truncation=False, verbose=False)["input_ids"])  # noqa: E731
    paragraphs = stdlib_paragraphs()
    long = long_texts(paragraphs, count, n_long, seed)
    return {"long": long, "short": short_texts(paragraphs, n_short, seed, exclude=long)}


def _vm_hwm_mib() -> float:
    from .probe import _vm_hwm_kib

    return round(_vm_hwm_kib() / 1024, 1)


def probe(model: str, key: str) -> dict:
    """In a fresh process: load the method once, encode 32 long texts; this process's peak RSS."""
    from .weights import resolve

    weights = resolve(model)
    workdir = bench_cache() / "work" / model / "cpu"
    method = by_key()[key](Context(weights, workload_for(model), workdir, probe=True))
    texts = texts_for(weights, BATCH, 0)["long"]
    before = _vm_hwm_mib()
    method.load()
    method.encode(texts[:BATCH])
    return {"peak_rss_mib": _vm_hwm_mib(), "rss_before_load_mib": before}


def _probe_rss(model: str, key: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "bench.precision", "--model", model, "--probe", key],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    for line in done.stdout.splitlines():
        if line.startswith("PRECISION-PROBE "):
            return json.loads(line[len("PRECISION-PROBE "):])
    raise RuntimeError(f"probe exited {done.returncode}: " + " | ".join((done.stderr or "").strip().splitlines()[-3:]))


def _error(phase: str, exc: BaseException) -> str:
    return f"{phase}: {type(exc).__name__}: {str(exc)[:1000]}"


def run(model: str, keys: Sequence[str] | None, out: Path, *, rounds: int, n_long: int, n_short: int,
        nn_docs: int, nn_queries: int, rss: bool = True, seed: int = 0) -> dict:
    from linnet.contention import ContentionMeter
    from .corpus import describe, stdlib_paragraphs
    from .weights import resolve
    from .workload import environment, load_average

    started_at = dt.datetime.now(dt.timezone.utc)
    meter = ContentionMeter()
    weights = resolve(model)
    workdir = bench_cache() / "work" / model / "cpu"
    workdir.mkdir(parents=True, exist_ok=True)
    ctx = Context(weights, workload_for(model), workdir)
    methods = [cls(ctx) for cls in methods_for(keys)]
    texts = texts_for(weights, n_long, n_short, seed)
    docs, queries = nn_sets(stdlib_paragraphs(), nn_docs, nn_queries, seed)
    log(f"precision bench {model}: {', '.join(m.key for m in methods)}")
    log(f"texts: long {len(texts['long'])}, short {len(texts['short'])}; nn: {len(queries)} queries x {len(docs)} docs")
    env = environment("cpu")
    records = {m.key: {"key": m.key, "method": m.name, "kind": m.kind, "precision": m.precision, "error": None,
                       "metrics": {}, "notes": m.notes} for m in methods}
    live = lambda: [m for m in methods if records[m.key]["error"] is None]  # noqa: E731

    def fail(m, phase, exc):
        records[m.key]["error"] = _error(phase, exc)
        log(f"  ! {m.key}: {records[m.key]['error'][:300]}")

    for m in live():  # 1. build (exports, quantisation, Linnet caches)
        t = time.perf_counter()
        try:
            m.build()
        except Exception as exc:  # noqa: BLE001 - recorded
            fail(m, "build", exc)
            continue
        log(f"  built {m.key} ({time.perf_counter() - t:.1f} s)")
    for m in live():  # 2. peak RSS, a fresh process each
        if not rss:
            records[m.key]["metrics"]["peak_rss_mib"] = None
            continue
        try:
            found = _probe_rss(model, m.key)
            records[m.key]["metrics"]["peak_rss_mib"] = found["peak_rss_mib"]
            log(f"  probed {m.key}: {found['peak_rss_mib']} MiB")
        except Exception as exc:  # noqa: BLE001 - a missing memory figure is not a failed method
            records[m.key]["metrics"]["peak_rss_mib"] = None
            m.notes.append(f"peak RSS probe failed: {_error('probe', exc)}")
    for m in live():  # 3. load
        try:
            records[m.key]["metrics"]["load_s"] = round(m.load(), 3)
        except Exception as exc:  # noqa: BLE001
            fail(m, "load", exc)
    # 4. one untimed encode of each workload (warm-up) whose embeddings are compared, and the
    # neighbour search's docs and queries.
    embeddings: dict[str, dict[str, np.ndarray]] = {}
    for m in live():
        t = time.perf_counter()
        try:
            embeddings[m.key] = {name: np.asarray(m.encode(list(ts)), np.float32) for name, ts in texts.items()}
            embeddings[m.key]["nn_docs"] = np.asarray(m.encode(docs), np.float32)
            embeddings[m.key]["nn_queries"] = np.asarray(m.encode(queries), np.float32)
        except Exception as exc:  # noqa: BLE001
            fail(m, "check", exc)
            continue
        log(f"  checked {m.key} ({time.perf_counter() - t:.1f} s)")
    anchor = embeddings.get(ANCHOR)
    if anchor is None:
        raise SystemExit("the anchor (sentence-transformers) failed: nothing to compare with")
    anchor_top = top_k(anchor["nn_queries"], anchor["nn_docs"], 10)
    for m in live():
        mine, metrics = embeddings[m.key], records[m.key]["metrics"]
        cos = {name: cosines(mine[name], anchor[name]) for name in texts}
        both = np.concatenate(list(cos.values()))
        worst = max(float(np.abs(mine[n] - anchor[n]).max()) for n in texts)
        metrics.update({"cosine_mean": float(both.mean()), "cosine_min": float(both.min()), "max_abs_diff": worst,
                        **{f"{n}_cosine_mean": float(c.mean()) for n, c in cos.items()},
                        **{f"{n}_cosine_min": float(c.min()) for n, c in cos.items()}})
        overlap = top_k_overlap(anchor_top, top_k(mine["nn_queries"], mine["nn_docs"], 10))
        metrics.update({"top10_overlap_mean": float(overlap.mean()), "top10_overlap_min": float(overlap.min()),
                        "top10_identical_share": float((overlap == 1).mean())})
    # 5. rounds: round r encodes each workload once with every method in turn.
    times: dict[str, dict[str, list[float]]] = {m.key: {n: [] for n in texts} for m in methods}
    env["load_average_after_round"] = []
    for r in range(rounds):
        for m in live():
            for name, ts in texts.items():
                t = time.perf_counter()
                try:
                    m.encode(list(ts))
                except Exception as exc:  # noqa: BLE001
                    fail(m, "rounds", exc)
                    break
                times[m.key][name].append(time.perf_counter() - t)
        env["load_average_after_round"].append(load_average())
        log(f"  round {r + 1}/{rounds} done, load average {env['load_average_after_round'][-1]}")
    for m in methods:
        metrics = records[m.key]["metrics"]
        for name, ts in texts.items():
            runs = times[m.key][name]
            metrics[f"{name}_per_s"] = round(len(ts) / statistics.median(runs), 2) if runs and records[m.key]["error"] is None else None
            metrics[f"{name}_rounds_s"] = [round(x, 3) for x in runs]
    for name in texts:
        base = records[ANCHOR]["metrics"].get(f"{name}_per_s")
        for m in methods:
            rate = records[m.key]["metrics"].get(f"{name}_per_s")
            records[m.key]["metrics"][f"{name}_x_st"] = round(rate / base, 3) if rate and base else None
    for m in methods:
        try:
            m.close()
        except Exception:  # noqa: BLE001
            pass
    contention = meter.stop()
    env["load_average_at_end"] = load_average()
    env["others_cpu_share"] = None if contention is None else round(contention.others_share, 3)
    result = {"date": started_at.isoformat(timespec="seconds"), "what": __doc__.split("\n")[0],
              "environment": env, "weights": weights.origin,
              "workload": {"batch": BATCH, "max_length": MAX_LENGTH, "rounds": rounds,
                           "long": {**describe(texts["long"]), "made": "consecutive docstring paragraphs joined "
                                    "until a seeded target of 150-250 tokens (the checkpoint's tokenizer)"},
                           "short": {**describe(texts["short"]), "made": "first sentences of docstring paragraphs, "
                                     "20-120 characters"},
                           "nn": {"queries": len(queries), "docs": len(docs), "k": 10,
                                  "reference": f"{ANCHOR} f32"},
                           "throughput": "texts/s of one encode of the workload's texts, median over rounds; "
                                         "methods interleaved within each round"},
              "anchor": ANCHOR, "methods": list(records.values())}
    result["targets"] = targets(result)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    log(table(result))
    log(f"wrote {out}")
    return result


def _rate(result: dict, key: str, workload: str) -> float | None:
    for m in result["methods"]:
        if m["key"] == key and m["error"] is None:
            return m["metrics"].get(f"{workload}_per_s")
    return None


def _metric(result: dict, key: str, name: str):
    for m in result["methods"]:
        if m["key"] == key and m["error"] is None:
            return m["metrics"].get(name)
    return None


def targets(result: dict) -> dict:
    """Issue 27's targets against this run, per workload: each with the figures and `met`."""
    checks = {}
    pairs = {"int8": ("linnet-onnx-f32-int8", "openvino-reference-int8-nncf"),
             "int8 (OpenVINO)": ("linnet-openvino-f32-int8", "openvino-reference-int8-nncf"),
             "int8 (OpenVINO, bf16 hint)": ("linnet-openvino-f32-int8-bf16-hint", "openvino-reference-int8-nncf"),
             "bf16": ("linnet-torch-bf16", "openvino-reference-default"),
             "bf16 (OpenVINO hint)": ("linnet-openvino-f32-bf16-hint", "openvino-reference-default"),
             "f32": ("linnet-onnx-f32", "openvino-reference"),
             "f32 (OpenVINO)": ("linnet-openvino-f32", "openvino-reference")}
    for label, (mine, theirs) in pairs.items():
        goal = TARGETS[label.split()[0]]
        ratio_goal = next(v for k, v in goal.items() if k.startswith("x_"))
        entry = {"method": mine, "against": theirs}
        for workload in ("long", "short"):
            a, b = _rate(result, mine, workload), _rate(result, theirs, workload)
            entry[f"{workload}_x"] = round(a / b, 3) if a and b else None
        entry["x_goal"] = ratio_goal
        entry["cosine_mean"] = _metric(result, mine, "cosine_mean")
        entry["cosine_min"] = _metric(result, mine, "cosine_min")
        ok = [entry[f"{w}_x"] is not None and entry[f"{w}_x"] >= ratio_goal for w in ("long", "short")]
        if "mean_cosine" in goal:
            ok.append(entry["cosine_mean"] is not None and entry["cosine_mean"] >= goal["mean_cosine"])
        if "min_cosine" in goal:
            ok.append(entry["cosine_min"] is not None and entry["cosine_min"] >= goal["min_cosine"])
        if label.startswith("f32"):  # exact: as close to sentence-transformers as its own f32 is
            entry["max_abs_diff"] = _metric(result, mine, "max_abs_diff")
            entry["exact_goal"] = "max_abs_diff <= 1e-5 (normalised embeddings, float roundoff)"
            ok.append(entry["max_abs_diff"] is not None and entry["max_abs_diff"] <= 1e-5)
        entry["goal"] = {k: v for k, v in goal.items()}
        entry["met"] = all(ok)
        checks[label] = entry
    return checks


def _fmt(x, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def table(result: dict) -> str:
    """The markdown table docs/bench.md shows."""
    lines = ["| method | key | precision | long texts/s | × ST | short texts/s | × ST | cosine mean | cosine min "
             "| top-10 overlap (mean / min) | peak RSS MiB |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for m in result["methods"]:
        x = m["metrics"]
        if m["error"]:
            lines.append(f"| {m['method']} | `{m['key']}` | {m['precision']} | error: {m['error'][:80]} "
                         "| | | | | | | |")
            continue
        lines.append(
            f"| {m['method']} | `{m['key']}` | {m['precision']} | {_fmt(x.get('long_per_s'), '.1f')} "
            f"| {_fmt(x.get('long_x_st'), '.2f')} | {_fmt(x.get('short_per_s'), '.1f')} "
            f"| {_fmt(x.get('short_x_st'), '.2f')} | {_fmt(x.get('cosine_mean'), '.6f')} "
            f"| {_fmt(x.get('cosine_min'), '.6f')} | {_fmt(x.get('top10_overlap_mean'), '.3f')} / "
            f"{_fmt(x.get('top10_overlap_min'), '.1f')} | {_fmt(x.get('peak_rss_mib'), ',.0f')} |")
    return "\n".join(lines)


def targets_table(result: dict) -> str:
    """Issue 27's targets beside this run's figures."""
    goals = {"int8": "≥ 1.25x OpenVINO NNCF int8, cosine mean ≥ 0.995, min ≥ 0.98",
             "bf16": "≥ 1.15x OpenVINO default (bf16), cosine mean ≥ 0.99998",
             "f32": "exact (max abs diff ≤ 1e-5 on normalised embeddings) and ≥ 1.00x OpenVINO f32"}
    lines = ["| target | Linnet method | against | goal | long × | short × | cosine mean | cosine min | met |",
             "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for label, t in result["targets"].items():
        lines.append(f"| {label} | `{t['method']}` | `{t['against']}` | {goals.get(label.split()[0], '')} "
                     f"| {_fmt(t.get('long_x'), '.2f')} | {_fmt(t.get('short_x'), '.2f')} "
                     f"| {_fmt(t.get('cosine_mean'), '.6f')} | {_fmt(t.get('cosine_min'), '.6f')} "
                     f"| {'**yes**' if t['met'] else 'no'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.precision", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="all-minilm-l6-v2")
    parser.add_argument("--methods", default=None, help="comma-separated keys (the anchor is always added)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--long", type=int, default=300, help="long texts (150-250 tokens)")
    parser.add_argument("--short", type=int, default=200, help="one-line sentences")
    parser.add_argument("--nn-docs", type=int, default=2000)
    parser.add_argument("--nn-queries", type=int, default=1000)
    parser.add_argument("--no-rss", action="store_true")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 round, 32+32 texts, 64x200 nn, no RSS")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--probe", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--list", action="store_true", help="print the method keys and exit")
    parser.add_argument("--table", type=Path, default=None, help="print the markdown tables of a result and exit")
    args = parser.parse_args(argv)
    if args.table:
        result = json.loads(args.table.read_text(encoding="utf-8"))
        print(table(result) + "\n\n" + targets_table(result))
        return 0
    if args.list:
        for cls in all_methods():
            print(cls.key, "-", cls.name)
        return 0
    if args.probe:
        print("PRECISION-PROBE " + json.dumps(probe(args.model, args.probe)), flush=True)
        return 0
    if args.quick:
        args.rounds, args.long, args.short, args.nn_docs, args.nn_queries, args.no_rss = 1, 32, 32, 200, 64, True
    out = args.out or REPO_ROOT / "nest" / args.model / "precision-bench.json"
    keys = args.methods.split(",") if args.methods else None
    run(args.model, keys, out, rounds=args.rounds, n_long=args.long, n_short=args.short, nn_docs=args.nn_docs,
        nn_queries=args.nn_queries, rss=not args.no_rss)
    return 0


if __name__ == "__main__":
    sys.exit(main())
