"""`helm lint --strict` and the chart's metadata."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import helm_python
import pytest
from chart_helm import CHART_DIR, NAMESPACE, ROOT, chart, ci_values_files, render, values_file

# helm lint reports this as info even with --strict; the project has no icon yet.
IGNORED_INFO = {"icon is recommended"}


def lint_messages(values: dict[str, Any] | None = None) -> list[str]:
    report = helm_python.lint(
        str(CHART_DIR), values, strict=True, namespace=NAMESPACE, kube_version="v1.25.0"
    )
    messages = [f"{m['path']}: {m['error']}" for m in report["messages"] if m["error"] not in IGNORED_INFO]
    return messages + list(report["errors"])


def test_lint_strict_clean_with_defaults() -> None:
    assert lint_messages() == []


@pytest.mark.parametrize("path", ci_values_files(), ids=lambda p: p.name)
def test_lint_strict_clean_with_ci_values(path: Path) -> None:
    assert lint_messages(values_file(path)) == []


def test_chart_metadata() -> None:
    metadata = chart().metadata
    # tomllib needs Python 3.11; the project supports 3.10.
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    version = re.search(r'^version = "([^"]+)"', pyproject, flags=re.MULTILINE)
    assert version is not None
    assert metadata["apiVersion"] == "v2"
    assert metadata["name"] == "nvidia-device-plugin"
    assert metadata["version"] == "0.1.0"
    assert metadata["appVersion"] == version.group(1)
    assert metadata["kubeVersion"] == ">=1.25.0-0"


def test_ci_files_cover_the_documented_scenarios() -> None:
    assert [p.name for p in ci_values_files()] == [
        "affinity-tolerations-values.yaml",
        "default-values.yaml",
        "metrics-values.yaml",
        "mig-mixed-values.yaml",
        "mps-values.yaml",
        "per-node-config-values.yaml",
        "time-slicing-values.yaml",
    ]


def test_network_policy_denies_all_for_release_pods() -> None:
    policy = render({}).one("NetworkPolicy", "nvdp-nvidia-device-plugin-deny-all")
    assert policy["spec"] == {
        "podSelector": {
            "matchLabels": {
                "app.kubernetes.io/name": "nvidia-device-plugin",
                "app.kubernetes.io/instance": "nvdp",
            }
        },
        "policyTypes": ["Ingress", "Egress"],
    }
    assert render({"networkPolicy": {"enabled": False}}).find("NetworkPolicy") == []
