"""Prepare and unprepare of claims (nvdp.dra.claims.check, nvdp.dra.claims.preparer): the checks on the
claim, the guards,
idempotence, the checkpoint surviving a restart, and a bad checkpoint rebuilt from the API's claims."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from nvdp.cdi.spec import ContainerEdits
from nvdp.dra.claims.check import ClaimProblem, NodeView, check_claim, our_results
from nvdp.dra.claims.identity.metadata import ClaimFile
from nvdp.dra.claims.preparer import ClaimPreparer
from nvdp.dra.claims.records import COMPLETED, ClaimRef
from nvdp.dra.claims.release import ClaimsInUse
from nvdp.dra.pool.devices import DraDevice
from nvdp.inventory.model import MigDevice

DRIVER = "gpu.nvidia.com"
NODE = "node-a"
LOG = logging.getLogger("test-dra-prepare")


def device(name: str, uuid: str, gpu_uuid: str | None = None, kind: str = "gpu") -> DraDevice:
    return DraDevice(name=name, kind=kind, uuid=uuid, gpu_uuid=gpu_uuid or uuid, attributes={}, capacity={})


DEVICES = {d.name: d for d in (device("gpu-0", "GPU-0"), device("gpu-1", "GPU-1"))}


def claim(name: str, uid: str, *devices: str, driver: str = DRIVER, pool: str = NODE,
          namespace: str = "default", reserved: bool = True, request: str = "gpu") -> dict[str, Any]:
    results = [{"request": request, "driver": driver, "pool": pool, "device": d} for d in devices]
    status: dict[str, Any] = {"allocation": {"devices": {"results": results}}}
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "pod-uid"}]
    return {"metadata": {"name": name, "namespace": namespace, "uid": uid}, "status": status}


class Specs:
    """The per-claim CDI specs, in memory: what was written and removed."""

    def __init__(self) -> None:
        self.files: dict[str, list[str]] = {}
        self.edits: dict[str, ContainerEdits | None] = {}
        self.made: dict[str, dict[str, str]] = {}
        self.metadata: dict[str, dict[str, ClaimFile]] = {}  # by claim, by request
        self.fail = False

    def write(self, claim_uid: str, devices: Sequence[DraDevice], extra: ContainerEdits | None = None,
              made: Mapping[str, MigDevice] | None = None, files: Sequence[ClaimFile] = ()) -> dict[str, str]:
        if self.fail:
            raise OSError("read-only file system")
        self.metadata[claim_uid] = {f.request: f for f in files}
        self.files[claim_uid] = [d.name for d in devices]
        self.edits[claim_uid] = extra
        self.made[claim_uid] = {name: mig.uuid for name, mig in (made or {}).items()}
        return {d.name: f"k8s.gpu.nvidia.com/claim={claim_uid}-{d.name}" for d in devices}

    def remove(self, claim_uid: str) -> None:
        self.files.pop(claim_uid, None)
        self.metadata.pop(claim_uid, None)

    def exists(self, claim_uid: str) -> bool:
        return claim_uid in self.files

    def present(self) -> frozenset[str]:
        return frozenset(self.files)


class Cluster:
    def __init__(self, *claims: dict[str, Any]) -> None:
        self.claims = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in claims}
        self.gets = 0

    def get(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        self.gets += 1
        return self.claims.get((namespace, name))

    def list(self) -> list[dict[str, Any]]:
        return list(self.claims.values())


def no_container_holds_a_claim() -> tuple[tuple[str, str], ...]:
    """The kubelet's pod-resources answer of a node where no running container holds a claim."""
    return ()


def preparer(tmp_path: Path, cluster: Cluster, specs: Specs, unhealthy: frozenset[str] = frozenset(),
             in_use: ClaimsInUse | None = no_container_holds_a_claim) -> ClaimPreparer:
    return ClaimPreparer(driver=DRIVER, pool=NODE, checkpoint_path=str(tmp_path / "checkpoint.json"),
                         lock_path=str(tmp_path / "pu.lock"), specs=specs, get_claim=cluster.get,
                         view=lambda: NodeView(DEVICES, unhealthy), log=LOG, in_use=in_use)


def ref(c: dict[str, Any]) -> ClaimRef:
    meta = c["metadata"]
    return ClaimRef(namespace=meta["namespace"], uid=meta["uid"], name=meta["name"])


# --- the claim itself -------------------------------------------------------------------------------


def test_results_of_other_drivers_are_ignored_and_subrequests_stripped() -> None:
    c = claim("c", "u1", "gpu-0", request="gpus/large")
    c["status"]["allocation"]["devices"]["results"].append(
        {"request": "nic", "driver": "net.example.com", "pool": NODE, "device": "eth0"})
    (result,) = our_results(c, DRIVER)
    assert (result.request, result.device) == ("gpus", "gpu-0")


@pytest.mark.parametrize(("found", "uid", "words"), [
    (None, "u1", "not in the API server"),
    (claim("c", "other-uid", "gpu-0"), "u1", "was replaced"),
    ({"metadata": {"name": "c", "namespace": "default", "uid": "u1"}, "status": {}}, "u1",
     "not allocated yet"),
    (claim("c", "u1", "gpu-0", pool="node-b"), "u1", "this node's pool is 'node-a'"),
    (claim("c", "u1", "gpu-7"), "u1",
     "device gpu-7, which this node does not have (its devices: gpu-0, gpu-1)"),
])
def test_a_claim_that_cannot_be_prepared_says_why(found: dict[str, Any] | None, uid: str, words: str) -> None:
    with pytest.raises(ClaimProblem) as err:
        check_claim(found, namespace="default", name="c", uid=uid, driver=DRIVER, pool=NODE, devices=DEVICES)
    assert words in str(err.value)
    assert "claim default/c (uid u1)" in str(err.value)


# --- prepare and unprepare --------------------------------------------------------------------------


def test_prepare_writes_the_spec_and_answers_its_names(tmp_path: Path) -> None:
    c = claim("c", "u1", "gpu-1")
    specs, cluster = Specs(), Cluster(c)
    answer = preparer(tmp_path, cluster, specs).prepare([ref(c)])["u1"]
    assert answer.error == ""
    (dev,) = answer.devices
    assert (dev.request_names, dev.pool, dev.device) == (("gpu",), NODE, "gpu-1")
    # the device, and the request's device metadata file (KEP-5304) its spec mounts
    assert dev.cdi_ids == ("k8s.gpu.nvidia.com/claim=u1-gpu-1", "k8s.gpu.nvidia.com/claim=u1-metadata-gpu")
    assert specs.files == {"u1": ["gpu-1"]}
    assert list(specs.metadata["u1"]) == ["gpu"]


def test_prepare_is_idempotent_without_asking_the_api_again(tmp_path: Path) -> None:
    c = claim("c", "u1", "gpu-0")
    specs, cluster = Specs(), Cluster(c)
    p = preparer(tmp_path, cluster, specs)
    first = p.prepare([ref(c)])["u1"]
    second = p.prepare([ref(c)])["u1"]
    assert first == second and cluster.gets == 1


def test_a_device_prepared_for_another_claim_is_refused(tmp_path: Path) -> None:
    a, b = claim("a", "ua", "gpu-0"), claim("b", "ub", "gpu-0")
    specs = Specs()
    p = preparer(tmp_path, Cluster(a, b), specs)
    assert p.prepare([ref(a)])["ua"].error == ""
    error = p.prepare([ref(b)])["ub"].error
    assert "device gpu-0 is already prepared for claim default/a (uid ua)" in error
    assert set(specs.files) == {"ua"}, "nothing written for the refused claim"


def test_an_unhealthy_device_is_not_handed_out(tmp_path: Path) -> None:
    c = claim("c", "u1", "gpu-0")
    answer = preparer(tmp_path, Cluster(c), Specs(), frozenset({"GPU-0"})).prepare([ref(c)])["u1"]
    assert "device gpu-0 is unhealthy" in answer.error


def test_each_claim_of_a_call_gets_its_own_answer(tmp_path: Path) -> None:
    good, missing = claim("good", "ug", "gpu-0"), claim("gone", "ux", "gpu-1")
    answers = preparer(tmp_path, Cluster(good), Specs()).prepare([ref(good), ref(missing)])
    assert answers["ug"].error == "" and "not in the API server" in answers["ux"].error


def test_a_spec_that_cannot_be_written_leaves_nothing_prepared(tmp_path: Path) -> None:
    c = claim("c", "u1", "gpu-0")
    specs = Specs()
    specs.fail = True
    p = preparer(tmp_path, Cluster(c), specs)
    assert "read-only file system" in p.prepare([ref(c)])["u1"].error
    assert p.prepared() == {}
    specs.fail = False
    assert p.prepare([ref(c)])["u1"].error == "", "the kubelet's retry succeeds"


def test_unprepare_removes_the_spec_and_frees_the_device(tmp_path: Path) -> None:
    a, b = claim("a", "ua", "gpu-0"), claim("b", "ub", "gpu-0")
    specs = Specs()
    p = preparer(tmp_path, Cluster(a, b), specs)
    p.prepare([ref(a)])
    assert p.unprepare([ref(a)]) == {"ua": ""}
    assert specs.files == {}
    assert p.prepare([ref(b)])["ub"].error == ""


def test_unprepare_of_an_unknown_claim_is_done_and_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture
                                                          ) -> None:
    with caplog.at_level(logging.WARNING):
        answers = preparer(tmp_path, Cluster(), Specs()).unprepare([ClaimRef("default", "u9", "never")])
    assert answers == {"u9": ""}
    assert "claim default/never (uid u9), which this plugin has not prepared" in caplog.text


# --- restarts and the checkpoint --------------------------------------------------------------------


def test_prepared_claims_survive_a_restart(tmp_path: Path) -> None:
    c = claim("c", "u1", "gpu-0")
    specs, cluster = Specs(), Cluster(c)
    first = preparer(tmp_path, cluster, specs)
    answer = first.prepare([ref(c)])["u1"]
    second = preparer(tmp_path, cluster, specs)
    assert second.restore(cluster.list) is None
    assert cluster.gets == 2, "the start checked the claim with the API server"
    assert second.prepared()["u1"].state == COMPLETED
    assert second.prepare([ref(c)])["u1"] == answer and cluster.gets == 2, "answered from the checkpoint"


def test_a_spec_file_lost_in_a_reboot_is_written_again(tmp_path: Path) -> None:
    c = claim("c", "u1", "gpu-0")
    specs, cluster = Specs(), Cluster(c)
    preparer(tmp_path, cluster, specs).prepare([ref(c)])
    specs.files.clear()  # /var/run/cdi is a tmpfs
    again = preparer(tmp_path, cluster, specs)
    again.restore(cluster.list)
    assert again.prepare([ref(c)])["u1"].error == "" and specs.files == {"u1": ["gpu-0"]}


def test_stale_specs_are_removed_at_start(tmp_path: Path) -> None:
    specs = Specs()
    specs.files["left-over"] = ["gpu-0"]
    preparer(tmp_path, Cluster(), specs).restore(Cluster().list)
    assert specs.files == {}


@pytest.mark.parametrize("content", [b"{not json", b'{"version": 99, "checksum": "x", "claims": {}}'])
def test_an_unreadable_checkpoint_is_set_aside_and_rebuilt_from_the_api(tmp_path: Path, content: bytes
                                                                         ) -> None:
    reserved = claim("r", "ur", "gpu-1")
    idle = claim("i", "ui", "gpu-0", reserved=False)
    other = claim("o", "uo", "gpu-0", pool="node-b")
    (tmp_path / "checkpoint.json").write_bytes(content)
    specs, cluster = Specs(), Cluster(reserved, idle, other)
    p = preparer(tmp_path, cluster, specs)
    problem = p.restore(cluster.list)
    assert problem is not None
    assert set(p.prepared()) == {"ur"}, "only the claim reserved for a pod on this node's pool"
    assert specs.files == {"ur": ["gpu-1"]}
    aside = [n for n in os.listdir(tmp_path) if n.startswith("checkpoint.json.bad-")]
    assert len(aside) == 1 and (tmp_path / aside[0]).read_bytes() == content, "the bad file is kept"
    saved = json.loads((tmp_path / "checkpoint.json").read_text())
    assert list(saved["claims"]) == ["ur"]


# --- sharing -----------------------------------------------------------------------------------------

SHARED = {d.name: d for d in (
    DraDevice(name="gpu-0", kind="gpu", uuid="GPU-0", gpu_uuid="GPU-0", attributes={},
              capacity={"memory": {"value": str(16 * 2**30)}}, resource="nvidia.com/gpu", replicas=4,
              sharing="time-slicing"),
    device("gpu-1", "GPU-1"),
)}


def shared_claim(name: str, uid: str, share_id: str | None, *config: dict[str, Any]) -> dict[str, Any]:
    c = claim(name, uid, "gpu-0")
    if share_id is not None:
        c["status"]["allocation"]["devices"]["results"][0]["shareID"] = share_id
    if config:
        c["spec"] = {"devices": {"config": [
            {"opaque": {"driver": DRIVER, "parameters": {"apiVersion": "resource.nvidia.com/v1beta1",
                                                         "kind": "GpuConfig", "sharing": p}}}
            for p in config]}}
    return c


class FakeMps:
    """ClaimMps's calls, remembered: which claims use which GPUs' daemon."""

    def __init__(self) -> None:
        self.using: dict[str, tuple[str, ...]] = {}

    def use(self, claim_uid: str, gpus: Sequence[str], limits: Any = None) -> Any:
        self.using[claim_uid] = tuple(gpus)
        return self.mount(gpus)

    def mount(self, gpus: Sequence[str]) -> Any:
        from nvdp.dra.claims.sharing.mps import MpsMount

        return MpsMount(pipe_dir=f"/run/nvidia/mps/gpu.nvidia.com/{gpus[0]}/pipe",
                        shm_dir="/run/nvidia/mps/gpu.nvidia.com/shm")

    def release(self, claim_uid: str) -> None:
        self.using.pop(claim_uid, None)

    def adopt(self, claim_uid: str, gpus: Sequence[str], limits: Any = None) -> None:
        self.using[claim_uid] = tuple(gpus)

    def settle(self) -> None:
        self.settled = dict(self.using)

    def stop(self) -> bool:
        return True


def sharing_preparer(tmp_path: Path, cluster: Cluster, specs: Specs, mps: FakeMps) -> ClaimPreparer:
    from nvdp.dra.claims.sharing.node import NodeSharing

    sharing = NodeSharing(driver=DRIVER, mps=mps, log=LOG, no_mps_reason="",  # type: ignore[arg-type]
                          timeslice=lambda gpu, interval: None)
    return ClaimPreparer(driver=DRIVER, pool=NODE, checkpoint_path=str(tmp_path / "checkpoint.json"),
                         lock_path=str(tmp_path / "pu.lock"), specs=specs, get_claim=cluster.get,
                         view=lambda: NodeView(SHARED), log=LOG, sharing=sharing)


MPS = {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 25,
                                        "defaultPinnedDeviceMemoryLimit": "2Gi"}}


def test_replicas_of_a_shared_gpu_are_prepared_for_several_claims(tmp_path: Path) -> None:
    a, b = shared_claim("a", "u1", "s1"), shared_claim("b", "u2", "s2")
    specs = Specs()
    p = sharing_preparer(tmp_path, Cluster(a, b), specs, FakeMps())
    answers = p.prepare([ref(a), ref(b)])
    assert not answers["u1"].error and not answers["u2"].error
    assert specs.files == {"u1": ["gpu-0"], "u2": ["gpu-0"]}
    # without a share ID the scheduler did not share it: the second claim is refused
    c = shared_claim("c", "u3", None)
    (tmp_path / "x").mkdir()
    p2 = sharing_preparer(tmp_path / "x", Cluster(a, c), Specs(), FakeMps())
    assert not p2.prepare([ref(a)])["u1"].error
    assert "already prepared for claim default/a" in p2.prepare([ref(c)])["u3"].error


def test_mps_claims_on_one_gpu_share_its_daemon_with_their_own_limits(tmp_path: Path) -> None:
    a = shared_claim("a", "u1", "s1", MPS)
    b = shared_claim("b", "u2", "s2", {**MPS, "mpsConfig": {"defaultActiveThreadPercentage": 50}})
    specs, mps = Specs(), FakeMps()
    p = sharing_preparer(tmp_path, Cluster(a, b), specs, mps)
    answers = p.prepare([ref(a), ref(b)])
    assert not answers["u1"].error and not answers["u2"].error
    assert mps.using == {"u1": ("GPU-0",), "u2": ("GPU-0",)}
    edits_a, edits_b = specs.edits["u1"], specs.edits["u2"]
    assert edits_a is not None and edits_b is not None
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in edits_a.env
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M" in edits_a.env
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50" in edits_b.env
    assert {(m.host_path, m.container_path) for m in edits_a.mounts} == {
        ("/run/nvidia/mps/gpu.nvidia.com/shm", "/dev/shm"),
        ("/run/nvidia/mps/gpu.nvidia.com/GPU-0/pipe", "/tmp/nvidia-mps")}
    # the checkpoint keeps the share: a restarted plugin starts the daemon again for both
    mps2 = FakeMps()
    sharing_preparer(tmp_path, Cluster(a, b), Specs(), mps2).restore(None)
    assert mps2.using == {"u1": ("GPU-0",), "u2": ("GPU-0",)}
    assert p.unprepare([ref(a)]) == {"u1": ""}
    assert mps.using == {"u2": ("GPU-0",)}


def test_a_claim_without_mps_on_a_gpu_shared_through_mps_is_refused(tmp_path: Path) -> None:
    a, b = shared_claim("a", "u1", "s1", MPS), shared_claim("b", "u2", "s2")
    mps = FakeMps()
    p = sharing_preparer(tmp_path, Cluster(a, b), Specs(), mps)
    assert not p.prepare([ref(a)])["u1"].error
    error = p.prepare([ref(b)])["u2"].error
    assert "GPU GPU-0 is in use by claim default/a (uid u1) through the MPS daemon of GPU-0" in error
    assert "this claim asks for no MPS" in error
    assert mps.using == {"u1": ("GPU-0",)}


def test_invalid_sharing_config_is_refused_with_the_field_and_nothing_prepared(tmp_path: Path) -> None:
    bad = shared_claim("a", "u1", "s1",
                       {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 101}})
    specs, mps = Specs(), FakeMps()
    p = sharing_preparer(tmp_path, Cluster(bad), specs, mps)
    error = p.prepare([ref(bad)])["u1"].error
    assert "invalid sharing config" in error and "defaultActiveThreadPercentage" in error
    assert specs.files == {} and mps.using == {} and p.prepared() == {}


# --- admin access (KEP-5018) -------------------------------------------------------------------------


def admin_claim(name: str, uid: str, *devices: str, namespace: str = "monitoring") -> dict[str, Any]:
    """A claim whose request has `adminAccess: true`: the scheduler writes it on each result."""
    c = claim(name, uid, *devices, namespace=namespace)
    for result in c["status"]["allocation"]["devices"]["results"]:
        result["adminAccess"] = True
    return c


def test_admin_access_gets_a_device_another_claim_holds(tmp_path: Path) -> None:
    holder, admin = claim("a", "ua", "gpu-0"), admin_claim("debug", "ud", "gpu-0")
    specs = Specs()
    p = preparer(tmp_path, Cluster(holder, admin), specs)
    assert p.prepare([ref(holder)])["ua"].error == ""
    answer = p.prepare([ref(admin)])["ud"]
    assert answer.error == ""
    (device,) = answer.devices
    assert (device.device, device.cdi_ids) == ("gpu-0", ("k8s.gpu.nvidia.com/claim=ud-gpu-0",
                                                         "k8s.gpu.nvidia.com/claim=ud-metadata-gpu"))
    assert specs.files == {"ua": ["gpu-0"], "ud": ["gpu-0"]}
    # the holder's retried prepare still answers its own device
    assert p.prepare([ref(holder)])["ua"].devices[0].device == "gpu-0"


def test_an_admin_claim_holds_nothing(tmp_path: Path) -> None:
    # prepared first (the holder's pod not started yet, or gone), it keeps no claim from the device
    admin, a, b = admin_claim("debug", "ud", "gpu-0"), claim("a", "ua", "gpu-0"), claim("b", "ub", "gpu-0")
    specs = Specs()
    p = preparer(tmp_path, Cluster(admin, a, b), specs)
    assert p.prepare([ref(admin)])["ud"].error == ""
    assert p.prepare([ref(a)])["ua"].error == ""
    # ... and is no second allocation: a normal claim on a device a normal claim holds is still refused
    assert "already prepared for claim default/a (uid ua)" in p.prepare([ref(b)])["ub"].error
    # a restarted plugin knows the admin device from its checkpoint
    p.unprepare([ref(a)])
    restarted = preparer(tmp_path, Cluster(admin, a, b), specs)
    restarted.restore(None)
    assert restarted.prepared()["ud"].devices[0].admin_access
    assert restarted.prepare([ref(b)])["ub"].error == ""


def test_unprepare_of_an_admin_claim_leaves_the_holder_alone(tmp_path: Path) -> None:
    holder, admin = claim("a", "ua", "gpu-0"), admin_claim("debug", "ud", "gpu-0")
    specs = Specs()
    p = preparer(tmp_path, Cluster(holder, admin), specs)
    p.prepare([ref(holder), ref(admin)])
    assert p.unprepare([ref(admin)]) == {"ud": ""}
    assert specs.files == {"ua": ["gpu-0"]} and list(p.prepared()) == ["ua"]
    # the device is still the holder's
    other = claim("b", "ub", "gpu-0")
    p2 = preparer(tmp_path, Cluster(holder, other), specs)
    p2.restore(None)
    assert "already prepared for claim default/a" in p2.prepare([ref(other)])["ub"].error


MPS_NODE = {"gpu-0": DraDevice(name="gpu-0", kind="gpu", uuid="GPU-0", gpu_uuid="GPU-0", attributes={},
                                capacity={"memory": {"value": str(16 * 2**30)}}, resource="nvidia.com/gpu",
                                replicas=4, sharing="mps")}


def mps_node_preparer(tmp_path: Path, cluster: Cluster, specs: Specs, mps: FakeMps) -> ClaimPreparer:
    """The node's sharing config shares gpu-0 through MPS: every claim on it joins the daemon."""
    from nvdp.dra.claims.sharing.node import NodeSharing

    sharing = NodeSharing(driver=DRIVER, mps=mps, log=LOG, no_mps_reason="",  # type: ignore[arg-type]
                          timeslice=lambda gpu, interval: None)
    return ClaimPreparer(driver=DRIVER, pool=NODE, checkpoint_path=str(tmp_path / "checkpoint.json"),
                         lock_path=str(tmp_path / "pu.lock"), specs=specs, get_claim=cluster.get,
                         view=lambda: NodeView(MPS_NODE), log=LOG, sharing=sharing)


def test_an_admin_claim_takes_no_part_in_the_gpus_mps_or_replicas(tmp_path: Path) -> None:
    holder, admin = shared_claim("a", "u1", "s1"), admin_claim("debug", "ud", "gpu-0")
    specs, mps = Specs(), FakeMps()
    p = mps_node_preparer(tmp_path, Cluster(holder, admin), specs, mps)
    assert not p.prepare([ref(holder)])["u1"].error
    assert mps.using == {"u1": ("GPU-0",)}
    # the admin claim sees the GPU itself: it is no MPS client, and its spec has no MPS pipe or limits
    assert p.prepare([ref(admin)])["ud"].error == ""
    assert mps.using == {"u1": ("GPU-0",)}
    assert specs.edits["ud"] == ContainerEdits()
    assert p.prepared()["ud"].share.mps_gpus == ()
    # another replica joins the holder's daemon as before
    other = shared_claim("b", "u2", "s2")
    p2 = mps_node_preparer(tmp_path, Cluster(holder, admin, other), specs, mps)
    p2.restore(None)
    assert p2.prepare([ref(other)])["u2"].error == ""
    assert mps.using == {"u1": ("GPU-0",), "u2": ("GPU-0",)}
    # unpreparing the admin claim keeps the holders' daemon
    assert p2.unprepare([ref(admin)]) == {"ud": ""}
    assert mps.using == {"u1": ("GPU-0",), "u2": ("GPU-0",)}


def test_an_admin_claim_on_an_unhealthy_device_is_refused(tmp_path: Path) -> None:
    admin = admin_claim("debug", "ud", "gpu-0")
    answer = preparer(tmp_path, Cluster(admin), Specs(), frozenset({"GPU-0"})).prepare([ref(admin)])["ud"]
    assert "device gpu-0 is unhealthy" in answer.error
