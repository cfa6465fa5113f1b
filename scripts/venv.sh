# Sourced by scripts/*.sh with what they need: create .venv and install the project into it.
#
#   . scripts/venv.sh runtime   # the runtime dependencies only (the demo)
#   . scripts/venv.sh test      # and the test suite's tools, the `test` extra (scripts/test.sh, CI)
#
# It installs again when pyproject.toml changed since the last install of that set. A venv with the test
# tools serves `runtime` as it is; a runtime-only venv gets the test tools added on the first `test`.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"
case "${1:-}" in
  runtime) extras="" ;;
  test) extras="test" ;;
  *) echo "venv.sh: say what to install: '. scripts/venv.sh runtime' or '. scripts/venv.sh test'" >&2
     return 2 2>/dev/null || exit 2 ;;
esac
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
digest=$(sha256sum "$ROOT/pyproject.toml" | cut -c1-16)
# One stamp per set installed from this pyproject.toml: .installed-<digest> (runtime), -test (both).
stamp="$VENV/.installed-$digest${extras:+-$extras}"
if [ ! -f "$stamp" ] && ! { [ -z "$extras" ] && [ -f "$VENV/.installed-$digest-test" ]; }; then
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  "$VENV/bin/python" -m pip install --quiet -e "$ROOT${extras:+[$extras]}"
  find "$VENV" -maxdepth 1 -name '.installed-*' ! -name ".installed-$digest*" -delete
  touch "$stamp"
fi
unset digest stamp extras
export PATH="$VENV/bin:$PATH"
