"""`nvdp doctor`'s DRA checks: the registration part against a real DraServer on unix sockets, the slice
part against a throwaway kube-apiserver holding slices the real SlicePublisher wrote (or broke)."""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from nvdp.doctor.dra_check import DraChecks, dra_node
from nvdp.doctor.report import Finding
from nvdp.doctor.where import Where
from nvdp.dra.claims.records import ClaimRef, PrepareResult
from nvdp.dra.kubelet.server import DraServer
from nvdp.dra.pool.devices import dra_devices
from nvdp.dra.pool.publish import SlicePublisher
from nvdp.dra.pool.slices import desired_slices
from nvdp.inventory.model import Inventory
from nvdp.inventory.profile import load_profile
from nvdp.kube import connect, create_slice
from tests.kube.envtest import ControlPlane

DRIVER = "gpu.nvidia.com"
LOG = logging.getLogger("test-doctor-dra")
PROFILES = Path(__file__).resolve().parents[2] / "sim" / "profiles"


class Node(DraChecks):
    """The doctor's DRA checks on their own: what `Doctor` gives them."""

    def __init__(self, env: dict[str, str], inventory: Inventory | None, node_name: str = "",
                 kubeconfig: str | None = None) -> None:
        self.where = Where(env=env, context="container", node_name=node_name, timeout=3.0)
        self.inventory = inventory
        self.dra_kubeconfig = kubeconfig


def by_check(findings: Sequence[Finding]) -> dict[str, Finding]:
    return {f.check: f for f in findings}


@pytest.fixture(scope="module")
def a100() -> Inventory:
    return load_profile(PROFILES / "a100-sxm-8.yaml")


@pytest.fixture
def kubelet_dirs() -> Iterator[dict[str, str]]:
    # Unix socket paths must stay under ~100 bytes: pytest's tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="nvdp-") as tmp:
        yield {"KUBELET_PLUGINS_DIR": f"{tmp}/plugins", "KUBELET_REGISTRAR_DIR": f"{tmp}/registry"}


def serve(env: dict[str, str], driver: str = DRIVER, instance: str = "") -> DraServer:
    calls: list[Sequence[ClaimRef]] = []

    def prepare(refs: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        calls.append(refs)
        return {}

    server = DraServer(driver=driver, plugin_dir=os.path.join(env["KUBELET_PLUGINS_DIR"], driver),
                       registry_dir=env["KUBELET_REGISTRAR_DIR"], prepare=prepare,
                       unprepare=lambda refs: {}, log=LOG, on_registered=lambda ok, error: None,
                       instance=instance)
    server.start()
    return server


def dead_socket(path: str) -> None:
    """A socket file nobody serves, as a crashed plugin leaves behind."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(path)


# --- is DRA on this node -----------------------------------------------------------------------------


def test_without_the_dra_plugin_there_is_no_dra_line(kubelet_dirs: dict[str, str]) -> None:
    assert Node(kubelet_dirs, None).dra() == []
    node = dra_node(kubelet_dirs)
    assert not node.on
    assert f"no {kubelet_dirs['KUBELET_REGISTRAR_DIR']}/{DRIVER}-reg.sock" in node.why
    assert "DRA_DRIVER_NAME is not set" in node.why


def test_the_driver_name_from_the_environment_means_dra_even_without_a_socket(
    kubelet_dirs: dict[str, str],
) -> None:
    env = {**kubelet_dirs, "DRA_DRIVER_NAME": "gpu.example.com"}
    node = dra_node(env)
    assert node.on and node.driver == "gpu.example.com"
    assert node.plugin_socket == f"{kubelet_dirs['KUBELET_PLUGINS_DIR']}/gpu.example.com/dra.sock"
    found = by_check(Node(env, None).dra())
    registration = found["dra-registration"]
    assert registration.status == "FAIL"
    assert "no registration socket" in registration.detail and "DRA_DRIVER_NAME is gpu.example.com" in \
        registration.detail
    assert "kubeletRegistrarDir" in registration.fix
    assert found["dra-slices"].status == "SKIP"  # no node name


# --- registration ------------------------------------------------------------------------------------


def test_a_serving_plugin_passes_registration(kubelet_dirs: dict[str, str]) -> None:
    server = serve(kubelet_dirs)
    try:
        found = by_check(Node(kubelet_dirs, None).dra())
    finally:
        server.stop()
    registration = found["dra-registration"]
    assert registration.status == "PASS", registration
    assert registration.detail == (
        f"{server.registration_socket}: DRAPlugin {DRIVER} (v1.DRAPlugin, v1beta1.DRAPlugin); "
        f"endpoint {server.plugin_socket} answers NodePrepareResources")


def test_the_sockets_named_after_the_plugins_pod_are_the_ones_checked(kubelet_dirs: dict[str, str]) -> None:
    """In the plugin's pod (POD_UID set) its own sockets; on the host the newest instance's (a rolling
    update's new pod)."""
    old_uid, new_uid = "0f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0", "11111111-2222-4333-8444-555555555555"
    old = serve(kubelet_dirs, instance=old_uid)
    new = serve(kubelet_dirs, instance=new_uid)
    try:
        mine = dra_node({**kubelet_dirs, "POD_UID": old_uid})
        assert (mine.registration_socket, mine.plugin_socket) == (old.registration_socket, old.plugin_socket)
        os.utime(new.registration_socket, (2e9, 2e9))
        newest = dra_node(kubelet_dirs)
        assert newest.on and newest.registration_socket == new.registration_socket
        found = by_check(Node(kubelet_dirs, None).dra())["dra-registration"]
    finally:
        old.stop()
        new.stop()
    assert found.status == "PASS" and found.detail.startswith(f"{new.registration_socket}: DRAPlugin"), found


def test_an_endpoint_that_is_gone_fails_with_the_mount_fix(kubelet_dirs: dict[str, str]) -> None:
    server = serve(kubelet_dirs)
    try:
        os.unlink(server.plugin_socket)
        registration = by_check(Node(kubelet_dirs, None).dra())["dra-registration"]
    finally:
        server.stop()
    assert registration.status == "FAIL"
    assert registration.detail == f"GetInfo names the endpoint {server.plugin_socket}, which does not exist"
    assert "dra.kubeletPluginsDir" in registration.fix


def test_an_endpoint_nobody_serves_fails(kubelet_dirs: dict[str, str]) -> None:
    server = serve(kubelet_dirs)
    try:
        os.unlink(server.plugin_socket)
        dead_socket(server.plugin_socket)
        registration = by_check(Node(kubelet_dirs, None).dra())["dra-registration"]
    finally:
        server.stop()
    assert registration.status == "FAIL"
    assert f"{server.plugin_socket} does not answer NodePrepareResources (v1.DRAPlugin) (UNAVAILABLE" in \
        registration.detail
    assert "kubectl logs" in registration.fix


def test_a_registration_socket_nobody_serves_fails(kubelet_dirs: dict[str, str]) -> None:
    path = dra_node(kubelet_dirs).registration_socket
    dead_socket(path)
    registration = by_check(Node(kubelet_dirs, None).dra())["dra-registration"]
    assert registration.status == "FAIL"
    assert registration.detail.startswith(f"{path} does not answer GetInfo (UNAVAILABLE")


def test_another_driver_behind_this_drivers_socket_name_fails(kubelet_dirs: dict[str, str]) -> None:
    server = serve(kubelet_dirs, driver="other.example.com")
    try:
        path = dra_node(kubelet_dirs).registration_socket
        os.rename(server.registration_socket, path)
        registration = by_check(Node(kubelet_dirs, None).dra())["dra-registration"]
    finally:
        server.stop()
        os.unlink(path)
    assert registration.status == "FAIL"
    assert registration.detail == f"{path}: GetInfo says driver 'other.example.com', not '{DRIVER}'"
    assert "DRA_DRIVER_NAME" in registration.fix


# --- slices ------------------------------------------------------------------------------------------


@pytest.fixture
def node_name(kube_api: ControlPlane) -> str:
    name = f"dra-doctor-{uuid.uuid4().hex[:8]}"
    kube_api.create_node(name)
    return name


def publisher(kube_api: ControlPlane, node: str) -> SlicePublisher:
    return SlicePublisher(connect(str(kube_api.admin_kubeconfig)), node=node, driver=DRIVER, log=LOG)


def slices_finding(kube_api: ControlPlane, node: str, inventory: Inventory | None) -> Finding:
    env = {"DRA_DRIVER_NAME": DRIVER}
    found = by_check(Node(env, inventory, node, str(kube_api.admin_kubeconfig)).dra())
    return found["dra-slices"]


def test_published_slices_of_this_nodes_gpus_pass(kube_api: ControlPlane, node_name: str,
                                                   a100: Inventory) -> None:
    assert publisher(kube_api, node_name).publish(dra_devices(a100), frozenset()) == 1
    finding = slices_finding(kube_api, node_name, a100)
    assert finding.status == "PASS", finding
    assert finding.detail == (f"pool {node_name} generation 1: 1 slice(s); 8 device(s), as this node's GPUs "
                              "give: gpu-0, gpu-1, gpu-2, gpu-3 and 4 more")


def test_no_slices_fail_with_what_the_kubelet_does_and_where_to_look(kube_api: ControlPlane, node_name: str,
                                                                     a100: Inventory) -> None:
    finding = slices_finding(kube_api, node_name, a100)
    assert finding.status == "FAIL"
    assert finding.detail == f"no ResourceSlice with spec.nodeName={node_name},spec.driver={DRIVER}"
    assert "the kubelet wipes a node's slices when it starts" in finding.fix
    assert "create resourceslices" in finding.fix


def test_an_unhealthy_gpu_left_out_is_named(kube_api: ControlPlane, node_name: str, a100: Inventory) -> None:
    sick = a100.gpus[3]
    publisher(kube_api, node_name).publish(dra_devices(a100), frozenset({sick.uuid}))
    finding = slices_finding(kube_api, node_name, a100)
    assert finding.status == "FAIL"
    assert f"not published (unhealthy, or not yet read): gpu-3 ({sick.uuid})" in finding.detail
    # It comes back by itself (docs/health.md): the fix points at the record, not at a restart.
    assert "XID" in finding.fix and "`nvdp health` in the DRA plugin's container" in finding.fix
    assert "restart" not in finding.fix


def test_slices_of_other_gpus_are_stale(kube_api: ControlPlane, node_name: str, a100: Inventory) -> None:
    t4 = load_profile(PROFILES / "t4.yaml")
    publisher(kube_api, node_name).publish(dra_devices(a100), frozenset())
    finding = slices_finding(kube_api, node_name, t4)
    assert finding.status == "FAIL"
    assert f"gpu-0 ({a100.gpus[0].uuid}, this node's is {t4.gpus[0].uuid})" in finding.detail
    assert "published but not on this node: gpu-1, gpu-2, gpu-3, gpu-4 and 3 more" in finding.detail
    assert "SIGHUP" in finding.fix


def test_an_incomplete_pool_fails(kube_api: ControlPlane, node_name: str, a100: Inventory) -> None:
    (obj,) = desired_slices(node=node_name, node_uid="", driver=DRIVER, devices=dra_devices(a100),
                            generation=4)
    obj["spec"]["pool"]["resourceSliceCount"] = 2  # the second slice was never written
    create_slice(connect(str(kube_api.admin_kubeconfig)), obj)
    finding = slices_finding(kube_api, node_name, a100)
    assert finding.status == "FAIL"
    assert finding.detail == f"pool {node_name} generation 4 has 1 of 2 slice(s)"
    assert "kubectl delete resourceslices" in finding.fix


def test_without_nvml_the_slices_are_counted_not_compared(kube_api: ControlPlane, node_name: str,
                                                          a100: Inventory) -> None:
    publisher(kube_api, node_name).publish(dra_devices(a100), frozenset())
    finding = slices_finding(kube_api, node_name, None)
    assert finding.status == "SKIP"
    assert "8 device(s); not compared with this node's GPUs: NVML did not load" in finding.detail


def test_an_unreachable_api_server_is_a_report_line(tmp_path: Path, a100: Inventory) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n")
    env = {"DRA_DRIVER_NAME": DRIVER}
    finding = by_check(Node(env, a100, "node-x", str(kubeconfig)).dra())["dra-slices"]
    assert finding.status == "FAIL"
    assert finding.detail.startswith("cannot list ResourceSlices: unreachable:")
    assert "API server address" in finding.fix


# --- dynamic MIG at cluster scale ----------------------------------------------------------------------


def scale_finding(kube_api: ControlPlane, node: str, env: dict[str, str] | None = None,
                  profiles: list[str] | None = None) -> Finding:
    from nvdp.config.loader import load_config

    overrides: dict[str, object] = {"flags.migStrategy": "dynamic", "flags.mode": "dra"}
    if profiles is not None:
        overrides["flags.migDynamicProfiles"] = profiles
    h100 = load_profile(PROFILES / "h100-mig-dynamic.yaml")
    doctor = Node({"DRA_DRIVER_NAME": DRIVER, **(env or {})}, h100, node, str(kube_api.admin_kubeconfig))
    doctor.config = load_config(None, {}, overrides)
    return by_check(doctor.dra())["dra-mig-scale"]


def test_dynamic_mig_on_a_control_plane_without_the_fix_fails_with_the_plugins_words(
        kube_api: ControlPlane, node_name: str) -> None:
    from nvdp.dra.pool.scale import scale_warning

    finding = scale_finding(kube_api, node_name)  # the kit's kube-apiserver reports v1.36.2
    assert finding.status == "FAIL"
    assert finding.detail == scale_warning("v1.36.2", (1, 36, 2), 26)
    assert "1.37.0" in finding.fix and "flags.migDynamicProfiles" in finding.fix
    fewer = scale_finding(kube_api, node_name, profiles=["1g.10gb", "3g.40gb"])
    assert fewer.status == "FAIL" and "publishes 10 partitionable devices" in fewer.detail


def test_dynamic_mig_silenced_or_on_a_fixed_control_plane_passes(kube_api: ControlPlane, node_name: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from nvdp.kube.version import parse_version

    quiet = scale_finding(kube_api, node_name, {"NVDP_DYNAMIC_MIG_SCALE_WARNING": "false"})
    assert quiet.status == "PASS" and "dra.dynamicMigScaleWarning" in quiet.detail
    monkeypatch.setattr("nvdp.kube.get_server_version",
                        lambda _client: parse_version({"gitVersion": "v1.37.2"}))
    fixed = scale_finding(kube_api, node_name)
    assert fixed.status == "PASS" and "Kubernetes v1.37.2 has the scheduler's" in fixed.detail
