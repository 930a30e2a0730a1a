"""`python -m bench.modernbert`: ModernBERT-base (full-size synthetic) latency and peak RSS, Linnet
against transformers, at B=1 and S = 128 and 2048, and on a batch of 32 sentences of their real lengths.

The checkpoint is transformers' own random init at answerdotai/ModernBERT-base's config, written
by `save_pretrained` (`--folder`, default ~/.cache/linnet/bench/hf/modernbert-base-synthetic): speed
and memory are representative, the outputs mean nothing.  Workloads:

* `S=128`, `S=2048`: one sequence of random ids, no padding (B=1).
* `varlen`: 32 sentences, the first sentences of stdlib docstring paragraphs (`bench.corpus`,
  20-200 characters, a seeded sample), at their token counts under all-MiniLM-L6-v2's WordPiece
  tokenizer (the packaged copy: ModernBERT's own tokenizer.json is on the Hub only), [CLS] and
  [SEP] included; random ids in ModernBERT's vocabulary between its [CLS] (50281) and [SEP]
  (50282), right-padded with 0 to the longest, with the attention mask.

Each (method, workload) is one child process: load, one untimed call, then `--iters` timed calls
of the last hidden state; it reports the median seconds, the RSS after load and the peak RSS
(VmHWM: a child's `ru_maxrss` includes its parent's RSS at fork, which Linux carries across
exec), and each sequence's vectors at its first and last real token, which the parent compares
with transformers' SDPA.  Rounds interleave the methods (order reversed every other round).
Methods: transformers' `ModernBertModel` with eager and with SDPA attention; the same model
exported by `torch.onnx.export` (the TorchScript exporter, `dynamo=False`, opset 17, batch and
sequence axes dynamic, traced on a padded batch so the exported masks keep padding) and run by
ONNX Runtime with its default session options (`transformers-onnx-ort`; exported once per
folder, `transformers.onnx` beside the checkpoint; an export that fails is recorded in the
JSON as `export_error` and the method is left out); Linnet's torch and onnx backends with their
default options (onnx runs padding-free where `pack_tokens` applies to `forward`: the JSON's
`linnet_onnx_packing` holds the pass's line for it).

    python -m bench.modernbert                    # 1 round, 3 timed calls each
    python -m bench.modernbert --rounds 2 --iters 5
    python -m bench.modernbert --workloads S=128 --rounds 1 --iters 1 --out /tmp/smoke.json   # a smoke run
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys, time
method, folder, spec, iters, onnx_file = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
import numpy as np

def status_mib(field):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith(field + ":")) / 1024

lengths = spec["lengths"]
rng = np.random.default_rng(spec["seed"])
ids = np.zeros((len(lengths), max(lengths)), np.int64)
mask = np.zeros_like(ids)
for row, n in enumerate(lengths):
    ids[row, :n] = rng.integers(3, 50000, n)
    if spec["cls_sep"]:
        ids[row, 0], ids[row, n - 1] = 50281, 50282
    mask[row, :n] = 1
if method.startswith("transformers-onnx"):
    import onnxruntime as ort
    session = ort.InferenceSession(onnx_file, providers=["CPUExecutionProvider"])
    def call():
        return session.run(None, {"input_ids": ids, "attention_mask": mask})[0]
elif method.startswith("transformers"):
    import torch
    from transformers import ModernBertModel
    model = ModernBertModel.from_pretrained(folder, attn_implementation=method.split("-")[1]).eval()
    def call():
        with torch.inference_mode():
            return model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).last_hidden_state.numpy()
else:
    from linnet import nest
    model = nest.load(folder, backend=method.split("-")[1])
    def call():
        return np.asarray(model.forward(ids.astype(np.int32), mask.astype(np.int32)))
loaded = status_mib("VmRSS")
out = call()
times = []
for _ in range(iters):
    start = time.perf_counter()
    call()
    times.append(time.perf_counter() - start)
result = {"median_s": sorted(times)[len(times) // 2], "times_s": times, "rss_after_load_mib": loaded,
          "peak_rss_mib": status_mib("VmHWM"),  # ru_maxrss would include the parent's RSS at fork
          "first": [[float(v) for v in out[r, 0, :4]] for r in range(len(lengths))],
          "last": [[float(v) for v in out[r, n - 1, :4]] for r, n in enumerate(lengths)]}
print(json.dumps(result))
"""

EXPORT = r"""
import sys, time
folder, out = sys.argv[1], sys.argv[2]
import torch
from transformers import ModernBertModel

class LastHidden(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

model = ModernBertModel.from_pretrained(folder, attn_implementation="sdpa").eval()
ids = torch.randint(3, 50000, (2, 16))
mask = torch.ones(2, 16, dtype=torch.long)
mask[1, 10:] = 0  # traced with padding: the exported graph keeps the mask whatever the input
axes = {"batch": 0, "sequence": 1}
start = time.perf_counter()
with torch.no_grad():
    torch.onnx.export(LastHidden(model), (ids, mask), out, input_names=["input_ids", "attention_mask"],
                      output_names=["last_hidden_state"], opset_version=17, dynamo=False,
                      dynamic_axes={n: {0: "batch", 1: "sequence"} for n in ("input_ids", "attention_mask", "last_hidden_state")})
print(round(time.perf_counter() - start, 1))
"""

METHODS = ("transformers-eager", "transformers-sdpa", "transformers-onnx-ort", "linnet-torch", "linnet-onnx")
WORKLOADS = ("S=128", "S=2048", "varlen")
#: The sentences of the `varlen` workload.
VARLEN_BATCH, VARLEN_SEED, VARLEN_CHARS = 32, 0, (20, 200)
DEFAULT_FOLDER = Path(os.environ.get("LINNET_BENCH_CACHE", Path.home() / ".cache/linnet/bench")) / "hf" / \
    "modernbert-base-synthetic"


def synthetic(folder: Path) -> Path:
    """transformers' random init at ModernBERT-base's config, saved once."""
    if not (folder / "model.safetensors").is_file():
        import torch
        from transformers import ModernBertConfig, ModernBertForMaskedLM

        torch.manual_seed(0)
        ModernBertForMaskedLM(ModernBertConfig(pad_token_id=0)).save_pretrained(folder)
    return folder


def exported(folder: Path) -> tuple[Path | None, dict]:
    """transformers' model as ONNX (exported once per folder, in a child), and what to record."""
    path = folder / "transformers.onnx"
    if path.is_file():
        return path, {"export": "cached", "file": str(path)}
    run = subprocess.run([sys.executable, "-c", EXPORT, str(folder), str(path)], capture_output=True, text=True)
    if run.returncode != 0 or not path.is_file():
        path.unlink(missing_ok=True)
        return None, {"export_error": run.stderr[-3000:]}
    return path, {"export_seconds": float(run.stdout.strip().splitlines()[-1]), "file": str(path)}


def onnx_packing(folder: Path) -> dict:
    """What `pack_tokens` does to the `forward` entry the onnx backend runs (its lines of
    `Optimized.applied` and `notes`): whether linnet-onnx runs the varlen batch padding-free."""
    from linnet import nest
    from linnet.backends import record
    from linnet.middle.optimize import optimize

    ctx, _ = nest.prepare(folder, need_weights=False)
    done = optimize(ctx.program, passes=record("onnx").passes_for())
    lines = [line for line in done.applied + done.notes if line.startswith("forward:")]
    return {"packed": any("runs on the kept tokens" in line for line in lines), "lines": lines}


def varlen_lengths(count: int = VARLEN_BATCH, seed: int = VARLEN_SEED) -> list[int]:
    """Token counts ([CLS] and [SEP] included) of `count` docstring first sentences."""
    from tokenizers import Tokenizer

    from .corpus import stdlib_paragraphs
    from .precision import short_texts
    from .weights import packaged_minilm

    texts = short_texts(stdlib_paragraphs(), count, seed, *VARLEN_CHARS)
    tokenizer = Tokenizer.from_file(str(packaged_minilm() / "tokenizer.json"))
    tokenizer.no_padding()
    return [len(e.ids) for e in tokenizer.encode_batch(texts)]


def workload_spec(name: str) -> dict:
    """What a child builds its inputs from: each sequence's length, the seed of its ids."""
    if name == "varlen":
        return {"lengths": varlen_lengths(), "seed": VARLEN_SEED, "cls_sep": True}
    length = int(name.removeprefix("S="))
    return {"lengths": [length], "seed": length, "cls_sep": False}


def _child(method: str, folder: Path, spec: dict, iters: int, onnx_file: Path | None) -> dict:
    run = subprocess.run([sys.executable, "-c", CHILD, method, str(folder), json.dumps(spec), str(iters),
                          str(onnx_file or "")], capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"{method} {spec['lengths'][:4]}... failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def _max_diff(a: dict, b: dict) -> float:
    return max(abs(x - y) for key in ("first", "last") for ra, rb in zip(a[key], b[key]) for x, y in zip(ra, rb))


def _choice(text: str | None, known: tuple[str, ...], what: str) -> tuple[str, ...]:
    if text is None:
        return known
    picked = tuple(t.strip() for t in text.split(",") if t.strip())
    unknown = [p for p in picked if p not in known]
    if unknown:
        raise SystemExit(f"unknown {what}: {', '.join(unknown)} (known: {', '.join(known)})")
    return picked


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.modernbert", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--folder", type=Path, default=DEFAULT_FOLDER)
    parser.add_argument("--methods", help=f"comma-separated, of {','.join(METHODS)} (default all)")
    parser.add_argument("--workloads", help=f"comma-separated, of {','.join(WORKLOADS)} (default all)")
    parser.add_argument("--out", type=Path, default=Path("nest/modernbert-base/long-inputs-bench.json"))
    args = parser.parse_args(argv)
    methods = _choice(args.methods, METHODS, "methods")
    workloads = _choice(args.workloads, WORKLOADS, "workloads")

    from linnet.contention import ContentionMeter
    from bench.workload import environment, load_average

    folder = synthetic(args.folder)
    env = environment("cpu")
    export: dict = {}
    onnx_file = None
    if "transformers-onnx-ort" in methods:
        onnx_file, export = exported(folder)
        if onnx_file is None:
            print("transformers -> torch.onnx.export failed; transformers-onnx-ort is left out", flush=True)
            methods = tuple(m for m in methods if m != "transformers-onnx-ort")
    specs = {name: workload_spec(name) for name in workloads}
    runs: dict[tuple[str, str], list[dict]] = {(m, w): [] for m in methods for w in workloads}
    meter = ContentionMeter()
    for r in range(args.rounds):
        for name in workloads:
            for method in methods if r % 2 == 0 else tuple(reversed(methods)):
                result = _child(method, folder, specs[name], args.iters, onnx_file)
                runs[method, name].append(result)
                print(f"round {r + 1} {name} {method}: {result['median_s']:.3f} s, peak "
                      f"{result['peak_rss_mib']:.0f} MiB", flush=True)
    contention = meter.stop()
    table: dict[str, dict] = {}
    for name in workloads:
        reference = runs.get(("transformers-sdpa", name))
        for method in methods:
            median = statistics.median(run["median_s"] for run in runs[method, name])
            first = runs[method, name][0]
            row = {"median_s": round(median, 4), "rss_after_load_mib": round(first["rss_after_load_mib"]),
                   "peak_rss_mib": round(max(run["peak_rss_mib"] for run in runs[method, name]))}
            if reference:
                row["x_transformers_sdpa"] = round(median / statistics.median(run["median_s"] for run in reference), 3)
                row["max_abs_diff_first_last_to_sdpa"] = _max_diff(first, reference[0])
            if "transformers-onnx-ort" in methods and method != "transformers-onnx-ort":
                ort = statistics.median(run["median_s"] for run in runs["transformers-onnx-ort", name])
                row["x_transformers_onnx_ort"] = round(median / ort, 3)
            table[f"{method} {name}"] = row
    lengths = specs["varlen"]["lengths"] if "varlen" in specs else None
    result = {"what": "ModernBERT-base full-size synthetic (transformers' random init), the last hidden state: "
                      "median seconds per call of --iters timed calls after one untimed call, and peak RSS, each "
                      "(method, workload) its own process",
              "workloads": {name: ({"batch": len(specs[name]["lengths"]), "lengths": specs[name]["lengths"],
                                    "padded_width": max(specs[name]["lengths"]),
                                    "padding_share": round(1 - sum(lengths) / (len(lengths) * max(lengths)), 3),
                                    "made": f"first sentences of bench.corpus docstring paragraphs, "
                                            f"{VARLEN_CHARS[0]}-{VARLEN_CHARS[1]} characters, seed {VARLEN_SEED}, "
                                            "counted with all-MiniLM-L6-v2's WordPiece tokenizer; random ids, "
                                            "right-padded"}
                                   if name == "varlen" else {"batch": 1, "length": specs[name]["lengths"][0],
                                                             "padding": 0})
                            for name in workloads},
              "transformers_onnx_export": export or None,
              "linnet_onnx_packing": onnx_packing(folder) if "linnet-onnx" in methods else None,
              "rounds": args.rounds, "iters": args.iters, "environment": env,
              "load_average_at_end": load_average(),
              "other_processes_cpu_share": None if contention is None else round(contention.others_share, 2),
              "methods": table}
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
