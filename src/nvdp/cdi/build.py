"""The CDI specs of this node, from the config, the inventory, the plan and the host facts.

Pure. One spec per class: `gpu` (every full GPU with MIG off, every MIG device, every device the plan
advertises, and `all`), `imex-channel` when channels exist, and `gdrcopy` / `gds` / `mofed` when
enabled and their files exist. The `gpu` spec follows NVIDIA's device plugin v0.20.0 (toolkit v1.20.0)
field by field; docs/cdi.md lists where nvdp differs and why.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from fnmatch import fnmatchcase

from msgspec import Struct

from nvdp.cdi import edits as ed
from nvdp.cdi.errors import CdiError
from nvdp.cdi.facts import GATED_MODES, HostFacts, HostFile, Library, Node, gated_modes, sysfs_bus_id
from nvdp.cdi.links import graphics_links, hookless_mounts, library_links
from nvdp.cdi.names import ALL_DEVICE as ALL_DEVICE
from nvdp.cdi.spec import (
    ContainerEdits,
    Device,
    DeviceNode,
    Spec,
    kind_of,
    minimum_version,
    qualified,
    validate,
)
from nvdp.config.model import Config
from nvdp.inventory.devnodes import MIG_MINORS_FILE, gpu_node, mig_cap_keys
from nvdp.inventory.model import Gpu, Inventory, MigDevice
from nvdp.plan.ids import container_id
from nvdp.plan.model import Plan

CLASS_ORDER = ("gpu", "imex-channel", *GATED_MODES)
VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
# A legacy nvidia runtime hook then injects nothing a second time.
VISIBLE_DEVICES_VOID = f"{VISIBLE_DEVICES_ENV}=void"
LIBCUDA_DIR_ENV = "NVIDIA_CTK_LIBCUDA_DIR"


class SpecSet(Struct, frozen=True):
    """The specs to write, one per class, `gpu` first."""

    specs: tuple[Spec, ...] = ()

    def classes(self) -> frozenset[str]:
        return frozenset(s.cls for s in self.specs)

    def names(self) -> frozenset[str]:
        """Every qualified device name the specs resolve ("k8s.device-plugin.nvidia.com/gpu=GPU-...")."""
        return frozenset(qualified(s.kind, d.name) for s in self.specs for d in s.devices)

    def spec(self, cls: str) -> Spec | None:
        return next((s for s in self.specs if s.cls == cls), None)

    def merged(self, other: SpecSet) -> SpecSet:
        """The union per class, so the names of both sets resolve while a switch is under way: the
        devices of both (`other`'s edits where both name a device, `all` the union of them all) and
        `other`'s common edits."""
        specs: dict[str, Spec] = {s.cls: s for s in self.specs}
        for new in other.specs:
            old = specs.get(new.cls)
            if old is None:
                specs[new.cls] = new
                continue
            devices = {d.name: d for d in old.devices} | {d.name: d for d in new.devices}
            others = [d.container_edits for name, d in devices.items() if name != ALL_DEVICE]
            if ALL_DEVICE in devices and others:  # `all` covers the devices of both
                devices[ALL_DEVICE] = Device(name=ALL_DEVICE, container_edits=ed.join(*others))
            specs[new.cls] = finish_spec(new.kind, devices.values(), new.container_edits)
        return SpecSet(tuple(sorted(specs.values(), key=lambda s: _class_rank(s.cls))))


def _class_rank(cls: str) -> tuple[int, str]:
    return (CLASS_ORDER.index(cls) if cls in CLASS_ORDER else len(CLASS_ORDER), cls)


def finish_spec(kind: str, devices: Iterable[Device], common: ContainerEdits) -> Spec:
    """A valid spec: simplified, devices sorted by name, the minimum version; CdiError if invalid."""
    common = ed.tidy(common)
    simplified = (
        Device(name=d.name, annotations=d.annotations,
               container_edits=ed.tidy(ed.without_common(ed.tidy(d.container_edits), common)))
        for d in devices
    )
    finished = tuple(sorted(simplified, key=lambda d: d.name))
    spec = Spec(cdi_version="0.3.0", kind=kind, devices=finished, container_edits=common)
    spec = Spec(cdi_version=minimum_version(spec), kind=kind, devices=finished, container_edits=common)
    validate(spec)
    return spec


class SpecBuilder:
    """The gpu spec's parts, with the settings every part needs (the per-claim specs use them too)."""

    def __init__(self, config: Config, inventory: Inventory, facts: HostFacts) -> None:
        plugin = config.flags.plugin
        flags = frozenset(plugin.cdi_feature_flags)
        self.config = config
        self.inventory = inventory
        self.facts = facts
        self.gids = "no-additional-gids-for-device-nodes" not in flags
        self.hooks = ed.HookMaker(plugin.nvidia_ctk_path, plugin.cdi_disable_hooks)
        self.strategy = plugin.device_id_strategy

    # --- devices -------------------------------------------------------------------------------------

    def gpu_edits(self, gpu: Gpu) -> ContainerEdits:
        """A full GPU: /dev/nvidia<minor>, its DRM nodes, and the hook for their by-path links."""
        bus = sysfs_bus_id(gpu.pci_bus_id)
        return ed.join(
            ed.node_edits([self._gpu_node(gpu, f"GPU {gpu.uuid} (index {gpu.index})"),
                           *self.facts.drm_nodes.get(bus, ())], self.gids),
            ContainerEdits(hooks=self.hooks.make(ed.CREATE_SYMLINKS, self.facts.drm_links.get(bus, ()))),
        )

    def mig_edits(self, gpu: Gpu, mig: MigDevice) -> ContainerEdits:
        """A MIG device: its parent's node and its GPU and compute instances' capability nodes (and the
        DRM nodes when its profile has the gfx attribute)."""
        where = f"MIG device {mig.uuid} ({mig.index_id}, profile {mig.profile})"
        caps: list[Node] = []
        for key in mig_cap_keys(gpu.minor, mig.gi_id, mig.ci_id):
            cap = self.facts.mig_caps.get(key)
            if cap is None:
                raise CdiError(
                    f"{where}: no capability minor for {key} in {MIG_MINORS_FILE} nor in "
                    "/proc/driver/nvidia/capabilities, so a container would not get the MIG device. Check "
                    "that the MIG layout is the one NVML reports (nvidia-smi mig -lgi / -lci on the host) "
                    "and that /proc/driver/nvidia is visible in the plugin's container; both are read "
                    "again at every start and re-plan"
                )
            caps.append(cap)
        bus = sysfs_bus_id(gpu.pci_bus_id)
        gfx = "gfx" in mig.profile.split("+")[1:]
        drm = self.facts.drm_nodes.get(bus, ()) if gfx else ()
        links = self.facts.drm_links.get(bus, ()) if gfx else ()
        return ed.join(ed.node_edits([self._gpu_node(gpu, where), *caps, *drm], self.gids),
                       ContainerEdits(hooks=self.hooks.make(ed.CREATE_SYMLINKS, links)))

    def _gpu_node(self, gpu: Gpu, where: str) -> Node:
        node = self.facts.gpu_nodes.get(gpu.minor)
        if node is None:
            roots = self.facts.roots
            host_dev = posixpath.join(roots.target_dev_root, "dev")
            raise CdiError(
                f"{where}: no character device {gpu_node(gpu.minor)} under the dev root {roots.dev_root}, "
                "so a container would get no GPU. Check that the nvidia kernel module has created it on "
                f"the host (run nvidia-smi there), and that the host's {host_dev} is what the plugin sees "
                "at its dev root (the driver root's dev/ folder, else its own /dev)"
            )
        return node

    def devices(self, plan: Plan) -> list[Device]:
        """Every full GPU with MIG off, every MIG device, every device the plan advertises (a MIG GPU
        advertised whole under migStrategy none), by the names Allocate gives them; and `all`."""
        found: dict[str, ContainerEdits] = {}
        for gpu in self.inventory.gpus:
            if not gpu.mig_enabled:
                found[container_id(gpu.uuid, str(gpu.index), self.strategy)] = self.gpu_edits(gpu)
            for mig in gpu.mig_devices if gpu.mig_enabled else ():
                found[container_id(mig.uuid, mig.index_id, self.strategy)] = self.mig_edits(gpu, mig)
        for device in (d for r in plan.resources for d in r.devices):
            name = container_id(device.base_id, device.index, self.strategy)
            whole = self.inventory.gpu(device.base_id)
            if name not in found and whole is not None:
                found[name] = self.gpu_edits(whole)
        if not found:
            return []
        every = ed.join(*found.values())
        found[ALL_DEVICE] = every
        return [Device(name=name, container_edits=e) for name, e in found.items()]

    # --- common edits --------------------------------------------------------------------------------

    def common(self, visible_devices: str = "void") -> ContainerEdits:
        """The driver's edits every device needs, with NVIDIA_VISIBLE_DEVICES=`visible_devices`."""
        facts = self.facts
        version = facts.driver_version
        # The allocator is among the versioned libraries already; NVIDIA leaves its graphics copy out.
        allocator = f"libnvidia-allocator.so.{version}"
        graphics_mounts = [g for g in facts.graphics if posixpath.basename(g.path) != allocator]
        lib_links = library_links(facts.libraries, facts.symlinks)
        gfx_links = graphics_links(facts.graphics, version)
        files: list[HostFile | Library] = [*facts.libraries, *graphics_mounts, *facts.configs,
                                           *facts.firmware, *facts.binaries]
        hooks = (
            *self.hooks.make(ed.CREATE_SYMLINKS, gfx_links),
            *self.hooks.make(ed.CREATE_SYMLINKS, lib_links),
            *self.hooks.make("enable-cuda-compat", [f"--host-driver-version={version}"]),
            *self.hooks.make(ed.UPDATE_LDCACHE, _library_folders(facts.libraries)),
            *self.hooks.make("disable-device-node-modification"),
            *self.hooks.make("update-application-profile"),
        )
        extra = []
        if self.hooks.all_disabled:  # no create-symlinks hook: the files themselves at those paths
            extra = hookless_mounts([*facts.libraries, *facts.graphics], [*gfx_links, *lib_links])
        return ed.join(
            ed.node_edits(facts.control_nodes, self.gids),
            ContainerEdits(
                env=(f"{LIBCUDA_DIR_ENV}={':'.join(facts.lib_dirs)}",
                     f"{VISIBLE_DEVICES_ENV}={visible_devices}"),
                mounts=(*ed.mounts([*files, *extra]), *ed.mounts(facts.ipc, ed.IPC_MOUNT_OPTIONS)),
                hooks=hooks,
            ),
        )

    # --- the other classes ---------------------------------------------------------------------------

    def imex(self) -> Spec | None:
        """One device per channel found: its node by path and host path only, as NVIDIA writes it."""
        channels = [c for c in self.config.imex.channel_ids if c in self.facts.imex_channels]
        if not channels:
            return None
        devices = []
        for channel in channels:
            node = self.facts.imex_channels[channel]
            edits = ContainerEdits(device_nodes=(DeviceNode(path=node.path, host_path=node.host_path),))
            devices.append(Device(name=str(channel), container_edits=edits))
        return finish_spec(kind_of("imex-channel"), devices, ContainerEdits())

    def gated(self, mode: str) -> Spec | None:
        files = self.facts.gated.get(mode)
        if files is None or not files.nodes:
            return None
        mounts = ContainerEdits(mounts=ed.mounts(files.mounts))
        edits = ed.join(ed.node_edits(files.nodes, self.gids), mounts)
        return finish_spec(kind_of(mode), [Device(name=ALL_DEVICE, container_edits=edits)],
                           ContainerEdits(env=(VISIBLE_DEVICES_VOID,)))


def _library_folders(libs: Iterable[Library]) -> list[str]:
    """The folders the update-ldcache hook runs ldconfig on: those holding a `lib*.so*` mounted."""
    return list(dict.fromkeys(posixpath.dirname(lib.path) for lib in libs if _is_library_name(lib.path)))


def _is_library_name(path: str) -> bool:
    base = posixpath.basename(path)
    if not fnmatchcase(base, "lib?*.so*"):
        return False
    tail = base.split(".so")[-1]
    return tail == "" or tail.startswith(".")


def build_specs(config: Config, inventory: Inventory, plan: Plan, facts: HostFacts) -> SpecSet:
    """This node's specs (CdiError when one would be invalid, naming the device and the fix)."""
    builder = SpecBuilder(config, inventory, facts)
    specs: list[Spec] = []
    devices = builder.devices(plan)
    if devices:
        specs.append(finish_spec(kind_of("gpu"), devices, builder.common()))
    imex = builder.imex()
    if imex is not None:
        specs.append(imex)
    for mode in gated_modes(config):
        gated = builder.gated(mode)
        if gated is not None:
            specs.append(gated)
    return SpecSet(tuple(specs))
