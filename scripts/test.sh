#!/usr/bin/env bash
# The whole test suite: venv + installs, stand-in NVML build, ruff, mypy, pytest.
set -euo pipefail
. "$(dirname "$0")/venv.sh"
cd "$ROOT"
echo "== ruff"; ruff check src tests sim bench scripts
echo "== mypy"; mypy
echo "== pytest"; exec pytest -q "$@"
