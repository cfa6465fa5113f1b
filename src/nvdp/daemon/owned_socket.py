"""A gRPC server's socket in a kubelet folder: which socket at its path is ours.

gRPC unlinks the path it bound when its server stops, and during a rolling update the next
instance may already listen at the same path by then. So a server binds under a private name, which
this module renames into place (atomically replacing a stale socket), and it removes the path only
while it still is the socket it made. The same identity tells a running resource that its socket
was removed or replaced behind its back (`state()`).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import stat
from typing import Literal

_READY_TIMEOUT_S = 5.0
_bind_names = itertools.count()  # private names to bind under, unique in this process

FileId = tuple[int, int, int]
# ours: the socket we made is in place; gone: nothing at the path; stale: another socket nobody
# listens on (its owner died); taken: another socket that accepts (a newer instance serves it).
SocketState = Literal["ours", "gone", "stale", "taken"]


class ServerStartError(RuntimeError):
    """The gRPC server could not listen on its socket."""


def file_id(path: str) -> FileId | None:
    # Inode numbers are reused at once after an unlink (tmpfs), so the change time tells sockets apart.
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def accepts(socket_path: str) -> None:
    """Connect to the socket once; OSError when nothing listens there.

    NVIDIA's plugin, too, only dials its own socket (no call) before registering. A gRPC call here
    cost 5-7 ms of start-up (a channel, the HTTP/2 handshake and the server's first call), which the
    kubelet's own first call repeats right after Register anyway.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(_READY_TIMEOUT_S)
        probe.connect(socket_path)


class OwnedSocket:
    """The socket at `path` that one server made; not thread-safe (its server's start/stop use it)."""

    def __init__(self, path: str, resource_name: str) -> None:
        self.path = path
        self._resource_name = resource_name
        self._made: FileId | None = None  # identity of the socket we put in place

    def prepare(self) -> str:
        """Check the directory and the path, and return a fresh private path to bind under."""
        self._make_directory()
        self._check_path()
        bound = os.path.join(os.path.dirname(self.path), f".{os.getpid():x}-{next(_bind_names):x}")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(bound)
        return bound

    def take_place(self, bound: str) -> None:
        """Rename the bound socket into place (atomic: replaces a stale one in one step)."""
        try:
            os.rename(bound, self.path)
        except OSError as err:
            cause = f"cannot move {bound} into place: {err.strerror}"
            raise ServerStartError(self.listen_error(cause)) from None
        self._made = file_id(self.path)

    def state(self) -> SocketState:
        """What is at the path now, compared with what we made (one stat; a connect when not ours)."""
        current = file_id(self.path)
        if current is None:
            return "gone"
        if current == self._made:
            return "ours"
        try:
            accepts(self.path)
        except OSError:
            return "stale"
        return "taken"

    def remove_if_ours(self) -> None:
        """Remove the socket only if it is still the one we made: the next instance's must survive."""
        made, self._made = self._made, None
        if made is not None and file_id(self.path) == made:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)

    def listen_error(self, cause: str) -> str:
        return (
            f"cannot listen on {self.path} for {self._resource_name}: {cause}; check that the "
            "directory exists, is writable by the plugin and is the kubelet's device-plugins directory"
        )

    def _make_directory(self) -> None:
        directory = os.path.dirname(self.path) or "."
        try:
            os.makedirs(directory, exist_ok=True)
        except FileExistsError:
            raise ServerStartError(self.listen_error(f"{directory} exists but is not a directory")) from None
        except OSError as err:
            raise ServerStartError(self.listen_error(f"cannot create {directory}: {err.strerror}")) from None

    def _check_path(self) -> None:
        """A socket at our path (a crashed or older instance) is replaced; anything else is not ours."""
        try:
            mode = os.lstat(self.path).st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(mode):
            raise ServerStartError(
                f"{self.path} exists and is not a socket; remove it or choose another devicePluginPath"
            )
