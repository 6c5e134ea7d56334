#!/bin/bash
# Builds the GPU test binaries and the sov binary (release; cudarc loads CUDA at run time, so no
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
json=$(cd "$SRC" && build cargo test --release -p sov-kernels --test nvrtc_compile --no-run --message-format=json)
bin=$(echo "$json" | grep -o '"executable":"[^"]*"' | grep nvrtc_compile | tail -1 | cut -d'"' -f4)
cp "$bin" .gpu/nvrtc-compile
(cd "$SRC" && build cargo build --release -p sov --bin sov)
cp "$SRC/target/release/sov" .gpu/sov
strip .gpu/sov-lib-tests .gpu/nvrtc-compile .gpu/sov
ls -la .gpu
