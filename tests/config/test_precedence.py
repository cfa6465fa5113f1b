"""Effective config = command-line flag > environment variable > config file > default."""

from __future__ import annotations

import argparse

import pytest

from nvdp.config.flags import add_config_arguments, overrides_from_args
from nvdp.config.loader import ENV_VARS, ConfigError, ConfigIssue, load_config_text
from nvdp.config.model import Flags
from nvdp.config.schema import node_at

FILE = b"""
version: v1
flags:
  migStrategy: single
  mpsRoot: /file/mps
  plugin:
    deviceListStrategy: volume-mounts
"""


def parse_flags(*argv: str) -> dict[str, object]:
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    return overrides_from_args(parser.parse_args(list(argv)))


def test_default_when_nothing_is_set() -> None:
    assert load_config_text(None, env={}).flags.mig_strategy == Flags().mig_strategy


def test_file_beats_default() -> None:
    config = load_config_text(FILE, "c.yaml", env={})
    assert config.flags.mig_strategy == "single"
    assert config.flags.plugin.device_list_strategy == ("volume-mounts",)


def test_env_beats_file() -> None:
    env = {"MIG_STRATEGY": "mixed", "DEVICE_LIST_STRATEGY": "envvar, cdi-cri"}
    config = load_config_text(FILE, "c.yaml", env=env)
    assert config.flags.mig_strategy == "mixed"
    assert config.flags.plugin.device_list_strategy == ("envvar", "cdi-cri")
    assert config.flags.mps_root == "/file/mps"


def test_flag_beats_env() -> None:
    overrides = parse_flags("--mig-strategy=none", "--mps-root", "/flag/mps")
    config = load_config_text(FILE, "c.yaml", env={"MIG_STRATEGY": "mixed"}, overrides=overrides)
    assert config.flags.mig_strategy == "none"
    assert config.flags.mps_root == "/flag/mps"


def test_empty_env_var_counts_as_unset() -> None:
    assert load_config_text(FILE, "c.yaml", env={"MIG_STRATEGY": ""}).flags.mig_strategy == "single"


def test_first_of_two_env_names_wins() -> None:
    env = {"NVIDIA_CTK_PATH": "/b/nvidia-ctk", "NVIDIA_CDI_HOOK_PATH": "/a/nvidia-cdi-hook"}
    assert load_config_text(None, env=env).flags.plugin.nvidia_ctk_path == "/a/nvidia-cdi-hook"
    env = {"CONTAINER_DRIVER_ROOT": "/c"}
    assert load_config_text(None, env=env).flags.plugin.container_driver_root == "/c"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("true", True),
        ("TRUE", True),
        ("1", True),
        ("Yes", True),
        ("false", False),
        ("0", False),
        ("no", False),
    ],
)
def test_env_booleans(text: str, value: bool) -> None:
    config = load_config_text(None, env={"PASS_DEVICE_SPECS": text, "IMEX_REQUIRED": text})
    assert config.flags.plugin.pass_device_specs is value
    assert config.imex.required is value


def test_bad_env_values_name_the_variable() -> None:
    env = {"FAIL_ON_INIT_ERROR": "maybe", "IMEX_CHANNEL_IDS": "0,x", "DEVICE_ID_STRATEGY": "serial"}
    with pytest.raises(ConfigError) as caught:
        load_config_text(None, env=env)
    assert [str(i) for i in caught.value.issues] == [
        "FAIL_ON_INIT_ERROR: flags.failOnInitError: not a boolean (got 'maybe'); "
        "use true/false, 1/0 or yes/no",
        "DEVICE_ID_STRATEGY: flags.plugin.deviceIDStrategy: is not an allowed value (got 'serial'); "
        "expected one of uuid, index",
        "IMEX_CHANNEL_IDS: imex.channelIDs: 'x' is not an integer (got '0,x'); "
        "use a comma-separated list of integers, e.g. 0",
    ]


def test_env_values_go_through_semantic_checks() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config_text(
            b"sharing: {mps: {resources: [{name: gpu, replicas: 2}]}}",
            "c.yaml",
            env={"MIG_STRATEGY": "mixed", "IMEX_CHANNEL_IDS": "3"},
        )
    assert [str(i) for i in caught.value.issues] == [
        "c.yaml:1: sharing.mps: MPS sharing is not supported with migStrategy mixed (set by MIG_STRATEGY); "
        "use migStrategy none or single, or share with sharing.timeSlicing",
        "IMEX_CHANNEL_IDS: imex.channelIDs: channelIDs must be [] or [0] (got [3]); use [] (none) or [0]",
    ]


def test_tegra_discovery_is_refused_with_the_reason_from_any_source() -> None:
    reason = (
        "flags.deviceDiscoveryStrategy: tegra is not supported: this plugin finds GPUs through NVML only, "
        "so a Tegra (Jetson) integrated GPU would not be advertised; use auto or nvml, or run NVIDIA's "
        "k8s-device-plugin on Tegra nodes"
    )
    with pytest.raises(ConfigError) as caught:
        load_config_text(None, env={"DEVICE_DISCOVERY_STRATEGY": "tegra"})
    assert [str(i) for i in caught.value.issues] == [f"DEVICE_DISCOVERY_STRATEGY: {reason}"]
    with pytest.raises(ConfigError) as caught:
        load_config_text(b"flags: {deviceDiscoveryStrategy: tegra}", "c.yaml")
    assert [str(i) for i in caught.value.issues] == [f"c.yaml:1: {reason}"]
    for accepted in ("auto", "nvml"):
        env = {"DEVICE_DISCOVERY_STRATEGY": accepted}
        assert load_config_text(None, env=env).flags.device_discovery_strategy == accepted


def test_health_check_env_vars() -> None:
    env = {"DP_DISABLE_HEALTHCHECKS": "XIDs", "DP_ENABLE_HEALTHCHECKS": "48,079"}
    plugin = load_config_text(None, env=env).flags.plugin
    assert plugin.disable_health_checks == ("xids",)
    assert plugin.enable_health_checks == ("48", "79")
    with pytest.raises(ConfigError) as caught:
        load_config_text(None, env={"DP_DISABLE_HEALTHCHECKS": "48,sometimes"})
    assert caught.value.issues[0].source == "DP_DISABLE_HEALTHCHECKS"
    assert caught.value.issues[0].path == "flags.plugin.disableHealthChecks[1]"


def test_cdi_env_vars_as_nvidia_names_them() -> None:
    """NVIDIA's values set CDI_FEATURE_FLAGS and CDI_DISABLE_HOOKS; both are comma lists."""
    env = {"CDI_FEATURE_FLAGS": "no-additional-gids-for-device-nodes, a-future-flag",
           "CDI_DISABLE_HOOKS": "all"}
    plugin = load_config_text(None, env=env).flags.plugin
    # Feature flags are free text: NVIDIA passes unknown ones through to the toolkit.
    assert plugin.cdi_feature_flags == ("no-additional-gids-for-device-nodes", "a-future-flag")
    assert plugin.cdi_disable_hooks == ("all",)
    assert load_config_text(None, env={}).flags.plugin.cdi_disable_hooks == ()


def test_cdi_settings_in_the_file_and_their_precedence() -> None:
    text = b"""\
version: v1
flags:
  plugin:
    cdiFeatureFlags: [disable-ipc-discoverer]
    cdiDisableHooks: [enable-cuda-compat, update-application-profile]
"""
    plugin = load_config_text(text, "c.yaml", env={}).flags.plugin
    assert plugin.cdi_feature_flags == ("disable-ipc-discoverer",)
    assert plugin.cdi_disable_hooks == ("enable-cuda-compat", "update-application-profile")
    env = {"CDI_DISABLE_HOOKS": "update-ldcache"}
    overrides = parse_flags("--cdi-disable-hooks=all")
    plugin = load_config_text(text, "c.yaml", env=env, overrides=overrides).flags.plugin
    assert plugin.cdi_disable_hooks == ("all",)
    assert load_config_text(text, "c.yaml", env=env).flags.plugin.cdi_disable_hooks == ("update-ldcache",)


@pytest.mark.parametrize(
    ("env", "path", "message"),
    [
        ({"CDI_DISABLE_HOOKS": "update-ldcache,create-symlink"}, "flags.plugin.cdiDisableHooks[1]",
         "is not an allowed value"),
        ({"CDI_DISABLE_HOOKS": "all,all"}, "flags.plugin.cdiDisableHooks", "lists the same item twice"),
    ],
)
def test_bad_cdi_hook_names_name_the_variable_and_the_hooks(env: dict[str, str], path: str,
                                                           message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config_text(None, env=env)
    (issue,) = caught.value.issues
    assert (issue.source, issue.path) == ("CDI_DISABLE_HOOKS", path)
    assert message in issue.message
    if "allowed" in message:
        assert issue.fix is not None and "create-symlinks" in issue.fix and "all" in issue.fix


def test_kubelet_paths_env() -> None:
    plugin = load_config_text(None, env={"DEVICE_PLUGIN_PATH": "/var/lib/k0s/device-plugins/"}).flags.plugin
    assert plugin.kubelet_socket_path == "/var/lib/k0s/device-plugins/kubelet.sock"
    plugin = load_config_text(None, env={"KUBELET_SOCKET": "/run/k.sock"}).flags.plugin
    assert plugin.kubelet_socket_path == "/run/k.sock"


def test_every_env_var_names_a_config_path() -> None:
    for name, path in ENV_VARS.items():
        if name == "CONFIG_FILE":
            assert path == ""
        else:
            assert node_at(path.split(".")) is not None, name


def test_bool_flags() -> None:
    assert parse_flags("--pass-device-specs") == {"flags.plugin.passDeviceSpecs": "true"}
    assert parse_flags("--fail-on-init-error=false") == {"flags.failOnInitError": "false"}
    assert parse_flags() == {}
    overrides = parse_flags("--fail-on-init-error=no", "--imex-required")
    config = load_config_text(None, env={"FAIL_ON_INIT_ERROR": "true"}, overrides=overrides)
    assert config.flags.fail_on_init_error is False
    assert config.imex.required is True


def test_flag_aliases() -> None:
    overrides = parse_flags(
        "--nvidia-driver-root=/d",
        "--nvidia-dev-root=/v",
        "--nvidia-ctk-path=/k",
        "--container-driver-root=/c",
    )
    flags = load_config_text(None, env={}, overrides=overrides).flags
    assert (flags.nvidia_driver_root, flags.nvidia_dev_root) == ("/d", "/v")
    assert (flags.plugin.nvidia_ctk_path, flags.plugin.container_driver_root) == ("/k", "/c")


def test_every_flag_parses() -> None:
    argv = [
        "--config-file=/c.yaml",
        "--mig-strategy=single",
        "--fail-on-init-error",
        "--pass-device-specs=1",
        "--device-list-strategy=envvar,cdi-annotations",
        "--device-id-strategy=index",
        "--driver-root=/d",
        "--dev-root=/v",
        "--mps-root=/m",
        "--gds-enabled",
        "--mofed-enabled=yes",
        "--gdrcopy-enabled=true",
        "--device-discovery-strategy=nvml",
        "--cdi-annotation-prefix=x.io/",
        "--nvidia-cdi-hook-path=/h",
        "--driver-root-ctr-path=/r",
        "--shared-devices-allocation-policy=packed",
        "--imex-channel-ids=0",
        "--imex-required=false",
        "--device-plugin-path=/p",
        "--kubelet-socket=/p/k.sock",
        "--cdi-feature-flags=disable-ipc-discoverer",
        "--cdi-disable-hooks=update-ldcache,create-symlinks",
    ]
    overrides = parse_flags(*argv)
    assert len(overrides) == 22
    config = load_config_text(None, env={}, overrides=overrides)
    plugin = config.flags.plugin
    assert plugin.device_list_strategy == ("envvar", "cdi-annotations")
    assert (plugin.cdi_annotation_prefix, plugin.shared_devices_allocation_policy) == ("x.io/", "packed")
    assert (config.flags.gds_enabled, config.flags.mofed_enabled, config.flags.gdrcopy_enabled) == (
        True,
        True,
        True,
    )
    assert config.imex.channel_ids == (0,)
    assert plugin.kubelet_socket_path == "/p/k.sock"
    assert plugin.cdi_feature_flags == ("disable-ipc-discoverer",)
    assert plugin.cdi_disable_hooks == ("update-ldcache", "create-symlinks")


def test_bad_flag_values_name_the_flag() -> None:
    overrides = parse_flags("--gds-enabled=often", "--mig-strategy=all")
    with pytest.raises(ConfigError) as caught:
        load_config_text(None, env={}, overrides=overrides)
    assert caught.value.issues == [
        ConfigIssue(
            "--gds-enabled",
            "flags.gdsEnabled",
            "not a boolean",
            value="'often'",
            fix="use true/false, 1/0 or yes/no",
        ),
        ConfigIssue(
            "--mig-strategy",
            "flags.migStrategy",
            "is not an allowed value",
            value="'all'",
            fix="expected one of none, single, mixed, dynamic",
        ),
    ]


def test_typed_overrides_and_unknown_paths() -> None:
    config = load_config_text(None, env={}, overrides={"flags.plugin.passDeviceSpecs": True})
    assert config.flags.plugin.pass_device_specs is True
    with pytest.raises(ConfigError) as caught:
        load_config_text(None, env={}, overrides={"flags.nope": "x"})
    assert (
        str(caught.value.issues[0])
        == "override flags.nope: flags.nope: not a config setting; check the setting's name"
    )
