#!/bin/bash
# Issue 17 in one GPU call, logging to $OUT/gpu-exactness.log: the deterministic-mode kernel tests
# (products of 1..=256 rows, decode attention beside other sequences, prefill == decode K/V and
# outputs) and the other CUDA op tests; engine batch invariance (bench/gpu-batch-invariance.sh);
# SIGTERM + recompute resume with --deterministic (bench/gpu-resume.sh); `sov bench` at batch 1,
# 64 and 256 in the default and the deterministic mode; batch 256 with --checkpoint off against
# --checkpoint recompute (journal + signed heads). Run from the repository root after
# kernels/build-gpu.sh. PARTS picks parts, in order (default: tests bench ckpt engine resume;
# also: rows, the deterministic sweep with the pinned algorithms chosen at 32 rows; ckpt-det,
# batch 256 with recompute checkpoints in the deterministic mode).
set -o pipefail
LOG=${OUT:-.}/gpu-exactness.log
: > "$LOG"
say() { echo "== $*" | tee -a "$LOG"; }
run() { say "$*"; "$@" 2>&1 | tee -a "$LOG"; echo "rc=$?" | tee -a "$LOG"; }
say "sov gpu-exactness $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee -a "$LOG"
export SOV_FIXTURE_DIR=$PWD/runtime/tests/fixtures
PARTS=${PARTS:-tests bench ckpt engine resume}
B="--model random:llama3-8b --device cuda --kv-memory-mb 24000 --input-len 128 --output-len 256 --ignore-eos"
for part in $PARTS; do
  case $part in
    tests)
      run .gpu/sov-lib-tests deterministic_tests --test-threads=1 --nocapture
      run .gpu/sov-lib-tests backend::cuda --test-threads=1 --skip deterministic_tests ;;
    engine) run kernels/bench/gpu-batch-invariance.sh ;;
    engine-det) MODES=deterministic run kernels/bench/gpu-batch-invariance.sh ;;
    resume) FLAGS=--deterministic MODES=recompute run kernels/bench/gpu-resume.sh ;;
    bench)
      run .gpu/sov bench $B --sweep 1,64,256
      run .gpu/sov bench $B --sweep 1,64,256 --deterministic ;;
    rows) SOV_DETERMINISTIC_GEMM_ROWS=32 run .gpu/sov bench $B --sweep 1,64,256 --deterministic ;;
    ckpt)
      run .gpu/sov bench $B --sweep 256 --checkpoint off
      run .gpu/sov bench $B --sweep 256 --checkpoint recompute ;;
    ckpt-det) run .gpu/sov bench $B --sweep 256 --checkpoint recompute --deterministic ;;
  esac
done
say "done $(date -u +%FT%TZ)"
