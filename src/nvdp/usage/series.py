"""The usage series of the plugins' /metrics, made from one collection at each scrape.

A prometheus-client collector registered in the plugin's registry (nvdp.daemon.report.metrics names
the series and their labels): each scrape collects (nvdp.usage.collect), so a pod's series exist while
it holds a device and are gone at the first scrape after the kubelet stops listing it. Problems of a
collection are counted in a series and logged as a WARNING when they change (once, not every scrape).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import GaugeMetricFamily

from nvdp.daemon.report import metrics
from nvdp.usage.model import DeviceInfo, Usage, Use

if TYPE_CHECKING:
    from nvdp.daemon.report.recording import Recorder
    from nvdp.usage.collect import UsageCollector


def device_labels(device: DeviceInfo, node: str) -> list[str]:
    """USAGE_DEVICE_LABELS' values: dcgm-exporter's gpu, UUID, device, modelName, hostname, GPU_I_*."""
    gi = "" if device.mig_gi_id is None else str(device.mig_gi_id)
    return [str(device.gpu_index), device.gpu_uuid, f"nvidia{device.minor}", device.model, node,
            device.mig_profile, gi]


def use_labels(use: Use, node: str) -> list[str]:
    h = use.holder
    return [*device_labels(use.device, node), h.namespace, h.pod, h.container, h.pod_uid, h.claim_namespace,
            h.claim_name, h.driver, h.pool, h.device_name]


def families(usage: Usage | None, seconds: float = 0.0) -> list[GaugeMetricFamily]:
    """The series of one collection (None: the families alone, for describe())."""
    memory = GaugeMetricFamily(*metrics.POD_GPU_MEMORY, labels=metrics.USAGE_LABELS)
    util = GaugeMetricFamily(*metrics.POD_GPU_SM_UTIL, labels=metrics.USAGE_LABELS)
    others = GaugeMetricFamily(*metrics.GPU_OTHER_PROCESSES, labels=metrics.USAGE_DEVICE_LABELS)
    problems = GaugeMetricFamily(*metrics.USAGE_PROBLEMS)
    duration = GaugeMetricFamily(*metrics.USAGE_DURATION)
    if usage is not None:
        for use in usage.uses:
            labels = use_labels(use, usage.node)
            memory.add_metric(labels, use.memory_bytes)
            if use.sm_util is not None:
                util.add_metric(labels, use.sm_util)
        for device, count in usage.others:
            others.add_metric(device_labels(device, usage.node), count)
        problems.add_metric([], len(usage.problems))
        duration.add_metric([], seconds)
    return [memory, util, others, problems, duration]


class UsageSeries:
    """The collector prometheus-client asks at each scrape."""

    def __init__(self, collector: UsageCollector, log: logging.Logger) -> None:
        self._collector = collector
        self._log = log
        self._reported: tuple[str, ...] = ()

    def describe(self) -> list[GaugeMetricFamily]:
        return families(None)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        start = time.perf_counter()
        try:
            usage = self._collector.collect()
        except Exception as err:  # a scrape must still answer; the other series are not at fault
            self._log.exception("Usage collection failed")
            usage = Usage(self._collector.source.node, problems=(f"{type(err).__name__}: {err}",))
        if usage.problems != self._reported:
            self._reported = usage.problems
            for problem in usage.problems:
                self._log.warning("Usage metrics: %s", problem)
            if not usage.problems:
                self._log.info("Usage metrics: every figure is read again")
        yield from families(usage, time.perf_counter() - start)


def serve_usage(recorder: Recorder, collector: UsageCollector, log: logging.Logger) -> Any:
    """Add the usage series to the process's /metrics (its metrics on from now on); the collector."""
    series = recorder.enable_metrics()
    usage = UsageSeries(collector, log)
    series.PLUGIN.register(usage)
    return usage
