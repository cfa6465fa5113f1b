"""Container edits from host facts, as NVIDIA's toolkit writes them: device nodes, mounts, hooks, the
additional GIDs, and the simplify pass.

Pure. Sources (facts, not code): NVIDIA/nvidia-container-toolkit v1.20.0 internal/edits/device.go
(node fields, additionalGids), internal/discover/hooks.go (hook form), pkg/nvcdi/transform/simplify.go,
deduplicate.go and sorter.go (the simplify pass).
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Sequence
from typing import TypeVar

from nvdp.cdi.facts import HostFile, Library, Node
from nvdp.cdi.spec import ContainerEdits, DeviceNode, Hook, Mount

MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "rbind", "rprivate")
IPC_MOUNT_OPTIONS = ("nosuid", "nodev", "rbind", "rprivate", "noexec")  # sockets: written to, not ro
HOOK_STAGE = "createContainer"  # every hook NVIDIA makes runs there
HOOK_ENV = ("NVIDIA_CTK_DEBUG=false",)
CREATE_SYMLINKS = "create-symlinks"
UPDATE_LDCACHE = "update-ldcache"
# NVIDIA's hooks that are off unless asked for by name; nvdp has no setting that asks.
DISABLED_BY_DEFAULT = frozenset({"chmod"})
T = TypeVar("T")


class HookMaker:
    """Hooks as NVIDIA's hook creator makes them: `path` is the host's hook binary and args[0] its base
    name; `nvidia-ctk` takes the hook as a subcommand of `hook`, `nvidia-cdi-hook` directly. A hook
    named in `disabled` (or every hook, with "all") is not made, nor a create-symlinks without links."""

    def __init__(self, path: str, disabled: Iterable[str] = ()) -> None:
        self.path = path
        self.disabled = frozenset(disabled) | DISABLED_BY_DEFAULT
        base = posixpath.basename(path)
        self.fixed = (base, "hook") if base == "nvidia-ctk" else (base,)

    @property
    def all_disabled(self) -> bool:
        return "all" in self.disabled

    def make(self, name: str, args: Sequence[str] = ()) -> tuple[Hook, ...]:
        if self.all_disabled or name in self.disabled or (name == CREATE_SYMLINKS and not args):
            return ()
        if name == CREATE_SYMLINKS:
            args = [a for link in args for a in ("--link", link)]
        elif name == UPDATE_LDCACHE:
            args = [a for folder in args for a in ("--folder", folder)]
        return (Hook(hook_name=HOOK_STAGE, path=self.path, args=(*self.fixed, name, *args), env=HOOK_ENV),)


def device_node(node: Node) -> DeviceNode:
    """The spec's form of a node: a stat'ed node with "rwm" and its mode and group when not 0 (NVIDIA
    leaves zeroes out); a node described from /proc with its type and no host path."""
    return DeviceNode(
        path=node.path,
        host_path=node.host_path,
        type=node.type,
        major=node.major,
        minor=node.minor,
        file_mode=node.mode or None,
        permissions="rwm" if node.host_path else "",
        gid=node.gid or None,
    )


def additional_gid(node: Node) -> int | None:
    """The node's group when a container needs to be in it: group-owned (not 0) and not both world
    readable and writable (feature flag no-additional-gids-for-device-nodes turns this off)."""
    if not node.gid or node.mode is None:
        return None
    world_rw = node.mode & 0o004 and node.mode & 0o002
    return None if world_rw else node.gid


def node_edits(nodes: Iterable[Node], gids: bool) -> ContainerEdits:
    found = tuple(nodes)
    groups = [g for g in (additional_gid(n) for n in found) if g is not None] if gids else []
    return ContainerEdits(device_nodes=tuple(device_node(n) for n in found), additional_gids=tuple(groups))


def mounts(files: Iterable[HostFile | Library], options: tuple[str, ...] = MOUNT_OPTIONS,
           ) -> tuple[Mount, ...]:
    return tuple(Mount(host_path=f.host_path, container_path=f.path, options=options) for f in files)


def join(*parts: ContainerEdits) -> ContainerEdits:
    """The edits of `parts` one after the other (CDI's ContainerEdits.Append)."""
    return ContainerEdits(
        env=tuple(e for p in parts for e in p.env),
        device_nodes=tuple(n for p in parts for n in p.device_nodes),
        hooks=tuple(h for p in parts for h in p.hooks),
        mounts=tuple(m for p in parts for m in p.mounts),
        additional_gids=tuple(g for p in parts for g in p.additional_gids),
    )


# --- the simplify pass ------------------------------------------------------------------------------


def _depth(path: str) -> int:
    return posixpath.normpath(path).count("/")


def _unique(items: Iterable[T]) -> tuple[T, ...]:
    return tuple(dict.fromkeys(items))


def _mount_order(mount: Mount) -> tuple[int, str]:
    return _depth(mount.container_path), mount.container_path


def tidy(edits: ContainerEdits) -> ContainerEdits:
    """Duplicates removed, GIDs sorted, device nodes and mounts sorted by path depth then path; env and
    hooks keep their order (hooks run in it)."""
    return ContainerEdits(
        env=_unique(edits.env),
        device_nodes=tuple(sorted(_unique(edits.device_nodes), key=lambda n: (_depth(n.path), n.path))),
        net_devices=edits.net_devices,
        hooks=_unique(edits.hooks),
        mounts=tuple(sorted(_unique(edits.mounts), key=_mount_order)),
        intel_rdt=edits.intel_rdt,
        additional_gids=tuple(sorted(set(edits.additional_gids))),
    )


def without_common(edits: ContainerEdits, common: ContainerEdits) -> ContainerEdits:
    """A device's edits less what the common edits already give (GIDs stay, as NVIDIA keeps them);
    unchanged when nothing would be left, since CDI refuses a device without edits."""
    reduced = ContainerEdits(
        env=tuple(e for e in edits.env if e not in common.env),
        device_nodes=tuple(n for n in edits.device_nodes if n not in common.device_nodes),
        net_devices=edits.net_devices,
        hooks=tuple(h for h in edits.hooks if h not in common.hooks),
        mounts=tuple(m for m in edits.mounts if m not in common.mounts),
        intel_rdt=edits.intel_rdt,
        additional_gids=edits.additional_gids,
    )
    return edits if reduced.is_empty() else reduced
