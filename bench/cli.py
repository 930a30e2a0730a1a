"""`python -m bench`: load every method, warm up, time in interleaved rounds, write the report.

Phases, each guarded per method (a failure records `error` and drops the method from the
phases after it; the rest go on):

1. build     one-off exports (the reference's ONNX file, the Triton repository)
2. probe     CPU: peak RSS of each method in its own subprocess (bench/probe.py)
3. load      into this process; load_s
4. warm-up   `warmup` untimed calls per batch size; the first is first_call_s
5. check     max_abs_diff of the hidden state against the reference, same inputs (the
             variable-length batch: at real tokens only); the corpus: one untimed encode
             per method (JAX compiles its batch widths here), embeddings against
             sentence-transformers'
6. rounds    round r runs every method in turn: latency_iters calls at B=1, then
             throughput_iters calls at B=8, varlen_iters calls on the variable-length batch,
             and in the first corpus_rounds rounds one encode of the corpus; so drift over
             time hits all methods alike

Workloads ("fixed", "varlen", "corpus"; `--workloads`) a method does not support, or one that
fails for it, leave its metrics for that workload null with a note; only a failure in the
fixed workload (or in the only one a method runs) drops the method.
7. perf_analyzer  the Triton methods under Triton's own load client at each of
             `perf_concurrency` requests of B=8 in flight (perf_cN_* metrics)
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gc
import json
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from .rounds import check_corpus, check_varlen, cuda_allocated, cuda_phase, max_diff, run_round
from .weights import MODELS, REPO_ROOT, bench_cache

log = print

#: Corpus sizes other than the workload's default (2000), per model: bert-base-uncased is 12
#: layers of 768 (about 15x all-MiniLM-L6-v2's work per token), so 2000 texts would take about
#: a minute per encode on 2 cores, three encodes per method.
CORPUS_SIZE = {"bert-base-uncased": 500}

#: The metrics each workload beyond the fixed one adds (null where a method does not run it).
WORKLOAD_METRICS = {"varlen": ("varlen_ms", "varlen_max_abs_diff"),
                    "corpus": ("corpus_per_s", "corpus_max_abs_diff")}


def _error_text(phase: str, exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    if len(text) > 1500:
        text = text[:1500] + " ..."
    return f"{phase}: {text}"


class Record:
    """What is known about one method so far."""

    def __init__(self, method, workloads: tuple[str, ...] = ("fixed",)):
        self.method = method
        self.error: str | None = None
        self.metrics: dict = {"latency_ms": None, "throughput_per_s": None, "load_s": None}
        for name, metrics in WORKLOAD_METRICS.items():
            if name in workloads:
                self.metrics.update(dict.fromkeys(metrics))
        #: The workloads of the run this method takes part in.
        self.workloads = [w for w in workloads if method.supports(w)]
        self.latencies: list[float] = []
        self.throughputs: list[float] = []
        self.varlen_times: list[float] = []
        self.corpus_rates: list[float] = []
        self.max_abs_diff: float | None = None
        self.cuda_resident = 0
        self.cuda_peak = 0

    @property
    def ok(self) -> bool:
        return self.error is None

    def runs(self, workload: str) -> bool:
        return self.ok and workload in self.workloads

    def drop(self, workload: str, phase: str, exc: BaseException) -> None:
        """Stop running one workload after a failure in it; the others go on."""
        if workload == "fixed" or self.workloads == [workload]:
            self.fail(phase, exc)
            return
        self.workloads.remove(workload)
        self.method.notes.append(f"{workload} workload failed: {_error_text(phase, exc)}")
        log(f"  ! {self.method.key} ({workload}): {_error_text(phase, exc).splitlines()[0][:300]}")

    def fail(self, phase: str, exc: BaseException) -> None:
        self.error = _error_text(phase, exc)
        log(f"  ! {self.method.key}: {self.error.splitlines()[0][:300]}")
        with contextlib.suppress(Exception):
            self.method.close()


def _progress(total: int, description: str):
    """A rich progress bar on stderr, or a plain counter when rich is missing."""
    try:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), transient=False)
        return progress, progress.add_task(description, total=total)
    except ImportError:  # pragma: no cover - rich is installed with the test extra's deps
        return None, None


def _probe_rss(model: str, key: str, workdir: Path, timeout: float) -> dict:
    cmd = [sys.executable, "-m", "bench.probe", model, key, str(workdir)]
    done = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)
    for line in done.stdout.splitlines():
        if line.startswith("BENCH-PROBE "):
            return json.loads(line[len("BENCH-PROBE "):])
    tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
    raise RuntimeError(f"probe exited {done.returncode}: " + " | ".join(tail))


def run_bench(model: str, workload, keys: list[str] | None, out: Path, *, chart: bool = True) -> dict:
    from . import report
    from .corpus import corpus, describe as describe_corpus
    from .methods import CORPUS_ANCHOR, REFERENCE, Context, methods_for
    from .weights import resolve
    from linnet.contention import ContentionMeter
    from .workload import environment, load_average, make_batch, make_varlen_batch

    started_at = dt.datetime.now(dt.timezone.utc)
    meter = ContentionMeter()
    weights = resolve(model)
    workdir = bench_cache() / "work" / model / workload.device
    workdir.mkdir(parents=True, exist_ok=True)
    ctx = Context(weights, workload, workdir)
    records = [Record(cls(ctx), workload.workloads)
               for cls in methods_for(workload.device, keys, corpus="corpus" in workload.workloads)]
    log(f"bench {model} on {workload.device}: {', '.join(r.method.key for r in records)}")
    log(f"weights: {weights.origin}")
    env = environment(workload.device)
    live = lambda: [r for r in records if r.ok]  # noqa: E731

    for r in records:
        if workload.device not in r.method.devices:
            r.error = f"not available: {r.method.key} runs on {' / '.join(r.method.devices)} only"
        elif not r.workloads:
            r.error = f"not run: {r.method.key} runs none of the workloads {', '.join(workload.workloads)}"
        for name in (w for w in workload.workloads if w != "fixed" and not r.method.supports(w)):
            r.method.notes.append(f"{name} workload: not run by this method")

    # 1. build
    for r in live():
        t = time.perf_counter()
        try:
            r.method.build()
        except Exception as exc:  # noqa: BLE001 - recorded, never dropped
            r.fail("build", exc)
            continue
        log(f"  built {r.method.key} ({time.perf_counter() - t:.1f} s)")

    # 2. peak RSS, one subprocess per method, before this process holds any model
    if workload.device == "cpu":
        for r in live():
            if r.method.key.startswith("triton-"):
                continue  # measured from the server's own processes
            if not workload.rss:
                r.metrics["peak_rss_mib"] = None
                r.method.notes.append("peak RSS not measured (--no-rss)")
                continue
            t = time.perf_counter()
            try:
                found = _probe_rss(model, r.method.key, workdir, timeout=900)
                r.metrics["peak_rss_mib"] = found["peak_rss_mib"]
                r.method.notes.append("peak_rss_mib: peak RSS (VmHWM) of a fresh process that imports, loads once "
                                      "and runs one call per batch size (the interpreter alone, before the "
                                      f"framework imports: {found['rss_before_load_mib']} MiB)")
                if found.get("cache_written"):
                    r.method.notes.append("peak RSS probe: its load built or measured again what this run had cached "
                                          f"({', '.join(found['cache_written'])}), so its peak includes that (was "
                                          "the source tree edited during the run?)")
                if found.get("children_peak_rss_mib"):
                    r.method.notes.append("peak RSS probe: its load ran child processes (an option probe measures in "
                                          f"one), the largest peaking at {found['children_peak_rss_mib']} MiB")
            except Exception as exc:  # noqa: BLE001 - a memory figure missing is not a failed method
                r.metrics["peak_rss_mib"] = None
                r.method.notes.append(f"peak RSS probe failed: {_error_text('probe', exc)}")
            log(f"  probed {r.method.key}: {r.metrics.get('peak_rss_mib')} MiB ({time.perf_counter() - t:.1f} s)")

    # 3. load, 4. warm-up
    small = make_batch(workload.latency_batch, workload.seq, workload.seed)
    big = make_batch(workload.throughput_batch, workload.seq, workload.seed + 1)
    varlen = make_varlen_batch(workload.varlen_batch, workload.varlen_mean, workload.varlen_max, workload.seed)
    prepared: dict[str, tuple] = {}
    prepared_varlen: dict[str, object] = {}
    for r in live():
        try:
            before = cuda_allocated() if workload.device == "cuda" else 0
            with cuda_phase(r, workload.device):
                r.metrics["load_s"] = r.method.load()
            if workload.device == "cuda":
                r.cuda_resident = cuda_allocated() - before
            if r.runs("fixed"):
                prepared[r.method.key] = (r.method.prepare(small), r.method.prepare(big))
                with cuda_phase(r, workload.device):
                    for i in range(max(workload.warmup, 1)):
                        for p in prepared[r.method.key]:
                            t = time.perf_counter()
                            r.method.run(p)
                            if i == 0 and p is prepared[r.method.key][0]:
                                r.metrics["first_call_s"] = time.perf_counter() - t
        except Exception as exc:  # noqa: BLE001
            r.fail("load" if r.metrics["load_s"] is None else "warm-up", exc)
            continue
        if r.runs("varlen"):
            try:
                prepared_varlen[r.method.key] = r.method.prepare(varlen)
                with cuda_phase(r, workload.device):
                    for _ in range(max(workload.warmup, 1)):
                        r.method.run(prepared_varlen[r.method.key])
            except Exception as exc:  # noqa: BLE001
                r.drop("varlen", "warm-up", exc)
        first = r.metrics.get("first_call_s")
        log(f"  loaded {r.method.key}: load {r.metrics['load_s']:.2f} s"
            + (f", first call {first:.2f} s" if first is not None else ""))

    # 5. max_abs_diff against the reference on the same (B=8) inputs
    reference = next((r for r in records if r.method.key == REFERENCE and r.runs("fixed")), None)
    want = None
    if reference is not None:
        try:
            want = reference.method.hidden(reference.method.run(prepared[REFERENCE][1])).astype(np.float64)
        except Exception as exc:  # noqa: BLE001
            reference.fail("check", exc)
    for r in live():
        if want is None:
            break
        if not r.runs("fixed"):
            continue
        try:
            r.max_abs_diff = max_diff(r.method.hidden(r.method.run(prepared[r.method.key][1])), want)
        except Exception as exc:  # noqa: BLE001
            r.fail("check", exc)
    check_varlen(records, prepared_varlen, varlen.mask.astype(bool))

    # 5b. the corpus: one untimed encode per method, embeddings against the anchor's
    texts = corpus(workload.corpus_size, workload.seed) if "corpus" in workload.workloads else []
    if texts:
        check_corpus(records, texts, CORPUS_ANCHOR)

    # 6. interleaved rounds
    progress, task = _progress(workload.rounds * len(live()), f"{model} rounds")
    with progress if progress is not None else contextlib.nullcontext():
        for round_ in range(workload.rounds):
            for r in live():
                if progress is not None:
                    progress.update(task, description=f"{model} round {round_ + 1}/{workload.rounds}: {r.method.key}")
                run_round(r, round_, workload, prepared.get(r.method.key), prepared_varlen.get(r.method.key), texts)
                if progress is not None:
                    progress.advance(task)

    # 7. Triton's own load client on the methods that serve through Triton (B = throughput_batch)
    for r in live():
        if hasattr(r.method, "load_client_figures"):
            t = time.perf_counter()
            try:
                r.method.extra_metrics.update(r.method.load_client_figures(big))
            except Exception as exc:  # noqa: BLE001 - the method's own figures stand
                r.method.notes.append(f"perf_analyzer failed: {_error_text('perf_analyzer', exc)}")
            log(f"  perf_analyzer on {r.method.key} ({time.perf_counter() - t:.1f} s)")

    # results
    for r in records:
        if r.latencies:
            r.metrics["latency_ms"] = statistics.median(r.latencies) * 1e3
        if r.throughputs:
            r.metrics["throughput_per_s"] = statistics.median(r.throughputs)
        if r.varlen_times:
            r.metrics["varlen_ms"] = statistics.median(r.varlen_times) * 1e3
        if r.corpus_rates:
            r.metrics["corpus_per_s"] = statistics.median(r.corpus_rates)
        with contextlib.suppress(Exception):
            own = r.method.memory() if r.ok else None
            if own:
                r.metrics.update(own)
        if workload.device == "cuda":
            r.metrics.pop("peak_rss_mib", None)
            r.metrics["peak_vram_mib"] = _vram_mib(r)
        elif "peak_rss_mib" not in r.metrics:
            r.metrics["peak_rss_mib"] = None
        r.metrics.update({k: v for k, v in r.method.extra_metrics.items() if v is not None})
        with contextlib.suppress(Exception):
            r.method.close()

    load_end = load_average()
    notes_common = [weights.origin]
    contention = meter.stop()
    if contention is not None:
        env["others_cpu_share"] = round(contention.others_share, 3)
    if workload.device == "cpu" and contention is not None and contention.shared:
        notes_common.append(f"the machine was shared with other work during the run ({contention.describe()})")
    env["load_average_at_end"] = load_end
    result = {
        "date": started_at.isoformat(timespec="seconds"),
        "model": model,
        "weights": weights.origin,
        "environment": env,
        "workload": {**workload.describe(), **({"corpus_texts": describe_corpus(texts)} if texts else {})},
        "methods": [{
            "method": r.method.name,
            "kind": r.method.kind,
            "metrics": r.metrics,
            "max_abs_diff": r.max_abs_diff,
            "notes": "; ".join(notes_common + _dedupe(r.method.notes)),
            "error": r.error,
            "key": r.method.key,
        } for r in records],
        "reference": REFERENCE,
        **({"corpus_reference": CORPUS_ANCHOR} if texts else {}),
        "seconds": round(time.perf_counter() - _T0, 1),
    }
    report.write(result, out, chart=chart)
    return result


def _dedupe(items: list[str]) -> list[str]:
    seen, kept = set(), []
    for item in items:
        if item not in seen:
            seen.add(item)
            kept.append(item)
    return kept


def _vram_mib(r: Record) -> float | None:
    key = r.method.key
    if "jax" in key:
        # JAX's allocator is not torch's: report its own peak (process-wide, shared by JAX methods).
        with contextlib.suppress(Exception):
            import jax

            stats = jax.devices("gpu")[0].memory_stats() or {}
            r.method.notes.append("peak_vram_mib: JAX allocator peak of the process (shared by the JAX methods)")
            return round(stats.get("peak_bytes_in_use", 0) / 2**20, 1) or None
        return None
    if "onnx" in key or "triton" in key:
        r.method.notes.append("peak_vram_mib: not measured (ONNX Runtime's CUDA arena is outside torch's allocator)")
        return None
    if not r.ok and not r.cuda_peak:
        return None
    return round((r.cuda_resident + r.cuda_peak) / 2**20, 1)


_T0 = time.perf_counter()


def default_out(model: str, device: str) -> Path:
    name = "bench.json" if device == "cpu" else f"bench.{device}.json"
    return REPO_ROOT / "nest" / model / name


def main(argv: list[str] | None = None) -> int:
    from .workload import Workload

    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, choices=MODELS)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--quick", action="store_true", help="1 round, few iterations: a smoke test, not numbers")
    parser.add_argument("--methods", help="comma-separated method keys (the reference is always added)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 8, --quick 1)")
    parser.add_argument("--latency-iters", type=int)
    parser.add_argument("--throughput-iters", type=int)
    parser.add_argument("--warmup", type=int)
    parser.add_argument("--perf-concurrency", help="perf_analyzer's requests in flight for the Triton methods, "
                        "comma-separated (default 1,4,16; --quick 1)")
    parser.add_argument("--workloads", help="comma-separated, of fixed,varlen,corpus (default all three); "
                        "'precision' alone runs bench.precision (reduced precision on encode) instead")
    parser.add_argument("--corpus-size", type=int, help="texts in the corpus workload (default 2000; "
                        "bert-base-uncased 500; --quick 64)")
    parser.add_argument("--no-rss", action="store_true", help="skip the peak-RSS probe subprocesses")
    parser.add_argument("--no-chart", action="store_true")
    parser.add_argument("--out", type=Path, help="default nest/<model>/bench.json (bench.cuda.json on cuda)")
    args = parser.parse_args(argv)
    if args.workloads and "precision" in args.workloads.split(","):
        return _precision(parser, args)

    workload = Workload.quick(args.device) if args.quick else Workload(device=args.device)
    changes = {k: v for k, v in (("rounds", args.rounds), ("latency_iters", args.latency_iters),
                                 ("throughput_iters", args.throughput_iters), ("warmup", args.warmup)) if v is not None}
    if args.no_rss:
        changes["rss"] = False
    if args.corpus_size is not None:
        changes["corpus_size"] = args.corpus_size
    elif not args.quick and args.model in CORPUS_SIZE:
        changes["corpus_size"] = CORPUS_SIZE[args.model]
    if args.workloads:
        chosen = tuple(w.strip() for w in args.workloads.split(",") if w.strip())
        known = ("fixed", "varlen", "corpus")
        if not chosen or set(chosen) - set(known):
            parser.error(f"--workloads takes some of {', '.join(known)}, found {args.workloads!r}")
        changes["workloads"] = tuple(w for w in known if w in chosen)
    if args.perf_concurrency:
        changes["perf_concurrency"] = tuple(int(n) for n in args.perf_concurrency.split(",") if n.strip())
    workload = replace(workload, **changes)
    keys = [k.strip() for k in args.methods.split(",") if k.strip()] if args.methods else None
    out = args.out or default_out(args.model, args.device)
    result = run_bench(args.model, workload, keys, out, chart=not args.no_chart)
    from .report import markdown_table

    print(markdown_table(result))
    print(f"\nwrote {out} in {result['seconds']} s")
    gc.collect()
    return 0


def _precision(parser: argparse.ArgumentParser, args) -> int:
    """`--workloads precision`: the precision bench (bench/precision.py), its own methods and rounds."""
    if args.workloads.strip() != "precision" or args.device != "cpu":
        parser.error("--workloads precision runs alone, on the cpu (python -m bench.precision)")
    from . import precision

    argv = ["--model", args.model]
    for flag, value in (("--methods", args.methods), ("--rounds", args.rounds), ("--out", args.out)):
        if value is not None:
            argv += [flag, str(value)]
    argv += ["--quick"] * args.quick + ["--no-rss"] * args.no_rss
    return precision.main(argv)
