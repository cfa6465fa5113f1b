"""The health-recovery settings: flags.plugin.healthRecoveryAfter, healthFlapLimit and healthStateDir.

Defaults, the three ways to set them (config file, HEALTH_* variables, --health-* flags), the values
refused with the loader's message, and recovery_after_seconds agreeing with the schema.
"""

from __future__ import annotations

import argparse
import math

import pytest
import yaml

from nvdp.config import durations
from nvdp.config.document import config_to_document
from nvdp.config.durations import RECOVERY_AFTER_FORMS, parse_duration, recovery_after_seconds
from nvdp.config.flags import add_config_arguments, env_name, overrides_from_args
from nvdp.config.loader import ConfigError, load_config_text
from nvdp.config.model import Config, PluginFlags
from nvdp.config.quickcheck import verdict
from nvdp.config.schema import load_schema, node_at, validator
from nvdp.config.sources import ENV_VARS, FLAG_PATHS

AFTER = "flags.plugin.healthRecoveryAfter"
FORMS = (
    "never, or a duration greater than zero such as 30s, 5m, 1h30m or 500ms; "
    "every number needs its unit (ns, us, µs, ms, s, m or h): 5m, not 5"
)


def flags(*argv: str) -> dict[str, object]:
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    return overrides_from_args(parser.parse_args(list(argv)))


def refusal(
    text: str | None = None, env: dict[str, str] | None = None, overrides: dict[str, object] | None = None
) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config_text(text, "c.yaml", env=env or {}, overrides=overrides)
    return str(caught.value)


def test_defaults() -> None:
    plugin = load_config_text(None, env={}).flags.plugin
    assert (plugin.health_recovery_after, plugin.health_flap_limit, plugin.health_state_dir) == ("5m", 3, "")
    assert PluginFlags() == plugin
    for key, default in (("healthRecoveryAfter", "5m"), ("healthFlapLimit", 3), ("healthStateDir", "")):
        node = node_at(("flags", "plugin", key))
        assert node is not None and node["default"] == default


def test_names_of_the_contract() -> None:
    assert {name: ENV_VARS[name] for name in ENV_VARS if name.startswith("HEALTH_")} == {
        "HEALTH_RECOVERY_AFTER": "flags.plugin.healthRecoveryAfter",
        "HEALTH_FLAP_LIMIT": "flags.plugin.healthFlapLimit",
        "HEALTH_STATE_DIR": "flags.plugin.healthStateDir",
        "HEALTH_TAINT_EFFECT": "flags.plugin.healthTaintEffect",
    }
    assert {flag: FLAG_PATHS[flag] for flag in FLAG_PATHS if flag.startswith("--health-")} == {
        "--health-recovery-after": "flags.plugin.healthRecoveryAfter",
        "--health-flap-limit": "flags.plugin.healthFlapLimit",
        "--health-state-dir": "flags.plugin.healthStateDir",
        "--health-taint-effect": "flags.plugin.healthTaintEffect",
    }


def test_config_file_form() -> None:
    text = "version: v1\nflags:\n  plugin:\n    healthRecoveryAfter: 1h30m\n    healthFlapLimit: 5\n" \
           "    healthStateDir: /run/nvidia/nvdp\n"  # fmt: skip
    plugin = load_config_text(text, "c.yaml", env={}).flags.plugin
    assert (plugin.health_recovery_after, plugin.health_flap_limit, plugin.health_state_dir) == (
        "1h30m", 5, "/run/nvidia/nvdp",
    )  # fmt: skip


def test_environment_form_converts_the_integer() -> None:
    env = {"HEALTH_RECOVERY_AFTER": "never", "HEALTH_FLAP_LIMIT": " 7 ", "HEALTH_STATE_DIR": "/var/lib/nvdp"}
    plugin = load_config_text(None, env=env).flags.plugin
    assert (plugin.health_recovery_after, plugin.health_flap_limit, plugin.health_state_dir) == (
        "never", 7, "/var/lib/nvdp",
    )  # fmt: skip


def test_empty_variables_count_as_unset() -> None:
    env = {"HEALTH_RECOVERY_AFTER": "", "HEALTH_FLAP_LIMIT": "", "HEALTH_STATE_DIR": ""}
    assert load_config_text(None, env=env).flags.plugin == PluginFlags()


def test_flag_form_beats_environment_and_file() -> None:
    text = "flags:\n  plugin:\n    healthRecoveryAfter: 10m\n    healthFlapLimit: 2\n"
    env = {"HEALTH_RECOVERY_AFTER": "20m", "HEALTH_FLAP_LIMIT": "4", "HEALTH_STATE_DIR": "/env"}
    overrides = flags("--health-recovery-after=500ms", "--health-flap-limit", "1", "--health-state-dir=/flag")
    plugin = load_config_text(text, "c.yaml", env=env, overrides=overrides).flags.plugin
    assert (plugin.health_recovery_after, plugin.health_flap_limit, plugin.health_state_dir) == (
        "500ms", 1, "/flag",
    )  # fmt: skip
    assert load_config_text(text, "c.yaml", env=env).flags.plugin.health_recovery_after == "20m"


def test_shown_document_has_the_settings_and_loads_back() -> None:
    config = load_config_text(None, env={"HEALTH_RECOVERY_AFTER": "30s", "HEALTH_FLAP_LIMIT": "2"})
    doc = config_to_document(config)
    keys = ("healthRecoveryAfter", "healthFlapLimit", "healthStateDir")
    assert {k: doc["flags"]["plugin"][k] for k in keys} == {
        "healthRecoveryAfter": "30s",
        "healthFlapLimit": 2,
        "healthStateDir": "",
    }
    assert load_config_text(yaml.safe_dump(doc), "shown.yaml", env={}).flags == config.flags
    assert config_to_document(Config())["flags"]["plugin"]["healthRecoveryAfter"] == "5m"


# The three refused inputs of the contract, plus a bare number and zero with a unit.
@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("-1s", f"is not valid (got '-1s'); expected {FORMS}"),
        ("abc", f"is not valid (got 'abc'); expected {FORMS}"),
        ("0", f"is not valid (got '0'); expected {FORMS}"),
        ("5", f"is not valid (got '5'); expected {FORMS}"),
        ("0s", f"must not be a duration of zero (got '0s'); expected {FORMS}"),
        ("0h0.0m", f"must not be a duration of zero (got '0h0.0m'); expected {FORMS}"),
        ("infinite", f"is not valid (got 'infinite'); expected {FORMS}"),
    ],
)
def test_refused_recovery_delays_name_the_source_and_the_accepted_forms(value: str, message: str) -> None:
    assert refusal(env={"HEALTH_RECOVERY_AFTER": value}) == (
        f"invalid configuration (1 problem):\n  HEALTH_RECOVERY_AFTER: {AFTER}: {message}"
    )
    assert refusal(overrides=flags(f"--health-recovery-after={value}")) == (
        f"invalid configuration (1 problem):\n  --health-recovery-after: {AFTER}: {message}"
    )
    assert refusal(f"flags:\n  plugin:\n    healthRecoveryAfter: '{value}'\n") == (
        f"invalid configuration (1 problem):\n  c.yaml:3: {AFTER}: {message}"
    )


def test_a_number_in_the_file_is_the_wrong_type() -> None:
    assert refusal("flags:\n  plugin:\n    healthRecoveryAfter: 5\n") == (
        "invalid configuration (1 problem):\n"
        f"  c.yaml:3: {AFTER}: has the wrong type (got 5); expected {FORMS}"
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"HEALTH_FLAP_LIMIT": "0"}, "HEALTH_FLAP_LIMIT: flags.plugin.healthFlapLimit: must be at least 1 "
         "(got 0); expected an integer >= 1"),
        ({"HEALTH_FLAP_LIMIT": "three"}, "HEALTH_FLAP_LIMIT: flags.plugin.healthFlapLimit: not an integer "
         "(got 'three'); expected an integer >= 1"),
        ({"HEALTH_FLAP_LIMIT": "2.5"}, "HEALTH_FLAP_LIMIT: flags.plugin.healthFlapLimit: not an integer "
         "(got '2.5'); expected an integer >= 1"),
        ({"HEALTH_STATE_DIR": "run/nvdp"}, "HEALTH_STATE_DIR: flags.plugin.healthStateDir: is not valid "
         "(got 'run/nvdp'); expected an absolute path such as /run/nvidia/nvdp, or empty for none"),
    ],
)  # fmt: skip
def test_refused_flap_limits_and_state_dirs(env: dict[str, str], message: str) -> None:
    assert refusal(env=env) == f"invalid configuration (1 problem):\n  {message}"


def test_flap_limit_in_the_file_must_be_at_least_one() -> None:
    assert refusal("flags:\n  plugin:\n    healthFlapLimit: 0\n") == (
        "invalid configuration (1 problem):\n"
        "  c.yaml:3: flags.plugin.healthFlapLimit: must be at least 1 (got 0); expected an integer >= 1"
    )


def test_every_problem_is_listed_together() -> None:
    env = {"HEALTH_RECOVERY_AFTER": "abc", "HEALTH_FLAP_LIMIT": "0", "HEALTH_STATE_DIR": "x"}
    assert refusal(env=env).splitlines()[0] == "invalid configuration (3 problems):"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("never", None), ("30s", 30.0), ("5m", 300.0), ("1h30m", 5400.0), ("500ms", 0.5), ("1.5s", 1.5),
     ("2us", 2e-6), ("2µs", 2e-6), ("100ns", 1e-7), ("0m1s", 1.0)],
)  # fmt: skip
def test_recovery_after_seconds(text: str, seconds: float | None) -> None:
    result = recovery_after_seconds(text)
    assert result == seconds if seconds is None else math.isclose(result or 0, seconds)


REFUSED = ["0", "0s", "0.0ms", "0h0m0s", "-1s", "+1s", "abc", "5", "1.5", "infinite", "", " 5m", "5m ",
           "5M", "1d", "Never", "never5m", "5mnever"]  # fmt: skip
ACCEPTED = ["never", "1ns", "1us", "1µs", "1ms", "1s", "1m", "1h", "1h30m", "0h1m", "0.5s", "1.s", "5000ns"]


@pytest.mark.parametrize("text", REFUSED)
def test_recovery_after_seconds_refuses_naming_the_accepted_forms(text: str) -> None:
    with pytest.raises(ValueError) as caught:
        recovery_after_seconds(text)
    assert str(caught.value) == f"healthRecoveryAfter {text!r} is not valid: use {FORMS}"


@pytest.mark.parametrize("text", REFUSED + ACCEPTED)
def test_recovery_after_seconds_agrees_with_the_schema(text: str) -> None:
    doc = {"flags": {"plugin": {"healthRecoveryAfter": text}}}
    try:
        recovery_after_seconds(text)
        accepted = True
    except ValueError:
        accepted = False
    assert accepted == validator().is_valid(doc), text
    # and the quick check the loader tries first says the same, or leaves it to jsonschema
    assert verdict(doc) in (accepted, None), text
    assert verdict(doc) is not None  # `not` and `pattern` are keywords it knows


def test_the_accepted_forms_are_worded_once() -> None:
    assert RECOVERY_AFTER_FORMS == FORMS == load_schema()["$defs"]["recoveryDelay"]["description"]


def test_parse_duration_has_one_home() -> None:
    from nvdp.gfd import options

    assert options.parse_duration is durations.parse_duration is parse_duration
    assert not hasattr(options, "_DURATION_PART")
    assert parse_duration("1m30s") == 90
    assert parse_duration("infinite") == math.inf


def test_gpu_feature_discovery_reads_the_state_dir() -> None:
    from nvdp.gfd.options import GFD_ENV_VARS, parse_options

    assert GFD_ENV_VARS["HEALTH_STATE_DIR"] == "flags.plugin.healthStateDir"
    opts = parse_options(["--health-state-dir", "/flag"], env={})
    assert opts.overrides == {"flags.plugin.healthStateDir": "/flag"}
    from_env = load_config_text(None, env={"HEALTH_STATE_DIR": "/run/nvidia/nvdp"}, env_vars=GFD_ENV_VARS)
    assert from_env.flags.plugin.health_state_dir == "/run/nvidia/nvdp"


def test_flags_help_names_the_variables() -> None:
    """Each flag's help names its variable, or the variable is the one nvdp.config.flags.ENV_RULE (the
    daemons' descriptions) names: the flag in capitals."""
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    helps = {a.option_strings[0]: a.help or "" for a in parser._actions if a.option_strings}
    for flag, path in FLAG_PATHS.items():
        variables = [name for name, at in ENV_VARS.items() if at == path]
        assert env_name(flag) in variables or any(f"env {v}" in helps[flag] for v in variables), flag
    for flag in ("--health-recovery-after", "--health-flap-limit", "--health-state-dir"):
        assert ENV_VARS[env_name(flag)] == FLAG_PATHS[flag]
    assert env_name("--driver-root") not in ENV_VARS and "env NVIDIA_DRIVER_ROOT" in helps["--driver-root"]
