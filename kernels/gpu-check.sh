#!/bin/bash
# Runs every sov GPU check and benchmark in one go on the GPU machine, logging to $OUT/gpu-check.log
# (or ./gpu-check.log). Build the binaries first on a machine with Rust (see kernels/build-gpu.sh),
# which puts them in .gpu/; then, from the repository root on the GPU machine:
#   kernels/gpu-check.sh [tests|gemv|attention|full]
#   tests:     CUDA op tests against CPU references (GEMV, argmax, every kernel), the deterministic
#              mode's kernel and model tests (bit-identical rows in any batch), NVRTC compile of
#              every unit, greedy parity of the tiny-random fixtures (the gpu_parity target:
#              LlamaModel on CUDA vs CPU, and the runner's decode graphs vs CPU), and the
#              engine's decode steps launched ahead against steps run one at a time
#   gemv:      tests + the batch-1 products in each GEMV variant + the batch-1 model decode with each
#              GEMV tuning (SOV_GEMV_SPLIT) varied + the engine
#              at batch 1
#   attention: tests + decode-attention bandwidth vs copy vs torch SDPA (and the kernels' tuning
#              variants: SOV_DECODE_MMA, SOV_DECODE_ATTENTION_DEFINES, SOV_DECODE_STAGES,
#              SOV_DECODE_SPLIT_TOKENS, SOV_DECODE_CTAS_PER_SM)
#   full:      attention + the decode products (cuBLAS vs GEMV at 1 and 4 rows) + Llama-3-8B-shape
#              decode throughput: the model's own layer stack (gpu_bench: eager, graphs, forward),
#              and the engine (`sov bench`, batch 1/16/64/256 on one loaded model) next to
#              transformers generate
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
run .gpu/sov-lib-tests runner::deterministic_tests --test-threads=1 --nocapture
run .gpu/sov-gpu-parity --test-threads=1 --nocapture
run .gpu/sov-gpu-decode-ahead --test-threads=1 --nocapture
run .gpu/nvrtc-compile --test-threads=1
[ "$MODE" = tests ] && exit 0
BENCH="--model random:llama3-8b --device cuda --kv-memory-mb 24000 --input-len 128 --output-len 256 --ignore-eos"
if [ "$MODE" = gemv ]; then
  MM=backend::cuda::bench::bench_decode_matmuls
  L8=bench_llama8b_decode
  products() { # label, env assignments...
    say "products: $1"; shift
    env "$@" .gpu/sov-lib-tests $MM --ignored --nocapture --test-threads=1 2>&1 | grep "n=1 " | tee -a "$LOG"
  }
  products "default (one-row kernels, warps per row picked to fill one wave)"
  products "one warp per row" SOV_GEMV_SPLIT=1
  oploop() { # label, env assignments...
    say "model decode, batch 1: $1"; shift
    env SOV_BENCH_BATCHES=1 "$@" .gpu/sov-gpu-bench $L8 --ignored --nocapture --test-threads=1 2>&1 | grep "BENCH llama8b_decode" | tee -a "$LOG"
  }
  oploop "default (PDL on every kernel, one-row GEMV, fused SwiGLU)"
  oploop "SOV_GEMV_SPLIT=1" SOV_GEMV_SPLIT=1
  run .gpu/sov bench $BENCH --sweep 1
  say "done $(date -u +%FT%TZ)"
  exit 0
fi
ATT=backend::cuda::bench::bench_decode_attention
run .gpu/sov-lib-tests $ATT --ignored --nocapture --test-threads=1
# Variants of the decode kernels, each checked against the CPU reference, then timed: the CUDA-core
# kernel (SOV_DECODE_MMA=0) with its loading variants (SOV_DECODE_ATTENTION_DEFINES, see
# decode_attention.cu), the tensor-core kernel's ring depth (SOV_DECODE_STAGES) and split caps.
variant() { # label, env assignments...
  say "variant $1"; shift
  env "$@" .gpu/sov-lib-tests backend::cuda::tests::decode_attention_matches_cpu --test-threads=1 2>&1 | grep "test result" | tee -a "$LOG"
  env "$@" .gpu/sov-lib-tests $ATT --ignored --nocapture --test-threads=1 2>&1 | grep "BENCH decode" | tee -a "$LOG"
}
variant "CUDA cores" SOV_DECODE_MMA=0
variant "CUDA cores, -DREG_LOADS -DPREFETCH" SOV_DECODE_MMA=0 "SOV_DECODE_ATTENTION_DEFINES=-DREG_LOADS -DPREFETCH"
variant "tensor cores, STAGES=3" SOV_DECODE_STAGES=3
variant "tensor cores, splits of <= 512 tokens" SOV_DECODE_SPLIT_TOKENS=512
variant "tensor cores, 4 CTAs per SM target" SOV_DECODE_CTAS_PER_SM=4
run python3 kernels/bench/sdpa_bench.py
[ "$MODE" = attention ] && exit 0
run .gpu/sov-lib-tests backend::cuda::bench::bench_decode_matmuls --ignored --nocapture --test-threads=1
run .gpu/sov-lib-tests backend::cuda::bench::bench_row_kernels --ignored --nocapture --test-threads=1
run .gpu/sov-gpu-bench bench_llama8b_decode --ignored --nocapture --test-threads=1
run .gpu/sov bench $BENCH --sweep 1,16,64,256
run python3 kernels/bench/hf_generate.py 1 16 64 256
say "done $(date -u +%FT%TZ)"
