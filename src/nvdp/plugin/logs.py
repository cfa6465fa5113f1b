"""The plugin's log lines that tell an operator what was found and what is served (the format:
nvdp.daemon.report.logs)."""

from __future__ import annotations

import logging

from nvdp.inventory.model import Inventory
from nvdp.plan.model import Plan


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
