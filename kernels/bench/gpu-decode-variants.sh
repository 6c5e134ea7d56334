#!/bin/bash
# Variants of the tensor-core decode-attention kernel against the one built into the binary, in one
# device call: `bench_decode_attention` rounds interleaved (built-in, each variant, built-in, ...)
# so the machine's drift falls on all of them, then TESTS (test names, default the bf16 and e4m3
# decode-attention tests) with each variant, compiled through SOV_KERNEL_SOURCE_DIR (no Rust build).
# A variant is NAME=LINES: the lines (separated by ';') go at the top of a copy of
# kernels/cuda/decode_attention_mma.cu, e.g. a third CTA an SM for the e4m3 cache:
#   kernels/bench/gpu-decode-variants.sh 'min3=#ifdef KV_FP8;#define MIN_BLOCKS 3;#endif'
# NAME=@DIR takes a whole kernels/cuda folder instead (e.g. the carried working tree's, holding an
# edited kernel: 'edited=@kernels/cuda'), and NAME=LINES|ENV or NAME=@DIR|ENV adds environment
# settings for that variant's runs (space-separated VAR=VALUE, e.g. 'two=@kernels/cuda|
# SOV_DECODE_CARVEOUT=40,50').
# Env: BIN (default .gpu/sov-lib-tests, from kernels/build-gpu.sh), SHAPES (default the 1000-request
# and long-context shapes), KV (bf16 or e4m3: one cache format; default both), ROUNDS (default 2).
# Logs to $OUT/gpu-decode-variants.log (or ./).
set -o pipefail
BIN=${BIN:-.gpu/sov-lib-tests}
LOG=${OUT:-.}/gpu-decode-variants.log
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
: > "$LOG"
[ $# -gt 0 ] || { echo "usage: $0 NAME=LINES..." >&2; exit 2; }
export SOV_FIXTURE_DIR=$PWD/runtime/tests/fixtures
names=()
declare -A envs
for v in "$@"; do
  name=${v%%=*}
  body=${v#*=}
  envs[$name]=""
  [[ $body == *"|"* ]] && envs[$name]=${body#*|} && body=${body%%|*}
  mkdir -p "$T/$name"
  if [[ $body == @* ]]; then
    cp "${body#@}"/* "$T/$name/" || exit 2
  else
    cp kernels/cuda/* "$T/$name/"
    { echo "$body" | tr ';' '\n'; cat kernels/cuda/decode_attention_mma.cu; } > "$T/$name/decode_attention_mma.cu"
  fi
  names+=("$name")
done
bench() {  # name (built-in: the binary's own kernel)
  local dir="" extra=""
  [ "$1" != built-in ] && dir=$T/$1 && extra=${envs[$1]}
  echo "== $1 $(date -u +%T)${extra:+ ($extra)}" | tee -a "$LOG"
  env ${dir:+SOV_KERNEL_SOURCE_DIR=$dir} ${KV:+SOV_BENCH_ATTN_KV=$KV} $extra \
    SOV_BENCH_ATTN_SHAPES=${SHAPES:-1000x256,1000x384,256x1024,64x2048,1x4096} \
    "$BIN" bench_decode_attention --ignored --nocapture --test-threads=1 2>&1 | grep -E "^BENCH decode_attention |panicked|rror" | tee -a "$LOG"
}
for r in $(seq 1 "${ROUNDS:-2}"); do
  bench built-in
  for n in "${names[@]}"; do bench "$n"; done
done
for n in "${names[@]}"; do
  for t in ${TESTS:-decode_attention_matches_cpu attention_over_an_e4m3_cache_matches_cpu}; do
    echo "== $n: $t $(date -u +%T)" | tee -a "$LOG"
    env SOV_KERNEL_SOURCE_DIR=$T/$n ${envs[$n]} "$BIN" "$t" --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED" | tee -a "$LOG"
  done
done
echo "== done $(date -u +%T)" | tee -a "$LOG"
