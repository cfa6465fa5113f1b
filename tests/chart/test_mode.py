"""The chart's per-node mode: with dra.enabled the device-plugin DaemonSet runs beside the DRA plugin
where a node may be in device-plugin mode, every daemon gets the mode's environment and rights, and an
entry whose mode has no plugin installed is refused at install time."""

from __future__ import annotations

from typing import Any

import pytest
from chart_helm import Manifest, container, env, merge_values, render, render_error
from test_dra import DRA_VERSIONS
from test_render import assert_valid

DP = "nvdp-nvidia-device-plugin"
DRA_DS = "nvdp-nvidia-device-plugin-dra-plugin"
MPS = "nvdp-nvidia-device-plugin-mps-control-daemon"
GFD = "nvdp-nvidia-device-plugin-gpu-feature-discovery"
DP_ACCOUNT = "nvdp-nvidia-device-plugin-service-account"
DP_ENTRY = "version: v1\nflags:\n  mode: device-plugin\n"
DRA_ENTRY = "version: v1\nflags:\n  mode: dra\n"
MPS_ENTRY = ("version: v1\nflags:\n  mode: device-plugin\nsharing:\n  mps:\n    resources:\n"
             "    - {name: nvidia.com/gpu, replicas: 4}\n")
ENTRIES = {"config": {"map": {"dp": DP_ENTRY, "dra": DRA_ENTRY}, "default": "dp"}}
MODE_RULES = {("resource.k8s.io", "resourceslices"): {"list"}}
# Which pods use the GPUs: the kubelet's pod-resources socket, never the API server.
NEVER = {("", "pods"), ("resource.k8s.io", "resourceclaims")}
SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


def objects(*layers: dict[str, Any]) -> list[Manifest]:
    return render(merge_values({"dra": {"enabled": True}}, *layers)).objects


def daemonsets(found: list[Manifest]) -> dict[str, Manifest]:
    return {o["metadata"]["name"]: o for o in found if o["kind"] == "DaemonSet"}


def rules(role: Manifest) -> dict[tuple[str, str], set[str]]:
    return {(g, r): set(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"]
            for r in rule["resources"]}  # fmt: skip


def role_of(found: list[Manifest], account: str) -> Manifest:
    """The ClusterRole bound to `account` (one binding each)."""
    (binding,) = [o for o in found if o["kind"] == "ClusterRoleBinding"
                  and any(s["name"] == account for s in o["subjects"])]
    (role,) = [o for o in found if o["kind"] == "ClusterRole"
               and o["metadata"]["name"] == binding["roleRef"]["name"]]
    return role


@pytest.mark.parametrize("values", [ENTRIES, {"dra": {"defaultMode": "device-plugin"}},
                                    {"config": {"name": "existing-configs"}},
                                    {"config": {"map": {"only": DP_ENTRY}}}],
                         ids=["per-node-entries", "default-device-plugin", "config-name", "one-dp-entry"])
def test_both_plugins_run_where_a_node_may_be_in_either_mode(values: dict[str, Any]) -> None:
    found = objects(values)
    sets = daemonsets(found)
    assert {DP, DRA_DS} <= set(sets)
    plugin = env(container(sets[DP], "nvidia-device-plugin-ctr"))
    default = values.get("dra", {}).get("defaultMode", "dra")
    assert plugin["NVDP_DEFAULT_MODE"] == default and plugin["DRA_DRIVER_NAME"] == "gpu.nvidia.com"
    assert env(container(sets[DRA_DS], "nvidia-dra-plugin-ctr"))["NVDP_DEFAULT_MODE"] == default
    # The device plugin reads the API beside the DRA plugin: its slices; the node's GPU pods come from
    # the kubelet, where the node label may switch the mode.
    assert sets[DP]["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
    granted = rules(role_of(found, DP_ACCOUNT))
    assert all(granted.get(key, set()) >= verbs for key, verbs in MODE_RULES.items()), granted
    assert not NEVER & set(granted), granted
    switches = "default" in values.get("config", {}) or "name" in values.get("config", {})
    assert (plugin.get("KUBELET_POD_RESOURCES_SOCKET") == SOCKET) is switches, plugin
    assert_valid(found, DRA_VERSIONS)


@pytest.mark.parametrize("values", [{}, {"config": {"map": {"a": "version: v1\n", "b": DRA_ENTRY}}}],
                         ids=["no-config", "entries-without-device-plugin-mode"])
def test_no_device_plugin_where_every_node_is_in_dra_mode(values: dict[str, Any]) -> None:
    assert set(daemonsets(objects(values))) == {DRA_DS, "nvdp-nvidia-device-plugin-dra-mps"}


def test_without_dra_nothing_changes() -> None:
    found = render({"config": {"map": {"dp": DP_ENTRY, "plain": "version: v1\n"}, "default": "dp"}}).objects
    sets = daemonsets(found)
    assert DRA_DS not in sets
    plugin = env(container(sets[DP], "nvidia-device-plugin-ctr"))
    assert "NVDP_DEFAULT_MODE" not in plugin and "DRA_DRIVER_NAME" not in plugin
    granted = rules(role_of(found, DP_ACCOUNT))
    assert not set(MODE_RULES) & set(granted), granted


def test_the_mps_daemon_and_the_labeller_follow_the_mode() -> None:
    found = objects({"config": {"map": {"mps": MPS_ENTRY, "dra": DRA_ENTRY}, "default": "mps"},
                     "gfd": {"enabled": True}})
    sets = daemonsets(found)
    assert {DP, DRA_DS, MPS, GFD} <= set(sets)
    for name, ctr in ((MPS, "mps-control-daemon-ctr"), (GFD, "gpu-feature-discovery-ctr")):
        variables = env(container(sets[name], ctr))
        assert variables["NVDP_DEFAULT_MODE"] == "dra" and variables["DRA_DRIVER_NAME"] == "gpu.nvidia.com"
        assert variables["KUBELET_POD_RESOURCES_SOCKET"] == SOCKET
        mount = next(m for m in container(sets[name], ctr)["volumeMounts"] if m["name"] == "pod-resources")
        assert mount == {"name": "pod-resources", "mountPath": SOCKET.rsplit("/", 1)[0], "readOnly": True}
    assert not NEVER & set(rules(role_of(found, GFD)))


def test_no_mps_daemon_where_no_node_can_be_in_device_plugin_mode() -> None:
    """The MPS control daemon serves the device plugin's MPS resources only."""
    mps_in_dra = MPS_ENTRY.replace("mode: device-plugin", "mode: dra")
    assert MPS not in daemonsets(objects({"config": {"map": {"mps": mps_in_dra}}}))
    assert MPS in daemonsets(objects({"config": {"map": {"mps": MPS_ENTRY}}}))
    without_mode = MPS_ENTRY.replace("flags:\n  mode: device-plugin\n", "")
    assert MPS in daemonsets(render({"config": {"map": {"mps": without_mode}}}).objects)  # no DRA


def test_the_default_mode_is_dra_and_only_the_two_modes_are_accepted() -> None:
    sets = daemonsets(objects())
    assert env(container(sets[DRA_DS], "nvidia-dra-plugin-ctr"))["NVDP_DEFAULT_MODE"] == "dra"
    error = render_error({"dra": {"enabled": True, "defaultMode": "plugin"}})
    assert "defaultMode" in error and "device-plugin" in error, error


@pytest.mark.parametrize("as_object", [False, True], ids=["set-file", "inline-object"])
def test_an_entry_in_dra_mode_needs_dra_enabled(as_object: bool) -> None:
    entry: Any = {"version": "v1", "flags": {"mode": "dra"}} if as_object else DRA_ENTRY
    error = render_error({"config": {"map": {"plain": "version: v1\n", "gpu-dra": entry}}})
    assert "config.map.gpu-dra sets flags.mode: dra, but 'dra.enabled' is false" in error, error
    assert "Set 'dra.enabled=true', or remove flags.mode from the entry" in error


def test_a_device_plugin_mode_needs_the_device_plugin() -> None:
    error = render_error({"dra": {"enabled": True}, "devicePlugin": {"enabled": False},
                          "config": {"map": {"dp": DP_ENTRY}}})
    assert "config.map.dp sets flags.mode: device-plugin, but 'devicePlugin.enabled' is false" in error, error
    error = render_error({"dra": {"enabled": True, "defaultMode": "device-plugin"},
                          "devicePlugin": {"enabled": False}})
    assert "'dra.defaultMode' is device-plugin, but 'devicePlugin.enabled' is false" in error, error


@pytest.mark.parametrize("as_object", [False, True], ids=["set-file", "inline-object"])
def test_dynamic_mig_is_refused_at_install_for_device_plugin_mode(as_object: bool) -> None:
    entry: Any = ({"version": "v1", "flags": {"migStrategy": "dynamic"}} if as_object
                  else "version: v1\nflags:\n  migStrategy: dynamic\n")
    error = render_error({"dra": {"enabled": True, "defaultMode": "device-plugin"},
                          "config": {"map": {"mig": entry}}})
    assert "config.map.mig sets flags.migStrategy: dynamic, but the nodes that pick it would run in " \
        "device-plugin mode (the entry has no flags.mode, and 'dra.enabled' is true and 'dra.defaultMode' " \
        "is device-plugin)" in error, error
    assert "Set flags.mode: dra in the entry and 'dra.enabled=true'" in error
    explicit = "version: v1\nflags:\n  migStrategy: dynamic\n  mode: device-plugin\n"
    assert "flags.mode is device-plugin" in render_error({"dra": {"enabled": True},
                                                          "config": {"map": {"mig": explicit}}})
    assert MPS not in daemonsets(objects({"dra": {"enabled": True}, "config": {"map": {"mig": entry}}}))
