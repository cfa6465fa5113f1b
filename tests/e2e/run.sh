#!/usr/bin/env bash
# End-to-end check on a kind cluster (needs Docker, kind, kubectl, helm): build the images, load them,
# install the chart with the stand-in NVML and wait until the node advertises the profile's GPUs.
#
#   tests/e2e/run.sh                 # profile t4 (1 GPU), plain install
#   PROFILE=a100-sxm-8 tests/e2e/run.sh
#   KEEP_CLUSTER=1 tests/e2e/run.sh  # leave the cluster for inspection
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
CLUSTER="${CLUSTER:-nvdp-e2e}"
PROFILE="${PROFILE:-t4}"
NAMESPACE=nvidia-device-plugin
RELEASE=nvdp
TIMEOUT_S="${TIMEOUT_S:-180}"
cd "$ROOT"

cleanup() {
  if [[ -z "${KEEP_CLUSTER:-}" ]]; then kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

echo "== images"
docker build -q -f images/plugin/Dockerfile -t nvdp-plugin:e2e .
docker build -q -f images/mps-daemon/Dockerfile -t nvdp-mps-daemon:e2e .
docker build -q -f tests/e2e/Dockerfile.plugin-sim --build-arg PROFILE="$PROFILE" \
  --build-arg BASE_IMAGE=nvdp-plugin:e2e -t nvdp-plugin-sim:e2e .

echo "== cluster"
kind get clusters | grep -qx "$CLUSTER" || kind create cluster --name "$CLUSTER" --wait 120s
kind load docker-image --name "$CLUSTER" nvdp-plugin-sim:e2e nvdp-mps-daemon:e2e
NODE="$(kubectl get nodes -o jsonpath='{.items[0].metadata.name}')"
# No NFD or GFD here: mark the node the way the chart's default affinity accepts.
kubectl label node "$NODE" nvidia.com/gpu.present=true --overwrite

echo "== install"
helm upgrade --install "$RELEASE" charts/nvidia-device-plugin \
  --namespace "$NAMESPACE" --create-namespace \
  --set image.repository=nvdp-plugin-sim --set image.tag=e2e --set image.pullPolicy=Never \
  --set mpsImage.repository=nvdp-mps-daemon --set mpsImage.tag=e2e \
  --wait --timeout "${TIMEOUT_S}s"

echo "== allocatable"
expected="$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["gpus"]))' \
  <(docker run --rm --entrypoint cat nvdp-plugin-sim:e2e /opt/nvml-sim/profile.json))"
deadline=$((SECONDS + TIMEOUT_S))
while :; do
  got="$(kubectl get node "$NODE" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}')"
  [[ "$got" == "$expected" ]] && break
  if (( SECONDS > deadline )); then
    echo "node $NODE advertises nvidia.com/gpu=${got:-none}, expected $expected" >&2
    kubectl -n "$NAMESPACE" logs -l app.kubernetes.io/instance="$RELEASE" --tail=100 >&2 || true
    exit 1
  fi
  sleep 2
done
kubectl get nodes -o custom-columns=NAME:.metadata.name,GPU:.status.allocatable.nvidia\\.com/gpu
echo "ok: $NODE advertises $expected nvidia.com/gpu"
