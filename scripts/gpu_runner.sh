#!/usr/bin/env bash
# The GPU check, run on a lent GPU machine from the unpacked bundle of
# scripts/gpu_bundle.sh (where it is the bundle's run.sh):
#
#   bash scripts/gpu_check.sh        (unpacks gpu-bundle/dufu-gpu.tar.xz, runs this)
#   run.sh [--steps 1,2,...] [--budget SECONDS]
#
# Each step runs under its own `timeout`, and the whole under a budget (default 420 s,
# 7 minutes) from which every step's limit is cut, so a step that hangs cannot eat the
# others' time; a step the budget no longer reaches is reported as not run. The steps
# run in the order --steps names them; the default, 0,1,2,4,7,5,3,6, puts correctness
# first and the slow tools (the sanitizer, torch.compile) last. Steps:
#   0 libraries: cuBLAS, cuBLASLt (and NCCL, which only multi-GPU groups load) found on
#     this machine (the CUDA install, the loader's cache, then the Python wheels'
#     nvidia/*/lib), and every bundled program resolving every library it needs
#   1 versions and the two ceilings: GPU, driver, runtime, the bf16 cuBLASLt GEMM rate
#     and the device-to-device copy rate (gpu_ceilings)
#   2 every CUDA row of kernels_test against the double-precision reference (failing
#     rows again under CUDA_LAUNCH_BLOCKING=1, so a fault names its kernel)
#   3 compute-sanitizer memcheck, racecheck and synccheck over the small shapes of
#     those rows, and memcheck over two training steps
#   4 gpu_model_test and the one-GPU cases of cuda_training_test
#   5 GPT-2 124M (T = 1024) for 20 steps, fp32 and bf16 (and bf16 with bf16 attention
#     products), micro-batch 8 and 16: tokens/s, MFU, memory against the plan, the loss
#     falling from ln(50257)
#   6 the PyTorch peer on the same shapes: bf16 autocast, SDPA, fused AdamW, eager and
#     torch.compile
#   7 loss parity: dufu's initial weights exported to HuggingFace and loaded by
#     transformers on the GPU give dufu's first loss (fp32 1e-5, bf16 1e-2 relative)
#   8 only when named: Nsight Compute's time for every kernel of one bf16 GPT-2 step,
#     with fp32 and with bf16 attention products, grouped (profile.txt)
# Logs go under $OUT (default ./gpu-check-out): summary.txt, which ends with the table
# this prints last, and machine.log (steps 0, 1 and 8), kernels.log, sanitizer.log,
# tests.log, training.log, peer.log, parity.log and profile.txt. A device call brings
# back at most 8 files: steps 0-7 make 8, so name fewer steps beside step 8.
# Without a GPU (scripts/gpu_bundle.sh --verify runs it in a bare Debian root) every
# GPU step reports "skipped: no GPU" with the reason, and the CPU side still runs.
set -uo pipefail
bundle=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$PWD/gpu-check-out}
budget=420
steps=0,1,2,4,7,5,3,6
while (($#)); do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
summary=$out/summary.txt
: >"$summary"
started=$SECONDS
rows=()

say() { echo "$*" | tee -a "$summary"; }
# record STEP RESULT FIGURES: one row of the final table.
record() { rows+=("$(printf '%-4s %-34s %s' "$1" "$2" "$3")"); say "step $1: $2${3:+ ($3)}"; }
# The seconds step may use: its own cap, or what is left of the budget.
limit() { local left=$((budget - (SECONDS - started))); echo $(( $1 < left ? $1 : left )); }
wants() { [[ ,$steps, == *,$1,* ]]; }
# key=value fields of a machine-readable line.
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<" $2"; }

# --- step 0: libraries ---------------------------------------------------------
gpu_libraries_dirs=()
add_dir() { [[ -d $1 ]] && [[ " ${gpu_libraries_dirs[*]} " != *" $1 "* ]] && gpu_libraries_dirs+=("$1"); }
for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/nvidia/lib64 \
           /usr/lib/x86_64-linux-gnu; do
  add_dir "$dir"
done
python=$(command -v python3 || true)
if [[ -n $python ]]; then
  while read -r dir; do add_dir "$dir"; done < <("$python" - <<'EOF' 2>/dev/null
import glob, os
try:
    import nvidia
except ImportError:
    raise SystemExit
for root in nvidia.__path__:
    for lib in sorted(glob.glob(os.path.join(root, "*", "lib")) + glob.glob(os.path.join(root, "*", "*", "lib"))):
        print(lib)
EOF
  )
fi
# find_library SONAME: the first directory holding it, else the loader's cache.
find_library() {
  local dir
  for dir in "${gpu_libraries_dirs[@]}"; do [[ -e $dir/$1 ]] && { echo "$dir/$1"; return 0; }; done
  "$(command -v ldconfig || echo /sbin/ldconfig)" -p 2>/dev/null | awk -v name="$1" '$1 == name { print $NF; exit }'
}
library_path=$bundle/lib
missing_machine=()
for soname in $(cat "$bundle/MACHINE_LIBRARIES"); do
  found=$(find_library "$soname")
  if [[ -z $found ]]; then
    missing_machine+=("$soname")
  else
    say "found $soname: $found"
    dir=$(dirname "$found")
    [[ :$library_path: == *:$dir:* ]] || library_path+=:$dir
  fi
done
export DUFU_CUDA_MODULE=$bundle/lib/libdufu_cuda.so DUFU_TEST_FIXTURE_DIR=$bundle/fixtures
export DUFU_TEST_TRAIN_TOOL=$bundle/bin/train DUFU_TEST_DATAPREP_TOOL=$bundle/bin/dataprep
# Only dufu's programs see the bundle's libraries: Python and PyTorch keep the machine's.
# (A command prefix rather than a function, so that `timeout` can run it.)
dufu=(env "LD_LIBRARY_PATH=$library_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
unresolved=$(for program in "$bundle"/bin/* "$bundle"/lib/*.so*; do
  "${dufu[@]}" ldd "$program" 2>&1 | awk -v p="${program#"$bundle"/}" '/not found/ { print p ": " $1 }'
done | sort -u)
if wants 0; then
  # The CPU side in this root: OpenBLAS, OpenMP and the trainer, one tiny step.
  "${dufu[@]}" "$bundle/bin/train_benchmark" --n-layer 1 --d-model 32 --n-head 2 --vocab 300 --seq 16 --micro-batch 2 \
    --warmup 0 --steps 2 --sgemm-seconds 0.02 >>"$out/machine.log" 2>&1
  cpu_status=$?
  figures="not on this machine: ${missing_machine[*]:-none}; a CPU training step: status $cpu_status"
  [[ -n $unresolved ]] && say "unresolved:"$'\n'"$unresolved"
  if ((cpu_status != 0)); then
    record 0 "FAIL: a CPU training step failed" "$figures, see machine.log"
  elif [[ -z $unresolved ]]; then
    record 0 "ok: every library resolves" "$figures"
  elif [[ -z $(grep -v -e libcuda.so -e libcublas -e libnccl <<<"$unresolved") ]]; then
    record 0 "partial: only GPU libraries missing" "${missing_machine[*]}"
  else
    record 0 "FAIL: bundled programs lack libraries" "$(wc -l <<<"$unresolved") unresolved"
  fi
fi

# GPU present? (gpu_ceilings exits 77 with the reason when there is none.)
gpu_reason=$("${dufu[@]}" "$bundle/bin/gpu_ceilings" --probe 2>&1 >/dev/null)
gpu_status=$?
say "GPU: ${gpu_reason:-present}"
has_gpu() { ((gpu_status == 0)); }
no_gpu_reason=${gpu_reason#gpu_ceilings: skipped: no GPU: }
# run_logged LOG CAP COMMAND...: runs under the step's limit, appending to LOG; status.
run_logged() {
  local log=$1 cap; cap=$(limit "$2"); shift 2
  if ((cap <= 0)); then echo "(not run: out of budget)" >>"$log"; return 124; fi
  echo "\$ $* (limit ${cap}s)" >>"$log"
  timeout -k 5 "$cap" "$@" >>"$log" 2>&1
}
# gtest_result LOG STATUS: "ok: N passed", "skipped: ...", or "FAIL: ...".
gtest_result() {
  local passed skipped failed
  passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) tests\{0,1\}\..*/\1/p' "$1" | tail -n 1)
  skipped=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) tests\{0,1\}[,.].*/\1/p' "$1" | tail -n 1)
  failed=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) tests\{0,1\}[,.].*/\1/p' "$1" | tail -n 1)
  if (($2 == 124 || $2 == 137)); then echo "FAIL: timed out"
  elif (($2 != 0)); then echo "FAIL: status $2${failed:+, $failed failed}"
  elif ! has_gpu; then echo "skipped: no GPU (the program ran, ${skipped:-0} tests skipped)"
  else echo "ok: ${passed:-0} passed${skipped:+, $skipped skipped}"
  fi
}

# --- step 1: versions and ceilings ----------------------------------------------
step_1() {
  log=$out/machine.log
  { uname -a; command -v nvidia-smi >/dev/null && nvidia-smi; ls "${gpu_libraries_dirs[@]}" 2>/dev/null |
      grep -E '^lib(cublas|cublasLt|nccl|cudart)\.so\.[0-9.]+$' | sort -u; } >>"$log" 2>&1
  if has_gpu; then
    run_logged "$log" 60 "${dufu[@]}" "$bundle/bin/gpu_ceilings"
    status=$?
    line=$(grep '^gpu_ceilings ' "$log" | tail -n 1)
    if ((status == 0)) && [[ -n $line ]]; then
      gemm_tflops=$(field bf16_gemm_tflops "$line")
      record 1 "ok: $(sed 's/.*gpu="\([^"]*\)".*/\1/' <<<"$line")" \
        "bf16 GEMM $gemm_tflops TFLOP/s, copy $(field copy_gbps "$line") GB/s"
    else
      record 1 "FAIL: status $status" "see machine.log"
    fi
  else
    record 1 "skipped: no GPU" "$no_gpu_reason"
  fi
}

# --- step 2: kernels against the reference ---------------------------------------
cuda_rows='*/cuda_*'
step_2() {
  log=$out/kernels.log
  run_logged "$log" 90 "${dufu[@]}" "$bundle/bin/kernels_test" --gtest_filter="$cuda_rows:KernelDevices.*:GroupedAttention.*" --gtest_brief=1
  status=$?
  result=$(gtest_result "$log" $status)
  if [[ $result == FAIL* ]] && has_gpu; then
    failing=$(sed -n 's/^\[  FAILED  \] \([^ ,]*\.[^ ,]*\).*/\1/p' "$log" | sort -u | head -n 20 | paste -sd: -)
    echo "=== failing rows again under CUDA_LAUNCH_BLOCKING=1 ===" >>"$log"
    CUDA_LAUNCH_BLOCKING=1 run_logged "$log" 60 "${dufu[@]}" "$bundle/bin/kernels_test" --gtest_filter="${failing:-$cuda_rows}"
  fi
  record 2 "$result" "kernels_test rows $cuda_rows"
}

# --- step 3: compute-sanitizer -------------------------------------------------------
step_3() {
  log=$out/sanitizer.log
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
  if ! has_gpu; then
    record 3 "skipped: no GPU" "$no_gpu_reason"
  elif [[ -z $sanitizer ]]; then
    record 3 "skipped: compute-sanitizer not found" ""
  else
    # racecheck and synccheck are the slow tools: the smallest shape only.
    verdicts=()
    for tool in memcheck racecheck synccheck; do
      local filter='*/cuda_*_tiny'
      [[ $tool == memcheck ]] && filter+=':*/cuda_*_odd'
      run_logged "$log" 60 "${dufu[@]}" "$sanitizer" --tool "$tool" --error-exitcode 3 \
        "$bundle/bin/kernels_test" --gtest_filter="$filter" --gtest_brief=1
      verdicts+=("$tool $?")
    done
    run_logged "$log" 60 "${dufu[@]}" "$sanitizer" --tool memcheck --error-exitcode 3 "$bundle/bin/train_benchmark" \
      --device cuda --precision bf16 --n-layer 2 --d-model 64 --n-head 2 --vocab 500 --seq 64 --micro-batch 2 \
      --warmup 0 --steps 2 --sgemm-seconds 0.05
    verdicts+=("training $?")
    # Status 3: the tool found errors; 124: out of time; else the program failed.
    bad=$(printf '%s\n' "${verdicts[@]}" | awk '$2 == 3 { print $1 " errors" } $2 == 124 || $2 == 137 { print $1 " timed out" }
                                               $2 != 0 && $2 != 3 && $2 != 124 && $2 != 137 { print $1 " status " $2 }' | paste -sd, -)
    record 3 "${bad:+FAIL: $bad}${bad:-ok: no errors}" "$(printf '%s\n' "${verdicts[@]}" | awk '{print $1}' | paste -sd' ' -)"
  fi
}

# --- step 4: the model and the train tool on the GPU --------------------------------
step_4() {
  log=$out/tests.log
  run_logged "$log" 90 "${dufu[@]}" "$bundle/bin/gpu_model_test" --gtest_brief=1
  record 4a "$(gtest_result "$log" $?)" "gpu_model_test"
  : >"$out/.cuda_training.log"
  run_logged "$out/.cuda_training.log" 150 "${dufu[@]}" "$bundle/bin/cuda_training_test" --gtest_brief=1 \
    --gtest_filter='-*LayoutsOverNccl*'
  status=$?
  cat "$out/.cuda_training.log" >>"$log"
  record 4b "$(gtest_result "$out/.cuda_training.log" $status)" "cuda_training_test, one GPU"
  rm -f "$out/.cuda_training.log"
}

# --- step 5: GPT-2 124M on dufu -----------------------------------------------------
gpt2_shape=(--n-layer 12 --d-model 768 --n-head 12 --vocab 50257 --seq 1024)
declare -A dufu_rate
step_5() {
  log=$out/training.log
  if ! has_gpu; then
    record 5 "skipped: no GPU" "$no_gpu_reason"
  else
    # The third field: attention's products (train.attention_products); "bf16" runs the
    # tensor-core attention kernels.
    for config in "bf16 16 fp32" "bf16 16 bf16" "bf16 8 fp32" "bf16 8 bf16" "fp32 16 fp32" "fp32 8 fp32"; do
      read -r precision batch products <<<"$config"
      run_logged "$log" 90 "${dufu[@]}" "$bundle/bin/train_benchmark" --device cuda --precision "$precision" \
        --attention-products "$products" "${gpt2_shape[@]}" --micro-batch "$batch" --warmup 3 --steps 20 \
        --nominal-peak-tflops 989
      status=$?
      line=$(grep '^train_benchmark impl=dufu' "$log" | tail -n 1)
      label="$precision B=$batch$([[ $products == bf16 ]] && echo ", bf16 attention")"
      if ((status == 0)) && [[ $(field precision "$line") == "$precision" && $(field micro_batch "$line") == "$batch" &&
                                 $(field attention_products "$line") == "$products" ]]; then
        [[ $products == fp32 ]] && dufu_rate[$precision-$batch]=$(field tokens_per_s "$line")
        [[ $products == bf16 ]] && dufu_rate[bf16attention-$batch]=$(field tokens_per_s "$line")
        record "5" "ok: $label" "$(field tokens_per_s "$line") tok/s, $(field ms_per_step "$line") ms/step, MFU $(field mfu_nominal "$line") of 989 and $(field mfu "$line") of the GEMM rate, plan $(field plan_gb "$line") GB held $(field held_gb "$line") GB, loss $(field loss_first "$line") -> $(field loss_final "$line")"
      else
        record "5" "FAIL: $label status $status" "see training.log"
      fi
    done
  fi
}

# --- step 6: the PyTorch peer --------------------------------------------------------
step_6() {
  log=$out/peer.log
  if ! has_gpu; then
    record 6 "skipped: no GPU" "$no_gpu_reason"
  elif [[ -z $python ]] || ! "$python" -c 'import torch; assert torch.cuda.is_available()' >>"$log" 2>&1; then
    record 6 "skipped: no python3 with CUDA torch" "see peer.log"
  else
    export TORCHINDUCTOR_CACHE_DIR=${TMPDIR:-/tmp}/dufu-inductor-cache
    for config in "16 compile" "16 eager" "8 eager" "8 compile"; do
      read -r batch mode <<<"$config"
      flags=(--device cuda --precision bf16 --sdpa --threads 8)
      [[ $mode == compile ]] && flags+=(--compile)
      run_logged "$log" 150 "$python" "$bundle/python/benchmarks/reference/torch_train_benchmark.py" "${flags[@]}" \
        "${gpt2_shape[@]}" --micro-batch "$batch" --warmup 3 --steps 20
      status=$?
      line=$(grep '^train_benchmark impl=torch' "$log" | tail -n 1)
      if ((status == 0)) && [[ $(field micro_batch "$line") == "$batch" && $(field compile "$line") == $([[ $mode == compile ]] && echo 1 || echo 0) ]]; then
        torch_rate=$(field tokens_per_s "$line")
        ratio=$(awk -v a="${dufu_rate[bf16-$batch]:-0}" -v b="$torch_rate" 'BEGIN { if (a > 0) printf "%.2f", a / b; else print "n/a" }')
        ratio_bf16_attention=$(awk -v a="${dufu_rate[bf16attention-$batch]:-0}" -v b="$torch_rate" \
          'BEGIN { if (a > 0) printf "%.2f", a / b; else print "n/a" }')
        record 6 "ok: torch bf16 $mode B=$batch" \
          "$torch_rate tok/s; dufu bf16 / this = $ratio ($ratio_bf16_attention with bf16 attention products)"
      else
        record 6 "FAIL: torch $mode B=$batch status $status" "see peer.log"
      fi
    done
  fi
}

# --- step 7: loss parity through HuggingFace -----------------------------------------
step_7() {
  log=$out/parity.log
  work=$(mktemp -d)
  if ! has_gpu; then
    record 7 "skipped: no GPU" "$no_gpu_reason"
  elif [[ -z $python ]] || ! "$python" -c 'import transformers, torch' >>"$log" 2>&1; then
    record 7 "skipped: no python3 with transformers" "see parity.log"
  else
    # The fixture tokenizer has 2000 pieces: GPT-2 124M's body with that vocabulary.
    for precision in fp32 bf16; do
      run_logged "$log" 60 "${dufu[@]}" "$bundle/bin/train_benchmark" --device cuda --precision "$precision" \
        --n-layer 12 --d-model 768 --n-head 12 --vocab 2000 --seq 1024 --micro-batch 4 --warmup 0 --steps 1 \
        --sgemm-seconds 0.1 --save-initial "$work/$precision" &&
        run_logged "$log" 30 "${dufu[@]}" "$bundle/bin/train" export-hf "$work/$precision" "$work/hf-$precision" \
          -m "$bundle/fixtures/fortunes.model" &&
        run_logged "$log" 60 "$python" "$bundle/python/tests/reference/hf_export_check.py" loss \
          --export "$work/hf-$precision" --batch "$work/$precision/first_batch.json" --device cuda
      status=$?
      verdict=$(grep '^loss parity' "$log" | tail -n 1)
      if ((status == 0)); then record 7 "ok: $precision" "${verdict#loss parity }"
      else record 7 "FAIL: $precision status $status" "${verdict:-see parity.log}"; fi
    done
  fi
  rm -rf "$work"
}

# --- step 8 (asked for by name only): where a training step's GPU time goes ---------
# Nsight Compute times every kernel of one bf16 GPT-2 124M step (B=8, T=1024) at the
# card's own clocks, with fp32 and with bf16 attention products; profile.txt gets
# scripts/ncu_summary.py's tables (the step's kernels grouped, every kernel by name);
# the commands' output goes to machine.log, so the step adds one file.
step_8() {
  local log=$out/machine.log ncu products status=0 profiles=()
  ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
  if ! has_gpu; then
    record 8 "skipped: no GPU" "$no_gpu_reason"
    return
  elif [[ -z $ncu || -z $python ]]; then
    record 8 "skipped: ncu or python3 not found" ""
    return
  fi
  for products in fp32 bf16; do
    local csv=${TMPDIR:-/tmp}/dufu-profile-$products.csv
    rm -f "$csv"
    run_logged "$log" 150 "${dufu[@]}" "$ncu" --clock-control none --metrics gpu__time_duration.sum --csv \
      --page raw --log-file "$csv" "$bundle/bin/train_benchmark" --device cuda --precision bf16 \
      --attention-products "$products" "${gpt2_shape[@]}" --micro-batch 8 --warmup 0 --steps 1 --sgemm-seconds 0.001 ||
      status=$?
    [[ -s $csv ]] && profiles+=("bf16 B=8, $products attention products=$csv")
  done
  if ((${#profiles[@]} == 0)) ||
       ! "$python" "$bundle/python/scripts/ncu_summary.py" "${profiles[@]}" >"$out/profile.txt" 2>>"$log"; then
    record 8 "FAIL: no profile summarized (status $status)" "see machine.log"
    return
  fi
  local steps
  steps=$(grep -F 'the training step:' "$out/profile.txt" | sed 's/ of kernel time//' | paste -sd';' -)
  if ((status == 0)); then
    record 8 "ok: kernel time by group" "$steps; see profile.txt"
  else
    record 8 "FAIL: a profiled run exited $status" "$steps; see machine.log"
  fi
}

# The GPU steps, in the order --steps names them (step 0 ran above).
for step in ${steps//,/ }; do
  [[ $step == 0 ]] && continue
  if declare -F "step_$step" >/dev/null; then "step_$step"; else say "run.sh: no step $step"; fi
done

# What comes back from a device call is at most 16 MiB a file: a log that a flood of
# sanitizer reports made larger keeps its first and last 4 MB.
for log in "$out"/*.log; do
  if [[ -f $log ]] && (($(stat -c %s "$log") > 8000000)); then
    { head -c 4000000 "$log"; printf '\n[... cut ...]\n'; tail -c 4000000 "$log"; } >"$log.cut" && mv "$log.cut" "$log"
  fi
done
{
  echo
  echo "dufu GPU check, bundle of $(cat "$bundle/COMMIT"), $(date -u '+%Y-%m-%d %H:%M UTC'), $((SECONDS - started)) s"
  printf '%-4s %-34s %s\n' step result figures
  printf '%s\n' "${rows[@]}"
} | tee -a "$summary"
! grep -q '^.... FAIL' <(printf '%s\n' "${rows[@]}")
