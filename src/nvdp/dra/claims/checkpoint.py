"""The DRA plugin's checkpoint: which claims are prepared on this node, in one JSON file.

    {"version": 1, "checksum": "<sha256 hex>", "claims": {"<claim uid>": {...}, ...}}

The checksum covers the canonical JSON (sorted keys, no spaces) of {"claims": ..., "version": ...},
so a file changed by hand or written only in part is told from a good one. Writes go to a temporary
file that is synced and renamed over the checkpoint, under an exclusive `flock` on `<path>.lock`.

A file that cannot be trusted (not JSON, a bad checksum, another version, older or newer) is never
read in part: it is renamed to `<path>.bad-<unix time>` and loading answers no claims with a
`problem` saying what happened, so the caller rebuilds its state from the API server. The newest
`KEEP_SET_ASIDE` such files are kept for inspection, older ones deleted, so a checkpoint that goes
bad on every start does not fill the plugin's folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
import time
from collections.abc import Iterator, Mapping
from typing import Any

import msgspec
from msgspec import Struct

from nvdp.dra.claims.records import ClaimEntry, OwnedMig, owned_mig

CHECKPOINT_VERSION = 1
CHECKPOINT_FILE = "checkpoint.json"  # in the plugin's folder, beside its socket
KEEP_SET_ASIDE = 5
_REBUILT = "the prepared claims are rebuilt from the API server"


class Loaded(Struct, frozen=True):
    """What load_checkpoint found: the claims, and when the file was set aside, where and why."""

    claims: dict[str, ClaimEntry]
    set_aside: str | None = None
    problem: str | None = None


class _Untrusted(Exception):
    """The file's content cannot be used; the message says why."""


def _checksum(version: object, claims: object) -> str:
    body = msgspec.json.encode({"claims": claims, "version": version}, order="sorted")
    return hashlib.sha256(body).hexdigest()


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    """Hold an exclusive flock on `<path>.lock` (made when missing) for the block."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _parse(data: bytes) -> dict[str, ClaimEntry]:
    try:
        document = msgspec.json.decode(data)
    except msgspec.DecodeError as err:
        raise _Untrusted(f"is not valid JSON ({err})") from None
    if not isinstance(document, dict):
        raise _Untrusted("is not a JSON object")
    version = document.get("version")
    if version != CHECKPOINT_VERSION:
        if not isinstance(version, int) or isinstance(version, bool):
            raise _Untrusted(f"has no valid version (found {version!r})")
        written_by = "a newer" if version > CHECKPOINT_VERSION else "an older"
        raise _Untrusted(f"has version {version}, written by {written_by} plugin; this plugin reads "
                         f"version {CHECKPOINT_VERSION}")
    raw_claims = document.get("claims")
    if document.get("checksum") != _checksum(version, raw_claims):
        raise _Untrusted("fails its checksum (changed or only partly written)")
    try:
        claims = msgspec.convert(raw_claims, dict[str, ClaimEntry])
    except msgspec.ValidationError as err:
        raise _Untrusted(f"does not hold version-{CHECKPOINT_VERSION} claims ({err})") from None
    for uid, entry in claims.items():
        if entry.uid != uid:
            raise _Untrusted(f"files claim {entry.uid!r} under the key {uid!r}")
    return {uid: entry.upgraded() for uid, entry in claims.items()}


def _set_aside(path: str) -> str:
    """Rename the file to a free `<path>.bad-<unix time>[-n]` name, then delete all but the newest
    KEEP_SET_ASIDE such files."""
    base = f"{path}.bad-{int(time.time())}"
    target, n = base, 0
    while os.path.lexists(target):
        n += 1
        target = f"{base}-{n}"
    os.rename(path, target)
    for old in set_aside_files(path)[:-KEEP_SET_ASIDE]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(old)
    return target


def set_aside_files(path: str) -> list[str]:
    """The files set aside from the checkpoint at `path`, oldest first (by the time and number in
    their names: `<path>.bad-<unix time>[-n]`)."""
    directory = os.path.dirname(path) or "."
    prefix = f"{os.path.basename(path)}.bad-"
    found: list[tuple[int, int, str]] = []
    for name in os.listdir(directory):
        if not name.startswith(prefix):
            continue
        stamp, _, n = name[len(prefix):].partition("-")
        if stamp.isdigit() and (n.isdigit() or not n):
            found.append((int(stamp), int(n or 0), os.path.join(directory, name)))
    return [p for _, _, p in sorted(found)]


def load_checkpoint(path: str) -> Loaded:
    """The prepared claims stored at `path`; none when there is no file.

    An untrusted file is renamed aside (see the module) and answered with no claims and a `problem`.
    Raises OSError only when the file or its folder cannot be read, never for its content.
    """
    with _locked(path):
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return Loaded(claims={})
        try:
            return Loaded(claims=_parse(data))
        except _Untrusted as err:
            what = f"checkpoint {path} {err}"
        try:
            aside: str | None = _set_aside(path)
        except OSError as rename_err:
            aside = None
            where = f"it could not be set aside ({rename_err.strerror}) and is overwritten on the next save"
        else:
            where = f"it was set aside as {aside}"
        return Loaded(claims={}, set_aside=aside, problem=f"{what}; {where}; {_REBUILT}")


def read_owned_mig(path: str) -> OwnedMig:
    """The MIG devices the checkpoint's claims own (migStrategy dynamic): made, or begun and not yet
    recorded as made; read without setting a bad file aside (the preparer's start does that): none
    when it cannot be read."""
    try:
        with open(path, "rb") as f:
            claims = _parse(f.read())
    except (OSError, _Untrusted):
        return OwnedMig()
    return owned_mig(claims.values())


def encode_checkpoint(claims: Mapping[str, ClaimEntry]) -> bytes:
    """The file's bytes for `claims`: version, checksum and the claims by uid."""
    body: Any = msgspec.to_builtins(dict(claims))
    checksum = _checksum(CHECKPOINT_VERSION, body)
    return msgspec.json.encode({"version": CHECKPOINT_VERSION, "checksum": checksum, "claims": body})


def save_checkpoint(path: str, claims: Mapping[str, ClaimEntry]) -> None:
    """Replace the checkpoint at `path` with `claims`, atomically and durably (OSError on failure)."""
    data = encode_checkpoint(claims)
    directory = os.path.dirname(path) or "."
    with _locked(path):
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        # The rename is durable only once the folder itself is synced.
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
