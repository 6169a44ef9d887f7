#!/usr/bin/env bash
# scripts/ncu_summary.py (the GPU runner's step 8) on a hand-made ncu CSV: the training
# step is the launches from the first embedding launch up to the second, grouped by
# what the kernels do; ncu's thousands separators and its units row are read right.
#   ncu_summary_test.sh PYTHON SOURCE_DIR
set -euo pipefail
python=$1
source_dir=$2
output=$("$python" "$source_dir/scripts/ncu_summary.py" sample="$source_dir/tests/data/ncu_profile_sample.csv")
echo "$output"
expect() {
  grep -qF -- "$1" <<<"$output" || { echo "ncu_summary_test: missing line: $1" >&2; exit 1; }
}
expect "sample, the whole run: 2.78 ms of kernel time in 8 launches"
expect "sample, the training step: 1.96 ms of kernel time in 5 launches"
expect "1.064 ms  54.2%     1x  attention backward"
expect "0.068 ms   3.5%     1x  bf16 rounding and copies"
expect "1.525 ms  54.8%     2x  void dufu::<unnamed>::flash_forward_kernel<64>"
