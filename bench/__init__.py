"""Benchmarks for Nest entries: `python -m bench --model all-minilm-l6-v2 --device cpu`.

Every method (transformers eager and compiled, the reference model's own ONNX export, each
Linnet backend, Linnet served by Triton) is loaded into one process and timed in interleaved
rounds, so that drift of the machine hits all of them alike.  The result is written to
`nest/<model>/bench.json` (`bench.cuda.json` on a GPU) with a chart beside it; see
docs/bench.md for the workload and how each number is measured.

Importing the package turns huggingface_hub's offline mode on (unless the caller set it
either way): a benchmark reads cached or local weights and must never start a download.
"""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
