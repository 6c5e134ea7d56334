#!/usr/bin/env bash
# KV memory figures on the CPU, default model: prefix caching on a shared-prefix workload, and
# the KV cache oversubscribed 2x and 4x (swap vs recompute vs the laptop machine vs the swap file)
# against an unconstrained run. Arms are alternated within each round so that a change in machine
# load hits all of them; the table gives per-arm medians over the rounds and the load average
# (`uptime`) seen before each run.
#
# Usage:
#   runtime/bench/kv-memory.sh prefix|oversub|all [SOV_BIN] [OUT_DIR]
#   runtime/bench/kv-memory.sh --table OUT_DIR      (the tables of an earlier, maybe partial, run)
#     SOV_BIN  sov's binary (default: target/release/sov)
#     OUT_DIR  where each run's JSON and stderr go (default: a new temp folder)
# Environment (defaults in brackets):
#   ROUNDS [2]  rounds of alternated arms;  FIRST_ROUND [1]  number of the first (to add rounds
#       to an earlier OUT_DIR)
#   PREFIX_PROMPTS [64]  PREFIX_TOKENS [1024]  PREFIX_OWN [32]  PREFIX_OUT [16]
#       shared-prefix workload: PREFIX_PROMPTS requests at once, each the same PREFIX_TOKENS
#       tokens then PREFIX_OWN of its own, PREFIX_OUT new tokens; arms: cache on / off
#   OVER_PROMPTS [16]  OVER_IN [128]  OVER_OUT [64]
#       oversubscription workload, all at once; the cache for 2x / 4x is sized from the model's
#       KV per token (SmolLM2-135M: 30 layers x K/V x 3 heads x 64 x f32 = 45 KiB, 16-token blocks)
#   KV_PER_BLOCK_KIB [720]  SOV_ARGS ["--device cpu"]
set -euo pipefail

if [ $# -lt 1 ]; then
    sed -n '2,24p' "$0"
    exit 2
fi
WHAT=$1
ROUNDS=${ROUNDS:-2} FIRST_ROUND=${FIRST_ROUND:-1}
PREFIX_PROMPTS=${PREFIX_PROMPTS:-64} PREFIX_TOKENS=${PREFIX_TOKENS:-1024}
PREFIX_OWN=${PREFIX_OWN:-32} PREFIX_OUT=${PREFIX_OUT:-16}
OVER_PROMPTS=${OVER_PROMPTS:-16} OVER_IN=${OVER_IN:-128} OVER_OUT=${OVER_OUT:-64}
KV_PER_BLOCK_KIB=${KV_PER_BLOCK_KIB:-720}
SOV_ARGS=${SOV_ARGS:-"--device cpu"}

if [ "$WHAT" = --table ]; then
    OUT_DIR=$2
else
    SOV=${2:-target/release/sov}
    OUT_DIR=${3:-$(mktemp -d -t sov-kv-XXXXXX)}
    mkdir -p "$OUT_DIR"
fi

# Blocks the whole oversubscription workload needs, and the cache in MiB for 1/X of it.
over_blocks=$(( OVER_PROMPTS * ( (OVER_IN + OVER_OUT + 15) / 16 ) ))
mib_for() { echo $(( (over_blocks * KV_PER_BLOCK_KIB / $1 + 1023) / 1024 )); }

# Arms: name|options after the workload's.
prefix_arms=(
    "prefix-on|"
    "prefix-off|--no-prefix-cache"
)
over_arms=(
    "unconstrained|"
    "2x-swap|--kv-memory-mb $(mib_for 2)"
    "2x-recompute|--kv-memory-mb $(mib_for 2) --swap-mb 0"
    "2x-laptop|--kv-memory-mb $(mib_for 2) --machine laptop"
    "4x-swap|--kv-memory-mb $(mib_for 4)"
    "4x-recompute|--kv-memory-mb $(mib_for 4) --swap-mb 0"
    "4x-laptop|--kv-memory-mb $(mib_for 4) --machine laptop"
    "4x-file|--kv-memory-mb $(mib_for 4) --swap-mb 0 --swap-file-mb 256"
)

run_arm() { # run_arm ROUND NAME WORKLOAD OPTIONS
    local out="$OUT_DIR/$2.r$1"
    uptime >"$out.load"
    echo "round $1: $2 ($(cut -d, -f3- "$out.load" | xargs))" >&2
    # shellcheck disable=SC2086
    "$SOV" bench $SOV_ARGS $3 $4 --ignore-eos --json "$out.json" 2>"$out.err" >/dev/null ||
        echo "  failed: see $out.err" >&2
}

if [ "$WHAT" != --table ]; then
    for r in $(seq "$FIRST_ROUND" $((FIRST_ROUND + ROUNDS - 1))); do
        if [ "$WHAT" = prefix ] || [ "$WHAT" = all ]; then
            for a in "${prefix_arms[@]}"; do
                run_arm "$r" "${a%%|*}" "--num-prompts $PREFIX_PROMPTS --input-len $PREFIX_OWN \
                    --output-len $PREFIX_OUT --shared-prefix-tokens $PREFIX_TOKENS" "${a#*|}"
            done
        fi
        if [ "$WHAT" = oversub ] || [ "$WHAT" = all ]; then
            for a in "${over_arms[@]}"; do
                run_arm "$r" "${a%%|*}" "--num-prompts $OVER_PROMPTS --input-len $OVER_IN \
                    --output-len $OVER_OUT" "${a#*|}"
            done
        fi
    done
fi

python3 - "$OUT_DIR" <<'EOF'
import glob, json, os, re, statistics, sys

out = sys.argv[1]
runs = {}
for path in sorted(glob.glob(os.path.join(out, "*.json"))):
    name, rnd = re.match(r"(.*)\.r(\d+)\.json$", os.path.basename(path)).groups()
    try:
        with open(path) as f:
            text = f.read().strip()
        # One JSON object (pretty or on one line); with several, the last.
        j = json.loads(text) if text.startswith("{") and text.endswith("}") and text.count("\n{") == 0 else json.loads(text.splitlines()[-1])
    except (OSError, ValueError, IndexError):
        continue
    with open(path[: -len(".json")] + ".load") as f:
        load = float(re.search(r"load average: ([\d.]+)", f.read()).group(1))
    runs.setdefault(name, []).append((int(rnd), j, load))


def med(name, get):
    v = [get(j) for _, j, _ in runs.get(name, [])]
    return statistics.median(v) if v else None


def loads(name):
    return "/".join(f"{l:.1f}" for _, _, l in sorted(runs.get(name, [])))


def f(x, d=1):
    return "-" if x is None else f"{x:.{d}f}"


if any(n.startswith("prefix") for n in runs):
    print("| prefix cache | runs | mean TTFT | median TTFT | P99 TTFT | output tok/s | total tok/s | hit / queried tokens | load |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n, label in (("prefix-on", "on (default)"), ("prefix-off", "off")):
        if n not in runs:
            continue
        kv = runs[n][-1][1]["kv"]
        hits = f'{kv["prefix_hit_tokens"]} / {kv["prefix_query_tokens"]}' if kv["prefix_cache"] else "-"
        print(f'| {label} | {len(runs[n])} | {f(med(n, lambda j: j["ttft"]["mean_ms"] / 1e3))} s '
              f'| {f(med(n, lambda j: j["ttft"]["median_ms"] / 1e3))} s | {f(med(n, lambda j: j["ttft"]["p99_ms"] / 1e3))} s '
              f'| {f(med(n, lambda j: j["output_throughput"]), 2)} | {f(med(n, lambda j: j["total_token_throughput"]), 1)} '
              f'| {hits} | {loads(n)} |')
    on, off = med("prefix-on", lambda j: j["ttft"]["mean_ms"]), med("prefix-off", lambda j: j["ttft"]["mean_ms"])
    if on and off:
        per = [(o[1]["ttft"]["mean_ms"] / c[1]["ttft"]["mean_ms"]) for c in runs["prefix-on"] for o in runs["prefix-off"] if o[0] == c[0]]
        print(f"\nmean TTFT off/on: {off / on:.1f}x (medians); per round: {', '.join(f'{x:.1f}x' for x in per)}")
    print()

over = [n for n in ("unconstrained", "2x-swap", "2x-recompute", "2x-laptop", "4x-swap", "4x-recompute", "4x-laptop", "4x-file") if n in runs]
if over:
    base = med("unconstrained", lambda j: j["output_throughput"])
    print("| run | runs | duration | output tok/s | vs unconstrained | median TTFT | median ITL | P99 ITL | completed | preemptions | blocks out / in | recomputed | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in over:
        kv = runs[n][-1][1]["kv"]
        last = runs[n][-1][1]
        thr = med(n, lambda j: j["output_throughput"])
        rel = f"{100 * thr / base:.0f}%" if base and thr else "-"
        print(f'| {n} | {len(runs[n])} | {f(med(n, lambda j: j["duration_s"]))} s | {f(thr, 2)} | {rel} '
              f'| {f(med(n, lambda j: j["ttft"]["median_ms"] / 1e3))} s | {f(med(n, lambda j: j["itl"]["median_ms"]), 0)} ms '
              f'| {f(med(n, lambda j: j["itl"]["p99_ms"]), 0)} ms | {last["completed"]}/{last["num_prompts"]} '
              f'| {kv["preemptions"]} | {kv["blocks_swapped_out"]} / {kv["blocks_swapped_in"]} | {kv["recomputed"]} | {loads(n)} |')
    if base:
        per = []
        for n in over[1:]:
            for r, j, _ in runs[n]:
                b = [bj for br, bj, _ in runs["unconstrained"] if br == r]
                if b:
                    per.append(f'{n} r{r} {100 * j["output_throughput"] / b[0]["output_throughput"]:.0f}%')
        print("\nthroughput against the same round's unconstrained run: " + ", ".join(per))
EOF
echo "raw results: $OUT_DIR" >&2
