"""Where ONNX Runtime's time goes in an ONNX file, and how close its GEMMs come to MLAS's best.

    python -m bench.onnx_profile profile FILE [FILE ...] [--runs 20]   # per op type, per GEMM shape
    python -m bench.onnx_profile roofline [--shapes 128x768x768,...]   # one-MatMul graphs, GFLOP/s
    python -m bench.onnx_profile ab A.onnx B.onnx [--rounds 10]        # interleaved A/B, median ratio
    python -m bench.onnx_profile chain OUT.onnx [--tokens 128]         # the GEMM-only graph of bert-base
    python -m bench.onnx_profile --size 224 profile vit.onnx           # free dims other than B (S; H, W)

`profile` opens each file with ONNX Runtime's profiler on (`SessionOptions.enable_profiling`,
Linnet's default session otherwise), runs it on probe inputs (`linnet.backends.onnx_options.
probe_inputs`: ones for integer inputs, B=1, free dims 128), and sums the kernel time of the
timed runs per op type and, for the matrix products, per shape with the GFLOP/s achieved.
`roofline` times a graph of one MatMul per shape: the weight as an initializer (so MLAS
prepacks it, as it does a Linear's) or, for the attention products, both operands as inputs.
`ab` runs two files alternately (the order flips every round), `--calls` calls a round, and
prints the median of the per-round ratios B/A: on a shared machine the load hits both alike.
None of this asserts a time; docs/performance.md has the figures and the machine's load.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

#: ONNX Runtime kernels that are matrix products (after its own fusions).
GEMM_OPS = ("MatMul", "FusedMatMul", "Gemm", "MatMulInteger", "QAttention", "Attention")
#: bert-base / ViT-base GEMMs at B=1 (M = tokens), the attention products per head batch,
#: and the large-M shape the issue's GEMM figure used.
DEFAULT_SHAPES = ("128x768x768", "128x768x2304", "128x768x3072", "128x3072x768", "197x768x768",
                  "197x768x3072", "197x3072x768", "12:128x64x128", "12:128x128x64", "1024x768x3072")


def threads() -> int:
    from linnet.backends.onnx_runtime import physical_cores

    return physical_cores()


def open_session(path: str, *, profile_prefix: str | None = None, changes: dict | None = None):
    """`path` with Linnet's default session options (plus `changes`), profiling when asked."""
    import onnxruntime as ort

    from linnet.backends.onnx_options import default_settings, session_options

    options = session_options({**default_settings(threads()), **(changes or {})})
    options.log_severity_level = 3  # no warnings about the initializers a variant left unused
    if profile_prefix:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


#: The size of the free dims after the first (B=1) in the probe inputs: S for a text model,
#: H and W for an image model (`--size 224` for ViT).
SIZE = {"free": 128}


def feeds_for(session) -> dict:
    """Probe inputs as `linnet.backends.onnx_options.probe_inputs` makes them, at `SIZE`."""
    from linnet.backends import onnx_options

    sizes = onnx_options.PROBE_SIZES
    onnx_options.PROBE_SIZES = (SIZE["free"],)
    try:
        feeds = onnx_options.probe_inputs(session)
    finally:
        onnx_options.PROBE_SIZES = sizes
    if feeds is None:
        raise SystemExit(f"no probe input of size {SIZE['free']} runs {session._model_path}")
    return feeds


# ----------------------------------------------------------------------------- the profile


def gemm_flops(op: str, inputs: list[list[int]], output: list[int]) -> float:
    """2*M*K*N summed over the batch for a MatMul-like node, from its input and output shapes."""
    if not inputs or not output:
        return 0.0
    k = inputs[0][-1]  # MatMul, and Gemm as ORT fuses it (transA=0): A is [..., M, K]
    return 2.0 * float(np.prod(output)) * k


def _shapes(arg: list) -> list[list[int]]:
    """ORT's `input_type_shape`: a list of {type: dims} dicts."""
    return [list(next(iter(d.values()))) for d in arg]


def summarise_trace(trace: list, runs: int) -> dict:
    """Kernel time per op type and per (op, shapes) of the last `runs` model runs of a trace."""
    model_runs = [ev for ev in trace if ev.get("cat") == "Session" and ev["name"] == "model_run"]
    first = model_runs[-runs]["ts"] if len(model_runs) >= runs else 0
    by_op: dict[str, float] = {}
    by_shape: dict[tuple, list[float]] = {}
    for ev in trace:
        if ev.get("cat") != "Node" or not ev["name"].endswith("_kernel_time") or ev["ts"] < first:
            continue
        args = ev["args"]
        op = args.get("op_name", "?")
        ms = ev["dur"] / 1e3 / runs
        by_op[op] = by_op.get(op, 0.0) + ms
        if op in GEMM_OPS:
            inputs = _shapes(args.get("input_type_shape", []))
            output = _shapes(args.get("output_type_shape", []))
            key = (op, " x ".join("[" + ",".join(map(str, s)) + "]" for s in inputs[:2]))
            flops = gemm_flops(op, inputs, output[0] if output else [])
            entry = by_shape.setdefault(key, [0.0, 0.0, 0])
            entry[0] += ms
            entry[1] += flops / runs
            entry[2] += 1
    walls = [ev["dur"] / 1e3 for ev in model_runs[-runs:]]
    return {"by_op": by_op, "by_shape": by_shape, "wall_ms": statistics.median(walls) if walls else 0.0}


def profile(paths: list[str], runs: int) -> dict[str, dict]:
    """Each file's trace summary; the files run alternately, one run each in turn, so a busy
    spell of a shared machine lands on all of them alike."""
    sessions = {}
    with tempfile.TemporaryDirectory(prefix="ort-profile-") as traces:
        for index, path in enumerate(paths):
            session = open_session(path, profile_prefix=f"{traces}/trace{index}")
            feeds, out = feeds_for(session), [session.get_outputs()[0].name]
            for _ in range(3):  # warm-up runs, left out of the summary
                session.run(out, feeds)
            sessions[path] = (session, out, feeds)
        for _ in range(runs):
            for session, out, feeds in sessions.values():
                session.run(out, feeds)
        return {path: summarise_trace(json.loads(Path(s.end_profiling()).read_text()), runs)
                for path, (s, _, _) in sessions.items()}


def print_profile(name: str, summary: dict, runs: int) -> None:
    by_op, total = summary["by_op"], sum(summary["by_op"].values())
    gemm = sum(ms for op, ms in by_op.items() if op in GEMM_OPS)
    print(f"== {name}: model_run median {summary['wall_ms']:.1f} ms; kernels {total:.1f} ms "
          f"(mean of {runs} runs); GEMM {gemm:.1f} ms = {100 * gemm / max(total, 1e-9):.1f}%")
    print("| op type | ms | % |\n| --- | ---: | ---: |")
    for op, ms in sorted(by_op.items(), key=lambda kv: -kv[1]):
        if ms >= 0.05:
            print(f"| {op} | {ms:.2f} | {100 * ms / total:.1f} |")
    print("| GEMM (op, shapes) | nodes | ms | GFLOP | GFLOP/s |\n| --- | ---: | ---: | ---: | ---: |")
    for (op, shapes), (ms, flops, count) in sorted(summary["by_shape"].items(), key=lambda kv: -kv[1][0]):
        n = count // runs
        print(f"| {op} {shapes} | {n} | {ms:.2f} | {flops / 1e9:.3f} | {flops / 1e9 / (ms / 1e3):.0f} |")
    print(flush=True)


# ----------------------------------------------------------------------------- the roofline


def parse_shape(text: str) -> tuple[int, int, int, int]:
    """"M x K x N" or "batch:MxKxN" (a batched product of two inputs) -> (batch, M, K, N);
    batch 0 means a plain MatMul against a constant weight."""
    batch, _, mkn = text.rpartition(":")
    m, k, n = (int(v) for v in mkn.split("x"))
    return int(batch or 0), m, k, n


def one_matmul_model(batch: int, m: int, k: int, n: int):
    """A one-node graph: x[M,K] @ W[K,N] (W an initializer) or, batched, a[b,M,K] @ b[b,K,N]."""
    from onnx import TensorProto, helper, numpy_helper

    f32 = TensorProto.FLOAT
    if batch:
        inputs = [helper.make_tensor_value_info("a", f32, [batch, m, k]),
                  helper.make_tensor_value_info("b", f32, [batch, k, n])]
        initializers = []
        out_dims = [batch, m, n]
    else:
        inputs = [helper.make_tensor_value_info("a", f32, [m, k])]
        weight = np.random.default_rng(0).standard_normal((k, n)).astype(np.float32) * 0.02
        initializers = [numpy_helper.from_array(weight, "b")]
        out_dims = [m, n]
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"])], "one_matmul", inputs,
                              [helper.make_tensor_value_info("y", f32, out_dims)], initializer=initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def gemm_chain_model(layers: int, tokens: int, width: int, hidden: int):
    """Only the Linear products of a BERT-like encoder, in order, each with its own weight
    (4 x [width, width], [width, hidden], [hidden, width] a layer): the GEMM floor of the model,
    with the weights streaming from memory as they do in it.  Weights scaled by 1/sqrt(K)
    keep the activations near unit size (no denormals)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, initializers, x = [], [], "x"
    for layer in range(layers):
        for i, (k, n) in enumerate([(width, width)] * 4 + [(width, hidden), (hidden, width)]):
            name = f"w{layer}_{i}"
            initializers.append(numpy_helper.from_array(
                (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), name))
            nodes.append(helper.make_node("MatMul", [x, name], [name + "_y"]))
            x = name + "_y"
    f32 = TensorProto.FLOAT
    graph = helper.make_graph(nodes, "gemm_chain", [helper.make_tensor_value_info("x", f32, [tokens, width])],
                              [helper.make_tensor_value_info(x, f32, [tokens, width])], initializer=initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def write_gemm_chain(path: str, layers: int = 12, tokens: int = 128, width: int = 768, hidden: int = 3072) -> str:
    import onnx

    onnx.save(gemm_chain_model(layers, tokens, width, hidden), path, save_as_external_data=True,
              location=Path(path).name + ".data")
    return path


def roofline(shapes: list[str], seconds_per_shape: float = 1.5, cpu_time: bool = False) -> list[dict]:
    """GFLOP/s of one MatMul per shape, the weight hot in cache (the same one every call).
    cpu_time: one thread, timed by its CPU time (as in `ab`)."""
    import onnx

    clock = time.thread_time if cpu_time else time.perf_counter

    rows = []
    with tempfile.TemporaryDirectory(prefix="ort-roofline-") as folder:
        for text in shapes:
            batch, m, k, n = parse_shape(text)
            path = Path(folder) / f"{text.replace(':', '_')}.onnx"
            onnx.save(one_matmul_model(batch, m, k, n), str(path))
            session = open_session(str(path), changes={"intra_op_num_threads": 1} if cpu_time else None)
            feeds = feeds_for(session)
            for _ in range(5):
                session.run(None, feeds)
            times, deadline = [], time.perf_counter() + seconds_per_shape
            while time.perf_counter() < deadline or len(times) < 10:
                t = clock()
                session.run(None, feeds)
                times.append(clock() - t)
            best, med = min(times), statistics.median(times)
            flops = 2.0 * max(batch, 1) * m * k * n
            rows.append({"shape": text, "median_ms": med * 1e3, "best_ms": best * 1e3,
                         "gflops_median": flops / med / 1e9, "gflops_best": flops / best / 1e9})
    return rows


def print_roofline(rows: list[dict]) -> None:
    print("| shape (batch:MxKxN) | median ms | GFLOP/s (median) | GFLOP/s (best) |\n| --- | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['shape']} | {r['median_ms']:.3f} | {r['gflops_median']:.0f} | {r['gflops_best']:.0f} |")
    print(flush=True)


# ----------------------------------------------------------------------------- A/B


def _timed_calls(session, out, feeds, calls: int, clock=time.perf_counter) -> float:
    start = clock()
    for _ in range(calls):
        session.run(out, feeds)
    return (clock() - start) / calls


def open_pair(path_a: str, path_b: str, changes_a: dict | None, changes_b: dict | None):
    """Sessions, feeds and output names for A and B, and max |B - A| of their first outputs."""
    sessions = {"a": open_session(path_a, changes=changes_a), "b": open_session(path_b, changes=changes_b)}
    feeds = {k: feeds_for(s) for k, s in sessions.items()}  # two exports may name their inputs apart
    outs = {k: [s.get_outputs()[0].name] for k, s in sessions.items()}
    results = {k: s.run(outs[k], feeds[k])[0] for k, s in sessions.items()}
    diff = float(np.max(np.abs(results["a"].astype(np.float64) - results["b"]))) if results["a"].shape == \
        results["b"].shape else float("inf")
    return sessions, feeds, outs, diff


def alternate(block, rounds: int) -> dict:
    """Times `block("a")` and `block("b")` once per round, the two taking turns at going first,
    so a busy spell lands on both; the summary is the median of each and of the ratios B / A."""
    times = {"a": [], "b": []}
    for r in range(rounds):
        for k in (("a", "b") if r % 2 == 0 else ("b", "a")):
            times[k].append(block(k))
    ratios = [b / a for a, b in zip(times["a"], times["b"])]
    return {"a_ms": 1e3 * statistics.median(times["a"]), "b_ms": 1e3 * statistics.median(times["b"]),
            "ratio": statistics.median(ratios), "ratios": [round(x, 3) for x in ratios],
            "load": os.getloadavg()[0]}


def ab(path_a: str, path_b: str, rounds: int, calls: int, changes_a: dict | None = None,
       changes_b: dict | None = None, cpu_time: bool = False) -> dict:
    """Median over rounds of time(B) / time(A), A and B alternating first; also max |B - A|.

    cpu_time: one intra-op thread, which ONNX Runtime runs on the calling thread, timed by that
    thread's CPU time: on a machine loaded several times over, wall time mostly measures the
    other processes, while the CPU time of the one thread doing the work barely moves (cache
    sharing still does).  It compares the work of two graphs, not their parallel scaling."""
    clock = time.thread_time if cpu_time else time.perf_counter
    if cpu_time:
        changes_a = {**(changes_a or {}), "intra_op_num_threads": 1}
        changes_b = {**(changes_b or {}), "intra_op_num_threads": 1}
    sessions, feeds, outs, diff = open_pair(path_a, path_b, changes_a, changes_b)
    for k, s in sessions.items():
        _timed_calls(s, outs[k], feeds[k], 2)
    return {**alternate(lambda k: _timed_calls(sessions[k], outs[k], feeds[k], calls, clock), rounds),
            "max_abs_diff": diff}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.onnx_profile", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("profile")
    p.add_argument("files", nargs="+")
    p.add_argument("--runs", type=int, default=20)
    r = sub.add_parser("roofline")
    r.add_argument("--shapes", default=",".join(DEFAULT_SHAPES))
    r.add_argument("--seconds", type=float, default=1.5, help="timing per shape")
    r.add_argument("--cpu-time", action="store_true", help="one thread, timed by its CPU time (see `ab`)")
    c = sub.add_parser("chain", help="write the GEMM-only chain graph (`gemm_chain_model`) to a file")
    c.add_argument("out")
    c.add_argument("--tokens", type=int, default=128)
    a = sub.add_parser("ab")
    a.add_argument("a")
    a.add_argument("b")
    a.add_argument("--rounds", type=int, default=10)
    a.add_argument("--calls", type=int, default=5)
    a.add_argument("--b-options", default="{}", help="JSON session changes for B (onnx_options keys)")
    a.add_argument("--cpu-time", action="store_true", help="one thread, timed by its CPU time (see `ab`)")
    parser.add_argument("--size", type=int, default=128, help="free dims after the batch (S; H and W)")
    args = parser.parse_args(argv)
    SIZE["free"] = args.size
    print(f"load average {os.getloadavg()[0]:.2f}; ORT threads {threads()}", flush=True)
    if args.command == "profile":
        for path, summary in profile(args.files, args.runs).items():
            print_profile(path, summary, args.runs)
    elif args.command == "roofline":
        print_roofline(roofline(args.shapes.split(","), args.seconds, args.cpu_time))
    elif args.command == "chain":
        print(write_gemm_chain(args.out, tokens=args.tokens))
    else:
        print(json.dumps(ab(args.a, args.b, args.rounds, args.calls, changes_b=json.loads(args.b_options),
                            cpu_time=args.cpu_time)))
    print(f"load average {os.getloadavg()[0]:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
