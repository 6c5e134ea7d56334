#!/bin/bash
# Builds the GPU test binaries (the library's op tests, the gpu_parity and gpu_bench targets) and
# the sov binary (release; cudarc loads CUDA at run time, so no
# CUDA is needed here), strips them and copies them into .gpu/ (git-ignored) for
# kernels/gpu-check.sh on the GPU machine.
# Usage (repository root): kernels/build-gpu.sh [source-tree]   (default: this checkout)
set -e
SRC=${1:-.}
ERR=$(mktemp)
trap 'rm -f "$ERR"' EXIT
# A failed build must stop here with its messages, not leave stale binaries in .gpu/.
build() { "$@" 2>"$ERR" || { cat "$ERR" >&2; echo "build-gpu: '$*' failed" >&2; exit 1; }; }
mkdir -p .gpu
json=$(cd "$SRC" && build cargo test --release -p sov --lib --no-run --message-format=json)
bin=$(echo "$json" | grep -o '"executable":"[^"]*"' | grep '/sov-' | tail -1 | cut -d'"' -f4)
cp "$bin" .gpu/sov-lib-tests
# The model-level GPU test targets: parity with the CPU, the engine's decode steps launched
# ahead, and the decode benchmark.
for t in gpu_parity gpu_decode_ahead gpu_bench; do
  json=$(cd "$SRC" && build cargo test --release -p sov --test $t --no-run --message-format=json)
  bin=$(echo "$json" | grep -o '"executable":"[^"]*"' | grep "/$t-" | tail -1 | cut -d'"' -f4)
  cp "$bin" .gpu/sov-${t//_/-}
done
json=$(cd "$SRC" && build cargo test --release -p sov-kernels --test nvrtc_compile --no-run --message-format=json)
bin=$(echo "$json" | grep -o '"executable":"[^"]*"' | grep nvrtc_compile | tail -1 | cut -d'"' -f4)
cp "$bin" .gpu/nvrtc-compile
(cd "$SRC" && build cargo build --release -p sov --bin sov)
cp "$SRC/target/release/sov" .gpu/sov
strip .gpu/sov-lib-tests .gpu/sov-gpu-parity .gpu/sov-gpu-decode-ahead .gpu/sov-gpu-bench .gpu/nvrtc-compile .gpu/sov
ls -la .gpu
