#!/usr/bin/env bash
# The CUDA benchmark, prepared to run as one short job on a GPU machine:
#
#   bash bench/gpu.sh                        # both models, default rounds
#   MODELS=all-minilm-l6-v2 ROUNDS=5 bash bench/gpu.sh
#
# Writes nest/<model>/bench.cuda.json and bench.cuda.png for each model and prints the
# tables. Needs a CUDA build of torch; JAX on the GPU needs jax[cuda], ONNX Runtime's CUDA and
# TensorRT providers need onnxruntime-gpu (and TensorRT). A method whose package or provider
# is missing is recorded with its error in the JSON, not skipped. When $OUT is set (the
# device runner's output folder) the results are copied there too.
set -euo pipefail
cd "$(dirname "$0")/.."

python - <<'PY'
import torch
assert torch.cuda.is_available(), f"torch {torch.__version__} sees no CUDA device"
print("GPU:", torch.cuda.get_device_name(0), "| torch", torch.__version__)
try:
    import onnxruntime as ort
    print("onnxruntime providers:", ort.get_available_providers())
except ImportError:
    print("onnxruntime: not installed")
try:
    import jax
    print("jax devices:", jax.devices())
except Exception as exc:  # a CPU-only jax is fine: the JAX methods record their error
    print("jax:", exc)
PY

for model in ${MODELS:-all-minilm-l6-v2 bert-base-uncased}; do
  # Peak memory on CUDA comes from torch's allocator in-process, so no RSS probes run here.
  python -m bench --model "$model" --device cuda --rounds "${ROUNDS:-10}" ${BENCH_ARGS:-}
done
python -m bench.report

if [ -n "${OUT:-}" ]; then
  for f in nest/*/bench.cuda.json nest/*/bench.cuda.png; do
    [ -e "$f" ] && mkdir -p "$OUT/$(dirname "$f")" && cp "$f" "$OUT/$f"
  done
fi
