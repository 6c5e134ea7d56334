#!/bin/bash
# Run from the repository root on the GPU machine after kernels/build-gpu.sh (SOV=path overrides the binary).
# Logs: kernels/bench/logs/gpu-exactness-2026-12-01T2217.log and gpu-lead-checks-2026-12-03T0523.log (resumes).
# GPU resume, Llama-3-8B shape random bf16, 16 requests x 1200 tokens: an uninterrupted reference,
# then for each checkpoint mode (MODES, default "recompute blocks") and signal (SIGNALS, default
# "TERM KILL"): the signal DELAY s (default 3) after acceptance, `--resume`, every request compared token for token.
# The reference and every interrupted first run load and run at once, then the resumes (the GPU
# holds them all: KV=MiB of KV cache each, default 24000); T is the folder for their files
# (default /tmp/sov-resume), so several of these scripts may run side by side.
# FLAGS adds options to every run (FLAGS=--deterministic: the batch-invariant kernels, whose
# recompute resume rebuilds the KV bit for bit); SAMPLE adds sampling options (SAMPLE="--temperature
# 0.8 --seed 7": seeded requests; default greedy, --temperature 0). AUDIT=1 also runs `sov audit`
# on each resumed run directory (a replay of every finished request on this GPU).
S=${SOV:-.gpu/sov}
M="--model random:llama3-8b --device cuda --kv-memory-mb ${KV:-24000} ${FLAGS:-}"
SAMPLE=${SAMPLE:---temperature 0}
T=${T:-/tmp/sov-resume}
rm -rf "$T"; mkdir -p "$T"
export SOV_STATE_DIR=$T/state
P=(); for i in $(seq 1 16); do P+=(--prompt "request number $i"); done
N=${N:-1200}
CASES=(); for mode in ${MODES:-recompute blocks}; do for sig in ${SIGNALS:-TERM KILL}; do CASES+=("$mode-$sig"); done; done

$S generate $M $SAMPLE --checkpoint off --max-tokens $N --ignore-eos --json "${P[@]}" > $T/ref.json 2>$T/ref.err &
ref=$!
first() {  # mode sig: the interrupted run
  local d=$T/r-$1-$2
  $S generate $M $SAMPLE --checkpoint $1 --max-tokens $N --ignore-eos --json "${P[@]}" --run-dir $d > $d.first.json 2>$d.first.err &
  local pid=$!
  for i in $(seq 1 1800); do grep -q "resume with" $d.first.err && break; sleep 0.1; done
  sleep ${DELAY:-3}; kill -$2 $pid; wait $pid; echo "== $1 SIG$2: first run exit $?"; grep -E "interrupted" $d.first.err
}
for c in "${CASES[@]}"; do first ${c%-*} ${c#*-} > $T/$c.log 2>&1 & done
wait $ref; rc=$?
wait
echo "reference exit $rc ($SAMPLE ${FLAGS:-})"
resume() {  # mode sig
  local d=$T/r-$1-$2 t0=$(date +%s%N)
  $S generate $M $SAMPLE --checkpoint $1 --max-tokens $N --ignore-eos --json --resume $d > $d.res.json 2>$d.res.err
  local rc=$?
  echo "resume took $(( ($(date +%s%N) - t0) / 1000000 )) ms, exit $rc"; grep -E "resumed|rror|recovered|torn" $d.res.err | head -3; du -sb $d/checkpoints
  python3 - "$1 SIG$2" $T/ref.json $d.res.json <<'PY'
import json, sys
ref={j["request_id"]:j for j in map(json.loads, open(sys.argv[2]))}
res={j["request_id"]:j for j in map(json.loads, open(sys.argv[3]))}
same=0; firsts=[]
for k,r in ref.items():
    t=res.get(k,{}).get("tokens")
    if t==r["tokens"]: same+=1
    else: firsts.append(next((i for i,(a,b) in enumerate(zip(r["tokens"],t or [])) if a!=b), -1))
print(f"{sys.argv[1]}: {len(res)} of {len(ref)} requests reported; {same} identical to the uninterrupted run; first differing token of the others: {firsts}")
PY
  if [ -n "${AUDIT:-}" ]; then
    # The run directory first: FLAGS may end in an option with an optional value (--deterministic).
    $S audit $d $M > $d.audit.log 2>&1; echo "audit exit $?"; tail -4 $d.audit.log
  fi
}
for c in "${CASES[@]}"; do resume ${c%-*} ${c#*-} >> $T/$c.log 2>&1 & done
wait
for c in "${CASES[@]}"; do cat $T/$c.log; done
rm -rf "$T"
