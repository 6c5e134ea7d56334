#!/bin/bash
# Per-kernel GPU time inside sov's decode steps, default against deterministic mode, under Nsight
# Compute: each kernel node of the captured step is replayed alone (no overlap between kernels, no
# programmatic dependent launch; caches and clocks left as the previous kernel leaves them), so a
# step's sum runs above its real time, and picks that time kernels (det_gemv.rs) time the profiler
# too: read the product rows next to the pick logs of an unprofiled run.
# Usage (repository root, GPU machine, binaries from kernels/build-gpu.sh):
#   BATCHES="1 16" OUT_DIR=/tmp/step-profile kernels/bench/gpu-step-profile.sh
# Prints, per batch and mode, each kernel's time a step over the last STEPS decode steps (steps end
# at argmax_rows, the greedy sampler) and keeps the raw CSVs in OUT_DIR (4-7 MB each).
# PREFILL=1: the first prefill pass instead, every kernel from the first embedding_gather to the
# first argmax_rows (the first request is admitted alone: one prompt of 128 tokens).
set -u
SOV=${SOV:-.gpu/sov}
OUT_DIR=${OUT_DIR:-/tmp/step-profile}
BATCHES=${BATCHES:-"1 16"}
STEPS=${STEPS:-3}
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "gpu-step-profile: ncu not found" >&2; exit 1; }
mkdir -p "$OUT_DIR"
for b in $BATCHES; do
  for mode in false true; do
    csv="$OUT_DIR/ncu-b$b-det-$mode.csv"
    timeout 300 "$NCU" --graph-profiling node --clock-control none --cache-control none \
      --metrics gpu__time_duration.sum --csv --page raw --print-units base \
      "$SOV" bench --model random:llama3-8b --device cuda --kv-memory-mb 4000 \
      --num-prompts "$b" --concurrency "$b" --input-len 128 --output-len 6 --ignore-eos \
      --deterministic "$mode" >"$csv" 2>"$OUT_DIR/ncu-b$b-det-$mode.err"
    echo "== batch $b deterministic=$mode: rc $?"
    python3 - "$csv" "$STEPS" "${PREFILL:-}" <<'PY'
import collections, csv, statistics, sys
rows = list(csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')))
if len(rows) < 3:
    print("no kernels profiled"); sys.exit(0)
head = rows[0]
ki, ti = head.index("Kernel Name"), head.index("gpu__time_duration.sum")
gi = head.index("Grid Size") if "Grid Size" in head else None
num = lambda s: float(s.replace(",", ""))
ks = [(r[ki], r[gi] if gi is not None else "", num(r[ti])) for r in rows[2:] if r[ti]]
ends = [i for i, (k, _, _) in enumerate(ks) if k.startswith("argmax_rows")]
steps = int(sys.argv[2])
what = f"last {steps} decode steps"
if sys.argv[3] and ends:
    start = next(i for i, (k, _, _) in enumerate(ks) if k.startswith("embedding_gather"))
    ends, steps, what = [start - 1, ends[0]], 1, "the prefill pass"
    print("(the first pass also times the deterministic picks' candidates: det_*, read_sweep and nvjet kernels counted other than once a layer)")
if len(ends) <= steps:
    print(f"only {len(ends)} sampled steps"); sys.exit(0)
tail = ks[ends[-steps - 1] + 1 : ends[-1] + 1]
by = collections.defaultdict(list)
for k, g, t in tail:
    by[(k[:50], g)].append(t)
print(f"{what}: {sum(t for *_, t in tail) / steps / 1e3:.1f} us of kernels a step, {len(tail) / steps:.0f} launches")
for (k, g), ts in sorted(by.items(), key=lambda kv: -sum(kv[1])):
    print(f"  {sum(ts) / steps / 1e3:9.1f} us/step {len(ts) / steps:5.1f}x  median {statistics.median(ts) / 1e3:7.2f} us  {k} {g}")
PY
  done
done
