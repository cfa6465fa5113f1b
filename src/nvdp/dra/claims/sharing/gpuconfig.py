"""The sharing each device of a claim gets: NVIDIA's opaque `GpuConfig` and `MigDeviceConfig` parameters
(resource.nvidia.com/v1beta1), decoded strictly and resolved with NVIDIA's precedence.

Pure: the claim comes in as its API JSON, the node's devices as `DraDevice`s, the answer is one
`DeviceSharing` per allocated device of this driver, or a `SharingProblem` whose message names the
field (`spec.devices.config[1].opaque.parameters.sharing.strategy`) and the fix.

Precedence, as NVIDIA's kubelet plugin resolves it: the node's sharing (lowest), then the DeviceClasses'
configs (`FromClass`), then the claim's (`FromClaim`), later entries of one source above earlier ones.
Each allocation result gets the highest config that applies to it: one naming its request (a config
naming `main` names each subrequest `main/x` too), or one naming no request whose kind fits the device.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import msgspec
from msgspec import Struct

from nvdp.claim_results import allocation_results, result_field
from nvdp.dra.claims.sharing.quantity import QuantityError, quantity_value
from nvdp.dra.pool.devices import MIB, DraDevice

API_VERSION = "resource.nvidia.com/v1beta1"
GPU_CONFIG = "GpuConfig"
MIG_DEVICE_CONFIG = "MigDeviceConfig"
FROM_CLASS, FROM_CLAIM = "FromClass", "FromClaim"

Strategy = Literal["TimeSlicing", "MPS"]
Interval = Literal["Default", "Short", "Medium", "Long"]
STRATEGIES: tuple[Strategy, ...] = ("TimeSlicing", "MPS")
# `nvidia-smi compute-policy --set-timeslice <n>`
TIMESLICE_VALUES: dict[Interval, int] = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}


class MpsLimits(Struct, frozen=True):
    """What the MPS control daemon is told for one device."""

    active_thread_percentage: int | None = None  # 1..100; None: the daemon's default (100)
    pinned_memory_limit_mib: int | None = None  # this device's limit, whole MiB >= 1; None: no limit


class DeviceSharing(Struct, frozen=True):
    """The sharing one allocated device gets."""

    strategy: Strategy | None = None  # None: no sharing config applies
    interval: Interval | None = None  # TimeSlicing on a full GPU only
    mps: MpsLimits | None = None  # set iff strategy == "MPS"
    source: str = ""  # for messages: "claim config #1", "class config #0", "node config"


class SharingProblem(ValueError):
    """The claim's sharing config cannot be applied; the message names the field path and the fix."""


def summary(sharing: DeviceSharing) -> str:
    """One line for logs and messages: "MPS (25% threads, 4096 MiB pinned)", "no sharing"."""
    if sharing.strategy is None:
        text = "no sharing"
    elif sharing.strategy == "TimeSlicing":
        text = "TimeSlicing" + (f" (interval {sharing.interval})" if sharing.interval else "")
    else:
        limits = sharing.mps or MpsLimits()
        parts = []
        if limits.active_thread_percentage is not None:
            parts.append(f"{limits.active_thread_percentage}% threads")
        if limits.pinned_memory_limit_mib is not None:
            parts.append(f"{limits.pinned_memory_limit_mib} MiB pinned")
        text = "MPS" + (f" ({', '.join(parts)})" if parts else "")
    return f"{text} from {sharing.source}" if sharing.source else text


# --- the wire format ---------------------------------------------------------------------------------


class _Wire(Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    """Decoded strictly: a field NVIDIA's API does not have is an error, as with NVIDIA's strict decoder."""


class _TimeSlicingConfig(_Wire, frozen=True):
    interval: str | None = None  # checked by hand, to name the allowed values


class _MpsConfig(_Wire, frozen=True):
    default_active_thread_percentage: int | None = None
    # Quantities are checked by hand, to say what a quantity looks like and which key was wrong.
    default_pinned_device_memory_limit: Any = None
    default_per_device_pinned_memory_limit: dict[str, Any] | None = None


class _GpuSharing(_Wire, frozen=True):
    strategy: str
    time_slicing_config: _TimeSlicingConfig | None = None
    mps_config: _MpsConfig | None = None


class _MigDeviceSharing(_Wire, frozen=True):
    strategy: str
    mps_config: _MpsConfig | None = None


class _GpuConfig(_Wire, frozen=True):
    api_version: str
    kind: str
    sharing: _GpuSharing | None = None


class _MigDeviceConfig(_Wire, frozen=True):
    api_version: str
    kind: str
    sharing: _MigDeviceSharing | None = None


_KINDS: dict[str, type[_GpuConfig] | type[_MigDeviceConfig]] = {
    GPU_CONFIG: _GpuConfig,
    MIG_DEVICE_CONFIG: _MigDeviceConfig,
}
# The record at each path below `parameters`, to list its fields when an unknown one is met.
_SHAPES: dict[str, dict[str, type[_Wire]]] = {
    GPU_CONFIG: {"": _GpuConfig, ".sharing": _GpuSharing, ".sharing.timeSlicingConfig": _TimeSlicingConfig,
                 ".sharing.mpsConfig": _MpsConfig},
    MIG_DEVICE_CONFIG: {"": _MigDeviceConfig, ".sharing": _MigDeviceSharing,
                        ".sharing.mpsConfig": _MpsConfig},
}
_KIND_OF_DEVICE = {"gpu": GPU_CONFIG, "mig": MIG_DEVICE_CONFIG}
_HINTS = {
    "strategy": "set TimeSlicing or MPS",
    "interval": "set Default, Short, Medium or Long",
    "defaultActiveThreadPercentage": "set a whole number from 1 to 100",
    "requests": "list request names of this claim",
}
_TYPE_NAMES = {"object": "an object", "int": "a whole number", "str": "a string", "array": "a list",
               "bool": "true or false", "float": "a decimal number", "null": "null"}
_MSGSPEC_AT = re.compile(r"(?P<what>.*?)(?: - at `\$(?P<where>[^`]*)`)?", re.DOTALL)


# --- decoded configs and results -----------------------------------------------------------------------


class _Result(Struct, frozen=True):
    index: int  # among this driver's results, in the order the scheduler wrote them
    request: str  # as written: "gpus" or "gpus/large"
    device: DraDevice


class _Limit(Struct, frozen=True):
    amount: int  # bytes
    text: str  # as written, for messages
    path: str


class _Config(Struct, frozen=True):
    source: str  # "claim config #1"
    path: str  # the entry: "spec.devices.config[1]"
    kind: str
    requests: tuple[str, ...]
    strategy: Strategy | None = None
    interval: Interval | None = None
    percentage: int | None = None
    default_limit: _Limit | None = None
    per_device: dict[str, _Limit] = {}  # by device name

    def names(self, request: str) -> bool:
        """Whether the config names `request`; naming a main request names its subrequests."""
        return request in self.requests or request.split("/", 1)[0] in self.requests


class _Entry(Struct, frozen=True):
    source: str
    path: str
    body: Any


# --- the answer ------------------------------------------------------------------------------------


def device_sharing(claim: Mapping[str, Any], driver: str, devices: Mapping[str, DraDevice],
                   default: Callable[[DraDevice], DeviceSharing] | None = None) -> dict[str, DeviceSharing]:
    """The sharing of each device the claim was allocated from `driver`, keyed by device name.

    `devices` are this node's devices by name; `default(device)` is the node's sharing, used where no
    opaque config applies (None: no sharing). A device allocated to two results of the claim gets one
    entry, and both results must come to the same sharing. SharingProblem when a config of this driver
    is malformed (even one that applies to no result) or cannot be applied to its device.
    """
    results = _results(claim, driver, devices)
    configs = [c for c in (_decode(e, driver, results) for e in _entries(claim)) if c is not None]
    chosen: dict[str, tuple[str, DeviceSharing]] = {}
    for result in results:
        config = _winner(configs, result)
        if config is not None:
            sharing = _sharing(config, result.device)
        elif default is not None:
            sharing = default(result.device)
        else:
            sharing = DeviceSharing()
        name = result.device.name
        if name in chosen:
            request, first = chosen[name]
            if _settings(first) != _settings(sharing):
                raise SharingProblem(
                    f"device {name} is allocated to requests {request!r} and {result.request!r} of this "
                    f"claim, which configure its sharing differently ({summary(first)}; {summary(sharing)}); "
                    "one device has one sharing: give both requests the same config")
            continue
        chosen[name] = (result.request, sharing)
    return {name: sharing for name, (_, sharing) in chosen.items()}


def _settings(sharing: DeviceSharing) -> tuple[object, ...]:
    return (sharing.strategy, sharing.interval, sharing.mps)


def _winner(configs: Sequence[_Config], result: _Result) -> _Config | None:
    """The highest config that applies to the result (NVIDIA: the first, walking down from the top)."""
    fits = _KIND_OF_DEVICE.get(result.device.kind)
    for config in reversed(configs):
        if config.requests:
            if not config.names(result.request):
                continue
            if config.kind != fits:
                what = "a MIG device" if result.device.kind == "mig" else "a full GPU"
                raise SharingProblem(
                    f"{config.path}.opaque.parameters.kind: {config.kind} names request "
                    f"{result.request!r}, which was allocated {what} "
                    f"({result.device.name}); use kind {fits} for it, or name only requests for "
                    f"{'full GPUs' if config.kind == GPU_CONFIG else 'MIG devices'}")
            return config
        if config.kind == fits:
            return config
    return None


def _sharing(config: _Config, device: DraDevice) -> DeviceSharing:
    """The config applied to one device: its limits, checked against the device."""
    if config.strategy is None:
        return DeviceSharing(source=config.source)
    if config.strategy == "TimeSlicing":
        return DeviceSharing(strategy="TimeSlicing", interval=config.interval, source=config.source)
    if device.kind == "mig":
        raise SharingProblem(
            f"{config.path}.opaque.parameters.sharing.strategy: MPS is not supported on MIG devices "
            f"(device {device.name}): share MIG devices with TimeSlicing, or use full GPUs")
    limit = config.per_device.get(device.name, config.default_limit)
    memory = _memory(device)
    if limit is not None and memory is not None and limit.amount > memory:
        raise SharingProblem(
            f"{limit.path}: {limit.text} is more than the memory of device {device.name} "
            f"({memory // MIB} MiB); set a limit of at most {memory // MIB}Mi")
    mps = MpsLimits(active_thread_percentage=config.percentage,
                    pinned_memory_limit_mib=limit.amount // MIB if limit is not None else None)
    return DeviceSharing(strategy="MPS", mps=mps, source=config.source)


def _memory(device: DraDevice) -> int | None:
    text = (device.capacity.get("memory") or {}).get("value")
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


# --- reading the claim -------------------------------------------------------------------------------


def _results(claim: Mapping[str, Any], driver: str, devices: Mapping[str, DraDevice]) -> list[_Result]:
    found: list[_Result] = []
    for i, result in allocation_results(claim):
        if result.get("driver") != driver:
            continue
        name = result.get("device")
        device = devices.get(name) if isinstance(name, str) else None
        if device is None:
            raise SharingProblem(f"{result_field(i, 'device')}: {name!r} is not a device of this node; the "
                                 "claim must be allocated again from this node's slice")
        found.append(_Result(index=len(found), request=str(result.get("request", "")), device=device))
    return found


def _entries(claim: Mapping[str, Any]) -> list[_Entry]:
    """The config entries, lowest precedence first: the classes', then the claim's.

    The allocation's copy is authoritative, since only it holds the classes' configs; a claim without
    one (not allocated by a scheduler) has its own configs only.
    """
    spec = _list(_object(_object(claim.get("spec"), "spec").get("devices"), "spec.devices").get("config"),
                 "spec.devices.config")
    allocated = _object((claim.get("status") or {}).get("allocation"), "status.allocation")
    copied = _object(allocated.get("devices"), "status.allocation.devices").get("config")
    if copied is None:
        return [_Entry(f"claim config #{i}", f"spec.devices.config[{i}]", e) for i, e in enumerate(spec)]
    classes: list[_Entry] = []
    claims: list[tuple[int, Any]] = []
    for i, raw in enumerate(_list(copied, "status.allocation.devices.config")):
        where = f"status.allocation.devices.config[{i}]"
        source = _object(raw, where).get("source")
        if source == FROM_CLASS:
            classes.append(_Entry(f"class config #{i}", f"class config ({where})", raw))
        elif source == FROM_CLAIM:
            claims.append((i, raw))
        else:
            raise SharingProblem(f"{where}.source: {source!r} is not a config source this driver knows "
                                 f"({FROM_CLASS}, {FROM_CLAIM}); upgrade nvdp to one that knows it")
    # The scheduler copies every claim config, in order; name the one the user wrote where it lines up.
    in_spec = len(claims) == len(spec)
    ordered = classes
    for k, (i, raw) in enumerate(claims):
        copy = f"claim config (status.allocation.devices.config[{i}])"
        ordered.append(_Entry(f"claim config #{k}", f"spec.devices.config[{k}]" if in_spec else copy, raw))
    return ordered


def _object(value: Any, path: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SharingProblem(f"{path}: expected an object, got {_json_type(value)}")
    return value


def _list(value: Any, path: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise SharingProblem(f"{path}: expected a list, got {_json_type(value)}")
    return value


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, int):
        return "a whole number"
    if isinstance(value, float):
        return "a decimal number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object" if isinstance(value, Mapping) else type(value).__name__


# --- decoding one entry ------------------------------------------------------------------------------


def _decode(entry: _Entry, driver: str, results: Sequence[_Result]) -> _Config | None:
    """The entry as a config of this driver; None when it is another driver's (or not opaque)."""
    body = _object(entry.body, entry.path)
    if body.get("opaque") is None:  # a config type other than opaque: never addressed to this driver
        return None
    opaque = _object(body["opaque"], f"{entry.path}.opaque")
    if opaque.get("driver") != driver:
        return None  # a request can be served by several drivers: each skips the others' configs
    requests = _list(body.get("requests"), f"{entry.path}.requests")
    for i, request in enumerate(requests):
        if not isinstance(request, str):
            raise SharingProblem(f"{entry.path}.requests[{i}]: expected a string (a request name), got "
                                 f"{_json_type(request)}")
    path = f"{entry.path}.opaque.parameters"
    params = opaque.get("parameters")
    if not isinstance(params, Mapping):
        raise SharingProblem(f"{path}: expected an object ({GPU_CONFIG} or {MIG_DEVICE_CONFIG}), got "
                             f"{_json_type(params)}; write apiVersion: {API_VERSION}, kind and sharing")
    api_version, kind = params.get("apiVersion"), params.get("kind")
    if api_version != API_VERSION:
        found = "missing" if api_version is None else f"{api_version!r} is not supported"
        raise SharingProblem(f"{path}.apiVersion: {found}; set apiVersion: {API_VERSION}")
    if kind not in _KINDS:
        found = "missing" if kind is None else f"unknown kind {kind!r}"
        raise SharingProblem(f"{path}.kind: {found}; use {GPU_CONFIG} for full GPUs or {MIG_DEVICE_CONFIG} "
                             "for MIG devices")
    try:
        wire = msgspec.convert(params, _KINDS[kind], strict=True)
    except msgspec.ValidationError as err:
        raise SharingProblem(_explain(str(err), path, kind)) from None
    config = _Config(source=entry.source, path=entry.path, kind=kind, requests=tuple(requests))
    if wire.sharing is None:
        return config
    return _with_sharing(config, wire.sharing, f"{path}.sharing", results)


def _with_sharing(config: _Config, sharing: _GpuSharing | _MigDeviceSharing, path: str,
                  results: Sequence[_Result]) -> _Config:
    strategy = sharing.strategy
    slicing = sharing.time_slicing_config if isinstance(sharing, _GpuSharing) else None
    if strategy == "TimeSlicing":
        if sharing.mps_config is not None:
            raise SharingProblem(f"{path}.mpsConfig: goes with strategy MPS, not TimeSlicing; remove it or "
                                 "set strategy: MPS")
        if config.kind == MIG_DEVICE_CONFIG:  # a MIG device's time slice cannot be set
            return msgspec.structs.replace(config, strategy="TimeSlicing")
        given = slicing.interval if slicing is not None else None
        interval = _interval(given, f"{path}.timeSlicingConfig.interval")
        return msgspec.structs.replace(config, strategy="TimeSlicing", interval=interval)
    if strategy == "MPS":
        if slicing is not None:
            raise SharingProblem(f"{path}.timeSlicingConfig: goes with strategy TimeSlicing, not MPS; "
                                 "remove it or set strategy: TimeSlicing")
        return _with_mps(config, sharing.mps_config or _MpsConfig(), f"{path}.mpsConfig", results)
    raise SharingProblem(f"{path}.strategy: unknown sharing strategy {strategy!r}; use TimeSlicing or MPS")


def _interval(given: str | None, path: str) -> Interval:
    if given is None:
        return "Default"  # NVIDIA's default for a TimeSlicing GpuConfig
    for interval in TIMESLICE_VALUES:
        if given == interval:
            return interval
    raise SharingProblem(f"{path}: unknown time-slice interval {given!r}; use Default, Short, Medium or Long")


def _with_mps(config: _Config, mps: _MpsConfig, path: str, results: Sequence[_Result]) -> _Config:
    percentage = mps.default_active_thread_percentage
    if percentage is not None and not 1 <= percentage <= 100:
        raise SharingProblem(f"{path}.defaultActiveThreadPercentage: {percentage} is out of range; set 1 to "
                             "100 (the percent of a GPU's threads each client may use)")
    default_limit = None
    if mps.default_pinned_device_memory_limit is not None:
        default_limit = _limit(mps.default_pinned_device_memory_limit,
                               f"{path}.defaultPinnedDeviceMemoryLimit")
    per_device: dict[str, _Limit] = {}
    for key, value in (mps.default_per_device_pinned_memory_limit or {}).items():
        key_path = f"{path}.defaultPerDevicePinnedMemoryLimit[{key!r}]"
        device = _device_of_key(key, results)
        if device is None:
            uuids = ", ".join(dict.fromkeys(r.device.uuid for r in results)) or "none"
            raise SharingProblem(
                f"{key_path}: names no device of this claim; key a limit by the UUID of one of the claim's "
                f"devices ({uuids}) or by the index of its allocation result (0 to {len(results) - 1})")
        limit = _limit(value, key_path)
        other = per_device.get(device)
        if other is not None and other.amount != limit.amount:
            raise SharingProblem(f"{key_path}: device {device} has a limit under another key already "
                                 f"({other.path}: {other.text}); give each device one limit")
        per_device[device] = limit
    return msgspec.structs.replace(config, strategy="MPS", percentage=percentage, default_limit=default_limit,
                                   per_device=per_device)


def _device_of_key(key: str, results: Sequence[_Result]) -> str | None:
    """The device a per-device key names: a UUID of the claim's devices, or an index into this driver's
    results in the order the scheduler wrote them (a stable order the user can see in the claim's status)."""
    for result in results:
        if result.device.uuid == key:
            return result.device.name
    if key.isascii() and key.isdigit() and len(key) <= 6 and int(key) < len(results):
        return results[int(key)].device.name
    return None


def _limit(value: Any, path: str) -> _Limit:
    try:
        amount = quantity_value(value)
    except QuantityError as err:
        raise SharingProblem(f"{path}: {err}") from None
    if amount < MIB:
        raise SharingProblem(f"{path}: {value!r} is less than 1 MiB (MPS limits pinned memory in whole MiB); "
                             "set 1Mi or more")
    return _Limit(amount=amount, text=str(value), path=path)


def _explain(error: str, path: str, kind: str) -> str:
    """msgspec's error as the field path and the fix."""
    m = _MSGSPEC_AT.fullmatch(error)
    what, where = (m["what"], m["where"] or "") if m else (error, "")
    if unknown := re.fullmatch(r"Object contains unknown field `(.+)`", what):
        field = unknown[1]
        if kind == MIG_DEVICE_CONFIG and where == ".sharing" and field == "timeSlicingConfig":
            return (f"{path}.sharing.timeSlicingConfig: a {MIG_DEVICE_CONFIG} has no timeSlicingConfig (the "
                    "time slice of a MIG device cannot be set); remove it")
        shape = _SHAPES[kind].get(where)
        known = f" (the fields here: {', '.join(shape.__struct_encode_fields__)})" if shape else ""
        return f"{path}{where}.{field}: unknown field; remove it{known}"
    if missing := re.fullmatch(r"Object missing required field `(.+)`", what):
        field = missing[1]
        return f"{path}{where}.{field}: missing; {_HINTS.get(field, 'set it')}"
    if expected := re.fullmatch(r"Expected `(.+)`, got `(.+)`", what):
        wanted = " or ".join(_TYPE_NAMES.get(t, t) for t in expected[1].split(" | ") if t != "null")
        leaf = where.rsplit(".", 1)[-1]
        hint = _HINTS.get(leaf, "fix the value")
        return f"{path}{where}: expected {wanted}, got {_TYPE_NAMES.get(expected[2], expected[2])}; {hint}"
    return f"{path}{where}: {what}"
