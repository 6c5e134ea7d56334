#!/bin/bash
# Engine-level batch invariance on the GPU (issue 17), Llama-3-8B shape random bf16, N tokens each
# (default 256): four requests run alone (--max-batch 1, one after another) and the same four
# inside one batch of 64 (two first, two last, 60 neighbours of other lengths between), in the
# default mode and with --deterministic; prints how many of the four are identical.
# MIDRUN=1 instead checks neighbours arriving mid-run, in the modes of MODES (default
# deterministic), for each batch size of BATCHES (default "16 64 256") and each sampling of
# SAMPLES (default greedy and seeded): the four requests come first with short prompts, and the
# batch's other requests have long prompts (100-400 tokens) that are prefilled in chunks of
# --max-prefill-tokens 128 inside the decode steps of the four, so they join the batch while the
# four are decoding (--max-batch = the batch size). The runs of one sampling start at once (about
# 100 GB of GPU memory for the 8B shape: KV cache sized by batch). MODEL (default
# random:llama3-8b) may be a GGUF; DEVICE (default cuda) =cpu checks the script itself; EXTRA adds
# options to every run of both kinds (e.g. --mixed-prefill: the prompts' chunks inside decode steps).
# Run from the repository root on the GPU machine after kernels/build-gpu.sh (SOV=path overrides).
S=${SOV:-.gpu/sov}
MODEL=${MODEL:-random:llama3-8b}
FOUR=(); for i in 1 2 3 4; do FOUR+=(--prompt "request number $i of four"); done
if [ -n "${MIDRUN:-}" ]; then
  T=${T:-/tmp/sov-midrun}; rm -rf $T; mkdir -p $T
  M="--model $MODEL --device ${DEVICE:-cuda} --checkpoint off --max-tokens ${N:-256} --ignore-eos --json ${EXTRA:-}"
  long() { printf 'neighbour %s ' "$1"; head -c $((100 + ($1 * 37) % 300)) /dev/zero | tr '\0' "$(printf \\$(printf '%03o' $((97 + $1 % 26))))"; }
  SAMPLES=${SAMPLES:-greedy seeded}
  for mode in ${MODES:-deterministic}; do
    F=(); [ "$mode" = deterministic ] && F=(--deterministic)
    for s in $SAMPLES; do
      X="--temperature 0"; [ "$s" = seeded ] && X="--temperature 0.8 --seed 7"
      $S generate $M --kv-memory-mb 2000 "${F[@]}" $X --max-batch 1 "${FOUR[@]}" > $T/alone-$mode-$s.json 2>$T/alone-$mode-$s.err &
      for b in ${BATCHES:-16 64 256}; do
        MANY=(); for i in $(seq 1 $((b - 4))); do MANY+=(--prompt "$(long $i)"); done
        $S generate $M --kv-memory-mb $((1000 + b * 75)) "${F[@]}" $X --max-batch $b --max-prefill-tokens 128 "${FOUR[@]}" "${MANY[@]}" > $T/batch-$mode-$s-$b.json 2>$T/batch-$mode-$s-$b.err &
      done
      wait
    done
  done
  for mode in ${MODES:-deterministic}; do for s in $SAMPLES; do for b in ${BATCHES:-16 64 256}; do
    python3 - $T/alone-$mode-$s.json $T/batch-$mode-$s-$b.json "$mode $s, batch of $b with neighbours arriving mid-run" <<'PY'
import json, sys
alone = {j["request_id"]: j["tokens"] for j in map(json.loads, open(sys.argv[1]))}
batch = {j["request_id"]: j["tokens"] for j in map(json.loads, open(sys.argv[2]))}
ids, bids = sorted(alone), sorted(batch)[:4]
same, firsts = 0, []
for i, j in zip(ids, bids):
    a, b = alone[i], batch.get(j, [])
    if a == b: same += 1
    else: firsts.append(next((t for t, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))))
print(f"{sys.argv[3]}: {same} of {len(ids)} requests identical to themselves alone ({len(batch)} reported); first differing token of the others: {firsts}")
PY
  done; done; done
  rm -rf $T
  exit 0
fi
M="--model $MODEL --device cuda --kv-memory-mb 24000 --checkpoint off --max-tokens ${N:-256} --ignore-eos --json ${EXTRA:-}"
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
