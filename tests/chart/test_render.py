"""Render the ci/ values files and a matrix of options; every object must be valid Kubernetes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from chart_helm import Manifest, Rendered, ci_values_files, render, values_file

# Chart.yaml promises >=1.25; kubernetes-validate carries schemas up to 1.37.
ALL_VERSIONS = [f"1.{minor}.0" for minor in range(25, 38)]
EDGE_VERSIONS = [ALL_VERSIONS[0], ALL_VERSIONS[-1]]


def assert_valid(objects: list[Manifest], versions: list[str]) -> None:
    problems = []
    for obj in objects:
        for version in versions:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                where = "/".join(str(p) for p in error.path)
                problems.append(
                    f"{obj['kind']}/{obj['metadata']['name']} on {version}: {where}: {error.message}"
                )
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", ci_values_files(), ids=lambda p: p.name)
def test_ci_values_render_to_valid_objects(path: Path) -> None:
    rendered = render(values_file(path))
    assert rendered.find("DaemonSet"), "no DaemonSet rendered"
    assert_valid(rendered.objects, ALL_VERSIONS)


MPS_CONFIG = "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"

MATRIX: dict[str, dict[str, Any]] = {
    "compat-cpu-manager": {"compatWithCPUManager": True},
    "mig-single": {"migStrategy": "single"},
    "volume-mounts-string": {"deviceListStrategy": "envvar,volume-mounts"},
    "cdi-cri": {
        "deviceListStrategy": ["cdi-cri"],
        "cdi": {"nvidiaHookPath": "/usr/local/bin/nvidia-cdi-hook", "featureFlags": "disable-ipc-discoverer"},
    },
    "cdi-from-an-inline-entry": {
        "nvidiaDriverRoot": "/",
        "config": {"map": {"cdi": {"flags": {"plugin": {"deviceListStrategy": "cdi-annotations"}}}}},
    },
    "all-bools-false": {
        "failOnInitError": False,
        "gdrcopyEnabled": False,
        "gdsEnabled": False,
        "mofedEnabled": False,
        "compatWithCPUManager": False,
    },
    "all-strings": {
        "deviceIDStrategy": "index",
        "deviceDiscoveryStrategy": "nvml",
        "nvidiaDriverRoot": "/run/nvidia/driver",
        "nvidiaDevRoot": "/",
        "sharedDevicesAllocationPolicy": "packed",
        "disableHealthChecks": "xids",
    },
    "host-network": {
        "devicePlugin": {"enableHostNetwork": True},
        "mps": {"enableHostNetwork": True, "enabled": True},
    },
    "mps-no-host-pid": {"config": {"map": {"config": MPS_CONFIG}}, "mps": {"enableHostPID": False}},
    "mps-forced-external-config": {
        "config": {"name": "my-configs", "default": "gpu"},
        "mps": {"enabled": True},
    },
    "kubelet-root": {"devicePlugin": {"kubeletRootDir": "/var/lib/k0s/kubelet"}},
    "pod-settings": {
        "podAnnotations": {"example.com/team": "ml"},
        "podSecurityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "resources": {
            "limits": {"cpu": "200m", "memory": "256Mi"},
            "requests": {"cpu": "50m", "memory": "64Mi"},
        },
        "imagePullSecrets": [{"name": "regcred"}],
        "nodeSelector": {"gpu": "true"},
        "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%"}},
        "priorityClassName": "",
        "runtimeClassName": "nvidia",
    },
    "no-affinity-no-tolerations": {"affinity": None, "tolerations": None},
    "explicit-security-context": {"securityContext": {"privileged": True}},
    "naming-overrides": {
        "nameOverride": "gpu-plugin",
        "fullnameOverride": "gpus",
        "namespaceOverride": "gpu-system",
        "selectorLabelsOverride": {"app": "gpus"},
    },
    "images": {
        "image": {"repository": "registry.example.com/plugin", "tag": "dev", "pullPolicy": "Always"},
        "mpsImage": {"repository": "registry.example.com/mps", "tag": "dev"},
        "config": {"map": {"config": MPS_CONFIG}},
    },
    "config-empty-fallback": {
        "config": {
            "map": {"a": "version: v1\n", "b": "version: v1\n"},
            "fallbackStrategies": ["named", "empty"],
        }
    },
    "plugin-disabled": {"devicePlugin": {"enabled": False}},
    "default-namespace-allowed": {"allowDefaultNamespace": True},
}


@pytest.mark.parametrize("values", MATRIX.values(), ids=list(MATRIX))
def test_option_matrix_renders_valid_objects(values: dict[str, Any]) -> None:
    rendered: Rendered = render(values)
    assert_valid(rendered.objects, EDGE_VERSIONS)


def test_default_namespace_renders_when_allowed() -> None:
    rendered = render({"allowDefaultNamespace": True}, namespace="default")
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding"}
    namespaces = {o["metadata"]["namespace"] for o in rendered.objects if o["kind"] not in cluster_scoped}
    assert namespaces == {"default"}
