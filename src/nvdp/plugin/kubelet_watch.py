"""Notice when the kubelet (re)creates its registration socket, so the plugin can register again.

A restarted kubelet forgets every plugin and removes their sockets. Linux inotify on the socket's
directory reports the new kubelet.sock within microseconds and costs nothing while idle; where
inotify is unavailable (no libc symbol, or the per-user watch limit is reached, as in
gpu-operator#441) the watcher falls back to checking the socket's inode and change time every `poll_interval`
seconds, one stat() call per check.

A directory that is removed and re-created must be watched anew. inotify reports the removal only
once nothing holds the old directory any more (an open descriptor, a bind mount), so the watcher
also compares the directory at the path with the one it watches every `directory_check_s` seconds
(one stat) and, when they differ, moves its watch to the new one as after a kubelet restart.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import select
import struct
import threading
from collections.abc import Callable

from nvdp.daemon.guard import guarded_thread

IN_CREATE = 0x00000100
IN_MOVED_TO = 0x00000080
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_IGNORED = 0x00008000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
_EVENT_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len


class _Inotify:
    """The three inotify calls, through ctypes; raises OSError when the kernel refuses."""

    def __init__(self) -> None:
        # The process's own symbols include libc's; ctypes.util.find_library would run ldconfig in a
        # subprocess at every start.
        libc = ctypes.CDLL(None, use_errno=True)
        self._add_watch = libc.inotify_add_watch
        self._add_watch.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
        self._rm_watch = libc.inotify_rm_watch
        self._rm_watch.argtypes = (ctypes.c_int, ctypes.c_int)
        fd = int(libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC))
        if fd < 0:
            raise _errno_error("inotify_init1")
        self.fd = fd

    def unwatch(self, wd: int) -> None:
        self._rm_watch(self.fd, wd)  # fails only when the kernel removed it already: nothing to undo

    def watch(self, directory: str) -> int:
        wd = int(self._add_watch(self.fd, os.fsencode(directory), IN_CREATE | IN_MOVED_TO | IN_DELETE_SELF
                                 | IN_MOVE_SELF))
        if wd < 0:
            raise _errno_error(f"inotify_add_watch({directory})")
        return wd

    def read_names(self, wd: int) -> tuple[list[str], bool]:
        """Names created in the directory watched as `wd`, and whether that directory went away (the
        end of an earlier watch, reported late, is not)."""
        names: list[str] = []
        gone = False
        while True:
            try:
                data = os.read(self.fd, 64 * 1024)
            except BlockingIOError:
                return names, gone
            offset = 0
            while offset + _EVENT_HEADER.size <= len(data):
                event_wd, mask, _cookie, length = _EVENT_HEADER.unpack_from(data, offset)
                offset += _EVENT_HEADER.size
                raw = data[offset : offset + length]
                offset += length
                if event_wd != wd:
                    continue
                if mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED):
                    gone = True
                if mask & (IN_CREATE | IN_MOVED_TO):
                    names.append(os.fsdecode(raw.rstrip(b"\0")))

    def close(self) -> None:
        os.close(self.fd)


def _errno_error(call: str) -> OSError:
    code = ctypes.get_errno()
    return OSError(code, f"{call}: {os.strerror(code)}")


def _directory_identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _identity(path: str) -> tuple[int, int, int] | None:
    # Inode numbers are reused at once after unlink, so the change time tells a new socket apart.
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


class KubeletSocketWatcher:
    """Calls `on_created()` from its own thread each time `socket_path` appears anew."""

    def __init__(
        self,
        socket_path: str,
        on_created: Callable[[], None],
        log: logging.Logger,
        *,
        poll_interval: float = 0.1,
        use_inotify: bool = True,
        directory_check_s: float = 1.0,
    ) -> None:
        self.socket_path = socket_path
        self._directory = os.path.dirname(socket_path) or "."
        self._name = os.path.basename(socket_path)
        self._on_created = on_created
        self._log = log
        self._poll_interval = poll_interval
        self._use_inotify = use_inotify
        self._directory_check_s = directory_check_s
        self._watched: tuple[int, tuple[int, int] | None] | None = None  # watch descriptor, directory
        self._stop = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        self._thread: threading.Thread | None = None
        self._last: tuple[int, int, int] | None = None
        self.mode = ""  # "inotify" or "polling", once started

    def start(self) -> None:
        # The starting point is taken here, not in the thread, so a kubelet restart right after
        # start() returns is not missed.
        self._last = _identity(self.socket_path)
        inotify: _Inotify | None = None
        watching = False
        if self._use_inotify:
            try:
                inotify = _Inotify()
                watching = self._try_watch(inotify)
            except (OSError, AttributeError) as err:
                if inotify is not None:
                    inotify.close()
                    inotify = None
                self._log.warning(
                    "Cannot watch %s with inotify (%s); checking for kubelet restarts every %.0f ms "
                    "instead (raise fs.inotify.max_user_instances / max_user_watches to use inotify)",
                    self._directory, err, self._poll_interval * 1000,
                )
        self.mode = "inotify" if inotify else "polling"
        self._log.info("Watching %s for kubelet restarts (%s)", self.socket_path, self.mode)
        if inotify is not None:
            watcher = inotify

            def target() -> None:
                self._run_inotify(watcher, watching)
        else:
            target = self._run_polling
        self._thread = guarded_thread(target, "kubelet-watch", self._log, "The kubelet socket watcher")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5.0)
        self._thread = None
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _notify(self) -> None:
        self._log.info("Kubelet socket %s created; registering again", self.socket_path)
        try:
            self._on_created()
        except Exception:  # the watcher must outlive a failing callback
            self._log.exception("Handling the kubelet restart failed")

    def _run_polling(self) -> None:
        while not self._stop.wait(self._poll_interval):
            current = _identity(self.socket_path)
            if current is not None and current != self._last:
                self._notify()
            self._last = current

    def _run_inotify(self, inotify: _Inotify, watching: bool) -> None:
        try:
            while not self._stop.is_set():
                if not watching and not self._watch_directory(inotify):
                    return
                if not self._wait_for_events(inotify):
                    return
                watching = False
        except OSError as err:
            self._log.warning("inotify: %s; falling back to polling", err)
            self.mode = "polling"
            self._run_polling()
        finally:
            inotify.close()

    def _try_watch(self, inotify: _Inotify) -> bool:
        """Add the watch; False while the directory does not exist."""
        directory = _directory_identity(self._directory)
        try:
            wd = inotify.watch(self._directory)
        except OSError as err:
            if err.errno in (errno.ENOENT, errno.ENOTDIR):
                return False
            raise
        self._watched = (wd, directory)
        return True

    def _directory_replaced(self, inotify: _Inotify) -> bool:
        """Whether the path names another directory than the watched one (or none); drops the old watch."""
        watched = self._watched
        if watched is None or _directory_identity(self._directory) == watched[1]:
            return False
        self._log.info("%s was removed or replaced; watching it anew", self._directory)
        inotify.unwatch(watched[0])
        self._watched = None
        return True

    def _watch_directory(self, inotify: _Inotify) -> bool:
        """Wait for the directory to exist and watch it; False when stopping."""
        while not self._try_watch(inotify):
            if self._stop.wait(self._poll_interval):
                return False
        if _identity(self.socket_path) not in (None, self._last):
            # Created while the directory had no watch.
            self._notify()
        return True

    def _wait_for_events(self, inotify: _Inotify) -> bool:
        """Deliver creations until the directory disappears (True) or the watcher stops (False)."""
        while not self._stop.is_set():
            ready, _, _ = select.select([inotify.fd, self._wake_r], [], [], self._directory_check_s)
            if self._wake_r in ready:
                return False
            if not ready:
                if self._directory_replaced(inotify):
                    self._last = None
                    return True
                continue
            wd = self._watched[0] if self._watched is not None else -1
            names, gone = inotify.read_names(wd)
            if self._name in names:
                self._notify()
                self._last = _identity(self.socket_path)
            if gone:
                self._last = None
                if self._watched is not None:  # moved away: its watch would stay
                    inotify.unwatch(self._watched[0])
                    self._watched = None
                return True
        return False
