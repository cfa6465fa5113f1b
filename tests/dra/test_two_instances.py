"""Two instances of the DRA plugin on one node (the old and new pod of a rolling update): calls are
serialized by the node lock and each starts from the other's last records, so no claim is lost from
the checkpoint and no device is handed out twice, whichever instance the kubelet asks."""

from __future__ import annotations

from pathlib import Path

from tests.dra.test_prepare import Cluster, Specs, claim, preparer, ref


def test_each_instance_starts_from_the_others_records(tmp_path: Path) -> None:
    first, second = claim("a", "uid-a", "gpu-0"), claim("b", "uid-b", "gpu-1")
    third = claim("c", "uid-c", "gpu-0")
    cluster, specs = Cluster(first, second, third), Specs()
    old, new = preparer(tmp_path, cluster, specs), preparer(tmp_path, cluster, specs)
    old.restore(None)
    new.restore(None)  # the new pod starts before the old one stops
    # The old pod finishes a call after the new one loaded the checkpoint.
    assert not old.prepare([ref(first)])["uid-a"].error
    # The new pod's next call starts from that record: its own claim is kept beside it ...
    assert not new.prepare([ref(second)])["uid-b"].error
    assert set(new.prepared()) == {"uid-a", "uid-b"}
    # ... and gpu-0, held by the old pod's claim, is not handed out again.
    refused = new.prepare([ref(third)])["uid-c"]
    assert refused.error and "gpu-0" in refused.error and "uid-a" in refused.error, refused
    # The old pod, asked once more, sees the new one's record too; an unprepare there is seen here.
    assert not old.unprepare([ref(first)])["uid-a"]
    assert set(old.prepared()) == {"uid-b"}
    assert not new.prepare([ref(third)])["uid-c"].error
    assert set(new.prepared()) == {"uid-b", "uid-c"}
    # What is on disk is every record, whoever wrote last.
    fresh = preparer(tmp_path, cluster, specs)
    fresh.restore(None)
    assert set(fresh.prepared()) == {"uid-b", "uid-c"}
