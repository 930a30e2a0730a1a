"""Ragged against padded Triton serving, on real variable-length texts (perf_analyzer, one run).

    PYTHONPATH=. python -m bench.triton_ragged [--models all-minilm-l6-v2,bert-base-uncased]
        [--concurrency 1,4,16] [--rounds 2] [--texts 256] [--max-tokens 256] [--ms 3000] [--out DIR]

The requests are paragraphs of the standard library's docstrings (`bench.corpus`), tokenized
with the models' WordPiece tokenizer and cut at `--max-tokens`, lengths as they come. Every
deployment serves the sentence embedding on Triton's ONNX Runtime backend with the same
batching (max_batch_size 32, max_queue_delay 2000 us):

* `linnet-ragged`: `export-triton --ragged`; each request is its own `[1, S_i]` and the
  batcher concatenates any lengths (docs/triton.md, "Ragged serving").
* `linnet-padded`: the default export; each request padded to the longest text of the set
  with `attention_mask`, since Triton's batcher only merges requests of one shape. Padding to
  the set's longest is the least a fixed-shape client can pad; a deployment that does not
  know its texts pads to the model's limit.
* `linnet-padded-own-length`: the default export, each request at its own length: no padding,
  but the batcher merges only requests of equal length.
* `reference`: transformers' BertModel with mean pooling and normalisation (what
  sentence-transformers computes), through torch.onnx, one plain onnxruntime_onnx model with
  the same batching, requests padded as `linnet-padded`'s.

The four servers run side by side and the measurements are interleaved: each round runs every
concurrency level for every deployment, the order rotating between rounds. Figures: texts per
second and p50/p99 latency from perf_analyzer's report, the median over rounds. bert-base
uses the full-size synthetic checkpoint of `bench.weights` unless the real one is cached
(speed is the same; outputs are not compared here, tests/test_triton_ragged.py does that).
The CPU and the load average are recorded: on a shared machine the figures are indicative.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

MODELS = ("all-minilm-l6-v2", "bert-base-uncased")
LAYOUTS = ("linnet-ragged", "linnet-padded", "linnet-padded-own-length", "reference")
BATCHING = {"max_batch_size": 32, "max_queue_delay_us": 2000}


def token_rows(count: int, max_tokens: int, seed: int = 0) -> list[np.ndarray]:
    """`count` docstring paragraphs as token ids ([CLS] ... [SEP]), cut at `max_tokens`."""
    from tokenizers import Tokenizer

    from bench.corpus import corpus
    from bench.weights import packaged_minilm

    tokenizer = Tokenizer.from_file(str(packaged_minilm() / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_tokens)
    return [np.asarray(e.ids, np.int32) for e in tokenizer.encode_batch(corpus(count, seed=seed))]


def right_padded(rows: list[np.ndarray], width: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows as `[B, width]` int32 token ids, zeros after each row, and their mask."""
    tokens = np.zeros((len(rows), width), np.int32)
    mask = np.zeros_like(tokens)
    for i, row in enumerate(rows):
        tokens[i, :len(row)], mask[i, :len(row)] = row, 1
    return tokens, mask


def requests(layout: str, seqs: list[np.ndarray]) -> list[dict]:
    """perf_analyzer's input rows for one deployment: each a request's tensors, batch dim left out."""
    if layout == "linnet-ragged":
        return [{"tokens": s} for s in seqs]
    if layout == "linnet-padded-own-length":
        return [{"tokens": s, "attention_mask": np.ones_like(s)} for s in seqs]
    rows = []
    for tokens, mask in zip(*right_padded(seqs, max(len(s) for s in seqs))):
        width = len(tokens)
        if layout == "reference":
            rows.append({"input_ids": tokens.astype(np.int64), "attention_mask": mask.astype(np.int64),
                         "token_type_ids": np.zeros(width, np.int64)})
        else:
            rows.append({"tokens": tokens, "attention_mask": mask})
    return rows


def write_reference(repo: Path, weights_folder: Path) -> str:
    """transformers' BertModel + mean pooling + L2 normalisation through torch.onnx, as one
    Triton onnxruntime_onnx model named "reference" with `BATCHING`."""
    import warnings

    import torch
    from transformers import BertModel

    bert = BertModel.from_pretrained(str(weights_folder), dtype=torch.float32).eval()

    class Embedding(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, token_type_ids):
            hidden = self.inner(input_ids=input_ids, attention_mask=attention_mask,
                                token_type_ids=token_type_ids).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            mean = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(mean, dim=-1)

    version = repo / "reference" / "1"
    version.mkdir(parents=True)
    # A padded row in the example: traced with an all-ones mask, transformers skips the mask.
    ids = torch.randint(1000, 30000, (2, 16))
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0
    names = ["input_ids", "attention_mask", "token_type_ids"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Embedding(bert), (ids, mask, torch.zeros_like(ids)), str(version / "model.onnx"),
                          input_names=names, output_names=["embedding"], opset_version=17, dynamo=False,
                          dynamic_axes={**{n: {0: "B", 1: "S"} for n in names}, "embedding": {0: "B"}})
    inputs = ",\n".join(f'  {{ name: "{n}" data_type: TYPE_INT64 dims: [ -1 ] }}' for n in names)
    width = bert.config.hidden_size
    (repo / "reference" / "config.pbtxt").write_text(
        f'name: "reference"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {BATCHING["max_batch_size"]}\n'
        f'input [\n{inputs}\n]\noutput [\n  {{ name: "embedding" data_type: TYPE_FP32 dims: [ {width} ] }}\n]\n'
        f'dynamic_batching {{ max_queue_delay_microseconds: {BATCHING["max_queue_delay_us"]} }}\n'
        'instance_group [ { count: 1 } ]\n', encoding="utf-8")
    return "reference"


def repositories(model: str, root: Path) -> dict[str, tuple[Path, str]]:
    """Layout -> (model repository, the model clients call)."""
    from bench.weights import resolve
    from linnet.nest import prepare
    from linnet.serving.triton import export_passes, export_triton

    folder = resolve(model).snapshot()
    ctx, _ = prepare(model, weights=str(folder), optimize=export_passes())
    options = {**BATCHING, "entries": ["embedding"]}
    export_triton(ctx, root / "ragged", ragged=True, **options)
    export_triton(ctx, root / "padded", **options)
    called = write_reference(root / "reference", folder)
    return {"linnet-ragged": (root / "ragged", model), "linnet-padded": (root / "padded", model),
            "linnet-padded-own-length": (root / "padded", model), "reference": (root / "reference", called)}


def stable_figures(measure, tools, url: str, model: str, rows: list[dict], concurrency: int, ms: int) -> dict:
    """perf_analyzer's figures; on a busy machine its windows may never agree, so a failed
    run is tried once more with windows twice as long and more of them, then recorded as
    unstable (no figures) rather than ending the bench."""
    for window, trials in ((ms, 6), (2 * ms, 10)):
        try:
            return measure(tools, url, model, rows, concurrency=concurrency, batch=1, measurement_ms=window,
                           max_trials=trials).to_json()
        except RuntimeError as exc:
            reason = str(exc).strip().splitlines()[-1]
    return {"concurrency": concurrency, "batch": 1, "infer_per_s": None, "p50_ms": None, "p99_ms": None,
            "unstable": reason}


def _median(values):
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def bench_model(model: str, seqs: list[np.ndarray], levels: list[int], rounds: int, ms: int, tools) -> dict:
    from linnet.testing.perf_analyzer import measure
    from linnet.testing.triton_server import TritonServer

    runs: dict[tuple[str, int], list] = {}
    with tempfile.TemporaryDirectory(prefix="bench-ragged-") as work:
        root = Path(work)
        repos = repositories(model, root)
        servers = {}
        try:
            for folder in {repo for repo, _ in repos.values()}:
                servers[folder] = TritonServer(folder, tools, log_path=root / f"{folder.name}.log").start()
            rows = {layout: requests(layout, seqs) for layout in LAYOUTS}
            for r in range(rounds):
                order = LAYOUTS[r % len(LAYOUTS):] + LAYOUTS[:r % len(LAYOUTS)]
                for c in levels:
                    for layout in order:
                        folder, called = repos[layout]
                        figures = stable_figures(measure, tools, servers[folder].grpc_url, called, rows[layout],
                                                 c, ms)
                        runs.setdefault((layout, c), []).append(figures)
                        print(json.dumps({"model": model, "round": r, "layout": layout, **figures}), flush=True)
        finally:
            for server in servers.values():
                server.stop()
        shutil.rmtree(root, ignore_errors=True)
    table = []
    for (layout, c), figures in runs.items():
        table.append({"layout": layout, "concurrency": c,
                      "texts_per_s": _median(f["infer_per_s"] for f in figures),
                      "p50_ms": _median(f["p50_ms"] for f in figures),
                      "p99_ms": _median(f["p99_ms"] for f in figures),
                      "rounds": figures})
    padded = {row["concurrency"]: row["texts_per_s"] for row in table if row["layout"] == "linnet-padded"}
    for row in table:
        base = padded.get(row["concurrency"])
        row["x_linnet_padded"] = round(row["texts_per_s"] / base, 3) if row["texts_per_s"] and base else None
    return {"model": model, "results": sorted(table, key=lambda r: (r["concurrency"], LAYOUTS.index(r["layout"])))}


def main(argv=None) -> int:
    from linnet.backends.measured import cpu_model
    from linnet.testing.triton_ort import build_onnxruntime_backend
    from linnet.testing.triton_server import provision

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--texts", type=int, default=256, help="docstring paragraphs sent, round robin")
    parser.add_argument("--max-tokens", type=int, default=256, help="texts are cut at this many tokens")
    parser.add_argument("--ms", type=int, default=3000, help="perf_analyzer's measurement window")
    parser.add_argument("--out", type=Path, default=None,
                        help="write <out>/<model>/triton-ragged-bench.json (default: print only)")
    args = parser.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    tools = provision()
    build_onnxruntime_backend(tools)
    seqs = token_rows(args.texts, args.max_tokens)
    lengths = [len(s) for s in seqs]
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for model in args.models.split(","):
        load_start = os.getloadavg()
        result = bench_model(model, seqs, levels, args.rounds, args.ms, tools)
        result.update({
            "date": started, "cpu": cpu_model(), "cpus": os.cpu_count(), "load_avg_at_start": load_start,
            "load_avg_at_end": os.getloadavg(), "rounds": args.rounds, "measurement_ms": args.ms,
            "texts": {"count": len(seqs), "source": "bench.corpus stdlib docstring paragraphs",
                      "max_tokens": args.max_tokens, "min": min(lengths), "mean": round(float(np.mean(lengths)), 1),
                      "max": max(lengths), "padded_to": max(lengths)},
            "batching": BATCHING})
        print(json.dumps(result, indent=1), flush=True)
        if args.out is not None:
            path = args.out / model / "triton-ragged-bench.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
