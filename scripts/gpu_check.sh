#!/usr/bin/env bash
# The one command of a GPU call: unpacks the bundle that scripts/gpu_bundle.sh made
# (gpu-bundle/dufu-gpu.tar.xz, carried with the call) and runs its run.sh, passing on
# its arguments (--steps, --budget; run.sh --help). Python's tarfile unpacks it where
# the machine has no xz.
#   bash scripts/gpu_check.sh [run.sh arguments]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
archive=$root/gpu-bundle/dufu-gpu.tar.xz
[[ -f $archive ]] || { echo "gpu_check.sh: $archive missing. HINT: scripts/gpu_bundle.sh, then carry gpu-bundle" >&2; exit 1; }
target=${TMPDIR:-/tmp}/dufu-gpu-check
rm -rf "$target" && mkdir -p "$target"
if command -v xz >/dev/null; then
  tar -xJf "$archive" -C "$target"
else
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$archive" "$target"
fi
echo "gpu_check.sh: bundle of $(cat "$target/dufu-gpu/COMMIT"); this tree is $(git -C "$root" rev-parse HEAD 2>/dev/null || echo "not a git checkout")"
exec "$target/dufu-gpu/run.sh" "$@"
