"""Rules the schema cannot express: resource names, cross-field constraints.

Runs on documents that may also have schema errors, so every lookup checks its types first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from nvdp.config.issues import ConfigIssue, DocPath, format_path, show_value
from nvdp.config.model import Flags
from nvdp.config.names import SHARED_SUFFIX, qualify_resource_name, resource_name_problem
from nvdp.config.validate import Locate

SHARING_KINDS = ("timeSlicing", "mps")


def semantic_issues(doc: Mapping[Any, Any], locate: Locate) -> list[ConfigIssue]:
    issues: list[ConfigIssue] = []

    def add(path: DocPath, message: str, value: object, fix: str) -> None:
        source, line = locate(path)
        shown = None if value is None else show_value(value)
        issues.append(ConfigIssue(source, format_path(path), message, line=line, value=shown, fix=fix))

    def check_name(path: DocPath, name: object, fix: str) -> bool:
        """False when `name` is a string that cannot be a resource name."""
        if isinstance(name, str) and name:
            problem = resource_name_problem(qualify_resource_name(name))
            if problem is not None:
                add(path, f"bad resource name: {problem}", None, fix)
                return False
        return True

    resources = _mapping(doc.get("resources"))
    for kind in ("gpus", "mig"):
        for i, entry in _items(resources.get(kind)):
            check_name(("resources", kind, i, "name"), entry.get("name"), "e.g. gpu or nvidia.com/tesla-t4")

    sharing = _mapping(doc.get("sharing"))
    names: dict[str, dict[str, DocPath]] = {kind: {} for kind in SHARING_KINDS}
    for kind in SHARING_KINDS:
        block = _mapping(sharing.get(kind))
        rename_by_default = block.get("renameByDefault") is True
        for i, entry in _items(block.get("resources")):
            base: DocPath = ("sharing", kind, "resources", i)
            name = entry.get("name")
            name_ok = check_name((*base, "name"), name, "name a resource the node has, e.g. nvidia.com/gpu")
            rename = entry.get("rename")
            check_name((*base, "rename"), rename, "e.g. gpu.shared")
            strict_shares_issue(kind, entry, base, add)
            if isinstance(name, str) and name:
                qualified = qualify_resource_name(name)
                names[kind].setdefault(qualified, (*base, "name"))
                if rename_by_default and not rename and name_ok:
                    problem = resource_name_problem(qualified + SHARED_SUFFIX)
                    if problem is not None:
                        add(
                            (*base, "name"),
                            f"renameByDefault gives a bad resource name: {problem}",
                            None,
                            "set a shorter `rename` for this resource",
                        )
    for name, path in names["mps"].items():
        if name in names["timeSlicing"]:
            add(
                path,
                f"{name} is shared by both sharing.timeSlicing and sharing.mps",
                None,
                "share each resource one way only: remove it from one of the two lists",
            )

    flags = _mapping(doc.get("flags"))
    if flags.get("migStrategy") == "dynamic" and flags.get("mode") == "device-plugin":
        add(
            ("flags", "migStrategy"),
            "migStrategy dynamic needs DRA mode, but flags.mode is device-plugin: the device plugin cannot "
            "make MIG devices on demand",
            "dynamic",
            "set flags.mode: dra (with the chart's dra.enabled=true), or use migStrategy single or mixed",
        )
    strategy = flags.get("migStrategy", Flags().mig_strategy)
    # Only where one source sets both: a daemon whose environment sets another strategy (the chart's
    # migStrategy value, for the device plugin and the labeller) reads the same entry and ignores the list.
    if ("migDynamicProfiles" in flags and strategy != "dynamic"
            and locate(("flags", "migStrategy"))[0] == locate(("flags", "migDynamicProfiles"))[0]):
        add(
            ("flags", "migDynamicProfiles"),
            "migDynamicProfiles applies to migStrategy dynamic only, and migStrategy is "
            f"{show_value(strategy)}",
            None,
            "set flags.migStrategy: dynamic (DRA mode), or remove flags.migDynamicProfiles",
        )
    if isinstance(sharing.get("mps"), Mapping):
        if flags.get("migStrategy") == "mixed":
            mig_source, _ = locate(("flags", "migStrategy"))
            by = "" if mig_source == locate(("sharing", "mps"))[0] else f" (set by {mig_source})"
            add(
                ("sharing", "mps"),
                f"MPS sharing is not supported with migStrategy mixed{by}",
                None,
                "use migStrategy none or single, or share with sharing.timeSlicing",
            )
        default_root = Flags().mps_root
        mps_root = flags.get("mpsRoot", default_root)
        if mps_root == "":
            add(
                ("flags", "mpsRoot"),
                "MPS needs an MPS root (sharing.mps is set)",
                mps_root,
                f"set flags.mpsRoot (env MPS_ROOT, flag --mps-root), e.g. {default_root}",
            )

    if flags.get("deviceDiscoveryStrategy") == "tegra":
        add(
            ("flags", "deviceDiscoveryStrategy"),
            "tegra is not supported: this plugin finds GPUs through NVML only, so a Tegra (Jetson) "
            "integrated GPU would not be advertised",
            None,
            "use auto or nvml, or run NVIDIA's k8s-device-plugin on Tegra nodes",
        )

    channels = _mapping(doc.get("imex")).get("channelIDs")
    if isinstance(channels, list) and channels not in ([], [0]):
        add(("imex", "channelIDs"), "channelIDs must be [] or [0]", channels, "use [] (none) or [0]")
    return issues


def strict_shares_issue(kind: str, entry: Mapping[Any, Any], base: DocPath,
                        add: Callable[[DocPath, str, object, str], None]) -> None:
    """`strictShares` where it cannot hold: time-slicing has no ceilings to set, and one replica no shares."""
    if entry.get("strictShares") is not True:
        return
    path: DocPath = (*base, "strictShares")
    if kind != "mps":
        add(path, "strict shares are MPS ceilings, and time-slicing sets no limit at all", None,
            "share this resource through sharing.mps to give every claim an enforced share, or remove "
            "strictShares")
        return
    replicas = entry.get("replicas")
    if isinstance(replicas, int) and not isinstance(replicas, bool) and replicas < 2:
        add(path, f"strict shares need replicas of 2 or more: with replicas {replicas} the GPU is not "
            "shared, so there is no share to hold claims to", None,
            "set replicas to the number of equal shares per GPU (each share is 1/replicas of its threads "
            "and memory), or remove strictShares")


def _mapping(value: object) -> Mapping[Any, Any]:
    return value if isinstance(value, Mapping) else {}


def _items(value: object) -> list[tuple[int, Mapping[Any, Any]]]:
    if not isinstance(value, list):
        return []
    return [(i, item) for i, item in enumerate(value) if isinstance(item, Mapping)]
