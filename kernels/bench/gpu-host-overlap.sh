#!/bin/bash
# The decode steps' host work in turn against overlapped with the next forward pass (the GPU
# default; `--no-host-overlap` turns it off), one sov binary, interleaved on off on off so drift of
# the machine falls on both: Llama-3-8B shape with random weights, 1000 requests of 128 in / 256 out
# at --max-batch 1024, then batch 1. Each run prints output tok/s, TTFT, ITL and the host time per
# decode step (between passes, and under the next pass).
# Usage (repository root, on the GPU machine): [SOV=.gpu/sov] [ROUNDS=2]
#   [FLAGS="--quantization fp8 --kv-dtype fp8"] [KV_MB=MiB (default auto: what the card has free after loading)] kernels/bench/gpu-host-overlap.sh
# Logs to $OUT/gpu-host-overlap.log (or ./gpu-host-overlap.log): each run's report in full.
set -o pipefail
SOV=${SOV:-.gpu/sov}
ROUNDS=${ROUNDS:-2}
FLAGS=${FLAGS:-"--quantization fp8 --kv-dtype fp8"}
LOG=${OUT:-.}/gpu-host-overlap.log
: > "$LOG"
MODEL="--model random:llama3-8b --device cuda --input-len 128 --output-len 256 --ignore-eos $FLAGS"
WIDE="--num-prompts 1000 --max-batch 1024 --kv-memory-mb ${KV_MB:-auto}"
echo "== gpu-host-overlap $(date -u +%FT%TZ) sov=$SOV rounds=$ROUNDS flags=$FLAGS" | tee -a "$LOG"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader 2>&1 | tee -a "$LOG"
for shape in "$WIDE" "--num-prompts 4 --concurrency 1 --max-batch 1 --kv-memory-mb 4000"; do
  for r in $(seq 1 "$ROUNDS"); do
    for overlap in on off; do
      extra=""
      [ "$overlap" = off ] && extra="--no-host-overlap"
      echo "== round $r overlap $overlap: bench $MODEL $shape $extra" | tee -a "$LOG"
      "$SOV" bench $MODEL $shape $extra >>"$LOG" 2>&1
      echo "rc=$?" | tee -a "$LOG"
      grep -E "Output token throughput|Mean TTFT|Median ITL|P99 ITL|schedule|tokens, events|Retire|Overlapped" "$LOG" \
        | tail -8 | paste -sd' '
    done
  done
done
echo "== done $(date -u +%FT%TZ)" | tee -a "$LOG"
