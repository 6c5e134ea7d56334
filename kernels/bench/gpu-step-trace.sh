#!/bin/bash
# Where sov's decode steps spend their time, kernels as they really ran (CUDA graphs, programmatic
# dependent launch), default against deterministic mode: builds the CUPTI injection library
# step_trace/step_trace.c, runs `sov bench` under it and prints step_trace/step_report.py's table
# (each kernel's exposed time, idle gaps, duration) per batch and mode.
# Usage (repository root, GPU machine, binaries from kernels/build-gpu.sh):
#   BATCHES="1 16" MODES="false true" kernels/bench/gpu-step-trace.sh
# FLAGS adds sov bench options (e.g. "--quantization fp8"); KV (MiB of KV cache, default 4000) and
# OUTPUT (tokens a request, default 64) size the run; SKIP leaves out the last steps (at a large
# batch they run with fewer sequences: e.g. BATCHES=1024 KV=60000 OUTPUT=256 SKIP=100). Traces
# stay in OUT_DIR. PREFILL=N adds a report of the STEPS passes after the first N (with every prompt
# arriving at once, prefill passes: e.g. PREFILL=8). HOST=1 also records the driver calls, memsets
# and copies, and says what filled the idle gaps (step_report.py's HOST.csv argument); it also
# runs sov with `--log sov::pass=trace` and splits the host's part of the eager passes after the
# first PREFILL (default 8) with pass_timeline.py.
set -u
DIR=$(cd "$(dirname "$0")" && pwd)
SOV=${SOV:-.gpu/sov}
OUT_DIR=${OUT_DIR:-/tmp/step-trace}
BATCHES=${BATCHES:-"1 16"}
MODES=${MODES:-"false true"}
STEPS=${STEPS:-8}
CUDA=${CUDA:-/usr/local/cuda}
mkdir -p "$OUT_DIR"
CUPTI_INC=$(dirname "$(find "$CUDA/" "$CUDA/extras/CUPTI/" -name cupti.h 2>/dev/null | head -1)")
CUPTI_LIB=$(dirname "$(find "$CUDA/" "$CUDA/extras/CUPTI/" -name 'libcupti.so*' 2>/dev/null | head -1)")
[ -n "$CUPTI_INC" ] && [ -n "$CUPTI_LIB" ] || { echo "gpu-step-trace: CUPTI not found under $CUDA" >&2; exit 1; }
LIB="$OUT_DIR/libsteptrace.so"
gcc -O2 -shared -fPIC -I"$CUDA/include" -I"$CUPTI_INC" "$DIR/step_trace/step_trace.c" -L"$CUPTI_LIB" -lcupti \
  -Wl,-rpath,"$CUPTI_LIB" -o "$LIB" || exit 1
for b in $BATCHES; do
  for mode in $MODES; do
    trace="$OUT_DIR/trace-b$b-det-$mode.csv"
    host=""
    log=""
    [ -z "${HOST:-}" ] || { host="$OUT_DIR/host-b$b-det-$mode.csv"; log="--log sov::pass=trace"; }
    CUDA_INJECTION64_PATH="$LIB" STEP_TRACE_OUT="$trace" STEP_TRACE_HOST="$host" timeout 300 "$SOV" bench --model random:llama3-8b \
      --device cuda --kv-memory-mb "${KV:-4000}" --num-prompts "$b" --concurrency "$b" --max-batch "$b" \
      --input-len 128 --output-len "${OUTPUT:-64}" --ignore-eos --deterministic "$mode" ${FLAGS:-} $log >"$OUT_DIR/bench-b$b-det-$mode.txt" 2>&1
    echo "== batch $b deterministic=$mode: rc $?, $(grep -m1 "Output token throughput" "$OUT_DIR/bench-b$b-det-$mode.txt")"
    python3 "$DIR/step_trace/step_report.py" "$trace" "$STEPS" "${SKIP:-0}" last $host
    [ -z "${PREFILL:-}" ] || python3 "$DIR/step_trace/step_report.py" "$trace" "$STEPS" "$PREFILL" first $host
    [ -z "$log" ] || python3 "$DIR/pass_timeline.py" "$OUT_DIR/bench-b$b-det-$mode.txt" "${PREFILL:-8}" 32
  done
done
