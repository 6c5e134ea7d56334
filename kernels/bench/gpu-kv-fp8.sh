#!/bin/bash
# The e4m3 KV cache (`--kv-dtype fp8`) in one device call: its GPU tests (writes byte for byte
# against the host quantization, attention against the f64 reference, fused write + attention
# against the unfused ops), `bench_decode_attention` over a bf16 and an e4m3 cache at the shapes of
# the 1000-request workload and at long contexts, once with the default shared-memory carveout and
# once with CARVEOUT (default 40,100: room for a third CTA an SM at wide grids), then `sov bench`
# at 1000 requests (Llama-3-8B shape, random weights, 128 in / 256 out, ignore EOS) with the bf16
# cache (the anchor) and the e4m3 one, in bf16 and with FP8 products; with GGUF set, the perplexity
# of that model on runtime/bench/texts/plain-english.txt with each cache.
# Usage (repository root, on the GPU machine): [GGUF=smol.gguf] [KV_MB=MiB (default auto: what the card has free after loading)] kernels/bench/gpu-kv-fp8.sh [BIN_DIR]
# (default .gpu; binaries from kernels/build-gpu.sh). Logs to $OUT/gpu-kv-fp8.log (or ./).
set -o pipefail
BIN=${1:-.gpu}
LOG=${OUT:-.}/gpu-kv-fp8.log
: > "$LOG"
run() { echo "== $(date -u +%T) $*" | tee -a "$LOG"; "$@" 2>&1 | tee -a "$LOG"; echo "rc=$?" | tee -a "$LOG"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.used --format=csv,noheader 2>&1 | tee -a "$LOG"
[ -n "$SKIP_TESTS" ] || run "$BIN/sov-lib-tests" kv_e4m3 fused_rope_attention_matches_the_unfused_ops_e4m3 --test-threads=1
SHAPES=${SHAPES:-1000x256,1000x384,256x1024,64x2048,1x4096}
for carveout in 40,72 "${CARVEOUT:-40,100}"; do
  run env SOV_DECODE_CARVEOUT=$carveout SOV_BENCH_ATTN_SHAPES=$SHAPES "$BIN/sov-lib-tests" bench_decode_attention --ignored --nocapture --test-threads=1
done
B8="--model random:llama3-8b --device cuda --input-len 128 --output-len 256 --ignore-eos --num-prompts 1000 --max-batch 1024 --kv-memory-mb ${KV_MB:-auto}"
for q in none fp8; do
  for kv in bf16 fp8; do
    run "$BIN/sov" bench $B8 --quantization $q --kv-dtype $kv
  done
done
if [ -n "$GGUF" ]; then
  for kv in bf16 fp8; do
    run "$BIN/sov" perplexity --model "$GGUF" --text runtime/bench/texts/plain-english.txt --device cuda --kv-dtype $kv
  done
fi
echo "== done $(date -u +%T)" | tee -a "$LOG"
