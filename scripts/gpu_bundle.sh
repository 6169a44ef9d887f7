#!/usr/bin/env bash
# Builds the GPU bundle: everything the GPU check (scripts/gpu_runner.sh, the bundle's
# run.sh) needs on a lent GPU machine, which is not Debian and has none of our apt
# packages, in one compressed file to carry there.
#
#   scripts/gpu_bundle.sh [--verify] [--no-build] [--check-here] [BUILD_DIR]
#
# Builds what it carries in BUILD_DIR (default build-gpu), Release with the CUDA device
# for sm_80 and sm_90, then stages into BUILD_DIR/bundle/dufu-gpu/:
#   bin/       train, dataprep, gpu_ceilings, train_benchmark and the GPU test programs
#   lib/       libdufu_cuda.so and every shared library these load (ldd), except glibc,
#              the CUDA driver, cuBLAS/cuBLASLt and NCCL, which the machine provides
#              (MACHINE_LIBRARIES lists them; run.sh finds them there)
#   fixtures/  the tokenizer fixture the training tests read (fortunes.jsonl, .model)
#   python/    the PyTorch peer, the reference scripts and the profile summary, at their
#              repository paths
#   run.sh     the runner; COMMIT: the commit built (and whether the tree was dirty)
# and writes gpu-bundle/dufu-gpu.tar.xz (git-ignored; at most 40 MiB). On the device,
# scripts/gpu_check.sh unpacks it and runs run.sh (carry gpu-bundle with the call).
# --verify then unpacks the bundle into a minimal Debian root made with debootstrap
# (none of our packages; cached in BUILD_DIR/verify-root) and runs run.sh there: every
# program must resolve every library it needs but the machine's GPU libraries, a CPU
# training step must run, and the GPU steps must report "skipped: no GPU".
# --no-build uses BUILD_DIR as it is (built with -DDUFU_CUDA=ON and the tests).
# --check-here stages the bundle (no archive) and runs its run.sh on this machine with
# the same expectations as --verify: the test suite's gpu_runner_without_gpu.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
verify=0
check_here=0
build_first=1
build=$root/build-gpu
while (($#)); do
  case $1 in
    --verify) verify=1 ;;
    --no-build) build_first=0 ;;
    --check-here) check_here=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "gpu_bundle.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) build=$(realpath -m "$1") ;;
  esac
  shift
done
fail() { echo "gpu_bundle.sh: $*" >&2; exit 1; }
max_bytes=$((40 * 1024 * 1024))
programs=(tools/train/train tools/dataprep/dataprep benchmarks/gpu_ceilings benchmarks/train_benchmark
          tests/trainer/kernels_test tests/trainer/gpu_model_test tests/trainer/cuda_training_test)
# Sonames the GPU machine provides (glibc's are never carried either).
machine_library='^(libcuda\.so|libcublas\.so|libcublasLt\.so|libnccl\.so)'
glibc_library='^(linux-vdso|ld-linux-x86-64|libc|libm|libpthread|libdl|librt|libresolv|libutil)\.so'

if ((build_first)); then
  "$root/scripts/setup.sh"
  # Only what the bundle carries (and dataprep, which makes the tokenizer fixture): on
  # 2 cores that is about a third of the whole build, minutes a lent GPU would wait.
  # No Parquet input: Arrow's libraries (66 MB) would pass the bundle's 64 MiB carry.
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDUFU_WERROR=ON -DDUFU_CUDA=ON \
    -DDUFU_CUDA_ARCHITECTURES="80;90" -DDUFU_BUILD_TESTS=ON -DDUFU_BUILD_BENCHMARKS=ON -DDUFU_PARQUET=OFF
  cmake --build "$build" --parallel "$(nproc)" --target dufu_cuda dataprep \
    $(for program in "${programs[@]}"; do basename "$program"; done)
fi
[[ -f $build/trainer/libdufu_cuda.so ]] ||
  fail "$build has no trainer/libdufu_cuda.so. HINT: build it with -DDUFU_CUDA=ON (or drop --no-build)"
for program in "${programs[@]}"; do [[ -x $build/$program ]] || fail "$build/$program missing"; done
# The tokenizer fixture, made by its ctest fixture (a few seconds).
if [[ ! -f $build/test-fixtures/fortunes.model ]]; then
  ctest --test-dir "$build" -R '^fixture_tokenizer$' --output-on-failure >/dev/null ||
    fail "the tokenizer fixture failed (ctest --test-dir $build -R fixture_tokenizer)"
fi

# check_summary FILE STATUS WHERE: what a machine without a GPU must show.
check_summary() {
  if grep -q '^GPU: present' "$1"; then
    (($2 == 0)) || fail "$3: run.sh exited $2 on a machine with a GPU ($1)"
    return
  fi
  grep -q '^0    ok: every library resolves\|^0    partial: only GPU libraries missing' "$1" ||
    fail "$3: a bundled program lacks a library or a CPU step failed (see $1)"
  for step in 1 2 3 4a 4b 5 6 7; do
    grep -q "^$(printf '%-4s' "$step") skipped" "$1" || fail "$3: step $step did not report skipped ($1)"
  done
  (($2 == 0)) || fail "$3: run.sh exited $2 ($1)"
}

stage=$build/bundle/dufu-gpu
rm -rf "$build/bundle"
mkdir -p "$stage/bin" "$stage/lib" "$stage/fixtures" "$stage/python"
for program in "${programs[@]}"; do cp "$build/$program" "$stage/bin/"; done
cp "$build/trainer/libdufu_cuda.so" "$stage/lib/"
cp "$build/test-fixtures/fortunes.jsonl" "$build/test-fixtures/fortunes.model" "$stage/fixtures/"
for script in benchmarks/reference/torch_train_benchmark.py tests/reference/gpt_torch_reference.py \
              tests/reference/hf_export_check.py scripts/ncu_summary.py; do
  mkdir -p "$stage/python/$(dirname "$script")"
  cp "$root/$script" "$stage/python/$script"
done
cp "$root/scripts/gpu_runner.sh" "$stage/run.sh"

# Every library the programs and the module load, by soname, from ldd's resolution here.
declare -A machine=()
while read -r soname path; do
  if [[ $soname =~ $machine_library ]]; then
    machine[$soname]=1
  elif [[ ! $soname =~ $glibc_library ]]; then
    [[ -n $path && -f $path ]] || fail "ldd cannot resolve $soname here"
    cp -L "$path" "$stage/lib/$soname"
  fi
done < <(for file in "$stage"/bin/* "$stage/lib/libdufu_cuda.so"; do
           ldd "$file" | awk '$2 == "=>" { print $1, $3 } $2 != "=>" && $1 !~ /^\// { print $1, "" }'
         done | sort -u)
# Loaded with dlopen, so not in ldd's list: the driver (by the CUDA runtime) and NCCL
# (only by groups that span GPUs).
machine[libcuda.so.1]=1
machine[libnccl.so.2]=1
printf '%s\n' "${!machine[@]}" | sort >"$stage/MACHINE_LIBRARIES"
strip --strip-unneeded "$stage"/bin/* "$stage"/lib/*.so* 2>/dev/null || true
commit=$(git -C "$root" rev-parse HEAD)
git -C "$root" diff --quiet HEAD || commit+=" (with uncommitted changes)"
echo "$commit" >"$stage/COMMIT"

if ((check_here)); then
  status=0
  OUT=$build/bundle/out "$stage/run.sh" || status=$?
  check_summary "$build/bundle/out/summary.txt" "$status" "check here"
  echo "gpu_bundle.sh: the staged runner ran here: libraries resolve, a CPU step trains, GPU steps skipped"
  exit 0
fi

mkdir -p "$root/gpu-bundle"
archive=$root/gpu-bundle/dufu-gpu.tar.xz
tar -C "$build/bundle" -cf - dufu-gpu | xz -T0 -9 >"$archive.tmp"
mv "$archive.tmp" "$archive"
bytes=$(stat -c %s "$archive")
echo "gpu_bundle.sh: $archive: $((bytes / 1024)) KiB from $(du -sh "$stage" | cut -f1) staged, commit $commit"
echo "gpu_bundle.sh: carried from the machine: $(paste -sd' ' "$stage/MACHINE_LIBRARIES")"
((bytes <= max_bytes)) || fail "the bundle is $((bytes / 1024 / 1024)) MiB, over the 40 MiB a device call can carry"

if ((verify)); then
  verify_root=$build/verify-root
  if [[ ! -x $verify_root/bin/bash ]]; then
    command -v debootstrap >/dev/null || fail "debootstrap not found. HINT: apt-get install debootstrap"
    rm -rf "$verify_root.partial"
    debootstrap --variant=minbase bookworm "$verify_root.partial" >"$build/debootstrap.log" 2>&1 ||
      fail "debootstrap failed; see $build/debootstrap.log"
    mv "$verify_root.partial" "$verify_root"
  fi
  rm -rf "$verify_root/opt/dufu-gpu" "$verify_root/opt/out"
  tar -xJf "$archive" -C "$verify_root/opt"
  mkdir -p "$verify_root/opt/out"
  mountpoint -q "$verify_root/proc" || mount -t proc proc "$verify_root/proc"
  trap 'umount "$verify_root/proc" 2>/dev/null || true' EXIT
  status=0
  chroot "$verify_root" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/root OUT=/opt/out /opt/dufu-gpu/run.sh || status=$?
  check_summary "$verify_root/opt/out/summary.txt" "$status" verify
  echo "gpu_bundle.sh: verified in a bare Debian root: libraries resolve, a CPU step trains, GPU steps skipped"
fi
