#!/usr/bin/env bash
# Installs every Debian package dufu needs to build, test, benchmark and run the
# quickstart. Idempotent: packages already present are not downloaded again.
set -euo pipefail

packages=(
  # build
  build-essential cmake ninja-build pkg-config
  libsentencepiece-dev libsimdjson-dev libzstd-dev zlib1g-dev libboost-dev libssl-dev
  libcli11-dev libtomlplusplus-dev libgtest-dev libopenblas-dev libopenmpi-dev openmpi-bin
  libpcre2-dev libicu-dev
  # tests: independent references (sentencepiece's own encoder, numpy, PyTorch)
  sentencepiece python3 python3-numpy python3-sentencepiece python3-torch zstd gzip
  # fuzzing (scripts/fuzz.sh): clang with libFuzzer and its sanitizer runtimes, and
  # clang's OpenMP for the trainer library
  clang-14 libclang-rt-14-dev libomp-14-dev
  # quickstart and benchmarks: real text corpora and plots
  fortunes linux-source-6.1 xz-utils gnuplot-nox time
  # tokenizer tests: the reference venv (scripts/setup_reference_venv.sh) and
  # translated manual pages (Cyrillic, CJK and accented Latin text)
  python3-venv manpages-de manpages-ru manpages-ja manpages-zh
  # the Python package (python/) and its pytest suite
  pybind11-dev python3-pytest
)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#packages[@]} packages already installed"
  exit 0
fi

sudo=()
if [[ $(id -u) -ne 0 ]]; then sudo=(sudo); fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -q
"${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
