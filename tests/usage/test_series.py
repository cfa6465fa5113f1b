"""The usage series: dcgm-exporter's label names, one sample per holder, MIG without utilization, and
problems counted and logged once."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from nvdp.usage.model import DeviceInfo, Holder, Usage, Use
from nvdp.usage.series import UsageSeries

GPU = DeviceInfo("GPU-aaaa", "GPU-aaaa", 0, 0, "Tesla T4")
MIG = DeviceInfo("MIG-cccc", "GPU-bbbb", 1, 3, "NVIDIA H100 80GB HBM3", mig_gi_id=7, mig_profile="1g.10gb")
DP = Holder("GPU-aaaa", "team", "a", "main", "uid-a", resource="nvidia.com/gpu")
CLAIM = Holder("MIG-cccc", "team", "b", "main", "uid-b", claim_namespace="team", claim_name="b-gpu",
               driver="gpu.nvidia.com", pool="node-a", device_name="gpu-3-mig-1g10gb-19-0")
USAGE = Usage("node-a", (Use(GPU, DP, 1 << 30, 35, 2), Use(MIG, CLAIM, 1 << 29, None, 1)), ((GPU, 1),))


class Fixed:
    """A collector that answers what it is given."""

    def __init__(self, *answers: Usage | Exception) -> None:
        self.answers = list(answers)
        self.source = type("Source", (), {"node": "node-a"})()

    def collect(self) -> Usage:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def scrape(series: UsageSeries) -> dict[str, list[tuple[dict[str, str], float]]]:
    registry = CollectorRegistry()
    registry.register(series)  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    return {f.name: [(dict(s.labels), s.value) for s in f.samples]
            for f in text_string_to_metric_families(text)}


def test_one_sample_per_holder_in_dcgm_exporters_label_names() -> None:
    found = scrape(UsageSeries(Fixed(USAGE), logging.getLogger("t")))  # type: ignore[arg-type]
    memory = found["nvdp_pod_gpu_memory_used_bytes"]
    assert memory == [
        ({"gpu": "0", "UUID": "GPU-aaaa", "device": "nvidia0", "modelName": "Tesla T4", "hostname": "node-a",
          "GPU_I_PROFILE": "", "GPU_I_ID": "", "namespace": "team", "pod": "a", "container": "main",
          "pod_uid": "uid-a", "dra_claim_namespace": "", "dra_claim_name": "", "dra_driver_name": "",
          "dra_pool_name": "", "dra_device_name": ""}, float(1 << 30)),
        ({"gpu": "1", "UUID": "GPU-bbbb", "device": "nvidia3", "modelName": "NVIDIA H100 80GB HBM3",
          "hostname": "node-a", "GPU_I_PROFILE": "1g.10gb", "GPU_I_ID": "7", "namespace": "team", "pod": "b",
          "container": "main", "pod_uid": "uid-b", "dra_claim_namespace": "team", "dra_claim_name": "b-gpu",
          "dra_driver_name": "gpu.nvidia.com", "dra_pool_name": "node-a",
          "dra_device_name": "gpu-3-mig-1g10gb-19-0"}, float(1 << 29)),
    ]
    util = found["nvdp_pod_gpu_sm_utilization_percent"]
    assert [(labels["pod"], value) for labels, value in util] == [("a", 35.0)]  # MIG: none
    assert [(labels["UUID"], value) for labels, value in found["nvdp_gpu_unattributed_processes"]] == [
        ("GPU-aaaa", 1.0)]
    assert found["nvdp_usage_collection_problems"] == [({}, 0.0)]
    assert found["nvdp_usage_collection_duration_seconds"][0][1] >= 0


def test_a_pod_gone_from_the_kubelet_is_gone_from_the_next_scrape() -> None:
    series = UsageSeries(Fixed(USAGE, Usage("node-a", USAGE.uses[1:])), logging.getLogger("t"))  # type: ignore[arg-type]
    assert {labels["pod"] for labels, _ in scrape(series)["nvdp_pod_gpu_memory_used_bytes"]} == {"a", "b"}
    after = scrape(series)
    assert {labels["pod"] for labels, _ in after["nvdp_pod_gpu_memory_used_bytes"]} == {"b"}
    assert after["nvdp_gpu_unattributed_processes"] == []


def test_problems_are_counted_at_each_scrape_and_logged_when_they_change(
        caplog: pytest.LogCaptureFixture) -> None:
    broken = Usage("node-a", problems=("cannot ask the kubelet's pod-resources API",))
    series = UsageSeries(Fixed(broken, broken, RuntimeError("boom"), USAGE),  # type: ignore[arg-type]
                         logging.getLogger("t"))
    with caplog.at_level(logging.INFO):
        counts = [scrape(series)["nvdp_usage_collection_problems"][0][1] for _ in range(4)]
    assert counts == [1.0, 1.0, 1.0, 0.0]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["Usage metrics: cannot ask the kubelet's pod-resources API",
                        "Usage metrics: RuntimeError: boom"]
    assert any(r.levelno == logging.ERROR and "Usage collection failed" in r.getMessage()
               for r in caplog.records)
    assert "Usage metrics: every figure is read again" in caplog.text


def test_describe_collects_nothing() -> None:
    series = UsageSeries(Fixed(), logging.getLogger("t"))  # type: ignore[arg-type]
    assert [f.name for f in series.describe()] == [
        "nvdp_pod_gpu_memory_used_bytes", "nvdp_pod_gpu_sm_utilization_percent",
        "nvdp_gpu_unattributed_processes", "nvdp_usage_collection_problems",
        "nvdp_usage_collection_duration_seconds"]
    assert all(not f.samples for f in series.describe())
