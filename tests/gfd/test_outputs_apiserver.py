"""The Node and NodeFeature outputs against a throwaway kube-apiserver (envtest), with real watches.

Two labellers with different label sets on one Node (a rolling update with a new config) must not
write the Node without bound, and the one left running must put its labels back within a pass or two.
A NodeFeature object deleted by someone is written again.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator, Mapping

import pytest
from lightkube.core.exceptions import ApiError

from nvdp.gfd.publish import NodeFeatureOutput, NodeOutput
from nvdp.kube import NodeWatcher, connect, get_node_labels
from nvdp.kube.node import NodeLabels
from tests.kube.envtest import ControlPlane

N = "nvidia.com/"
PASS_S = 0.3  # the labellers' re-check interval in these tests
BACKOFF_S = (0.2, 1.0)  # contested writes: small, so that the test is short
OLD = {N + "gpu.product": "Tesla-T4", N + "gpu.replicas": "1", N + "mig-1g.24gb-me.count": "4"}
NEW = {N + "gpu.product": "Tesla-T4-SHARED", N + "gpu.replicas": "4", N + "mps.capable": "true"}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


class Labeller:
    """The labeller's loop in small: publish after every label change the watch shows, and every pass."""

    def __init__(self, plane: ControlPlane, node: str, wanted: Mapping[str, str]) -> None:
        self.output = NodeOutput(connect(plane.admin_kubeconfig), node, contested_backoff_s=BACKOFF_S)
        self.wanted = dict(wanted)
        self.errors: list[BaseException] = []
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.watcher = NodeWatcher(connect(plane.admin_kubeconfig), node, self._on_labels)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _on_labels(self, node: NodeLabels) -> None:
        self.output.set_current(node.labels)
        self._wake.set()

    def start(self) -> Labeller:
        self.watcher.start()
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(PASS_S)
            self._wake.clear()
            if self.output.current is None:
                continue
            try:
                self.output.publish(self.wanted, int(time.time()))
            except Exception as e:  # kept for the assertion message
                self.errors.append(e)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.watcher.stop()


@pytest.fixture
def labellers(kube_api: ControlPlane) -> Iterator[list[Labeller]]:
    started: list[Labeller] = []
    yield started
    for lab in started:
        lab.stop()


def node_patches(plane: ControlPlane) -> int:
    """PATCH requests on nodes the API server has answered (its own request counter)."""
    total = 0
    for line in plane.metrics().splitlines():
        if line.startswith("apiserver_request_total{") and 'resource="nodes"' in line and '"PATCH"' in line:
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


def owned(labels: Mapping[str, str], wanted: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in wanted.items())


@pytest.mark.slow
def test_two_labellers_write_a_bounded_number_of_times_and_the_survivor_wins(
    kube_api: ControlPlane, labellers: list[Labeller]
) -> None:
    node = unique("fight")
    kube_api.create_node(node, {"team": "ml"})
    admin = connect(kube_api.admin_kubeconfig)
    before = node_patches(kube_api)
    old, new = Labeller(kube_api, node, OLD), Labeller(kube_api, node, NEW)
    labellers.extend([old, new])
    old.start()
    new.start()
    fight_s = 5.0
    time.sleep(fight_s)
    patches = node_patches(kube_api) - before
    # Unpaced, each side answered every change of the other at once: hundreds of writes. Paced, each
    # writes at most once per back-off step (0.2, 0.4, 0.8, then 1 s): about 7 in 5 s.
    counts = f"{old.output.patches} + {new.output.patches}"
    assert patches <= 24, f"{patches} Node patches in {fight_s} s ({counts})"
    assert old.output.patches + new.output.patches >= 3  # they did fight

    old.stop()  # the rolling update removes the old pod
    deadline = time.monotonic() + BACKOFF_S[1] + 5 * PASS_S + 3
    labels: Mapping[str, str] = {}
    while time.monotonic() < deadline:
        labels = get_node_labels(admin, node).labels
        if owned(labels, NEW) and N + "mig-1g.24gb-me.count" not in labels:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the survivor's labels are not on the Node: {labels}; errors {new.errors}")
    assert labels["team"] == "ml"
    settled = node_patches(kube_api)
    time.sleep(4 * PASS_S)
    assert node_patches(kube_api) == settled  # and then it is quiet
    assert not new.errors


@pytest.mark.slow
def test_node_output_takes_the_watched_node_not_the_patch_answer(
    kube_api: ControlPlane, labellers: list[Labeller]
) -> None:
    # Someone changes a label right after our patch: the watch shows it, and the next pass puts it
    # back (once), instead of believing the patch answer.
    node = unique("answer")
    kube_api.create_node(node)
    admin = connect(kube_api.admin_kubeconfig)
    lab = Labeller(kube_api, node, NEW).start()
    labellers.append(lab)
    deadline = time.monotonic() + 10
    while not owned(get_node_labels(admin, node).labels, NEW):
        assert time.monotonic() < deadline, lab.errors
        time.sleep(0.1)
    admin_patch = {"metadata": {"labels": {N + "gpu.replicas": "9"}}}
    from lightkube.resources.core_v1 import Node
    from lightkube.types import PatchType

    admin.patch(Node, node, admin_patch, patch_type=PatchType.MERGE)
    deadline = time.monotonic() + 5
    while get_node_labels(admin, node).labels.get(N + "gpu.replicas") != "4":
        assert time.monotonic() < deadline, lab.errors
        time.sleep(0.1)


SCHEMA = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
NODE_FEATURE_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "nodefeatures.nfd.k8s-sigs.io"},
    "spec": {"group": "nfd.k8s-sigs.io", "scope": "Namespaced",
             "names": {"kind": "NodeFeature", "plural": "nodefeatures", "singular": "nodefeature"},
             "versions": [{"name": "v1alpha1", "served": True, "storage": True, "schema": SCHEMA}]},
}  # fmt: skip


def node_feature(plane: ControlPlane, name: str) -> dict[str, object] | None:
    got = plane.kubectl("-n", "default", "get", "nodefeature", name, "-o", "json", check=False)
    return json.loads(got.stdout) if got.returncode == 0 else None


@pytest.mark.slow
def test_deleted_node_feature_is_written_again(kube_api: ControlPlane) -> None:
    kube_api.apply(json.dumps(NODE_FEATURE_CRD))
    crd = "crd/nodefeatures.nfd.k8s-sigs.io"
    kube_api.kubectl("wait", "--for=condition=Established", crd, "--timeout=30s")
    node = unique("nfd-deleted")
    output = NodeFeatureOutput(connect(kube_api.admin_kubeconfig), node, "default")
    wanted = {N + "gpu.product": "Tesla-T4", N + "gpu.count": "1"}
    deadline = time.monotonic() + 15
    while True:  # the new CRD's endpoint appears within moments
        try:
            output.publish(wanted, 1000)
            break
        except ApiError:
            assert time.monotonic() < deadline
            time.sleep(0.5)
    name = f"nvidia-features-for-{node}"
    assert node_feature(kube_api, name) is not None
    assert output.publish(wanted, 2000) == {}

    kube_api.kubectl("-n", "default", "delete", "nodefeature", name)
    # The next pass or the one after writes it again; passes that fail on the way are retried.
    for _ in range(2):
        try:
            output.publish(wanted, 3000)
        except ApiError:
            continue
    got = node_feature(kube_api, name)
    assert got is not None, "the deleted NodeFeature was not written again"
    spec = got["spec"]
    assert isinstance(spec, dict)
    assert spec["labels"] == {**wanted, N + "gfd.timestamp": "3000"}
