"""Whose a process is: its pod UID and container ID from /proc/<pid>/cgroup, its container's name from
/proc/<pid>/mountinfo.

The kubelet puts each pod in a cgroup named after its UID and the runtime puts each container in one
named after its ID, whatever the cgroup driver:

    0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid>.slice/cri-containerd-<id>.scope
    0::/kubepods/besteffort/pod<uid>/<id>                      (the cgroupfs driver)
    11:memory:/kubepods/pod<uid>/<id>                          (cgroup v1: one line per hierarchy)

(the systemd driver writes the UID with _ for -).

Read from inside a cgroup namespace, the path starts with `/..` components; the names are the same.
The container's name is not in its cgroup; the kubelet's bind mount of the container's termination
log is, from `/var/lib/kubelet/pods/<uid>/containers/<name>/<file>` (the mount's root in mountinfo,
relative to the file system the kubelet folder is on). Both files are readable for every process of
the PID namespace; the host's needs the plugin in it (hostPID).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from nvdp.usage.model import Owner

_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
# cri-containerd-<id>.scope, crio-<id>.scope, docker-<id>.scope, or the bare ID (cgroupfs); not
# crio-conmon-<id>.scope, CRI-O's monitor process beside the container.
_CONTAINER_ID = re.compile(r"^((?:[a-z]+-)*)([0-9a-f]{64})(?:\.scope)?$")
_NAME = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"


def owner_from_cgroup(text: str) -> tuple[str, str] | None:
    """(pod UID, container ID) of a /proc/<pid>/cgroup; None for a process outside every pod. The
    container ID is "" for a process in the pod's cgroup itself."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        parts = path.split("/")
        for k, part in enumerate(parts):
            found = _POD.search(part)
            if found is None:
                continue
            uid = found.group(1).replace("_", "-")
            rest = [p for p in parts[k + 1:] if p]
            match = _CONTAINER_ID.match(rest[0]) if rest else None
            return uid, match.group(2) if match and "conmon" not in match.group(1) else ""
    return None


def container_from_mountinfo(text: str, pod_uid: str) -> str:
    """The container's name from its termination-log mount; "" when no mount names it."""
    pattern = re.compile(rf"/pods/{re.escape(pod_uid)}/containers/({_NAME})/")
    for line in text.splitlines():
        fields = line.split(" ", 5)
        if len(fields) > 4:
            found = pattern.search(fields[3])
            if found is not None:
                return found.group(1)
    return ""


class ProcReader:
    """Reads the owners of PIDs under a proc root, remembering each container's name by its ID (a
    container's mounts are read once; names of containers not seen in the last read are forgotten)."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self.root = proc_root.rstrip("/")
        self._names: dict[str, str] = {}

    def owners(self, pids: Iterable[int]) -> dict[int, Owner]:
        """The owner of each PID that runs in a pod; a PID gone, or outside every pod, is left out."""
        found: dict[int, Owner] = {}
        names: dict[str, str] = {}
        for pid in pids:
            try:
                owner = owner_from_cgroup(_read(f"{self.root}/{pid}/cgroup"))
            except OSError:  # gone since NVML listed it, or not in this PID namespace
                continue
            if owner is None:
                continue
            uid, container_id = owner
            name = names.get(container_id, self._names.get(container_id)) if container_id else None
            if name is None:
                name = self._container_name(pid, uid)
            if container_id:
                names[container_id] = name
            found[pid] = Owner(pod_uid=uid, container_id=container_id, container=name)
        self._names = names
        return found

    def _container_name(self, pid: int, uid: str) -> str:
        try:
            return container_from_mountinfo(_read(f"{self.root}/{pid}/mountinfo"), uid)
        except OSError:
            return ""


def _read(path: str) -> str:
    # os.read rather than open(): a scrape reads one of these per process on a held GPU, and the file
    # objects cost more than the read (2.7 times the time for a cgroup file).
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace")
