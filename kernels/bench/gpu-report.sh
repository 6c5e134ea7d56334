#!/bin/bash
# Issue 20's GPU throughput report: sov against its anchors on one card, Llama-3-8B shape with
# random weights, prompt 128, 256 new tokens, EOS ignored. Two parts, each within one device call:
#   sov      `sov bench` at batch 1 / 16 / 64 / 256 and 1000 requests (--max-batch 1024), bf16 and
#            FP8 (--quantization fp8 --kv-dtype fp8); TTFT and ITL p50 / p99 are in each report
#   anchors  transformers `generate`, eager (bench/hf_generate.py, batch 1 and 256), and gpt-fast's
#            own model compiled with mode="reduce-overhead" (bench/gpt_fast_bench.py, batch 1 and
#            256; GPT_FAST_DIR is a checkout of pytorch-labs/gpt-fast, carried with the call: the
#            GPU machine has no network)
# Run both parts on the same card (one warm lease) and quote them together; the runtime's
# BENCHMARKS.md ("GPU: issue 20's report") has the table this fills.
# Usage (repository root, on the GPU machine):
#   [SOV=.gpu/sov] [KV_MB=60000] [SOV_FLAGS="--prefill-ahead"] kernels/bench/gpu-report.sh sov
#   GPT_FAST_DIR=DIR kernels/bench/gpu-report.sh anchors
# Logs to $OUT/gpu-report-PART.log (or ./gpu-report-PART.log).
set -o pipefail
PART=${1:?usage: gpu-report.sh sov|anchors}
SOV=${SOV:-.gpu/sov}
LOG=${OUT:-.}/gpu-report-$PART.log
: > "$LOG"
run() { echo "== $(date -u +%T) $*" | tee -a "$LOG"; "$@" 2>&1 | tee -a "$LOG"; echo "rc=$?" | tee -a "$LOG"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader 2>&1 | tee -a "$LOG"
C="--model random:llama3-8b --device cuda --input-len 128 --output-len 256 --ignore-eos"
case "$PART" in
  sov)
    for q in "" "--quantization fp8 --kv-dtype fp8"; do
      run "$SOV" bench $C --kv-memory-mb 24000 --sweep 1,16,64,256 $q ${SOV_FLAGS:-}
      run "$SOV" bench $C --kv-memory-mb "${KV_MB:-60000}" --num-prompts 1000 --max-batch 1024 $q ${SOV_FLAGS:-}
    done
    ;;
  anchors)
    [ -d "${GPT_FAST_DIR:-}" ] || { echo "GPT_FAST_DIR: not a directory: '${GPT_FAST_DIR:-}'" | tee -a "$LOG"; exit 2; }
    run python3 kernels/bench/gpt_fast_bench.py "$GPT_FAST_DIR" --batches 1,256
    run python3 kernels/bench/hf_generate.py 1 256
    ;;
  *)
    echo "unknown part '$PART' (sov or anchors)" >&2
    exit 2
    ;;
esac
echo "== done $(date -u +%T)" | tee -a "$LOG"
