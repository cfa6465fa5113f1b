"""What the loader turns valid files into, and how it reports problems."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from nvdp.config.loader import MAX_CONFIG_BYTES, ConfigError, ConfigIssue, load_config, load_config_text
from nvdp.config.model import Config, DeviceSelection, ReplicatedResource

VALID = Path(__file__).parent / "valid"


def load(name: str) -> Config:
    return load_config(str(VALID / name), env={})


def test_seed_004_mps_config() -> None:
    config = load("seed-004-mps.yaml")
    mps = config.sharing.mps
    assert mps is not None
    assert mps.resources == (ReplicatedResource(name="nvidia.com/gpu", replicas=10),)
    # NVIDIA's historical MPS default, unlike time-slicing's.
    assert mps.fail_requests_greater_than_one is True
    assert config.sharing.strategy == "mps"
    assert config.flags.mps_root == "/run/nvidia/mps"


def test_time_slicing_defaults_to_accepting_larger_requests() -> None:
    ts = load("time-slicing.yaml").sharing.time_slicing
    assert ts is not None and ts.fail_requests_greater_than_one is False


def test_rename_by_default_appends_shared() -> None:
    ts = load("time-slicing-rename-by-default.yaml").sharing.time_slicing
    assert ts is not None
    assert ts.rename_by_default is True
    assert ts.fail_requests_greater_than_one is True
    assert [r.rename for r in ts.resources] == ["nvidia.com/gpu.shared"]
    mps = load("mps-rename-by-default.yaml").sharing.mps
    assert mps is not None and mps.fail_requests_greater_than_one is False
    assert [r.rename for r in mps.resources] == ["nvidia.com/gpu.shared"]


def test_rename_and_devices_are_kept() -> None:
    sharing = load("devices-forms.yaml").sharing
    assert sharing.time_slicing is not None and sharing.mps is not None
    first, second, third = sharing.time_slicing.resources
    assert first.name == "nvidia.com/gpu"
    assert first.rename == "nvidia.com/gpu-small"
    assert first.devices == DeviceSelection(
        all=False, refs=("0", "1", "0:1", "GPU-8f2a4e0c-1b7d-4c2e-9d3a-5e6f7a8b9c0d")
    )
    assert second.devices == DeviceSelection(all=False, count=2)
    assert second.replicas == 1
    assert third.devices == DeviceSelection()
    (mig,) = sharing.mps.resources
    assert mig.name == "nvidia.com/mig-1g.10gb"
    assert mig.devices.refs[1] == "MIG-GPU-8f2a4e0c-1b7d-4c2e-9d3a-5e6f7a8b9c0d/1/0"


def test_replicas_one_is_valid_and_not_shared() -> None:
    config = load("imex-empty-replicas-one.yaml")
    assert config.sharing.strategy == "none"


def test_device_list_strategy_string_and_list_forms() -> None:
    assert load("flags-string-strategy.yaml").flags.plugin.device_list_strategy == ("envvar",)
    plugin = load("flags-list-strategy.yaml").flags.plugin
    assert plugin.device_list_strategy == ("envvar", "cdi-annotations")


def test_every_flag_is_read() -> None:
    flags = load("flags-list-strategy.yaml").flags
    assert (flags.mig_strategy, flags.fail_on_init_error, flags.nvidia_driver_root) == (
        "single",
        False,
        "/run/nvidia/driver",
    )
    assert (flags.gdrcopy_enabled, flags.gds_enabled, flags.mofed_enabled) == (True, True, True)
    assert flags.use_node_feature_api is False
    assert flags.device_discovery_strategy == "nvml"
    assert flags.dev_root == "/"
    plugin = flags.plugin
    assert plugin.pass_device_specs is True
    assert plugin.device_id_strategy == "index"
    assert plugin.nvidia_ctk_path == "/usr/local/nvidia/toolkit/nvidia-ctk"
    assert plugin.shared_devices_allocation_policy == "packed"
    assert plugin.kubelet_socket_path == "/var/lib/k0s/kubelet/device-plugins/kubelet.sock"
    assert plugin.disable_health_checks == ("48", "79")
    assert plugin.enable_health_checks == ("31", "43")
    assert flags.gfd.sleep_interval == "30s"
    assert flags.gfd.no_timestamp is True


def test_imex_and_json_files() -> None:
    config = load("flags-list-strategy.yaml")
    assert (config.imex.channel_ids, config.imex.required) == ((0,), True)
    json_config = load("gfd-sleep-nanoseconds.json")
    assert json_config.flags.gfd.sleep_interval == "60000000000ns"
    assert json_config.flags.plugin.disable_health_checks == ("all",)
    assert json_config.flags.plugin.device_list_strategy == ("volume-mounts",)


def test_resource_names_are_qualified() -> None:
    resources = load("resources-names.yaml").resources
    assert [(r.pattern, r.name) for r in resources.gpus] == [
        ("Tesla T4", "nvidia.com/tesla-t4"),
        ("*", "nvidia.com/gpu"),
    ]
    assert [r.name for r in resources.mig] == ["nvidia.com/mig-small"]


def test_yaml_merge_keys_work() -> None:
    ts = load("anchors.yaml").sharing.time_slicing
    assert ts is not None
    assert [(r.name, r.replicas) for r in ts.resources] == [
        ("nvidia.com/gpu", 4),
        ("nvidia.com/mig-1g.5gb", 4),
    ]


def test_empty_keys_count_as_not_set() -> None:
    config = load("null-sections.yaml")
    assert config.flags == Config().flags
    assert config.imex == Config().imex
    assert config.sharing.mps is None
    assert config.sharing.time_slicing is not None
    assert config.sharing.time_slicing.resources == (ReplicatedResource(name="nvidia.com/gpu", replicas=2),)
    with_env = load_config(str(VALID / "null-sections.yaml"), env={"MIG_STRATEGY": "single"})
    assert with_env.flags.mig_strategy == "single"


def test_no_file_gives_defaults() -> None:
    assert load_config(None, env={}) == Config()
    assert load("empty.yaml") == Config(source=str(VALID / "empty.yaml"))


def test_missing_file_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config("/nonexistent/config.yaml", env={})
    assert caught.value.issues == [
        ConfigIssue(
            "/nonexistent/config.yaml",
            "",
            "cannot read the config file: No such file or directory",
            fix="check the path given by --config-file",
        )
    ]


def test_config_file_env_names_the_file() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(env={"CONFIG_FILE": "/nonexistent/c.yaml"})
    assert caught.value.issues[0].fix == "check the path given by CONFIG_FILE"
    config = load_config(env={"CONFIG_FILE": str(VALID / "seed-004-mps.yaml")})
    assert config.sharing.mps is not None


def test_error_text_lists_every_issue() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config_text(b"version: v3\nflags: {migStrategy: x}\n", "c.yaml", env={})
    assert str(caught.value) == (
        "invalid configuration (2 problems):\n"
        "  c.yaml:1: version: is not an allowed value (got 'v3'); expected one of v1, \"\"\n"
        "  c.yaml:2: flags.migStrategy: is not an allowed value (got 'x'); "
        "expected one of none, single, mixed, dynamic"
    )


def test_issue_fields() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config_text(
            "sharing:\n  mps:\n    resources:\n    - name: gpu\n      replicas: 0\n", "c.yaml", env={}
        )
    (issue,) = caught.value.issues
    assert issue == ConfigIssue(
        source="c.yaml",
        path="sharing.mps.resources[0].replicas",
        message="must be at least 1",
        line=5,
        value="0",
        fix="expected an integer from 1 to 1024",
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: 1\n---\nb: 2\n", "not valid YAML: expected a single document in the stream"),
        ("42\n", "the document must be a mapping, not a number"),
        ("'text'\n", "the document must be a mapping, not a string"),
        ("!!python/object:os.system {}\n", "not valid YAML: could not determine a constructor"),
    ],
)
def test_documents_that_are_not_configs(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config_text(text, "c.yaml", env={})
    (issue,) = caught.value.issues
    assert issue.message.startswith(message)


def test_alias_bombs_are_refused() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 7)]
    with pytest.raises(ConfigError) as caught:
        load_config_text("\n".join(lines), "c.yaml", env={})
    assert caught.value.issues[0].message.startswith("the document expands to ")
    assert "through YAML aliases" in caught.value.issues[0].message
    assert str(caught.value.issues[0].fix).startswith("use fewer YAML aliases")


def test_a_long_list_without_aliases_is_not_blamed_on_aliases() -> None:
    text = "version: v1\nresources:\n  gpus:\n" + "  - 1\n" * 100_001
    with pytest.raises(ConfigError) as caught:
        load_config_text(text, "c.yaml", env={})
    (issue,) = caught.value.issues
    assert issue.message.startswith("the document has 100008 values")
    assert "alias" not in f"{issue.message} {issue.fix}"


def fifo(tmp: Path) -> str:
    os.mkfifo(tmp / "fifo")
    return str(tmp / "fifo")


@pytest.mark.parametrize(("kind", "make"), [
    ("a device", lambda tmp: "/dev/zero"),
    ("a FIFO", fifo),
    ("a directory", str),
])
def test_config_files_that_never_end_or_block_are_refused(tmp_path: Path, kind: str,
                                                          make: Callable[[Path], str]) -> None:
    path = make(tmp_path)
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    (issue,) = caught.value.issues
    assert issue.message == f"cannot read the config file: it is not a regular file ({kind})"


def test_an_oversized_config_file_is_refused_before_parsing(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("#" * (MAX_CONFIG_BYTES + 1))
    with pytest.raises(ConfigError) as caught:
        load_config(str(big), env={})
    assert caught.value.issues[0].message == (
        "cannot read the config file: it is larger than 1024 KiB, which no config needs")


@pytest.mark.parametrize("replicas", [1025, 10**6, 10**22])
def test_replicas_are_bounded_with_the_reason(replicas: int) -> None:
    text = f"version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n" \
           f"      replicas: {replicas}\n"
    with pytest.raises(ConfigError) as caught:
        load_config_text(text, "c.yaml", env={})
    (issue,) = caught.value.issues
    assert issue.message.startswith("must be at most 1024: every replica is one device in each ListAndWatch")
    assert issue.fix == "expected an integer from 1 to 1024"
    ok = load_config_text(text.replace(str(replicas), "1024"), "c.yaml", env={})
    assert ok.sharing.time_slicing is not None and ok.sharing.time_slicing.resources[0].replicas == 1024
