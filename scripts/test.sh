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
. "$(dirname "$0")/venv.sh" test
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
# The full suite in two pytest processes side by side, with mypy and the import contracts beside them:
# the end-to-end stories, which share the kit's one node and mostly wait on it, and the tests that need
# the host as those stories leave it (NVIDIA's mock NVML: no /dev/nvidia0), in one process; everything
# else in the other. The first's output and the checks' follow the second's; any failure fails the run.
# With pytest arguments (a path, -k ...), or NVDP_TEST_SERIAL=1: one pytest process after the checks.
if [ "$#" -gt 0 ] || [ "${NVDP_TEST_SERIAL:-0}" = 1 ]; then
  echo "== mypy"; mypy
  echo "== lint-imports"; lint-imports --no-cache
  echo "== pytest"; exec pytest -q "$@"
fi
KIT_TESTS=(tests/e2e tests/footprint/test_bench_runs.py)
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
( mypy >"$OUT/mypy" 2>&1; echo $? >"$OUT/mypy.rc" ) &
( lint-imports --no-cache >"$OUT/lint-imports" 2>&1; echo $? >"$OUT/lint-imports.rc" ) &
( pytest -q -p no:cacheprovider "${KIT_TESTS[@]}" >"$OUT/pytest-kit" 2>&1; echo $? >"$OUT/pytest-kit.rc" ) &
ignore=()
for path in "${KIT_TESTS[@]}"; do ignore+=("--ignore=$path"); done
status=0
echo "== pytest: all but ${KIT_TESTS[*]} (those run beside it; their output follows)"
pytest -q "${ignore[@]}" || status=$?
wait
for check in pytest-kit mypy lint-imports; do
  case "$check" in
    pytest-kit) echo "== pytest: ${KIT_TESTS[*]}";;
    *) echo "== $check";;
  esac
  cat "$OUT/$check"
  rc=$(cat "$OUT/$check.rc")
  if [ "$rc" != 0 ]; then
    echo "$check failed (exit $rc)"
    status=1
  fi
done
exit "$status"
