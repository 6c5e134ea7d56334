#!/bin/bash
# Runs every sov GPU check and benchmark in one go on the GPU machine, logging to $OUT/gpu-check.log
# (or ./gpu-check.log). Build the binaries first on a machine with Rust (see kernels/build-gpu.sh),
# which puts them in .gpu/; then, from the repository root on the GPU machine:
#   kernels/gpu-check.sh [tests|attention|full]
#   tests:     CUDA op tests against CPU references (GEMV, argmax, every kernel), NVRTC compile of
#              every unit, greedy parity of the tiny-random fixtures (LlamaModel on CUDA vs CPU, and
#              the engine's decode graphs vs CPU)
#   attention: tests + decode-attention bandwidth vs copy vs torch SDPA (and the kernel's tuning
#              variants, SOV_DECODE_ATTENTION_DEFINES / SOV_DECODE_CTAS_PER_SM)
#   full:      attention + Llama-3-8B-shape decode throughput: the direct op loop, and the engine
#              (`sov bench`, batch 1/16/64/256 on one loaded model) next to transformers generate
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
ATT=backend::cuda::bench::bench_decode_attention
run .gpu/sov-lib-tests $ATT --ignored --nocapture --test-threads=1
# Loading variants of the decode kernel (see decode_attention.cu): each checked against the CPU
# reference, then timed.
VARIANTS=("-DREG_LOADS" "-DREG_LOADS -DPREFETCH" "-DSTAGES=4 -DMIN_BLOCKS=2")
for v in "${VARIANTS[@]}"; do
  say "variant SOV_DECODE_ATTENTION_DEFINES=$v"
  SOV_DECODE_ATTENTION_DEFINES="$v" .gpu/sov-lib-tests backend::cuda::tests::decode_attention_matches_cpu --test-threads=1 2>&1 | grep "test result" | tee -a "$LOG"
  SOV_DECODE_ATTENTION_DEFINES="$v" .gpu/sov-lib-tests $ATT --ignored --nocapture --test-threads=1 2>&1 | grep "BENCH decode" | tee -a "$LOG"
done
for c in 1 4; do
  say "variant SOV_DECODE_CTAS_PER_SM=$c (default 2)"
  SOV_DECODE_CTAS_PER_SM=$c .gpu/sov-lib-tests $ATT --ignored --nocapture --test-threads=1 2>&1 | grep "BENCH decode" | tee -a "$LOG"
done
run python3 kernels/bench/sdpa_bench.py
[ "$MODE" = attention ] && exit 0
run .gpu/sov-lib-tests backend::cuda::bench::bench_llama8b_decode --ignored --nocapture --test-threads=1
BENCH="--model random:llama3-8b --device cuda --kv-memory-mb 24000 --input-len 128 --output-len 256 --ignore-eos"
run .gpu/sov bench $BENCH --sweep 1,16,64,256
run python3 kernels/bench/hf_generate.py 1 16 64 256
say "done $(date -u +%FT%TZ)"
