"""The chart's per-node-config RBAC, applied to a real kube-apiserver: enough for what the plugin
does (watch its Node, record Events) and nothing more."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from chart_helm import NAMESPACE, render
from lightkube.core.exceptions import ApiError
from lightkube.models.authorization_v1 import SelfSubjectRulesReviewSpec
from lightkube.resources.authorization_v1 import SelfSubjectRulesReview

from nvdp.kube import EventRecorder, NodeLabels, NodeWatcher, connect, get_node_labels, patch_node_labels
from tests.kube.envtest import ControlPlane

TS = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - {name: nvidia.com/gpu, replicas: 4}\n"


def can_i(plane: ControlPlane, kubeconfig: object, *args: str) -> bool:
    done = plane.kubectl("auth", "can-i", *args, kubeconfig=kubeconfig, check=False)  # type: ignore[arg-type]
    return done.stdout.strip() == "yes"


def test_chart_cluster_role_is_sufficient_and_no_larger(kube_api: ControlPlane) -> None:
    release = f"r{uuid.uuid4().hex[:6]}"
    rendered = render({"config": {"map": {"ts": TS, "plain": "version: v1\n"}, "default": "ts"}},
                      release=release)
    wanted = ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount")
    objects = [o for o in rendered.objects if o["kind"] in wanted]
    assert {o["kind"] for o in objects} == set(wanted)
    if kube_api.kubectl("get", "namespace", NAMESPACE, check=False).returncode != 0:
        kube_api.kubectl("create", "namespace", NAMESPACE)
    kube_api.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    account = rendered.one("ServiceAccount")["metadata"]["name"]
    kubeconfig = kube_api.service_account_kubeconfig(NAMESPACE, account)

    # Sufficient: what the plugin does, through the same code.
    node = f"gpu-{uuid.uuid4().hex[:8]}"
    kube_api.create_node(node, {"nvidia.com/device-plugin.config": "ts"})
    seen: list[NodeLabels] = []
    watcher = NodeWatcher(connect(kubeconfig), node, seen.append)
    watcher.start()
    try:
        assert watcher.connected.wait(10), "the service account could not get and watch its node"
        kube_api.kubectl("label", "node", node, "nvidia.com/device-plugin.config=plain", "--overwrite")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(
            s.labels.get("nvidia.com/device-plugin.config") == "plain" for s in seen
        ):
            time.sleep(0.05)
        assert seen[-1].labels["nvidia.com/device-plugin.config"] == "plain"
        assert watcher.failures == 0
    finally:
        watcher.stop()
    uid = get_node_labels(connect(kubeconfig), node).uid
    assert EventRecorder(connect(kubeconfig), node, node_uid=uid).warning("UnknownConfig", "rbac check")
    for verb in ("get", "list", "watch"):
        assert can_i(kube_api, kubeconfig, verb, "nodes")
    assert can_i(kube_api, kubeconfig, "create", "events", "-n", "default")

    # No larger: a forbidden verb is refused by the server, and the account's rules are exactly these.
    with pytest.raises(ApiError) as refused:
        patch_node_labels(connect(kubeconfig), node, {"nvidia.com/gpu.present": "true"})
    assert refused.value.status.code == 403
    for forbidden in (("update", "nodes"), ("patch", "nodes"), ("delete", "nodes"), ("create", "nodes"),
                      ("delete", "events", "-n", "default"), ("get", "events", "-n", "default"),
                      ("patch", "events", "-n", "default"), ("create", "events", "-n", NAMESPACE),
                      ("get", "secrets", "-n", NAMESPACE), ("list", "pods", "-A"),
                      ("get", "configmaps", "-A"), ("patch", "nodes/status")):
        assert not can_i(kube_api, kubeconfig, *forbidden), forbidden
    review = connect(kubeconfig).create(
        SelfSubjectRulesReview(spec=SelfSubjectRulesReviewSpec(namespace="default")))
    assert review.status is not None
    granted = {
        (resource, verb)
        for rule in review.status.resourceRules
        for resource in rule.resources or []
        for verb in rule.verbs
        # Every authenticated user may review its own access (system:basic-user).
        if not resource.endswith(("reviews", "reviews.authorization.k8s.io", "reviews.authentication.k8s.io"))
    }
    assert granted == {("nodes", "get"), ("nodes", "list"), ("nodes", "watch"), ("events", "create")}, granted
