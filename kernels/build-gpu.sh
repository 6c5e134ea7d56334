#!/bin/bash
# Builds the GPU test binaries (release; cudarc loads CUDA at run time, so no CUDA is needed here)
# and copies them into .gpu/ (git-ignored) for kernels/gpu-check.sh on the GPU machine.
# Usage (repository root): kernels/build-gpu.sh [source-tree]   (default: this checkout)
set -e
SRC=${1:-.}
mkdir -p .gpu
json=$(cd "$SRC" && cargo test --release -p sov --lib --no-run --message-format=json 2>/dev/null)
bin=$(echo "$json" | grep -o '"executable":"[^"]*"' | grep '/sov-' | tail -1 | cut -d'"' -f4)
cp "$bin" .gpu/sov-lib-tests
json=$(cd "$SRC" && cargo test --release -p sov-kernels --test nvrtc_compile --no-run --message-format=json 2>/dev/null)
bin=$(echo "$json" | grep -o '"executable":"[^"]*"' | grep nvrtc_compile | tail -1 | cut -d'"' -f4)
cp "$bin" .gpu/nvrtc-compile
ls -la .gpu
