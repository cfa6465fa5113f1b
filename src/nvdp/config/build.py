"""A validated config document -> the typed Config. Absent keys take model.py's defaults."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from msgspec.structs import fields

from nvdp.config.model import (
    Config,
    DeviceSelection,
    Flags,
    GfdFlags,
    Imex,
    PluginFlags,
    ReplicatedResource,
    ReplicatedResources,
    ResourcePattern,
    Resources,
    Sharing,
)
from nvdp.config.names import SHARED_SUFFIX, qualify_resource_name
from nvdp.config.schema import snake_case

# MPS has always refused requests for more than one replica unless told otherwise (NVIDIA's default).
MPS_FAIL_REQUESTS_GREATER_THAN_ONE = True


def build_config(doc: Mapping[str, Any], source: str) -> Config:
    flags_doc = doc.get("flags", {})
    plugin = PluginFlags(**_plugin_fields(flags_doc.get("plugin", {})))
    gfd = GfdFlags(**_gfd_fields(flags_doc.get("gfd", {})))
    flags = Flags(**_scalar_fields(Flags, flags_doc), plugin=plugin, gfd=gfd)
    resources_doc = doc.get("resources", {})
    resources = Resources(
        gpus=_patterns(resources_doc.get("gpus", [])),
        mig=_patterns(resources_doc.get("mig", [])),
    )
    sharing_doc = doc.get("sharing", {})
    sharing = Sharing(
        time_slicing=_replicated(sharing_doc.get("timeSlicing"), fail_by_default=False),
        mps=_replicated(sharing_doc.get("mps"), fail_by_default=MPS_FAIL_REQUESTS_GREATER_THAN_ONE),
    )
    imex = Imex(**_scalar_fields(Imex, doc.get("imex", {})))
    return Config(
        version=doc.get("version") or "v1",
        flags=flags,
        resources=resources,
        sharing=sharing,
        imex=imex,
        source=source,
    )


def _scalar_fields(cls: type, doc: Mapping[str, Any]) -> dict[str, Any]:
    """Keys of `doc` that name a field of `cls` (camelCase -> snake_case); lists become tuples."""
    names = {f.name for f in fields(cls)}
    found: dict[str, Any] = {}
    for key, value in doc.items():
        name = snake_case(key)
        if name in names and not isinstance(value, Mapping):
            found[name] = tuple(value) if isinstance(value, list) else value
    return found


def _plugin_fields(doc: Mapping[str, Any]) -> dict[str, Any]:
    found = _scalar_fields(PluginFlags, doc)
    strategy = doc.get("deviceListStrategy")
    if isinstance(strategy, str):
        found["device_list_strategy"] = (strategy,)
    for key in ("disableHealthChecks", "enableHealthChecks"):
        if key in doc:
            found[snake_case(key)] = health_check_tokens(doc[key])
    return found


def _gfd_fields(doc: Mapping[str, Any]) -> dict[str, Any]:
    found = _scalar_fields(GfdFlags, doc)
    interval = doc.get("sleepInterval")
    if isinstance(interval, int):
        found["sleep_interval"] = f"{interval}ns"  # a bare number is nanoseconds, as in Go
    return found


def health_check_tokens(value: object) -> tuple[str, ...]:
    """ "all", "xids" or XID numbers, lower-cased, as the health checker reads them."""
    raw = value.split(",") if isinstance(value, str) else value if isinstance(value, list) else [value]
    tokens: list[str] = []
    for item in raw:
        token = str(item).strip().lower()
        if token.isdigit():
            token = str(int(token))
        if token and token not in tokens:
            tokens.append(token)
    return tuple(tokens)


def _patterns(entries: list[Mapping[str, Any]]) -> tuple[ResourcePattern, ...]:
    return tuple(ResourcePattern(e["pattern"], qualify_resource_name(e["name"])) for e in entries)


def _replicated(doc: Mapping[str, Any] | None, fail_by_default: bool) -> ReplicatedResources | None:
    if doc is None:
        return None
    rename_by_default = bool(doc.get("renameByDefault", False))
    resources = []
    for entry in doc["resources"]:
        name = qualify_resource_name(entry["name"])
        rename: str | None = None
        if entry.get("rename"):
            rename = qualify_resource_name(entry["rename"])
        elif rename_by_default:
            rename = name + SHARED_SUFFIX
        resources.append(
            ReplicatedResource(
                name=name,
                replicas=entry["replicas"],
                rename=rename,
                devices=device_selection(entry.get("devices", "all")),
                strict_shares=bool(entry.get("strictShares", False)),
            )
        )
    return ReplicatedResources(
        resources=tuple(resources),
        rename_by_default=rename_by_default,
        fail_requests_greater_than_one=bool(doc.get("failRequestsGreaterThanOne", fail_by_default)),
    )


def device_selection(value: object) -> DeviceSelection:
    if isinstance(value, list):
        return DeviceSelection(all=False, refs=tuple(str(ref) for ref in value))
    if isinstance(value, int) and not isinstance(value, bool):
        return DeviceSelection(all=False, count=value)
    return DeviceSelection()
