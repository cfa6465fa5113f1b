"""Errors raised while planning resources: a plan that cannot be built, an unknown device ID."""

from __future__ import annotations


class PlanError(ValueError):
    """The config cannot be applied to this node's GPUs; the message names the cause and the fix."""


class UnknownDeviceError(PlanError):
    """A device ID that the resource does not advertise (a kubelet request for a stale or foreign ID)."""

    def __init__(self, resource: str, device_id: str) -> None:
        super().__init__(f"unknown device: {device_id}")
        self.resource = resource
        self.device_id = device_id
