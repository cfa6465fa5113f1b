#!/usr/bin/env bash
# Build the two images (device plugin, MPS control daemon) with whatever the machine has.
#
#   scripts/build-images.sh                       # docker, podman or buildah, the first one found
#   scripts/build-images.sh --push                # then push them
#   REGISTRY=registry.example.com/gpu TAG=dev scripts/build-images.sh --push
#   scripts/build-images.sh --kit ../shared/k8s   # no container engine: the k8s kit (root), see README
#
# Images: $REGISTRY/nvdp-plugin:$TAG and $REGISTRY/nvdp-mps-daemon:$TAG, by default
# ghcr.io/nvdp-project/...:<the chart's appVersion>, exactly where the chart's values point.
# env: REGISTRY, TAG, ENGINE (docker | podman | buildah), PLATFORM (e.g. linux/arm64; engine builds only)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
APP_VERSION="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' charts/nvidia-device-plugin/Chart.yaml)"
REGISTRY="${REGISTRY:-ghcr.io/nvdp-project}"
TAG="${TAG:-$APP_VERSION}"
PUSH=0 KIT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --push) PUSH=1 ;;
    --kit) KIT="${2:?--kit needs the kit directory}"; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "build-images.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

if [ -n "$KIT" ]; then
  . scripts/venv.sh
  exec python scripts/kit_images.py --kit "$KIT" --repository-prefix "$REGISTRY" --tag "$TAG"
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

for image in plugin mps-daemon; do
  ref="$REGISTRY/nvdp-$image:$TAG"
  args=(-f "images/$image/Dockerfile" -t "$ref")
  [ -n "${PLATFORM:-}" ] && args+=(--platform "$PLATFORM")
  echo "== $ENGINE: $ref"
  case "$ENGINE" in
    buildah) buildah build "${args[@]}" . ;;
    *) "$ENGINE" build "${args[@]}" . ;;
  esac
  if [ "$PUSH" = 1 ]; then "$ENGINE" push "$ref"; fi
done
