#!/usr/bin/env bash
# The checks to run on a GPU machine (docs/benchmarks/gpu.md): the machine, whether NCCL takes
# two ranks on one GPU, the GPU tests, and the GPT benchmark on the GPU. Needs python3 with a
# CUDA torch, numpy, click, fsspec, httpx and pytest; dyntrain from this checkout (not
# installed).
#     bash bench/gpu_check.sh [OUTDIR]       (GPU_GPT_ARGS: more flags for bench/gpu_gpt.py)
set -u
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-/tmp/gpu_check}}
mkdir -p "$OUT_DIR"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
PY=${PYTHON:-python3}
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc
  $PY -c "import sys, torch; print(sys.version.split()[0], torch.__version__, 'CUDA', torch.version.cuda)"
} 2>&1 | tee "$OUT_DIR/machine.txt"
echo "== NCCL, two ranks on one GPU"
timeout 60 $PY bench/gpu_nccl_probe.py 2>&1 | tail -5 | tee "$OUT_DIR/nccl_probe.txt"
echo "== tests/test_gpu.py"
timeout 210 $PY -m pytest -q -p no:cacheprovider -rA tests/test_gpu.py 2>&1 \
    | tee "$OUT_DIR/test_gpu.txt" | tail -25
echo "== bench/gpu_gpt.py"
timeout 240 $PY bench/gpu_gpt.py ${GPU_GPT_ARGS:-} --out "$OUT_DIR/gpu_gpt.json" 2>&1 | tee "$OUT_DIR/gpu_gpt.txt"
