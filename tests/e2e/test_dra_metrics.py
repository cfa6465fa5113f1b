"""The DRA plugin's metrics on a real node: the real kubelet's prepare and unprepare, scraped as
Prometheus does.

The chart installed with `dra.enabled=true` and `metrics.enabled=true`, the claim specs' driver files
the CDI scenario's fake driver root (as tests/e2e/test_dra.py). The metrics Service is headless: the
test reads its EndpointSlices and fetches /metrics from the DRA plugin pod's endpoint from the node.

1. install: the DRA plugin pod is an endpoint of the metrics Service; its /metrics has NVIDIA's
   nvidia_dra_* series at 0.
2. a claim pod Running: a prepare request counted and timed, one gpu prepared, nothing in flight, no
   error.
3. the pod deleted: the kubelet's unprepare counted, no device prepared.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from .e2e_cluster import Cluster, Images, Release, Timings, story_release
from .test_cdi import HostSetup
from .test_dra import (
    NAMESPACE,
    claim_host,
    claim_pod,
    claim_template,
    delete_pod,
    diagnose,
    plugin_log,
    pod_phase,
    values,
)

SCENARIO = "DRA metrics"
pytestmark = pytest.mark.incremental
DRIVER = "gpu.nvidia.com"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def host(cluster: Cluster) -> Iterator[HostSetup]:
    with claim_host(cluster) as setup:
        yield setup


@pytest.fixture(scope="module")
def release(cluster: Cluster, images: Images, host: HostSetup) -> Iterator[Release]:
    with story_release(cluster, images, "nvdp-dram", "nvdp-e2e-dra-metrics", work=[NAMESPACE]) as release:
        yield release


def dra_endpoint(cluster: Cluster, release: Release) -> str | None:
    """`<pod IP>:<port>` of the DRA plugin pod's ready endpoint of the metrics Service."""
    pods = release.pods("dra-plugin")
    if len(pods) != 1:
        return None
    pod_ip = pods[0]["status"].get("podIP")
    service = f"{release.name}-nvidia-device-plugin-metrics"
    slices = cluster.kubectl_json("get", "endpointslices", "-n", release.namespace, "-l",
                                  f"kubernetes.io/service-name={service}")
    for item in slices["items"]:
        ports = [p["port"] for p in item.get("ports") or [] if p.get("name") == "metrics"]
        for endpoint in item.get("endpoints") or []:
            if endpoint.get("conditions", {}).get("ready") and pod_ip in endpoint["addresses"] and ports:
                return f"{pod_ip}:{ports[0]}"
    return None


def scrape(cluster: Cluster, endpoint: str) -> Samples:
    text = cluster.host(f"curl -sS --max-time 5 http://{endpoint}/metrics").stdout
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted({"driver": DRIVER, **labels}.items()))))


def test_install_exports_the_dra_series(cluster: Cluster, release: Release, host: HostSetup,
                                        timings: Timings) -> None:
    with timings.measure(SCENARIO, "helm install (dra.enabled, metrics.enabled) --wait"):
        done = release.install(*values(host), "--set", "metrics.enabled=true", check=False)
    assert done.returncode == 0, f"{done.stderr[-2000:]}\n{plugin_log(cluster, release)}"
    cluster.wait_for("the kubelet's registration", lambda: "Registered with the kubelet" in plugin_log(
        cluster, release), 60, diagnose=lambda: plugin_log(cluster, release))
    endpoint, seconds = cluster.wait_for("the DRA plugin's endpoint of the metrics Service",
                                         lambda: dra_endpoint(cluster, release), 60)
    timings.add(SCENARIO, "metrics endpoint ready", seconds)
    samples = scrape(cluster, endpoint)
    assert value(samples, "nvidia_dra_requests_total", operation="prepare") == 0, samples
    assert value(samples, "nvidia_dra_requests_inflight", operation="unprepare") == 0
    assert value(samples, "nvidia_dra_prepared_devices", node=cluster.node, device_type="gpu") == 0


def test_a_claim_pod_is_a_prepare_request_and_a_prepared_gpu(cluster: Cluster, release: Release,
                                                             images: Images, timings: Timings) -> None:
    endpoint = dra_endpoint(cluster, release)
    assert endpoint is not None
    cluster.apply(claim_template("one-gpu"))
    cluster.apply(claim_pod("dram-a", images.plugin, "one-gpu"))
    _, seconds = cluster.wait_for("pod dram-a Ready", lambda: pod_phase(cluster, "dram-a") == "Ready", 120,
                                  diagnose=diagnose(cluster, release, "dram-a"))
    timings.add(SCENARIO, "claim created -> pod Ready", seconds)
    samples = scrape(cluster, endpoint)
    assert (value(samples, "nvidia_dra_requests_total", operation="prepare") or 0) >= 1, samples
    assert value(samples, "nvidia_dra_request_duration_seconds_count", operation="prepare") == \
        value(samples, "nvidia_dra_requests_total", operation="prepare")
    assert value(samples, "nvidia_dra_requests_inflight", operation="prepare") == 0
    assert value(samples, "nvidia_dra_prepared_devices", node=cluster.node, device_type="gpu") == 1
    assert not [k for k, v in samples.items() if k[0].endswith("_errors_total") and v], samples


def test_deleting_the_pod_is_an_unprepare_request(cluster: Cluster, release: Release,
                                                  timings: Timings) -> None:
    endpoint = dra_endpoint(cluster, release)
    assert endpoint is not None
    # The kubelet may still be finishing an earlier story's claims on this node: count from here.
    before = value(scrape(cluster, endpoint), "nvidia_dra_requests_total", operation="unprepare") or 0
    delete_pod(cluster, "dram-a")

    def unprepared() -> Samples | None:
        # Its own unprepare, not only a retried one of an earlier story's claim: the device released.
        samples = scrape(cluster, endpoint)
        done = (value(samples, "nvidia_dra_requests_total", operation="unprepare") or 0) > before and \
            value(samples, "nvidia_dra_prepared_devices", node=cluster.node, device_type="gpu") == 0
        return samples if done else None

    samples, seconds = cluster.wait_for("the kubelet's unprepare in the metrics", unprepared, 60,
                                        diagnose=lambda: plugin_log(cluster, release))
    timings.add(SCENARIO, "pod deleted -> unprepare counted", seconds)
    assert value(samples, "nvidia_dra_prepared_devices", node=cluster.node, device_type="gpu") == 0
    assert not [k for k, v in samples.items() if k[0].endswith("_errors_total") and v], samples
