"""Demo: nvdp's real daemons on a simulated node, as a kubelet sees them.

A config in device-plugin mode (the default) starts `nvidia-device-plugin` (and the MPS control daemon
for an MPS config) against the stand-in NVML and a simulated kubelet, and shows every resource of the
plan: its registration, its count and one Allocate answer. A config in DRA mode (`flags.mode: dra`, or
--dra) runs the DRA demo instead (scripts/demo_dra.py): `nvidia-dra-plugin` with a throwaway
kube-apiserver, its ResourceSlices and one claim prepared.

    python scripts/demo.py [--profile t4] [--config my-config.yaml] [--dra] [--kube-assets DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from demo_common import ROOT, DemoError, Refused, daemon_env, header, next_steps, section, show_log

from nvdp.config.issues import ConfigError
from nvdp.config.loader import load_config
from nvdp.config.model import Config
from nvdp.daemon.pernode.mode import DEFAULT_MODE_ENV, InvalidMode, node_mode, strategy_problem
from nvdp.inventory.model import Inventory
from nvdp.plan import PlanError, plan
from nvdp.plan.model import PlannedResource
from nvdp.plan.summary import plan_summary_rows, render_table
from sim.kubelet import KubeletSim
from sim.mps import BIN_DIR as MPS_SIM_BIN
from sim.nvml import NodeSim, list_profiles, resolve_profile
from sim.processes import running

REGISTER_TIMEOUT_S = 20.0


def node_line(profile: Path, inventory: Inventory) -> str:
    models = ", ".join(sorted({gpu.name for gpu in inventory.gpus}))
    count = len(inventory.gpus)
    where = profile.relative_to(ROOT) if profile.is_relative_to(ROOT) else profile
    return (f"profile {profile.stem} ({where}): {count} GPU{'' if count == 1 else 's'} ({models}), "
            f"driver {inventory.driver_version}")


def config_line(config: str | None) -> str:
    return config if config else "the built-in defaults (no --config)"


def device_plugin_demo(profile: str, config: str | None, cfg: Config, workdir: Path) -> None:
    node = NodeSim(profile, workdir / "state")
    expected = plan(cfg, node.inventory)
    mps = cfg.sharing.strategy == "mps"
    header("nvdp demo: the device plugin on a simulated node", [
        ("started", "nvidia-device-plugin (python -m nvdp.plugin.main): the real plugin process"),
        *([("", "mps-control-daemon (python -m nvdp.mps.main): the real MPS control daemon, driving a "
                "stand-in nvidia-cuda-mps-control (sim/mps)")] if mps else []),
        ("node", f"simulated: {node_line(node.profile, node.inventory)}, through the stand-in NVML "
                 "(sim/nvml: the libnvidia-ml.so.1 the plugin's pynvml loads)"),
        ("kubelet", "simulated: its device manager (sim/kubelet), on a socket folder of its own"),
        ("config", config_line(config)),
    ])
    section(f"The plan (what `nvdp plan --node {node.profile.stem}{f' --config {config}' if config else ''}` "
            "computes, with the plugin's own functions)")
    for line in render_table(plan_summary_rows(expected, node.inventory)):
        print(f"  {line}")
    for warning in expected.warnings:
        print(f"  warning: {warning}")
    for left_out in expected.excluded:
        print(f"  left out: {left_out.device}: {left_out.reason}")
    if not expected.resources:
        raise DemoError("this config advertises no resource on this node (see the plan above); try another "
                        "--config or --profile")
    plugin_dir = workdir / "device-plugins"
    env = daemon_env(config, node.env, {"DEVICE_PLUGIN_PATH": str(plugin_dir)})
    log_path = workdir / "plugin.log"
    with KubeletSim(plugin_dir) as kubelet, mps_daemon(mps, env, workdir) as daemon_log, \
            running([sys.executable, "-m", "nvdp.plugin.main"], env, log_path) as plugin:
        section("What the kubelet sees, resource by resource (in the plan's order)")
        for resource in expected.resources:
            show_resource(kubelet, resource, plugin, log_path)
        plugin.send_signal(signal.SIGTERM)
    show_log("The plugin's log", log_path)
    if daemon_log is not None:
        show_log("The MPS control daemon's log", daemon_log)
    if plugin.returncode != 0:
        raise DemoError(f"the plugin exited with status {plugin.returncode} after SIGTERM (its log is above)")
    print(f"\nStopped: the plugin exited 0 after SIGTERM{', and the MPS control daemon' if mps else ''}.")
    device_plugin_next_steps(node.profile.stem, config)


def show_resource(kubelet: KubeletSim, resource: PlannedResource, plugin: subprocess.Popen[bytes],
                  log_path: Path) -> None:
    name, count = resource.name, len(resource.devices)
    try:
        devices = kubelet.wait_for_resource(name, count=count, timeout=REGISTER_TIMEOUT_S)
    except TimeoutError as err:
        state = (f"the plugin exited with status {plugin.returncode}" if plugin.poll() is not None
                 else "the plugin is still running")
        raise DemoError(f"{err} ({state}). Its log:\n{log_path.read_text()}") from None
    registration = next(r for r in kubelet.registrations if r.get("resource_name") == name)
    options = registration.get("options", {})
    healthy = sum(d["health"] == "Healthy" for d in devices)
    print(f"\n  {name}: {len(devices)} allocatable ({healthy} healthy); registered on "
          f"{registration['endpoint']} (API {registration['version']}, GetPreferredAllocation "
          f"{'yes' if options.get('get_preferred_allocation_available') else 'no'})")
    device = resource.devices[0].id
    answer = kubelet.allocate(name, [[device]])
    print(f"  Allocate {device} (the plan's first device) answers:")
    for line in allocate_lines(answer):
        print(f"    {line}")


def allocate_lines(answer: dict[str, Any]) -> list[str]:
    """One container's Allocate answer, a line per setting."""
    lines: list[str] = []
    for container in answer.get("container_responses", []):
        lines += [f"env {k}={v}" for k, v in sorted(container.get("envs", {}).items())]
        lines += [f"mount {m.get('host_path')} -> {m.get('container_path')}"
                  f"{' (read-only)' if m.get('read_only') else ''}" for m in container.get("mounts", [])]
        lines += [f"device {d.get('host_path')} -> {d.get('container_path')} ({d.get('permissions', '')})"
                  for d in container.get("devices", [])]
        lines += [f"annotation {k}={v}" for k, v in sorted(container.get("annotations", {}).items())]
        lines += [f"CDI device {d.get('name')}" for d in container.get("cdi_devices", [])]
    return lines or ["(nothing: an empty answer)"]


@contextlib.contextmanager
def mps_daemon(mps: bool, env: dict[str, str], workdir: Path) -> Iterator[Path | None]:
    """For a config that shares GPUs with MPS, the MPS control daemon beside the plugin, as the chart
    runs it, with the stand-in nvidia-cuda-mps-control; both see the MPS root in `workdir`."""
    if not mps:
        yield None
        return
    root = workdir / "mps"
    env.update(PATH=f"{MPS_SIM_BIN}{os.pathsep}{env.get('PATH', '')}", MPS_ROOT=str(root),
               MPS_CONTAINER_ROOT=str(root))
    log_path = workdir / "mps-daemon.log"
    with running([sys.executable, "-m", "nvdp.mps.main"], env, log_path):
        yield log_path


def device_plugin_next_steps(profile: str, config: str | None) -> None:
    others = ", ".join(p for p in list_profiles() if p != profile)
    with_config = f" --config {config}" if config else ""
    next_steps([
        ("Another node:", f"scripts/demo.sh --profile h100-mig-8 (profiles: {others})"),
        ("Another config:", "scripts/demo.sh --config examples/time-slicing/config.yaml (also "
                            "examples/mps/, and examples/mig/ with --profile h100-mig-8)"),
        ("The same node in DRA mode:", f"scripts/demo.sh --dra --profile {profile}{with_config}"),
        ("Preview, no processes:", f".venv/bin/nvdp plan --node {profile}{with_config}"),
        ("On a cluster, no GPU:", "docs/kind.md (kind, stand-in images, chart value "
                                  "unsupported.simulatedGpus)"),
        ("On GPU nodes:", "README.md, charts/nvidia-device-plugin/README.md"),
    ])


def choose_mode(cfg: Config, config: str | None, dra: bool) -> str:
    """The node's mode as the plugins decide it (flags.mode, else --dra as the chart's dra.defaultMode);
    Refused when the arguments contradict each other."""
    if dra and cfg.flags.mode == "device-plugin":
        raise Refused(f"--dra: {config} sets flags.mode: device-plugin, which wins over the default mode "
                      "--dra sets; drop --dra, or flags.mode from the config")
    mode = node_mode(cfg, {DEFAULT_MODE_ENV: "dra" if dra else ""})
    problem = strategy_problem(cfg, mode)
    if problem is not None:
        raise Refused(f"{config} cannot run in device-plugin mode: add --dra (the demo's DRA mode), or set "
                      f"flags.mode: dra in it. Why: {problem}")
    return mode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--profile", default="t4", help="node profile: a name from sim/profiles or a path "
                        f"(default t4; names: {', '.join(list_profiles())})")
    parser.add_argument("--config", help="plugin config file (default: the built-in defaults)")
    parser.add_argument("--dra", action="store_true", help="run the node in DRA mode when the config sets "
                        "no flags.mode (what the chart's dra.defaultMode=dra does): the DRA demo")
    parser.add_argument("--kube-assets", metavar="DIR", help="the DRA demo's kube-apiserver, etcd and "
                        "kubectl (default: $KUBEBUILDER_ASSETS, else /tmp/nvdp-k8s/assets/bin)")
    args = parser.parse_args(argv)
    try:
        resolve_profile(args.profile)  # FileNotFoundError naming the shipped profiles
        cfg = load_config(args.config, env={})
        mode = choose_mode(cfg, args.config, args.dra)
        if mode == "dra":
            import demo_dra

            by_flag = cfg.flags.mode != "dra"  # else the config asks for DRA mode itself
            demo_dra.check_machine(by_flag, args.profile, args.config, args.kube_assets)
        with tempfile.TemporaryDirectory(prefix="nvdp-demo-") as workdir:
            if mode == "dra":
                demo_dra.dra_demo(by_flag, args.profile, args.config, Path(workdir), args.kube_assets)
            else:
                device_plugin_demo(args.profile, args.config, cfg, Path(workdir))
    except Refused as err:
        print(f"demo: {err}", file=sys.stderr)
        return 2
    except (DemoError, ConfigError, InvalidMode, PlanError, FileNotFoundError, TimeoutError,
            RuntimeError) as err:
        print(f"demo failed: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
