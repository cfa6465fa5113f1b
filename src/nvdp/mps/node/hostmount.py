"""Mounting and unmounting the MPS tmpfs in the host's mount namespace, without Bidirectional propagation.

MPS clients in other pods get `<mps root>/shm` from the host as their /dev/shm, so the tmpfs must exist in
the host's mount namespace. Mounting it inside the container and relying on `mountPropagation:
Bidirectional` needs the MPS root on a shared mount; hosts without systemd keep / private, and the pod
then never starts ("... is mounted on / but it is not a shared mount"). With the host's PID namespace (the
chart's default `mps.enableHostPID`), a privileged process can instead join the host's mount namespace and
mount there directly, with no propagation. The host's namespace is PID 1's, or,
where PID 1 cannot be inspected, that of the container runtime's shim, the parent of the container's
first process.

Joining a mount namespace needs a single-threaded process, so the daemon runs these steps as a child
process (`mps-control-daemon mount-shm` / `unmount-shm`). Only syscalls are used once inside, never the
host's binaries.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from collections.abc import Mapping
from pathlib import Path

HOST_MOUNT_NS = Path("/proc/1/ns/mnt")
HOST_NAMESPACE_ENV = "MPS_MOUNT_IN_HOST_NAMESPACE"
CLONE_NEWNS = 0x00020000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_RELATIME = 0x2, 0x4, 0x8, 0x200000
MNT_DETACH = 0x2


class HostMountError(OSError):
    """A step in the host's mount namespace failed; the message names the step and the fix."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise HostMountError(code, f"{what}: {os.strerror(code)}")


def wanted(env: Mapping[str, str] | None = None) -> bool:
    """Whether the chart asked for the host's namespace.

    Only the pod spec knows whether other PIDs are the host's (hostPID) or the pod's own
    (shareProcessNamespace), so the chart sets MPS_MOUNT_IN_HOST_NAMESPACE=true with hostPID.
    """
    source = os.environ if env is None else env
    return source.get(HOST_NAMESPACE_ENV, "").lower() == "true"


def host_namespace(parent_pid: int | None = None) -> Path | None:
    """The mount namespace file of the host: PID 1's, else the parent's (the runtime's shim), if it
    differs from ours and can be opened; None otherwise."""
    try:
        own = os.readlink("/proc/self/ns/mnt")
    except OSError:
        return None
    for candidate in (HOST_MOUNT_NS, Path(f"/proc/{parent_pid or os.getppid()}/ns/mnt")):
        try:
            if os.readlink(candidate) != own:
                return candidate
        except OSError:
            continue
    return None


def enter_host_namespace(namespace: Path) -> None:
    """Join that mount namespace (needs CAP_SYS_ADMIN and CAP_SYS_CHROOT: a privileged container)."""
    try:
        fd = os.open(namespace, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as err:
        raise HostMountError(err.errno or errno.EPERM, f"cannot open {namespace}: {err.strerror}") from err
    try:
        _check(_libc().setns(fd, CLONE_NEWNS), f"joining the host's mount namespace ({namespace})")
    finally:
        os.close(fd)


def mount_tmpfs(path: Path, size: str) -> None:
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RELATIME
    options = f"size={size},mode=1777".encode()
    _check(_libc().mount(b"shm", str(path).encode(), b"tmpfs", flags, options), f"mounting a tmpfs at {path}")


def unmount(path: Path) -> None:
    """Detach the mount from `path`; containers that have it bind-mounted keep using it until they end."""
    _check(_libc().umount2(str(path).encode(), MNT_DETACH), f"unmounting {path}")


def is_mount_point(path: Path) -> bool:
    try:
        return os.path.ismount(path)
    except OSError:
        return False
