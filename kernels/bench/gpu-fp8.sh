#!/bin/bash
# FP8 W8A8 checks and figures in one device call: the FP8 tests (quantization byte for byte,
# every product path against the CPU reference of the same quantized values, FP8 vs bf16 logits),
# the Llama-3-8B layer products in bf16 and FP8 at 1..1024 rows, then `sov bench` (random
# Llama-3-8B weights, 128 in / 256 out, ignore EOS) at batch 1/16/64/256 and 1000 requests
# (--max-batch 1024 --kv-memory-mb KV_MB, default auto: what the card has free after loading), FP8 and bf16 (the anchor) in the same call, with the
# decode graphs' captures logged; last, the CUDA op tests for regressions.
# Usage (repository root, on the GPU machine): kernels/bench/gpu-fp8.sh [BIN_DIR]  (default .gpu)
# Logs to $OUT/gpu-fp8.log (or ./gpu-fp8.log).
set -o pipefail
BIN=${1:-.gpu}
LOG=${OUT:-.}/gpu-fp8.log
: > "$LOG"
run() { echo "== $(date -u +%T) $*" | tee -a "$LOG"; "$@" 2>&1 | tee -a "$LOG"; echo "rc=$?" | tee -a "$LOG"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.used --format=csv,noheader 2>&1 | tee -a "$LOG"
run "$BIN/sov-lib-tests" backend::cuda::fp8_tests --nocapture --test-threads=1
run env SOV_BENCH_FP8_ROWS=${FP8_ROWS:-1,2,4,8,16,32,64,256,1024} "$BIN/sov-lib-tests" bench_fp8_matmuls --ignored --nocapture --test-threads=1
B8="--model random:llama3-8b --device cuda --input-len 128 --output-len 256 --ignore-eos"
run "$BIN/sov" bench $B8 --kv-memory-mb 24000 --sweep 1,16,64,256 --quantization fp8
run "$BIN/sov" bench $B8 --kv-memory-mb 24000 --sweep 1,16,64,256
run env SOV_LOG=info,sov::runner::decode_graphs=debug "$BIN/sov" bench $B8 --num-prompts 1000 --max-batch 1024 --kv-memory-mb ${KV_MB:-auto} --quantization fp8
run "$BIN/sov" bench $B8 --num-prompts 1000 --max-batch 1024 --kv-memory-mb ${KV_MB:-auto}
[ -n "$SKIP_OP_TESTS" ] || run "$BIN/sov-lib-tests" backend::cuda::tests --test-threads=1
echo "== done $(date -u +%T)" | tee -a "$LOG"
