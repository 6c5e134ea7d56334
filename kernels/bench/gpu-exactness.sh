#!/bin/bash
# Issue 17 in one GPU call, logging to $OUT/gpu-exactness.log: the deterministic-mode kernel tests
# (products of 1..=256 rows, decode attention beside other sequences, prefill == decode K/V and
# outputs) and the other CUDA op tests; engine batch invariance (bench/gpu-batch-invariance.sh);
# SIGTERM + recompute resume with --deterministic (bench/gpu-resume.sh); `sov bench` at batch 1,
# 64 and 256 in the default and the deterministic mode; batch 256 with --checkpoint off against
# --checkpoint recompute (journal + signed heads). Run from the repository root after
# kernels/build-gpu.sh. PARTS picks parts, in order (default: tests bench ckpt engine resume;
# also: rows, the deterministic sweep with the pinned algorithms chosen at 32 rows; ckpt-det,
# batch 256 with recompute checkpoints in the deterministic mode; staging, the CUDA gather/scatter
# test; resume-blocks, resume-blocks-seeded, resume-det (+ sov audit), resume-det-seeded: SIGTERM /
# SIGKILL resumes; ckpt-fig, checkpoints off vs asynchronous blocks vs recompute at batch 64; swap,
# swap vs recompute under 2x / 4x KV oversubscription; swap-exact, deterministic outputs under swap;
# ckpt-share, checkpoints off vs blocks at batch 64 and 256, one process per mode, the writer's log
# of every checkpoint (bytes, phases, deferrals); resume-blocks-par, resume-blocks and
# resume-blocks-seeded side by side with 4000 MiB of KV each; engine-midrun, deterministic-mode
# batch invariance with neighbours arriving mid-run, batches 16/64/256, greedy and seeded).
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
    engine-midrun) MIDRUN=1 run kernels/bench/gpu-batch-invariance.sh ;;
    resume) FLAGS=--deterministic MODES=recompute run kernels/bench/gpu-resume.sh ;;
    bench)
      run .gpu/sov bench $B --sweep 1,64,256
      run .gpu/sov bench $B --sweep 1,64,256 --deterministic ;;
    rows) SOV_DETERMINISTIC_GEMM_ROWS=32 run .gpu/sov bench $B --sweep 1,64,256 --deterministic ;;
    ckpt)
      run .gpu/sov bench $B --sweep 256 --checkpoint off
      run .gpu/sov bench $B --sweep 256 --checkpoint recompute ;;
    ckpt-det) run .gpu/sov bench $B --sweep 256 --checkpoint recompute --deterministic ;;
    staging)
      run .gpu/sov-lib-tests backend::cuda::staging --test-threads=1 --nocapture ;;
    resume-blocks) MODES=blocks run kernels/bench/gpu-resume.sh ;;
    resume-blocks-seeded) MODES=blocks SIGNALS=KILL SAMPLE="--temperature 0.8 --seed 7" run kernels/bench/gpu-resume.sh ;;
    resume-det) FLAGS=--deterministic MODES=recompute SIGNALS=KILL AUDIT=1 run kernels/bench/gpu-resume.sh ;;
    resume-det-seeded) FLAGS=--deterministic MODES=recompute SIGNALS=KILL SAMPLE="--temperature 0.8 --seed 7" run kernels/bench/gpu-resume.sh ;;
    ckpt-fig)
      # Issue 17 item 3: batch 64, 128 in / 256 out (3 checkpoints), off vs blocks vs recompute.
      for C in off blocks recompute; do
        rm -rf /tmp/ck-$C
        run .gpu/sov bench $B --num-prompts 64 --concurrency 64 --checkpoint $C --run-dir /tmp/ck-$C --log info
        say "checkpoint bytes ($C): $(du -sb /tmp/ck-$C/checkpoints 2>/dev/null | cut -f1) receipts: $(ls /tmp/ck-$C/checkpoints 2>/dev/null | grep -c receipt)"
        rm -rf /tmp/ck-$C
      done ;;
    ckpt-share)
      # Issue 17 item 3: the share of busy time in blocks-mode checkpoints at batch 64 and 256,
      # against checkpoints off in the same call; bytes per checkpoint in the writer's lines.
      for C in off blocks; do
        rm -rf /tmp/ck-$C
        run .gpu/sov bench $B --sweep 64,256 --checkpoint $C --run-dir /tmp/ck-$C --log info
        say "checkpoint bytes ($C): $(du -sb /tmp/ck-$C/checkpoints 2>/dev/null | cut -f1) receipts: $(ls /tmp/ck-$C/checkpoints 2>/dev/null | grep -c receipt)"
        rm -rf /tmp/ck-$C
      done ;;
    resume-blocks-par)
      T=/tmp/rb KV=4000 MODES=blocks kernels/bench/gpu-resume.sh > /tmp/rb.out 2>&1 &
      T=/tmp/rbs KV=4000 MODES=blocks SIGNALS=KILL SAMPLE="--temperature 0.8 --seed 7" kernels/bench/gpu-resume.sh > /tmp/rbs.out 2>&1 &
      wait; cat /tmp/rb.out /tmp/rbs.out | tee -a "$LOG" ;;
    swap)
      # Issue 19: batch 64, 128 in / 512 out needs ~5.4 GB of KV; 2x and 4x oversubscribed, with a
      # host swap pool (swap) and without (--swap-mb 0: recompute).
      W="--model random:llama3-8b --device cuda --input-len 128 --output-len 512 --ignore-eos --num-prompts 64 --concurrency 64"
      run .gpu/sov bench $W --kv-memory-mb 24000
      for KV in 2700 1350; do
        run .gpu/sov bench $W --kv-memory-mb $KV --swap-mb 16000
        run .gpu/sov bench $W --kv-memory-mb $KV --swap-mb 0
      done ;;
    swap-exact)
      # Deterministic mode: 16 x 600 tokens with the KV 2x oversubscribed equal an unconstrained run.
      G="--model random:llama3-8b --device cuda --deterministic --checkpoint off --max-tokens 600 --ignore-eos --json"
      P=(); for i in $(seq 1 16); do P+=(--prompt "request number $i"); done
      .gpu/sov generate $G --kv-memory-mb 24000 "${P[@]}" > /tmp/sw-ref.json 2>>"$LOG"
      .gpu/sov generate $G --kv-memory-mb 600 --swap-mb 8000 --log info "${P[@]}" > /tmp/sw.json 2>/tmp/sw.err
      tail -5 /tmp/sw.err | tee -a "$LOG"
      python3 -c "
import json
a={j['request_id']:j['tokens'] for j in map(json.loads, open('/tmp/sw-ref.json'))}
b={j['request_id']:j['tokens'] for j in map(json.loads, open('/tmp/sw.json'))}
print(f'swap-exact: {len(b)} of {len(a)} reported, {sum(a[k]==b.get(k) for k in a)} identical to the unconstrained run')
" 2>&1 | tee -a "$LOG" ;;
  esac
done
say "done $(date -u +%FT%TZ)"
