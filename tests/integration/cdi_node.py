"""A node's driver files for CDI tests (`sim.driver_root`), in the test's folder; the test skips, saying
why, where device nodes cannot be made (mknod needs root)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvdp.inventory.model import Inventory
from sim.driver_root import GPU_KIND, SPEC_NAME, VENDOR, CdiNode, NoDeviceNodes, make_driver_root

__all__ = ["GPU_KIND", "SPEC_NAME", "VENDOR", "CdiNode", "make_cdi_node"]


def make_cdi_node(folder: Path, inventory: Inventory) -> CdiNode:
    """The driver root, hook and CDI folder for `inventory` (skips the test without mknod)."""
    try:
        return make_driver_root(folder, inventory)
    except NoDeviceNodes as err:
        print(f"skipped: {err}")
        pytest.skip(str(err))
