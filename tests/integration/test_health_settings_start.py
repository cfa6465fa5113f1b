"""A bad health-recovery setting stops the plugin at start (exit 1) with the loader's message, as any
invalid setting does (test_plugin_process.py: test_invalid_config_at_start_exits_1); the DRA plugin too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import MakeBarePlugin, clean_env

pytestmark = pytest.mark.slow

FORMS = (
    "expected never, or a duration greater than zero such as 30s, 5m, 1h30m or 500ms; "
    "every number needs its unit (ns, us, µs, ms, s, m or h): 5m, not 5"
)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("-1s", f"is not valid (got '-1s'); {FORMS}"),
        ("abc", f"is not valid (got 'abc'); {FORMS}"),
        ("0", f"is not valid (got '0'); {FORMS}"),
        ("0s", f"must not be a duration of zero (got '0s'); {FORMS}"),
    ],
)
def test_bad_recovery_delay_in_the_environment_exits_1(
    make_bare_plugin: MakeBarePlugin, value: str, problem: str
) -> None:
    plugin = make_bare_plugin(HEALTH_RECOVERY_AFTER=value)
    plugin.start()
    assert plugin.wait() == 1
    assert (
        "invalid configuration (1 problem):\n"
        f"  HEALTH_RECOVERY_AFTER: flags.plugin.healthRecoveryAfter: {problem}\n"
    ) in plugin.log
    assert plugin.sockets() == []
    assert "Traceback" not in plugin.log


def test_bad_recovery_delay_flag_exits_1(make_bare_plugin: MakeBarePlugin) -> None:
    plugin = make_bare_plugin()
    plugin.start("--health-recovery-after=5")
    assert plugin.wait() == 1
    assert f"  --health-recovery-after: flags.plugin.healthRecoveryAfter: is not valid (got '5'); {FORMS}" \
        in plugin.log  # fmt: skip
    assert "Traceback" not in plugin.log


def test_bad_flap_limit_exits_1(make_bare_plugin: MakeBarePlugin) -> None:
    plugin = make_bare_plugin(HEALTH_FLAP_LIMIT="0")
    plugin.start()
    assert plugin.wait() == 1
    assert "  HEALTH_FLAP_LIMIT: flags.plugin.healthFlapLimit: must be at least 1 (got 0); " \
           "expected an integer >= 1" in plugin.log  # fmt: skip


def test_dra_plugin_refuses_a_bad_recovery_delay_at_start(tmp_path: Path) -> None:
    env = {
        **clean_env(),
        "HEALTH_RECOVERY_AFTER": "-1s",
        "NODE_NAME": "node-1",
        "KUBELET_PLUGINS_DIR": str(tmp_path / "plugins"),
        "KUBELET_REGISTRAR_DIR": str(tmp_path / "registry"),
        "CDI_ROOT": str(tmp_path / "cdi"),
        "KUBECONFIG": str(tmp_path / "no-kubeconfig"),
    }
    done = subprocess.run([sys.executable, "-m", "nvdp.dra.main"], env=env, capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert f"  HEALTH_RECOVERY_AFTER: flags.plugin.healthRecoveryAfter: is not valid (got '-1s'); {FORMS}" \
        in done.stderr  # fmt: skip
    assert "Traceback" not in done.stderr
