"""Interleaved CPU timing and profiles of Linnet against transformers (issue 7, "make it fast").

    python bench/profile_cpu.py                       # every target, 5 interleaved rounds
    python bench/profile_cpu.py --targets torch,load  # some of them
    python bench/profile_cpu.py --profile torch       # where the time goes (also: onnx, runtime)

The targets are ratios measured within one run, so a busy shared machine slows both sides
alike: each round runs every contender once (in a rotating order) and a ratio is the median
over rounds of the per-round ratios.  B=1, S=128, f32, full-size bert-base-uncased with
synthetic weights (`tests/fixtures/checkpoints.py`), in a private offline HF cache under
$LINNET_PROFILE_HOME (default /tmp/linnet-profile), which is kept between runs.

| target | ours | reference | goal |
| --- | --- | --- | --- |
| torch | nest.load(backend="torch") | BertModel.from_pretrained (SDPA), inference_mode | <= 0.91 |
| compile | nest.load(backend="torch", mode="compile"): inductor, frozen weights | the same eager BertModel | <= 0.91 |
| onnx | nest.load(backend="onnx") | the same BertModel through torch.onnx.export, same ORT options | <= 0.83 |
| load | nest.load wall time, files and generated source cached | from_pretrained | <= 0.5 |
| jax | nest.load(backend="jax"), jitted | transformers eager | <= 1.0 |
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

HOME = Path(os.environ.get("LINNET_PROFILE_HOME", "/tmp/linnet-profile"))
os.environ["HF_HOME"] = str(HOME / "hf")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ.setdefault("LINNET_CACHE", str(HOME / "linnet"))
for _override in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE"):
    os.environ.pop(_override, None)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

B, S = 1, 128
GOALS = {"torch": 0.91, "compile": 0.91, "onnx": 0.83, "load": 0.5, "jax": 1.0}


def checkpoint():
    from fixtures.checkpoints import BERT_BASE_REPO, BERT_BASE_REVISION, repo_cache_dir, write_synthetic_bert_base

    hub = HOME / "hf" / "hub"
    snapshot = repo_cache_dir(hub, BERT_BASE_REPO) / "snapshots" / BERT_BASE_REVISION
    if not (snapshot / "model.safetensors").exists():
        hub.mkdir(parents=True, exist_ok=True)
        print("writing the synthetic bert-base checkpoint ...", flush=True)
        write_synthetic_bert_base(hub)
    return BERT_BASE_REPO, BERT_BASE_REVISION


def inputs(batch=B, seq=S, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 30522, size=(batch, seq), dtype=np.int64),
            rng.integers(0, 2, size=(batch, seq), dtype=np.int64))


def hf_model():
    import torch
    from transformers import BertModel

    repo, revision = checkpoint()
    return BertModel.from_pretrained(repo, revision=revision, dtype=torch.float32).eval()


def hf_onnx_session(model, options):
    """transformers' BertModel through torch.onnx.export, opened with our session options."""
    import onnxruntime as ort
    import torch

    path = HOME / "hf_bert_base.onnx"
    if not path.exists():
        tokens, types = inputs()
        args = (torch.from_numpy(tokens), torch.from_numpy(np.ones_like(tokens)), torch.from_numpy(types))
        tmp = path.with_suffix(".tmp.onnx")

        class Wrapped(torch.nn.Module):  # keyword arguments, as transformers' forward wants them
            def __init__(self):
                super().__init__()
                self.bert = model

            def forward(self, input_ids, attention_mask, token_type_ids):
                out = self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
                return out.last_hidden_state, out.pooler_output

        with torch.inference_mode(False), torch.no_grad():
            torch.onnx.export(Wrapped().eval(), args, str(tmp), input_names=["input_ids", "attention_mask", "token_type_ids"],
                              output_names=["last_hidden_state", "pooler_output"], opset_version=17,
                              dynamic_axes={n: {0: "B", 1: "S"} for n in ("input_ids", "attention_mask",
                                                                        "token_type_ids")},
                              dynamo=False)
        os.replace(tmp, path)
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


def ort_options():
    import onnxruntime as ort

    from linnet.backends.onnx_runtime import physical_cores

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = physical_cores()
    return options


def timed(fn, calls):
    """The median wall time of `calls` calls, after one warm-up."""
    fn()
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def interleave(contenders: dict, rounds: int, calls: int) -> dict[str, list[float]]:
    names = list(contenders)
    results = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            results[n].append(timed(contenders[n], calls))
    return results


def report(target, results, ours, ref):
    ratios = [a / b for a, b in zip(results[ours], results[ref])]
    ratio = statistics.median(ratios)
    print(f"{target:6s} {ours} {statistics.median(results[ours]) * 1e3:8.1f} ms   "
          f"{ref} {statistics.median(results[ref]) * 1e3:8.1f} ms   ratio {ratio:.3f} "
          f"(rounds {', '.join(f'{x:.3f}' for x in ratios)})  goal <= {GOALS[target]}  "
          f"{'OK' if ratio <= GOALS[target] else 'MISSED'}", flush=True)
    return ratio


def bench_latency(targets, rounds, calls, **load_options):
    import torch

    from linnet import nest

    tokens, types = inputs()
    t_tokens, t_types = torch.from_numpy(tokens), torch.from_numpy(types)
    hf = hf_model()

    def hf_eager():
        with torch.inference_mode():
            return hf(input_ids=t_tokens, token_type_ids=t_types).last_hidden_state

    contenders = {"hf_eager": hf_eager}
    if "torch" in targets:
        ours = nest.load("bert-base-uncased", backend="torch", **load_options)
        contenders["linnet_torch"] = lambda: ours(tokens, types)
        _parity("torch", ours(tokens, types), hf_eager())
    if "compile" in targets:  # first call compiles (~17 s), then a frozen static-shape graph
        compiled = nest.load("bert-base-uncased", backend="torch", mode="compile")
        contenders["linnet_compile"] = lambda: compiled(tokens, types)
        _parity("compile", compiled(tokens, types), hf_eager())
    if "jax" in targets:
        ours_jax = nest.load("bert-base-uncased", backend="jax")
        contenders["linnet_jax"] = lambda: ours_jax(tokens, types).block_until_ready()
        _parity("jax", np.asarray(ours_jax(tokens, types)), hf_eager())
    if "onnx" in targets:
        options = ort_options()
        session = hf_onnx_session(hf, options)
        feeds = {"input_ids": tokens, "attention_mask": np.ones_like(tokens), "token_type_ids": types}
        contenders["hf_onnx_ort"] = lambda: session.run(["last_hidden_state"], feeds)[0]
        ours_onnx = nest.load("bert-base-uncased", backend="onnx", providers=["CPUExecutionProvider"])
        contenders["linnet_onnx"] = lambda: ours_onnx(tokens, types)
        _parity("onnx", ours_onnx(tokens, types), hf_eager())
        print(f"linnet_onnx session options: {ours_onnx.runtime.session_choice.describe()} "
              f"(measured: {ours_onnx.runtime.session_choice.measured})", flush=True)
        # The default session beside the measured one: what the option search bought.
        plain_onnx = nest.load("bert-base-uncased", backend="onnx", providers=["CPUExecutionProvider"],
                               kernels="default")
        contenders["linnet_onnx_default"] = lambda: plain_onnx(tokens, types)
        # transformers' graph opened with the options Linnet chose: the graphs compared alike.
        from linnet.backends.onnx_options import default_settings, session_options

        same = hf_onnx_session(hf, session_options({**default_settings(options.intra_op_num_threads),
                                                    **ours_onnx.runtime.session_choice.settings}))
        contenders["hf_onnx_ort_same_options"] = lambda: same.run(["last_hidden_state"], feeds)[0]
    results = interleave(contenders, rounds, calls)
    ratios = {}
    if "torch" in targets:
        ratios["torch"] = report("torch", results, "linnet_torch", "hf_eager")
    if "compile" in targets:
        ratios["compile"] = report("compile", results, "linnet_compile", "hf_eager")
    if "onnx" in targets:
        ratios["onnx"] = report("onnx", results, "linnet_onnx", "hf_onnx_ort")
        report("onnx", results, "linnet_onnx_default", "hf_onnx_ort")
        report("onnx", results, "linnet_onnx", "hf_onnx_ort_same_options")
    if "jax" in targets:
        ratios["jax"] = report("jax", results, "linnet_jax", "hf_eager")
    return ratios


def _parity(name, ours, ref):
    import torch

    ours = torch.as_tensor(np.asarray(ours))
    print(f"parity {name}: max|diff| vs transformers = {(ours - ref).abs().max().item():.3g}", flush=True)


def bench_load(rounds):
    """nest.load vs from_pretrained, both with files (and Linnet's generated source) cached."""
    import gc

    from linnet import nest

    checkpoint()
    nest.load("bert-base-uncased", backend="torch")  # warm the generated-source cache
    hf_model()
    results = {"linnet_load": [], "hf_from_pretrained": []}
    for r in range(rounds):
        for name in (["linnet_load", "hf_from_pretrained"] if r % 2 == 0 else ["hf_from_pretrained", "linnet_load"]):
            gc.collect()
            t = time.perf_counter()
            model = nest.load("bert-base-uncased", backend="torch") if name == "linnet_load" else hf_model()
            results[name].append(time.perf_counter() - t)
            del model
    return {"load": report("load", results, "linnet_load", "hf_from_pretrained")}


# ------------------------------------------------------------------------ profiles


def profile_torch():
    import torch
    from torch.profiler import ProfilerActivity, profile

    from linnet import nest

    tokens, types = inputs()
    ours = nest.load("bert-base-uncased", backend="torch")
    hf = hf_model()
    for name, fn in (("linnet", lambda: ours(tokens, types)),
                     ("transformers", lambda: hf(input_ids=torch.from_numpy(tokens),
                                                 token_type_ids=torch.from_numpy(types)))):
        with torch.inference_mode():
            for _ in range(3):
                fn()
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(5):
                    fn()
        print(f"== {name} (5 calls)")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


def profile_runtime():
    """Python overhead around the kernels: cProfile of nest's call path."""
    import cProfile
    import pstats

    from linnet import nest

    tokens, types = inputs()
    ours = nest.load("bert-base-uncased", backend="torch")
    ours(tokens, types)
    validator = ours._validators["forward"]
    t = timed(lambda: validator((tokens, types), {}), 200)
    print(f"input validation: {t * 1e6:.1f} us per call")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(10):
        ours(tokens, types)
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(20)


#: ONNX Runtime kernels that are matrix products (after its fusions).
MATMUL_OPS = {"MatMul", "FusedMatMul", "Gemm"}


def profile_onnx(calls: int = 10):
    """Where ONNX Runtime's time goes at B=1, S=128, per operator, Linnet's graph beside
    transformers' torch.onnx export.  Both sessions get the same options (Linnet's default
    session) and run alternately, so load on a shared machine hits both alike.  Linnet's file
    is the one its runtime runs for `forward` (model.forward.onnx, cut to that output), not
    model.onnx, which also holds the masked-LM head's nodes."""
    import json

    import onnxruntime as ort

    from linnet import nest
    from linnet.backends.onnx_options import default_settings, session_options
    from linnet.backends.onnx_runtime import entry_file

    tokens, types = inputs()
    ours = nest.load("bert-base-uncased", backend="onnx", providers=["CPUExecutionProvider"], kernels="default")
    hf_onnx_session(hf_model(), ort_options())  # writes the export once
    files = {"linnet": (ours.runtime.folder / entry_file("forward"),
                        {"tokens": tokens.astype(np.int32), "token_types": types.astype(np.int32),
                         "attention_mask": np.ones_like(tokens, dtype=np.int32)}),
             "transformers": (HOME / "hf_bert_base.onnx", {"input_ids": tokens, "token_type_ids": types,
                                                           "attention_mask": np.ones_like(tokens)})}
    sessions = {}
    for name, (path, feeds) in files.items():
        options = session_options(default_settings(ort_options().intra_op_num_threads))
        options.enable_profiling = True
        options.profile_file_prefix = str(HOME / f"ort_{name}")
        session = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
        out = [session.get_outputs()[0].name]
        for _ in range(2):  # warm-up runs, in the trace too; left out below by skipping them
            session.run(out, feeds)
        sessions[name] = (session, out, feeds)
    walls = {name: [] for name in sessions}
    for _ in range(calls):
        for name, (session, out, feeds) in sessions.items():
            walls[name].append(timed(lambda: session.run(out, feeds), 1))
    for name, (session, _, _) in sessions.items():
        _print_ort_profile(name, json.loads(Path(session.end_profiling()).read_text()), calls,
                           statistics.median(walls[name]))


def _print_ort_profile(name: str, trace: list, calls: int, wall: float) -> None:
    """Per-operator kernel time of the last runs of a trace (the warm-ups are skipped)."""
    runs = [ev for ev in trace if ev.get("cat") == "Session" and ev["name"] == "model_run"]
    first_timed = runs[-2 * calls]["ts"] if len(runs) >= 2 * calls else 0  # timed() runs twice per call
    by_op: dict[str, float] = {}
    nodes = 0
    timed_runs = min(len(runs), 2 * calls)
    for ev in trace:
        if ev.get("cat") == "Node" and ev["name"].endswith("_kernel_time") and ev["ts"] >= first_timed:
            op = ev["args"].get("op_name", "?")
            by_op[op] = by_op.get(op, 0.0) + ev["dur"] / (1e3 * timed_runs)
            nodes += 1
    total = sum(by_op.values())
    matmul = sum(ms for op, ms in by_op.items() if op in MATMUL_OPS)
    print(f"== {name}: median wall {wall * 1e3:.1f} ms per run; {nodes // timed_runs} kernels per run, "
          f"{total:.1f} ms kernel time (mean of {timed_runs} runs); GEMMs ({'/'.join(sorted(MATMUL_OPS))}) {matmul:.1f} ms = "
          f"{100 * matmul / total:.1f}%, the rest {total - matmul:.1f} ms", flush=True)
    for op, ms in sorted(by_op.items(), key=lambda kv: -kv[1])[:14]:
        print(f"   {op:28s} {ms:7.2f} ms  {100 * ms / total:5.1f}%")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--targets", default="torch,compile,onnx,jax,load")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=10, help="calls per contender per round")
    parser.add_argument("--profile", choices=["torch", "onnx", "runtime"])
    args = parser.parse_args()
    import torch

    print(f"torch threads {torch.get_num_threads()}, B={B} S={S} f32", flush=True)
    if args.profile:
        {"torch": profile_torch, "onnx": profile_onnx, "runtime": profile_runtime}[args.profile]()
        return
    targets = args.targets.split(",")
    ratios = {}
    latency = [t for t in targets if t in ("torch", "compile", "onnx", "jax")]
    if latency:
        ratios.update(bench_latency(latency, args.rounds, args.calls))
    if "load" in targets:
        ratios.update(bench_load(args.rounds))
    print("summary: " + ", ".join(f"{k} {v:.3f} (goal {GOALS[k]})" for k, v in ratios.items()))


if __name__ == "__main__":
    main()
