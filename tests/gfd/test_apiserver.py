"""The labeller and the chart's admission policy against a real kube-apiserver (throwaway, envtest).

The chart's own RBAC and ValidatingAdmissionPolicy are applied; the labeller authenticates with a
service-account token bound to a pod on its node, as it does in a cluster, so the API server puts
the node name into the request and the policy can check it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Node

from nvdp.kube import connect, get_node_labels, patch_node_labels
from sim.nvml import NodeSim, build_library
from tests.kube.envtest import ControlPlane

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "nvidia-device-plugin"
NAMESPACE = "gpu-labeller"
RELEASE = "nvdp"
SA = "nvdp-nvidia-device-plugin-gpu-feature-discovery"
N = "nvidia.com/"
MPS_10 = "version: v1\nsharing:\n  mps:\n    resources:\n      - {name: nvidia.com/gpu, replicas: 10}\n"
CONFIG_LABEL = N + "device-plugin.config"
POLICY_WAIT_S = 120


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def plane(kube_api: ControlPlane) -> ControlPlane:
    """The chart's labeller objects (ServiceAccount, RBAC, admission policy) applied once."""
    manifests = helm_python.Chart.load(str(CHART)).render(
        {"gfd": {"enabled": True}}, name=RELEASE, namespace=NAMESPACE, is_install=True
    )
    wanted = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
              "ValidatingAdmissionPolicyBinding"}  # fmt: skip
    objects = [
        doc
        for path, text in manifests.items()
        if not path.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        if doc and doc["kind"] in wanted
    ]
    assert {o["kind"] for o in objects} == wanted
    if kube_api.kubectl("get", "namespace", NAMESPACE, check=False).returncode != 0:
        kube_api.kubectl("create", "namespace", NAMESPACE)
    kube_api.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    wait_for_policy(kube_api)
    return kube_api


def wait_for_policy(plane: ControlPlane) -> None:
    """A new policy takes a moment to be enforced: probe until a foreign-label patch is refused."""
    node = unique("probe")
    plane.create_node(node)
    kubeconfig = pod_token_kubeconfig(plane, node)
    client = connect(kubeconfig)
    # Usually a second or two; much longer on a loaded machine (the policy is compiled and synced
    # by the API server's own informer).
    deadline = time.monotonic() + POLICY_WAIT_S
    last = "both patches allowed"
    attempt = 0
    try:
        while time.monotonic() < deadline:
            attempt += 1  # a new value each time: re-setting an unchanged label is no change to refuse
            try:
                patch_node_labels(client, node, {N + "probe": str(attempt)})  # allowed: RBAC is in
                client.patch(Node, node, {"metadata": {"labels": {"probe": str(attempt)}}})
            except ApiError as e:
                last = f"{e.status.code} {e.status.message}"
                if e.status.code == 403 and "nvidia.com/" in (e.status.message or ""):
                    return
            time.sleep(0.5)
    finally:
        client.close()
    policies = plane.kubectl("get", "validatingadmissionpolicies,validatingadmissionpolicybindings", "-o",
                             "yaml", check=False).stdout  # fmt: skip
    raise AssertionError(
        f"the admission policy was not enforced within {POLICY_WAIT_S} s: {last}\n{policies}"
    )


def pod_token_kubeconfig(plane: ControlPlane, node: str) -> Path:
    """A kubeconfig with the labeller's token bound to a pod on `node` (the pod never runs: no kubelet)."""
    pod = unique("gfd")
    manifest = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod, "namespace": NAMESPACE},
        "spec": {"nodeName": node, "serviceAccountName": SA, "automountServiceAccountToken": False,
                 "containers": [{"name": "c", "image": "none"}]},
    }  # fmt: skip
    plane.kubectl("create", "-f", "-", input_text=json.dumps(manifest))
    uid = plane.kubectl("-n", NAMESPACE, "get", "pod", pod, "-o", "jsonpath={.metadata.uid}").stdout
    bound = ["--bound-object-kind=Pod", f"--bound-object-name={pod}", f"--bound-object-uid={uid}"]
    token = plane.kubectl("-n", NAMESPACE, "create", "token", SA, *bound).stdout.strip()
    path = plane.workdir / f"{pod}.kubeconfig"
    config = yaml.safe_load(plane.admin_kubeconfig.read_text())
    user = f"system:serviceaccount:{NAMESPACE}:{SA}"
    config["users"] = [{"name": user, "user": {"token": token}}]
    config["contexts"][0]["context"]["user"] = user
    path.write_text(json.dumps(config))
    return path


def refused(call: Callable[[], object]) -> str:
    with pytest.raises(ApiError) as info:
        call()
    assert info.value.status.code == 403, info.value.status
    return info.value.status.message or ""


# -- the admission policy ------------------------------------------------------------------------


def test_own_node_labels_allowed(plane: ControlPlane) -> None:
    node = unique("own")
    plane.create_node(node, {"team": "ml"})
    client = connect(pod_token_kubeconfig(plane, node))
    patched = patch_node_labels(client, node, {N + "gpu.product": "Tesla-T4", N + "mps.capable": "true"})
    assert patched.labels[N + "gpu.product"] == "Tesla-T4"
    patched = patch_node_labels(client, node, {N + "mps.capable": None})
    assert N + "mps.capable" not in patched.labels
    assert patched.labels["team"] == "ml"


def test_other_node_refused(plane: ControlPlane) -> None:
    mine, other = unique("mine"), unique("other")
    plane.create_node(mine)
    plane.create_node(other)
    client = connect(pod_token_kubeconfig(plane, mine))
    message = refused(lambda: patch_node_labels(client, other, {N + "gpu.product": "fake"}))
    assert f"on node {mine} may not change node {other}" in message


def test_foreign_label_refused(plane: ControlPlane) -> None:
    node = unique("foreign")
    plane.create_node(node, {"team": "ml"})
    client = connect(pod_token_kubeconfig(plane, node))
    attempts: list[dict[str, str | None]] = [
        {"team": "hacked"}, {"node-role.kubernetes.io/control-plane": ""}, {"team": None}]  # fmt: skip
    for labels in attempts:

        def patch(labels: dict[str, str | None] = labels) -> object:
            return client.patch(Node, node, {"metadata": {"labels": labels}})

        assert "only change labels under nvidia.com/" in refused(patch)
    assert get_node_labels(connect(plane.admin_kubeconfig), node).labels["team"] == "ml"


def test_spec_and_annotation_changes_refused(plane: ControlPlane) -> None:
    node = unique("spec")
    plane.create_node(node)
    client = connect(pod_token_kubeconfig(plane, node))
    changes: list[dict[str, Any]] = [
        {"spec": {"unschedulable": True}},
        {"spec": {"taints": [{"key": "x", "effect": "NoSchedule"}]}},
        {"metadata": {"annotations": {"a": "b"}}},
        {"metadata": {"labels": {N + "gpu.product": "ok"}, "annotations": {"a": "b"}}},
    ]
    for change in changes:

        def patch(change: dict[str, Any] = change) -> object:
            return client.patch(Node, node, change)

        assert "only change labels" in refused(patch)
    refused(lambda: client.delete(Node, node))


def test_token_without_node_binding_refused(plane: ControlPlane) -> None:
    node = unique("unbound")
    plane.create_node(node)
    client = connect(plane.service_account_kubeconfig(NAMESPACE, SA))
    message = refused(lambda: patch_node_labels(client, node, {N + "gpu.product": "x"}))
    assert "not bound to a node" in message


# -- the labeller process -------------------------------------------------------------------------


class Labeller:
    def __init__(self, plane: ControlPlane, node: str, tmp: Path, config: Path,
                 extra: dict[str, str] | None = None) -> None:  # fmt: skip
        self.log = tmp / "gfd.log"
        self.sim = NodeSim("t4", tmp / "state")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NVML_SIM_", "GFD_"))
               and k not in ("LD_LIBRARY_PATH", "CONFIG_FILE", "MIG_STRATEGY", "KUBECONFIG")}  # fmt: skip
        env.update(self.sim.env)
        env.update({"NODE_NAME": node, "KUBECONFIG": str(pod_token_kubeconfig(plane, node)),
                    "CONFIG_FILE": str(config), "GFD_SLEEP_INTERVAL": "1s",
                    "GFD_MACHINE_TYPE_FILE": ""})  # fmt: skip
        env.update(extra or {})
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "nvdp.gfd.main"], env=env, stdout=out,
                                         stderr=subprocess.STDOUT)  # fmt: skip

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(15)

    def text(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
def labeller_factory(plane: ControlPlane, tmp_path: Path) -> Iterator[Callable[..., Labeller]]:
    build_library()
    started: list[Labeller] = []

    def start(node: str, config: Path, extra: dict[str, str] | None = None) -> Labeller:
        workdir = tmp_path / f"l{len(started)}"
        workdir.mkdir()
        lab = Labeller(plane, node, workdir, config, extra)
        started.append(lab)
        return lab

    yield start
    for lab in started:
        if lab.proc.poll() is None:
            lab.stop()


def wait_labels(plane: ControlPlane, node: str, ok: Callable[[dict[str, str]], bool], lab: Labeller,
                timeout: float = 30) -> dict[str, str]:  # fmt: skip
    client = connect(plane.admin_kubeconfig)
    deadline = time.monotonic() + timeout
    labels: dict[str, str] = {}
    while time.monotonic() < deadline:
        labels = dict(get_node_labels(client, node).labels)
        if ok(labels):
            return labels
        assert lab.proc.poll() is None, f"labeller exited ({lab.proc.returncode}):\n{lab.text()}"
        time.sleep(0.2)
    raise AssertionError(f"labels not as wanted within {timeout} s: {labels}\nlog:\n{lab.text()}")


def node_patches(plane: ControlPlane) -> int:
    """PATCH requests on nodes the API server has answered (its own request counter)."""
    total = 0
    for line in plane.metrics().splitlines():
        if line.startswith("apiserver_request_total{") and 'resource="nodes"' in line and '"PATCH"' in line:
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


@pytest.mark.slow
def test_labels_appear_change_with_the_config_and_stale_ones_go(
    plane: ControlPlane, labeller_factory: Callable[..., Labeller], tmp_path: Path
) -> None:
    node = unique("gpu")
    stale = {N + "mig-1g.10gb.count": "7", N + "mig.strategy": "mixed"}  # an earlier labeller's
    foreign = {"team": "ml", N + "gpu.present": "true", N + "custom": "kept"}
    plane.create_node(node, {**stale, **foreign})
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\n")
    lab = labeller_factory(node, config)

    labels = wait_labels(plane, node, lambda ls: ls.get(N + "gpu.product") == "Tesla-T4", lab)
    assert labels[N + "gpu.count"] == "1"
    assert labels[N + "mps.capable"] == "false"
    assert labels[N + "cuda.driver-version.full"] == "550.54.15"
    assert re.fullmatch(r"[0-9]{10}", labels[N + "gfd.timestamp"])
    assert not set(stale) & set(labels)
    assert {k: labels.get(k) for k in foreign} == foreign

    # steady state: NVML is re-read every second, the Node is not written
    before = node_patches(plane)
    time.sleep(4)
    assert node_patches(plane) == before, lab.text()

    config.write_text(MPS_10)
    lab.proc.send_signal(signal.SIGHUP)
    labels = wait_labels(plane, node, lambda ls: ls.get(N + "mps.capable") == "true", lab)
    assert labels[N + "gpu.product"] == "Tesla-T4-SHARED"
    assert labels[N + "gpu.replicas"] == "10"
    assert labels[N + "gpu.sharing-strategy"] == "mps"

    config.write_text("version: v1\n")
    lab.proc.send_signal(signal.SIGHUP)
    labels = wait_labels(plane, node, lambda ls: ls.get(N + "mps.capable") == "false", lab)
    assert labels[N + "gpu.product"] == "Tesla-T4"
    assert {k: labels.get(k) for k in foreign} == foreign
    lab.stop()
    assert lab.proc.returncode == 0
    assert "Traceback" not in lab.text()


@pytest.mark.slow
def test_labeller_refused_for_another_node_reports_and_keeps_running(
    plane: ControlPlane, labeller_factory: Callable[..., Labeller], tmp_path: Path
) -> None:
    # A pod whose token says node A but which is told (wrongly) to label node B.
    a, b = unique("a"), unique("b")
    plane.create_node(a)
    plane.create_node(b)
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\n")
    lab = Labeller.__new__(Labeller)
    lab.log = tmp_path / "wrong.log"
    lab.sim = NodeSim("t4", tmp_path / "wrong-state")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "KUBECONFIG")}
    env.update(lab.sim.env)
    env.update({"NODE_NAME": b, "KUBECONFIG": str(pod_token_kubeconfig(plane, a)), "CONFIG_FILE": str(config),
                "GFD_SLEEP_INTERVAL": "1s"})  # fmt: skip
    with open(lab.log, "ab") as out:
        lab.proc = subprocess.Popen([sys.executable, "-m", "nvdp.gfd.main"], env=env, stdout=out,
                                    stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while "publishing the labels failed" not in lab.text():
            assert lab.proc.poll() is None and time.monotonic() < deadline, lab.text()
            time.sleep(0.2)
        assert f"may not change node {b}" in lab.text()
        assert N + "gpu.product" not in get_node_labels(connect(plane.admin_kubeconfig), b).labels
    finally:
        lab.stop()


@pytest.mark.slow
def test_labels_follow_the_node_selected_config(
    plane: ControlPlane, labeller_factory: Callable[..., Labeller], tmp_path: Path
) -> None:
    # The chart's per-node config: every entry in a directory, the node label picks one.
    entries = tmp_path / "configs"
    entries.mkdir()
    (entries / "plain").write_text("version: v1\n")
    (entries / "mps").write_text(MPS_10)
    node = unique("per-node")
    plane.create_node(node, {CONFIG_LABEL: "mps"})
    lab = labeller_factory(node, entries / "plain", {"CONFIG_DIR": str(entries), "DEFAULT_CONFIG": "plain"})
    labels = wait_labels(plane, node, lambda ls: ls.get(N + "mps.capable") == "true", lab)
    assert labels[N + "gpu.product"] == "Tesla-T4-SHARED"

    admin = connect(plane.admin_kubeconfig)
    admin.patch(Node, node, {"metadata": {"labels": {CONFIG_LABEL: "plain"}}})
    labels = wait_labels(plane, node, lambda ls: ls.get(N + "mps.capable") == "false", lab)
    assert labels[N + "gpu.product"] == "Tesla-T4"

    admin.patch(Node, node, {"metadata": {"labels": {CONFIG_LABEL: "mps"}}})
    wait_labels(plane, node, lambda ls: ls.get(N + "mps.capable") == "true", lab)
    assert labels[CONFIG_LABEL] == "plain"  # the selector itself is the user's: never written
    lab.stop()
    assert "labelling with entry 'mps' (from label)" in lab.text()


# -- the presence check and the NodeFeature output ------------------------------------------------


def fake_sysfs(root: Path, vendor: str, pci_class: str) -> Path:
    device = root / "bus" / "pci" / "devices" / "0000:00:06.0"
    device.mkdir(parents=True)
    (device / "vendor").write_text(vendor + "\n")
    (device / "class").write_text(pci_class + "\n")
    return root


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@pytest.mark.slow
@pytest.mark.parametrize(("vendor", "pci_class", "present"), [
    ("0x10de", "0x030200", True),  # an NVIDIA 3D controller
    ("0x8086", "0x030000", False),  # another vendor's VGA
])  # fmt: skip
def test_presence_check_labels_gpu_nodes_then_idles(
    plane: ControlPlane, tmp_path: Path, vendor: str, pci_class: str, present: bool
) -> None:
    node = unique("presence")
    plane.create_node(node, {"team": "ml"})
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "KUBECONFIG")}
    env.update({"NODE_NAME": node, "KUBECONFIG": str(pod_token_kubeconfig(plane, node)),
                "GFD_SYSFS_ROOT": str(fake_sysfs(tmp_path / "sys", vendor, pci_class))})  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "nvdp.gfd.main", "--presence-only"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        # done when the process has become the bare idle interpreter
        while "-S" not in Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode(errors="replace").split("\0"):
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "the presence check did not go idle"
            time.sleep(0.1)
        labels = get_node_labels(connect(plane.admin_kubeconfig), node).labels
        assert (labels.get(N + "gpu.present") == "true") is present
        assert labels["team"] == "ml"
        time.sleep(0.5)
        assert rss_kib(proc.pid) < 16 * 1024, f"idle RSS {rss_kib(proc.pid)} KiB"  # the chart requests 16Mi
    finally:
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=10)[0].decode()
    assert proc.returncode == 0, out
    assert "Traceback" not in out


SCHEMA = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
NODE_FEATURE_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "nodefeatures.nfd.k8s-sigs.io"},
    "spec": {"group": "nfd.k8s-sigs.io", "scope": "Namespaced",
             "names": {"kind": "NodeFeature", "plural": "nodefeatures", "singular": "nodefeature"},
             "versions": [{"name": "v1alpha1", "served": True, "storage": True, "schema": SCHEMA}]},
}  # fmt: skip


@pytest.mark.slow
def test_node_feature_output_writes_only_on_change(plane: ControlPlane, tmp_path: Path) -> None:
    from nvdp.gfd.publish import NodeFeatureOutput

    plane.apply(json.dumps(NODE_FEATURE_CRD))
    plane.kubectl("wait", "--for=condition=Established", "crd/nodefeatures.nfd.k8s-sigs.io", "--timeout=30s")
    node = unique("nfd")
    admin = connect(plane.admin_kubeconfig)
    output = NodeFeatureOutput(admin, node, "default")
    wanted = {N + "gpu.product": "Tesla-T4", N + "gpu.count": "1"}
    deadline = time.monotonic() + 15
    while True:  # the new CRD's endpoint appears within moments
        try:
            assert output.publish(wanted, 1000) == {**wanted, N + "gfd.timestamp": "1000"}
            break
        except ApiError:
            assert time.monotonic() < deadline
            time.sleep(0.5)
    got = json.loads(plane.kubectl("-n", "default", "get", "nodefeature", f"nvidia-features-for-{node}",
                                   "-o", "json").stdout)  # fmt: skip
    assert got["metadata"]["labels"] == {"nfd.node.kubernetes.io/node-name": node}
    assert got["spec"]["labels"] == {**wanted, N + "gfd.timestamp": "1000"}
    version = got["metadata"]["resourceVersion"]
    assert output.publish(wanted, 2000) == {}  # steady state: nothing written
    # a new labeller process reads the object back and still writes nothing
    assert NodeFeatureOutput(admin, node, "default").publish(wanted, 3000) == {}
    again = json.loads(plane.kubectl("-n", "default", "get", "nodefeature", f"nvidia-features-for-{node}",
                                     "-o", "json").stdout)  # fmt: skip
    assert again["metadata"]["resourceVersion"] == version
    assert output.publish({N + "gpu.product": "Tesla-T4"}, 4000) == {
        N + "gpu.count": None,
        N + "gfd.timestamp": "4000",
    }
