"""The CDI 1.1.0 spec format as records: its JSON names, its version table, its name rules.

Pure. Field order follows CDI's Go types (specs-go/config.go), so nvdp's JSON reads like NVIDIA's;
empty fields are left out as Go's `omitempty` leaves them out, except `containerEdits`, which Go
always writes (`{}` when empty). Unknown fields are refused when decoding, as CDI's loaders do.
"""

from __future__ import annotations

import re

import msgspec
from msgspec import Struct, field

from nvdp.cdi.errors import CdiError
from nvdp.cdi.names import VENDOR as VENDOR
from nvdp.cdi.names import kind_of as kind_of
from nvdp.cdi.names import qualified as qualified

CURRENT_VERSION = "1.1.0"
# Every version CDI v1.1.0 accepts in `cdiVersion` (specs-go/version.go); a loader refuses any other.
VALID_VERSIONS = ("0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")
HOOK_NAMES = frozenset(
    {"prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"}
)
DEVICE_TYPES = frozenset({"", "b", "c", "u", "p"})



class _Record(
    Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True, forbid_unknown_fields=True
):
    """The options every CDI record shares. msgspec passes them on to subclasses; `frozen` is repeated on
    each for mypy, `kw_only` where a required field follows optional ones (msgspec does not pass it on)."""


class DeviceNode(_Record, frozen=True):
    path: str
    host_path: str = ""
    type: str = ""
    major: int = 0
    minor: int = 0
    file_mode: int | None = None  # permission bits as a decimal integer: 438 is 0666
    permissions: str = ""
    uid: int | None = None
    gid: int | None = None


class Mount(_Record, frozen=True):
    host_path: str
    container_path: str
    options: tuple[str, ...] = ()
    type: str = ""


class Hook(_Record, frozen=True):
    hook_name: str
    path: str
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    timeout: int | None = None


class IntelRdt(_Record, frozen=True):
    clos_id: str = field(default="", name="closID")
    l3_cache_schema: str = ""
    mem_bw_schema: str = ""
    schemata: tuple[str, ...] | None = None
    enable_monitoring: bool = False


class NetDevice(_Record, frozen=True):
    host_interface_name: str
    name: str


class ContainerEdits(_Record, frozen=True):
    env: tuple[str, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    net_devices: tuple[NetDevice, ...] = ()
    hooks: tuple[Hook, ...] = ()
    mounts: tuple[Mount, ...] = ()
    intel_rdt: IntelRdt | None = None
    additional_gids: tuple[int, ...] = ()

    def is_empty(self) -> bool:
        return self == EMPTY_EDITS


EMPTY_EDITS = ContainerEdits()


class Device(_Record, frozen=True, kw_only=True):
    name: str
    annotations: dict[str, str] = field(default_factory=dict)
    container_edits: ContainerEdits  # no default: always written, as CDI's schema requires


class Spec(_Record, frozen=True, kw_only=True):
    cdi_version: str
    kind: str  # "<vendor>/<class>"
    annotations: dict[str, str] = field(default_factory=dict)
    devices: tuple[Device, ...]
    container_edits: ContainerEdits  # no default: Go writes `"containerEdits":{}` too

    @property
    def vendor(self) -> str:
        return self.kind.partition("/")[0]

    @property
    def cls(self) -> str:
        return self.kind.partition("/")[2]


# --- the minimum version (specs-go/version.go) ---------------------------------------------------------


def _all_edits(spec: Spec) -> list[ContainerEdits]:
    return [spec.container_edits, *(d.container_edits for d in spec.devices)]


def minimum_version(spec: Spec) -> str:
    """The lowest `cdiVersion` that can hold `spec`, by CDI's table; NVIDIA writes this, not the latest."""
    edits = _all_edits(spec)
    rdts = [e.intel_rdt for e in edits if e.intel_rdt is not None]
    if any(e.net_devices for e in edits) or any(r.schemata is not None or r.enable_monitoring for r in rdts):
        return "1.1.0"
    if rdts or any(e.additional_gids for e in edits):
        return "0.7.0"
    if spec.annotations or any(d.annotations for d in spec.devices) or "." in spec.cls:
        return "0.6.0"
    digit_name = any(d.name[:1].isdigit() for d in spec.devices)
    if digit_name or any(n.host_path for e in edits for n in e.device_nodes):
        return "0.5.0"
    if any(m.type for e in edits for m in e.mounts):
        return "0.4.0"
    return "0.3.0"


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


# --- names and validation (pkg/parser, pkg/cdi) ----------------------------------------------------------

_VENDOR_OR_CLASS = re.compile(r"[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?")
_DEVICE_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?")


def name_problem(kind: str, value: str) -> str | None:
    """Why `value` is not a valid CDI vendor, class or device name (`kind`), or None when it is."""
    pattern = _DEVICE_NAME if kind == "device" else _VENDOR_OR_CLASS
    if pattern.fullmatch(value) is not None:
        return None
    first = "a letter or digit" if kind == "device" else "a letter"
    allowed = "letters, digits, '-', '_', '.'" + (" and ':'" if kind == "device" else "")
    return (f"invalid CDI {kind} name {value!r}: it must start with {first}, end with a letter or digit, "
            f"and hold only {allowed}")


def _edits_problems(where: str, edits: ContainerEdits) -> list[str]:
    problems = [f"{where}: invalid environment variable {v!r} (expected NAME=value)"
                for v in edits.env if v.find("=") <= 0]
    for node in edits.device_nodes:
        if not node.path.startswith("/"):
            problems.append(f"{where}: device node path {node.path!r} is not absolute")
        if node.type not in DEVICE_TYPES:
            problems.append(f"{where}: device node {node.path}: invalid type {node.type!r}")
        if set(node.permissions) - set("rwm"):
            problems.append(f"{where}: device node {node.path}: invalid permissions {node.permissions!r}")
    for hook in edits.hooks:
        if hook.hook_name not in HOOK_NAMES:
            problems.append(f"{where}: invalid hook name {hook.hook_name!r}")
        if not hook.path:
            problems.append(f"{where}: hook {hook.hook_name} has an empty path")
        problems += [f"{where}: hook {hook.hook_name}: invalid environment variable {v!r}"
                     for v in hook.env if v.find("=") <= 0]
    for mount in edits.mounts:
        if not mount.host_path or not mount.container_path:
            problems.append(f"{where}: mount {mount.container_path or mount.host_path!r} lacks a path")
    return problems


def validate(spec: Spec) -> None:
    """Refuse a spec a CDI loader would refuse (CdiError listing every problem).

    Checks the version (valid, and at least the minimum the content needs), the vendor, class and
    device names, that there is a device, that no device name repeats, that no device has empty
    edits (CDI refuses those even when the common edits are not empty), and the edits themselves.
    """
    problems: list[str] = []
    if spec.cdi_version not in VALID_VERSIONS:
        problems.append(f"cdiVersion {spec.cdi_version!r} is not one of {', '.join(VALID_VERSIONS)}")
    else:
        needed = minimum_version(spec)
        if _version_key(needed) > _version_key(spec.cdi_version):
            problems.append(f"cdiVersion {spec.cdi_version} is below {needed}, which the content needs")
    vendor, sep, cls = spec.kind.partition("/")
    if not sep:
        problems.append(f"kind {spec.kind!r} is not '<vendor>/<class>'")
    problems += [p for p in (name_problem("vendor", vendor), name_problem("class", cls)) if p]
    if not spec.devices:
        problems.append("no devices: CDI refuses a spec without one")
    seen: set[str] = set()
    for device in spec.devices:
        problem = name_problem("device", device.name)
        if problem:
            problems.append(problem)
        if device.name in seen:
            problems.append(f"device {device.name!r} appears twice")
        seen.add(device.name)
        if device.container_edits.is_empty():
            problems.append(f"device {device.name!r} has empty edits: CDI refuses it")
        problems += _edits_problems(f"device {device.name!r}", device.container_edits)
    problems += _edits_problems("common edits", spec.container_edits)
    if problems:
        raise CdiError(f"invalid CDI spec {spec.kind}: " + "; ".join(problems))


# --- JSON ------------------------------------------------------------------------------------------------

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Spec)


def encode(spec: Spec) -> bytes:
    """Compact JSON, as NVIDIA writes `.json` specs (no trailing newline)."""
    return _encoder.encode(spec)


def decode(data: bytes, source: str = "<bytes>") -> Spec:
    """A spec from JSON; unknown fields and wrong types raise CdiError naming `source`."""
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError as err:
        raise CdiError(f"{source}: not a CDI spec nvdp can read: {err}") from None
