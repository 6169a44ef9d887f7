#!/usr/bin/env bash
# Creates the Python environments of the reference tests, at pinned versions from
# PyPI, in virtual environments outside the repository that also see Debian's numpy,
# sentencepiece and torch. Idempotent: a finished environment with the same pins is
# left as it is.
#
# The tokenizer references (the default): tiktoken, HuggingFace tokenizers, bpe-openai
# (whose wheel ships the cl100k_base and o200k_base rank files) and openai-whisper's
# source distribution (which ships gpt2.tiktoken). Copies the three rank files out of
# the installed packages into VENV/rank-files/ as plain .tiktoken files.
#
# --transformers: HuggingFace transformers for `train export-hf`'s test, in an
# environment of its own: the newest transformers that runs on Debian's torch 1.13
# (4.47.1; 4.48 requires torch >= 2.0, and 4.52 on disables torch < 2.1 at import)
# checks at import that tokenizers is < 0.22, while the tokenizer references are
# pinned to 0.22.1.
#
# --readers: the index readers of Megatron-core and fairseq for the index layout test
# (tests/reference/index_readers_reference.py). megatron-core's wheel installs with
# --no-deps: its reader needs only Debian's numpy and torch. fairseq 0.12.2 does not
# install here (its C++ extensions do not build against Debian's CPU-only torch), so
# its source distribution is downloaded, checked against its SHA-256, and its Python
# package unpacked into VENV/fairseq-src/fairseq, from which the reference imports
# fairseq's reader modules.
#
# --tensorboard: TensorBoard's event reader (EventAccumulator) for the test of the
# trainer's event files (tests/reference/tensorboard_events_check.py). --no-deps:
# reading event files imports only protobuf (for the Event messages) and absl-py (the
# flags of its TensorFlow stand-in) from PyPI, and Debian's numpy. The server's other
# requirements (grpcio, werkzeug, markdown, the Rust data server) are not needed.
#
# --arrow: the pyarrow wheel, whose C++ libraries (libarrow, libparquet) the build links
# for Parquet and Arrow input and whose Python side writes the Parquet tests' inputs
# (scripts/setup_arrow.sh runs this; CMakeLists.txt's cmake/arrow.cmake expects 22.0.0).
#
# usage: setup_reference_venv.sh [--transformers|--readers|--tensorboard|--arrow] [VENV]   (prints the venv's python on the last line)
# VENV defaults to $DUFU_REFERENCE_VENV, else ${XDG_CACHE_HOME:-~/.cache}/dufu/reference-venv;
# with --transformers to $DUFU_REFERENCE_HF_VENV, else ${XDG_CACHE_HOME:-~/.cache}/dufu/reference-venv-hf;
# with --readers to $DUFU_REFERENCE_READERS_VENV, else ${XDG_CACHE_HOME:-~/.cache}/dufu/reference-venv-readers;
# with --tensorboard to $DUFU_REFERENCE_TB_VENV, else ${XDG_CACHE_HOME:-~/.cache}/dufu/reference-venv-tensorboard;
# with --arrow to $DUFU_ARROW_VENV, else ${XDG_CACHE_HOME:-~/.cache}/dufu/arrow-venv.
set -euo pipefail

cache=${XDG_CACHE_HOME:-$HOME/.cache}/dufu
fairseq_sdist=""
if [[ ${1:-} == --readers ]]; then
  shift
  venv=${1:-${DUFU_REFERENCE_READERS_VENV:-$cache/reference-venv-readers}}
  pins=(megatron-core==0.16.1)
  optional_pins=()
  rank_files=""
  fairseq_sdist=fairseq==0.12.2
  fairseq_sha256=34f1b18426bf3844714534162f065ab733e049597476daa35fffb4d06a92b524
elif [[ ${1:-} == --arrow ]]; then
  shift
  venv=${1:-${DUFU_ARROW_VENV:-$cache/arrow-venv}}
  pins=(pyarrow==22.0.0)
  optional_pins=()
  rank_files=""
elif [[ ${1:-} == --tensorboard ]]; then
  shift
  venv=${1:-${DUFU_REFERENCE_TB_VENV:-$cache/reference-venv-tensorboard}}
  pins=(tensorboard==2.21.0 protobuf==7.36.2 absl-py==2.5.1)
  optional_pins=()
  rank_files=""
elif [[ ${1:-} == --transformers ]]; then
  shift
  venv=${1:-${DUFU_REFERENCE_HF_VENV:-$cache/reference-venv-hf}}
  # --no-deps: exactly these packages (transformers' import-time requirements and
  # huggingface-hub's); torch, numpy, sentencepiece, requests and pyyaml are Debian's.
  pins=(
    transformers==4.47.1
    tokenizers==0.21.4
    safetensors==0.5.3
    huggingface-hub==0.27.1
    regex==2026.11.15
    filelock==3.16.1
    fsspec==2024.10.0
    packaging==24.2
    tqdm==4.67.1
  )
  optional_pins=()
  rank_files=""
else
  venv=${1:-${DUFU_REFERENCE_VENV:-$cache/reference-venv}}
  # --no-deps: exactly these packages; the references import nothing else from PyPI
  # (openai-whisper only ships the data file, it is never imported).
  pins=(
    tiktoken==0.12.0
    regex==2026.11.15
    tokenizers==0.22.1
    bpe-openai==0.1.4
    openai-whisper==20250625
  )
  # The benchmark also measures these when they install; the tests never need them.
  optional_pins=(quicktok-v1==0.4.0)
  rank_files=rank-files-v1
fi
stamp="$venv/.dufu-reference-pins"
wanted="${pins[*]} ${optional_pins[*]} $rank_files${fairseq_sdist:+ $fairseq_sdist-src}"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$wanted" && -x "$venv/bin/python" ]]; then
  echo "$venv/bin/python"
  exit 0
fi

mkdir -p "$(dirname "$venv")"
# One set-up at a time (ctest may start several fixtures at once).
exec 9>"$venv.lock"
flock 9
if [[ -f "$stamp" && "$(cat "$stamp")" == "$wanted" && -x "$venv/bin/python" ]]; then
  echo "$venv/bin/python"
  exit 0
fi

rm -rf "$venv"
# Debian's interpreter (python3-venv), so that --system-site-packages sees
# python3-numpy and python3-sentencepiece.
python=/usr/bin/python3
if ! "$python" -m venv --system-site-packages "$venv" >&2; then
  echo "setup_reference_venv: '$python -m venv' failed; HINT: apt-get install python3-venv" >&2
  exit 1
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps "${pins[@]}" >&2
if ((${#optional_pins[@]} > 0)); then
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps "${optional_pins[@]}" >&2 ||
    echo "setup_reference_venv: ${optional_pins[*]} did not install; the benchmark leaves it out" >&2
fi
if [[ -n $fairseq_sdist ]]; then
  download=$(mktemp -d)
  trap 'rm -rf "$download"' EXIT
  "$venv/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary fairseq \
    -d "$download" "$fairseq_sdist" >&2
  archive=$(echo "$download"/fairseq-*.tar.gz)
  if [[ "$(sha256sum "$archive" | cut -d' ' -f1)" != "$fairseq_sha256" ]]; then
    echo "setup_reference_venv: $archive is not the $fairseq_sdist source distribution (SHA-256 differs)" >&2
    exit 1
  fi
  mkdir -p "$venv/fairseq-src"
  tar -xzf "$archive" -C "$venv/fairseq-src" --strip-components=1 "$(basename "$archive" .tar.gz)/fairseq"
fi
if [[ -z $rank_files ]]; then
  echo "$wanted" > "$stamp"
  echo "$venv/bin/python"
  exit 0
fi

mkdir -p "$venv/rank-files"
"$venv/bin/python" - "$venv/rank-files" <<'EOF' >&2
import gzip
import importlib.util
import os
import shutil
import sys

out = sys.argv[1]


def package_dir(name):
    spec = importlib.util.find_spec(name)
    return list(spec.submodule_search_locations)[0]


bpe_data = os.path.join(package_dir("bpe_openai"), "data")
for stem in ("cl100k_base", "o200k_base"):
    with gzip.open(os.path.join(bpe_data, stem + ".tiktoken.gz"), "rb") as source, \
            open(os.path.join(out, stem + ".tiktoken"), "wb") as target:
        shutil.copyfileobj(source, target)
shutil.copyfile(os.path.join(package_dir("whisper"), "assets", "gpt2.tiktoken"),
                os.path.join(out, "gpt2.tiktoken"))
for name in sorted(os.listdir(out)):
    print("setup_reference_venv:", os.path.join(out, name), os.path.getsize(os.path.join(out, name)), "bytes")
EOF
echo "$wanted" > "$stamp"
echo "$venv/bin/python"
