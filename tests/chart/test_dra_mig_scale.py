"""Dynamic MIG at cluster scale in the chart: NOTES warn where dynamic MIG is possible and the
cluster's Kubernetes is older than the scheduler fix, unless dra.dynamicMigScaleWarning is false, which
also reaches the DRA plugin (env NVDP_DYNAMIC_MIG_SCALE_WARNING); flags.migDynamicProfiles is checked at
install like every config key."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from chart_helm import CHART_DIR, container, env, render, render_error

from nvdp.dra.pool.scale import SCHEDULER_FIX_TEXT, SILENCE_ENV, scale_warning

DRA = "nvdp-nvidia-device-plugin-dra-plugin"
DRA_CTR = "nvidia-dra-plugin-ctr"
DYNAMIC = "version: v1\nflags:\n  migStrategy: dynamic\n  mode: dra\n"
HEADING = "Dynamic MIG at cluster scale"


def values(config: str = DYNAMIC, **dra: Any) -> dict[str, Any]:
    return {"dra": {"enabled": True, **dra}, "config": {"map": {"config": config}}}


def notes(vals: dict[str, Any], kube_version: str = "v1.36.2") -> str:
    return render(vals, kube_version=kube_version).notes


def test_notes_warn_on_a_cluster_without_the_scheduler_fix_with_the_plugins_figures() -> None:
    text = notes(values())
    assert HEADING in text and "a config entry sets flags.migStrategy" in text
    flat = " ".join(text.split())
    assert f"Kubernetes v1.36.2. Its kube-scheduler (before {SCHEDULER_FIX_TEXT}, without " \
           "kubernetes/kubernetes#138917)" in flat
    # The plugin's and the doctor's message says the same: the figures and the way out.
    message = scale_warning("v1.36.2", (1, 36, 2), 208)
    assert message is not None
    for words in ("0.4 / 4.9 / 32.7 s", "8 / 11 / 20 ms", "1.7 pods/s", "(114 without)",
                  f"Kubernetes {SCHEDULER_FIX_TEXT} or later",
                  "flags.migDynamicProfiles (e.g. [1g.10gb, 3g.40gb]: less work per node, the same growth)",
                  "small clusters", "dra.dynamicMigScaleWarning=false"):
        assert words in flat and words in message, words
    assert "DynamicMigSchedulerCost" in flat


@pytest.mark.parametrize("version", ["v1.37.0", "v1.37.0-rc.1", "v1.38.2"])
def test_notes_are_quiet_where_the_cluster_has_the_fix(version: str) -> None:
    assert HEADING not in notes(values(), version)


@pytest.mark.parametrize("version", ["v1.35.4", "v1.36.2-gke.1000"])
def test_older_and_vendor_versions_are_warned(version: str) -> None:
    assert HEADING in notes(values(), version)


def test_notes_are_quiet_without_dynamic_mig_or_when_silenced() -> None:
    assert HEADING not in notes(values("version: v1\nflags:\n  migStrategy: mixed\n"))
    assert HEADING not in notes({"dra": {"enabled": True}})
    assert HEADING not in notes(values(dynamicMigScaleWarning=False))


def test_an_existing_configmap_may_set_it() -> None:
    text = notes({"dra": {"enabled": True}, "config": {"name": "my-configs"}})
    assert "the ConfigMap my-configs may set flags.migStrategy" in text


def test_the_value_defaults_on_and_false_reaches_the_plugin() -> None:
    assert yaml.safe_load((CHART_DIR / "values.yaml").read_text())["dra"]["dynamicMigScaleWarning"] is True
    plugin = container(render(values()).one("DaemonSet", DRA), DRA_CTR)
    assert SILENCE_ENV not in env(plugin)
    quiet = container(render(values(dynamicMigScaleWarning=False)).one("DaemonSet", DRA), DRA_CTR)
    assert env(quiet)[SILENCE_ENV] == "false"
    assert "- at '/dra/dynamicMigScaleWarning'" in render_error(values(dynamicMigScaleWarning="no"))


def test_the_profile_list_is_checked_at_install() -> None:
    good = DYNAMIC + "  migDynamicProfiles: [1g.10gb, 3g.40gb@4]\n"
    render(values(good))
    render(values(yaml.safe_load(good)))  # an entry written as YAML: the values schema's copy
    error = render_error(values(DYNAMIC + "  migDynamicProfiles: [1g.10gb, 1g.10gb]\n"))
    assert "migDynamicProfiles" in error
    error = render_error(values(DYNAMIC + "  migDynamicProfile: [1g.10gb]\n"))
    assert "migDynamicProfiles" in error  # the loader's "did you mean", at install time
