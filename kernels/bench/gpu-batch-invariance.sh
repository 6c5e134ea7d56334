#!/bin/bash
# Engine-level batch invariance on the GPU (issue 17), Llama-3-8B shape random bf16, greedy, N
# tokens each (default 256): four requests run alone (--max-batch 1, one after another) and the
# same four inside one batch of 64 (two first, two last, 60 neighbours of other lengths between),
# in the default mode and with --deterministic; prints how many of the four are identical.
# Run from the repository root on the GPU machine after kernels/build-gpu.sh (SOV=path overrides).
S=${SOV:-.gpu/sov}
M="--model random:llama3-8b --device cuda --kv-memory-mb 24000 --checkpoint off --max-tokens ${N:-256} --ignore-eos --json"
FOUR=(); for i in 1 2 3 4; do FOUR+=(--prompt "request number $i of four"); done
MANY=(); for i in $(seq 1 60); do MANY+=(--prompt "neighbour $i $(printf '%*s' "$i" '' | tr ' ' x)"); done
for mode in ${MODES:-default deterministic}; do
  F=(); [ "$mode" = deterministic ] && F=(--deterministic)
  $S generate $M "${F[@]}" --max-batch 1 "${FOUR[@]}" > /tmp/alone-$mode.json 2>/tmp/alone-$mode.err
  echo "== $mode: alone exit $?"
  $S generate $M "${F[@]}" --max-batch 64 "${FOUR[@]:0:4}" "${MANY[@]}" "${FOUR[@]:4:4}" > /tmp/batch-$mode.json 2>/tmp/batch-$mode.err
  echo "== $mode: batch of 64 exit $?"
  python3 - "$mode" <<'PY'
import json, sys
m = sys.argv[1]
alone = {j["request_id"]: j["tokens"] for j in map(json.loads, open(f"/tmp/alone-{m}.json"))}
batch = {j["request_id"]: j["tokens"] for j in map(json.loads, open(f"/tmp/batch-{m}.json"))}
ids = sorted(alone)
where = dict(zip(ids, [min(batch), min(batch) + 1, max(batch) - 1, max(batch)]))
same, firsts = 0, []
for i in ids:
    a, b = alone[i], batch.get(where[i], [])
    if a == b: same += 1
    else: firsts.append(next((t for t, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))))
print(f"{m}: {same} of {len(ids)} requests identical alone and in a batch of {len(batch)}; first differing token of the others: {firsts}")
PY
done
