#!/usr/bin/env bash
# Configures and builds dufu: scripts/build.sh BUILD_DIR [extra cmake arguments...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${1:-$root/build}
shift || true
cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDUFU_WERROR=ON "$@"
cmake --build "$build_dir" --parallel "$(nproc)"
