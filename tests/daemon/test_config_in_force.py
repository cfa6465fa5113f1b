"""`Config in force: ...` without per-node config names what was read: the config file (from
--config-file, else CONFIG_FILE) or the built-in defaults, as `Configuration from ...` does before it."""

from __future__ import annotations

import logging

import pytest

from nvdp.config.loader import config_file_path
from nvdp.daemon.pernode.nodechoice import NodeConfigRule
from nvdp.daemon.pernode.nodeconfig import Chosen
from nvdp.daemon.skeleton import DaemonWork, Skeleton

LOG = logging.getLogger("test.config-in-force")


class Loads(DaemonWork):
    """Puts any config in force; begins and stops at once."""

    def switch(self, chosen: Chosen | None) -> None:
        return None

    def begin(self) -> int | None:
        return 0


def in_force(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("Config in force: ")]


@pytest.mark.parametrize(("config_file", "env", "said"), [
    (None, {}, "the built-in defaults (no config file)"),
    (None, {"CONFIG_FILE": "/etc/nvdp/config.yaml"}, "the config file /etc/nvdp/config.yaml"),
    ("/flags/config.yaml", {"CONFIG_FILE": "/env/config.yaml"}, "the config file /flags/config.yaml"),
    (None, {"CONFIG_FILE": ""}, "the built-in defaults (no config file)"),
])
def test_the_daemon_says_which_config_it_read(config_file: str | None, env: dict[str, str], said: str,
                                              caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    skeleton = Skeleton("test-daemon", LOG, env)
    assert skeleton.run(Loads(), config_file=config_file) == 0
    assert in_force(caplog) == [f"Config in force: {said}"]


def test_the_rule_and_the_loader_read_the_same_file() -> None:
    assert config_file_path(None, {"CONFIG_FILE": "/a"}) == "/a"
    assert config_file_path("/b", {"CONFIG_FILE": "/a"}) == "/b"
    assert config_file_path(None, {}) is None
    rule = NodeConfigRule(None, lambda *a, **k: None, LOG, config_file="/a")
    assert rule.describe() == "the config file /a"
