"""Run one doctor check within a time limit, and turn what it raised into a report line.

A doctor that hangs tells the user nothing: an NVML whose init never returns (a hung driver), an API
server that accepts the connection and never answers, a socket that never accepts. Each call runs on
a daemon thread; when it has not returned within its limit the caller gets `TimedOut` and goes on to
the next check, and the stuck thread is left behind (it holds nothing the report needs, and the
process exits without waiting for it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from nvdp.doctor.report import Finding, failed

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 10.0


class TimedOut:
    """The call did not return within `seconds`."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds


class _Outcome(Generic[T]):
    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: T | None = None
        self.error: BaseException | None = None


def within(call: Callable[[], T], seconds: float, name: str = "doctor-check") -> T | TimedOut:
    """`call()`'s result, or TimedOut when it has not returned within `seconds`; its exception re-raised."""
    outcome: _Outcome[T] = _Outcome()

    def run() -> None:
        try:
            outcome.value = call()
        except BaseException as err:  # handed to the caller's thread as is
            outcome.error = err
        finally:
            outcome.done.set()

    threading.Thread(target=run, name=name, daemon=True).start()
    if not outcome.done.wait(seconds):
        return TimedOut(seconds)
    if outcome.error is not None:
        raise outcome.error
    return outcome.value  # type: ignore[return-value]  # set by call(), which returns T


def checked(check: str, title: str, call: Callable[[], Finding], seconds: float) -> Finding:
    """The check's finding; a FAIL line when it did not finish in time or stopped with an error."""
    return checked_all(check, title, lambda: [call()], seconds)[0]


def checked_all(check: str, title: str, call: Callable[[], list[Finding]], seconds: float) -> list[Finding]:
    """The check's findings; one FAIL line when it did not finish in time or stopped with an error."""
    try:
        result = within(call, seconds, f"doctor-{check}")
    except Exception as err:  # every error is a report line, never a traceback
        return [
            failed(
                check,
                title,
                f"the check stopped with an unexpected error: {type(err).__name__}: {err}",
                "the other checks still ran; report this line with the output of `nvdp doctor --json`",
            )
        ]
    if isinstance(result, TimedOut):
        return [
            failed(
                check,
                title,
                f"the check did not finish within {result.seconds:g} s",
                "something it reads does not answer (see its title); `nvdp doctor --check-timeout "
                "SECONDS` allows more time",
            )
        ]
    return result
