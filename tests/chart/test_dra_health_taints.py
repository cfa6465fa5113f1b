"""The effect of a down GPU's device taints: flags.plugin.healthTaintEffect per config entry (env
HEALTH_TAINT_EFFECT, flag --health-taint-effect) and the chart value dra.healthTaintEffect. An unknown
effect is refused at install time and at start, with the field named."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from chart_helm import CHART_DIR, container, env, render, render_error

from nvdp.config.issues import ConfigError
from nvdp.config.loader import load_config_text

DRA = "nvdp-nvidia-device-plugin-dra-plugin"
DRA_CTR = "nvidia-dra-plugin-ctr"
WITH_DRA = {"dra": {"enabled": True}}
SCHEMA_ERROR = "values don't meet the specifications of the schema(s) in the following chart(s):\n"


def dra_env(values: dict[str, Any]) -> dict[str, str | None]:
    return env(container(render(values).one("DaemonSet", DRA), DRA_CTR))


def test_by_default_each_config_entry_chooses_and_the_default_is_no_schedule() -> None:
    assert yaml.safe_load((CHART_DIR / "values.yaml").read_text())["dra"]["healthTaintEffect"] is None
    assert "HEALTH_TAINT_EFFECT" not in dra_env(WITH_DRA)
    assert load_config_text(None, env={}).flags.plugin.health_taint_effect == "NoSchedule"
    entry = "version: v1\nflags:\n  plugin:\n    healthTaintEffect: NoExecute\n"
    assert load_config_text(entry, env={}).flags.plugin.health_taint_effect == "NoExecute"
    render({**WITH_DRA, "config": {"map": {"evict": entry}}})
    render({**WITH_DRA, "config": {"map": {"evict": yaml.safe_load(entry)}}})


def test_the_chart_value_reaches_the_dra_plugin_for_every_node() -> None:
    assert dra_env({"dra": {"enabled": True, "healthTaintEffect": "NoExecute"}})["HEALTH_TAINT_EFFECT"] == \
        "NoExecute"
    assert load_config_text(None, env={"HEALTH_TAINT_EFFECT": "NoExecute"}).flags.plugin.health_taint_effect \
        == "NoExecute"


def test_an_unknown_chart_value_is_refused_at_install_naming_it() -> None:
    error = render_error({"dra": {"enabled": True, "healthTaintEffect": "Evict"}})
    assert error.startswith(SCHEMA_ERROR)
    assert "- at '/dra/healthTaintEffect'" in error


def test_an_unknown_effect_in_a_config_entry_is_refused_at_install_naming_the_field() -> None:
    entry = {"version": "v1", "flags": {"plugin": {"healthTaintEffect": "None"}}}
    as_object = render_error({**WITH_DRA, "config": {"map": {"cfg": entry}}})
    assert "- at '/config/map/cfg/flags/plugin/healthTaintEffect'" in as_object
    as_string = render_error({**WITH_DRA, "config": {"map": {"cfg": yaml.safe_dump(entry)}}})
    assert "config.map.cfg (a string entry) does not meet the config schema" in as_string
    assert "/flags/plugin/healthTaintEffect" in as_string


@pytest.mark.parametrize(
    ("text", "environ", "where"),
    [("flags:\n  plugin:\n    healthTaintEffect: Evict\n", {}, "<config>:3: flags.plugin.healthTaintEffect"),
     (None, {"HEALTH_TAINT_EFFECT": "noexecute"}, "HEALTH_TAINT_EFFECT: flags.plugin.healthTaintEffect")],
)  # fmt: skip
def test_an_unknown_effect_is_refused_at_start_naming_the_field(text: str | None, environ: dict[str, str],
                                                               where: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config_text(text, env=environ)
    assert f"{where}: is not an allowed value" in str(err.value)
    assert "expected one of NoSchedule, NoExecute" in str(err.value)
