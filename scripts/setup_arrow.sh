#!/usr/bin/env bash
# Installs Apache Arrow's C++ libraries for Parquet and Arrow IPC input (issue 41) from
# the one place Debian 12 users can get them: PyPI's pyarrow wheel, which ships
# libarrow, libparquet and their headers (Debian 12 packages neither). The wheel goes
# into a virtual environment of its own, at a pinned version; the build links the
# libraries inside it (CMake's DUFU_ARROW_PYTHON) and the Parquet tests write their
# inputs with the same pyarrow. Idempotent: a finished environment with the same pin is
# left as it is. Prints the environment's python on the last line.
#
# usage: setup_arrow.sh [VENV]
# VENV defaults to $DUFU_ARROW_VENV, else ${XDG_CACHE_HOME:-~/.cache}/dufu/arrow-venv.
set -euo pipefail

venv=${1:-${DUFU_ARROW_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dufu/arrow-venv}}
# The version CMakeLists.txt's DUFU_ARROW_VERSION expects: its libraries are
# libarrow.so.2200 and libparquet.so.2200.
pin=pyarrow==22.0.0
stamp="$venv/.dufu-arrow-pin"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$pin" && -x "$venv/bin/python" ]]; then
  echo "$venv/bin/python"
  exit 0
fi
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
if [[ -f "$stamp" && "$(cat "$stamp")" == "$pin" && -x "$venv/bin/python" ]]; then
  echo "$venv/bin/python"
  exit 0
fi
rm -rf "$venv"
# Debian's interpreter (python3-venv); nothing of the system's site-packages is needed.
python=/usr/bin/python3
if ! "$python" -m venv "$venv" >&2; then
  echo "setup_arrow: '$python -m venv' failed; HINT: apt-get install python3-venv" >&2
  exit 1
fi
# --only-binary: the wheel's prebuilt libraries are the point; never build from source.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --only-binary :all: "$pin" >&2
echo "$pin" > "$stamp"
echo "$venv/bin/python"
