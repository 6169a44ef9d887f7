#!/usr/bin/env bash
# CUDA compiler launcher: runs the compile command it is given and keeps what ptxas
# printed (-Xptxas=-v: registers, shared memory and spills of every kernel) next to the
# object as OBJECT.ptxas.txt, for tests/trainer/cuda_spills_test.sh to read.
set -uo pipefail
object=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  if [[ ${args[i]} == -o && $((i + 1)) -lt ${#args[@]} ]]; then object=${args[i + 1]}; fi
done
if [[ -z $object ]]; then exec "$@"; fi
"$@" 2>"$object.ptxas.txt"
status=$?
grep -v '^ptxas info' "$object.ptxas.txt" >&2
exit $status
