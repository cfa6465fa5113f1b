"""The DRA plugin's least privilege in the chart: claims' status (and 1.36's resourceclaims/driver), for
what each prepared device is, with the admission policy that narrows it to this driver's entries of
claims on the plugin's own node, whatever the config entries; no pod list (the kubelet's pod-resources
API answers which pods use the GPUs); Events only created; the device plugin's Node Events through a
Role in the one namespace they are written in."""

from __future__ import annotations

from typing import Any

import pytest
from chart_helm import NAMESPACE, Manifest, Rendered, merge_values, render

DRA = {"dra": {"enabled": True}}
DRA_ROLE = "nvdp-nvidia-device-plugin-nvidia-device-plugin-dra-plugin"
STATUS_POLICY = f"{DRA_ROLE}-claim-status"
DRA_ACCOUNT = "nvdp-nvidia-device-plugin-dra-plugin"
PLUGIN_ACCOUNT = "nvdp-nvidia-device-plugin-service-account"
DYNAMIC = "version: v1\nflags:\n  mode: dra\n  migStrategy: dynamic\n"
MIXED = "version: v1\nflags:\n  mode: dra\n  migStrategy: mixed\n"
STATUS_RULES = {("resource.k8s.io", "resourceclaims/status"), ("resource.k8s.io", "resourceclaims/driver")}
# The Node events' namespace (nvdp.kube.events.EVENT_NAMESPACE).
EVENT_NAMESPACE = "default"


def dra(values: dict[str, Any] | None = None) -> Rendered:
    return render(merge_values(DRA, values or {}))


def dra_rules(rendered: Rendered) -> dict[tuple[str, str], set[str]]:
    role = rendered.one("ClusterRole", DRA_ROLE)
    return {(g, r): set(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"]
            for r in rule["resources"]}  # fmt: skip


def status_policy(rendered: Rendered) -> Manifest | None:
    found = rendered.find("ValidatingAdmissionPolicy", STATUS_POLICY)
    return found[0] if found else None


# -- claims' status: every prepared claim's, whatever the entries --------------------------------------

DYNAMIC_CASES: dict[str, tuple[dict[str, Any], bool]] = {
    "no config": ({}, True),
    "an entry without MIG": ({"config": {"map": {"plain": "version: v1\n"}}}, True),
    "an entry with migStrategy mixed": ({"config": {"map": {"mixed": MIXED}}}, True),
    "an entry with migStrategy dynamic": ({"config": {"map": {"mig": DYNAMIC, "plain": "version: v1\n"},
                                                      "default": "plain"}}, True),
    "an entry as a map (values file)": ({"config": {"map": {"mig": {
        "version": "v1", "flags": {"mode": "dra", "migStrategy": "dynamic"}}}}}, True),
    "an existing ConfigMap (config.name): its entries unseen, so maybe": (
        {"config": {"name": "mine", "default": "a"}}, True),
}


@pytest.mark.parametrize("case", list(DYNAMIC_CASES))
def test_claim_status_is_granted_with_its_admission_policy_whatever_the_entries(case: str) -> None:
    values, dynamic = DYNAMIC_CASES[case]
    rendered = dra(values)
    rules = dra_rules(rendered)
    assert (set(rules) >= STATUS_RULES) is dynamic, rules
    assert not (STATUS_RULES & set(rules)) or dynamic
    assert (status_policy(rendered) is not None) is dynamic
    assert bool(rendered.find("ValidatingAdmissionPolicyBinding", STATUS_POLICY)) is dynamic
    # Always: the claims read, the slices written (narrowed by the slices policy), the Node read.
    assert rules[("resource.k8s.io", "resourceclaims")] == {"get", "list", "watch"}
    assert rules[("resource.k8s.io", "resourceslices")] == {"get", "list", "watch", "create", "update",
                                                            "delete"}
    assert rendered.find("ValidatingAdmissionPolicy", DRA_ROLE)


def test_the_status_rules_name_the_patch_and_this_drivers_node_aware_verb() -> None:
    role = dra({"dra": {"driverName": "gpu.example.com"}, "config": {"map": {"mig": DYNAMIC}}}).one(
        "ClusterRole", DRA_ROLE)
    status = [r for r in role["rules"] if r["resources"] == ["resourceclaims/status"]]
    driver = [r for r in role["rules"] if r["resources"] == ["resourceclaims/driver"]]
    assert status == [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/status"],
                       "verbs": ["patch"]}]
    assert driver == [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/driver"],
                       "resourceNames": ["gpu.example.com"], "verbs": ["associated-node:patch"]}]


def test_the_status_policy_matches_the_plugins_status_updates_only() -> None:
    rendered = dra({"dra": {"driverName": "gpu.example.com"}, "config": {"map": {"mig": DYNAMIC}}})
    policy = status_policy(rendered)
    assert policy is not None
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [{
        "apiGroups": ["resource.k8s.io"], "apiVersions": ["*"], "operations": ["UPDATE"],
        "resources": ["resourceclaims/status"]}]
    (condition,) = spec["matchConditions"]
    assert condition["expression"] == (
        f'request.userInfo.username == "system:serviceaccount:{NAMESPACE}:{DRA_ACCOUNT}"')
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert "request.userInfo.extra['authentication.kubernetes.io/node-name'][0]" in variables["tokenNode"]
    # The node: the allocation's node selector names the token's node alone, else this driver's pool.
    assert "f.key == 'metadata.name' && f.operator == 'In'" in variables["allocatedHere"]
    assert "f.values == [variables.tokenNode]" in variables["allocatedHere"]
    assert "r.driver == 'gpu.example.com' && r.pool == variables.tokenNode" in variables["allocatedHere"]
    expressions = [v["expression"] for v in spec["validations"]]
    assert expressions == [
        "variables.tokenNode != ''",
        "variables.allocatedHere",
        "size(variables.changedFields) == 0",  # allocation, reservedFor, anything but devices
        "variables.changedDevices.all(d, d.driver == 'gpu.example.com')",
        "variables.changedDevices.all(d, d.pool == variables.tokenNode)",
    ]
    assert all(v["reason"] == "Forbidden" for v in spec["validations"])
    binding = rendered.one("ValidatingAdmissionPolicyBinding", STATUS_POLICY)
    assert binding["spec"] == {"policyName": STATUS_POLICY, "validationActions": ["Deny"]}


def test_the_policies_are_cluster_objects_named_after_the_release_and_namespace() -> None:
    one = dra({"config": {"map": {"mig": DYNAMIC}}})
    other = render(merge_values(DRA, {"config": {"map": {"mig": DYNAMIC}}}), namespace="gpu-b")
    assert status_policy(one) is not None
    assert {o["metadata"]["name"] for o in other.find("ValidatingAdmissionPolicy")}.isdisjoint(
        {o["metadata"]["name"] for o in one.find("ValidatingAdmissionPolicy")})


# -- pods and events ---------------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(DYNAMIC_CASES))
def test_the_dra_plugin_lists_no_pods_and_only_creates_events(case: str) -> None:
    rules = dra_rules(dra(DYNAMIC_CASES[case][0]))
    assert not any(resource == "pods" or resource.startswith("pods/") for _, resource in rules)
    # Events on the claims it prepares, in the claims' namespaces (any): cluster-wide, created only.
    assert rules[("", "events")] == {"create"}


def test_the_dra_daemonset_mounts_the_kubelets_pod_resources_read_only() -> None:
    ds = dra().one("DaemonSet", DRA_ACCOUNT)
    spec = ds["spec"]["template"]["spec"]
    (ctr,) = [c for c in spec["containers"] if c["name"] == "nvidia-dra-plugin-ctr"]
    socket = {e["name"]: e.get("value") for e in ctr["env"]}["KUBELET_POD_RESOURCES_SOCKET"]
    assert socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
    mounts = {m["mountPath"]: m for m in ctr["volumeMounts"]}
    assert mounts["/var/lib/kubelet/pod-resources"].get("readOnly") is True


def test_node_events_are_granted_through_a_role_in_their_namespace() -> None:
    rendered = render({"events": {"enabled": True}})
    assert not rendered.find("ClusterRole") and not rendered.find("ClusterRoleBinding")
    (role,) = rendered.find("Role")
    assert role["metadata"]["namespace"] == EVENT_NAMESPACE
    assert role["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    (binding,) = rendered.find("RoleBinding")
    assert binding["metadata"]["namespace"] == EVENT_NAMESPACE
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": PLUGIN_ACCOUNT, "namespace": NAMESPACE}]
    # Releases of the same name in two namespaces each have their own Role there.
    other = render({"events": {"enabled": True}}, namespace="gpu-b")
    assert other.one("Role")["metadata"]["name"] != role["metadata"]["name"]
    assert len(role["metadata"]["name"]) <= 63
