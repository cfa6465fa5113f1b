"""The MPS image's side of DRA claims, in the test's process: OrderedDaemons carrying out the orders a
ClaimMps writes, looked at every few milliseconds (the image looks every 0.2 s)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from nvdp.daemon.report.recording import Recorder
from nvdp.mps.compute_mode import ComputeModes
from nvdp.mps.ordered.daemons import OrderedDaemons

LOG = logging.getLogger("test.mps.ordered")


@contextmanager
def carried_out(root: Path, modes_factory: Callable[[], ComputeModes], *, driver: str = "gpu.nvidia.com",
                every_s: float = 0.02, probe_interval_s: float = 0.05) -> Iterator[OrderedDaemons]:
    """Orders under `root` carried out until the block ends; then every daemon stops."""
    daemons = OrderedDaemons(root, driver, modes_factory, LOG, probe_interval_s, recorder=Recorder())
    done = threading.Event()

    def loop() -> None:
        while not done.wait(every_s):
            try:
                daemons.reconcile()
            except Exception:
                LOG.exception("a pass over the orders failed")

    thread = threading.Thread(target=loop, name="orders", daemon=True)
    thread.start()
    try:
        yield daemons
    finally:
        done.set()
        thread.join()
        daemons.stop()
