"""values.schema.json and validation.yaml: bad values are refused with a message naming them."""

from __future__ import annotations

import json
import re
from typing import Any

import chart_schema_sync
import pytest
from chart_helm import CHART_DIR, merge_values, render, render_error

SCHEMA_ERROR = (
    "values don't meet the specifications of the schema(s) in the following chart(s):\n"
    "nvidia-device-plugin:\n"
)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"migStrategy": 2}, "- at '/migStrategy': got number, want null or string"),
        ({"failOnInitError": "yes"}, "- at '/failOnInitError': got string, want null or boolean"),
        ({"compatWithCPUManager": 1}, "- at '/compatWithCPUManager': got number, want null or boolean"),
        ({"image": {"tag": 1}}, "- at '/image/tag': got number, want string"),
        ({"tolerations": {"key": "x"}}, "- at '/tolerations': got object, want null or array"),
        ({"mps": {"root": "run/mps"}}, "- at '/mps/root': 'run/mps' does not match pattern '^/.+'"),
        (
            {"config": {"fallbackStrategies": ["nearest"]}},
            "- at '/config/fallbackStrategies/0': value must be one of 'named', 'single', 'empty'",
        ),
        ({"deviceListStrategy": ["envvar", "files"]}, "- at '/deviceListStrategy': 'anyOf' failed"),
    ],
)
def test_schema_refuses_bad_values_naming_them(values: dict[str, Any], message: str) -> None:
    error = render_error(values)
    assert error.startswith(SCHEMA_ERROR)
    assert message in error


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"version": "v2"}, "- at '/config/map/cfg/version': value must be one of 'v1', ''"),
        (
            {"sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu"}]}}},
            "- at '/config/map/cfg/sharing/timeSlicing/resources/0': missing property 'replicas'",
        ),
        (
            {"sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": "ten"}]}}},
            "- at '/config/map/cfg/sharing/mps/resources/0/replicas': got string, want integer",
        ),
    ],
)
def test_inline_object_entries_are_checked_against_the_config_schema(
    entry: dict[str, Any], message: str
) -> None:
    error = render_error({"config": {"map": {"cfg": entry}}})
    assert error.startswith(SCHEMA_ERROR)
    assert message in error


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            {"flags": {"renameByDefault": True}},
            'config.map.cfg: unknown key "renameByDefault" under "flags". Did you mean '
            "sharing.timeSlicing.renameByDefault? Known keys there: deviceDiscoveryStrategy,",
        ),
        (
            {"sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2, "Rename": "x"}]}}},
            'config.map.cfg: unknown key "Rename" under "sharing.mps.resources[0]". Did you mean '
            "sharing.mps.resources[0].rename?",
        ),
    ],
)
def test_unknown_keys_in_inline_object_entries_say_where_they_belong(
    entry: dict[str, Any], message: str
) -> None:
    error = render_error({"config": {"map": {"cfg": entry}}})
    assert not error.startswith(SCHEMA_ERROR)
    assert message in error


def test_non_string_non_object_entry_is_refused() -> None:
    assert "- at '/config/map/cfg': got number, want string" in render_error({"config": {"map": {"cfg": 3}}})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "flags:\n  renameByDefault: true\n",
            'config.map.cfg: unknown key "renameByDefault" under "flags". Did you mean '
            "sharing.timeSlicing.renameByDefault? Known keys there: deviceDiscoveryStrategy,",
        ),
        (
            "version: v1\nsharing:\n  timeslicing: {}\n",
            'config.map.cfg: unknown key "timeslicing" under "sharing". Did you mean sharing.timeSlicing? '
            "Known keys there: mps, timeSlicing.",
        ),
        (
            "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replica: 2\n",
            'config.map.cfg: unknown key "replica" under "sharing.mps.resources[0]". '
            "Known keys there: devices, name, rename, replicas, strictShares.",
        ),
        (
            "version: v1\nsharing:\n  mps:\n    resources:\n    - name: a\n      replicas: 2\n"
            "    - name: b\n      Replicas: 2\n",
            'config.map.cfg: unknown key "Replicas" under "sharing.mps.resources[1]". Did you mean '
            "sharing.mps.resources[1].replicas? Known keys there: devices, name, rename, replicas, "
            "strictShares.",
        ),
        (
            "version: v1\nsharing:\n  mps:\n    resources:\n    - name: a\n      replicas: 2\n"
            "      renameByDefault: true\n",
            'config.map.cfg: unknown key "renameByDefault" under "sharing.mps.resources[0]". Did you mean '
            "sharing.mps.renameByDefault? Known keys there:",
        ),
        (
            "version: v1\nmigStrategy: mixed\n",
            'config.map.cfg: unknown top-level key "migStrategy". Did you mean flags.migStrategy? '
            "Known keys:",
        ),
        (
            "verison: v1\n",
            'config.map.cfg: unknown top-level key "verison". '
            "Known keys: flags, imex, resources, sharing, version.",
        ),
        (
            "version: v1\nflags: [\n",
            "config.map.cfg is not a valid config file: error converting YAML to JSON: "
            "yaml: line 2: did not find expected node content.",
        ),
        ("- version: v1\n", "config.map.cfg is not a valid config file: "),
    ],
)
def test_string_entries_are_parsed_and_their_keys_checked(text: str, message: str) -> None:
    error = render_error({"config": {"map": {"cfg": text}}})
    assert message in error


@pytest.mark.parametrize(
    ("values", "namespace", "message"),
    [
        ({}, "default", "Installing into the 'default' namespace is refused"),
        ({"namespaceOverride": "default"}, "gpu", "Installing into the 'default' namespace is refused"),
        (
            {"namespace": "gpu"},
            "gpu",
            "Value 'namespace' is set to \"gpu\", but a namespace in values is not supported.",
        ),
        (
            {"config": {"name": "mine", "map": {"a": "version: v1\n"}}},
            "gpu",
            "Both 'config.name' (\"mine\") and 'config.map' (entries: a) are set; only one may be.",
        ),
        (
            {"config": {"map": {"a": "version: v1\n"}, "default": "b"}},
            "gpu",
            "'config.default' is \"b\", but 'config.map' has no entry of that name (entries: a).",
        ),
    ],
)
def test_validation_failures_name_the_value_and_the_fix(
    values: dict[str, Any], namespace: str, message: str
) -> None:
    assert message in render_error(values, namespace=namespace)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        # A typo: a letter swapped, left out, added or changed.
        ({"dra": {"enabeld": True}},
         "Unknown value 'dra.enabeld'. Did you mean 'dra.enabled'? Keys under 'dra': "),
        ({"devicePlugn": {}}, "Unknown value 'devicePlugn'. Did you mean 'devicePlugin'? Top-level values: "),
        ({"image": {"tags": "x"}},
         "Unknown value 'image.tags'. Did you mean 'image.tag'? "
         "Keys under 'image': pullPolicy, repository, tag."),
        ({"probes": {"liveness": {"periodSecond": 3}}},
         "Unknown value 'probes.liveness.periodSecond'. Did you mean 'probes.liveness.periodSeconds'?"),
        # The wrong case, or the right key in the wrong section.
        ({"dra": {"Enabled": True}}, "Unknown value 'dra.Enabled'. Did you mean 'dra.enabled'?"),
        ({"dra": {"root": "/run/mps"}}, "Unknown value 'dra.root'. Did you mean 'mps.root'?"),
        ({"devicePlugin": {"migStrategy": "mixed"}},
         "Unknown value 'devicePlugin.migStrategy'. Did you mean 'migStrategy'?"),
        # In a list item, with the user's index; keys of other sections are not offered there.
        ({"dra": {"sharingClasses": [{"name": "a.b", "sharing": {"strategy": "MPS"}},
                                     {"name": "c.d", "selectr": "true", "sharing": {"strategy": "MPS"}}]}},
         "Unknown value 'dra.sharingClasses[1].selectr'. Did you mean 'dra.sharingClasses[1].selector'?"),
        ({"dra": {"sharingClasses": [
            {"name": "a.b", "sharing": {"strategy": "TimeSlicing", "Interval": "Long"}}]}},
         "Did you mean 'dra.sharingClasses[0].sharing.timeSlicingConfig.interval'?"),
        # Several keys equally near: all of them.
        ({"enabled": True},
         "Unknown value 'enabled'. Did you mean one of 'devicePlugin.enabled', 'dra.enabled', "),
        # Nothing near: the keys there are.
        ({"unknownKey": 1},
         "Unknown value 'unknownKey'. Top-level values: affinity, allowDefaultNamespace, "),
        ({"devicePlugin": {"healthRecovery": {"afterwards": "5m"}}},
         "Unknown value 'devicePlugin.healthRecovery.afterwards'. Keys under 'devicePlugin.healthRecovery': "
         "after, flapLimit, stateDir. Keys are case-sensitive; values.yaml describes each one."),
    ],
)  # fmt: skip
def test_unknown_keys_are_refused_with_the_key_meant(values: dict[str, Any], message: str) -> None:
    error = render_error(values)
    assert not error.startswith(SCHEMA_ERROR)
    assert message in error


def test_every_section_refuses_unknown_keys() -> None:
    """The key lists cover every section of the schema, list items included."""
    import chart_values

    # What the schema requires of a list item, so that the unknown key is what is refused.
    required_in_item = {"dra.sharingClasses[]": {"name": "a.b", "sharing": {"strategy": "TimeSlicing"}}}
    for section in chart_values.value_key_paths(chart_values.load_schema()):
        values: Any = {"zzUnknown": 1}
        shown = section.replace("[]", "[0]")
        parts = section.split(".") if section else []
        for depth in range(len(parts), 0, -1):
            part = parts[depth - 1]
            if part.endswith("[]"):
                item = merge_values(required_in_item[".".join(parts[:depth])], values)
                values = {part[:-2]: [item]}
            else:
                values = {part: values}
        assert f"Unknown value '{shown + '.' if shown else ''}zzUnknown'." in render_error(values), section


def test_unknown_keys_inside_free_form_values_are_left_alone() -> None:
    rendered = render({"nfd": {"anything": {"goes": 1}}, "podAnnotations": {"example.com/x": "y"},
                       "affinity": {"podAntiAffinity": {}}})  # fmt: skip
    assert "nvdp-nvidia-device-plugin" in rendered.daemonsets()


def test_mig_strategy_dynamic_says_where_dynamic_mig_is_set() -> None:
    error = render_error({"migStrategy": "dynamic"})
    assert not error.startswith(SCHEMA_ERROR)
    assert "'migStrategy' is \"dynamic\", which it does not take" in error
    assert "flags.migStrategy" in error
    fix = (
        "--set dra.enabled=true --set config.map.dynamic-mig.version=v1 "
        "--set config.map.dynamic-mig.flags.migStrategy=dynamic"
    )
    assert fix in error
    # The fix it gives installs.
    entry = {"version": "v1", "flags": {"migStrategy": "dynamic"}}
    rendered = render(
        {"dra": {"enabled": True}, "config": {"map": {"dynamic-mig": entry}}}, kube_version="v1.36.0"
    )
    assert "nvdp-nvidia-device-plugin-dra-plugin" in rendered.daemonsets()


@pytest.mark.parametrize("strategy", ["double", "", "Mixed"])
def test_other_mig_strategies_are_refused_naming_the_valid_ones(strategy: str) -> None:
    assert (
        f"'migStrategy' is \"{strategy}\", but it must be none, single or mixed (MIG_STRATEGY)"
        in render_error({"migStrategy": strategy})
    )


@pytest.mark.parametrize(
    "config",
    [
        {"map": {"a": "version: v1\n", "b": "version: v1\n"}},
        {"name": "mine", "fallbackStrategies": ["single"]},
    ],
)
def test_which_entry_a_node_gets_is_left_to_the_daemons(config: dict[str, Any]) -> None:
    """No entry for an unlabelled node is the daemons' to report (per node, with the entries there are):
    a labelled node may still run, and the chart does not repeat their rule to refuse the install."""
    rendered = render({"config": config})
    assert "nvdp-nvidia-device-plugin" in rendered.daemonsets()


@pytest.mark.parametrize(
    ("text", "parent"),
    [
        ("flags:\n  renameByDefault: true\n", ("flags",)),
        ("version: v1\nmigStrategy: mixed\n", ()),
        ("sharing:\n  timeslicing: {}\n", ("sharing",)),
        ("sharing:\n  mps:\n    resources:\n    - name: a\n      replicas: 2\n    - Replicas: 2\n", None),
        ("resources:\n  gpus:\n  - pattern: '*'\n    name: gpu\n    replicas: 2\n", None),
    ],
)
def test_install_time_suggestion_is_the_loaders(text: str, parent: tuple[str, ...] | None) -> None:
    """The chart's did-you-mean is the one `nvdp config validate` gives for the same file."""
    from nvdp.config.loader import ConfigError, load_config_text

    with pytest.raises(ConfigError) as raised:
        load_config_text(text, "cfg")
    loader_hints = {m.group(1) for m in re.finditer(r"did you mean ([^?]+)\?", str(raised.value))}
    error = render_error({"config": {"map": {"cfg": text}}})
    chart_hints = set(re.findall(r"Did you mean ([^?]+)\?", error))
    assert chart_hints and chart_hints <= loader_hints, (error, str(raised.value))


def test_embedded_config_schema_matches_config_schema_json() -> None:
    stale = chart_schema_sync.stale_files(write=False)
    assert not stale, (
        f"{[str(p.relative_to(chart_schema_sync.ROOT)) for p in stale]} differ from config-schema.json; "
        "run `python scripts/chart_schema_sync.py`"
    )


def test_embedded_schema_is_rerooted_and_leaves_unknown_keys_to_the_template() -> None:
    config_schema = json.loads(chart_schema_sync.CONFIG_SCHEMA.read_text(encoding="utf-8"))
    embedded = json.loads((CHART_DIR / "values.schema.json").read_text(encoding="utf-8"))["$defs"][
        "nvdpConfig"
    ]
    assert "$id" not in embedded
    assert embedded["properties"].keys() == config_schema["properties"].keys()
    refs = json.dumps(embedded).count('"$ref": "#/$defs/nvdpConfig/$defs/')
    assert refs == json.dumps(config_schema).count('"$ref": "#/$defs/')
    assert '"additionalProperties": false' not in json.dumps(embedded)
    assert json.dumps(config_schema).count('"additionalProperties": false') >= 10


def test_key_paths_follow_refs_and_list_items() -> None:
    paths = chart_schema_sync.config_key_paths(
        {
            "type": "object",
            "additionalProperties": False,
            "properties": {"a": {"$ref": "#/$defs/a"}, "open": {"type": "object", "properties": {"x": {}}}},
            "$defs": {
                "a": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/item"}}},
                },
                "item": {"type": "object", "additionalProperties": False, "properties": {"k": {}}},
            },
        }
    )
    assert paths == {"": ["a", "open"], "a": ["items"], "a.items[]": ["k"]}


@pytest.mark.parametrize(
    "entry",
    [
        {
            "version": "v1",
            "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": -1}]}},
        },
        {"version": "v1", "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 0}]}}},
        {"version": "v1", "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 1025}]}}},
        {"version": "v1", "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": "ten"}]}}},
        {"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu"}]}}},
        {"version": "v1", "flags": {"migStrategy": "sometimes"}},
        {"version": "v2"},
    ],
)
def test_string_entries_meet_the_schema_object_entries_meet(entry: dict[str, Any]) -> None:
    """`--set-file` entries get the values schema's checks, worded as Helm words them for objects."""
    import yaml

    as_object = render_error({"config": {"map": {"cfg": entry}}})
    problem = next(line for line in as_object.splitlines() if line.startswith("- at '"))
    as_string = render_error({"config": {"map": {"cfg": yaml.safe_dump(entry)}}})
    assert f"config.map.cfg (a string entry) does not meet the config schema:\n{problem}\n" in as_string
    assert "Fix the file given with --set-file config.map.cfg=<file>" in as_string
