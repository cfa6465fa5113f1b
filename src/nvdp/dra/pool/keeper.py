"""This node's ResourceSlices as the mode and health in force want them, from any thread.

In "dra" mode the devices are published (a down GPU's devices with their taints, or left out where the
API server has no taints), once the device plugin has let go of the GPUs, and each device's health
goes to the kubelet's health stream at once; in "device-plugin" mode the node's slices are deleted,
once, and the stream reports no device. A publish or delete that
fails (API server away, a conflict that kept coming back) is tried again from the loop every
REPUBLISH_AFTER_S; the slice watch also re-publishes when it reconnects.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from nvdp.config.model import Mode
from nvdp.dra.pool.devices import DraDevice
from nvdp.dra.pool.taints import DeviceHealth, slice_taints

if TYPE_CHECKING:
    from nvdp.dra.pool.publish import SlicePublisher

REPUBLISH_AFTER_S = 10.0


class HealthSink(Protocol):
    """Where each device's health goes as it changes (the kubelet's DRAResourceHealth stream,
    nvdp.dra.kubelet.health_service.HealthFeed)."""

    def update(self, health: Mapping[str, DeviceHealth]) -> None: ...

    def close(self) -> None: ...

# The devices in force, the unhealthy UUIDs and each device's health, read under the daemon's lock;
# None before a config.
Wanted = Callable[[], "tuple[Sequence[DraDevice], frozenset[str], Mapping[str, DeviceHealth]] | None"]


class SliceKeeper:
    """`wanted`: what to publish; `mode`: the node's mode in force; `waiting`: whether the device
    plugin still advertises (nothing is published until it has withdrawn)."""

    def __init__(self, wanted: Wanted, mode: Callable[[], Mode | None], waiting: Callable[[], bool],
                 log: logging.Logger) -> None:
        self._wanted = wanted
        self._mode = mode
        self._waiting = waiting
        self._log = log
        self.publisher: SlicePublisher | None = None
        self.feed: HealthSink | None = None  # the kubelet's health stream (DRAResourceHealth)
        self._publishing = threading.Lock()
        self._failed_at: float | None = None
        self.withdrawn = False  # in "device-plugin" mode: this node's slices are deleted

    def publish(self) -> None:
        # One publish at a time, each of the state read when it begins (a later change publishes
        # again); the daemon's lock is not held over the API calls, so prepares never wait on them.
        with self._publishing:
            wanted = self._wanted()
            if self.publisher is None or wanted is None:
                return
            devices, unhealthy, health = list(wanted[0]), wanted[1], dict(wanted[2])
            mode = self._mode()
            if mode is not None and mode != "dra":
                if self.feed is not None:
                    self.feed.update({})
                self.withdraw()  # the device plugin serves this node: no slices
                return
            if self.feed is not None:
                self.feed.update(health)  # the kubelet's view of each device follows at once
            if self._waiting():
                return  # the device plugin still advertises: published once it has withdrawn
            try:
                writes = self.publisher.publish(devices, unhealthy, slice_taints(health))
            except Exception as err:  # tried again from the loop, and by the watch when it reconnects
                self._log.error("Cannot publish this node's ResourceSlices (retrying in %gs): %s",
                                REPUBLISH_AFTER_S, err)
                self._failed_at = time.monotonic()
                return
            self._failed_at = None
        if writes:
            self._log.info("ResourceSlices published (%d API write%s): %d device(s), %d unhealthy", writes,
                           "" if writes == 1 else "s", len(devices),
                           sum(1 for d in devices if d.uuid in unhealthy or d.gpu_uuid in unhealthy))

    def withdraw(self) -> None:
        """Delete this node's slices (once; the watch re-creates nothing while nothing is wanted)."""
        if self.withdrawn or self.publisher is None:
            return
        try:
            removed = self.publisher.remove_all()
        except Exception as err:  # tried again from the loop
            self._log.error("Cannot delete this node's ResourceSlices (retrying in %gs): %s",
                            REPUBLISH_AFTER_S, err)
            self._failed_at = time.monotonic()
            return
        self.withdrawn = True
        self._failed_at = None
        self._log.info("This node is in device-plugin mode: %s", f"{removed} ResourceSlice(s) deleted"
                       if removed else "no ResourceSlices published")

    def retry(self) -> None:
        """From the loop: publish again once a failed write is REPUBLISH_AFTER_S old."""
        failed_at = self._failed_at
        if failed_at is not None and time.monotonic() - failed_at >= REPUBLISH_AFTER_S:
            self.publish()
