"""Threads that never die silently: a failing loop is logged and restarted, a dead thread ends the process.

A plugin whose health thread or MPS gate thread ended quietly looks alive to the kubelet while it no
longer marks devices Unhealthy or re-gates them. `guarded_loop` runs one iteration at a time: an
exception is logged with its traceback and the loop goes on after a pause. A `guarded_thread` whose
target still raises (outside such a loop) tells the process to exit with a failure through the
handler set by `on_fatal` (the plugin's main loop), so the kubelet restarts it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

_fatal: Callable[[], None] | None = None


def on_fatal(handler: Callable[[], None] | None) -> None:
    """Set what a dead guarded thread does to the process (None: only log)."""
    global _fatal
    _fatal = handler


def fatal(log: logging.Logger, what: str) -> None:
    log.critical("%s stopped unexpectedly; the plugin cannot go on without it", what)
    handler = _fatal
    if handler is not None:
        handler()


def guarded_loop(
    step: Callable[[], None],
    stop: threading.Event,
    log: logging.Logger,
    what: str,
    pause_s: float = 1.0,
) -> None:
    """Call `step()` until `stop` is set; an exception is logged and the loop goes on after `pause_s`."""
    while not stop.is_set():
        try:
            step()
        except Exception:
            log.exception("%s failed unexpectedly; going on in %gs", what, pause_s)
            stop.wait(pause_s)


def guarded_thread(target: Callable[[], None], name: str, log: logging.Logger, what: str) -> threading.Thread:
    """A daemon thread running `target`; if it raises, the process is told to exit (see on_fatal)."""

    def run() -> None:
        try:
            target()
        except Exception:
            log.exception("%s failed", what)
            fatal(log, what)

    return threading.Thread(target=run, name=name, daemon=True)
