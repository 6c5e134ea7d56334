#!/usr/bin/env bash
# sov serve vs llama.cpp's llama-server on the same model, same machine, same client.
#
# Starts each server in turn on loopback, runs `sov bench --url` against it at each request rate
# (64 requests of 128 random prompt tokens and 128 generated tokens, ignore_eos, streamed), stops
# it, and prints a side-by-side table: TTFT p50/p99, ITL p50/p99, output tok/s.
#
# Usage:
#   runtime/bench/serve-vs-llama.sh SOV_BIN LLAMA_SERVER_BIN SOV_MODEL LLAMA_GGUF [OUT_DIR]
#     SOV_BIN           target/release/sov
#     LLAMA_SERVER_BIN  llama.cpp's llama-server (CPU build)
#     SOV_MODEL         what `sov serve --model` loads (a .gguf, a Hugging Face folder, a name)
#     LLAMA_GGUF        the GGUF llama-server loads (weights of the same values as SOV_MODEL's)
#     OUT_DIR           where the per-run JSON and server logs go (default: a new temp folder)
# Environment (defaults in brackets):
#   RATES ["1 2 4 inf"]  NUM [64]  IN [128]  OUT [128]  SEED [0]  PORT [18080]
#   TOKENIZER [SOV_MODEL]   the prompts' tokenizer (the same token ids go to both servers)
#   SOV_ARGS  ["--device cpu"]  extra `sov serve` options
#   LLAMA_ARGS ["-np NUM -kvu -c NUM*(IN+OUT+16) --no-webui"]  extra llama-server options
#   SERVERS ["sov llama"]  which to run
set -euo pipefail

if [ $# -lt 4 ]; then
    sed -n '2,21p' "$0"
    exit 2
fi
SOV_BIN=$1 LLAMA_BIN=$2 SOV_MODEL=$3 LLAMA_GGUF=$4
OUT_DIR=${5:-$(mktemp -d -t serve-vs-llama.XXXXXX)}
RATES=${RATES:-"1 2 4 inf"}
NUM=${NUM:-64} IN=${IN:-128} OUT=${OUT:-128} SEED=${SEED:-0} PORT=${PORT:-18080}
TOKENIZER=${TOKENIZER:-$SOV_MODEL}
SOV_ARGS=${SOV_ARGS:-"--device cpu"}
LLAMA_ARGS=${LLAMA_ARGS:-"-np $NUM -kvu -c $((NUM * (IN + OUT + 16))) --no-webui"}
SERVERS=${SERVERS:-"sov llama"}
mkdir -p "$OUT_DIR"
URL="http://127.0.0.1:$PORT"

server_pid=""
stop_server() {
    if [ -n "$server_pid" ]; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
        server_pid=""
    fi
}
trap stop_server EXIT

start_server() {
    local name=$1
    case $name in
        # shellcheck disable=SC2086
        sov) "$SOV_BIN" serve --model "$SOV_MODEL" --host 127.0.0.1 --port "$PORT" $SOV_ARGS \
                 >"$OUT_DIR/$name.log" 2>&1 & ;;
        # shellcheck disable=SC2086
        llama) "$LLAMA_BIN" -m "$LLAMA_GGUF" --host 127.0.0.1 --port "$PORT" $LLAMA_ARGS \
                 >"$OUT_DIR/$name.log" 2>&1 & ;;
        *) echo "unknown server $name" >&2; exit 2 ;;
    esac
    server_pid=$!
    for _ in $(seq 1 600); do
        if curl -sf "$URL/health" >/dev/null 2>&1; then
            return 0
        fi
        if ! kill -0 "$server_pid" 2>/dev/null; then
            echo "$name exited before it was ready; its log:" >&2
            tail -20 "$OUT_DIR/$name.log" >&2
            exit 1
        fi
        sleep 0.2
    done
    echo "$name not ready after 120 s" >&2
    exit 1
}

echo "machine: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); out: $OUT_DIR" >&2
for name in $SERVERS; do
    start_server "$name"
    echo "== $name ready on $URL" >&2
    for rate in $RATES; do
        echo "-- $name rate $rate (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
        "$SOV_BIN" bench --url "$URL" --tokenizer "$TOKENIZER" --request-rate "$rate" \
            --num-prompts "$NUM" --input-len "$IN" --output-len "$OUT" --seed "$SEED" \
            --json "$OUT_DIR/$name-$rate.json" | tee "$OUT_DIR/$name-$rate.txt" >&2 || true
    done
    stop_server
done

python3 - "$OUT_DIR" "$RATES" "$SERVERS" <<'EOF'
import json, os, sys
out, rates, servers = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
def load(name, rate):
    p = os.path.join(out, f"{name}-{rate}.json")
    return json.load(open(p)) if os.path.exists(p) else None
cols = ["TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "out tok/s", "ok"]
print(f"{'rate':>5} {'server':>6} " + " ".join(f"{c:>10}" for c in cols))
for rate in rates:
    rows = {}
    for name in servers:
        r = load(name, rate)
        if r is None:
            print(f"{rate:>5} {name:>6} {'(no result)':>10}")
            continue
        rows[name] = r
        vals = [r["ttft"]["median_ms"], r["ttft"]["p99_ms"], r["itl"]["median_ms"],
                r["itl"]["p99_ms"], r["output_throughput"]]
        print(f"{rate:>5} {name:>6} " + " ".join(f"{v:>10.2f}" for v in vals)
              + f" {r['completed']:>7}/{r['num_prompts']}")
    if "sov" in rows and "llama" in rows:
        s, l = rows["sov"], rows["llama"]
        ok = (s["ttft"]["p99_ms"] <= l["ttft"]["p99_ms"] and s["itl"]["p99_ms"] <= l["itl"]["p99_ms"]
              and s["output_throughput"] >= 1.3 * l["output_throughput"])
        print(f"{rate:>5} {'ratio':>6} {'':>10} {s['ttft']['p99_ms'] / l['ttft']['p99_ms']:>10.2f}"
              f" {'':>10} {s['itl']['p99_ms'] / l['itl']['p99_ms']:>10.2f}"
              f" {s['output_throughput'] / l['output_throughput']:>10.2f}"
              f"  goal (p99s <= llama, tok/s >= 1.3x): {'met' if ok else 'NOT met'}")
EOF
