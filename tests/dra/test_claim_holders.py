"""Who holds a device, whatever the allocation says: a claim gone from the API server keeps its devices
while a container on the node holds it (the kubelet's pod-resources answer), and a device is refused
when it overlaps what another prepared claim occupies on the GPU (the whole GPU, its memory slices)."""

from __future__ import annotations

from pathlib import Path

from nvdp.dra.claims.check import NodeView
from nvdp.dra.claims.holders import Occupied, occupied
from nvdp.dra.claims.preparer import ClaimPreparer
from nvdp.dra.claims.records import ClaimEntry, ClaimRef, PreparedDevice
from nvdp.dra.pool.devices import DraDevice, Placement
from tests.dra.test_prepare import DRIVER, LOG, NODE, Cluster, Specs, claim, device


def placement(name: str, gpu: str, profile: str, start: int, size: int) -> DraDevice:
    return DraDevice(name=name, kind="mig", uuid="", gpu_uuid=gpu, attributes={}, capacity={},
                     placement=Placement(profile=profile, gi_profile_id=9, start=start, size=size))


WHOLE = device("gpu-0", "GPU-0")
BIG = placement("gpu-0-mig-3g40gb-9-0", "GPU-0", "3g.40gb", 0, 4)
SMALL = placement("gpu-0-mig-1g10gb-19-4", "GPU-0", "1g.10gb", 4, 1)
OVER = placement("gpu-0-mig-2g20gb-14-2", "GPU-0", "2g.20gb", 2, 2)
OTHER_GPU = device("gpu-1", "GPU-1")
STATIC = device("gpu-1-mig-1g10gb-0", "MIG-A", "GPU-1", kind="mig")
DEVICES = {d.name: d for d in (WHOLE, BIG, SMALL, OVER, OTHER_GPU, STATIC)}


def preparer(tmp_path: Path, cluster: Cluster, in_use: object) -> ClaimPreparer:
    return ClaimPreparer(driver=DRIVER, pool=NODE, checkpoint_path=str(tmp_path / "checkpoint.json"),
                         lock_path=str(tmp_path / "pu.lock"), specs=Specs(), get_claim=cluster.get,
                         view=lambda: NodeView(DEVICES), log=LOG, in_use=in_use)  # type: ignore[arg-type]


def ref(name: str) -> ClaimRef:
    return ClaimRef(namespace="default", uid=f"u-{name}", name=name)


def test_what_devices_occupy() -> None:
    assert occupied(WHOLE).overlaps(occupied(SMALL)) and occupied(SMALL).overlaps(occupied(WHOLE))
    assert occupied(BIG).overlaps(occupied(OVER)) and not occupied(BIG).overlaps(occupied(SMALL))
    assert not occupied(WHOLE).overlaps(occupied(STATIC)), "another GPU"
    assert occupied(OTHER_GPU).overlaps(occupied(STATIC)), "the whole GPU under a fixed MIG device"
    assert Occupied("GPU-1", whole=False, uuid="MIG-B").overlaps(occupied(STATIC)) is False


def test_mig_placements_on_a_gpu_prepared_whole_are_refused_naming_both_claims(tmp_path: Path) -> None:
    # The allocation forged, or raced with a slice update: the counters would never allow it.
    cluster = Cluster(claim("whole", "u-whole", "gpu-0"), claim("big", "u-big", BIG.name),
                      claim("fine", "u-fine", "gpu-1"))
    p = preparer(tmp_path, cluster, lambda: ())
    assert p.prepare([ref("whole")])["u-whole"].error == ""
    refused = p.prepare([ref("big")])["u-big"]
    assert refused.cause == "device_busy"
    assert f"device {BIG.name} overlaps device gpu-0" in refused.error
    assert "claim default/big (uid u-big)" in refused.error
    assert "claim default/whole (uid u-whole)" in refused.error
    assert p.prepare([ref("fine")])["u-fine"].error == ""
    assert set(p.prepared()) == {"u-whole", "u-fine"}


def test_overlapping_placements_are_refused_and_disjoint_ones_prepared(tmp_path: Path) -> None:
    cluster = Cluster(claim("big", "u-big", BIG.name), claim("over", "u-over", OVER.name),
                      claim("small", "u-small", SMALL.name), claim("whole", "u-whole", "gpu-0"))
    p = preparer(tmp_path, cluster, lambda: ())
    # No MIG control here: the big placement is recorded as prepared, as a plugin that made it would
    # have; a placement that passes the holder check is then refused at the make (no MIG control).
    p._book.put(ClaimEntry(uid="u-big", namespace="default", name="big", state="PrepareCompleted",
                           devices=(PreparedDevice(request_names=("gpu",), pool=NODE, device=BIG.name,
                                                   cdi_ids=("x",)),)))
    assert "overlaps device gpu-0-mig-3g40gb-9-0" in p.prepare([ref("over")])["u-over"].error
    assert "overlaps device gpu-0-mig-3g40gb-9-0" in p.prepare([ref("whole")])["u-whole"].error
    small = p.prepare([ref("small")])["u-small"]
    assert small.cause == "mig_create" and "does not make MIG devices" in small.error, "past the holders"


def test_a_force_deleted_claim_whose_pod_still_runs_keeps_its_gpu(tmp_path: Path) -> None:
    """The claim is gone from the API server (finalizers removed, deleted) while its pod runs; a new
    claim is allocated the same GPU. The kubelet says a container still holds the first: it is kept
    and the new one refused naming both, until the kubelet no longer lists it."""
    cluster = Cluster(claim("first", "u-first", "gpu-0"), claim("second", "u-second", "gpu-0"))
    holding = {("default", "first")}
    p = preparer(tmp_path, cluster, lambda: set(holding))
    assert p.prepare([ref("first")])["u-first"].error == ""
    del cluster.claims[("default", "first")]  # force-deleted while its pod runs
    refused = p.prepare([ref("second")])["u-second"]
    assert refused.cause == "device_busy"
    assert "claim default/second (uid u-second)" in refused.error
    assert "claim default/first (uid u-first)" in refused.error
    assert set(p.prepared()) == {"u-first"}
    holding.clear()  # its pod ended: no container on the node holds it
    assert p.prepare([ref("second")])["u-second"].error == ""
    assert set(p.prepared()) == {"u-second"}


def test_a_kubelet_that_cannot_say_proves_nothing(tmp_path: Path) -> None:
    cluster = Cluster(claim("first", "u-first", "gpu-0"), claim("second", "u-second", "gpu-0"))

    def unavailable() -> set[tuple[str, str]]:
        raise OSError("no pod-resources socket")

    p = preparer(tmp_path, cluster, unavailable)
    assert p.prepare([ref("first")])["u-first"].error == ""
    del cluster.claims[("default", "first")]
    assert "claim default/first" in p.prepare([ref("second")])["u-second"].error
    assert set(p.prepared()) == {"u-first"}
    # A start with the same answers releases nothing either.
    again = preparer(tmp_path, cluster, unavailable)
    again.restore(cluster.list)
    assert set(again.prepared()) == {"u-first"}
