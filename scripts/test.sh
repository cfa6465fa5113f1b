#!/usr/bin/env bash
# The whole test suite: venv + installs, stand-in NVML build, ruff, mypy, import contracts, pytest.
# --quick: the same checks, and only the tests that start no process, API server or cluster (the
# fast loop while working; tests/conftest.py fails a quick test that starts a process unmarked).
set -euo pipefail
QUICK=0
if [ "${1:-}" = "--quick" ]; then
  QUICK=1
  shift
fi
. "$(dirname "$0")/venv.sh"
cd "$ROOT"
# Tests of the Kubernetes API edge start throwaway kube-apiservers from KUBEBUILDER_ASSETS; the
# kit's idempotent setup.sh provides them (about 20 s when its Debian packages are present).
K8S_KIT="${NVDP_K8S_KIT:-$ROOT/../shared/k8s}"
export K8S_DIR="${K8S_DIR:-/tmp/nvdp-k8s}"
if [ "$QUICK" = 0 ] && [ -z "${KUBEBUILDER_ASSETS:-}" ] && [ ! -x "$K8S_DIR/assets/bin/kube-apiserver" ] \
   && [ "$(id -u)" = 0 ] && [ -x "$K8S_KIT/setup.sh" ]; then
  echo "== kit setup.sh (KUBEBUILDER_ASSETS for the API-server tests)"
  bash "$K8S_KIT/setup.sh" >"${TMPDIR:-/tmp}/nvdp-kit-setup.log" 2>&1 \
    || echo "kit setup failed (see ${TMPDIR:-/tmp}/nvdp-kit-setup.log); API-server tests will skip"
fi
if [ -z "${KUBEBUILDER_ASSETS:-}" ] && [ -x "$K8S_DIR/assets/bin/kube-apiserver" ]; then
  export KUBEBUILDER_ASSETS="$K8S_DIR/assets/bin"
fi
echo "== ruff"; ruff check src tests sim bench scripts
if [ "$QUICK" = 1 ]; then
  echo "== mypy"; mypy
  echo "== lint-imports"; lint-imports --no-cache
  echo "== pytest (quick: not slow)"; NVDP_QUICK=1 exec pytest -q -m "not slow" "$@"
fi
# The full suite: mypy and the import contracts run beside pytest, whose end-to-end stories mostly
# wait on the kit's node; their output follows pytest's, and any failure fails the run.
CHECKS="$(mktemp -d)"
trap 'rm -rf "$CHECKS"' EXIT
( mypy >"$CHECKS/mypy" 2>&1; echo $? >"$CHECKS/mypy.rc" ) &
( lint-imports --no-cache >"$CHECKS/lint-imports" 2>&1; echo $? >"$CHECKS/lint-imports.rc" ) &
# Two workers: the end-to-end stories on one (they share the kit's node), everything else on the
# other meanwhile (tests/conftest.py groups them). NVDP_TEST_WORKERS=0 runs in one process.
WORKERS="${NVDP_TEST_WORKERS:-2}"
status=0
if [ "$WORKERS" = 0 ]; then
  echo "== pytest"; pytest -q "$@" || status=$?
else
  echo "== pytest ($WORKERS workers)"; pytest -q -n "$WORKERS" --dist loadgroup "$@" || status=$?
fi
wait
for check in mypy lint-imports; do
  echo "== $check"; cat "$CHECKS/$check"
  rc=$(cat "$CHECKS/$check.rc")
  if [ "$rc" != 0 ]; then
    echo "$check failed (exit $rc)"
    status=1
  fi
done
exit "$status"
