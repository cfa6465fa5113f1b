"""The per-node mode policy (nvdp.daemon.pernode.mode): which mode a config puts a node in, which pods hold
its GPUs,
when a switch may go in, and how the per-node rule waits for one that may not yet."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from nvdp.config.loader import load_config_text
from nvdp.config.select import Selection
from nvdp.daemon.pernode.mode import DEFAULT_DRIVER as MODE_DEFAULT_DRIVER
from nvdp.daemon.pernode.mode import (
    DEFAULT_MODE_ENV,
    NAMED_PODS,
    GpuPod,
    Handover,
    InvalidMode,
    ModeGate,
    ModeSwitchRefused,
    claim_names,
    default_mode,
    device_plugin_resources,
    extended_resources,
    follower_mode,
    gpu_pods,
    node_mode,
    planned_resources,
    refusal,
    unbound_claims,
)
from nvdp.daemon.pernode.nodechoice import RETRY_PENDING_S, ConfigPending, ConfigRefused, NodeConfigRule
from nvdp.daemon.pernode.nodeconfig import Chosen
from nvdp.dra.pool.names import DEFAULT_DRIVER
from nvdp.inventory.profile import load_profile

DATA = Path(__file__).with_name("data")
PROFILES = Path(__file__).resolve().parents[2] / "sim" / "profiles"
NODE = "gpu-1"
LOG = logging.getLogger("test.mode")


def config(text: str) -> Any:
    return load_config_text(text, "entry.yaml", env={})


def pods() -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads((DATA / "pods.json").read_text())["items"]
    return items


def claims() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = json.loads((DATA / "claims.json").read_text())
    return found


def lookup(namespace: str, name: str) -> Mapping[str, Any] | None:
    return claims().get(f"{namespace}/{name}")


class Reports:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, bool]] = []

    def __call__(self, reason: str, message: str, *, warning: bool = True) -> None:
        self.seen.append((reason, message, warning))

    @property
    def reasons(self) -> list[str]:
        return [reason for reason, _, _ in self.seen]


# --- the mode a config gives ---------------------------------------------------------------------


def test_the_entry_wins_then_the_deployment_default_then_device_plugin() -> None:
    dra, plain = config("version: v1\nflags:\n  mode: dra\n"), config("version: v1\n")
    assert node_mode(dra, {DEFAULT_MODE_ENV: "device-plugin"}) == "dra"
    assert node_mode(plain, {DEFAULT_MODE_ENV: "dra"}) == "dra"
    assert node_mode(plain, {DEFAULT_MODE_ENV: " "}) == "device-plugin"
    assert node_mode(plain, {}) == "device-plugin"


def test_a_bad_default_names_the_variable_and_the_values() -> None:
    with pytest.raises(InvalidMode) as caught:
        default_mode({DEFAULT_MODE_ENV: "DRA"})
    assert isinstance(caught.value, ConfigRefused)
    message = str(caught.value)
    assert "NVDP_DEFAULT_MODE is 'DRA'" in message and "device-plugin or dra" in message
    assert "dra.defaultMode" in message


def test_dra_mode_needs_a_dra_plugin_beside_the_other_daemons() -> None:
    dra = config("version: v1\nflags:\n  mode: dra\n")
    with pytest.raises(InvalidMode) as caught:
        follower_mode(dra, {})
    assert str(caught.value) == (
        "entry.yaml: flags.mode is dra, but no DRA plugin runs beside this daemon (DRA_DRIVER_NAME and "
        "NVDP_DEFAULT_MODE are unset: the chart's dra.enabled is false); set dra.enabled=true, or remove "
        "flags.mode from the entry")
    assert follower_mode(dra, {"DRA_DRIVER_NAME": "gpu.nvidia.com"}) == "dra"
    assert follower_mode(config("version: v1\n"), {DEFAULT_MODE_ENV: "dra"}) == "dra"
    assert follower_mode(config("version: v1\n"), {}) == "device-plugin"


def test_dynamic_mig_is_refused_where_the_device_plugin_would_serve() -> None:
    dynamic = config("version: v1\nflags:\n  migStrategy: dynamic\n")
    with pytest.raises(InvalidMode) as caught:
        follower_mode(dynamic, {})
    assert "flags.migStrategy dynamic needs DRA mode, but the node's default mode is device-plugin" in str(
        caught.value)
    assert "set flags.mode: dra in the entry" in str(caught.value)
    assert follower_mode(dynamic, {DEFAULT_MODE_ENV: "dra"}) == "dra"


def test_the_driver_default_is_the_dra_plugins() -> None:
    assert MODE_DEFAULT_DRIVER == DEFAULT_DRIVER


# --- which pods hold the node's GPUs -------------------------------------------------------------


def test_gpu_pods_through_either_api() -> None:
    found = gpu_pods(pods(), lookup, driver=DEFAULT_DRIVER, node=NODE)
    assert [p.describe() for p in found] == [
        "ml/train (nvidia.com/gpu)",
        "ml/init-only (nvidia.com/mig-1g.10gb)",
        "work/dra-template (claim dra-template-gpu-9m2xq)",
        "work/dra-named (claim shared-gpu)",
        "work/dra-extended (claim dra-extended-extended-resources-5kxzd)",
    ]


def test_not_gpu_pods() -> None:
    """Done pods, a zero request, the plugin itself (NVIDIA_VISIBLE_DEVICES=all, no resource), another
    driver's claim, and claims of another node's pool."""
    names = {p.name for p in gpu_pods(pods(), lookup, driver=DEFAULT_DRIVER, node=NODE)}
    assert not names & {"done", "zero", "nvidia-device-plugin-x7k2p", "other-driver", "failed-claim"}
    elsewhere = gpu_pods(pods(), lookup, driver=DEFAULT_DRIVER, node="gpu-2")
    assert [p.name for p in elsewhere] == ["train", "init-only"]  # extended resources need no claim


def test_without_a_driver_only_extended_resources_count() -> None:
    found = gpu_pods(pods(), None, driver=None, node=NODE)
    assert [p.name for p in found] == ["train", "init-only"]


def test_a_deleted_claim_holds_nothing() -> None:
    found = gpu_pods(pods(), lambda ns, name: None, driver=DEFAULT_DRIVER, node=NODE)
    assert [p.name for p in found] == ["train", "init-only"]


def test_claims_allocated_here_whose_pod_is_not_bound_yet() -> None:
    """The scheduler allocates a claim before it binds the pod: such a claim holds the GPU too."""
    binding = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
               "metadata": {"name": "late-gpu-x2b9c", "namespace": "work"},
               "status": {"allocation": {"devices": {"results": [
                   {"request": "gpu", "driver": DEFAULT_DRIVER, "pool": NODE, "device": "gpu-0"}]}}}}
    everything = [*claims().values(), binding]
    found = unbound_claims(everything, pods(), driver=DEFAULT_DRIVER, node=NODE)
    assert [p.describe() for p in found] == [
        "work/late-gpu-x2b9c (a claim allocated here, its pod not bound yet)"]
    assert unbound_claims(everything, pods(), driver=DEFAULT_DRIVER, node="gpu-2") == []


def test_claim_names_from_spec_and_status() -> None:
    by_name = {p["metadata"]["name"]: p for p in pods()}
    assert claim_names(by_name["dra-template"]) == ["dra-template-gpu-9m2xq"]
    assert claim_names(by_name["dra-named"]) == ["shared-gpu"]
    assert claim_names(by_name["dra-extended"]) == ["dra-extended-extended-resources-5kxzd"]
    assert claim_names(by_name["train"]) == []
    assert extended_resources(by_name["zero"]) == []


def test_the_refusal_names_five_pods_and_the_fix() -> None:
    many = [GpuPod("ml", f"job-{n}", "nvidia.com/gpu") for n in range(7)]
    message = refusal("device-plugin", "dra", many)
    assert message.startswith("switching this node from device-plugin to dra is refused while 7 pods use "
                              "its GPUs: ml/job-0 (nvidia.com/gpu), ")
    assert "ml/job-4" in message and "ml/job-5" not in message and " and 2 more." in message
    assert message.endswith("Delete or drain them; the node switches by itself once they are gone")
    one = refusal("dra", "device-plugin", many[:1])
    assert "while 1 pod uses its GPUs: ml/job-0 (nvidia.com/gpu)." in one
    claim = GpuPod("ml", "job-9-gpu", "a claim allocated here, its pod not bound yet", pod=False)
    assert "while 2 pods or claims use its GPUs: " in refusal("dra", "device-plugin", [many[0], claim])
    assert NAMED_PODS == 5


# --- what the device plugin still advertises ------------------------------------------------------


def test_the_device_plugins_resources_above_zero() -> None:
    allocatable = {"cpu": "2", "nvidia.com/gpu": "1", "nvidia.com/gpu.shared": "0",
                   "nvidia.com/mig-1g.10gb": "7", "nvidia.com/hostdev": "4", "nvidia.com/renamed": "2"}
    assert device_plugin_resources(allocatable) == ["nvidia.com/gpu=1", "nvidia.com/mig-1g.10gb=7"]
    assert device_plugin_resources(allocatable, {"nvidia.com/renamed"}) == [
        "nvidia.com/gpu=1", "nvidia.com/mig-1g.10gb=7", "nvidia.com/renamed=2"]
    assert device_plugin_resources({"nvidia.com/gpu": "0"}) == []  # the kubelet's key for a stopped plugin


def test_planned_resources_include_renames() -> None:
    inventory = load_profile(PROFILES / "t4.yaml")
    renamed = config("version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
                     "    - {name: nvidia.com/gpu, replicas: 4, rename: nvidia.com/t4-slice}\n")
    assert planned_resources(renamed, inventory) == {"nvidia.com/t4-slice"}
    assert planned_resources(config("version: v1\nflags:\n  migStrategy: mixed\n"), inventory) == {
        "nvidia.com/gpu"}


# --- the gate ------------------------------------------------------------------------------------


class FakeApi:
    def __init__(self, found: list[GpuPod] | Exception) -> None:
        self.found = found
        self.node, self.driver = NODE, DEFAULT_DRIVER
        self.calls = 0

    def gpu_pods(self) -> list[GpuPod]:
        self.calls += 1
        if isinstance(self.found, Exception):
            raise self.found
        return self.found


def gate(own: Any, api: Any, reports: Reports, per_node: bool = True) -> ModeGate:
    return ModeGate(own, api, reports, LOG, per_node=per_node)


def test_the_first_mode_and_an_unchanged_one_need_no_check() -> None:
    api, reports = FakeApi([GpuPod("ml", "train", "nvidia.com/gpu")]), Reports()
    g = gate("device-plugin", api, reports)
    assert g.check("dra") is False  # at start: nothing of ours runs yet
    g.enter("dra")
    assert g.check("dra") is False
    assert api.calls == 0


def test_a_switch_goes_in_without_gpu_pods_and_is_recorded_once_advertised() -> None:
    reports = Reports()
    g = gate("dra", FakeApi([]), reports)
    g.enter("device-plugin")
    assert g.check("dra") is True
    g.enter("dra")
    assert reports.seen == []  # not yet: the DRA plugin has not published
    g.advertising()
    assert reports.seen == [("ModeSwitched", "device-plugin -> dra", False)]
    g.advertising()
    assert len(reports.seen) == 1


def test_only_the_daemon_entering_its_own_mode_records_the_switch() -> None:
    reports = Reports()
    g = gate("device-plugin", FakeApi([]), reports)
    g.enter("device-plugin")
    assert g.check("dra")
    g.enter("dra")
    g.advertising()
    assert reports.seen == []


def test_gpu_pods_refuse_the_switch_and_the_serving_daemon_notifies() -> None:
    held = [GpuPod("ml", "train", "nvidia.com/gpu")]
    serving, follower = gate("device-plugin", FakeApi(held), Reports()), gate("dra", FakeApi(held), Reports())
    for g in (serving, follower):
        g.enter("device-plugin")
        with pytest.raises(ModeSwitchRefused) as caught:
            g.check("dra")
        assert isinstance(caught.value, ConfigPending)
        assert caught.value.reason == "ModeSwitchRefused"
        assert "ml/train (nvidia.com/gpu)" in str(caught.value)
        assert g.mode == "device-plugin"
        assert caught.value.notify is (g is serving)


def test_pods_that_cannot_be_listed_make_the_switch_wait() -> None:
    g = gate("dra", FakeApi(RuntimeError("connection refused")), Reports())
    g.enter("dra")
    with pytest.raises(ModeSwitchRefused) as caught:
        g.check("device-plugin")
    assert "cannot be listed (RuntimeError: connection refused)" in str(caught.value)


def test_without_api_or_per_node_config_a_switch_needs_a_restart() -> None:
    for g in (gate("device-plugin", None, Reports()), gate("device-plugin", FakeApi([]), Reports(), False)):
        g.enter("device-plugin")
        with pytest.raises(ConfigRefused) as caught:
            g.check("dra")
        assert not isinstance(caught.value, ConfigPending)
        assert "restart the pods on this node to switch" in str(caught.value)


# --- the wait for the other API ------------------------------------------------------------------


def test_a_handover_says_what_it_waits_for_and_when_it_is_done(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    answers: list[str | None] = ["allocatable nvidia.com/gpu=1", "allocatable nvidia.com/gpu=1", None]
    caplog.set_level(logging.INFO, "test.mode")
    handover = Handover("the device plugin to withdraw", lambda: answers.pop(0), LOG, clock=lambda: now[0])
    assert not handover.done()
    now[0] += 1
    assert not handover.done()
    now[0] += 2.5
    assert handover.done()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["Waiting for the device plugin to withdraw (0 s so far): allocatable nvidia.com/gpu=1",
                     "Done waiting for the device plugin to withdraw after 3.5 s"]


def test_a_handover_keeps_waiting_through_api_errors() -> None:
    def fails() -> str | None:
        raise RuntimeError("503")

    assert not Handover("x", fails, LOG).done()


# --- the per-node rule with an entry that must wait --------------------------------------------


class Entries:
    """A stand-in NodeConfig: `choose()` answers whatever entry the test labels."""

    def __init__(self, entry: str) -> None:
        self.entry = entry

    def choose(self, *, lenient: bool = False) -> Chosen:
        return Chosen(Selection(self.entry, "label"), None, self.entry)


def test_a_pending_entry_is_reported_once_retried_and_not_rejected() -> None:
    now = [0.0]
    entries, reports = Entries("dp"), Reports()
    rule = NodeConfigRule(entries, reports, LOG, clock=lambda: now[0])  # type: ignore[arg-type]
    tries: list[str] = []
    pods_left = [2]

    def switch(chosen: Chosen | None) -> None:
        assert chosen is not None and chosen.entry is not None
        tries.append(chosen.entry)
        if chosen.entry == "dra" and pods_left[0]:
            pods_left[0] -= 1
            raise ModeSwitchRefused("1 pod uses its GPUs: ml/train", notify=True)

    rule.start(switch)
    entries.entry = "dra"
    assert not rule.again(switch, forced=False)
    assert rule.pending is not None and rule.rejected is None
    assert rule.retry_in() == RETRY_PENDING_S and not rule.retry_due()
    assert reports.reasons == ["ModeSwitchRefused"]
    assert "config entry 'dra' (from label) is not applied yet; still serving entry 'dp' (from label)" in (
        reports.seen[0][1])
    now[0] += RETRY_PENDING_S
    assert rule.retry_due()
    assert not rule.again(switch, forced=False)  # still a pod: tried, not reported again
    assert reports.reasons == ["ModeSwitchRefused"]
    now[0] += RETRY_PENDING_S
    assert rule.again(switch, forced=False)  # the pods are gone
    assert rule.entry == "dra" and rule.pending is None and rule.retry_in() is None
    assert tries == ["dp", "dra", "dra", "dra"]
    assert reports.reasons == ["ModeSwitchRefused", "ConfigApplied"]


def test_a_pending_entry_is_dropped_when_the_label_goes_back() -> None:
    entries, reports = Entries("dp"), Reports()
    rule = NodeConfigRule(entries, reports, LOG)  # type: ignore[arg-type]

    def switch(chosen: Chosen | None) -> None:
        if chosen is not None and chosen.entry == "dra":
            raise ModeSwitchRefused("pods", notify=False)

    rule.start(switch)
    entries.entry = "dra"
    rule.again(switch, forced=False)
    assert rule.pending is not None and reports.seen == []  # notify=False: logged, no Event
    entries.entry = "dp"
    assert not rule.again(switch, forced=False)
    assert rule.pending is None and rule.retry_in() is None
    entries.entry = "dra"
    rule.again(switch, forced=False)
    assert rule.pending is not None  # wanted again: reported again (once)
