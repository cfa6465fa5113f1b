"""Whose a process is, from /proc/<pid>/cgroup and /proc/<pid>/mountinfo as the kubelet and runtimes
lay them out, and the reader's use of a proc tree."""

from __future__ import annotations

from pathlib import Path

from nvdp.usage.model import Owner
from nvdp.usage.procfs import ProcReader, container_from_mountinfo, owner_from_cgroup

UID = "0b9c6f0e-3c4d-4b5e-8f70-123456789abc"
CID = "4f" * 32

SYSTEMD_V2 = (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}"
              f".slice/cri-containerd-{CID}.scope\n")
CGROUPFS_V2 = f"0::/kubepods/besteffort/pod{UID}/{CID}\n"
V1 = (f"12:pids:/kubepods/pod{UID}/{CID}\n11:memory:/kubepods/pod{UID}/{CID}\n"
      "1:name=systemd:/system.slice/containerd.service\n")
# Read from inside the plugin's own cgroup namespace: the path climbs out of it first.
NAMESPACED = f"0::/../../kubepods-besteffort-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n"
CRIO = f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope\n"
CONMON = f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-conmon-{CID}.scope\n"
POD_ITSELF = f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice\n"
HOST = "0::/system.slice/nvidia-persistenced.service\n"

MOUNTINFO = (
    "1062 1050 0:52 / / rw,relatime master:300 - overlay overlay rw,lowerdir=...\n"
    f"1075 1062 8:1 /var/lib/kubelet/pods/{UID}/etc-hosts /etc/hosts rw,relatime - ext4 /dev/sda1 rw\n"
    f"1076 1062 8:1 /var/lib/kubelet/pods/{UID}/containers/cuda-main/5d1c2b3a /dev/termination-log "
    "rw,relatime - ext4 /dev/sda1 rw\n"
)
# /var/lib/kubelet on a file system of its own: the mount's root is relative to it.
MOUNTINFO_OWN_FS = (f"88 60 8:17 /pods/{UID}/containers/trainer/0a1b2c3d /dev/termination-log rw - xfs "
                    "/dev/sdb1 rw\n")


def test_the_pod_and_container_of_every_cgroup_layout() -> None:
    for text in (SYSTEMD_V2, CGROUPFS_V2, V1, NAMESPACED, CRIO):
        assert owner_from_cgroup(text) == (UID, CID), text


def test_a_process_in_the_pod_but_no_container_and_one_outside_every_pod() -> None:
    assert owner_from_cgroup(POD_ITSELF) == (UID, "")
    assert owner_from_cgroup(CONMON) == (UID, "")  # CRI-O's monitor, not the container
    assert owner_from_cgroup(HOST) is None
    assert owner_from_cgroup("") is None


def test_the_container_name_from_its_termination_log_mount() -> None:
    assert container_from_mountinfo(MOUNTINFO, UID) == "cuda-main"
    assert container_from_mountinfo(MOUNTINFO_OWN_FS, UID) == "trainer"
    assert container_from_mountinfo(MOUNTINFO, "11111111-2222-3333-4444-555555555555") == ""
    assert container_from_mountinfo("garbage\n", UID) == ""


def _proc(root: Path, pid: int, cgroup: str, mountinfo: str | None) -> None:
    (root / str(pid)).mkdir(parents=True)
    (root / str(pid) / "cgroup").write_text(cgroup)
    if mountinfo is not None:
        (root / str(pid) / "mountinfo").write_text(mountinfo)


def test_the_reader_skips_gone_and_host_processes_and_reads_a_container_name_once(tmp_path: Path) -> None:
    _proc(tmp_path, 10, SYSTEMD_V2, MOUNTINFO)
    _proc(tmp_path, 11, SYSTEMD_V2, None)  # the same container: its name is known already
    _proc(tmp_path, 12, HOST, None)
    reader = ProcReader(str(tmp_path))
    owners = reader.owners([10, 11, 12, 13])  # 13 is gone
    assert owners == {10: Owner(UID, CID, "cuda-main"), 11: Owner(UID, CID, "cuda-main")}
    (tmp_path / "10" / "mountinfo").unlink()
    assert reader.owners([11]) == {11: Owner(UID, CID, "cuda-main")}
    assert reader.owners([12]) == {}  # no container seen: the names are forgotten
    assert ProcReader(str(tmp_path)).owners([11]) == {11: Owner(UID, CID, "")}
