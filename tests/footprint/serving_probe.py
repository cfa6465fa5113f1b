"""Runs the plugin (nvdp.plugin.main) with a probe: SIGUSR1 writes what the serving process holds.

Started as a script by test_serving_footprint.py. Every pynvml function is wrapped to count its
calls; on SIGUSR1 the probe writes JSON to $NVDP_PROBE_OUT: the imported modules (and which of
them are stand-ins not loaded yet), the Python threads, the OS thread count, the NVML calls so
far and what the cyclic GC tracks. Nothing here changes what the plugin does.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import signal
import sys
import threading
from collections import Counter
from collections.abc import Callable
from types import FrameType
from typing import Any

NVML_CALLS: Counter[str] = Counter()


def _counted(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        NVML_CALLS[name] += 1
        return function(*args, **kwargs)

    return wrapper


def count_nvml_calls() -> None:
    import pynvml

    for name in dir(pynvml):
        value = getattr(pynvml, name)
        if name.startswith("nvml") and callable(value):
            setattr(pynvml, name, _counted(name, value))


def write_probe(signum: int, frame: FrameType | None) -> None:
    with open(f"/proc/{os.getpid()}/status") as status:
        os_threads = next(int(line.split()[1]) for line in status if line.startswith("Threads:"))
    probe = {
        "modules": sorted(sys.modules),
        # Names whose real module has not been loaded (nvdp.daemon.grpc_import's stand-ins).
        "not_loaded": sorted(n for n, m in sys.modules.items() if type(m).__name__ == "_LoadedOnFirstUse"),
        "threads": sorted(t.name for t in threading.enumerate()),
        "os_threads": os_threads,
        "nvml_calls": dict(NVML_CALLS),
        "allocated_blocks": sys.getallocatedblocks(),
        "gc_frozen": gc.get_freeze_count(),
        "gc_tracked": len(gc.get_objects()),
    }
    path = os.environ["NVDP_PROBE_OUT"]
    with open(path + ".tmp", "w") as out:
        json.dump(probe, out)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    count_nvml_calls()
    signal.signal(signal.SIGUSR1, write_probe)
    from nvdp.plugin.main import main

    sys.exit(main())
