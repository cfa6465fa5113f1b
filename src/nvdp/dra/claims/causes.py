"""Why a claim could not be prepared or unprepared, as a closed set of words for metric labels.

The messages the kubelet gets (and logs) say what is wrong in full; these words sort them into a few
kinds an operator can alert on, so a label never carries a message, a claim or a device name. Each
error the prepare path raises carries its word (`ClaimProblem.cause`), or the step that failed gives it.
`lock_acquire` and `unprepare_devices` are NVIDIA's own `error_type` values for the same failures.
"""

from __future__ import annotations

LOCK_ACQUIRE = "lock_acquire"  # another prepare or unprepare held the node-wide lock for too long
API_ERROR = "api_error"  # the claim could not be read from the API server
CLAIM_NOT_FOUND = "claim_not_found"  # the claim is gone, or was replaced under its name
INVALID_CLAIM = "invalid_claim"  # not allocated, allocated on another pool or a device the node lacks
INVALID_CONFIG = "invalid_config"  # its sharing config (GpuConfig, MigDeviceConfig) is invalid
DEVICE_UNHEALTHY = "device_unhealthy"  # a device of the claim is unhealthy
DEVICE_BUSY = "device_busy"  # a device is held by another claim, or its GPU is shared another way
SHARING_SETUP = "sharing_setup"  # the time slice or the MPS daemon could not be set up
CDI_WRITE = "cdi_write"  # the claim's CDI spec could not be written
MIG_CREATE = "mig_create"  # migStrategy dynamic: NVML did not make the claim's MIG device
INTERNAL = "internal"  # anything else: the driver failed or gave no answer

# Unprepare: the driver answered the claim with an error (its CDI spec could not be removed, the lock).
UNPREPARE_DEVICES = "unprepare_devices"

PREPARE_CAUSES = (LOCK_ACQUIRE, API_ERROR, CLAIM_NOT_FOUND, INVALID_CLAIM, INVALID_CONFIG, DEVICE_UNHEALTHY,
                  DEVICE_BUSY, SHARING_SETUP, CDI_WRITE, MIG_CREATE, INTERNAL)
UNPREPARE_CAUSES = (UNPREPARE_DEVICES, INTERNAL)


def cause_of(err: BaseException, default: str = INTERNAL) -> str:
    """The word for an error: its own `cause` when it carries one of the set, else `default` (the
    caller knows which step failed: writing the spec, reading the claim)."""
    cause = getattr(err, "cause", None)
    return cause if isinstance(cause, str) and cause in PREPARE_CAUSES else default
