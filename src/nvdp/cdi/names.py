"""CDI device names: the device plugin's vendor, and "vendor/class=name" as CDI qualifies a device.

Pure and import-free: Allocate builds its names from here in the serving process, which must not load
the spec builders (tests/footprint), and the specs name their devices from here too, so a name
Allocate returns is a name a spec defines.
"""

from __future__ import annotations

VENDOR = "k8s.device-plugin.nvidia.com"
# The device of every class spec that stands for all of its devices (NVIDIA's `all`).
ALL_DEVICE = "all"


def kind_of(cls: str, vendor: str = VENDOR) -> str:
    """A spec's kind: "vendor/class"."""
    return f"{vendor}/{cls}"


def qualified(kind: str, name: str) -> str:
    """The fully qualified device name: "vendor/class=name"."""
    return f"{kind}={name}"
