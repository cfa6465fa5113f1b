"""The plugin process with a CDI device list strategy: it writes the CDI specs before it registers,
rewrites them on a re-plan without a moment where a name does not resolve, keeps them when it stops,
and stops (or refuses a reload) with the cause and the fix when they cannot be made or written.

A fake driver root, a stub hook and a CDI folder in the test's folder (tests/integration/cdi_node.py);
the stand-in NVML and the kubelet simulator as in test_plugin_process.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nvdp.doctor.cdi_specs import read_dirs
from sim.kubelet import KubeletSim
from sim.nvml import NodeSim
from tests.kube.envtest import ControlPlane

from .cdi_node import GPU_KIND, SPEC_NAME, VENDOR, CdiNode, make_cdi_node
from .conftest import MakeBarePlugin, PluginProcess
from .test_node_config import entries_dir

pytestmark = pytest.mark.slow

MakeCdiPlugin = Callable[..., tuple[PluginProcess, NodeSim, CdiNode]]
GPU = "nvidia.com/gpu"


@pytest.fixture
def make_cdi_plugin(tmp_path: Path, nvml_library: Path, make_bare_plugin: MakeBarePlugin) -> MakeCdiPlugin:
    """A plugin on a simulated node with a fake driver root, a hook and a CDI folder of its own."""

    def make(profile: str = "t4", **env: str) -> tuple[PluginProcess, NodeSim, CdiNode]:
        node = NodeSim(profile, tmp_path / "state")
        cdi = make_cdi_node(tmp_path / "node", node.inventory)
        settings = {"DEVICE_LIST_STRATEGY": "cdi-cri", **cdi.env, **env}
        return make_bare_plugin(**node.env, **settings), node, cdi

    return make


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def allocated_names(kubelet: KubeletSim, device_id: str) -> list[str]:
    (response,) = kubelet.allocate(GPU, [[device_id]])["container_responses"]
    names = [d["name"] for d in response.get("cdi_devices", [])]
    for value in response.get("annotations", {}).values():
        names += [n for n in value.split(",") if n not in names]
    return names


def assert_resolved(cdi: CdiNode, names: list[str]) -> None:
    """Every name resolves in the CDI folder as a container runtime reads it."""
    resolved = read_dirs([cdi.cdi_dir])
    assert names and [n for n in names if n not in resolved.names] == [], resolved


def assert_stopped_before_registering(plugin: PluginProcess, kubelet: KubeletSim, *messages: str) -> None:
    assert plugin.wait(20) == 1, plugin.log
    for message in messages:
        assert message in plugin.log
    assert kubelet.registrations == []
    assert plugin.sockets() == []
    assert "Traceback" not in plugin.log


@pytest.mark.parametrize("strategy", ["cdi-cri", "cdi-annotations", "envvar,cdi-cri"])
def test_spec_is_written_before_registering(make_cdi_plugin: MakeCdiPlugin, kubelet: KubeletSim,
                                            strategy: str) -> None:
    plugin, node, cdi = make_cdi_plugin("t4", DEVICE_LIST_STRATEGY=strategy)
    plugin.start()
    kubelet.wait_for_resource(GPU, count=1, timeout=10)
    plugin.wait_for_log("Registered device plugin for 'nvidia.com/gpu' with Kubelet")
    log = plugin.log
    written = f"CDI spec written before registering: {cdi.spec_path}"
    assert written in log
    assert log.index(written) < log.index("Starting GRPC server") < log.index("Registered device plugin")
    assert stat.S_IMODE(cdi.spec_path.stat().st_mode) == 0o644
    uuid = node.inventory.gpus[0].uuid
    assert cdi.spec()["kind"] == GPU_KIND
    assert cdi.device_names() == sorted([uuid, "all"])
    names = allocated_names(kubelet, uuid)
    assert names == [f"{GPU_KIND}={uuid}"]
    assert_resolved(cdi, names)
    assert plugin.stop() == 0


def test_sighup_with_another_id_strategy_rewrites_the_spec_and_names_always_resolve(
        make_cdi_plugin: MakeCdiPlugin, kubelet: KubeletSim, tmp_path: Path) -> None:
    """uuid -> index on an 8-GPU node: the spec ends with the index names only; read every few
    milliseconds meanwhile, it is never torn and holds the old names, both, or the new ones."""
    config = tmp_path / "config.yaml"
    write(config, "version: v1\nflags:\n  plugin:\n    deviceIDStrategy: uuid\n")
    plugin, node, cdi = make_cdi_plugin("a100-sxm-8", CONFIG_FILE=str(config))
    plugin.start()
    kubelet.wait_for_resource(GPU, count=8, timeout=10)
    uuids = [g.uuid for g in node.inventory.gpus]
    indexes = [str(g.index) for g in node.inventory.gpus]
    old, new = {*uuids, "all"}, {*indexes, "all"}
    assert set(cdi.device_names()) == old

    seen: list[frozenset[str]] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.append(frozenset(d["name"] for d in cdi.spec()["devices"]))  # json fails if torn

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    write(config, "version: v1\nflags:\n  plugin:\n    deviceIDStrategy: index\n")
    plugin.signal(signal.SIGHUP)
    plugin.wait_for_log("Reload applied:")
    done.set()
    watcher.join(5)
    assert set(cdi.device_names()) == new  # no UUID left
    assert {s for s in seen} <= {frozenset(old), frozenset(old | new), frozenset(new)}
    log = plugin.log
    assert log.index("CDI spec written for the re-plan") < log.index("CDI spec written after the re-plan")
    # The new server (a settings change restarts it) answers with the new names, and they resolve.
    plugin.wait_for_log("Registered device plugin for 'nvidia.com/gpu' with Kubelet", count=2)
    kubelet.wait_for_resource(GPU, count=8, timeout=10)
    names = allocated_names(kubelet, uuids[3])
    assert names == [f"{GPU_KIND}=3"]
    assert_resolved(cdi, names)
    assert plugin.stop() == 0


def test_spec_stays_after_the_plugin_stops(make_cdi_plugin: MakeCdiPlugin, kubelet: KubeletSim) -> None:
    """Containers created during a rolling update must still resolve their devices."""
    plugin, _node, cdi = make_cdi_plugin("t4")
    plugin.start()
    kubelet.wait_for_resource(GPU, count=1, timeout=10)
    before = cdi.spec_path.read_bytes()
    assert plugin.stop() == 0
    assert plugin.sockets() == []
    assert cdi.spec_path.read_bytes() == before


def test_reload_with_a_missing_hook_keeps_serving(make_cdi_plugin: MakeCdiPlugin, kubelet: KubeletSim,
                                                  tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    write(config, "version: v1\n")
    plugin, node, cdi = make_cdi_plugin("t4", CONFIG_FILE=str(config))
    plugin.start()
    kubelet.wait_for_resource(GPU, count=1, timeout=10)
    before = cdi.spec_path.read_bytes()
    write(config, "version: v1\nflags:\n  plugin:\n    nvidiaCTKPath: /opt/nowhere/nvidia-cdi-hook\n"
                  "    deviceIDStrategy: index\n")
    plugin.signal(signal.SIGHUP)
    plugin.wait_for_log("Reload failed; still serving the previous configuration.")
    refused = plugin.log.split("Reload failed")[1]
    looked = f"{cdi.hook_dir}/nvidia-cdi-hook"
    assert f"the CDI hook /opt/nowhere/nvidia-cdi-hook was looked for at {looked}" in refused
    assert "cdi.nvidiaHookPath" in refused
    assert cdi.spec_path.read_bytes() == before
    uuid = node.inventory.gpus[0].uuid
    assert allocated_names(kubelet, uuid) == [f"{GPU_KIND}={uuid}"]  # the old config still serves
    assert plugin.proc is not None and plugin.proc.poll() is None
    assert plugin.stop() == 0


def test_all_hooks_disabled_needs_no_hook(make_cdi_plugin: MakeCdiPlugin, kubelet: KubeletSim,
                                          tmp_path: Path) -> None:
    empty = tmp_path / "no-hook"
    empty.mkdir()
    plugin, _node, cdi = make_cdi_plugin("t4", NVDP_HOST_HOOK_DIR=str(empty))
    plugin.start("--cdi-disable-hooks=all")
    kubelet.wait_for_resource(GPU, count=1, timeout=10)
    assert "hooks" not in json.dumps(cdi.spec())
    assert plugin.stop() == 0


def test_nvidia_cdi_flags_and_variables_are_accepted(make_cdi_plugin: MakeCdiPlugin,
                                                     kubelet: KubeletSim) -> None:
    """NVIDIA's values set CDI_FEATURE_FLAGS; its flags exist too. Both used to exit 2."""
    plugin, _node, cdi = make_cdi_plugin("t4", CDI_FEATURE_FLAGS="disable-ipc-discoverer,a-future-flag")
    plugin.start("--cdi-disable-hooks=update-application-profile", "--cdi-feature-flags",
                 "no-additional-gids-for-device-nodes,a-future-flag")
    kubelet.wait_for_resource(GPU, count=1, timeout=10)
    assert "Unknown CDI feature flag(s) a-future-flag" in plugin.log
    assert "update-application-profile" not in json.dumps(cdi.spec())
    assert "update-ldcache" in json.dumps(cdi.spec())
    assert plugin.stop() == 0


def test_bad_hook_name_is_a_config_error_not_a_crash(make_cdi_plugin: MakeCdiPlugin,
                                                     kubelet: KubeletSim) -> None:
    plugin, _node, _cdi = make_cdi_plugin("t4", CDI_DISABLE_HOOKS="update-ldcache,create-symlink")
    plugin.start()
    assert_stopped_before_registering(plugin, kubelet, "CDI_DISABLE_HOOKS: flags.plugin.cdiDisableHooks[1]",
                                      "create-symlinks")


def test_optional_classes_are_named_only_when_their_spec_is_written(
        make_cdi_plugin: MakeCdiPlugin, kubelet: KubeletSim) -> None:
    """GDS on without its files: no gds spec, no gds name (NVIDIA_GDS is still set, as NVIDIA sets it).
    An IMEX channel that exists: its spec is written and Allocate names it."""
    plugin, node, cdi = make_cdi_plugin("t4", GDS_ENABLED="true", IMEX_CHANNEL_IDS="0")
    channels = cdi.driver_root / "dev" / "nvidia-caps-imex-channels"
    channels.mkdir()
    os.mknod(channels / "channel0", stat.S_IFCHR | 0o666, os.makedev(511, 0))
    plugin.start()
    kubelet.wait_for_resource(GPU, count=1, timeout=10)
    uuid = node.inventory.gpus[0].uuid
    names = allocated_names(kubelet, uuid)
    assert names == [f"{GPU_KIND}={uuid}", f"{VENDOR}/imex-channel=0"]
    assert_resolved(cdi, names)
    files = sorted(p.name for p in cdi.cdi_dir.iterdir())
    assert files == [f"{VENDOR}-gpu.json", f"{VENDOR}-imex-channel.json"]
    assert plugin.stop() == 0


# --- what stops the start --------------------------------------------------------------------------------


def break_libcuda(cdi: CdiNode) -> None:
    for lib in (cdi.driver_root / "usr/lib/x86_64-linux-gnu").glob("libcuda.so*"):
        lib.unlink()


def corrupt_ldcache(cdi: CdiNode) -> None:
    break_libcuda(cdi)
    (cdi.driver_root / "etc").mkdir()
    (cdi.driver_root / "etc/ld.so.cache").write_bytes(b"glibc-ld.so.cache1.1" + b"\x07" * 9)


def no_hook(cdi: CdiNode) -> None:
    (cdi.hook_dir / "nvidia-ctk").unlink()


@pytest.mark.parametrize(
    ("breakage", "env", "messages"),
    [
        (break_libcuda, {}, ["no libcuda.so.550.54.15 under the container driver root", "nvidiaDriverRoot"]),
        (corrupt_ldcache, {},
         ["/etc/ld.so.cache is not a readable ld.so.cache", "cannot generate the CDI specs"]),
        (no_hook, {}, ["the CDI hook /usr/bin/nvidia-ctk was looked for at", "does not exist",
                       "cdi.nvidiaHookPath", "--cdi-disable-hooks=all"]),
        (None, {"IMEX_CHANNEL_IDS": "0", "IMEX_REQUIRED": "true"},
         ["imex.required: requested IMEX channel channel0 does not exist (no character device at"]),
    ],
    ids=["no-libcuda", "corrupt-ld.so.cache", "missing-hook", "required-imex-channel-missing"],
)
def test_what_stops_the_start_names_the_cause_and_the_fix(
        make_cdi_plugin: MakeCdiPlugin, kubelet: KubeletSim, breakage: Callable[[CdiNode], None] | None,
        env: dict[str, str], messages: list[str]) -> None:
    plugin, _node, cdi = make_cdi_plugin("t4", **env)
    if breakage is not None:
        breakage(cdi)
    plugin.start()
    assert_stopped_before_registering(plugin, kubelet, *messages)
    assert not cdi.spec_path.exists()


def test_a_driver_root_that_is_a_file_stops_the_start(make_cdi_plugin: MakeCdiPlugin, kubelet: KubeletSim,
                                                      tmp_path: Path) -> None:
    a_file = tmp_path / "driver-root-file"
    a_file.write_text("")
    plugin, _node, _cdi = make_cdi_plugin("t4", DRIVER_ROOT_CTR_PATH=str(a_file))
    plugin.start()
    assert_stopped_before_registering(plugin, kubelet, f"the container driver root {a_file} is not a folder",
                                      "set nvidiaDriverRoot")


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[Path]:
    """`folder` as a read-only file system (a tmpfs mounted ro over it), or a skip saying why not."""
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        reason = f"cannot mount a read-only tmpfs here: {done.stderr.strip() or done.returncode}"
        print(f"skipped: {reason}")
        pytest.skip(reason)
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "ro-cdi"
    folder.mkdir()
    with read_only(folder):
        yield folder


def test_a_read_only_cdi_folder_stops_the_start(make_cdi_plugin: MakeCdiPlugin, kubelet: KubeletSim,
                                                read_only_dir: Path) -> None:
    plugin, _node, _cdi = make_cdi_plugin("t4", NVDP_CDI_DIR=str(read_only_dir))
    plugin.start()
    assert_stopped_before_registering(
        plugin, kubelet, "cannot write the CDI specs before registering: cannot write "
        f"{read_only_dir}/{SPEC_NAME}", "read-only file system",
        "mount the host's /var/run/cdi there read-write")



def test_a_spec_that_cannot_be_written_at_reload_refuses_it(make_cdi_plugin: MakeCdiPlugin,
                                                            kubelet: KubeletSim, tmp_path: Path) -> None:
    """The CDI folder turned read-only under a serving plugin: a re-plan that needs new names is
    refused, the old config (and its names) keep serving, and the spec on disk is the old one."""
    config = tmp_path / "config.yaml"
    write(config, "version: v1\n")
    plugin, node, cdi = make_cdi_plugin("t4", CONFIG_FILE=str(config))
    plugin.start()
    kubelet.wait_for_resource(GPU, count=1, timeout=10)
    before = cdi.spec_path.read_bytes()
    write(config, "version: v1\nflags:\n  plugin:\n    deviceIDStrategy: index\n")
    with read_only(cdi.cdi_dir):
        plugin.signal(signal.SIGHUP)
        plugin.wait_for_log("Reload failed; still serving the previous configuration.")
    refused = plugin.log.split("Reload failed")[1]
    assert "cannot write the CDI specs for the re-plan" in refused and "read-only file system" in refused
    assert cdi.spec_path.read_bytes() == before
    uuid = node.inventory.gpus[0].uuid
    assert allocated_names(kubelet, uuid) == [f"{GPU_KIND}={uuid}"]
    assert plugin.log.count("Registered device plugin") == 1  # nothing was restarted
    assert plugin.stop() == 0


def test_a_node_label_switch_rewrites_the_spec(make_cdi_plugin: MakeCdiPlugin, kubelet: KubeletSim,
                                              kube_api: ControlPlane, tmp_path: Path) -> None:
    """Per-node config: the label picks the index entry; the running plugin rewrites the spec."""
    node_name = f"gpu-{uuid.uuid4().hex[:8]}"
    kube_api.create_node(node_name)
    index = "version: v1\nflags:\n  plugin:\n    deviceIDStrategy: index\n"
    entries = {"uuid": "version: v1\n", "index": index}
    plugin, node, cdi = make_cdi_plugin("mixed-4", CONFIG_DIR=str(entries_dir(tmp_path, entries)),
                                        DEFAULT_CONFIG="uuid", NODE_NAME=node_name,
                                        KUBECONFIG=str(kube_api.admin_kubeconfig))
    plugin.start()
    kubelet.wait_for_resource(GPU, count=4, timeout=15)
    assert set(cdi.device_names()) == {*(g.uuid for g in node.inventory.gpus), "all"}
    kube_api.kubectl("label", "node", node_name, "nvidia.com/device-plugin.config=index")
    plugin.wait_for_log("Reload applied")
    assert set(cdi.device_names()) == {*(str(g.index) for g in node.inventory.gpus), "all"}
    assert plugin.stop() == 0
