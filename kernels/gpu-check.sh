#!/bin/bash
# Runs every sov GPU check and benchmark in one go on the GPU machine, logging to $OUT/gpu-check.log
# (or ./gpu-check.log). Build the binaries first on a machine with Rust (see kernels/build-gpu.sh),
# which puts them in .gpu/; then, from the repository root on the GPU machine:
#   kernels/gpu-check.sh [tests|attention|full]
#   tests:     CUDA op tests against CPU references, NVRTC compile of every unit, greedy parity
#              of the tiny-random fixtures (LlamaModel on CUDA vs CPU)
#   attention: tests + decode-attention bandwidth vs copy vs torch SDPA
#   full:      attention + Llama-3-8B-shape decode throughput (direct op loop with device sampling,
#              and LlamaModel<CudaBackend>::forward with host argmax) vs transformers generate
set -o pipefail
MODE=${1:-full}
LOG=${OUT:-.}/gpu-check.log
: > "$LOG"
say() { echo "== $*" | tee -a "$LOG"; }
run() { say "$*"; "$@" 2>&1 | tee -a "$LOG"; echo "rc=$?" | tee -a "$LOG"; }

say "sov gpu-check mode=$MODE $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>&1 | tee -a "$LOG"
export SOV_FIXTURE_DIR=$PWD/runtime/tests/fixtures
run .gpu/sov-lib-tests backend::cuda --test-threads=1 --nocapture
run .gpu/nvrtc-compile --test-threads=1
[ "$MODE" = tests ] && exit 0
run .gpu/sov-lib-tests backend::cuda::bench::bench_decode_attention --ignored --nocapture --test-threads=1
run python3 kernels/bench/sdpa_bench.py
[ "$MODE" = attention ] && exit 0
run .gpu/sov-lib-tests backend::cuda::bench::bench_llama8b_decode --ignored --nocapture --test-threads=1
run .gpu/sov-lib-tests backend::cuda::bench::bench_llama8b_model_forward --ignored --nocapture --test-threads=1
run python3 kernels/bench/hf_generate.py 1 16 64 256
say "done $(date -u +%FT%TZ)"
