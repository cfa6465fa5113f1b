"""CDI values: NVIDIA's cdi.* and deviceListStrategy values render, and the hook's host file (not its
folder) is mounted where the plugin checks for the hook (NVDP_HOST_HOOK_DIR) only when CDI may be on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from chart_helm import Manifest, container, env, render, values_file

loader = pytest.importorskip("nvdp.config.loader", reason="the plugin's config loader is not importable")

DATA = Path(__file__).parent / "data"
PLUGIN = "nvdp-nvidia-device-plugin"
HOOK_MOUNT = "/host-cdi-hook"
GPU_OPERATOR_HOOK = "/usr/local/nvidia/toolkit/nvidia-cdi-hook"


def plugin_ds(values: dict[str, Any]) -> Manifest:
    return render(values).one("DaemonSet", PLUGIN)


def plugin_ctr(values: dict[str, Any]) -> Manifest:
    return container(plugin_ds(values), "nvidia-device-plugin-ctr")


def hook_file(values: dict[str, Any]) -> str | None:
    """The host file mounted for the hook check, asserting mount, volume and env agree."""
    ds = plugin_ds(values)
    ctr = container(ds, "nvidia-device-plugin-ctr")
    volumes = [v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == "cdi-hook"]
    mounts = [m for m in ctr["volumeMounts"] if m["name"] == "cdi-hook"]
    variable = env(ctr).get("NVDP_HOST_HOOK_DIR")
    if not volumes:
        assert not mounts and variable is None
        return None
    (volume,), (mount,) = volumes, mounts
    path: str = volume["hostPath"]["path"]
    # The plugin looks for the hook's base name in $NVDP_HOST_HOOK_DIR.
    assert mount == {"name": "cdi-hook", "mountPath": f"{HOOK_MOUNT}/{Path(path).name}", "readOnly": True}
    assert variable == HOOK_MOUNT
    assert volume["hostPath"]["type"] == "File"
    return path


def entry(**plugin: Any) -> str:
    lines = "".join(f"    {key}: {value}\n" for key, value in plugin.items())
    return f"version: v1\nflags:\n  plugin:\n{lines}"


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"cdi": {"featureFlags": "disable-ipc-discoverer"}}, "disable-ipc-discoverer"),
        (
            {"cdi": {"featureFlags": ["no-additional-gids-for-device-nodes", "disable-ipc-discoverer"]}},
            "no-additional-gids-for-device-nodes,disable-ipc-discoverer",
        ),
        ({"cdi": {"featureFlags": []}}, None),
        ({"cdi": {"featureFlags": None}}, None),
        ({}, None),
    ],
)
def test_feature_flags_are_passed_as_nvidia_does(values: dict[str, Any], expected: str | None) -> None:
    variables = env(plugin_ctr(values))
    assert variables.get("CDI_FEATURE_FLAGS") == expected
    if expected is not None:
        config = loader.load_config_text(None, "chart", env={"CDI_FEATURE_FLAGS": expected})
        assert ",".join(config.flags.plugin.cdi_feature_flags) == expected


def test_feature_flags_are_no_longer_listed_as_ignored() -> None:
    rendered = render({"cdi": {"featureFlags": "disable-ipc-discoverer"}})
    assert "ignored" not in rendered.notes


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({}, None),
        ({"deviceListStrategy": "envvar"}, None),
        ({"deviceListStrategy": "volume-mounts,envvar"}, None),
        ({"deviceListStrategy": "cdi-cri"}, "/usr/bin/nvidia-ctk"),
        ({"deviceListStrategy": "envvar,cdi-annotations"}, "/usr/bin/nvidia-ctk"),
        ({"deviceListStrategy": ["cdi-cri", "cdi-annotations"]}, "/usr/bin/nvidia-ctk"),
        ({"deviceListStrategy": "cdi-cri", "cdi": {"nvidiaHookPath": GPU_OPERATOR_HOOK}}, GPU_OPERATOR_HOOK),
        # The hook path alone does not turn CDI on.
        ({"cdi": {"nvidiaHookPath": GPU_OPERATOR_HOOK}}, None),
        # The strategy from an inline entry; its hook path too.
        ({"config": {"map": {"c": entry(deviceListStrategy="cdi-cri")}}}, "/usr/bin/nvidia-ctk"),
        ({"config": {"map": {"c": entry(deviceListStrategy="[cdi-cri]", nvidiaCTKPath="/opt/ctk/hook")}}},
         "/opt/ctk/hook"),
        ({"config": {"map": {"c": {"flags": {"plugin": {"deviceListStrategy": "cdi-annotations"}}}}}},
         "/usr/bin/nvidia-ctk"),
        # The value wins over the entries, as its env var wins over the file.
        ({"deviceListStrategy": "envvar", "config": {"map": {"c": entry(deviceListStrategy="cdi-cri")}}},
         None),
        ({"deviceListStrategy": "cdi-cri", "cdi": {"nvidiaHookPath": GPU_OPERATOR_HOOK},
          "config": {"map": {"c": entry(nvidiaCTKPath="/opt/ctk/hook")}}}, GPU_OPERATOR_HOOK),
        # Entries that name different hook paths: the chart cannot tell which one a node gets.
        ({"deviceListStrategy": "cdi-cri",
          "config": {"map": {"a": entry(nvidiaCTKPath="/opt/ctk/hook"), "b": "version: v1\n"}}}, None),
        # Entries that agree.
        ({"deviceListStrategy": "cdi-cri",
          "config": {"map": {"a": entry(nvidiaCTKPath="/opt/ctk/hook"),
                             "b": entry(nvidiaCTKPath="/opt/ctk/hook", deviceIDStrategy="index")}}},
         "/opt/ctk/hook"),
        # An existing ConfigMap cannot be read: it may use CDI.
        ({"config": {"name": "mine", "default": "c"}}, "/usr/bin/nvidia-ctk"),
        # A hook at the root is only that file; a relative path: nothing to mount (the plugin refuses it).
        ({"deviceListStrategy": "cdi-cri", "cdi": {"nvidiaHookPath": "/nvidia-ctk"}}, "/nvidia-ctk"),
        ({"deviceListStrategy": "cdi-cri", "cdi": {"nvidiaHookPath": "nvidia-ctk"}}, None),
    ],
)
def test_hook_file_is_mounted_only_when_cdi_may_be_on(values: dict[str, Any], expected: str | None) -> None:
    assert hook_file(values) == expected


def test_nvidia_cdi_values_render_and_load() -> None:
    """A GPU Operator-like values file: CDI on, the operator's hook path and driver root, feature flags."""
    values = {
        **values_file(DATA / "nvidia-format-values.yaml"),
        "deviceListStrategy": "cdi-cri",
        "nvidiaDriverRoot": "/run/nvidia/driver",
        "cdi": {"nvidiaHookPath": GPU_OPERATOR_HOOK, "featureFlags": "disable-ipc-discoverer"},
    }
    ds = plugin_ds(values)
    ctr = container(ds, "nvidia-device-plugin-ctr")
    variables = {k: v for k, v in env(ctr).items() if v is not None}
    assert hook_file(values) == GPU_OPERATOR_HOOK
    mounts = {m["mountPath"]: m for m in ctr["volumeMounts"]}
    assert mounts["/driver-root"]["readOnly"] is True
    assert "/var/run/cdi" in mounts  # where the plugin writes the spec
    config = loader.load_config_text(None, "chart", env=variables)
    plugin = config.flags.plugin
    assert plugin.device_list_strategy == ("cdi-cri",)
    assert plugin.nvidia_ctk_path == GPU_OPERATOR_HOOK
    assert plugin.cdi_feature_flags == ("disable-ipc-discoverer",)
    assert config.flags.nvidia_driver_root == "/run/nvidia/driver"
