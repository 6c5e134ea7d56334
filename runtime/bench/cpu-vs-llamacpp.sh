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
# llama-batched-bench, CPU; on a Xeon whose GGML_NATIVE build died with SIGILL, spelling the flags
# out worked: -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON).
#
# Usage:
#   runtime/bench/cpu-vs-llamacpp.sh LLAMA_BIN_DIR GGUF [SOV_BIN] [OUT_DIR]
#   runtime/bench/cpu-vs-llamacpp.sh --table OUT_DIR   (the table of an earlier, maybe partial, run)
#     LLAMA_BIN_DIR  folder holding llama-bench and llama-batched-bench
#     GGUF           the model file both load (the default model: ~/.cache/sov/*.gguf)
#     SOV_BIN        sov's binary (default: target/release/sov)
#     OUT_DIR        where the raw JSON/JSONL and logs go (default: a new temp folder)
# Environment (defaults in brackets):
#   THREADS [2]  NPP [128]  NTG [128]  NPL ["1 4 16 64"]  SEED [0]
#   SOV_ARGS ["--device cpu"]  extra `sov bench` options
set -euo pipefail

if [ $# -lt 2 ]; then
    sed -n '2,26p' "$0"
    exit 2
fi
TABLE_ONLY=""
if [ "$1" = --table ]; then
    TABLE_ONLY=1 OUT_DIR=$2
fi
THREADS=${THREADS:-2} NPP=${NPP:-128} NTG=${NTG:-128} NPL=${NPL:-"1 4 16 64"} SEED=${SEED:-0}
SOV_ARGS=${SOV_ARGS:-"--device cpu"}

# Prints the table of the results in $OUT_DIR (rows whose files are missing show "-").
table() {
python3 - "$OUT_DIR" "$NPP" "$NTG" $NPL <<'EOF'
import json, os, sys

out, npp, ntg, npl = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]


def lines(name):
    """The JSON lines of out/name (none when the file is missing)."""
    try:
        with open(os.path.join(out, name)) as f:
            return [json.loads(l) for l in f if l.lstrip().startswith("{")]
    except OSError:
        return []


def last(name):
    rows = lines(name)
    return rows[-1] if rows else None


def num(x):
    return "-" if x is None else f"{x:.1f}"


def ratio(a, b):
    return f"{a / b:.2f}x" if a is not None and b else "-"


bench = {(r["n_prompt"], r["n_gen"]): r["avg_ts"] for r in lines("llama-bench.jsonl")}
rows = [("bench", "1", bench.get((npp, 0)), bench.get((0, ntg)), None, last("sov-1.json"))]
for n in npl:
    b = last(f"llama-batched-{n}.jsonl")
    rows.append(("batched", n, b and b["speed_pp"], b and b["speed_tg"],
                 b and b["pl"] * b["tg"] / b["t"], last(f"sov-{n}.json")))

head = ("llama.cpp", "N", "llama pp", "sov pp", "ratio", "llama tg", "sov tg", "ratio",
        "llama out", "sov out", "ratio", "sov TTFT ms")
print(f"pp{npp} / tg{ntg} tok/s; out = generated tok/s including prefill; ratio = sov / llama.cpp")
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
for kind, n, pp, tg, total, s in rows:
    ph = s["phases"] if s else {}
    spp, stg = ph.get("prefill_tok_s"), ph.get("decode_tok_s")
    sout = s["output_throughput"] if s else None
    ttft = s["ttft"]["mean_ms"] if s else None
    cells = [kind, n, num(pp), num(spp), ratio(spp, pp), num(tg), num(stg), ratio(stg, tg),
             num(total), num(sout), ratio(sout, total), "-" if ttft is None else f"{ttft:.0f}"]
    print("| " + " | ".join(cells) + " |")
print(f"raw results: {out}")
EOF
}

if [ -n "$TABLE_ONLY" ]; then
    table
    exit 0
fi
LLAMA_DIR=$1 GGUF=$2
SOV_BIN=${3:-target/release/sov}
OUT_DIR=${4:-$(mktemp -d -t cpu-vs-llamacpp.XXXXXX)}
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

table
