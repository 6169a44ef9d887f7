#!/usr/bin/env bash
# Installs Apache Arrow's C++ libraries for Parquet and Arrow IPC input (issue 41) from
# the one place Debian 12 users can get them: PyPI's pyarrow wheel (pinned, 22.0.0),
# which ships libarrow, libparquet and their headers (Debian 12 packages neither), into
# a virtual environment of its own. The build links the libraries inside it (CMake's
# DUFU_ARROW_PYTHON; scripts/build.sh passes it) and the Parquet tests write their
# inputs with the same pyarrow. Idempotent. Prints the environment's python on the
# last line.
#
# usage: setup_arrow.sh [VENV]
# VENV defaults to $DUFU_ARROW_VENV, else ${XDG_CACHE_HOME:-~/.cache}/dufu/arrow-venv.
exec "$(dirname "$0")/setup_reference_venv.sh" --arrow "$@"
