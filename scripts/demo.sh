#!/usr/bin/env bash
# Command 1: installs missing packages, builds everything and runs the main
# job: data-parallel training of the example on the embedded default
# (--standalone; the CPU backend when there is no GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
mkdir -p build
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release >build/release.configure.log 2>&1 ||
  { cat build/release.configure.log; exit 1; }
cmake --build build/release -j"$(nproc 2>/dev/null || echo 2)" 2>&1 | grep -vE '^\[ *[0-9]+%\]' || true
[ "${PIPESTATUS[0]}" -eq 0 ] || exit 1
b=build/release
exec $b/launcher/gpulaunch --standalone --nproc-per-node 4 $b/examples/dp_train "$@"
