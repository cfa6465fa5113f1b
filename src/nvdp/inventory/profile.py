"""Node profiles: a YAML (or JSON) description of a node's GPUs, read into an Inventory.

The same files drive the stand-in NVML library used in tests, so `nvdp plan --node PROFILE` previews
exactly what the plugin would see on such a node. The format is documented in sim/profiles/README.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any
from uuid import UUID

import yaml
from msgspec.structs import replace

from nvdp.inventory.facts import (
    ADDRESSING_MODES,
    ARCHITECTURES,
    BRANDS,
    MEMORY_SLICES,
    architecture_from_cc,
    default_brand,
    default_gi_profile_id,
    mig_memory_slices,
    pack_placements,
)
from nvdp.inventory.model import (
    TOPOLOGY_LEVELS,
    Fabric,
    Gpu,
    Inventory,
    Link,
    MigAttributes,
    MigDevice,
    MigProfile,
)

MIB = 1024 * 1024
MAX_MIG_DEVICES = 7
MAX_NVLINKS_PER_GPU = 36
LEVEL_BY_NAME = {name: value for value, name in TOPOLOGY_LEVELS.items()}
COMPUTE_MODES = ("DEFAULT", "PROHIBITED", "EXCLUSIVE_PROCESS")

# mig_profile_sets: named lists of GPU-instance profiles that GPUs refer to with YAML anchors; read
# only through the GPUs' mig_profiles.
_TOP_FIELDS = {
    "description", "driver_version", "cuda_driver_version", "gpus", "nvlinks", "nvswitch", "pcie",
    "mig_profile_sets",
}  # fmt: skip
_GPU_FIELDS = {
    "index", "uuid", "name", "memory_mib", "compute_capability", "minor", "pci_bus_id", "numa_node",
    "mig_capable", "mig_enabled", "mig_pending", "mig_devices", "compute_mode", "xid_events", "fabric",
    "brand", "architecture", "pcie_root", "addressing_mode", "mig_profiles",
}  # fmt: skip
_MIG_PROFILE_FIELDS = {
    "name", "profile_index", "gi_profile_id", "slices", "instances", "memory_mib", "multiprocessors",
    "copy_engines", "decoders", "encoders", "jpeg_engines", "ofa_engines", "placements",
}  # fmt: skip
# Profile indices the driver knows are 0 .. this - 1: driver 580 answers INVALID_ARGUMENT from index 17
# on (docs/mig-nvml-h100.md), the stand-in NVML too.
GPU_INSTANCE_PROFILE_COUNT = 17
MAX_COMPUTE_SLICES = 7
_FABRIC_FIELDS = {"cluster_uuid", "clique_id", "state"}
_FABRIC_STATES = ("not_started", "in_progress", "completed")
_MIG_FIELDS = {
    "uuid", "profile", "gi_id", "ci_id", "memory_mib", "gi_profile_id", "placement_start", "placement_size",
}  # fmt: skip
_PCIE_ROOT = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
_VERSION = re.compile(r"^\d+\.\d+$")
# Suffixes as NVML names them: "+me" (A100/H100), Blackwell's "-me", "+me.all" and "+gfx".
_MIG_PROFILE = re.compile(r"^(\d+c\.)?\d+g\.\d+gb([+-][a-z0-9]+(\.[a-z0-9]+)*)*$")
_BUS_ID = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]$")


class ProfileError(ValueError):
    """A node profile that cannot be used; the message names the field and what is expected."""


# Profiles shipped in a source checkout, so `--node t4` works without a path.
CHECKOUT_PROFILES = Path(__file__).resolve().parents[3] / "sim" / "profiles"


def resolve_profile(node: str) -> Path:
    """A path as given if it exists; else a profile name looked up in ./sim/profiles, then in the
    checkout's sim/profiles."""
    given = Path(node)
    if given.exists() or given.suffix or len(given.parts) > 1:
        return given
    for folder in (Path.cwd() / "sim" / "profiles", CHECKOUT_PROFILES):
        for suffix in (".yaml", ".yml", ".json"):
            candidate = folder / f"{node}{suffix}"
            if candidate.is_file():
                return candidate
    return given


def load_profile(path: str | Path) -> Inventory:
    """Read a node profile file (YAML, or JSON for a .json path) into an Inventory."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ProfileError(f"node profile {p}: cannot read it: {e.strerror or e}") from None
    try:
        doc = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise ProfileError(
            f"node profile {p}: not valid "
            f"{'JSON' if p.suffix == '.json' else 'YAML'}: {e}"
        ) from None
    try:
        return inventory_from_profile(doc)
    except ProfileError as e:
        raise ProfileError(f"node profile {p}: {e}") from None


def inventory_from_profile(doc: Mapping[str, Any]) -> Inventory:
    """Validate a parsed profile document and build the Inventory it describes."""
    if not isinstance(doc, Mapping):
        raise ProfileError(f"the top level must be a mapping of fields, got {_kind(doc)}")
    _no_unknown(doc, _TOP_FIELDS, "")
    driver = _str(doc, "driver_version", "")
    cuda = _str(doc, "cuda_driver_version", "")
    if not _VERSION.match(cuda):
        raise ProfileError(f'cuda_driver_version: expected "major.minor" like "12.4", got {cuda!r}')
    raw_gpus = doc.get("gpus")
    if not isinstance(raw_gpus, list):
        raise ProfileError(f"gpus: expected a list of GPUs, got {_kind(raw_gpus)}")
    sets = doc.get("mig_profile_sets", {})
    if not isinstance(sets, Mapping):
        raise ProfileError(
            "mig_profile_sets: expected a mapping of names to lists of MIG profiles (referred to "
            f"with YAML anchors), got {_kind(sets)}"
        )
    gpus = tuple(_gpu(g, i) for i, g in enumerate(raw_gpus))
    _unique_uuids(gpus)
    links = _links(doc, len(gpus))
    return Inventory(driver_version=driver, cuda_driver_version=cuda, gpus=gpus, links=links)


def _gpu(raw: object, i: int) -> Gpu:
    where = f"gpus[{i}]"
    if not isinstance(raw, Mapping):
        raise ProfileError(f"{where}: expected a mapping of GPU fields, got {_kind(raw)}")
    _no_unknown(raw, _GPU_FIELDS, where)
    index = _int(raw, "index", where)
    if index != i:
        raise ProfileError(
            f"{where}.index: is {index}, but GPUs must "
            f"be listed in index order (expected {i})"
        )
    uuid = _str(raw, "uuid", where)
    if not uuid.startswith("GPU-"):
        raise ProfileError(f"{where}.uuid: a GPU UUID starts with 'GPU-', got {uuid!r}")
    cc = _str(raw, "compute_capability", where)
    if not _VERSION.match(cc):
        raise ProfileError(f'{where}.compute_capability: expected "major.minor" like "7.5", got {cc!r}')
    bus_id = _str(raw, "pci_bus_id", where)
    if not _BUS_ID.match(bus_id):
        raise ProfileError(
            f"{where}.pci_bus_id: expected a PCI address "
            f"like '00000000:3B:00.0', got {bus_id!r}"
        )
    numa = raw.get("numa_node")
    if numa is not None and (not isinstance(numa, int) or isinstance(numa, bool) or numa < 0):
        raise ProfileError(f"{where}.numa_node: expected a non-negative integer or null, got {numa!r}")
    mig_capable = _bool(raw, "mig_capable", where)
    mig_enabled = _bool(raw, "mig_enabled", where)
    _bool(raw, "mig_pending", where)
    _bool(raw, "xid_events", where, default=True)
    mode = raw.get("compute_mode", "DEFAULT")
    if mode not in COMPUTE_MODES:
        raise ProfileError(f"{where}.compute_mode: expected one of {', '.join(COMPUTE_MODES)}, got {mode!r}")
    if mig_enabled and not mig_capable:
        raise ProfileError(f"{where}.mig_enabled: true needs mig_capable: true (this GPU cannot run MIG)")
    raw_migs = raw.get("mig_devices", [])
    if not isinstance(raw_migs, list):
        raise ProfileError(f"{where}.mig_devices: expected a list, got {_kind(raw_migs)}")
    if raw_migs and not mig_enabled:
        raise ProfileError(f"{where}.mig_devices: listed, but mig_enabled is not true")
    if len(raw_migs) > MAX_MIG_DEVICES:
        raise ProfileError(f"{where}.mig_devices: at most {MAX_MIG_DEVICES} per GPU, got {len(raw_migs)}")
    major, minor = (int(x) for x in cc.split("."))
    name = _str(raw, "name", where)
    memory_mib = _positive(raw, "memory_mib", where)
    migs = tuple(
        _mig(m, j, index, uuid, f"{where}.mig_devices[{j}]") for j, m in enumerate(raw_migs)
    )
    return Gpu(
        index=index,
        uuid=uuid,
        name=name,
        memory_bytes=memory_mib * MIB,
        compute_capability=(major, minor),
        minor=_int(raw, "minor", where),
        pci_bus_id=bus_id,
        numa_node=numa,
        mig_capable=mig_capable,
        mig_enabled=mig_enabled,
        mig_devices=_place(migs, raw_migs, memory_mib, where),
        mig_profiles=_mig_profiles(raw.get("mig_profiles"), mig_capable, where),
        fabric=_fabric(raw.get("fabric"), f"{where}.fabric"),
        brand=_choice(raw, "brand", where, BRANDS.values(), default_brand(name)),
        architecture=_choice(
            raw, "architecture", where, ARCHITECTURES.values(), architecture_from_cc((major, minor))
        ),
        pcie_root=_pcie_root(raw.get("pcie_root"), where),
        addressing_mode=_addressing_mode(raw, where),
    )


def _choice(raw: Mapping[str, Any], key: str, where: str, known: Iterable[str], default: str) -> str:
    value = raw.get(key, default)
    names = list(known)
    if value not in names:
        raise ProfileError(f"{_field(where, key)}: expected one of {', '.join(names)}, got {value!r}")
    return str(value)


def _addressing_mode(raw: Mapping[str, Any], where: str) -> str:
    """What nvmlDeviceGetAddressingMode answers; "" when absent (NVML answers NOT_SUPPORTED)."""
    if "addressing_mode" not in raw:
        return ""
    return _choice(raw, "addressing_mode", where, ADDRESSING_MODES.values(), "")


def _pcie_root(value: object, where: str) -> str | None:
    if value is None or (isinstance(value, str) and _PCIE_ROOT.match(value)):
        return value
    raise ProfileError(
        f"{where}.pcie_root: expected a PCIe root complex like 'pci0000:16' or null, got {value!r}"
    )


def _place(
    migs: tuple[MigDevice, ...], raw_migs: list[Any], memory_mib: int, where: str
) -> tuple[MigDevice, ...]:
    """Fill in each MIG device's GPU instance facts: as given, else NVIDIA's GI profile id for the profile
    and a placement packed around the given ones (sim/nvml/README.md). Compute instances of one GPU
    instance (same gi_id) share its facts."""
    ids: dict[int, int | None] = {}
    sizes: dict[int, int | None] = {}
    starts: dict[int, int] = {}
    for m, raw in zip(migs, raw_migs, strict=True):
        at = f"{where}.mig_devices[{m.index}]"
        if m.gi_id in ids:
            continue  # another compute instance of a GPU instance already seen
        given_id = _optional_int(raw, "gi_profile_id", at)
        gi_profile = given_id if given_id is not None else default_gi_profile_id(m.profile, memory_mib)
        size = _optional_int(raw, "placement_size", at)
        if size is not None and not 0 < size <= MEMORY_SLICES:
            raise ProfileError(f"{at}.placement_size: expected 1..{MEMORY_SLICES} memory slices, got {size}")
        size = size or mig_memory_slices(m.profile, memory_mib) or 1
        start = _optional_int(raw, "placement_start", at)
        if gi_profile is None and (start is not None or raw.get("placement_size") is not None):
            raise ProfileError(f"{at}: a placement needs gi_profile_id too (none is known for {m.profile!r})")
        ids[m.gi_id] = gi_profile
        sizes[m.gi_id] = size if gi_profile is not None else None
        if start is not None:
            _no_overlap(starts, sizes, m.gi_id, start, at)
            starts[m.gi_id] = start
    pending = [gi for gi, size in sizes.items() if size is not None and gi not in starts]
    taken = [(starts[gi], sizes[gi] or 1) for gi in starts]
    starts.update(zip(pending, pack_placements([sizes[gi] or 1 for gi in pending], taken), strict=True))
    return tuple(
        m if ids[m.gi_id] is None else
        replace(m, gi_profile_id=ids[m.gi_id], placement_start=starts[m.gi_id], placement_size=sizes[m.gi_id])
        for m in migs
    )  # fmt: skip


def _no_overlap(starts: dict[int, int], sizes: dict[int, int | None], gi: int, start: int, at: str) -> None:
    size = sizes[gi] or 1
    for other, begin in starts.items():
        end = begin + (sizes[other] or 1)
        if other != gi and start < end and begin < start + size:
            raise ProfileError(
                f"{at}.placement_start: slices {start}..{start + size - 1} overlap GPU instance {other} "
                f"(slices {begin}..{end - 1}); give each GPU instance its own slices"
            )


def _mig_profiles(raw: object, mig_capable: bool, where: str) -> tuple[MigProfile, ...]:
    """The GPU-instance profiles NVML reports for the GPU, with their possible placements."""
    where = f"{where}.mig_profiles"
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ProfileError(f"{where}: expected a list of MIG profiles, got {_kind(raw)}")
    if raw and not mig_capable:
        raise ProfileError(f"{where}: listed, but mig_capable is not true (only a MIG-capable GPU has them)")
    profiles = tuple(_mig_profile(p, f"{where}[{k}]") for k, p in enumerate(raw))
    for field in ("profile_index", "gi_profile_id", "name"):
        seen: set[object] = set()
        for k, p in enumerate(profiles):
            value = getattr(p, field)
            if value in seen:
                raise ProfileError(f"{where}[{k}].{field}: {value!r} is listed twice; each profile once")
            seen.add(value)
    return profiles


def _mig_profile(raw: object, where: str) -> MigProfile:
    if not isinstance(raw, Mapping):
        raise ProfileError(f"{where}: expected a mapping of MIG profile fields, got {_kind(raw)}")
    _no_unknown(raw, _MIG_PROFILE_FIELDS, where)
    for key in sorted(_MIG_PROFILE_FIELDS):
        if key not in raw:
            raise ProfileError(f"{where}.{key}: required (fields: {', '.join(sorted(_MIG_PROFILE_FIELDS))})")
    name = _str(raw, "name", where)
    if not _MIG_PROFILE.match(name):
        raise ProfileError(
            f"{where}.name: expected a MIG profile like '1g.10gb' or '1g.10gb+me', got {name!r}"
        )
    index = _int(raw, "profile_index", where)
    if index >= GPU_INSTANCE_PROFILE_COUNT:
        raise ProfileError(
            f"{where}.profile_index: NVML's profile indices are "
            f"0..{GPU_INSTANCE_PROFILE_COUNT - 1}, got {index}"
        )
    slices = _positive(raw, "slices", where)
    if slices > MAX_COMPUTE_SLICES:
        raise ProfileError(f"{where}.slices: a GPU has {MAX_COMPUTE_SLICES} compute slices, got {slices}")
    return MigProfile(
        name=name,
        profile_index=index,
        gi_profile_id=_int(raw, "gi_profile_id", where),
        slices=slices,
        instances=_positive(raw, "instances", where),
        memory_mib=_positive(raw, "memory_mib", where),
        multiprocessors=_positive(raw, "multiprocessors", where),
        copy_engines=_int(raw, "copy_engines", where),
        decoders=_int(raw, "decoders", where),
        encoders=_int(raw, "encoders", where),
        jpeg_engines=_int(raw, "jpeg_engines", where),
        ofa_engines=_int(raw, "ofa_engines", where),
        placements=_placements(raw.get("placements"), f"{where}.placements"),
    )


def _placements(raw: object, where: str) -> tuple[tuple[int, int], ...]:
    expected = f"a list of [start, size] pairs within the GPU's {MEMORY_SLICES} memory slices"
    if not isinstance(raw, list) or not raw:
        raise ProfileError(f"{where}: expected {expected}, got {_kind(raw)}")
    placements: list[tuple[int, int]] = []
    for k, pair in enumerate(raw):
        ok = isinstance(pair, list) and len(pair) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in pair
        )
        if not ok or not (pair[0] >= 0 and pair[1] > 0 and pair[0] + pair[1] <= MEMORY_SLICES):
            raise ProfileError(f"{where}[{k}]: expected [start, size] with start + size <= {MEMORY_SLICES} "
                               f"and size > 0 ({expected}), got {pair!r}")
        placements.append((pair[0], pair[1]))
    return tuple(placements)


def _fabric(raw: object, where: str) -> Fabric | None:
    """NVLink fabric registration; a Fabric only once it completed, as discovery reports it."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ProfileError(f"{where}: expected a mapping of fabric fields, got {_kind(raw)}")
    _no_unknown(raw, _FABRIC_FIELDS, where)
    text = _str(raw, "cluster_uuid", where)
    try:
        cluster = str(UUID(text))
    except ValueError:
        raise ProfileError(f"{where}.cluster_uuid: expected a UUID, got {text!r}") from None
    clique = _int(raw, "clique_id", where)
    state = raw.get("state", "completed")
    if state not in _FABRIC_STATES:
        raise ProfileError(f"{where}.state: expected one of {', '.join(_FABRIC_STATES)}, got {state!r}")
    if state != "completed" or cluster == str(UUID(int=0)):  # not attached, as discovery sees it
        return None
    return Fabric(cluster_uuid=cluster, clique_id=clique)


def _mig(raw: object, j: int, parent_index: int, parent_uuid: str, where: str) -> MigDevice:
    if not isinstance(raw, Mapping):
        raise ProfileError(f"{where}: expected a mapping of MIG device fields, got {_kind(raw)}")
    _no_unknown(raw, _MIG_FIELDS, where)
    uuid = _str(raw, "uuid", where)
    if not uuid.startswith("MIG-"):
        raise ProfileError(f"{where}.uuid: a MIG device UUID starts with 'MIG-', got {uuid!r}")
    profile = _str(raw, "profile", where)
    if not _MIG_PROFILE.match(profile):
        raise ProfileError(
            f"{where}.profile: expected a MIG profile like "
            f"'1g.10gb' or '1g.10gb+me', got {profile!r}"
        )
    return MigDevice(
        uuid=uuid,
        index=j,
        parent_uuid=parent_uuid,
        parent_index=parent_index,
        profile=profile,
        gi_id=_int(raw, "gi_id", where),
        ci_id=_int(raw, "ci_id", where),
        memory_bytes=_positive(raw, "memory_mib", where) * MIB,
        attributes=_mig_attributes(profile, _positive(raw, "memory_mib", where)),
    )


def _mig_attributes(profile: str, memory_mib: int) -> MigAttributes:
    """The attributes the stand-in NVML reports for a profile: the leading number is both slice
    counts, 16 multiprocessors per slice, no shared engines (sim/nvml/nvml_sim.c, GetAttributes)."""
    digits = re.match(r"\d+", profile)
    slices = int(digits.group()) if digits else 0
    return MigAttributes(
        multiprocessors=slices * 16, slices_gi=slices, slices_ci=slices, memory_mib=memory_mib
    )


def _links(doc: Mapping[str, Any], n: int) -> tuple[Link, ...]:
    levels = _pcie_levels(doc.get("pcie"), n)
    nvlinks: dict[tuple[int, int], int] = {}
    per_gpu = [0] * n
    raw_links = doc.get("nvlinks", [])
    if not isinstance(raw_links, list):
        raise ProfileError(f"nvlinks: expected a list of {{gpus: [a, b], links: N}}, got {_kind(raw_links)}")
    for k, raw in enumerate(raw_links):
        where = f"nvlinks[{k}]"
        if not isinstance(raw, Mapping):
            raise ProfileError(f"{where}: expected a mapping {{gpus: [a, b], links: N}}, got {_kind(raw)}")
        _no_unknown(raw, {"gpus", "links"}, where)
        pair = _indices(raw, where, n)
        if len(pair) != 2 or pair[0] == pair[1]:
            raise ProfileError(f"{where}.gpus: expected two different GPU indices, got {list(pair)}")
        count = _positive(raw, "links", where)
        a, b = sorted(pair)
        nvlinks[(a, b)] = nvlinks.get((a, b), 0) + count
        per_gpu[a] += count
        per_gpu[b] += count
    switch = doc.get("nvswitch")
    members: tuple[int, ...] = ()
    switch_links = 0
    if switch is not None:
        if not isinstance(switch, Mapping):
            raise ProfileError(
                "nvswitch: expected a mapping "
                f"{{links_per_gpu: N, gpus: [...]}}, got {_kind(switch)}"
            )
        _no_unknown(switch, {"gpus", "links_per_gpu"}, "nvswitch")
        switch_links = _positive(switch, "links_per_gpu", "nvswitch")
        members = _indices(switch, "nvswitch", n) if switch.get("gpus") is not None else tuple(range(n))
        for m in set(members):
            per_gpu[m] += switch_links
    for i, count in enumerate(per_gpu):
        if count > MAX_NVLINKS_PER_GPU:
            raise ProfileError(
                f"nvlinks: GPU {i} has {count} NVLink links; "
                f"NVML reports at most {MAX_NVLINKS_PER_GPU}"
            )
    switched = set(members)
    return tuple(
        Link(
            a=a,
            b=b,
            nvlinks=nvlinks.get((a, b), 0) + (switch_links if a in switched and b in switched else 0),
            pcie_level=levels[a][b],
        )
        for a in range(n)
        for b in range(a + 1, n)
    )


def _pcie_levels(raw: object, n: int) -> list[list[int]]:
    default = LEVEL_BY_NAME["system"]
    groups: list[Any] = []
    if raw is not None:
        if not isinstance(raw, Mapping):
            raise ProfileError(
                "pcie: expected a mapping "
                f"{{default: LEVEL, groups: [...]}}, got {_kind(raw)}"
            )
        _no_unknown(raw, {"default", "groups"}, "pcie")
        if "default" in raw:
            default = _level(raw["default"], "pcie.default")
        raw_groups = raw.get("groups", [])
        if not isinstance(raw_groups, list):
            raise ProfileError(
                "pcie.groups: expected a list of "
                f"{{gpus: [...], level: LEVEL}}, got {_kind(raw_groups)}"
            )
        groups = raw_groups
    levels = [[0 if a == b else default for b in range(n)] for a in range(n)]
    for k, group in enumerate(groups):
        where = f"pcie.groups[{k}]"
        if not isinstance(group, Mapping):
            raise ProfileError(
                f"{where}: expected a mapping "
                f"{{gpus: [...], level: LEVEL}}, got {_kind(group)}"
            )
        _no_unknown(group, {"gpus", "level"}, where)
        members = _indices(group, where, n)
        level = _level(group.get("level"), f"{where}.level")
        for a in members:
            for b in members:
                if a != b:
                    levels[a][b] = level
    return levels


def _level(value: object, where: str) -> int:
    if value not in LEVEL_BY_NAME:
        raise ProfileError(f"{where}: expected one of {', '.join(LEVEL_BY_NAME)}, got {value!r}")
    return LEVEL_BY_NAME[str(value)]


def _indices(raw: Mapping[str, Any], where: str, n: int) -> tuple[int, ...]:
    value = raw.get("gpus")
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise ProfileError(f"{where}.gpus: expected a list of GPU indices, got {_kind(value)}")
    for v in value:
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < n:
            raise ProfileError(f"{where}.gpus: {v!r} is not a GPU index of this profile (0..{n - 1})")
    return tuple(value)


def _unique_uuids(gpus: tuple[Gpu, ...]) -> None:
    seen: set[str] = set()
    for g in gpus:
        for uuid in (g.uuid, *(m.uuid for m in g.mig_devices)):
            if uuid in seen:
                raise ProfileError(f"gpus[{g.index}]: UUID {uuid} is used twice; every device needs its own")
            seen.add(uuid)


def _no_unknown(raw: Mapping[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(str(k) for k in raw if k not in known)
    if unknown:
        prefix = f"{where}: " if where else ""
        raise ProfileError(f"{prefix}unknown field {unknown[0]!r} (known fields: {', '.join(sorted(known))})")


def _field(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _str(raw: Mapping[str, Any], key: str, where: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or not value:
        raise ProfileError(f"{_field(where, key)}: required, expected a non-empty string, got {_kind(value)}")
    return value


def _int(raw: Mapping[str, Any], key: str, where: str) -> int:
    value = raw.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ProfileError(
            f"{_field(where, key)}: required, expected "
            f"a non-negative integer, got {_kind(value)}"
        )
    return value


def _optional_int(raw: Mapping[str, Any], key: str, where: str) -> int | None:
    return None if raw.get(key) is None else _int(raw, key, where)


def _positive(raw: Mapping[str, Any], key: str, where: str) -> int:
    value = _int(raw, key, where)
    if value == 0:
        raise ProfileError(f"{_field(where, key)}: must be greater than 0")
    return value


def _bool(raw: Mapping[str, Any], key: str, where: str, default: bool = False) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise ProfileError(f"{_field(where, key)}: expected true or false, got {_kind(value)}")
    return value


def _kind(value: object) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, (str, int, float, bool)):
        return repr(value)
    return type(value).__name__
