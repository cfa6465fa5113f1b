"""devicePlugin.healthRecovery: the health authority (device plugin, or the DRA plugin) gets the three
HEALTH_* settings and writes health.json under stateDir; GFD reads it there, read-only. Bad values are
refused at install time, each with a message naming the value and what to set."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_helm import (
    CHART_DIR,
    Manifest,
    Rendered,
    container,
    env,
    merge_values,
    render,
    render_error,
    values_file,
)
from test_render import ALL_VERSIONS, assert_valid

from nvdp.config import loader
from nvdp.gfd.options import GFD_ENV_VARS

DATA = Path(__file__).parent / "data"
PLUGIN = "nvdp-nvidia-device-plugin"
DRA = f"{PLUGIN}-dra-plugin"
GFD = f"{PLUGIN}-gpu-feature-discovery"
CONTAINERS = {
    PLUGIN: "nvidia-device-plugin-ctr",
    DRA: "nvidia-dra-plugin-ctr",
    GFD: "gpu-feature-discovery-ctr",
}
STATE_DIR = "/run/nvidia/nvdp"
HEALTH = ("HEALTH_RECOVERY_AFTER", "HEALTH_FLAP_LIMIT", "HEALTH_STATE_DIR")
WITH_GFD = {"gfd": {"enabled": True}}
WITH_DRA = {"dra": {"enabled": True}, "gfd": {"enabled": True}}
SCHEMA_ERROR = "values don't meet the specifications of the schema(s) in the following chart(s):\n"
AFTER_FORMS = (
    "never, or a duration greater than zero such as 30s, 5m, 1h30m or 500ms, with a unit on every number "
    "(ns, us, µs, ms, s, m or h)"
)


def health(**values: Any) -> dict[str, Any]:
    return {"devicePlugin": {"healthRecovery": values}}


def ctr(rendered: Rendered, daemonset: str) -> Manifest:
    return container(rendered.one("DaemonSet", daemonset), CONTAINERS[daemonset])


def health_env(rendered: Rendered, daemonset: str) -> dict[str, str | None]:
    return {k: v for k, v in env(ctr(rendered, daemonset)).items() if k in HEALTH}


def mounts(rendered: Rendered, daemonset: str) -> list[Manifest]:
    return [m for m in ctr(rendered, daemonset).get("volumeMounts", []) if m["name"] == "health-state"]


def volumes(rendered: Rendered, daemonset: str) -> list[Manifest]:
    spec = rendered.one("DaemonSet", daemonset)["spec"]["template"]["spec"]
    return [v for v in spec.get("volumes", []) if v["name"] == "health-state"]


def test_defaults_in_values_yaml() -> None:
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert values["devicePlugin"]["healthRecovery"] == {"after": "5m", "flapLimit": 3, "stateDir": STATE_DIR}


@pytest.mark.parametrize(("values", "authority"), [(WITH_GFD, PLUGIN), (WITH_DRA, DRA)])
def test_the_health_authority_gets_the_settings_and_a_writable_state_dir(
    values: dict[str, Any], authority: str
) -> None:
    rendered = render(values)
    assert health_env(rendered, authority) == {
        "HEALTH_RECOVERY_AFTER": "5m",
        "HEALTH_FLAP_LIMIT": "3",
        "HEALTH_STATE_DIR": STATE_DIR,
    }
    assert mounts(rendered, authority) == [{"name": "health-state", "mountPath": STATE_DIR}]
    assert volumes(rendered, authority) == [
        {"name": "health-state", "hostPath": {"path": STATE_DIR, "type": "DirectoryOrCreate"}}
    ]


@pytest.mark.parametrize("values", [WITH_GFD, WITH_DRA])
def test_gfd_reads_the_same_directory_read_only(values: dict[str, Any]) -> None:
    rendered = render(values)
    assert health_env(rendered, GFD) == {"HEALTH_STATE_DIR": STATE_DIR}
    assert mounts(rendered, GFD) == [{"name": "health-state", "mountPath": STATE_DIR, "readOnly": True}]
    assert volumes(rendered, GFD) == [
        {"name": "health-state", "hostPath": {"path": STATE_DIR, "type": "DirectoryOrCreate"}}
    ]


def test_set_values_follow_through_to_every_daemonset() -> None:
    values = merge_values(WITH_GFD, health(after="never", flapLimit=10, stateDir="/var/lib/nvdp/health/"))
    rendered = render(values)
    assert health_env(rendered, PLUGIN) == {
        "HEALTH_RECOVERY_AFTER": "never",
        "HEALTH_FLAP_LIMIT": "10",
        "HEALTH_STATE_DIR": "/var/lib/nvdp/health",
    }
    for daemonset in (PLUGIN, GFD):
        (mount,) = mounts(rendered, daemonset)
        (volume,) = volumes(rendered, daemonset)
        assert mount["mountPath"] == volume["hostPath"]["path"] == "/var/lib/nvdp/health"
    dra = render(merge_values(WITH_DRA, health(after="1h30m", flapLimit=1)))
    assert health_env(dra, DRA)["HEALTH_RECOVERY_AFTER"] == "1h30m"
    assert health_env(dra, DRA)["HEALTH_FLAP_LIMIT"] == "1"


@pytest.mark.parametrize("values", [WITH_GFD, WITH_DRA])
def test_empty_state_dir_means_no_volume_and_no_variable(values: dict[str, Any]) -> None:
    rendered = render(merge_values(values, health(stateDir="")))
    authority = DRA if values is WITH_DRA else PLUGIN
    assert health_env(rendered, authority) == {"HEALTH_RECOVERY_AFTER": "5m", "HEALTH_FLAP_LIMIT": "3"}
    assert health_env(rendered, GFD) == {}
    for daemonset in (authority, GFD):
        assert mounts(rendered, daemonset) == []
        assert volumes(rendered, daemonset) == []


def test_null_leaves_the_plugins_defaults() -> None:
    rendered = render(merge_values(WITH_GFD, health(after=None, flapLimit=None)))
    assert health_env(rendered, PLUGIN) == {"HEALTH_STATE_DIR": STATE_DIR}
    rendered = render({"devicePlugin": {"healthRecovery": None}, **WITH_GFD})
    assert health_env(rendered, PLUGIN) == health_env(rendered, GFD) == {}
    assert volumes(rendered, PLUGIN) == volumes(rendered, GFD) == []


@pytest.mark.parametrize("values", [WITH_GFD, WITH_DRA], ids=["device-plugin", "dra"])
def test_the_daemons_accept_what_the_chart_renders(values: dict[str, Any]) -> None:
    rendered = render(merge_values(values, health(after="90s", flapLimit=4)))
    authority = DRA if values is WITH_DRA else PLUGIN
    plugin_env = {k: v for k, v in env(ctr(rendered, authority)).items() if v is not None}
    config = loader.load_config_text(None, "chart", env=plugin_env)
    assert (config.flags.plugin.health_recovery_after, config.flags.plugin.health_flap_limit) == ("90s", 4)
    assert config.flags.plugin.health_state_dir == STATE_DIR
    gfd_env = {k: v for k, v in env(ctr(rendered, GFD)).items() if v is not None}
    gfd_config = loader.load_config_text(None, "chart", env=gfd_env, env_vars=GFD_ENV_VARS)
    assert gfd_config.flags.plugin.health_state_dir == STATE_DIR


def test_rendered_daemonsets_are_valid_kubernetes() -> None:
    assert_valid(render(merge_values(WITH_GFD, health(after="never"))).find("DaemonSet"), ALL_VERSIONS)
    assert_valid(render(merge_values(WITH_GFD, health(stateDir=""))).find("DaemonSet"), ALL_VERSIONS)
    assert_valid(render(WITH_DRA).find("DaemonSet"), ALL_VERSIONS)


def test_nvidia_values_install_with_the_defaults() -> None:
    rendered = render(values_file(DATA / "nvidia-format-values.yaml"))
    assert health_env(rendered, PLUGIN)["HEALTH_RECOVERY_AFTER"] == "5m"
    assert health_env(rendered, GFD) == {"HEALTH_STATE_DIR": STATE_DIR}


@pytest.mark.parametrize(
    ("after", "message"),
    [
        ("-1s", f"'devicePlugin.healthRecovery.after' is \"-1s\", which is not a recovery delay. Set it to "
                f"{AFTER_FORMS}; \"never\" keeps an Unhealthy GPU down until the plugin restarts"),
        ("abc", "'devicePlugin.healthRecovery.after' is \"abc\", which is not a recovery delay. Set it to "),
        ("0", "'devicePlugin.healthRecovery.after' is \"0\", which is not a recovery delay. Set it to "),
        ("5", "'devicePlugin.healthRecovery.after' is \"5\", which is not a recovery delay. Set it to "),
        ("0s", "'devicePlugin.healthRecovery.after' is \"0s\", a duration of zero: a GPU would be re-checked "
               f"while its fault goes on. Set it to {AFTER_FORMS}."),
        (5, f"'devicePlugin.healthRecovery.after' is 5, a number without a unit. Set it to {AFTER_FORMS}, "
            "as a string: after: \"5m\" in a values file, "
            "or --set-string devicePlugin.healthRecovery.after=5m."),
        (0, "'devicePlugin.healthRecovery.after' is 0, a number without a unit."),
    ],
)  # fmt: skip
def test_a_bad_recovery_delay_is_refused_naming_the_value_and_the_fix(after: object, message: str) -> None:
    error = render_error(health(after=after))
    assert message in error
    assert not error.startswith(SCHEMA_ERROR)


@pytest.mark.parametrize("flap_limit", [0, -3])
def test_a_flap_limit_below_one_is_refused_naming_the_value_and_the_fix(flap_limit: int) -> None:
    assert (
        f"'devicePlugin.healthRecovery.flapLimit' is {flap_limit}, but it must be an integer of at least 1: "
        "a GPU that turns Unhealthy more than flapLimit times within an hour stays down. Set it to 1 or more "
        "(default 3)."
    ) in render_error(health(flapLimit=flap_limit))


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (health(flapLimit="3"), "- at '/devicePlugin/healthRecovery/flapLimit': got string, want integer"),
        (health(flapLimit=2.5), "- at '/devicePlugin/healthRecovery/flapLimit': got number, want integer"),
        (health(stateDir="run/nvdp"),
         "- at '/devicePlugin/healthRecovery/stateDir': 'run/nvdp' does not match pattern '^(/.*)?$'"),
        (health(after=True), "- at '/devicePlugin/healthRecovery/after': got boolean, want number or string"),
    ],
)  # fmt: skip
def test_the_values_schema_refuses_wrong_types_and_relative_dirs(
    values: dict[str, Any], message: str
) -> None:
    error = render_error(values)
    assert error.startswith(SCHEMA_ERROR)
    assert message in error


@pytest.mark.parametrize(
    "plugin",
    [{"healthRecoveryAfter": "0s"}, {"healthRecoveryAfter": "-1s"}, {"healthFlapLimit": 0},
     {"healthStateDir": "relative"}],
)  # fmt: skip
def test_config_entries_get_the_same_checks_as_objects_and_as_strings(plugin: dict[str, Any]) -> None:
    entry = {"version": "v1", "flags": {"plugin": plugin}}
    as_object = render_error({"config": {"map": {"cfg": entry}}})
    problem = next(line for line in as_object.splitlines() if line.startswith("- at '"))
    assert problem.startswith("- at '/config/map/cfg/flags/plugin/health")
    as_string = render_error({"config": {"map": {"cfg": yaml.safe_dump(entry)}}})
    assert f"config.map.cfg (a string entry) does not meet the config schema:\n{problem}\n" in as_string


def test_valid_config_entries_are_accepted() -> None:
    entry = "version: v1\nflags:\n  plugin:\n    healthRecoveryAfter: never\n    healthFlapLimit: 1\n"
    render({"config": {"map": {"cfg": entry}}})
    render({"config": {"map": {"cfg": yaml.safe_load(entry)}}})
