"""The chart's GPU feature discovery: DaemonSets, RBAC, admission policy, NOTES, env contract."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from chart_helm import Manifest, Rendered, container, env, render, set_file, values_file

from nvdp.gfd.options import CONFIG_FILE_ENVS, GFD_ENV_VARS, parse_options

DATA = Path(__file__).parent / "data"
PLUGIN = "nvdp-nvidia-device-plugin"
GFD = f"{PLUGIN}-gpu-feature-discovery"
PRESENCE = f"{PLUGIN}-gpu-presence"
CLUSTER_NAME = f"{PLUGIN}-nvidia-device-plugin-node-labeller"  # fullname-namespace-node-labeller
SA_USER = f"system:serviceaccount:nvidia-device-plugin:{GFD}"
# Read by gpu-feature-discovery outside the config loader, or by the container runtime.
# Read by the per-node config settings (nvdp.daemon.pernode.nodeconfig.settings_from), whatever the daemon.
NODE_CONFIG_ENV = {"CONFIG_DIR", "DEFAULT_CONFIG", "FALLBACK_STRATEGIES"}
PROCESS_ENV = {"NODE_NAME", "NAMESPACE", "POD_NAME", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES",
               "NVIDIA_MIG_MONITOR_DEVICES"}  # fmt: skip
MPS_CONFIG = "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 10\n"


def gfd_ctr(rendered: Rendered) -> Manifest:
    return container(rendered.one("DaemonSet", GFD), "gpu-feature-discovery-ctr")


def pod_spec(ds: Manifest) -> Manifest:
    spec: Manifest = ds["spec"]["template"]["spec"]
    return spec


def test_nothing_by_default() -> None:
    rendered = render({})
    assert sorted(rendered.daemonsets()) == [PLUGIN]
    for kind in ("ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy"):
        # The plugin's own Node-events role (events.enabled) is all there is.
        names = [o["metadata"]["name"] for o in rendered.find(kind)]
        assert [n for n in names if not n.endswith("-events")] == []


def test_gfd_daemonset_runs_the_plugin_image_where_the_plugin_runs() -> None:
    rendered = render({"gfd": {"enabled": True}})
    ds, plugin = rendered.one("DaemonSet", GFD), rendered.one("DaemonSet", PLUGIN)
    ctr = gfd_ctr(rendered)
    assert ctr["command"] == ["gpu-feature-discovery"]
    assert ctr["image"] == container(plugin, "nvidia-device-plugin-ctr")["image"]
    for key in ("affinity", "tolerations", "priorityClassName"):
        assert pod_spec(ds)[key] == pod_spec(plugin)[key]
    assert pod_spec(ds)["serviceAccountName"] == GFD
    assert pod_spec(ds)["automountServiceAccountToken"] is True
    assert ctr["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert "GFD_USE_NODE_FEATURE_API" not in env(ctr)  # unset: label the Node directly
    # Only the health authority's health.json directory, read-only (test_health_recovery.py).
    assert [m["name"] for m in ctr["volumeMounts"]] == ["health-state"]


def test_gfd_values_become_nvidia_env_names() -> None:
    rendered = render({"gfd": {"enabled": True, "noTimestamp": True, "sleepInterval": "10m"},
                       "migStrategy": "mixed", "failOnInitError": False})  # fmt: skip
    e = env(gfd_ctr(rendered))
    assert (e["GFD_NO_TIMESTAMP"], e["GFD_SLEEP_INTERVAL"]) == ("true", "10m")
    assert (e["MIG_STRATEGY"], e["FAIL_ON_INIT_ERROR"]) == ("mixed", "false")


def test_bad_sleep_interval_is_refused_at_install() -> None:
    from chart_helm import render_error

    assert "sleepInterval" in render_error({"gfd": {"enabled": True, "sleepInterval": "soon"}})


def test_every_gfd_env_var_is_read_by_gpu_feature_discovery() -> None:
    values: dict[str, Any] = {
        "gfd": {"enabled": True, "noTimestamp": True, "sleepInterval": "1m", "useNodeFeatureAPI": True},
        "migStrategy": "single", "failOnInitError": True, "nvidiaDriverRoot": "/run/nvidia/driver",
        "deviceDiscoveryStrategy": "nvml", "config": {"map": {"config": MPS_CONFIG}},
    }  # fmt: skip
    e = env(gfd_ctr(render(values)))
    unknown = set(e) - set(GFD_ENV_VARS) - set(CONFIG_FILE_ENVS) - PROCESS_ENV - NODE_CONFIG_ENV
    assert not unknown, f"gpu-feature-discovery does not read {sorted(unknown)}"
    # and the loader accepts every rendered value
    from nvdp.gfd.discovery import load

    known = {k: v for k, v in e.items() if v is not None and k not in NODE_CONFIG_ENV}
    config = load(parse_options([], known), known)
    assert config.flags.gfd.sleep_interval == "1m"
    assert config.flags.use_node_feature_api is True


def test_features_file_output_mounts_features_d_and_needs_no_token() -> None:
    rendered = render({"gfd": {"enabled": True, "useNodeFeatureAPI": False}})
    ds = rendered.one("DaemonSet", GFD)
    assert env(gfd_ctr(rendered))["GFD_USE_NODE_FEATURE_API"] == "false"
    assert pod_spec(ds)["automountServiceAccountToken"] is False
    mount, health = gfd_ctr(rendered)["volumeMounts"]
    assert mount["mountPath"] == "/etc/kubernetes/node-feature-discovery/features.d"
    assert health["name"] == "health-state"


def test_node_feature_api_gets_its_rbac_rule() -> None:
    rendered = render({"gfd": {"enabled": True, "useNodeFeatureAPI": True}})
    rules = rendered.one("ClusterRole", CLUSTER_NAME)["rules"]
    assert {"apiGroups": ["nfd.k8s-sigs.io"], "resources": ["nodefeatures"],
            "verbs": ["get", "create", "update"]} in rules  # fmt: skip
    rendered = render({"gfd": {"enabled": True}})
    rules = rendered.one("ClusterRole", CLUSTER_NAME)["rules"]
    assert rules == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]}]
    # Its Node's Events through a Role in the default namespace, created only.
    (events,) = [r for r in rendered.find("Role") if r["metadata"]["name"].endswith("-gfd-events")]
    assert events["metadata"]["namespace"] == "default"
    assert events["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]


def test_rbac_binds_the_labeller_account() -> None:
    rendered = render({"gfd": {"enabled": True}})
    binding = rendered.one("ClusterRoleBinding", CLUSTER_NAME)
    assert binding["roleRef"]["name"] == CLUSTER_NAME
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": GFD, "namespace": "nvidia-device-plugin"}
    ]
    assert rendered.one("ServiceAccount", GFD).get("automountServiceAccountToken") is None


def test_admission_policy_targets_the_labeller_account() -> None:
    rendered = render({"gfd": {"enabled": True}})
    policy = rendered.one("ValidatingAdmissionPolicy", CLUSTER_NAME)
    assert policy["apiVersion"] == "admissionregistration.k8s.io/v1"
    (condition,) = policy["spec"]["matchConditions"]
    assert condition["expression"] == f'request.userInfo.username == "{SA_USER}"'
    binding = rendered.one("ValidatingAdmissionPolicyBinding", CLUSTER_NAME)
    assert binding["spec"] == {"policyName": CLUSTER_NAME, "validationActions": ["Deny"]}


def test_presence_check_runs_on_every_linux_node() -> None:
    rendered = render({"gfd": {"detectNodes": True}})
    assert sorted(rendered.daemonsets()) == [PLUGIN, PRESENCE]
    spec = pod_spec(rendered.one("DaemonSet", PRESENCE))
    assert "affinity" not in spec
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert spec["tolerations"] == [{"operator": "Exists"}]
    assert spec["serviceAccountName"] == GFD
    (ctr,) = spec["containers"]
    assert ctr["command"] == ["gpu-feature-discovery", "--presence-only"]
    assert ctr["resources"]["requests"]["memory"] == "16Mi"
    assert rendered.find("ValidatingAdmissionPolicy")  # the presence check labels too


def test_labellers_may_reach_the_api_server_despite_deny_all() -> None:
    rendered = render({"gfd": {"enabled": True}})
    policy = rendered.one("NetworkPolicy", f"{PLUGIN}-labeller-api")
    assert policy["spec"]["policyTypes"] == ["Egress"]
    assert {p["port"] for p in policy["spec"]["egress"][0]["ports"]} == {443, 6443}


def test_seed_004_with_gfd_needs_no_hand_label() -> None:
    values = values_file(DATA / "seed-004-values.yaml")
    config = set_file(f"config.map.config={DATA / 'seed-004-config.yaml'}")
    without = render({**values, **config})
    assert "kubectl label node <node> nvidia.com/mps.capable=true" in without.notes
    rendered = render({**values, **config, "gfd": {"enabled": True}})
    assert "nvidia.com/mps.capable=true" not in rendered.notes.split("GPU feature discovery labels")[0]
    assert "kubectl label node <node> nvidia.com/mps.capable" not in rendered.notes
    assert "GPU feature discovery labels the nodes whose config shares GPUs with MPS" in rendered.notes
    assert sorted(rendered.daemonsets()) == [PLUGIN, GFD, f"{PLUGIN}-mps-control-daemon"]
    # the labeller chooses the config entry as the plugin does, from the same settings
    plugin = container(rendered.one("DaemonSet", PLUGIN), "nvidia-device-plugin-ctr")
    for name in sorted(NODE_CONFIG_ENV - {"DEFAULT_CONFIG"}):
        assert env(gfd_ctr(rendered))[name] == env(plugin)[name]


def test_notes_point_at_detect_nodes_with_the_default_affinity() -> None:
    assert "set gfd.detectNodes=true" in render({}).notes
    assert "set gfd.detectNodes=true" not in render({"gfd": {"detectNodes": True}}).notes
    assert "which gfd.detectNodes sets on every node" in render({"gfd": {"detectNodes": True}}).notes
    seed = values_file(DATA / "seed-004-values.yaml")  # its own affinity: not our labels
    assert "detectNodes" not in render(seed).notes


@pytest.mark.parametrize("values", [
    {"gfd": {"enabled": True}},
    {"gfd": {"enabled": True, "useNodeFeatureAPI": True, "detectNodes": True}},
    {"gfd": {"enabled": True, "useNodeFeatureAPI": False}, "nvidiaDriverRoot": "/run/nvidia/driver"},
], ids=["node", "nodefeature+presence", "file"])  # fmt: skip
def test_renders_valid_objects_on_1_30_and_later(values: dict[str, Any]) -> None:
    problems = []
    for obj in render(values).objects:
        for version in ("1.30.0", "1.37.0"):
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                problems.append(f"{obj['kind']}/{obj['metadata']['name']} on {version}: {error.message}")
    assert not problems, "\n".join(problems)


def test_per_node_config_is_followed_like_the_plugin() -> None:
    two = {"config": {"map": {"plain": "version: v1\n", "mps": MPS_CONFIG}, "default": "plain"},
           "gfd": {"enabled": True}}  # fmt: skip
    rendered = render(two)
    ctr, plugin = gfd_ctr(rendered), container(rendered.one("DaemonSet", PLUGIN), "nvidia-device-plugin-ctr")
    for name in ("CONFIG_DIR", "DEFAULT_CONFIG", "FALLBACK_STRATEGIES"):
        assert env(ctr)[name] == env(plugin)[name]
    assert "CONFIG_FILE" not in env(ctr)
    assert {m["mountPath"] for m in ctr["volumeMounts"]} == {"/available-configs", "/run/nvidia/nvdp"}
    assert "checksum/config" not in (rendered.one("DaemonSet", GFD)["spec"]["template"]["metadata"]
                                     .get("annotations") or {})  # fmt: skip
    # and the labeller reads them: per-node settings from the rendered environment
    opts = parse_options([], {k: v for k, v in env(ctr).items() if v is not None})
    assert opts.node_config is not None and opts.node_config.default == "plain"


@pytest.mark.parametrize("kube_version", ["v1.25.0", "v1.29.0", "v1.30.0", "v1.36.0"])
def test_lint_strict_clean_with_gfd_before_and_after_admission_policies(kube_version: str) -> None:
    # Before 1.30 the policy is skipped (and NOTES say so); lint renders every template at that version.
    import helm_python
    from chart_helm import CHART_DIR

    # Before 1.30 the install is refused unless the unfenced labeller is accepted (test_least_privilege.py).
    values = {"gfd": {"enabled": True, "detectNodes": True,
                      "allowWithoutAdmissionPolicy": kube_version < "v1.30"}}  # fmt: skip
    report = helm_python.lint(str(CHART_DIR), values, strict=True, namespace="nvidia-device-plugin",
                              kube_version=kube_version)  # fmt: skip
    problems = [m for m in report["messages"] if m["error"] != "icon is recommended"]
    assert not problems and not report["errors"], (problems, report["errors"])
