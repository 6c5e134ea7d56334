#!/bin/bash
# Run from the repository root on the GPU machine after kernels/build-gpu.sh (SOV=path overrides the binary).
# Log of the run quoted in README: kernels/bench/logs/gpu-resume-2026-11-29T2020.log
# GPU resume after SIGTERM, Llama-3-8B shape random bf16, 16 requests x 1200 tokens greedy:
# uninterrupted reference, then per mode: SIGTERM 3 s after acceptance, --resume, compare.
# FLAGS adds options to every run (FLAGS=--deterministic: the batch-invariant kernels, whose
# recompute resume rebuilds the KV bit for bit); MODES picks the checkpoint modes.
S=${SOV:-.gpu/sov}
M="--model random:llama3-8b --device cuda --kv-memory-mb 24000 ${FLAGS:-}"
export SOV_STATE_DIR=/tmp/sov-state
P=(); for i in $(seq 1 16); do P+=(--prompt "request number $i"); done
N=1200

$S generate $M --checkpoint off --max-tokens $N --ignore-eos --json "${P[@]}" > /tmp/ref.json 2>/tmp/ref.err
echo "reference exit $?"
for mode in ${MODES:-recompute blocks}; do
  rm -rf /tmp/r-$mode
  $S generate $M --checkpoint $mode --max-tokens $N --ignore-eos --json "${P[@]}" --run-dir /tmp/r-$mode > /tmp/first-$mode.json 2>/tmp/first-$mode.err &
  pid=$!
  for i in $(seq 1 900); do grep -q "resume with" /tmp/first-$mode.err && break; sleep 0.1; done
  sleep 3; kill -TERM $pid; wait $pid; echo "== $mode: first run exit $?"; grep -E "interrupted" /tmp/first-$mode.err
  t0=$(date +%s%N)
  $S generate $M --checkpoint $mode --max-tokens $N --ignore-eos --json --resume /tmp/r-$mode > /tmp/res-$mode.json 2>/tmp/res-$mode.err
  echo "resume took $(( ($(date +%s%N) - t0) / 1000000 )) ms"
  echo "resume exit $?"; grep -E "resumed|rror" /tmp/res-$mode.err | head -3; du -sb /tmp/r-$mode/checkpoints
  python3 - "$mode" <<'PY'
import json, sys
ref={j["request_id"]:j for j in map(json.loads, open("/tmp/ref.json"))}
res={j["request_id"]:j for j in map(json.loads, open(f"/tmp/res-{sys.argv[1]}.json"))}
same=0; firsts=[]
for k,r in ref.items():
    t=res.get(k,{}).get("tokens")
    if t==r["tokens"]: same+=1
    else: firsts.append(next((i for i,(a,b) in enumerate(zip(r["tokens"],t or [])) if a!=b), -1))
print(f"{sys.argv[1]}: {len(res)} of {len(ref)} requests reported; {same} identical to the uninterrupted run; first differing token of the others: {firsts}")
PY
done
