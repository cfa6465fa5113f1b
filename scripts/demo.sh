#!/usr/bin/env bash
set -euo pipefail
. "$(dirname "$0")/venv.sh"
cd "$ROOT"
exec nvdp config show
