#!/usr/bin/env bash
# The main job on a built-in default: the real plugin process on a simulated Tesla T4 node
# (stand-in NVML), seen through the kubelet simulator. Extra arguments go to scripts/demo.py
# (--profile a100-sxm-8, --config my-config.yaml).
set -euo pipefail
. "$(dirname "$0")/venv.sh"
cd "$ROOT"
exec python scripts/demo.py "$@"
