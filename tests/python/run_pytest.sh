#!/usr/bin/env bash
# ctest runner of one pytest file of the Python package: skips (exit 77, with the
# reason) when the module was not built (no Python development files or pybind11 at
# configure time, or a sanitizer build) or pytest is missing.
# usage: run_pytest.sh PYTHON PACKAGE_DIR TEST_FILE [pytest args...]
set -euo pipefail
python=$1 package_dir=$2 test_file=$3
shift 3
if ! compgen -G "$package_dir/dufu/_dufu*.so" >/dev/null; then
  echo "skipped: the Python module is not built in $package_dir/dufu (configure with Python 3 development" \
       "files, numpy and pybind11: apt-get install python3-dev python3-numpy pybind11-dev)"
  exit 77
fi
if ! "$python" -c "import pytest" 2>/dev/null; then
  echo "skipped: $python has no pytest (apt-get install python3-pytest)"
  exit 77
fi
export PYTHONPATH="$package_dir${PYTHONPATH:+:$PYTHONPATH}"
exec "$python" -m pytest -q -p no:cacheprovider "$test_file" "$@"
