#!/usr/bin/env bash
# sov vs llama.cpp on the CPU, same GGUF, same machine, one run: prefill and decode throughput.
#
# Runs, alternating the two engines so that a change in machine load hits both:
#   llama-bench -t T -p NPP -n NTG  (pp NPP / tg NTG at batch 1)  then  sov bench --sweep 1
#   for each N in NPL: llama-batched-bench -npp NPP -ntg NTG -npl N -t T  then  sov bench --sweep N
# and prints one table: per concurrency, llama.cpp's S_PP / S_TG / output tok/s including prefill
# (pl*ntg / T) against sov's pp / tg / output tok/s (`sov bench` prefill_tok_s, decode_tok_s,
# output_throughput; defined in runtime/src/cli/bench_stats.rs, PhaseRates) and their ratios
# (sov / llama.cpp), plus sov's mean TTFT. Row "bench" is llama-bench's pp/tg (batch 1, tg from an
# empty context) against sov's batch-1 run.
#
# It never downloads or builds anything: build llama.cpp yourself (targets llama-bench and
# llama-batched-bench, CPU; see ../shared/device.md for the flags that work on this machine).
#
# Usage:
#   runtime/bench/cpu-vs-llamacpp.sh LLAMA_BIN_DIR GGUF [SOV_BIN] [OUT_DIR]
#     LLAMA_BIN_DIR  folder holding llama-bench and llama-batched-bench
#     GGUF           the model file both load (the default model: ~/.cache/sov/*.gguf)
#     SOV_BIN        sov's binary (default: target/release/sov)
#     OUT_DIR        where the raw JSON/JSONL and logs go (default: a new temp folder)
# Environment (defaults in brackets):
#   THREADS [2]  NPP [128]  NTG [128]  NPL ["1 4 16 64"]  SEED [0]
#   SOV_ARGS ["--device cpu"]  extra `sov bench` options
set -euo pipefail

if [ $# -lt 2 ]; then
    sed -n '2,25p' "$0"
    exit 2
fi
LLAMA_DIR=$1 GGUF=$2
SOV_BIN=${3:-target/release/sov}
OUT_DIR=${4:-$(mktemp -d -t cpu-vs-llamacpp.XXXXXX)}
THREADS=${THREADS:-2} NPP=${NPP:-128} NTG=${NTG:-128} NPL=${NPL:-"1 4 16 64"} SEED=${SEED:-0}
SOV_ARGS=${SOV_ARGS:-"--device cpu"}
mkdir -p "$OUT_DIR"
for bin in "$LLAMA_DIR/llama-bench" "$LLAMA_DIR/llama-batched-bench" "$SOV_BIN"; do
    [ -x "$bin" ] || { echo "not an executable: $bin" >&2; exit 2; }
done
[ -f "$GGUF" ] || { echo "no such GGUF: $GGUF" >&2; exit 2; }

# sov bench at concurrency N (N requests at once): one JSON line in $OUT_DIR/sov-N.json.
sov_run() {
    local n=$1
    # shellcheck disable=SC2086
    "$SOV_BIN" bench --model "$GGUF" $SOV_ARGS --sweep "$n" --input-len "$NPP" \
        --output-len "$NTG" --ignore-eos --seed "$SEED" --json - \
        >"$OUT_DIR/sov-$n.json" 2>"$OUT_DIR/sov-$n.log"
}

echo "llama-bench pp$NPP/tg$NTG ..." >&2
"$LLAMA_DIR/llama-bench" -m "$GGUF" -t "$THREADS" -p "$NPP" -n "$NTG" -o jsonl \
    >"$OUT_DIR/llama-bench.jsonl" 2>"$OUT_DIR/llama-bench.log"
echo "sov bench batch 1 ..." >&2
sov_run 1
for n in $NPL; do
    echo "llama-batched-bench npl $n ..." >&2
    "$LLAMA_DIR/llama-batched-bench" -m "$GGUF" -t "$THREADS" -npp "$NPP" -ntg "$NTG" -npl "$n" \
        -c $((n * (NPP + NTG) + 16)) --output-format jsonl \
        >"$OUT_DIR/llama-batched-$n.jsonl" 2>"$OUT_DIR/llama-batched-$n.log"
    if [ "$n" != 1 ]; then
        echo "sov bench concurrency $n ..." >&2
        sov_run "$n"
    fi
done

python3 - "$OUT_DIR" "$NPP" "$NTG" $NPL <<'EOF'
import json, os, sys

out, npp, ntg, npl = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]

def jsonl(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.lstrip().startswith("{")]

def ratio(a, b):
    return f"{a / b:.2f}x" if b else "-"

bench = {(r["n_prompt"], r["n_gen"]): r["avg_ts"] for r in jsonl(os.path.join(out, "llama-bench.jsonl"))}
rows = []
sov1 = jsonl(os.path.join(out, "sov-1.json"))[-1]
rows.append(("bench 1", bench.get((npp, 0), 0.0), bench.get((0, ntg), 0.0), None, sov1))
for n in npl:
    b = jsonl(os.path.join(out, f"llama-batched-{n}.jsonl"))[-1]
    s = jsonl(os.path.join(out, f"sov-{n}.json"))[-1]
    rows.append((f"batched {n}", b["speed_pp"], b["speed_tg"], b["pl"] * b["tg"] / b["t"], s))

head = ("llama.cpp", "N", "llama pp", "sov pp", "ratio", "llama tg", "sov tg", "ratio",
        "llama out", "sov out", "ratio", "sov TTFT ms")
print(f"pp{npp} / tg{ntg} tok/s; out = generated tok/s including prefill; ratio = sov / llama.cpp")
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
for name, pp, tg, total, s in rows:
    kind, n = name.split()
    ph = s["phases"]
    cells = [kind, n, f"{pp:.1f}", f"{ph['prefill_tok_s']:.1f}", ratio(ph["prefill_tok_s"], pp),
             f"{tg:.1f}", f"{ph['decode_tok_s']:.1f}", ratio(ph["decode_tok_s"], tg),
             "-" if total is None else f"{total:.1f}", f"{s['output_throughput']:.1f}",
             "-" if total is None else ratio(s["output_throughput"], total),
             f"{s['ttft']['mean_ms']:.0f}"]
    print("| " + " | ".join(cells) + " |")
print(f"raw results: {out}")
EOF
