#!/usr/bin/env bash
# The README's test command: installs everything needed (idempotent), lints, runs the test suite.
#   bash run_scripts/run_tests.sh                 # everything, as CI runs it
#   bash run_scripts/run_tests.sh -m "not slow"   # extra arguments go to pytest
#   bash run_scripts/run_tests.sh -m extended     # the extended variants (left out by default)
# Without a -m of its own, the run leaves out the `extended` and `containers` groups
# (pyproject.toml's markers; -m containers builds the CPU image with podman and trains in it).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
bash run_scripts/install.sh
venv="${HVDTRACK_VENV:-$repo/.venv}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TF_CPP_MIN_LOG_LEVEL=2
echo "[tests] ruff check"
"$venv/bin/ruff" check hvdtrack tests
"$venv/bin/ruff" format --check hvdtrack tests
echo "[tests] pytest"
set +e
select=(-m "not extended and not containers")
for arg in "$@"; do
    case "$arg" in -m | -m*) select=() ;; esac
done
"$venv/bin/python" -m pytest -p no:cacheprovider "${select[@]}" "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
    echo "[tests] pytest collected no tests: that is a failure here" >&2
    exit 1
fi
exit "$status"
