#!/usr/bin/env bash
# Build the two images (device plugin, MPS control daemon) with whatever the machine has.
#
#   scripts/build-images.sh                       # docker, podman or buildah, the first one found
#   scripts/build-images.sh --push                # then push them
#   REGISTRY=registry.example.com/gpu TAG=dev scripts/build-images.sh --push
#   scripts/build-images.sh --kit ../shared/k8s   # no container engine: the k8s kit (root), see README
#   scripts/build-images.sh --stand-ins           # UNSUPPORTED images for clusters without GPUs (kind)
#
# Images: $REGISTRY/nvdp-plugin:$TAG and $REGISTRY/nvdp-mps-daemon:$TAG, by default
# ghcr.io/nvdp-project/...:<the chart's appVersion>, exactly where the chart's values point.
# --stand-ins: also $REGISTRY/nvdp-plugin-sim:$TAG and $REGISTRY/nvdp-mps-daemon-sim:$TAG, the same images
# plus a simulated NVML with every node profile of sim/profiles, a stand-in nvidia-cuda-mps-control and
# nvidia-smi (tests/e2e/Dockerfile.sim): what the chart runs with unsupported.simulatedGpus=<profile>,
# which picks the profile (docs/kind.md). --push needs REGISTRY: never to the project's.
# env: REGISTRY, TAG, ENGINE (docker | podman | buildah), PLATFORM (e.g. linux/arm64; engine builds only)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
APP_VERSION="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' charts/nvidia-device-plugin/Chart.yaml)"
OWN_REGISTRY="${REGISTRY:-}"
REGISTRY="${REGISTRY:-ghcr.io/nvdp-project}"
TAG="${TAG:-$APP_VERSION}"
PUSH=0 KIT="" STAND_INS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --push) PUSH=1 ;;
    --kit) KIT="${2:?--kit needs the kit directory}"; shift ;;
    --stand-ins) STAND_INS=1 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *)
      if [ -f "sim/profiles/$1.yaml" ]; then
        echo "build-images.sh: $1: --stand-ins takes no profile, its images carry every one; choose it at" \
             "install: --set unsupported.simulatedGpus=$1" >&2
      else
        echo "build-images.sh: unknown argument $1 (see --help)" >&2
      fi
      exit 2 ;;
  esac
  shift
done
if [ -n "$STAND_INS" ] && [ "$PUSH" = 1 ] && [ -z "$OWN_REGISTRY" ]; then
  echo "build-images.sh: --stand-ins images are never pushed to the project's registry ($REGISTRY); set" \
       "REGISTRY to your own to share them with a test cluster" >&2
  exit 2
fi

if [ -n "$KIT" ]; then
  # The test set: scripts/kit_images.py builds the wheel without build isolation, with the venv's
  # setuptools, which only the test set brings new enough (a fresh venv's is ensurepip's).
  . scripts/venv.sh test
  exec python scripts/kit_images.py --kit "$KIT" --repository-prefix "$REGISTRY" --tag "$TAG" \
    ${STAND_INS:+--stand-ins}
fi

ENGINE="${ENGINE:-}"
if [ -z "$ENGINE" ]; then
  # The first engine that answers: a docker CLI without a running daemon does not count.
  for candidate in docker podman buildah; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" info >/dev/null 2>&1; then
      ENGINE=$candidate; break
    fi
  done
fi
if [ -z "$ENGINE" ]; then
  echo "build-images.sh: no working docker, podman or buildah (a docker CLI needs its daemon running);" \
       "install one, or build without an engine through the k8s kit:" \
       "scripts/build-images.sh --kit <kit directory>" >&2
  exit 1
fi

build() {
  echo "== $ENGINE: $1"
  local args=(-t "$1" "${@:2}")
  [ -n "${PLATFORM:-}" ] && args+=(--platform "$PLATFORM")
  case "$ENGINE" in
    buildah) buildah build "${args[@]}" . ;;
    *) "$ENGINE" build "${args[@]}" . ;;
  esac
  if [ "$PUSH" = 1 ]; then "$ENGINE" push "$1"; fi
}
for image in plugin mps-daemon; do
  ref="$REGISTRY/nvdp-$image:$TAG"
  build "$ref" -f "images/$image/Dockerfile"
  if [ -n "$STAND_INS" ]; then
    build "$REGISTRY/nvdp-$image-sim:$TAG" -f tests/e2e/Dockerfile.sim --build-arg "BASE_IMAGE=$ref"
  fi
done
