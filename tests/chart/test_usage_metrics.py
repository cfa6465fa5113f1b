"""metrics.usage: what both plugins get for the per-pod usage series (host PIDs, the switch, the kubelet's
pod-resources socket), the checks of the values, and the Grafana dashboard's ConfigMap."""

from __future__ import annotations

import json
import re
from typing import Any

from chart_helm import CHART_DIR, container, env, render, render_error

from nvdp.daemon.report import metrics

PLUGIN_DS, DRA_DS = "nvdp-nvidia-device-plugin", "nvdp-nvidia-device-plugin-dra-plugin"
PLUGIN_CTR, DRA_CTR = "nvidia-device-plugin-ctr", "nvidia-dra-plugin-ctr"
USAGE: dict[str, Any] = {"metrics": {"enabled": True, "usage": {"enabled": True}}}
DASHBOARD = "nvdp-nvidia-device-plugin-gpu-usage-dashboard"


def test_off_by_default_even_with_metrics() -> None:
    for values in ({}, {"metrics": {"enabled": True}},
                   {"metrics": {"enabled": True}, "dra": {"enabled": True}}):
        rendered = render(values)
        for daemonset, name in ((PLUGIN_DS, PLUGIN_CTR), (DRA_DS, DRA_CTR)):
            found = rendered.find("DaemonSet")
            if daemonset not in {d["metadata"]["name"] for d in found}:
                continue
            spec = rendered.one("DaemonSet", daemonset)["spec"]["template"]["spec"]
            assert "hostPID" not in spec
            assert "USAGE_METRICS" not in env(container(rendered.one("DaemonSet", daemonset), name))
        assert DASHBOARD not in {c["metadata"]["name"] for c in rendered.find("ConfigMap")}


def test_both_plugins_get_the_switch_and_the_hosts_pids() -> None:
    from nvdp.plugin.main import build_parser

    rendered = render({**USAGE, "dra": {"enabled": True, "defaultMode": "device-plugin"}})
    for daemonset, name in ((PLUGIN_DS, PLUGIN_CTR), (DRA_DS, DRA_CTR)):
        ds = rendered.one("DaemonSet", daemonset)
        assert ds["spec"]["template"]["spec"]["hostPID"] is True
        variables = env(container(ds, name))
        assert variables["USAGE_METRICS"] == "true"
        assert build_parser({k: v or "" for k, v in variables.items()}).parse_args([]).usage_metrics
    plugin = container(rendered.one("DaemonSet", PLUGIN_DS), PLUGIN_CTR)
    socket = env(plugin)["KUBELET_POD_RESOURCES_SOCKET"]
    assert socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
    mount = next(m for m in plugin["volumeMounts"] if m["mountPath"] == "/var/lib/kubelet/pod-resources")
    assert mount["readOnly"] is True
    # The kubelet's device checkpoint is read beside its socket, in the folder the plugin has anyway.
    assert any(m["mountPath"] == "/var/lib/kubelet/device-plugins" for m in plugin["volumeMounts"])


def test_usage_without_metrics_and_a_dashboard_without_usage_are_refused() -> None:
    error = render_error({"metrics": {"usage": {"enabled": True}}})
    assert "'metrics.usage.enabled' is true but 'metrics.enabled' is false" in error
    assert "Set 'metrics.enabled=true'" in error
    error = render_error({"metrics": {"enabled": True, "usage": {"dashboard": {"enabled": True}}}})
    assert "'metrics.usage.dashboard.enabled' is true but 'metrics.usage.enabled' is false" in error
    assert "Did you mean" in render_error({"metrics": {"usage": {"enable": True}}})


def test_the_dashboard_configmap_carries_the_sidecars_label_and_the_dashboard() -> None:
    dashboard = {"enabled": True}
    rendered = render({"metrics": {"enabled": True, "usage": {"enabled": True, "dashboard": dashboard}}})
    (configmap,) = [c for c in rendered.find("ConfigMap") if c["metadata"]["name"] == DASHBOARD]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["namespace"] == "nvidia-device-plugin"
    (text,) = configmap["data"].values()
    assert json.loads(text) == json.loads((CHART_DIR / "dashboards" / "gpu-usage.json").read_text())
    moved = render({"metrics": {"enabled": True, "usage": {"enabled": True, "dashboard": {
        **dashboard, "namespace": "monitoring", "labels": {"grafana_dashboard": None, "dashboards": "gpu"},
        "annotations": {"grafana_folder": "GPUs"}}}}})
    (configmap,) = [c for c in moved.find("ConfigMap") if c["metadata"]["name"] == DASHBOARD]
    assert configmap["metadata"]["namespace"] == "monitoring"
    assert configmap["metadata"]["labels"]["dashboards"] == "gpu"
    assert "grafana_dashboard" not in configmap["metadata"]["labels"]
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "GPUs"}


def test_the_dashboard_asks_only_for_series_and_labels_the_plugins_serve() -> None:
    served = {metrics.POD_GPU_MEMORY[0]: metrics.USAGE_LABELS,
              metrics.POD_GPU_SM_UTIL[0]: metrics.USAGE_LABELS,
              metrics.GPU_OTHER_PROCESSES[0]: metrics.USAGE_DEVICE_LABELS, metrics.USAGE_PROBLEMS[0]: (),
              metrics.USAGE_DURATION[0]: ()}
    text = (CHART_DIR / "dashboards" / "gpu-usage.json").read_text()
    dashboard = json.loads(text)
    expressions = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    expressions += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    for expr in expressions:
        names = set(re.findall(r"\bnvdp_[a-z_]+", expr))
        assert names and names <= set(served), expr
        labels = set(re.findall(r"(\w+)\s*=~", expr))
        for group in re.findall(r"by \(([^)]*)\)", expr):
            labels |= {label.strip() for label in group.split(",")}
        for name in names:
            assert labels <= set(served[name]) | {"instance"}, (expr, labels - set(served[name]))


def test_the_service_monitor_keeps_the_series_pod_labels() -> None:
    def endpoint(values: dict[str, Any]) -> dict[str, Any]:
        found: dict[str, Any] = render(values).one("ServiceMonitor", "nvdp-nvidia-device-plugin")["spec"][
            "endpoints"][0]
        return found

    monitor = {"serviceMonitor": {"enabled": True}}
    assert "honorLabels" not in endpoint({"metrics": {"enabled": True, **monitor}})
    assert endpoint({"metrics": {**USAGE["metrics"], **monitor}})["honorLabels"] is True
