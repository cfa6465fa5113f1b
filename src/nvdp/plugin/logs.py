"""The plugin's log: its format, and the lines that tell an operator what was found and what is served."""

from __future__ import annotations

import logging
import sys

from nvdp.inventory.model import Inventory
from nvdp.plan.model import Plan

LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"


def setup_logging() -> logging.Logger:
    # The log format uses none of the caller, thread or process fields; not collecting them (the
    # logging module's documented switches) makes each record, one per Allocate, about a third cheaper.
    logging._srcfile = None  # type: ignore[attr-defined]
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    return logging.getLogger("nvidia-device-plugin")


def log_inventory(log: logging.Logger, inventory: Inventory) -> None:
    log.info("NVML: driver %s, CUDA %s, %d GPU(s)", inventory.driver_version, inventory.cuda_driver_version,
             len(inventory.gpus))
    for gpu in inventory.gpus:
        mig = f"MIG enabled, {len(gpu.mig_devices)} MIG device(s)" if gpu.mig_enabled else "MIG disabled"
        log.info("GPU %d: %s, %s, %d MiB, %s", gpu.index, gpu.name, gpu.uuid, gpu.memory_bytes >> 20, mig)
        for mig_device in gpu.mig_devices:
            log.info("  MIG %s: %s, %s, %d MiB", mig_device.index_id, mig_device.profile, mig_device.uuid,
                     mig_device.memory_bytes >> 20)
    for lost in inventory.lost:
        log.warning("GPU %d (%s) is not usable: %s", lost.index, lost.uuid or "UUID unknown", lost.reason)


def log_plan(log: logging.Logger, plan: Plan) -> None:
    from nvdp.plugin.manager import describe_resource

    for warning in plan.warnings:
        log.warning("%s", warning)
    for excluded in plan.excluded:
        log.info("Not advertised: %s: %s", excluded.device, excluded.reason)
    for resource in plan.resources:
        log.info("Resource %s", describe_resource(resource))
