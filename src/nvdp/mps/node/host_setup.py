"""The MPS daemon's footprint on the host: the tmpfs MPS clients share, and what a final stop removes.

`mps-control-daemon mount-shm` (the chart's init container) mounts the tmpfs at <MPS root>/shm; with
the host's PID namespace it does so in the host's mount namespace (no Bidirectional propagation, see
nvdp.mps.node.hostmount). After the daemon's final stop `clean_up` removes each resource's pipe folder and
readiness marker and the tmpfs it mounted (through `mps-control-daemon unmount-shm`, run as a
single-threaded child because `setns` needs one); pods that still use the tmpfs keep it until they end.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from nvdp.mps.commands import MpsSettings
from nvdp.mps.node import hostmount, shm
from nvdp.mps.node.handover import holder_running
from nvdp.mps.paths import HOST_ROOT_ENV, ResourcePaths, container_root, shm_dir

PROG = "mps-control-daemon"
HOST_MODE_FIX = (
    "the MPS daemon pod must run privileged with the host's PID namespace (chart: mps.enableHostPID=true, "
    "the default)"
)
log = logging.getLogger("nvdp.mps")


def build_mount_parser() -> argparse.ArgumentParser:
    # Separate from the daemon's parser: the init container passes no config flags.
    parser = argparse.ArgumentParser(
        prog=f"{PROG} mount-shm",
        description="Mount the tmpfs that MPS clients share as /dev/shm at <MPS root>/shm.",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the commands instead of running them")
    return parser


def host_shm_dir() -> Path | None:
    root = os.environ.get(HOST_ROOT_ENV, "")
    return shm_dir(Path(root)) if root.startswith("/") else None


def mount_shm(dry_run: bool) -> int:
    if holder_running(container_root()):
        # The new pod of a rolling update: the running pod's clients use this tmpfs (nvdp.mps.node.handover).
        print(f"an MPS daemon pod of this node runs its daemons under {container_root()}: its tmpfs stays, "
              "and this pod shares it when it takes over", flush=True)
        return 0
    host_path = host_shm_dir()
    if hostmount.wanted():
        namespace = hostmount.host_namespace()
        if host_path is None or namespace is None:
            # Mounting in the container instead would look fine and reach nobody.
            print(
                f"{PROG} mount-shm: cannot find the host's mount namespace (PID 1 and this process's parent "
                f"share ours, or {HOST_ROOT_ENV} is not an absolute path); {HOST_MODE_FIX}",
                file=sys.stderr,
            )
            return 1
        return mount_shm_on_host(host_path, namespace, dry_run)
    path = shm_dir(container_root())
    mounted = shm.is_mounted(path, shm.read_text(Path("/proc/mounts")) or "")
    size = shm.shm_size(shm.read_text(Path("/proc/meminfo")))
    for argv in shm.mount_shm_commands(path, size, mounted):
        print(" ".join(argv), flush=True)
        if dry_run:
            continue
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            detail = done.stderr.strip() or done.stdout.strip() or f"status {done.returncode}"
            print(
                f"{PROG} mount-shm: `{' '.join(argv)}` failed: {detail}; the init container must run "
                "privileged with mountPropagation: Bidirectional on the MPS root, which must be a shared "
                "mount on the host (`mount --bind R R && mount --make-rshared R`), or use "
                "mps.enableHostPID=true so no shared mount is needed",
                file=sys.stderr,
            )
            return 1
    return 0


def mount_shm_on_host(path: Path, namespace: Path, dry_run: bool) -> int:
    """The tmpfs at `path` in the host's mount namespace (replacing one left by an earlier start)."""
    size = shm.shm_size(shm.read_text(Path("/proc/meminfo")))
    options = f"{shm.MOUNT_OPTIONS},size={size}"
    print(f"in the host's mount namespace ({namespace}): mount -t tmpfs shm {path} -o {options}", flush=True)
    if dry_run:
        return 0
    try:
        hostmount.enter_host_namespace(namespace)
        path.mkdir(mode=0o755, parents=True, exist_ok=True)
        if hostmount.is_mount_point(path):
            hostmount.unmount(path)
        hostmount.mount_tmpfs(path, size)
    except OSError as err:
        print(f"{PROG} mount-shm: {err}; {HOST_MODE_FIX}", file=sys.stderr)
        return 1
    return 0


def unmount_shm(device: int, namespace: Path) -> int:
    """Detach the host's tmpfs at <MPS root>/shm if it is still the one this pod got (device `device`)."""
    path = host_shm_dir()
    if path is None:
        return 0
    try:
        hostmount.enter_host_namespace(namespace)
        if hostmount.is_mount_point(path) and path.stat().st_dev == device:
            hostmount.unmount(path)
            print(f"unmounted the MPS tmpfs at {path}", flush=True)
    except OSError as err:
        print(f"{PROG} unmount-shm: {err}; {HOST_MODE_FIX}", file=sys.stderr)
        return 1
    return 0


def clean_up(settings: Sequence[MpsSettings], root: Path, host_root: str | None = None) -> None:
    """After the final stop: what only a running daemon needs goes (see the module docstring).

    `host_root` is the node's folder whose `shm` tmpfs this pod mounted, when not $MPS_ROOT (the DRA
    plugin's is `<MPS root>/<driver>`).

    The log folder and status.json ("stopped") stay: control.log is bounded (rotated past its limit) and
    explains a daemon that stopped; a later daemon continues it rather than replaying it.
    """
    for item in settings:
        paths = ResourcePaths(root, item.resource_name)
        shutil.rmtree(paths.pipe_dir, ignore_errors=True)
        try:
            # status.json stays: it says "stopped", which is what the plugin should report.
            paths.ready_marker.unlink(missing_ok=True)
        except OSError as err:  # an unusable root was reported already; nothing of ours is left there
            log.warning("%s: nothing cleaned up under %s: %s", item.resource_name, paths.base, err.strerror)
            continue
        parent = paths.base
        while parent != root and parent.is_relative_to(root):
            try:
                parent.rmdir()  # only when empty: another resource of the same vendor may live there
            except OSError:
                break
            parent = parent.parent
    try:
        device = Path("/dev/shm").stat().st_dev
    except OSError:
        return
    # Found here, where the parent is still the runtime's shim; the child only joins it.
    namespace = hostmount.host_namespace() if hostmount.wanted() else None
    env = dict(os.environ) if host_root is None else {**os.environ, HOST_ROOT_ENV: host_root}
    if not env.get(HOST_ROOT_ENV, "").startswith("/") or namespace is None:
        return
    argv = [sys.executable, "-m", "nvdp.mps.main", "unmount-shm", str(device), str(namespace)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30, env=env)
    for line in (done.stdout + done.stderr).splitlines():
        log.info("%s", line)
