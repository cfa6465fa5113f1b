"""The chart and the binaries agree: env names, flags, the config file path, and the config itself."""

from __future__ import annotations

from typing import Any

import pytest
from chart_helm import Manifest, Rendered, ci_values_files, container, env, render, values_file

loader = pytest.importorskip("nvdp.config.loader", reason="the plugin's config loader is not importable")
flags = pytest.importorskip("nvdp.config.flags")
sources = pytest.importorskip("nvdp.config.sources")

# Read by the container runtime or used only for log context, not by the config loader.
RUNTIME_ENV = {
    "NODE_NAME",
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "NVIDIA_MIG_MONITOR_DEVICES",
    # Read by the MPS daemon's mount step (nvdp.mps.node.hostmount), not by the config loader.
    "MPS_MOUNT_IN_HOST_NAMESPACE",
}
observe = pytest.importorskip("nvdp.daemon.report.observe")
# Read by the processes themselves (where to serve metrics and probes), not by the config loader.
PROCESS_ENV = {observe.METRICS_ADDRESS_ENV, observe.HEALTH_ADDRESS_ENV}
# Read by the MPS daemon's turn on its node (nvdp.mps.node.handover) and its ask of the kubelet
# (nvdp.mps.work).
handover = pytest.importorskip("nvdp.mps.node.handover")
podresources = pytest.importorskip("nvdp.daemon.podresources")
PROCESS_ENV |= {handover.READY_FILE_ENV, handover.POD_NAME_ENV, podresources.POD_RESOURCES_ENV}
# Read by the per-node config settings (nvdp.daemon.pernode.nodeconfig.settings_from), which choose the entry.
NODE_CONFIG_ENV = {"CONFIG_DIR", "DEFAULT_CONFIG", "FALLBACK_STRATEGIES"}
# Read by the CDI hook check (nvdp.cdi.host): where the chart mounted the hook's host directory.
HOOK_CHECK_ENV = {"NVDP_HOST_HOOK_DIR"}

MPS_CONFIG = "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
EVERYTHING_SET: dict[str, Any] = {
    "compatWithCPUManager": True,
    "migStrategy": "single",
    "failOnInitError": False,
    "deviceListStrategy": ["envvar", "cdi-annotations"],
    "deviceIDStrategy": "index",
    "nvidiaDriverRoot": "/run/nvidia/driver",
    "nvidiaDevRoot": "/",
    "gdrcopyEnabled": True,
    "gdsEnabled": False,
    "mofedEnabled": True,
    "deviceDiscoveryStrategy": "nvml",
    "sharedDevicesAllocationPolicy": "packed",
    "disableHealthChecks": "48,109",
    "cdi": {"nvidiaHookPath": "/usr/local/bin/nvidia-cdi-hook", "featureFlags": ["disable-ipc-discoverer"]},
    "devicePlugin": {"kubeletRootDir": "/var/lib/k0s/kubelet"},
    "config": {"map": {"config": MPS_CONFIG}},
}


@pytest.fixture(scope="module")
def rendered() -> Rendered:
    return render(EVERYTHING_SET)


def main_containers(rendered: Rendered) -> list[Manifest]:
    return [c for ds in rendered.find("DaemonSet") for c in ds["spec"]["template"]["spec"]["containers"]]


def test_every_env_var_is_read_by_the_config_loader(rendered: Rendered) -> None:
    names = {name for c in main_containers(rendered) for name in env(c)}
    unknown = names - set(loader.ENV_VARS) - RUNTIME_ENV - PROCESS_ENV - NODE_CONFIG_ENV - HOOK_CHECK_ENV
    assert not unknown, f"the chart sets env vars the plugin does not read: {sorted(unknown)}"
    # Every value is set here, so this is every env var the chart can emit.
    assert names - RUNTIME_ENV - PROCESS_ENV == {
        "CDI_FEATURE_FLAGS",
        "CONFIG_DIR",
        "DEVICE_DISCOVERY_STRATEGY",
        "DEVICE_ID_STRATEGY",
        "DEVICE_LIST_STRATEGY",
        "DEVICE_PLUGIN_PATH",
        "DP_DISABLE_HEALTHCHECKS",
        "FAIL_ON_INIT_ERROR",
        "FALLBACK_STRATEGIES",
        "GDRCOPY_ENABLED",
        "HEALTH_FLAP_LIMIT",
        "HEALTH_RECOVERY_AFTER",
        "HEALTH_STATE_DIR",
        "GDS_ENABLED",
        "MIG_STRATEGY",
        "MOFED_ENABLED",
        "MPS_ROOT",
        "NVDP_HOST_HOOK_DIR",
        "NVIDIA_CDI_HOOK_PATH",
        "NVIDIA_DEV_ROOT",
        "NVIDIA_DRIVER_ROOT",
        "PASS_DEVICE_SPECS",
        "SHARED_DEVICES_ALLOCATION_POLICY",
    }


def test_every_flag_passed_is_known() -> None:
    known = set(sources.FLAG_PATHS) | {a for aliases in flags.FLAG_ALIASES.values() for a in aliases}
    known.add("--config-file")
    for values in ({}, EVERYTHING_SET):
        for ds in render(values).find("DaemonSet"):
            spec = ds["spec"]["template"]["spec"]
            for c in [*spec.get("initContainers", []), *spec["containers"]]:
                passed = {arg.split("=", 1)[0] for arg in c.get("args", []) if arg.startswith("--")}
                assert passed <= known, f"{c['name']} passes unknown flags {sorted(passed - known)}"


def test_config_dir_env_points_at_the_mounted_entries(rendered: Rendered) -> None:
    """Every daemon gets the ConfigMap as a directory and the settings it chooses its entry by."""
    import argparse

    from nvdp.daemon.pernode.nodeconfig import settings_from

    for ds in rendered.find("DaemonSet"):
        spec = ds["spec"]["template"]["spec"]
        volume = next(v for v in spec["volumes"] if v["name"] == "available-configs")
        assert volume["configMap"] == {"name": "nvdp-nvidia-device-plugin-configs"}  # every entry, no items
        for c in spec["containers"]:
            mount = next(m for m in c["volumeMounts"] if m["name"] == "available-configs")
            assert "subPath" not in mount  # a subPath mount never sees ConfigMap updates
            variables = {k: v for k, v in env(c).items() if v is not None}
            assert "CONFIG_FILE" not in variables
            settings = settings_from(argparse.Namespace(), variables)
            assert settings is not None and str(settings.config_dir) == mount["mountPath"]
            assert settings.fallbacks == ("named", "single")


def test_device_plugin_path_is_the_mounted_kubelet_dir(rendered: Rendered) -> None:
    ds = rendered.one("DaemonSet", "nvdp-nvidia-device-plugin")
    plugin = container(ds, "nvidia-device-plugin-ctr")
    path = env(plugin)["DEVICE_PLUGIN_PATH"]
    assert path == "/var/lib/k0s/kubelet/device-plugins"
    mount = next(m for m in plugin["volumeMounts"] if m["name"] == "device-plugin")
    volume = next(v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == "device-plugin")
    assert mount["mountPath"] == volume["hostPath"]["path"] == path


CASES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "everything-set": EVERYTHING_SET,
    **{path.name: values_file(path) for path in ci_values_files()},
}


@pytest.mark.parametrize("values", CASES.values(), ids=list(CASES))
def test_plugin_loads_the_rendered_config_and_env(values: dict[str, Any]) -> None:
    rendered = render(values)
    configs = {k: v for cm in rendered.find("ConfigMap") for k, v in cm["data"].items()}
    for ds in rendered.find("DaemonSet"):
        spec = ds["spec"]["template"]["spec"]
        volume = next((v for v in spec["volumes"] if v["name"] == "config"), None)
        text = configs[volume["configMap"]["items"][0]["key"]] if volume else None
        for c in spec["containers"]:
            variables = {k: v for k, v in env(c).items() if v is not None}
            assert ("CONFIG_FILE" in variables) == (text is not None)
            if "CONFIG_DIR" in variables:
                # Per-node config: every entry may be chosen on some node, so every one must load.
                assert variables["CONFIG_DIR"] in {m["mountPath"] for m in c["volumeMounts"]}
                for entry, entry_text in configs.items():
                    loader.load_config_text(entry_text, f"{c['name']}:{entry}", env=variables)
            config = loader.load_config_text(text, c["name"], env=variables)
            if "MIG_STRATEGY" in variables:
                assert config.flags.mig_strategy == variables["MIG_STRATEGY"]
            assert config.flags.mps_root == "/run/nvidia/mps"
