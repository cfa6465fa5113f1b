#!/usr/bin/env bash
# The main job on a built-in default: the real plugin process on a simulated Tesla T4 node (stand-in
# NVML), seen through the kubelet simulator. Installs the runtime dependencies only (.venv), builds the
# stand-in NVML with gcc. Extra arguments go to scripts/demo.py:
#   --profile h100-mig-8             another simulated node (sim/profiles)
#   --config my-config.yaml          another config; one in DRA mode (flags.mode: dra) runs the DRA demo
#   --dra                            the DRA demo on the default config (needs the envtest binaries and root)
#   --kube-assets DIR                where the DRA demo finds kube-apiserver, etcd and kubectl
set -euo pipefail
. "$(dirname "$0")/venv.sh" runtime
cd "$ROOT"
exec python scripts/demo.py "$@"
