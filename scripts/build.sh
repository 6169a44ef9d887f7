#!/usr/bin/env bash
# Configures and builds dufu: scripts/build.sh BUILD_DIR [extra cmake arguments...]
# Installs Arrow's libraries first (scripts/setup_arrow.sh, for Parquet and Arrow IPC
# input) unless DUFU_PARQUET=OFF is set; where they cannot be installed (no network),
# the build goes on without that input and says so.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${1:-$root/build}
shift || true
arrow=()
if [[ ${DUFU_PARQUET:-AUTO} == OFF ]]; then
  arrow=(-DDUFU_PARQUET=OFF)
elif arrow_python=$("$root/scripts/setup_arrow.sh" | tail -n 1); then
  arrow=(-DDUFU_ARROW_PYTHON="$arrow_python")
else
  echo "build: scripts/setup_arrow.sh failed: building without Parquet and Arrow input" >&2
fi
cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDUFU_WERROR=ON "${arrow[@]}" "$@"
cmake --build "$build_dir" --parallel "$(nproc)"
