"""The time-slice interval of a GPU, set through the driver's `nvidia-smi` as NVIDIA's DRA driver does.

`nvidia-smi compute-policy -i <uuid> --set-timeslice <n>` changes the whole GPU for every process on
it, and it stays after the claim is gone (NVIDIA's driver does not reset it either): the interval is
the one the last TimeSlicing claim asked for.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence

NVIDIA_SMI = "nvidia-smi"
# NVIDIA's names for the driver's time-slice settings.
INTERVALS = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}
TIMEOUT_S = 10.0

Run = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


class TimesliceError(Exception):
    """nvidia-smi could not set the interval; the message has its output and the fix."""


def _run(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


def set_timeslice(gpu_uuid: str, interval: str, run: Run = _run) -> None:
    """Set GPU `gpu_uuid`'s time slice to NVIDIA's `interval` (Default, Short, Medium, Long)."""
    value = INTERVALS.get(interval)
    if value is None:
        raise TimesliceError(f"unknown time-slice interval {interval!r}: use one of {', '.join(INTERVALS)}")
    args = [NVIDIA_SMI, "compute-policy", "-i", gpu_uuid, "--set-timeslice", str(value)]
    try:
        done = run(args)
    except FileNotFoundError:
        raise TimesliceError(
            f"{NVIDIA_SMI} is not on PATH: it comes with the host driver, which the container gets through "
            "the NVIDIA runtime with NVIDIA_DRIVER_CAPABILITIES including utility") from None
    except subprocess.TimeoutExpired:
        raise TimesliceError(f"{' '.join(args)} did not finish within {TIMEOUT_S:g}s") from None
    except OSError as err:
        raise TimesliceError(f"cannot run {' '.join(args)}: {err}") from None
    if done.returncode != 0:
        output = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        raise TimesliceError(f"{' '.join(args)} failed (exit {done.returncode}): {output}")
