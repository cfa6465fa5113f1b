"""Which values give which pods access to the Kubernetes API: each adds exactly the rules it needs,
and only the pods that use them get a service account token. Nothing else talks to the API server:
the plugin and the MPS daemon reach the kubelet and each other over host sockets."""

from __future__ import annotations

from typing import Any

import pytest
from chart_helm import Rendered, render

PLUGIN = "nvdp-nvidia-device-plugin"
MPS = "nvdp-nvidia-device-plugin-mps-control-daemon"
GFD = "nvdp-nvidia-device-plugin-gpu-feature-discovery"
DRA = "nvdp-nvidia-device-plugin-dra-plugin"
DRA_MPS = "nvdp-nvidia-device-plugin-dra-mps"  # the MPS daemons of DRA claims: no token
PRESENCE = "nvdp-nvidia-device-plugin-gpu-presence"
PLUGIN_ACCOUNT = "nvdp-nvidia-device-plugin-service-account"
MPS_ENTRY = "version: v1\nsharing:\n  mps:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 10}\n"
PLAIN_ENTRY = "version: v1\n"

Rules = dict[tuple[str, str], frozenset[str]]


def rules(*items: tuple[str, str, str]) -> Rules:
    """(apiGroup, resource, "verb verb ...") -> the rule table."""
    return {(group, resource): frozenset(verbs.split()) for group, resource, verbs in items}


NODE_READ = ("", "nodes", "get list watch")
# Node Events: a Role in the default namespace, created only (rbac-events.yaml).
EVENTS = ("", "events", "create")

# values -> (the rules bound to each account, the token of each DaemonSet's pods)
CASES: dict[str, tuple[dict[str, Any], dict[str, Rules], dict[str, bool]]] = {
    "defaults": ({}, {}, {PLUGIN: False}),
    "one config entry (seed 004)": (
        {"config": {"map": {"config": MPS_ENTRY}}}, {}, {PLUGIN: False, MPS: False}),
    "one config entry and config.default": (
        {"config": {"map": {"config": MPS_ENTRY}, "default": "config"}}, {}, {PLUGIN: False, MPS: False}),
    "one entry called default, fallback named": (
        {"config": {"map": {"default": MPS_ENTRY}, "fallbackStrategies": ["named"]}}, {},
        {PLUGIN: False, MPS: False}),
    "one entry unlabelled nodes do not get (fallback empty): the label chooses": (
        {"config": {"map": {"config": MPS_ENTRY}, "fallbackStrategies": ["empty"]}},
        {PLUGIN_ACCOUNT: rules(NODE_READ, EVENTS)}, {PLUGIN: True, MPS: True}),
    "one entry no fallback reaches: only the label starts it": (
        {"config": {"map": {"config": MPS_ENTRY}, "fallbackStrategies": ["named"]}},
        {PLUGIN_ACCOUNT: rules(NODE_READ, EVENTS)}, {PLUGIN: True, MPS: True}),
    "two config entries: the node label chooses": (
        {"config": {"map": {"mps": MPS_ENTRY, "plain": PLAIN_ENTRY}, "default": "plain"}},
        {PLUGIN_ACCOUNT: rules(NODE_READ, EVENTS)}, {PLUGIN: True, MPS: True}),
    "an existing ConfigMap (config.name): its entries unseen": (
        {"config": {"name": "mine", "default": "plain"}},
        {PLUGIN_ACCOUNT: rules(NODE_READ, EVENTS)}, {PLUGIN: True}),
    "events.enabled": (  # a Role in the Node events' namespace (default)
        {"events": {"enabled": True}, "config": {"map": {"config": MPS_ENTRY}}},
        {PLUGIN_ACCOUNT: rules(("", "events", "create"))}, {PLUGIN: True, MPS: False}),
    "gfd.enabled": (
        {"gfd": {"enabled": True}, "config": {"map": {"config": MPS_ENTRY}}},
        {GFD: rules(("", "nodes", "get list watch patch"), ("", "events", "create"))},
        {PLUGIN: False, MPS: False, GFD: True}),
    "gfd.detectNodes (the presence check)": (
        {"gfd": {"detectNodes": True}},
        {GFD: rules(("", "nodes", "get list watch patch"), ("", "events", "create"))},
        {PLUGIN: False, PRESENCE: True}),
    "gfd.enabled with the NodeFeature API": (
        {"gfd": {"enabled": True, "useNodeFeatureAPI": True}},
        {GFD: rules(("", "nodes", "get list watch patch"), ("", "events", "create"),
                    ("nfd.k8s-sigs.io", "nodefeatures", "get create update"))},
        {PLUGIN: False, GFD: True}),
    "dra.enabled: claims' status, what each prepared device is (test_dra_rbac.py)": (
        {"dra": {"enabled": True}},
        {DRA: rules(("resource.k8s.io", "resourceclaims", "get list watch"),
                    ("resource.k8s.io", "resourceclaims/status", "patch"),
                    ("resource.k8s.io", "resourceclaims/driver", "associated-node:patch"),
                    ("resource.k8s.io", "resourceslices", "get list watch create update delete"),
                    NODE_READ, ("", "events", "create"))},
        {DRA: True, DRA_MPS: False}),
    "dra.enabled with migStrategy dynamic: nothing more": (
        {"dra": {"enabled": True},
         "config": {"map": {"mig": "version: v1\nflags:\n  mode: dra\n  migStrategy: dynamic\n"}}},
        {DRA: rules(("resource.k8s.io", "resourceclaims", "get list watch"),
                    ("resource.k8s.io", "resourceclaims/status", "patch"),
                    ("resource.k8s.io", "resourceclaims/driver", "associated-node:patch"),
                    ("resource.k8s.io", "resourceslices", "get list watch create update delete"),
                    NODE_READ, ("", "events", "create"))},
        {DRA: True, DRA_MPS: False}),
}


def granted(rendered: Rendered) -> dict[str, Rules]:
    """The rules bound to each service account, through (Cluster)RoleBindings."""
    roles = {(o["kind"], o["metadata"]["name"]): o for o in rendered.objects
             if o["kind"] in ("ClusterRole", "Role")}  # fmt: skip
    found: dict[str, Rules] = {}
    for binding in rendered.objects:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        role = roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
        for subject in binding["subjects"]:
            table = found.setdefault(subject["name"], {})
            for rule in role["rules"]:
                for key in ((g, r) for g in rule["apiGroups"] for r in rule["resources"]):
                    table[key] = table.get(key, frozenset()) | set(rule["verbs"])
    return found


@pytest.mark.parametrize("case", list(CASES))
def test_each_value_adds_exactly_the_api_access_it_needs(case: str) -> None:
    values, expected_rules, expected_tokens = CASES[case]
    rendered = render(values)
    assert granted(rendered) == expected_rules
    tokens = {name: ds["spec"]["template"]["spec"]["automountServiceAccountToken"]
              for name, ds in rendered.daemonsets().items()}  # fmt: skip
    assert tokens == expected_tokens
    # Every role is bound (none left over), and none is namespaced beyond what is listed.
    bound = {b["roleRef"]["name"] for b in rendered.objects if b["kind"].endswith("RoleBinding")}
    assert {o["metadata"]["name"] for o in rendered.objects if o["kind"] in ("ClusterRole", "Role")} == bound
    # The plugin's account never mounts its token by default: only the pods that need it opt in.
    assert rendered.one("ServiceAccount", PLUGIN_ACCOUNT)["automountServiceAccountToken"] is False


@pytest.mark.parametrize("case", list(CASES))
def test_the_api_server_is_reachable_only_for_pods_given_api_access(case: str) -> None:
    """The plugin's deny-all NetworkPolicy opens the API server's ports exactly when it has a token."""
    values, _, expected_tokens = CASES[case]
    rendered = render(values)
    if PLUGIN not in rendered.daemonsets():
        return
    deny_all = rendered.one("NetworkPolicy", f"{PLUGIN}-deny-all")["spec"]
    opened = bool(deny_all.get("egress")) or bool(rendered.find("NetworkPolicy", f"{PLUGIN}-allow-apiserver"))
    assert opened is expected_tokens[PLUGIN]
