"""Writing spec files: atomically, 0644, only when the bytes change, and removing nvdp's own stale ones.

The edge that touches /var/run/cdi. Container runtimes watch that folder and read every change, so
a file is replaced by rename (never seen half-written) and left alone when its bytes are the same.
A class that is no longer in the set (IMEX channels turned off, say) has its file removed; files of
other vendors, and other file kinds, are never touched.

In DRA mode each prepared claim has a transient spec of its own (`nvdp.cdi.claim`), written at
prepare and removed at unprepare: `k8s.gpu.nvidia.com-claim_<claim uid>.json`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import tempfile

from msgspec import Struct

from nvdp.cdi.build import SpecSet
from nvdp.cdi.claim import CLAIM_CLASS, CLAIM_KIND, CLAIM_VENDOR
from nvdp.cdi.errors import CdiError
from nvdp.cdi.spec import VENDOR, Spec, encode

CDI_DIR = "/var/run/cdi"  # dynamic specs: read after /etc/cdi, and winning over it
SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
FILE_MODE = 0o644
DIR_MODE = 0o755
SUFFIX = ".json"


class WriteResult(Struct, frozen=True):
    written: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()


def spec_file_name(spec: Spec) -> str:
    """`<vendor>-<class>.json`, the name CDI's GenerateNameForSpec gives and NVIDIA's plugin writes."""
    return f"{spec.vendor}-{spec.cls}{SUFFIX}"


def _fix(directory: str) -> str:
    return (f"the plugin writes its CDI specs to {directory}: mount the host's {CDI_DIR} there read-write "
            "(the chart mounts it as a hostPath, DirectoryOrCreate), and run the plugin as a user that may "
            "write it")


def _refused(action: str, path: str, err: OSError, directory: str, fix: str | None = None) -> CdiError:
    why = err.strerror or str(err)
    if err.errno == errno.EROFS:
        why = "read-only file system"
    return CdiError(f"cannot {action} {path}: {why}; {fix or _fix(directory)}")


def write_file(data: bytes, path: str, fix: str | None = None) -> bool:
    """Put `data` at `path` atomically with mode 0644 (temp file in the same folder, fsync, rename);
    False, writing nothing, when the file already holds exactly these bytes. CdiError when refused,
    ending with `fix` (default: how to give the plugin the CDI spec folder)."""
    directory = posixpath.dirname(path) or "."
    try:
        with open(path, "rb") as f:
            if f.read(len(data) + 1) == data:
                return False
    except OSError:
        pass  # missing or unreadable: write it
    try:
        fd, tmp = tempfile.mkstemp(prefix=".nvdp-spec.", suffix=".tmp", dir=directory)
    except OSError as err:
        raise _refused("write", path, err, directory, fix) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), FILE_MODE)  # not left to the umask
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(directory)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise _refused("write", path, err, directory, fix) from None
    return True


def _fsync_dir(directory: str) -> None:
    """Make the rename itself durable (best effort: some file systems refuse fsync on a folder)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def _make_dir(directory: str) -> None:
    if os.path.isdir(directory):
        return
    try:
        os.makedirs(directory, exist_ok=True)
        os.chmod(directory, DIR_MODE)
    except OSError as err:
        raise _refused("create the folder", directory, err, directory) from None


def _own_classes(directory: str) -> dict[str, str]:
    """nvdp's spec files in `directory` by class: `k8s.device-plugin.nvidia.com-<class>.json`."""
    prefix = f"{VENDOR}-"
    try:
        names = os.listdir(directory)
    except OSError:
        return {}
    return {n[len(prefix):-len(SUFFIX)]: posixpath.join(directory, n)
            for n in names if n.startswith(prefix) and n.endswith(SUFFIX) and len(n) > len(prefix + SUFFIX)}


def write_specs(specs: SpecSet, directory: str = CDI_DIR) -> WriteResult:
    """Write every spec of `specs` into `directory` (made 0755 when missing), skip those unchanged, and
    remove nvdp's files of classes no longer in the set. CdiError names the path and the fix."""
    _make_dir(directory)
    written: list[str] = []
    unchanged: list[str] = []
    for spec in specs.specs:
        path = posixpath.join(directory, spec_file_name(spec))
        (written if write_file(encode(spec), path) else unchanged).append(path)
    removed: list[str] = []
    keep = specs.classes()
    for cls, path in sorted(_own_classes(directory).items()):
        if cls in keep:
            continue
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue
        except OSError as err:
            raise _refused("remove the stale spec", path, err, directory) from None
        removed.append(path)
    return WriteResult(tuple(written), tuple(unchanged), tuple(removed))


# --- per-claim specs (DRA) -------------------------------------------------------------------------------

_CLAIM_PREFIX = f"{CLAIM_VENDOR}-{CLAIM_CLASS}_"


def claim_spec_path(directory: str, claim_uid: str) -> str:
    """`<dir>/k8s.gpu.nvidia.com-claim_<uid>.json`: CDI's GenerateTransientSpecName ('/' becomes '_')."""
    return posixpath.join(directory, f"{_CLAIM_PREFIX}{claim_uid.replace('/', '_')}{SUFFIX}")


def write_claim_spec(directory: str, spec: Spec, claim_uid: str) -> None:
    """Write a claim's spec (`nvdp.cdi.claim.claim_spec`) into `directory`, made 0755 when missing.
    CdiError names the path and the fix; ValueError when `spec` is not a claim spec."""
    if spec.kind != CLAIM_KIND:
        raise ValueError(f"a claim spec has kind {CLAIM_KIND}, not {spec.kind}")
    _make_dir(directory)
    write_file(encode(spec), claim_spec_path(directory, claim_uid))


def remove_claim_spec(directory: str, claim_uid: str) -> bool:
    """Remove a claim's spec; False when there was none. CdiError names the path and the fix."""
    path = claim_spec_path(directory, claim_uid)
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    except OSError as err:
        raise _refused("remove the claim spec", path, err, directory) from None
    return True


def claim_spec_uids(directory: str) -> frozenset[str]:
    """The claim uids that have a spec file in `directory` (none when it cannot be listed)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return frozenset()
    return frozenset(n[len(_CLAIM_PREFIX):-len(SUFFIX)] for n in names
                     if n.startswith(_CLAIM_PREFIX) and n.endswith(SUFFIX)
                     and len(n) > len(_CLAIM_PREFIX + SUFFIX))
