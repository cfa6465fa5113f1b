"""A second DRA driver for the end-to-end NUMA step (tests/e2e/test_dra.py): a stand-in for a NIC's.

It registers with the kubelet and answers its prepares with the one device of its slice and nothing to
inject, so that a pod whose claim holds an nvdp GPU and this device can start: the kubelet prepares
every driver of a claim before the pod runs. Its ResourceSlice is written by the test through the API
(the scheduler needs no more). Run in the plugin image, which has nvdp's kubelet edge:

    python second_driver.py DRIVER POOL DEVICE REQUEST
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence

from nvdp.dra.claims.records import ClaimRef, PreparedDevice, PrepareResult
from nvdp.dra.kubelet.server import DraServer

PLUGINS_DIR = "/var/lib/kubelet/plugins"
REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"


def main(driver: str, pool: str, device: str, request: str) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
    log = logging.getLogger("second-driver")
    answer = PreparedDevice(request_names=(request,), pool=pool, device=device, cdi_ids=())

    def prepare(refs: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        log.info("Prepared %s", ", ".join(f"{r.namespace}/{r.name}" for r in refs))
        return {r.uid: PrepareResult(devices=(answer,)) for r in refs}

    def unprepare(refs: Sequence[ClaimRef]) -> dict[str, str]:
        return {r.uid: "" for r in refs}

    plugin_dir = os.path.join(PLUGINS_DIR, driver)
    os.makedirs(plugin_dir, exist_ok=True)
    server = DraServer(driver=driver, plugin_dir=plugin_dir, registry_dir=REGISTRY_DIR, prepare=prepare,
                       unprepare=unprepare, log=log, on_registered=lambda registered, error: None)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: done.set())
    server.start()
    done.wait()
    server.stop()


if __name__ == "__main__":
    main(*sys.argv[1:5])
