#!/bin/bash
# Checkpoint overhead on the GPU: Llama-3-8B shape, random bf16, batch 64, prompt 128, 256 new tokens
# (3 checkpoints at checkpoint_every = 64) with checkpoints off / recompute / blocks, one process
# each; `sov bench` prints the share of busy time spent in checkpoint actions; bytes on disk per mode.
# Run from the repository root on the GPU machine after kernels/build-gpu.sh (SOV=path overrides).
# Current figures: `PARTS=ckpt-fig kernels/bench/gpu-exactness.sh` (runtime/BENCHMARKS.md).
S=${SOV:-.gpu/sov}
M="--model random:llama3-8b --device cuda --kv-memory-mb 24000"
export SOV_STATE_DIR=/tmp/sov-state
for C in off recompute blocks; do
  echo "== bench batch 64 --checkpoint $C"
  timeout 150 $S bench $M --num-prompts 64 --concurrency 64 --input-len 128 --output-len 256 \
    --ignore-eos --checkpoint $C --run-dir /tmp/ck-$C 2>&1 | grep -v "^\s*$"
  echo "checkpoint bytes: $(du -sb /tmp/ck-$C/checkpoints 2>/dev/null | cut -f1) receipts: $(ls /tmp/ck-$C/checkpoints 2>/dev/null | grep -c receipt)"
  rm -rf /tmp/ck-$C
done
