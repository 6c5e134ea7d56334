#!/bin/bash
# Which cuBLASLt algorithms sum in the order of which chains (deterministic mode, kernels/docs/deterministic.md
# "Which cuBLASLt algorithms give the same bits"): builds kernels/bench/det_probe/det_probe.cu with
# nvcc and runs it, logging to $OUT/det-probe.log (or ./det-probe.log). `bits` as the first
# argument skips the timings. Needs nvcc and cuBLASLt (the GPU machine has both).
set -eo pipefail
DIR=$(cd "$(dirname "$0")" && pwd)
LOG=${OUT:-.}/det-probe.log
nvcc -O3 -std=c++17 -arch=sm_90a "$DIR/det_probe/det_probe.cu" -lcublasLt -o /tmp/det_probe
{ nvidia-smi --query-gpu=name,driver_version --format=csv; /tmp/det_probe "$@"; } 2>&1 | tee "$LOG"
