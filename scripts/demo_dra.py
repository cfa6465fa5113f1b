"""The DRA demo: the real `nvidia-dra-plugin` on a simulated node, with a throwaway kube-apiserver.

The plugin runs unmodified on the stand-in NVML and a fake driver root (a libcuda file and real device
nodes, so root), publishes its ResourceSlices to a real etcd + kube-apiserver (the envtest binaries),
and is driven as a kubelet drives it: its registration socket answered, one ResourceClaim (allocated by
the demo, as kube-scheduler would) prepared through NodePrepareResources, its CDI spec shown, then
unprepared. Started by scripts/demo.py for a config in DRA mode.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from demo_common import DemoError, Refused, daemon_env, header, next_steps, section, show_log, wait_for_line

from nvdp.cdi.host import PROC_ROOT_ENV
from nvdp.config.names import DEFAULT_MODE_ENV, NODE_NAME_ENV
from nvdp.daemon.grpc_import import grpc
from nvdp.dra.cli import slices_table
from nvdp.dra.kubelet.api import dra_v1_pb2, pluginregistration_v1_pb2
from nvdp.dra.kubelet.server import dra_v1_grpc, registration_grpc
from nvdp.dra.main import CDI_ROOT_ENV, PLUGINS_DIR_ENV, REGISTRAR_DIR_ENV
from nvdp.dra.pool.names import DEFAULT_DRIVER
from sim.apiserver import DEFAULT_ASSETS, ControlPlane, missing
from sim.driver_root import make_driver_root, mknod_problem
from sim.nvml import NodeSim
from sim.nvml.procfs import write_proc_tree
from sim.processes import running

START_TIMEOUT_S = 30.0
CLAIM = "demo-gpu"
NAMESPACE = "default"


def assets_dir(kube_assets: str | None) -> Path:
    return Path(kube_assets or os.environ.get("KUBEBUILDER_ASSETS") or DEFAULT_ASSETS)


def mode_reason(by_flag: bool, config: str | None) -> str:
    """What put the node in DRA mode: --dra (`by_flag`), or the config's flags.mode."""
    return "--dra runs the node in DRA mode" if by_flag else f"{config} sets flags.mode: dra"


def check_machine(by_flag: bool, profile: str, config: str | None, kube_assets: str | None) -> None:
    """Refused (before anything starts, so a config in DRA mode is answered at once) when this machine
    lacks what the DRA demo needs, with the fixes."""
    assets = assets_dir(kube_assets)
    lacking = [f"{name} in {assets}" for name in missing(assets)]
    fixes = []
    if lacking:
        fixes.append("get kube-apiserver, etcd and kubectl (the envtest binaries, e.g. with "
                     "controller-runtime's `setup-envtest use -p path`) and pass their folder with "
                     "--kube-assets DIR (or set KUBEBUILDER_ASSETS)")
    with tempfile.TemporaryDirectory(prefix="nvdp-demo-probe-") as probe:
        if mknod_problem(Path(probe)) is not None:
            lacking.append("root (the claim's CDI spec needs real device nodes, made with mknod)")
            fixes.append("run the demo as root (sudo -E scripts/demo.sh ...)")
    if not lacking:
        return
    preview = f".venv/bin/nvdp dra slices --node {profile}{f' --config {config}' if config else ''}"
    raise Refused(
        f"{mode_reason(by_flag, config)}: the DRA demo runs nvidia-dra-plugin against a throwaway "
        f"kube-apiserver, and this machine lacks {'; '.join(lacking)}.\nFix: {'; '.join(fixes)}.\n"
        f"Without them: `{preview}` prints the slices the plugin would publish, computed as it computes "
        "them; the device-plugin demo needs none of this (a config without flags.mode: dra, and no --dra).")


def node_name(profile: Path) -> str:
    return "demo-" + re.sub(r"[^a-z0-9-]+", "-", profile.stem.lower()).strip("-")


@contextmanager
def control_plane(assets: Path) -> Iterator[ControlPlane]:
    # /dev/shm keeps etcd's fsyncs off the disk, as the tests do.
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    workdir = Path(tempfile.mkdtemp(prefix="nvdp-demo-apiserver-", dir=base))
    plane = ControlPlane(workdir, assets)
    try:
        try:
            plane.start()
        except (RuntimeError, subprocess.CalledProcessError, OSError) as err:
            raise DemoError(f"the throwaway kube-apiserver did not start: {err}") from None
        yield plane
    finally:
        plane.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def dra_demo(by_flag: bool, profile: str, config: str | None, workdir: Path, kube_assets: str | None) -> None:
    """The demo; `by_flag`: --dra put the node in DRA mode (else the config did)."""
    assets = assets_dir(kube_assets)
    node = NodeSim(profile, workdir / "nvml")
    name = node_name(node.profile)
    header("nvdp demo (DRA): the DRA kubelet plugin on a simulated node", [
        ("started", "nvidia-dra-plugin (python -m nvdp.dra.main): the real DRA plugin process"),
        ("", f"etcd + kube-apiserver from {assets}: real, throwaway (own PKI, free ports, deleted after)"),
        ("node", f"simulated: profile {node.profile.stem}, {len(node.inventory.gpus)} GPU(s) through the "
                 f"stand-in NVML (sim/nvml); Node object {name}; a fake driver root with real device nodes"),
        ("kubelet", "simulated: the demo answers the plugin's registration socket and calls "
                    "NodePrepareResources / NodeUnprepareResources as the kubelet's DRA manager does"),
        ("scheduler", "simulated: the demo writes the claim's allocation (status) as kube-scheduler would"),
        ("config", config or "the built-in defaults (no --config)"),
        ("mode", f"DRA: {mode_reason(by_flag, config)}"),
    ])
    driver_files = make_driver_root(workdir / "driver", node.inventory)
    # The driver's MIG capability files, which a node without the kernel module lacks (as in the images
    # with the stand-ins).
    write_proc_tree(workdir / "proc", len(node.inventory.gpus))
    sockets = workdir / "kubelet"
    with control_plane(assets) as plane:
        plane.create_node(name)
        env = daemon_env(config, node.env, driver_files.env, {
            NODE_NAME_ENV: name, "KUBECONFIG": str(plane.admin_kubeconfig),
            CDI_ROOT_ENV: str(driver_files.cdi_dir), PLUGINS_DIR_ENV: str(sockets / "plugins"),
            REGISTRAR_DIR_ENV: str(sockets / "registry"), DEFAULT_MODE_ENV: "dra",
            PROC_ROOT_ENV: str(workdir / "proc")})
        log = workdir / "dra-plugin.log"
        with running([sys.executable, "-m", "nvdp.dra.main"], env, log) as plugin:
            wait_for_line(log, "Registration socket for", plugin, "the DRA plugin", START_TIMEOUT_S)
            endpoint = register(sockets / "registry" / f"{DEFAULT_DRIVER}-reg.sock")
            wait_for_line(log, "ResourceSlices published", plugin, "the DRA plugin", START_TIMEOUT_S)
            slices = published(plane, name)
            section(f"ResourceSlices of node {name}, read back from the API server")
            for line in slices_table(slices):
                print(f"  {line}")
            devices = [d["name"] for s in slices for d in s["spec"].get("devices", [])]
            if not devices:
                raise DemoError("the plugin published no device; its log says why:\n" + log.read_text())
            prepare_one(plane, name, devices[0], endpoint, driver_files.cdi_dir)
            plugin.send_signal(signal.SIGTERM)
    show_log("The DRA plugin's log", log)
    if plugin.returncode != 0:
        raise DemoError(f"the DRA plugin exited with status {plugin.returncode} after SIGTERM (log above)")
    print("\nStopped: the DRA plugin exited 0 after SIGTERM; the API server and its data are gone.")
    again = f"scripts/demo.sh{' --dra' if by_flag else ''}{f' --config {config}' if config else ''}"
    next_steps([
        ("Another node:", f"{again} --profile h100-mig-8"),
        ("MIG made per claim:", "scripts/demo.sh --profile a100-80gb-mig-dynamic "
                                "--config examples/dra-dynamic-mig/config.yaml"),
        ("Preview, no processes:", f".venv/bin/nvdp dra slices --node {node.profile.stem}"
                                   f"{f' --config {config}' if config else ''}"),
        ("Device-plugin mode:", "scripts/demo.sh (a config without flags.mode: dra)"),
        ("On a cluster, no GPU:", "docs/kind.md (kind, stand-in images, dra.enabled=true)"),
        ("DRA on GPU nodes:", "docs/dra.md"),
    ])


def register(socket: Path) -> str:
    """What the kubelet's plugin watcher does: GetInfo, then NotifyRegistrationStatus; the DRA socket."""
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        stub = registration_grpc.RegistrationStub(channel)
        info = stub.GetInfo(pluginregistration_v1_pb2.InfoRequest(), timeout=10)
        stub.NotifyRegistrationStatus(pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=True),
                                      timeout=10)
    section("Registration, as the kubelet's plugin watcher sees it")
    print(f"  {info.type} {info.name} on {info.endpoint} (services {', '.join(info.supported_versions)})")
    return str(info.endpoint)


def published(plane: ControlPlane, node: str) -> list[dict[str, Any]]:
    found = plane.kubectl("get", "resourceslices", "--field-selector", f"spec.nodeName={node}",
                          "-o", "json").stdout
    return sorted(json.loads(found)["items"], key=lambda s: str(s["metadata"]["name"]))


def prepare_one(plane: ControlPlane, node: str, device: str, endpoint: str, cdi_dir: Path) -> None:
    """One claim for `device`, allocated as the scheduler would, prepared and unprepared as the kubelet
    would, with the CDI spec the plugin wrote for it."""
    request = {"name": "gpu", "exactly": {"deviceClassName": DEFAULT_DRIVER}}
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": CLAIM, "namespace": NAMESPACE},
             "spec": {"devices": {"requests": [request]}}}
    plane.kubectl("create", "-f", "-", input_text=json.dumps(claim))
    status = {"status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": DEFAULT_DRIVER, "pool": node, "device": device}]}}}}
    plane.kubectl("-n", NAMESPACE, "patch", "resourceclaim", CLAIM, "--subresource=status", "--type=merge",
                  "-p", json.dumps(status))
    uid = plane.kubectl("-n", NAMESPACE, "get", "resourceclaim", CLAIM, "-o",
                        "jsonpath={.metadata.uid}").stdout
    section(f"ResourceClaim {NAMESPACE}/{CLAIM}: one device of class {DEFAULT_DRIVER}")
    print(f"  allocated {device} of pool {node} (written by the demo, as kube-scheduler would)")
    answer = call(endpoint, "NodePrepareResources", uid)
    result = answer.claims[uid]
    if result.error:
        raise DemoError(f"NodePrepareResources refused the claim: {result.error}")
    print("  NodePrepareResources answers:")
    for prepared in result.devices:
        print(f"    {prepared.device_name} (pool {prepared.pool_name}, request "
              f"{', '.join(prepared.request_names)}): CDI devices {', '.join(prepared.cdi_device_ids)}")
    specs = sorted(p for p in cdi_dir.glob("*.json") if uid in p.read_text())
    for spec in specs:
        section(f"The claim's CDI spec, {spec.name} (what the container runtime reads)")
        for line in json.dumps(json.loads(spec.read_text()), indent=2).splitlines():
            print(f"  {line}")
    undone = call(endpoint, "NodeUnprepareResources", uid).claims[uid]
    if undone.error:
        raise DemoError(f"NodeUnprepareResources failed: {undone.error}")
    left = [p.name for p in specs if p.exists()]
    print(f"\n  NodeUnprepareResources: done; the claim's CDI spec is "
          f"{'still there: ' + ', '.join(left) if left else 'removed'}")


def call(endpoint: str, method: str, uid: str) -> Any:
    kind = "Prepare" if method == "NodePrepareResources" else "Unprepare"
    request = getattr(dra_v1_pb2, f"Node{kind}ResourcesRequest")(
        claims=[dra_v1_pb2.Claim(namespace=NAMESPACE, name=CLAIM, uid=uid)])
    with grpc.insecure_channel(f"unix://{endpoint}") as channel:
        return getattr(dra_v1_grpc.DRAPluginStub(channel), method)(request, timeout=30)
