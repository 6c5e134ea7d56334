#!/bin/bash
# Sampled rows drawn on the device (`--device-draw true`, the default: `draw_tokens`, the host's
# draw bit for bit) against drawn on the host from downloaded logits rows (`--device-draw false`),
# one sov binary, in one call:
# 1. the same tokens: 8 seeded requests (temperature 0.8, top-p 0.9 and plain temperature 1) on
#    the Llama-3-8B shape with random weights, `sov generate --json` both ways, compared;
# 2. throughput at temperature 1: batch 1, 16 and 256 (128 in / 256 out), then 1000 requests at
#    --max-batch 1024, draws on the device against on the host, interleaved, with the greedy run
#    (temperature 0) as the anchor. HOST=0 leaves out the host-draw runs (at 1000 requests they
#    take minutes: ~1.5k tok/s at batch 256), SHAPES=sweep or SHAPES=1000 one of the two shapes.
# Usage (repository root, on the GPU machine): [SOV=.gpu/sov] [FLAGS="--quantization fp8 --kv-dtype fp8"]
#   [HOST=0] [SHAPES=sweep|1000] [KV_MB=MiB (default auto: what the card has free after loading)] kernels/bench/gpu-device-draw.sh
# Logs to $OUT/gpu-device-draw.log (or ./gpu-device-draw.log).
set -o pipefail
SOV=${SOV:-.gpu/sov}
FLAGS=${FLAGS-"--quantization fp8 --kv-dtype fp8"}
OUTDIR=${OUT:-.}
LOG=$OUTDIR/gpu-device-draw.log
: > "$LOG"
echo "== gpu-device-draw $(date -u +%FT%TZ) sov=$SOV flags=$FLAGS" | tee -a "$LOG"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader 2>&1 | tee -a "$LOG"
PROMPTS=()
for i in 1 2 3 4 5 6 7 8; do PROMPTS+=(--prompt "Request $i: tell me about the number $((i * 37))"); done
for draw in false true; do
  for sampling in "--temperature 0.8 --top-p 0.9" "--temperature 1"; do
    echo "== generate device-draw $draw $sampling" | tee -a "$LOG"
    "$SOV" generate --model random:llama3-8b --device cuda $FLAGS $sampling --seed 7 --max-tokens 64 \
      --ignore-eos --json --device-draw "$draw" "${PROMPTS[@]}" >"$OUTDIR/draw-$draw-${sampling// /_}.jsonl" 2>>"$LOG"
    echo "rc=$?" | tee -a "$LOG"
  done
done
tokens() { grep -o '"tokens":\[[^]]*\]' "$1"; }
for sampling in "--temperature_0.8_--top-p_0.9" "--temperature_1"; do
  host=$(tokens "$OUTDIR/draw-false-$sampling.jsonl"); device=$(tokens "$OUTDIR/draw-true-$sampling.jsonl")
  if [ -n "$host" ] && [ "$host" = "$device" ]; then
    echo "== same tokens on device and host ($sampling): $(echo "$host" | wc -l) requests" | tee -a "$LOG"
  else
    echo "== TOKENS DIFFER ($sampling)" | tee -a "$LOG"
    diff <(echo "$host") <(echo "$device") | head -20 | tee -a "$LOG"
  fi
done
MODEL="--model random:llama3-8b --device cuda --input-len 128 --output-len 256 --ignore-eos $FLAGS"
SWEEP="--kv-memory-mb 24000 --sweep 1,16,256"
THOUSAND="--num-prompts 1000 --max-batch 1024 --kv-memory-mb ${KV_MB:-auto}"
case ${SHAPES:-both} in sweep) SHAPE_LIST=("$SWEEP") ;; 1000) SHAPE_LIST=("$THOUSAND") ;; *) SHAPE_LIST=("$SWEEP" "$THOUSAND") ;; esac
RUNS=("--temperature 1 --device-draw true" "--temperature 0")
[ "${HOST:-1}" = 0 ] || RUNS=("--temperature 1 --device-draw true" "--temperature 1 --device-draw false" "--temperature 0")
for shape in "${SHAPE_LIST[@]}"; do
  for run in "${RUNS[@]}"; do
    echo "== bench $MODEL $shape $run" | tee -a "$LOG"
    "$SOV" bench $MODEL $shape $run >>"$LOG" 2>&1
    echo "rc=$?" | tee -a "$LOG"
    grep -E "Output token throughput|Mean TTFT|Median ITL" "$LOG" | tail -3 | paste -sd' '
  done
done
echo "== done $(date -u +%FT%TZ)" | tee -a "$LOG"
