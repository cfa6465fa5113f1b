"""Metrics, probes and `nvdp doctor` on a real node, with the plugin on the host network.

Users set `devicePlugin.enableHostNetwork` too, so this is the suite's one scenario that does: the
plugin's pod IP is the node's address, its probe and metrics ports listen there, and it still reaches
the API server through the `kubernetes` Service. The kubelet's real HTTP probes decide readiness. The
metrics Service is headless: Prometheus scrapes the endpoints it selects, one per pod, and so does this
scenario, reading the Service's EndpointSlices and fetching /metrics from each endpoint from the node.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from .e2e_cluster import SIM_STATE_MOUNT, Cluster, Images, Release, Timings

pytestmark = pytest.mark.incremental
SCENARIO = "metrics and probes"
GPU = "nvidia.com/gpu"
T4 = "GPU-a4d98c34-f034-41fa-9519-b5bab976e4df"


@pytest.fixture(scope="module")
def release(cluster: Cluster, images: Images) -> Iterator[Release]:
    cluster.label({"nvidia.com/gpu.present": "true"})
    release = Release(cluster, images, "nvdp-obs", "nvdp-e2e-observability")
    yield release
    release.uninstall()
    cluster.label({"nvidia.com/gpu.present": None})
    cluster.kubectl("delete", "namespace", release.namespace, "--wait=false", check=False)


def endpoints(cluster: Cluster, release: Release) -> list[tuple[str, int]]:
    """(pod IP, port) of every ready endpoint of the release's metrics Service."""
    service = f"{release.name}-nvidia-device-plugin-metrics"
    slices: dict[str, Any] = cluster.kubectl_json(
        "get", "endpointslices", "-n", release.namespace, "-l", f"kubernetes.io/service-name={service}"
    )
    found = []
    for item in slices["items"]:
        ports = [p["port"] for p in item.get("ports") or [] if p.get("name") == "metrics"]
        for endpoint in item.get("endpoints") or []:
            if endpoint.get("conditions", {}).get("ready"):
                found += [(address, port) for address in endpoint["addresses"] for port in ports]
    return found


def get(cluster: Cluster, url: str) -> str:
    return cluster.host(f"curl -sS --max-time 5 {url}").stdout


def test_install_with_metrics_is_ready_when_registered(cluster: Cluster, release: Release,
                                                        timings: Timings) -> None:
    with timings.measure(SCENARIO, "helm install --wait (metrics.enabled)"):
        release.install("--set", "metrics.enabled=true", "--set", "devicePlugin.enableHostNetwork=true",
                        *SIM_STATE_MOUNT)
    seconds = cluster.wait_allocatable(1, namespace=release.namespace)
    timings.add(SCENARIO, "installed -> allocatable 1", seconds)
    (pod,) = release.pods("device-plugin")
    assert pod["spec"].get("hostNetwork") is True
    assert pod["status"]["podIP"] == pod["status"]["hostIP"], pod["status"]
    (container,) = [c for c in pod["spec"]["containers"] if c.get("readinessProbe")]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    timings.add(SCENARIO, "allocatable 1 -> Ready (kubelet's HTTP probe)", release.wait_ready())


def test_scrape_through_the_services_endpoints(cluster: Cluster, release: Release, timings: Timings) -> None:
    found, seconds = cluster.wait_for("a ready endpoint of the metrics Service",
                                      lambda: endpoints(cluster, release) or None, timeout=60)
    timings.add(SCENARIO, "metrics endpoint ready", seconds)
    (pod,) = release.pods("device-plugin")
    address, port = next((a, p) for a, p in found if a == pod["status"]["podIP"])
    text = get(cluster, f"http://{address}:{port}/metrics")
    assert f'nvdp_devices{{health="healthy",resource="{GPU}"}} 1.0' in text, text[-2000:]
    assert f'nvdp_resource_registered{{resource="{GPU}"}} 1.0' in text
    assert 'nvdp_build_info{component="device-plugin"' in text
    ready = get(cluster, f"http://{address}:9447/readyz")
    assert ready.splitlines()[:2] == ["ready", f"{GPU}: registered"], ready


def test_xid_shows_in_the_metrics(cluster: Cluster, release: Release, timings: Timings) -> None:
    (address, port), *_ = endpoints(cluster, release)
    cluster.inject_xid(T4, 79)
    timings.add(SCENARIO, "XID 79 -> allocatable 0", cluster.wait_allocatable(0, namespace=release.namespace))
    text = get(cluster, f"http://{address}:{port}/metrics")
    assert f'nvdp_xid_events_total{{action="critical",gpu="{T4}",xid="79"}} 1.0' in text, text[-2000:]
    assert f'nvdp_devices{{health="unhealthy",resource="{GPU}"}} 1.0' in text
    # Still ready: the resource is registered, its device is Unhealthy (the kubelet schedules around it).
    assert get(cluster, f"http://{address}:9447/readyz").startswith("ready\n")


def test_doctor_in_the_plugin_pod(cluster: Cluster, release: Release) -> None:
    (pod,) = release.pods("device-plugin")
    done = cluster.kubectl("exec", "-n", release.namespace, pod["metadata"]["name"], "--", "nvdp", "doctor",
                           "--json", check=False)
    report = json.loads(done.stdout)
    checks = {c["check"]: c for c in report["checks"]}
    # The stand-in NVML has no /dev/nvidiactl behind it, so the runtime check fails here, as it should.
    for name in ("nvml", "driver", "kubelet", "registration", "config", "mps", "mig"):
        assert checks[name]["status"] == "PASS", checks[name]
    assert "per the plugin's /readyz" in checks["registration"]["detail"]
    assert checks["runtime"]["status"] == "FAIL" and "nvidiactl" in checks["runtime"]["detail"]
    assert done.returncode == 1


def test_clearing_the_gpu_and_uninstall_removes_the_service(cluster: Cluster, release: Release) -> None:
    (pod,) = release.pods("device-plugin")
    cluster.exec(release.namespace, pod["metadata"]["name"], "nvdp", "health", "clear", "--all")
    cluster.wait_allocatable(1, namespace=release.namespace)
    release.uninstall()
    cluster.wait_for("the release's pods to go", lambda: not release.pods(), 60)
    left = cluster.kubectl("get", "services,endpointslices,networkpolicies", "-n", release.namespace,
                           "-l", release.selector, "-o", "name").stdout  # fmt: skip
    assert left.strip() == ""
