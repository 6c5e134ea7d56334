#!/bin/bash
# Engine throughput of two sov binaries in one device call, interleaved A B A B so drift of the
# machine falls on both: Llama-3-8B shape with random bf16 weights, 128 in / 256 out, ignore EOS,
# batch 1 and 256 (one loaded model per run). For checking that a change (a refactor, say) leaves
# the figures where they were.
# Usage (repository root, on the GPU machine): kernels/bench/gpu-ab.sh A_BINARY B_BINARY [ROUNDS]
# Logs to $OUT/gpu-ab.log (or ./gpu-ab.log): each run's `sov bench` report in full.
set -o pipefail
A=${1:?usage: gpu-ab.sh A_BINARY B_BINARY [ROUNDS]}
B=${2:?usage: gpu-ab.sh A_BINARY B_BINARY [ROUNDS]}
ROUNDS=${3:-2}
LOG=${OUT:-.}/gpu-ab.log
: > "$LOG"
BENCH="--model random:llama3-8b --device cuda --kv-memory-mb 24000 --input-len 128 --output-len 256 --ignore-eos --sweep 1,256"
echo "== gpu-ab $(date -u +%FT%TZ) A=$A B=$B rounds=$ROUNDS" | tee -a "$LOG"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader 2>&1 | tee -a "$LOG"
for r in $(seq 1 "$ROUNDS"); do
  for side in A B; do
    bin=$A
    [ "$side" = B ] && bin=$B
    echo "== round $r $side: $bin bench $BENCH" | tee -a "$LOG"
    "$bin" bench $BENCH 2>&1 | tee -a "$LOG"
    echo "rc=$?" | tee -a "$LOG"
  done
done
echo "== done $(date -u +%FT%TZ)" | tee -a "$LOG"
