"""Which file and environment a daemon loads its config from, with and without per-node config: one rule
for the plugin, the DRA plugin, the MPS daemon, GPU feature discovery and the doctor."""

from __future__ import annotations

from pathlib import Path

from nvdp.config.loader import entry_in_force

ENV = {"CONFIG_FILE": "/config/config.yaml", "FAIL_ON_INIT_ERROR": "false"}


def test_without_per_node_config_the_file_and_environment_stay() -> None:
    assert entry_in_force("/flag.yaml", ENV, None, per_node=False) == ("/flag.yaml", ENV)
    assert entry_in_force(None, ENV, Path("/available-configs/ts"), per_node=False) == (None, ENV)


def test_a_chosen_entry_replaces_the_flag_and_config_file() -> None:
    path, env = entry_in_force("/flag.yaml", ENV, Path("/available-configs/ts"), per_node=True)
    assert path == "/available-configs/ts"
    assert env == {"FAIL_ON_INIT_ERROR": "false"}


def test_an_entry_without_a_file_reads_no_file_not_config_file() -> None:
    # The `empty` fallback: the defaults, never the ConfigMap's default file through CONFIG_FILE (which
    # GPU feature discovery used to read here while the plugin did not).
    assert entry_in_force("/flag.yaml", ENV, None, per_node=True) == (None, {"FAIL_ON_INIT_ERROR": "false"})
