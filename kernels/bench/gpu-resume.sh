#!/bin/bash
# Run from the repository root on the GPU machine after kernels/build-gpu.sh (SOV=path overrides the binary).
# Logs: kernels/bench/logs/gpu-exactness-2026-12-01T2112.log and T2217 (its resume-* parts).
# GPU resume, Llama-3-8B shape random bf16, 16 requests x 1200 tokens: an uninterrupted reference,
# then for each checkpoint mode (MODES, default "recompute blocks") and signal (SIGNALS, default
# "TERM KILL"): the signal 3 s after acceptance, `--resume`, every request compared token for token.
# FLAGS adds options to every run (FLAGS=--deterministic: the batch-invariant kernels, whose
# recompute resume rebuilds the KV bit for bit); SAMPLE adds sampling options (SAMPLE="--temperature
# 0.8 --seed 7": seeded requests; default greedy, --temperature 0). AUDIT=1 also runs `sov audit`
# on each resumed run directory (a replay of every finished request on this GPU).
S=${SOV:-.gpu/sov}
M="--model random:llama3-8b --device cuda --kv-memory-mb 24000 ${FLAGS:-}"
SAMPLE=${SAMPLE:---temperature 0}
export SOV_STATE_DIR=/tmp/sov-state
P=(); for i in $(seq 1 16); do P+=(--prompt "request number $i"); done
N=${N:-1200}

$S generate $M $SAMPLE --checkpoint off --max-tokens $N --ignore-eos --json "${P[@]}" > /tmp/ref.json 2>/tmp/ref.err
echo "reference exit $? ($SAMPLE ${FLAGS:-})"
for mode in ${MODES:-recompute blocks}; do
for sig in ${SIGNALS:-TERM KILL}; do
  d=/tmp/r-$mode-$sig
  rm -rf $d
  $S generate $M $SAMPLE --checkpoint $mode --max-tokens $N --ignore-eos --json "${P[@]}" --run-dir $d > /tmp/first.json 2>/tmp/first.err &
  pid=$!
  for i in $(seq 1 900); do grep -q "resume with" /tmp/first.err && break; sleep 0.1; done
  sleep 3; kill -$sig $pid; wait $pid; echo "== $mode SIG$sig: first run exit $?"; grep -E "interrupted" /tmp/first.err
  t0=$(date +%s%N)
  $S generate $M $SAMPLE --checkpoint $mode --max-tokens $N --ignore-eos --json --resume $d > /tmp/res.json 2>/tmp/res.err
  rc=$?
  echo "resume took $(( ($(date +%s%N) - t0) / 1000000 )) ms, exit $rc"; grep -E "resumed|rror|recovered|torn" /tmp/res.err | head -3; du -sb $d/checkpoints
  python3 - "$mode SIG$sig" <<'PY'
import json, sys
ref={j["request_id"]:j for j in map(json.loads, open("/tmp/ref.json"))}
res={j["request_id"]:j for j in map(json.loads, open("/tmp/res.json"))}
same=0; firsts=[]
for k,r in ref.items():
    t=res.get(k,{}).get("tokens")
    if t==r["tokens"]: same+=1
    else: firsts.append(next((i for i,(a,b) in enumerate(zip(r["tokens"],t or [])) if a!=b), -1))
print(f"{sys.argv[1]}: {len(res)} of {len(ref)} requests reported; {same} identical to the uninterrupted run; first differing token of the others: {firsts}")
PY
  if [ -n "${AUDIT:-}" ]; then
    # The run directory first: FLAGS may end in an option with an optional value (--deterministic).
    $S audit $d $M > /tmp/audit.log 2>&1; echo "audit exit $?"; tail -4 /tmp/audit.log
  fi
  rm -rf $d
done
done
