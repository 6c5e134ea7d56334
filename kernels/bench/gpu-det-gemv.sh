#!/bin/bash
# Deterministic mode's small-row product (det_gemv, kernels/cuda/gemv.cu): bits against the
# reference chain det_mma_16 and cuBLASLt's split-K-1 algorithm, then times at 1..16 rows for several
# tilings against cuBLASLt and the default mode's GEMV. Builds
# kernels/bench/det_probe/det_gemv_bench.cu with nvcc, logs to $OUT/det-gemv.log (or ./det-gemv.log);
# `bits` as the first argument skips the timings; `time qkv,down` times only the shapes named. Needs nvcc and cuBLASLt (the GPU machine has both).
set -eo pipefail
DIR=$(cd "$(dirname "$0")" && pwd)
LOG=${OUT:-.}/det-gemv.log
nvcc -O3 -std=c++17 -arch=sm_90a -I "$DIR/../cuda" "$DIR/det_probe/det_gemv_bench.cu" -lcublasLt -o /tmp/det_gemv_bench
{ nvidia-smi --query-gpu=name,driver_version --format=csv; /tmp/det_gemv_bench "$@"; } 2>&1 | tee "$LOG"
