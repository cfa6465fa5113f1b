"""mps.upgrade: how both MPS DaemonSets roll. whenIdle (default) is a surge in which the new pod turns
Ready only once its node is idle (nvdp.mps.node.handover); immediately is the chart's updateStrategy."""

from __future__ import annotations

from typing import Any

import pytest
from chart_helm import Manifest, Rendered, container, env, render

from nvdp.mps.node.handover import POD_NAME_ENV, READY_FILE_ENV, WHY_SUFFIX

MPS_ENTRY = "version: v1\nsharing:\n  mps:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 4}\n"
DEVICE_PLUGIN_MPS = {"config": {"map": {"config": MPS_ENTRY}}}
DRA = {"dra": {"enabled": True}}
SURGE = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}


def mps_daemonsets(rendered: Rendered) -> dict[str, Manifest]:
    found = {ds["metadata"]["name"]: ds for ds in rendered.find("DaemonSet")}
    return {name: ds for name, ds in found.items() if name.endswith(("-mps-control-daemon", "-dra-mps"))}


def both(extra: dict[str, Any] | None = None) -> dict[str, Manifest]:
    """The MPS DaemonSets of both modes: device-plugin mode's and dra-mps."""
    sets = {**mps_daemonsets(render({**DEVICE_PLUGIN_MPS, **(extra or {})})),
            **mps_daemonsets(render({**DRA, **(extra or {})}))}
    assert sorted(name.rsplit("-", 2)[-1] for name in sets) == ["daemon", "mps"], sets.keys()
    return sets


@pytest.fixture(scope="module")
def default() -> dict[str, Manifest]:
    return both()


def test_both_mps_daemonsets_surge_and_are_ready_by_the_file_the_daemon_keeps(
        default: dict[str, Manifest]) -> None:
    for name, ds in default.items():
        assert ds["spec"]["updateStrategy"] == SURGE, name
        (main,) = ds["spec"]["template"]["spec"]["containers"]
        variables = env(main)
        ready = variables[READY_FILE_ENV]
        probe = main["readinessProbe"]["exec"]["command"]
        assert probe == ["sh", "-c", f"test -e {ready} || {{ cat {ready}{WHY_SUFFIX} 2>/dev/null; exit 1; }}"]
        assert main["readinessProbe"]["periodSeconds"] <= 5, name
        assert POD_NAME_ENV in variables, name


def test_the_device_plugin_modes_daemon_asks_the_kubelet_which_pods_use_mps(
        default: dict[str, Manifest]) -> None:
    (ds,) = [d for n, d in default.items() if n.endswith("-mps-control-daemon")]
    main = container(ds, "mps-control-daemon-ctr")
    assert env(main)["KUBELET_POD_RESOURCES_SOCKET"] == "/var/lib/kubelet/pod-resources/kubelet.sock"
    (mount,) = [m for m in main["volumeMounts"] if m["name"] == "pod-resources"]
    assert mount["readOnly"] is True


@pytest.mark.parametrize("strategy", [None, {"type": "OnDelete"}])
def test_immediately_gives_the_charts_update_strategy(strategy: dict[str, Any] | None) -> None:
    values: dict[str, Any] = {"mps": {"upgrade": "immediately"}}
    if strategy is not None:
        values["updateStrategy"] = strategy
    for name, ds in both(values).items():
        assert ds["spec"]["updateStrategy"] == (strategy or {"type": "RollingUpdate"}), name
