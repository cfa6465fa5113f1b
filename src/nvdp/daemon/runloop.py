"""The run loop every daemon shares: signals and posted wake-ups in one inbox, read as typed reasons.

The plugin, the MPS control daemon and GPU feature discovery all block in `Inbox.wait`. Signals reach
it through `signal.set_wakeup_fd` (so a wait in `select()` returns at once, whatever the main thread
was doing when the signal came), and other threads post a `Wake` on the same pipe (the per-node
config follower, a dead guarded thread, a Node label change). One read returns everything that
queued up, so a burst of SIGHUPs or label changes is acted on once, and a stop always wins.

A signal handler also sets `Inbox.stop_requested`, so a long wait elsewhere (a retry back-off, a
first read of the Node) can see the stop without going back to the loop first.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import math
import os
import select
import signal
import threading
from collections.abc import Callable
from types import FrameType

from msgspec import Struct

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class Wake(enum.Enum):
    """Why the loop woke up."""

    STOP = "stop"  # SIGTERM, SIGINT or SIGQUIT
    RELOAD = "reload"  # SIGHUP: read the config again, whatever changed
    NODE_CONFIG = "node-config"  # the node's config label or the mounted entries changed: choose again
    LABELS = "labels"  # the Node's labels changed (GPU feature discovery compares its own with them)
    FATAL = "fatal"  # a thread the process cannot go on without has died


# Posted wake-ups travel as one byte each, above every signal number (Linux has at most 64).
_CODES = {Wake.NODE_CONFIG: 250, Wake.LABELS: 251, Wake.FATAL: 252}
_FROM_CODE = {code: wake for wake, code in _CODES.items()}


class Wakes(Struct, frozen=True):
    """Everything that arrived since the last wait."""

    reasons: frozenset[Wake] = frozenset()
    stop_signal: str | None = None  # the first stop signal's name, e.g. "SIGTERM"
    reloads: int = 0  # SIGHUPs that queued up (acted on once)

    def __contains__(self, wake: object) -> bool:
        return wake in self.reasons

    @property
    def timed_out(self) -> bool:
        return not self.reasons


class Inbox:
    """The pipe the loop waits on; `post` is safe from any thread; make it on the main thread."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self.stop_requested = threading.Event()
        self._previous_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        self._previous_handlers = {
            signum: signal.signal(signum, self._on_signal) for signum in (signal.SIGHUP, *STOP_SIGNALS)
        }

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # The wakeup fd carries the signal to the loop; the flag lets other waits see a stop early.
        if signum in STOP_SIGNALS:
            self.stop_requested.set()

    def post(self, wake: Wake) -> None:
        """Wake the loop from any thread (a one-byte write is atomic)."""
        if wake is Wake.STOP:
            self.stop_requested.set()
            code = int(signal.SIGTERM)
        elif wake is Wake.RELOAD:
            code = int(signal.SIGHUP)
        else:
            code = _CODES[wake]
        # A full pipe already holds wake-ups, so the loop runs anyway; a closed one means it is gone.
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._write, bytes([code]))

    def post_fatal(self) -> None:
        self.post(Wake.FATAL)

    def wait(self, timeout: float | None = None) -> Wakes:
        """Block until something arrives or `timeout` seconds pass (None or inf: no limit)."""
        if timeout is not None and math.isinf(timeout):
            timeout = None
        if timeout is not None:
            timeout = max(timeout, 0.0)
        try:
            ready, _, _ = select.select([self._read], [], [], timeout)
        except InterruptedError:  # pragma: no cover - PEP 475 retries select itself
            ready = []
        if not ready:
            return Wakes()
        codes = bytearray()
        while True:
            try:
                chunk = os.read(self._read, 4096)
            except BlockingIOError:
                break
            codes += chunk
            if len(chunk) < 4096:
                break
        return decode(bytes(codes))

    def sleep(self, seconds: float) -> bool:
        """Wait without consuming wake-ups; True when a stop was requested meanwhile (end the wait early)."""
        return self.stop_requested.wait(seconds)

    def close(self) -> None:
        signal.set_wakeup_fd(self._previous_fd)
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        os.close(self._read)
        os.close(self._write)


def decode(codes: bytes) -> Wakes:
    """The wake-ups a run of pipe bytes stands for (signal numbers and posted codes)."""
    reasons: set[Wake] = set()
    stop_signal: str | None = None
    reloads = 0
    for code in codes:
        if code in _FROM_CODE:
            reasons.add(_FROM_CODE[code])
        elif code == signal.SIGHUP:
            reasons.add(Wake.RELOAD)
            reloads += 1
        elif code in STOP_SIGNALS:
            reasons.add(Wake.STOP)
            stop_signal = stop_signal or signal.Signals(code).name
    return Wakes(frozenset(reasons), stop_signal, reloads)


Step = Callable[[Wakes], "int | None"]


def run(inbox: Inbox, step: Step, log: logging.Logger,
        timeout: Callable[[], float | None] = lambda: None) -> int:
    """Wait and act until a stop (EXIT_OK), a dead thread (EXIT_FAILED) or `step` returns an exit code.

    `step` gets every wake-up but a stop or a fatal one, and a timed-out wait as an empty `Wakes`.
    """
    while True:
        wakes = inbox.wait(timeout())
        if Wake.STOP in wakes:
            log.info("Received signal %s, shutting down.", wakes.stop_signal or "SIGTERM")
            return EXIT_OK
        if Wake.FATAL in wakes:
            log.error("Exiting so that the kubelet restarts this pod (see the error above)")
            return EXIT_FAILED
        if wakes.reloads > 1:
            log.info("%d SIGHUPs arrived together; reloading once", wakes.reloads)
        result = step(wakes)
        if result is not None:
            return result
