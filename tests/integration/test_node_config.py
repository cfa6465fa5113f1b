"""Per-node config end to end: the plugin process, stand-in NVML, kubelet simulator and a real
kube-apiserver whose Node label picks the config entry."""

from __future__ import annotations

import json
import signal
import time
import uuid
from pathlib import Path

import pytest

from sim.kubelet import KubeletSim
from tests.kube.envtest import ControlPlane

from .conftest import MakePlugin

pytestmark = pytest.mark.slow
LABEL = "nvidia.com/device-plugin.config"
NAMES = """\
version: v1
resources:
  gpus:
    - pattern: "*T4*"
      name: t4
    - pattern: "*V100*"
      name: v100
"""
SHARE_T4 = "sharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/t4\n        replicas: {}\n"
ENTRIES = {"plain": NAMES, "ts-t4": NAMES + SHARE_T4.format(4),
           "broken": "version: v1\n" + SHARE_T4.format(0)}


def entries_dir(tmp_path: Path, entries: dict[str, str]) -> Path:
    """Laid out like a kubelet ConfigMap volume: ..data -> ..<ts>/, one symlink per key."""
    root = tmp_path / "available-configs"
    data = root / "..2026_01_01_00_00_00.1"
    data.mkdir(parents=True)
    for name, text in entries.items():
        (data / name).write_text(text)
    (root / "..data").symlink_to(data.name)
    for name in entries:
        (root / name).symlink_to(f"..data/{name}")
    return root


def update_entries(root: Path, entries: dict[str, str]) -> None:
    """The kubelet's atomic refresh: a new timestamped dir, then ..data swapped to it."""
    data = root / f"..2026_01_01_00_00_00.{time.time_ns()}"
    data.mkdir()
    for name, text in entries.items():
        (data / name).write_text(text)
    tmp = root / "..data_tmp"
    tmp.symlink_to(data.name)
    tmp.rename(root / "..data")
    for name in entries:
        if not (root / name).is_symlink():
            (root / name).symlink_to(f"..data/{name}")


def node_events(plane: ControlPlane, node: str) -> list[dict[str, str]]:
    out = plane.kubectl("get", "events", "-n", "default", "-o", "json",
                        "--field-selector", f"involvedObject.name={node}").stdout
    items = json.loads(out)["items"]
    return [{"reason": e["reason"], "message": e["message"], "type": e["type"]} for e in items]


def wait_for(predicate: object, timeout: float, what: str) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_label_switch_replans_live_and_unknown_or_invalid_entries_keep_serving(
        make_plugin: MakePlugin, kubelet: KubeletSim, kube_api: ControlPlane, tmp_path: Path) -> None:
    node_name = f"gpu-{uuid.uuid4().hex[:8]}"
    kube_api.create_node(node_name)
    root = entries_dir(tmp_path, ENTRIES)
    plugin, _node = make_plugin("mixed-4", CONFIG_DIR=str(root), DEFAULT_CONFIG="plain", NODE_NAME=node_name,
                                KUBECONFIG=str(kube_api.admin_kubeconfig))
    plugin.start()
    kubelet.wait_for_resource("nvidia.com/t4", count=2, healthy=2, timeout=15)
    kubelet.wait_for_resource("nvidia.com/v100", count=2, healthy=2, timeout=15)
    plugin.wait_for_log("entry 'plain' (from config.default)")

    # The label picks ts-t4: t4 re-planned to 8 replicas, v100 untouched (no new registration,
    # no disconnect, never fewer than 2 healthy devices).
    registrations = len(kubelet.registrations)
    kube_api.kubectl("label", "node", node_name, f"{LABEL}=ts-t4")
    kubelet.wait_for_resource("nvidia.com/t4", count=8, healthy=8, timeout=15)
    plugin.wait_for_log("Reload applied")
    v100_events = [e for e in kubelet.events if e.get("resource") == "nvidia.com/v100"]
    assert [e["type"] for e in v100_events] == ["devices"], v100_events
    assert all(len(e["devices"]) == 2 for e in v100_events)
    assert "nvidia.com/v100" not in [r["resource_name"] for r in kubelet.registrations[registrations:]]
    applied = plugin.log.split("Reload applied: ")[-1].splitlines()[0]
    assert "unchanged nvidia.com/v100" in applied and "nvidia.com/t4" in applied, applied
    wait_for(lambda: any(e["reason"] == "ConfigApplied" for e in node_events(kube_api, node_name)), 10,
             "ConfigApplied event")

    # An unknown entry: logged with the entries there are, an Event on the Node, nothing changes.
    kube_api.kubectl("label", "node", node_name, f"{LABEL}=nope", "--overwrite")
    plugin.wait_for_log("names config 'nope', which does not exist (entries: broken, plain, ts-t4)")
    wait_for(lambda: any(e["reason"] == "UnknownConfig" for e in node_events(kube_api, node_name)), 10,
             "UnknownConfig event")
    assert len(kubelet.devices("nvidia.com/t4")) == 8

    # An invalid entry: every error listed, the running config stays.
    kube_api.kubectl("label", "node", node_name, f"{LABEL}=broken", "--overwrite")
    plugin.wait_for_log("was not applied; still serving entry 'ts-t4'")
    wait_for(lambda: any(e["reason"] == "InvalidConfig" for e in node_events(kube_api, node_name)), 10,
             "InvalidConfig event")
    invalid = [e for e in node_events(kube_api, node_name) if e["reason"] == "InvalidConfig"]
    assert "replicas" in invalid[0]["message"], invalid
    assert len(kubelet.devices("nvidia.com/t4")) == 8
    assert plugin.proc is not None and plugin.proc.poll() is None

    # Back to a valid entry, then the ConfigMap is edited in place: picked up without a restart.
    kube_api.kubectl("label", "node", node_name, f"{LABEL}=plain", "--overwrite")
    kubelet.wait_for_resource("nvidia.com/t4", count=2, healthy=2, timeout=15)
    edited = dict(ENTRIES, plain=NAMES + "sharing:\n  timeSlicing:\n    resources:\n"
                  "      - name: nvidia.com/v100\n        replicas: 3\n")
    update_entries(root, edited)
    kubelet.wait_for_resource("nvidia.com/v100", count=6, healthy=6, timeout=20)
    plugin.wait_for_log("ConfigMap updated")
    assert plugin.stop() == 0, plugin.log


def test_unknown_label_at_start_serves_the_default_and_says_so(
        make_plugin: MakePlugin, kubelet: KubeletSim, kube_api: ControlPlane, tmp_path: Path) -> None:
    node_name = f"gpu-{uuid.uuid4().hex[:8]}"
    kube_api.create_node(node_name, {LABEL: "typo"})
    root = entries_dir(tmp_path, {"default": NAMES})
    plugin, _node = make_plugin("mixed-4", CONFIG_DIR=str(root), NODE_NAME=node_name,
                                KUBECONFIG=str(kube_api.admin_kubeconfig))
    plugin.start()
    kubelet.wait_for_resource("nvidia.com/v100", count=2, healthy=2, timeout=15)
    plugin.wait_for_log("entry 'default' (from fallback named)")
    wait_for(lambda: any(e["reason"] == "UnknownConfig" for e in node_events(kube_api, node_name)), 10,
             "UnknownConfig event")
    assert plugin.stop() == 0, plugin.log


def test_api_server_unreachable_at_start_still_serves(
        make_plugin: MakePlugin, kubelet: KubeletSim, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "nowhere.kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "x", "cluster": {"server": "https://127.0.0.1:1",
                                               "insecure-skip-tls-verify": True}}],
        "users": [{"name": "x", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}]}))
    root = entries_dir(tmp_path, {"a": NAMES, "b": ENTRIES["ts-t4"]})
    plugin, _node = make_plugin("mixed-4", CONFIG_DIR=str(root), DEFAULT_CONFIG="b", NODE_NAME="gpu-x",
                                KUBECONFIG=str(kubeconfig))
    plugin.start()
    kubelet.wait_for_resource("nvidia.com/t4", count=8, healthy=8, timeout=20)
    plugin.wait_for_log("API server unreachable")
    assert plugin.stop() == 0, plugin.log


def test_plugin_keeps_serving_while_the_api_server_is_down_and_follows_the_label_after(
        make_plugin: MakePlugin, kubelet: KubeletSim, kube_api_private: ControlPlane, tmp_path: Path) -> None:
    plane = kube_api_private
    node_name = f"gpu-{uuid.uuid4().hex[:8]}"
    plane.create_node(node_name)
    root = entries_dir(tmp_path, ENTRIES)
    plugin, _node = make_plugin("mixed-4", CONFIG_DIR=str(root), DEFAULT_CONFIG="plain", NODE_NAME=node_name,
                                KUBECONFIG=str(plane.admin_kubeconfig))
    plugin.start()
    kubelet.wait_for_resource("nvidia.com/t4", count=2, healthy=2, timeout=15)
    plane.kill_apiserver()
    plugin.wait_for_log("API server unreachable", timeout=15)
    assert len(kubelet.devices("nvidia.com/t4")) == 2
    assert plugin.proc is not None and plugin.proc.poll() is None
    plane.start_apiserver()
    plane.kubectl("label", "node", node_name, f"{LABEL}=ts-t4")
    kubelet.wait_for_resource("nvidia.com/t4", count=8, healthy=8, timeout=60)
    # SIGHUP in per-node mode chooses again and reloads, keeping the labelled entry.
    plugin.signal(signal.SIGHUP)
    plugin.wait_for_log("Received SIGHUP; config entry 'ts-t4' (from label)")
    assert len(kubelet.devices("nvidia.com/t4")) == 8
    assert plugin.stop() == 0, plugin.log


def test_invalid_labelled_entry_at_start_serves_the_default_and_records_why(
        make_plugin: MakePlugin, kubelet: KubeletSim, kube_api: ControlPlane, tmp_path: Path) -> None:
    node_name = f"gpu-{uuid.uuid4().hex[:8]}"
    kube_api.create_node(node_name, {LABEL: "broken"})
    root = entries_dir(tmp_path, ENTRIES)
    plugin, _node = make_plugin("mixed-4", CONFIG_DIR=str(root), DEFAULT_CONFIG="ts-t4", NODE_NAME=node_name,
                                KUBECONFIG=str(kube_api.admin_kubeconfig))
    plugin.start()
    kubelet.wait_for_resource("nvidia.com/t4", count=8, healthy=8, timeout=15)
    plugin.wait_for_log("starting with entry 'ts-t4' (from config.default) instead")
    wait_for(lambda: any(e["reason"] == "InvalidConfig" for e in node_events(kube_api, node_name)), 10,
             "InvalidConfig event")
    # The same broken entry is not retried on every wake-up, but a label change is followed.
    kube_api.kubectl("label", "node", node_name, f"{LABEL}=plain", "--overwrite")
    kubelet.wait_for_resource("nvidia.com/t4", count=2, healthy=2, timeout=15)
    assert plugin.stop() == 0, plugin.log
