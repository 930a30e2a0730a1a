"""Interleaved A/B of ONNX emitter variants on full-size ViT (B=1) and bert-base (B=1, S=128).

    python -m bench.emit_ab export VARIANT [--model vit|bert]       # prints the export's path
    python -m bench.emit_ab ab A B [--model vit|bert] [--rounds 12] [--calls 3] [--cpu-time]
    python -m bench.emit_ab profile A [B] [--model vit|bert] [--runs 20]
    python -m bench.emit_ab reference [--model vit]                 # transformers -> torch.onnx
    python -m bench.emit_ab rewrite REWRITE [VARIANT]               # a prototype rewrite's file

Names for A and B: a variant, `reference`, `floor` / `floor-nobias` (`gemm_floor_model`), or
the path of an .onnx file (`rewrite` prints one).

A variant is a named setting of the ONNX emitter (`VARIANTS`: module attributes of
`linnet.backends.onnx_graph`, or `module.attr` of another `linnet.backends` module).  `export` runs in a child process per variant, with the
setting applied and a Linnet cache of its own (`/tmp/linnet-emit-ab/<model>-<variant>`), and
loads the model as users do (`nest.load(..., backend="onnx")`, so the optimiser's passes and
the cut-down per-entry file apply); the file the runtime opens is what is timed.  `ab` opens
both files with Linnet's default session options and times them in alternating blocks
(`bench.onnx_profile.ab`: the order flips every round, the ratio B/A of each round, median
reported), so load from other processes on a shared machine falls on both alike.  Nothing here
asserts a time; docs/backend-onnx.md has the figures.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path("/tmp/linnet-emit-ab")

#: variant -> {`module.attr` of linnet.backends (or `passes:<backend>`, the passes its record
#: runs): value}.  "base" is the emitter as
#: committed.  The MultiHeadAttention variants measured in docs/backend-onnx.md ("mha",
#: "mha_bnsh": `ATTENTION_KERNEL = "multihead"` / `"multihead-bnsh"`) need the emission of
#: commit a6fc8dc, reverted after they lost; check it out to rerun them.
VARIANTS: dict[str, dict] = {
    "base": {},
    "matmul_linear": {"onnx_fused.GEMM_DTYPES": ()},
    "qkv": {"passes:onnx": ("fuse_linears", "fold_attention_scale", "dead_rows", "pack_tokens")},
}

MODELS = {"vit": ("vit-base-patch16-224", "forward", 224), "bert": ("bert-base-uncased", "forward", 128)}


def _weights(model: str) -> Path:
    if model == "vit":
        from bench.vision import weights_folder

        return weights_folder(MODELS[model][0])[0]
    from bench.weights import resolve

    return resolve(MODELS[model][0]).snapshot()


def export(variant: str, model: str) -> Path:
    """In this process: apply the variant, load the model (which exports it), return its file."""
    import importlib

    for name, value in VARIANTS[variant].items():
        if name.startswith("passes:"):
            from dataclasses import replace

            from linnet.backends import RECORDS

            backend = name.partition(":")[2]
            RECORDS[backend] = replace(RECORDS[backend], passes=value)
            continue
        module_name, _, attr = name.rpartition(".")
        module = importlib.import_module(f"linnet.backends.{module_name or 'onnx_graph'}")
        if not hasattr(module, attr):
            raise SystemExit(f"{module.__name__} has no setting {attr!r}")
        setattr(module, attr, value)
    from linnet import nest

    entry_model, entry, _ = MODELS[model]
    nest.load(entry_model, backend="onnx", weights=_weights(model), kernels="default")
    found = sorted(Path(os.environ["LINNET_CACHE"]).glob(f"generated/onnx/*/model.{entry}.onnx"),
                   key=lambda p: p.stat().st_mtime)
    if not found:
        raise SystemExit(f"no model.{entry}.onnx under {os.environ['LINNET_CACHE']}")
    return found[-1]


def exported(variant: str, model: str) -> Path:
    """The variant's export, written by a child process on first use."""
    cache = ROOT / f"{model}-{variant}"
    env = {**os.environ, "LINNET_CACHE": str(cache)}
    out = subprocess.run([sys.executable, "-m", "bench.emit_ab", "export", variant, "--model", model],
                         env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"export of {variant} failed:\n{out.stderr[-3000:]}")
    return Path(out.stdout.strip().splitlines()[-1])


def reference(model: str) -> Path:
    """transformers' ViTForImageClassification through torch.onnx.export, as bench/vision.py does."""
    path = ROOT / "reference-vit" / "model.onnx"
    if not path.exists():
        import torch
        from transformers import ViTForImageClassification

        path.parent.mkdir(parents=True, exist_ok=True)
        hf = ViTForImageClassification.from_pretrained(str(_weights("vit")), dtype=torch.float32).eval()
        torch.onnx.export(hf, (torch.zeros(1, 3, 224, 224),), str(path), input_names=["pixel_values"],
                          output_names=["logits"], dynamic_axes={"pixel_values": {0: "B"}, "logits": {0: "B"}},
                          dynamo=False)
    return path


def gemm_floor_model(layers: int = 12, tokens: int = 197, width: int = 768, hidden: int = 3072, heads: int = 12,
                     biases: bool = True):
    """Only the matrix products of Linnet's ViT graph, in its shapes and order: the patch
    embedding, per layer Q, K, V, the two attention products per head, the output, up and
    down projections (each Linear a Gemm with its bias, as Linnet emits it), the last layer's
    queries and everything after its keys and values on the class token's row alone (dead
    rows), and the classifier.  No LayerNorm, softmax, GELU, residual or data movement beyond
    free Reshapes: what the graph costs if everything but its GEMMs were free.  Weights are
    scaled by 1/sqrt(K) (V's also by the scores' size), so activations stay near unit size
    though no softmax bounds the scores."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits = [], []
    head = width // heads

    def const(name, array):
        inits.append(numpy_helper.from_array(array, name))
        return name

    def shape(name, dims):
        return const(name, np.array(dims, np.int64))

    def linear(x, name, k, n, gain=1.0):
        w = const(name + ".w", (gain * rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32))
        b = [const(name + ".b", (0.01 * rng.standard_normal(n)).astype(np.float32))] if biases else []
        nodes.append(helper.make_node("Gemm", [x, w, *b], [name]))
        return name

    def reshape(x, name, dims):
        nodes.append(helper.make_node("Reshape", [x, shape(name + ".shape", dims)], [name]))
        return name

    def matmul(a, b, name):
        nodes.append(helper.make_node("MatMul", [a, b], [name]))
        return name

    x = linear("patches", "patch", width, width)  # the input has the class token's row too
    rows = tokens
    for layer in range(layers):
        last = layer == layers - 1
        q_rows = 1 if last else rows
        q_in = x
        if last:  # the class token's row
            q_in = f"l{layer}.cls"
            nodes.append(helper.make_node("Slice", [x, shape("start", [0]), shape("stop", [1])], [q_in]))
        q = reshape(linear(q_in, f"l{layer}.q", width, width), f"l{layer}.q4", [heads, q_rows, head])
        # K and V read the input, not x: x (q k^T) v would be cubic in x and overflow f32
        # within a few layers; the work is the same.
        k = reshape(linear("patches", f"l{layer}.k", width, width), f"l{layer}.k4", [heads, head, rows])
        # Scores are ~sqrt(head) and a context sums `rows` of them: V's gain undoes both.
        v = reshape(linear("patches", f"l{layer}.v", width, width, 1 / np.sqrt(head * rows)), f"l{layer}.v4", [heads, rows, head])
        scores = matmul(q, k, f"l{layer}.scores")
        context = reshape(matmul(scores, v, f"l{layer}.context"), f"l{layer}.context2", [q_rows, width])
        out = linear(context, f"l{layer}.out", width, width)
        up = linear(out, f"l{layer}.up", width, hidden)
        x = linear(up, f"l{layer}.down", hidden, width)
    logits = linear(x, "classifier", width, 1000)
    f32 = TensorProto.FLOAT
    graph = helper.make_graph(nodes, "vit_gemm_floor", [helper.make_tensor_value_info("patches", f32, [tokens, width])],
                              [helper.make_tensor_value_info(logits, f32, [1, 1000])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def floor(biases: bool = True) -> Path:
    import onnx

    path = ROOT / ("floor-vit" if biases else "floor-nobias-vit") / "model.onnx"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(gemm_floor_model(biases=biases), str(path), save_as_external_data=True,
                  location="model.onnx.data")
    return path


# ------------------------------------------------------------------ prototype rewrites
# Forms tried as rewrites of an exported graph before any emitter change (each lost; see
# docs/backend-onnx.md): `python -m bench.emit_ab rewrite skip-layernorm base`.


def _graph_index(graph):
    producer = {o: n for n in graph.node for o in n.output}
    readers: dict[str, list] = {}
    for n in graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    return producer, readers


def _linear_restore(node, producer, readers):
    """The Gemm (with a bias) whose rows `node` reshapes back, when the Gemm has no other reader."""
    gemm = producer.get(node.input[0]) if node.op_type == "Reshape" else None
    if gemm is None or gemm.op_type != "Gemm" or len(gemm.input) != 3 or len(readers[gemm.output[0]]) != 1:
        return None
    return gemm


def rewrite_skip_layernorm(model, move_bias: bool = False) -> int:
    """residual Add + LayerNormalization -> com.microsoft.SkipLayerNormalization, its fourth
    output the sum the next residual reads; move_bias: the out/down projection's Gemm bias
    becomes the kernel's bias input."""
    from onnx import helper

    graph = model.graph
    params = {t.name for t in graph.initializer}
    producer, readers = _graph_index(graph)
    replaced, dropped = {}, set()
    for n in graph.node:
        add = producer.get(n.input[0]) if n.op_type == "LayerNormalization" else None
        if add is None or add.op_type != "Add" or any(i in params for i in add.input):
            continue
        inputs = [*add.input, *n.input[1:3]]
        for side in add.input if move_bias else ():
            gemm = _linear_restore(producer[side], producer, readers) if side in producer else None
            if gemm is not None and len(readers[side]) == 1:
                inputs.append(gemm.input.pop())
                break
        eps = next(a.f for a in n.attribute if a.name == "epsilon")
        replaced[id(n)] = helper.make_node("SkipLayerNormalization", inputs, [n.output[0], "", "", add.output[0]],
                                           name=n.name + "/skip", domain="com.microsoft", epsilon=eps)
        dropped.add(id(add))
    nodes = [replaced.get(id(n), n) for n in graph.node if id(n) not in dropped]
    del graph.node[:]
    graph.node.extend(nodes)
    return len(replaced)


def rewrite_bias_gelu(model) -> int:
    """The up projection as a bias-free Gemm and com.microsoft.BiasGelu (bias + erf GELU),
    in place of Gemm(bias) and the five-node erf GELU (as the reference export runs it)."""
    from onnx import helper

    graph = model.graph
    producer, readers = _graph_index(graph)
    dropped, after = set(), {}
    for n in graph.node:
        gelu = readers.get(n.output[0], []) if n.op_type == "Reshape" else []
        gemm = _linear_restore(n, producer, readers)
        if gemm is None or not gelu or not all("gelu" in r.name for r in gelu):
            continue
        scope = gelu[0].name.rsplit("/", 1)[0]
        body = [x for x in graph.node if x.name.rsplit("/", 1)[0] == scope]
        result = next(x for x in body if x.name.endswith("/Mul_2")).output[0]
        after[id(n)] = helper.make_node("BiasGelu", [n.output[0], gemm.input.pop()], [result],
                                        name=scope + "/BiasGelu", domain="com.microsoft")
        dropped |= {id(x) for x in body}
    nodes = []
    for n in graph.node:
        if id(n) not in dropped:
            nodes += [n] + ([after[id(n)]] if id(n) in after else [])
    del graph.node[:]
    graph.node.extend(nodes)
    return len(after)


REWRITES = {"skip-layernorm": rewrite_skip_layernorm,
            "skip-layernorm-bias": lambda m: rewrite_skip_layernorm(m, move_bias=True),
            "bias-gelu": rewrite_bias_gelu}


def rewritten(rewrite: str, variant: str, model: str) -> Path:
    import onnx
    from onnx import helper

    onnx_model = onnx.load(str(_path(variant, model)))
    count = REWRITES[rewrite](onnx_model)
    if not any(o.domain == "com.microsoft" for o in onnx_model.opset_import):
        onnx_model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    path = ROOT / f"{model}-{variant}-{rewrite}" / "model.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(onnx_model, str(path), save_as_external_data=True, location="model.onnx.data")
    print(f"{rewrite}: {count} sites rewritten -> {path}", file=sys.stderr)
    return path


def _path(name: str, model: str) -> Path:
    if name == "reference":
        return reference(model)
    if name.endswith(".onnx"):  # a file made elsewhere (a prototype rewrite)
        return Path(name)
    if name in ("floor", "floor-nobias"):
        return floor(biases=name == "floor")
    return exported(name, model)


def ab(path_a: Path, path_b: Path, rounds: int, calls: int, cpu_time: bool, changes_b: dict | None = None) -> dict:
    """Median over rounds of time(B) / time(A), the two alternating first.  Each block of
    `calls` timed calls starts with one untimed call: the other session's worker threads spin
    for a while after its last call, and a block timed from its first call measured the second
    session of each round ~15% slower whichever it was (ViT, 2 cores).  A block's time is its
    fastest call; cpu_time: one intra-op thread, timed by its CPU time (`onnx_profile.ab`)."""
    import time

    from bench import onnx_profile

    clock = time.thread_time if cpu_time else time.perf_counter
    one = {"intra_op_num_threads": 1} if cpu_time else {}
    sessions, feeds, outs, diff = onnx_profile.open_pair(str(path_a), str(path_b), one, {**(changes_b or {}), **one})

    def block(k: str) -> float:
        sessions[k].run(outs[k], feeds[k])
        times = []
        for _ in range(calls):
            started = clock()
            sessions[k].run(outs[k], feeds[k])
            times.append(clock() - started)
        return min(times)

    return {**onnx_profile.alternate(block, rounds), "max_abs_diff": diff}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.emit_ab", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=("export", "ab", "profile", "reference", "rewrite"))
    parser.add_argument("names", nargs="*")
    parser.add_argument("--model", choices=tuple(MODELS), default="vit")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--cpu-time", action="store_true", help="one thread, timed by its CPU time")
    parser.add_argument("--b-options", default="{}", help="JSON session changes for B (onnx_options keys)")
    args = parser.parse_args(argv)
    from bench import onnx_profile

    onnx_profile.SIZE["free"] = MODELS[args.model][2]
    if args.command == "export":
        print(export(args.names[0], args.model))
    elif args.command == "reference":
        print(reference(args.model))
    elif args.command == "rewrite":
        print(rewritten(args.names[0], args.names[1] if len(args.names) > 1 else "base", args.model))
    elif args.command == "profile":
        paths = [str(_path(n, args.model)) for n in args.names]
        for name, (path, summary) in zip(args.names, onnx_profile.profile(paths, args.runs).items()):
            onnx_profile.print_profile(f"{name} ({path})", summary, args.runs)
    else:
        a, b = (_path(n, args.model) for n in args.names)
        result = ab(a, b, args.rounds, args.calls, args.cpu_time, json.loads(args.b_options))
        print(json.dumps({"model": args.model, "a": args.names[0], "b": args.names[1], "rounds": args.rounds,
                          "calls": args.calls, "cpu_time": args.cpu_time,
                          "b_options": json.loads(args.b_options), **result}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
