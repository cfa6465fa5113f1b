"""Who uses which GPU (nvdp.dra.claims.identity): what each prepared device is, in the claim's status
(KEP-4817) and in its requests' device metadata files (KEP-5304), from one computation.

The status's keys are those dcgm-exporter joins a GPU's metrics on: its DRA mapping,
internal/pkg/transformation/dra.go of NVIDIA/dcgm-exporter (d5e5f510, 2026-05-12), reads the string
attributes `type` ("gpu" or "mig"), `uuid`, `parentUUID` and `profile` of each device of driver
gpu.nvidia.com, keyed by pool and device name.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from msgspec.structs import replace

from nvdp.dra.claims.cdi_specs import ClaimSpecWriter
from nvdp.dra.claims.check import NodeView
from nvdp.dra.claims.identity.device import MPS, TIME_SLICING, identify, metadata_attributes, status_entry
from nvdp.dra.claims.identity.metadata import (
    API_VERSIONS,
    container_path,
    metadata_stream,
    pod_claim_name,
)
from nvdp.dra.claims.identity.status import StatusRefused
from nvdp.dra.claims.preparer import ClaimPreparer
from nvdp.dra.claims.records import ClaimLimits, ClaimShare, PreparedDevice
from nvdp.dra.pool.devices import NUMA_NODE, by_name, dra_devices
from nvdp.inventory.model import MigDevice
from nvdp.inventory.profile import load_profile
from sim.nvml import resolve_profile
from tests.cdi.test_build import FACTS, INVENTORY, config
from tests.dra.test_prepare import (
    DEVICES,
    DRIVER,
    NODE,
    Cluster,
    Specs,
    claim,
    device,
    no_container_holds_a_claim,
    preparer,
    ref,
)

LOG = logging.getLogger("test-dra-identity")
# What dcgm-exporter reads of a device (internal/pkg/transformation/dra.go, getAttrString calls).
DCGM_EXPORTER_KEYS = {"gpu": {"type", "uuid"}, "mig": {"type", "uuid", "parentUUID", "profile"}}
MIG_DEVICES = by_name(dra_devices(load_profile(resolve_profile("h100-mig-8"))))
STATIC_MIG = "gpu-2-mig-3g40gb-9-4"


def prepared(name: str, share_id: str = "", request: str = "gpu") -> PreparedDevice:
    return PreparedDevice(request_names=(request,), pool=NODE, device=name, cdi_ids=(), share_id=share_id)


def read_stream(data: bytes) -> list[dict[str, Any]]:
    """The objects of a metadata file, in order, as a reader takes them (the first it knows wins)."""
    decoder, text, at = json.JSONDecoder(), data.decode(), 0
    found: list[dict[str, Any]] = []
    while text[at:].strip():
        at += len(text[at:]) - len(text[at:].lstrip())
        value, at = decoder.raw_decode(text, at)
        assert isinstance(value, dict)
        found.append(value)
    return found


# --- the identity, in the claim's status ------------------------------------------------------------


def test_a_whole_gpu_is_its_uuid() -> None:
    gpu = device("gpu-0", "GPU-0")
    entry = status_entry(DRIVER, identify(prepared("gpu-0"), gpu, ClaimShare()))
    assert entry == {"driver": DRIVER, "pool": NODE, "device": "gpu-0",
                     "data": {"type": "gpu", "uuid": "GPU-0"}}
    data = entry["data"]
    assert isinstance(data, dict) and set(data) == DCGM_EXPORTER_KEYS["gpu"]


def test_a_static_mig_device_names_its_parent_and_profile() -> None:
    mig = MIG_DEVICES[STATIC_MIG]
    data = status_entry(DRIVER, identify(prepared(STATIC_MIG), mig, ClaimShare()))["data"]
    assert data == {"type": "mig", "uuid": mig.uuid, "parentUUID": mig.gpu_uuid, "profile": "3g.40gb"}
    # the same values the slice publishes, under the same names dcgm-exporter reads there
    assert all(data[k] == mig.attributes[k]["string"] for k in DCGM_EXPORTER_KEYS["mig"])  # type: ignore[index]


def test_a_dynamic_mig_device_is_the_one_its_prepare_made() -> None:
    placement = device("gpu-0-mig-1g10gb-19-0", "", "GPU-P", kind="mig")
    made = MigDevice(uuid="MIG-made", index=0, parent_uuid="GPU-P", parent_index=0, profile="1g.10gb",
                     gi_id=9, ci_id=0, memory_bytes=10 << 30)
    data = status_entry(DRIVER, identify(prepared(placement.name), placement, ClaimShare(), made))["data"]
    assert data == {"type": "mig", "uuid": "MIG-made", "parentUUID": "GPU-P", "profile": "1g.10gb"}


def test_a_time_sliced_share_names_the_schedulers_share_and_the_interval() -> None:
    shared = replace(device("gpu-0", "GPU-0"), replicas=4, sharing="time-slicing")
    share = ClaimShare(timeslices=(("GPU-0", "Long"),))
    entry = status_entry(DRIVER, identify(prepared("gpu-0", share_id="s-1"), shared, share))
    # the API server matches shareID to the allocation's result of that share
    assert entry["shareID"] == "s-1"
    assert entry["data"] == {"type": "gpu", "uuid": "GPU-0",
                             "sharing": {"strategy": TIME_SLICING, "interval": "Long"}}


def test_an_mps_share_names_the_limits_its_clients_run_under() -> None:
    shared = replace(device("gpu-0", "GPU-0"), replicas=4, sharing="mps")
    share = ClaimShare(mps_gpus=("GPU-0",), mps_limits=ClaimLimits(thread_percentage=25,
                                                                  memory_mib=(("GPU-0", 3840),)))
    data = status_entry(DRIVER, identify(prepared("gpu-0", share_id="s-2"), shared, share))["data"]
    assert data["sharing"] == {"strategy": MPS, "mps": {"activeThreadPercentage": 25,  # type: ignore[index]
                                                        "pinnedMemoryLimitMiB": 3840}}


def test_a_strict_share_says_mps_enforces_its_limits_whatever_the_others_ask() -> None:
    strict = replace(device("gpu-0", "GPU-0"), replicas=4, sharing="mps", strict=True)
    share = ClaimShare(mps_gpus=("GPU-0",), mps_limits=ClaimLimits(thread_percentage=25))
    identity = identify(prepared("gpu-0"), strict, share)
    data = status_entry(DRIVER, identity)["data"]
    assert data["sharing"]["mps"] == {"activeThreadPercentage": 25, "strictShares": True}  # type: ignore[index]
    assert metadata_attributes(identity, {}, healthy=True)["mpsStrictShares"] == {"bool": True}


def test_the_metadata_attributes_are_the_slices_and_what_the_prepare_knows() -> None:
    mig = MIG_DEVICES[STATIC_MIG]
    share = ClaimShare(mps_gpus=(mig.gpu_uuid,), mps_limits=ClaimLimits(thread_percentage=50))
    identity = identify(prepared(STATIC_MIG), mig, share)
    attributes = metadata_attributes(identity, mig.attributes, healthy=False)
    assert {k: attributes[k] for k in mig.attributes} == mig.attributes  # every published attribute
    assert attributes[NUMA_NODE] == {"int": 0}
    assert attributes["sharingStrategy"] == {"string": "MPS"}
    assert attributes["mpsActiveThreadPercentage"] == {"int": 50}
    assert "mpsPinnedMemoryLimitMiB" not in attributes  # no memory limit set
    assert attributes["healthy"] == {"bool": False}
    assert len(attributes) <= 32  # the metadata API's limit per device (v1beta1)


# --- the metadata file ------------------------------------------------------------------------------


def test_the_file_is_the_helpers_json_stream_newest_version_first() -> None:
    devices = [replace(DEVICES["gpu-0"], attributes={"uuid": {"string": "GPU-0"}})]
    data = metadata_stream(DRIVER, namespace="ns", name="c", uid="u1", pod_claim="gpu", generation=2,
                           request_ref="gpus/large", devices=[
                               _device(d.name, d.attributes) for d in devices])
    objects = read_stream(data)
    assert [o["apiVersion"] for o in objects] == list(API_VERSIONS) == [
        "metadata.resource.k8s.io/v1beta1", "metadata.resource.k8s.io/v1alpha1"]
    assert objects[0] == {**objects[1], "apiVersion": API_VERSIONS[0]}
    assert objects[1] == {
        "kind": "DeviceMetadata", "apiVersion": "metadata.resource.k8s.io/v1alpha1",
        "metadata": {"name": "c", "namespace": "ns", "uid": "u1", "generation": 2},
        "podClaimName": "gpu",
        "requests": [{"name": "gpus/large", "devices": [
            {"driver": DRIVER, "pool": NODE, "name": "gpu-0", "attributes": {"uuid": {"string": "GPU-0"}}}]}],
    }
    assert data.count(b"\n") == 2 and data.endswith(b"}\n")


def _device(name: str, attributes: dict[str, Any]) -> Any:
    from nvdp.dra.claims.identity.metadata import MetadataDevice

    return MetadataDevice(pool=NODE, name=name, attributes=attributes)


def test_the_container_paths_are_the_helpers() -> None:
    # metadata.ResourceClaimFilePath and ResourceClaimTemplateFilePath (api/metadata/helpers.go)
    base = "/var/run/kubernetes.io/dra-device-attributes"
    assert container_path(DRIVER, "my-claim", "", "gpu") == \
        f"{base}/resourceclaims/my-claim/gpu/gpu.nvidia.com-metadata.json"
    assert container_path(DRIVER, "pod-gpu-x7k2q", "gpu", "gpu") == \
        f"{base}/resourceclaimtemplates/gpu/gpu/gpu.nvidia.com-metadata.json"
    made = {"metadata": {"annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"}}}
    assert (pod_claim_name(made), pod_claim_name({"metadata": {}})) == ("gpu", "")


# --- the preparer: every claim, its status and its files -------------------------------------------


class Statuses:
    def __init__(self, fail: Exception | None = None) -> None:
        self.writes: list[tuple[str, list[dict[str, Any]]]] = []
        self.fail = fail

    def __call__(self, namespace: str, name: str, entries: list[dict[str, Any]]) -> None:
        if self.fail is not None:
            raise self.fail
        self.writes.append((name, entries))


def with_status(tmp_path: Path, cluster: Cluster, specs: Specs, statuses: Statuses | None = None,
                view: Callable[[], NodeView] = lambda: NodeView(DEVICES)) -> ClaimPreparer:
    """The preparer of tests/dra/test_prepare.py, with a status writer and a view of its own."""
    return ClaimPreparer(driver=DRIVER, pool=NODE, checkpoint_path=str(tmp_path / "checkpoint.json"),
                         lock_path=str(tmp_path / "pu.lock"), specs=specs, get_claim=cluster.get, view=view,
                         log=LOG, in_use=no_container_holds_a_claim, status=statuses)


def test_every_prepared_claim_gets_its_status_and_one_metadata_file_per_request(tmp_path: Path) -> None:
    c = claim("c", "u1", "gpu-0")
    c["status"]["allocation"]["devices"]["results"].append(
        {"request": "second", "driver": DRIVER, "pool": NODE, "device": "gpu-1"})
    specs, statuses = Specs(), Statuses()
    p = with_status(tmp_path, Cluster(c), specs, statuses)
    answer = p.prepare([ref(c)])["u1"]
    assert answer.error == ""
    assert statuses.writes == [("c", [
        {"driver": DRIVER, "pool": NODE, "device": "gpu-0", "data": {"type": "gpu", "uuid": "GPU-0"}},
        {"driver": DRIVER, "pool": NODE, "device": "gpu-1", "data": {"type": "gpu", "uuid": "GPU-1"}}])]
    assert p.prepared()["u1"].status_pending is False
    files = specs.metadata["u1"]
    assert sorted(files) == ["gpu", "second"]
    assert files["second"].container_path == ("/var/run/kubernetes.io/dra-device-attributes/resourceclaims/c/"
                                              "second/gpu.nvidia.com-metadata.json")
    (newest, _) = read_stream(files["second"].content)
    (request,) = newest["requests"]
    assert (request["name"], [d["name"] for d in request["devices"]]) == ("second", ["gpu-1"])
    assert request["devices"][0]["attributes"]["healthy"] == {"bool": True}
    assert newest["metadata"] == {"name": "c", "namespace": "default", "uid": "u1", "generation": 1}
    assert [d.cdi_ids[-1] for d in answer.devices] == ["k8s.gpu.nvidia.com/claim=u1-metadata-gpu",
                                                       "k8s.gpu.nvidia.com/claim=u1-metadata-second"]


def test_a_claim_from_a_template_has_its_file_under_its_name_in_the_pod(tmp_path: Path) -> None:
    c = claim("pod-gpu-x7k2q", "u1", "gpu-0")
    c["metadata"]["annotations"] = {"resource.kubernetes.io/pod-claim-name": "gpu"}
    specs = Specs()
    assert preparer(tmp_path, Cluster(c), specs).prepare([ref(c)])["u1"].error == ""
    assert specs.metadata["u1"]["gpu"].container_path == (
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpu/gpu/gpu.nvidia.com-metadata.json")
    assert json.loads(specs.metadata["u1"]["gpu"].content.split(b"\n")[0])["podClaimName"] == "gpu"
    p = preparer(tmp_path, Cluster(c), specs)  # a restart: the checkpoint keeps where it goes
    p.restore(None)
    assert p.prepared()["u1"].pod_claim_name == "gpu"


def test_a_write_the_api_server_refuses_for_good_is_not_repeated_and_a_failure_is(tmp_path: Path) -> None:
    c = claim("c", "u1", "gpu-0")
    refused = Statuses(StatusRefused("403 forbidden"))
    p = with_status(tmp_path, Cluster(c), Specs(), refused)
    assert p.prepare([ref(c)])["u1"].error == ""  # the status is for monitoring: the claim is prepared
    assert p.prepared()["u1"].status_pending is False
    failing = Statuses(OSError("connection refused"))
    (tmp_path / "b").mkdir()
    p = with_status(tmp_path / "b", Cluster(c), Specs(), failing)
    assert p.prepare([ref(c)])["u1"].error == ""
    assert p.prepared()["u1"].status_pending is True
    failing.fail = None
    p.catch_up()  # the next tick
    assert p.prepared()["u1"].status_pending is False
    assert [name for name, _ in failing.writes] == ["c"]


def test_a_gpu_going_down_rewrites_the_files_of_the_claims_on_it(tmp_path: Path) -> None:
    on_0, on_1 = claim("a", "ua", "gpu-0"), claim("b", "ub", "gpu-1")
    specs, unhealthy = Specs(), [frozenset[str]()]
    p = with_status(tmp_path, Cluster(on_0, on_1), specs, view=lambda: NodeView(DEVICES, unhealthy[0]))
    assert all(p.prepare([ref(c)])[c["metadata"]["uid"]].error == "" for c in (on_0, on_1))
    p.catch_up()
    before = dict(specs.metadata)
    unhealthy[0] = frozenset({"GPU-0"})
    p.catch_up()

    def newest(uid: str) -> dict[str, Any]:
        return read_stream(specs.metadata[uid]["gpu"].content)[0]

    assert newest("ua")["metadata"]["generation"] == 2
    assert newest("ua")["requests"][0]["devices"][0]["attributes"]["healthy"] == {"bool": False}
    assert specs.metadata["ub"] is before["ub"], "a claim on a healthy GPU is left as it is"
    unhealthy[0] = frozenset()
    p.catch_up()
    assert newest("ua")["metadata"]["generation"] == 3
    assert newest("ua")["requests"][0]["devices"][0]["attributes"]["healthy"] == {"bool": True}


def test_unprepare_removes_the_spec_and_the_files(tmp_path: Path) -> None:
    c = claim("c", "u1", "gpu-0")
    specs = Specs()
    p = preparer(tmp_path, Cluster(c), specs)
    assert p.prepare([ref(c)])["u1"].error == ""
    assert p.unprepare([ref(c)]) == {"u1": ""}
    assert "u1" not in specs.files and "u1" not in specs.metadata


# --- the files on disk ------------------------------------------------------------------------------


def test_the_writer_puts_the_files_below_the_plugins_folder_and_the_spec_mounts_them(tmp_path: Path) -> None:
    from nvdp.cdi.spec import decode

    cdi, root = tmp_path / "cdi", tmp_path / "plugin" / "dra-device-metadata"
    writer = ClaimSpecWriter(str(cdi), config(), INVENTORY, FACTS, str(root))
    gpu = by_name(dra_devices(INVENTORY))["gpu-0"]
    c = claim("c", "u1", "gpu-0")
    specs_seen = Specs()
    assert preparer(tmp_path, Cluster(c), specs_seen).prepare([ref(c)])["u1"].error == ""
    files = list(specs_seen.metadata["u1"].values())
    ids = writer.write("u1", [gpu], None, None, files)
    assert ids == {"gpu-0": "k8s.gpu.nvidia.com/claim=u1-gpu-0"}
    host = root / "u1" / "gpu" / "metadata.json"
    assert host.read_bytes() == files[0].content and oct(host.stat().st_mode & 0o777) == "0o644"
    spec = decode((cdi / "k8s.gpu.nvidia.com-claim_u1.json").read_bytes())
    (mounted,) = [d for d in spec.devices if d.name == "u1-metadata-gpu"]
    (mount,) = mounted.container_edits.mounts
    assert (mount.host_path, mount.container_path) == (str(host), files[0].container_path)
    assert writer.present() == frozenset({"u1"})
    writer.remove("u1")
    assert not host.exists() and not (root / "u1").exists() and writer.present() == frozenset()


@pytest.mark.parametrize("uid", ["", "u2"])
def test_removing_a_claim_without_files_is_a_no_op(tmp_path: Path, uid: str) -> None:
    writer = ClaimSpecWriter(str(tmp_path / "cdi"), config(), INVENTORY, FACTS, str(tmp_path / "meta"))
    (tmp_path / "meta").mkdir()
    writer.remove(uid)
    assert (tmp_path / "meta").exists()
