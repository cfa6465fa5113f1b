"""Metrics, probes and their Service, ServiceMonitor and NetworkPolicy in the rendered chart."""

from __future__ import annotations

from typing import Any

import pytest
from chart_helm import Manifest, Rendered, container, env, render
from test_render import ALL_VERSIONS, EDGE_VERSIONS, assert_valid

PLUGIN_DS = "nvdp-nvidia-device-plugin"
MPS_DS = "nvdp-nvidia-device-plugin-mps-control-daemon"
PLUGIN_CTR = "nvidia-device-plugin-ctr"
MPS_CTR = "mps-control-daemon-ctr"
MPS_CONFIG = "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
METRICS_ON: dict[str, Any] = {"metrics": {"enabled": True}, "config": {"map": {"config": MPS_CONFIG}}}


def plugin(rendered: Rendered) -> Manifest:
    return container(rendered.one("DaemonSet", PLUGIN_DS), PLUGIN_CTR)


def mps(rendered: Rendered) -> Manifest:
    return container(rendered.one("DaemonSet", MPS_DS), MPS_CTR)


def kubernetes_objects(rendered: Rendered) -> list[Manifest]:
    """Everything but the Prometheus Operator's ServiceMonitor, which has no Kubernetes schema."""
    return [o for o in rendered.objects if o["kind"] != "ServiceMonitor"]


def test_metrics_off_renders_nothing_for_metrics() -> None:
    rendered = render({"config": {"map": {"config": MPS_CONFIG}}})
    assert rendered.find("Service") == [] and rendered.find("ServiceMonitor") == []
    policies = {p["metadata"]["name"] for p in rendered.find("NetworkPolicy")}
    assert "nvdp-nvidia-device-plugin-allow-metrics" not in policies
    assert "METRICS_ADDRESS" not in env(plugin(rendered)) and "METRICS_ADDRESS" not in env(mps(rendered))
    assert [p["name"] for p in plugin(rendered)["ports"]] == ["health"]
    assert "ports" not in mps(rendered)


def test_metrics_on_adds_ports_a_headless_service_and_a_scoped_network_policy() -> None:
    rendered = render(METRICS_ON)
    assert env(plugin(rendered))["METRICS_ADDRESS"] == ":9445"
    assert env(mps(rendered))["METRICS_ADDRESS"] == ":9446"
    ports = {p["name"]: p["containerPort"] for p in plugin(rendered)["ports"]}
    assert ports == {"metrics": 9445, "health": 9447}
    assert mps(rendered)["ports"] == [{"name": "metrics", "containerPort": 9446, "protocol": "TCP"}]

    service = rendered.one("Service")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9445, "targetPort": "metrics", "protocol": "TCP"}
    ]
    # The Service selects both DaemonSets' pods (each names its port "metrics").
    for name in (PLUGIN_DS, MPS_DS):
        pod_labels = rendered.one("DaemonSet", name)["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= pod_labels.items()
    assert rendered.find("ServiceMonitor") == []

    policy = rendered.one("NetworkPolicy", "nvdp-nvidia-device-plugin-allow-metrics")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": 9445, "protocol": "TCP"}, {"port": 9446, "protocol": "TCP"}]
    monitoring = {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    assert rule["from"] == [{"namespaceSelector": monitoring}]
    # The deny-all policy stays: only the metrics ports are opened, and only from those namespaces.
    rendered.one("NetworkPolicy", "nvdp-nvidia-device-plugin-deny-all")
    assert_valid(kubernetes_objects(rendered), ALL_VERSIONS)


def test_network_policy_selectors_are_configurable() -> None:
    selector = {"matchExpressions": [{"key": "team", "operator": "In", "values": ["observability"]}]}
    # Helm merges maps with the defaults: matchLabels: null drops the default namespace name.
    rendered = render({"metrics": {"enabled": True, "networkPolicy": {
        "namespaceSelector": {**selector, "matchLabels": None},
        "podSelector": {"matchLabels": {"app": "prometheus"}}}}})
    (rule,) = rendered.one("NetworkPolicy", "nvdp-nvidia-device-plugin-allow-metrics")["spec"]["ingress"]
    prometheus = {"matchLabels": {"app": "prometheus"}}
    assert rule["from"] == [{"namespaceSelector": selector, "podSelector": prometheus}]
    assert_valid(rendered.objects, EDGE_VERSIONS)
    off = render({"metrics": {"enabled": True}, "networkPolicy": {"enabled": False}})
    assert off.find("NetworkPolicy") == []


def test_service_monitor_only_when_enabled_and_it_selects_the_service() -> None:
    rendered = render({"metrics": {"enabled": True, "serviceMonitor": {
        "enabled": True, "interval": "15s", "labels": {"release": "kube-prometheus-stack"}}}})
    monitor = rendered.one("ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    service = rendered.one("Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [service["metadata"]["namespace"]]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"], endpoint["interval"]) == ("metrics", "/metrics", "15s")
    # Without metrics a ServiceMonitor alone would scrape nothing: it is not rendered.
    assert render({"metrics": {"serviceMonitor": {"enabled": True}}}).find("ServiceMonitor") == []


def test_probes_hit_the_plugins_health_port() -> None:
    ctr = plugin(render({}))
    assert env(ctr)["HEALTH_ADDRESS"] == ":9447"
    assert ctr["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert ctr["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert ctr["livenessProbe"]["periodSeconds"] == 30 and ctr["readinessProbe"]["periodSeconds"] == 10
    off = plugin(render({"probes": {"enabled": False}}))
    assert "livenessProbe" not in off and "readinessProbe" not in off and "ports" not in off
    assert "HEALTH_ADDRESS" not in env(off)


@pytest.mark.parametrize("values", [
    {"metrics": {"enabled": True, "port": 19445, "mpsPort": 19446}, "probes": {"port": 19447},
     "devicePlugin": {"enableHostNetwork": True},
     "mps": {"enabled": True, "enableHostNetwork": True, "upgrade": "immediately"}},
    {"metrics": {"enabled": True}, "probes": {"enabled": False}},
], ids=["host-network-custom-ports", "metrics-without-probes"])
def test_variants_are_valid(values: dict[str, Any]) -> None:
    assert_valid(kubernetes_objects(render(values)), EDGE_VERSIONS)


def test_a_waiting_surge_of_mps_daemons_on_the_host_network_is_refused_naming_the_port() -> None:
    from chart_helm import render_error

    problem = render_error({"metrics": {"enabled": True, "mpsPort": 19446},
                           "mps": {"enabled": True, "enableHostNetwork": True}})
    assert "'mps.upgrade' is whenIdle" in problem and "port 19446" in problem
    assert "mps.enableHostNetwork=false" in problem and "mps.upgrade=immediately" in problem


@pytest.mark.parametrize(("values", "field"), [
    ({"metrics": {"port": 0}}, "metrics.port"),
    ({"probes": {"liveness": {"periodSecond": 5}}}, "periodSecond"),
    ({"metrics": {"serviceMonitor": {"interval": "often"}}}, "interval"),
])
def test_bad_values_are_refused(values: dict[str, Any], field: str) -> None:
    from chart_helm import render_error

    assert field.split(".")[-1] in render_error(values)


def test_a_dra_only_install_gets_the_metrics_service_monitor_and_policy() -> None:
    # The DRA plugin serves nvidia_dra_* on its own "metrics" port: without the device plugin the
    # Service, ServiceMonitor and policy must still be there, or nothing scrapes it.
    rendered = render({"devicePlugin": {"enabled": False}, "dra": {"enabled": True},
                       "metrics": {"enabled": True, "serviceMonitor": {"enabled": True}},
                       "networkPolicy": {"enabled": True}})
    (dra,) = [d for d in rendered.find("DaemonSet") if d["metadata"]["name"].endswith("-dra-plugin")]
    assert PLUGIN_DS not in rendered.daemonsets()
    service = rendered.one("Service")
    pod_labels = dra["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    ports = [p["name"] for c in dra["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])]
    assert "metrics" in ports
    assert rendered.find("ServiceMonitor") != []
    policies = {p["metadata"]["name"] for p in rendered.find("NetworkPolicy")}
    assert "nvdp-nvidia-device-plugin-allow-metrics" in policies
