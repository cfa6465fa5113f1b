#!/usr/bin/env bash
# The end-to-end suite (tests/e2e) on a kind cluster, for machines with Docker: builds the images with the
# Dockerfiles plus tests/e2e/Dockerfile.sim, creates the cluster, runs the same scenarios as on the k8s
# kit's node, deletes the cluster (KEEP_CLUSTER=1 keeps it).
#
#   tests/e2e/run.sh                      # all scenarios, stand-in profile t4
#   tests/e2e/run.sh -k mps               # pytest arguments pass through
# Needs: docker, kind, kubectl, helm 3.8+ or 4, and the test tools (scripts/venv.sh test).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
. "$ROOT/scripts/venv.sh" test
cd "$ROOT"
export NVDP_E2E_CLUSTER=kind CLUSTER="${CLUSTER:-nvdp-e2e}" PROFILE="${PROFILE:-t4}"
exec pytest -v tests/e2e "$@"
