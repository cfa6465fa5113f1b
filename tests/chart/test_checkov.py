"""checkov on the rendered manifests: every finding is a documented, deliberate choice.

checkov pins dependency versions that clash with this project's test tools, so it lives in its own
virtual environment, .build/checkov-venv, created here on first use and reused afterwards.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_helm import CHART_DIR, ROOT, render

pytestmark = pytest.mark.slow  # starts processes

VENV = ROOT / ".build" / "checkov-venv"
CHECKOV = VENV / "bin" / "checkov"
MPS_CONFIG = "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"

# Renders that together switch on every feature with extra rights.
RENDERS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "mps-and-mig": {"config": {"map": {"config": MPS_CONFIG}}, "migStrategy": "single"},
    "cpu-manager": {"compatWithCPUManager": True},
    "metrics": {"metrics": {"enabled": True, "serviceMonitor": {"enabled": True},
                            "usage": {"enabled": True, "dashboard": {"enabled": True}}}},
    "per-node-config": {"config": {"map": {"mps": MPS_CONFIG, "plain": "version: v1\n"}, "default": "plain"}},
    "cdi": {"deviceListStrategy": "cdi-cri", "nvidiaDriverRoot": "/", "cdi": {"featureFlags": ["x"]}},
}

# Findings accepted on purpose: check ID -> components it is accepted for. The reasons are in the
# chart README ("checkov findings"), which must list every ID here.
ACCEPTED: dict[str, set[str]] = {
    "CKV_K8S_8": {"mps-control-daemon", "test"},  # liveness probe
    "CKV_K8S_9": {"test"},  # readiness probe
    "CKV_K8S_11": {"device-plugin", "mps-control-daemon"},  # CPU limits (throttling)
    "CKV_K8S_13": {"mps-control-daemon"},  # memory limit (NVIDIA's MPS processes run in it)
    "CKV_K8S_15": {"device-plugin", "mps-control-daemon", "test"},  # pull policy Always
    "CKV_K8S_43": {"device-plugin", "mps-control-daemon", "test"},  # image digest
    "CKV_K8S_23": {"device-plugin", "mps-control-daemon"},  # runs as root
    "CKV_K8S_40": {"device-plugin", "mps-control-daemon"},  # low UID
    "CKV_K8S_25": {"device-plugin"},  # added capability (SYS_ADMIN for MIG / volume-mounts)
    "CKV_K8S_39": {"device-plugin"},  # SYS_ADMIN
    "CKV_K8S_16": {"device-plugin", "mps-control-daemon"},  # privileged
    "CKV_K8S_17": {"mps-control-daemon", "device-plugin"},  # hostPID (MPS; usage metrics)
    "CKV_K8S_20": {"device-plugin", "mps-control-daemon"},  # privilege escalation (implied by privileged)
    "CKV_K8S_22": {"device-plugin", "mps-control-daemon"},  # writable root filesystem
    "CKV_K8S_28": {"device-plugin", "mps-control-daemon"},  # NET_RAW (implied by privileged)
    "CKV_K8S_37": {"device-plugin", "mps-control-daemon"},  # capabilities (implied by privileged)
    "CKV_K8S_38": {"device-plugin", "mps-control-daemon"},  # SA token: Node events, per-node config
    "CKV_K8S_21": {"device-plugin"},  # the default namespace: the Role for Node Events, which live there
}


def checkov() -> Path:
    if CHECKOV.exists():
        return CHECKOV
    try:
        subprocess.run(
            [sys.executable, "-m", "venv", str(VENV)], check=True, capture_output=True, timeout=120
        )
        subprocess.run(
            [str(VENV / "bin" / "pip"), "install", "--quiet", "checkov"],
            check=True,
            capture_output=True,
            timeout=900,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
        output = getattr(error, "stderr", b"") or b""
        pytest.skip(f"cannot install checkov into {VENV} (is PyPI reachable?): {output.decode()[-300:]}")
    return CHECKOV


def component(resource: str) -> str:
    name = resource.split(".")[2]
    # The MPS daemons of DRA claims (dra-mps) are the MPS daemon's, from the same image.
    for suffix, part in (("-mps-control-daemon", "mps-control-daemon"), ("-dra-mps", "mps-control-daemon"),
                         ("-test-gpu", "test")):
        if name.startswith("nvdp-nvidia-device-plugin" + suffix):
            return part
    return "device-plugin"


@pytest.fixture(scope="module")
def findings(tmp_path_factory: pytest.TempPathFactory) -> set[tuple[str, str]]:
    directory = tmp_path_factory.mktemp("manifests")
    for name, values in RENDERS.items():
        (directory / f"{name}.yaml").write_text(yaml.safe_dump_all(render(values).objects), encoding="utf-8")
    done = subprocess.run(
        [
            str(checkov()),
            "-d",
            str(directory),
            "--framework",
            "kubernetes",
            "--quiet",
            "--compact",
            "--skip-download",
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "BC_SKIP_MAPPING": "TRUE", "CHECKOV_RUN_SCA_PACKAGE_SCAN_V2": "false"},
    )
    report = json.loads(done.stdout)
    reports = report if isinstance(report, list) else [report]
    failed = [check for r in reports for check in r["results"]["failed_checks"]]
    assert reports[0]["summary"]["parsing_errors"] == 0
    return {(check["check_id"], component(check["resource"])) for check in failed}


def test_every_finding_is_accepted_on_purpose(findings: set[tuple[str, str]]) -> None:
    unexplained = sorted(f for f in findings if f[1] not in ACCEPTED.get(f[0], set()))
    assert not unexplained, f"checkov findings not documented in the chart README: {unexplained}"


def test_no_stale_acceptances(findings: set[tuple[str, str]]) -> None:
    accepted = {(check, part) for check, parts in ACCEPTED.items() for part in parts}
    assert sorted(accepted - findings) == []


def test_readme_explains_every_accepted_finding() -> None:
    readme = (CHART_DIR / "README.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `(CKV2?_K8S_\d+)`", readme, flags=re.MULTILINE))
    assert documented == set(ACCEPTED)
