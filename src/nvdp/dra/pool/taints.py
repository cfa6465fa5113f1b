"""A down GPU's device taints (KEP-5055) and health messages (KEP-4680), from the health record.

Health record (`nvdp.health.ledger.Ledger.record()`, or the health.json written from it) + the pool's
devices -> per device: healthy or not, since when, a message saying what happened and what brings the
device back, and the taints it carries in the ResourceSlice. The DRA plugin publishes these taints and
streams these messages to the kubelet; `nvdp dra slices --health-record` and `nvdp doctor` show them,
all through `device_health`.

Taint keys are NVIDIA's where NVIDIA's DRA driver (v0.4, `NVMLDeviceHealthCheck`) has one, with its
effects: `gpu.nvidia.com/xid=<xid>` (NoSchedule for a critical XID, None for one in the skip list),
`gpu.nvidia.com/gpu-lost` (NoSchedule), `gpu.nvidia.com/unmonitored` (None). Where NVIDIA has none,
nvdp's recovery state: `gpu.nvidia.com/recovery=<state>` (needs-reset, recovering, flapping,
recovery-off). Unlike NVIDIA's, the taints go when the record brings the GPU back. A down GPU's
taints take the config's `healthTaintEffect` (NoSchedule, or NoExecute to evict the pods using it).
A MIG device or a shared device (time-slicing, MPS) carries its GPU's health: the fault of its GPU,
or its own when only it went down.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from msgspec import Struct

from nvdp.dra.pool.devices import DraDevice
from nvdp.health.xids import describe

if TYPE_CHECKING:
    from nvdp.config.model import Config

XID_KEY = "gpu.nvidia.com/xid"
GPU_LOST_KEY = "gpu.nvidia.com/gpu-lost"
UNMONITORED_KEY = "gpu.nvidia.com/unmonitored"
RECOVERY_KEY = "gpu.nvidia.com/recovery"  # nvdp's: NVIDIA's driver has no recovery

Effect = Literal["None", "NoSchedule", "NoExecute"]
EFFECTS: tuple[Effect, ...] = ("None", "NoSchedule", "NoExecute")
DOWN_EFFECTS = ("NoSchedule", "NoExecute")  # what healthTaintEffect may be
DEFAULT_DOWN_EFFECT = "NoSchedule"
MAX_TAINTS = 16  # resource.k8s.io/v1 DeviceTaintsMaxLength
MAX_MESSAGE = 1024  # DeviceHealth.message
HEALTHY_MESSAGE = "healthy"

# A qualified name (key) and a label value, as the API server checks them.
_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class TaintError(ValueError):
    """A taint the API server would refuse: the message names the field and the limit."""


class Taint(Struct, frozen=True):
    key: str
    effect: str
    value: str = ""
    time_added: float | None = None  # unix seconds; None: the API server sets it

    def api(self) -> dict[str, Any]:
        """The taint as resource.k8s.io/v1 DeviceTaint JSON."""
        out: dict[str, Any] = {"key": self.key}
        if self.value:
            out["value"] = self.value
        out["effect"] = self.effect
        if self.time_added is not None:
            out["timeAdded"] = rfc3339(self.time_added)
        return out


class Toleration(Struct, frozen=True):
    """A claim request's toleration of device taints, as the scheduler copies it into the allocation
    result (resource.k8s.io/v1 DeviceToleration, tolerationSeconds aside)."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


def tolerated(tolerations: Sequence[Toleration], taints: Sequence[Taint]) -> bool:
    """Whether every taint that keeps claims off a device (any effect but None) is tolerated."""
    return all(any(t.tolerates(taint) for t in tolerations) for taint in taints if taint.effect != "None")


def tolerations_of(result: Mapping[str, Any]) -> tuple[Toleration, ...]:
    """The tolerations of an allocation result (ResourceClaim status.allocation.devices.results[])."""
    return tuple(Toleration(key=str(t.get("key") or ""), operator=str(t.get("operator") or "Equal"),
                            value=str(t.get("value") or ""), effect=str(t.get("effect") or ""))
                 for t in result.get("tolerations") or () if isinstance(t, Mapping))


class DeviceHealth(Struct, frozen=True):
    """One published device's health: what the kubelet shows in the pod and the slice carries."""

    device: str  # the device's name in the pool
    gpu: str  # its GPU's UUID
    healthy: bool
    message: str
    since: float | None = None  # when it went down (None while healthy)
    taints: tuple[Taint, ...] = ()


def rfc3339(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(seconds)))


def check_taint(taint: Taint, where: str) -> None:
    """Refuse a taint the API server would refuse, naming `where` (the field) and the limit."""
    prefix, _, name = taint.key.rpartition("/")
    if not name or len(name) > 63 or not _NAME.match(name):
        raise TaintError(f"{where}.key: {taint.key!r} is not a qualified name (a name of at most 63 "
                         "characters: letters, digits, '-', '_', '.', starting and ending alphanumeric)")
    if prefix and (len(prefix) > 253 or not _SUBDOMAIN.match(prefix)):
        raise TaintError(f"{where}.key: the prefix of {taint.key!r} is not a DNS subdomain of at most 253 "
                         "characters")
    if len(taint.value) > 63 or (taint.value and not _NAME.match(taint.value)):
        raise TaintError(f"{where}.value: {taint.value!r} is not a label value (at most 63 characters: "
                         "letters, digits, '-', '_', '.', starting and ending alphanumeric)")
    if taint.effect not in EFFECTS:
        raise TaintError(f"{where}.effect: {taint.effect!r} is not one of {', '.join(EFFECTS)}")


def check_down_effect(effect: str, where: str = "flags.plugin.healthTaintEffect") -> str:
    """The effect of a down GPU's taints as configured; refused with the field named when unknown."""
    if effect not in DOWN_EFFECTS:
        raise TaintError(f"{where}: {effect!r} is not a taint effect for a down GPU; use NoSchedule (the "
                         "scheduler keeps new claims off it) or NoExecute (pods using it are evicted too)")
    return effect


def device_health(
    devices: Sequence[DraDevice],
    record: Mapping[str, Any] | None,
    *,
    quiet_s: float | None,
    down_effect: str = DEFAULT_DOWN_EFFECT,
    informational: Mapping[str, tuple[int, float]] | None = None,
    unmonitored: Iterable[str] = (),
) -> dict[str, DeviceHealth]:
    """Each device's health, by device name in `devices`' order.

    `record`: the health record (its `gpus`: the GPUs that are down); `quiet_s`: the config's quiet
    period (healthRecoveryAfter in seconds, None for never); `informational`: the latest XID in the
    skip list per GPU UUID, with its time; `unmonitored`: the GPUs whose health NVML cannot watch."""
    check_down_effect(down_effect)
    faults = {gpu: dict(entry) for gpu, entry in dict((record or {}).get("gpus") or {}).items()
              if isinstance(entry, Mapping)}
    downs = dict((record or {}).get("downs") or {})
    info = dict(informational or {})
    off = frozenset(unmonitored)
    out: dict[str, DeviceHealth] = {}
    for device in devices:
        fault = faults.get(device.gpu_uuid)
        if fault is not None and _covers(fault, device):
            out[device.name] = _down(device, fault, len(downs.get(device.gpu_uuid) or ()), quiet_s,
                                     down_effect)
        else:
            out[device.name] = _up(device, info.get(device.gpu_uuid), device.gpu_uuid in off)
    return out


def device_health_for(config: Config, devices: Sequence[DraDevice], record: Mapping[str, Any] | None, *,
                      informational: Mapping[str, tuple[int, float]] | None = None,
                      unmonitored: Iterable[str] = ()) -> dict[str, DeviceHealth]:
    """`device_health` under `config`'s health settings (healthRecoveryAfter, healthTaintEffect): what
    the DRA plugin publishes and streams, and what `nvdp dra slices --health-record` shows."""
    from nvdp.health.settings import settings_from_config

    return device_health(devices, record, quiet_s=settings_from_config(config).after,
                         down_effect=config.flags.plugin.health_taint_effect, informational=informational,
                         unmonitored=unmonitored)


class InformationalXids:
    """The latest XID in the skip list per GPU, kept for the quiet period (healthRecoveryAfter, or 5
    minutes with recovery off): its `None` taint says it happened without keeping anything off the GPU.
    Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[int, float]] = {}

    def seen(self, gpu: str, xid: int, now: float) -> None:
        with self._lock:
            self._seen[gpu] = (xid, now)

    def current(self, now: float, quiet_s: float | None) -> dict[str, tuple[int, float]]:
        """The ones within the quiet period at `now` (older ones are forgotten)."""
        keep = 300.0 if quiet_s is None else quiet_s
        with self._lock:
            self._seen = {gpu: seen for gpu, seen in self._seen.items() if now - seen[1] < keep}
            return dict(self._seen)

    def next_expiry(self, quiet_s: float | None) -> float | None:
        """When the next one is forgotten (its taint must then be published away); None: none held."""
        keep = 300.0 if quiet_s is None else quiet_s
        with self._lock:
            return min((at + keep for _, at in self._seen.values()), default=None)


def slice_taints(health: Mapping[str, DeviceHealth]) -> dict[str, tuple[dict[str, Any], ...]]:
    """The taints each device carries in the ResourceSlice, as API JSON (devices without any left out)."""
    return {name: tuple(t.api() for t in h.taints) for name, h in health.items() if h.taints}


def what_brings_back(taints: Sequence[Mapping[str, Any]]) -> str:
    """What a published device's taints say: what happened and what brings the device back (for the
    doctor, which reads the slices, not the record)."""
    by_key = {str(t.get("key")): str(t.get("value") or "") for t in taints}
    effects = {str(t.get("effect")) for t in taints}
    said: list[str] = []
    if GPU_LOST_KEY in by_key:
        said.append("the GPU is lost (fallen off the bus)")
    if XID_KEY in by_key and by_key[XID_KEY].isdigit():
        xid = describe(int(by_key[XID_KEY]))
        said.append(f"{xid}, informational (in the skip list): nothing to do" if effects == {"None"} else xid)
    state = by_key.get(RECOVERY_KEY)
    if state == "needs-reset":
        said.append("needs a GPU reset (nvidia-smi -r) or a node reboot, then comes back once NVML shows it")
    elif state == "recovering":
        said.append("comes back by itself after the quiet period (healthRecoveryAfter) once NVML finds it "
                    "fine")
    elif state == "flapping":
        said.append("flapping: stays down until `nvdp health clear <GPU UUID>` in the DRA plugin's pod")
    elif state == "recovery-off":
        said.append("recovery is off: stays down until the DRA plugin restarts or `nvdp health clear`")
    if UNMONITORED_KEY in by_key:
        said.append("NVML cannot watch its health")
    others = sorted(k for k in by_key if k not in (GPU_LOST_KEY, XID_KEY, RECOVERY_KEY, UNMONITORED_KEY))
    if others:
        said.append(f"tainted by someone else ({', '.join(others)})")
    return "; ".join(said) or "tainted"


def is_down(taints: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the taints keep new claims off the device (any effect but None)."""
    return any(str(t.get("effect")) in DOWN_EFFECTS for t in taints)


def _covers(fault: Mapping[str, Any], device: DraDevice) -> bool:
    down = set(fault.get("devices") or ())
    return device.uuid in down or device.gpu_uuid in down


def _down(device: DraDevice, fault: Mapping[str, Any], down_count: int, quiet_s: float | None,
          effect: str) -> DeviceHealth:
    gpu = device.gpu_uuid
    since = float(fault.get("since") or 0.0)
    last = float(fault.get("last_fault") or since)
    xids = [int(x) for x in fault.get("xids") or ()]
    reason = str(fault.get("reason") or "unknown fault")
    blocked = str(fault.get("blocked") or "")
    state = str(fault.get("state") or "needs-reset")
    lost = reason.startswith("GPU is lost") or "the GPU is lost" in blocked
    cause = describe(xids[-1]) if xids else reason
    taints: list[Taint] = []
    if lost:
        taints.append(Taint(GPU_LOST_KEY, effect, time_added=since))
    if xids:
        taints.append(Taint(XID_KEY, effect, str(xids[-1]), time_added=last))
    taints.append(Taint(RECOVERY_KEY, effect, state, time_added=since))
    outlook = _outlook(state, gpu, last, quiet_s, down_count)
    found = f"; NVML finds {blocked}" if blocked else ""
    message = f"{cause}{found}: {outlook}"
    if device.kind == "mig" or device.shared:
        message = f"{message} (GPU {gpu})"
    return DeviceHealth(device.name, gpu, False, _fit(message), since, tuple(taints))


def _outlook(state: str, gpu: str, last: float, quiet_s: float | None, down_count: int) -> str:
    clear = f"`nvdp health clear {gpu}` in the DRA plugin's pod"
    if state == "flapping":
        return (f"went down {down_count} times within an hour (flapping) and stays down: find the cause, "
                f"then {clear}")
    if state == "recovery-off" or quiet_s is None:
        return ("health recovery is off (healthRecoveryAfter: never): stays down until the DRA plugin "
                f"restarts or {clear}")
    if state == "needs-reset":
        return (f"needs a GPU reset (nvidia-smi -r -i {gpu}, with no process on it) or a node reboot, then "
                f"comes back once NVML shows the reset; or {clear}")
    at = time.strftime("%H:%M:%S UTC", time.gmtime(int(last + quiet_s)))
    return f"comes back by itself at {at} once NVML finds it fine (each new critical XID restarts the wait)"


def _up(device: DraDevice, informational: tuple[int, float] | None, unmonitored: bool) -> DeviceHealth:
    taints: list[Taint] = []
    notes: list[str] = []
    if informational is not None:
        xid, at = informational
        taints.append(Taint(XID_KEY, "None", str(xid), time_added=at))
        notes.append(f"{describe(xid)} at {rfc3339(at)} is informational (in the skip list); nothing to do")
    if unmonitored:
        taints.append(Taint(UNMONITORED_KEY, "None"))
        notes.append("NVML cannot watch this GPU's health (no XID events): faults go unnoticed")
    message = HEALTHY_MESSAGE if not notes else f"{HEALTHY_MESSAGE}; {'; '.join(notes)}"
    return DeviceHealth(device.name, device.gpu_uuid, True, _fit(message), None, tuple(taints))


def _fit(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."
