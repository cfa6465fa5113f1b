"""Golden CDI specs from NVIDIA's device plugin v0.20.0, for nvdp's spec tests (tests/cdi).

    sudo .venv/bin/python scripts/cdi_golden.py            # rewrite tests/cdi/data/nvidia-*.json
    sudo .venv/bin/python scripts/cdi_golden.py --check    # exit 1 when a saved file differs

For each case in CASES this builds a fake driver root in a temp folder (`build_fake_root`: real
`mknod` character nodes, versioned libraries, stub binaries, firmware, configs, an IPC socket), runs
NVIDIA's binary from ../shared/upstream on NVIDIA's mock NVML with `--device-list-strategy=
cdi-annotations --container-driver-root=<root> --driver-root=/` in a private mount namespace
(`run_in_ns.sh`, which needs root), waits for the specs it writes into the namespace's /var/run/cdi
and saves them with the fake root's path replaced by ROOT_MARK. Fake DRM entries for the first GPU
are made in the namespace's sysfs (FAKE_PCI_NUMA mounts a tmpfs on /sys/bus/pci/devices).

tests/cdi/test_golden.py builds the same root, runs nvdp on the same mock and compares. The fake root
and the cases live here so the two cannot drift apart.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
UPSTREAM_SHARED = Path(os.environ.get("NVDP_UPSTREAM_SHARED", ROOT.parent / "shared" / "upstream"))
DATA_DIR = ROOT / "tests" / "cdi" / "data"
ROOT_MARK = "<ROOT>"
DRIVER_VERSION = "550.163.01"  # NVIDIA's mock NVML reports this version
LIB_DIR = "usr/lib/x86_64-linux-gnu"
NVIDIA_MAJOR = 195
UVM_MAJOR = 235
DRM_MAJOR = 226
VIDEO_GID = 44  # group of the nodes that are not world-rw, so additionalGids shows up
RENDER_GID = 993
SPEC_WAIT_S = 20.0


@dataclass(frozen=True)
class Case:
    """One run of NVIDIA's plugin: mock profile, command-line flags, and the spec classes expected."""

    name: str
    profile: str  # a file of ../shared/upstream/mock-profiles
    args: tuple[str, ...]
    classes: tuple[str, ...] = ("gpu",)
    # The flags as nvdp's config fields, for the test that builds nvdp's side.
    id_strategy: str = "uuid"
    hook_path: str = "/usr/bin/nvidia-ctk"
    feature_flags: tuple[str, ...] = ()
    disable_hooks: tuple[str, ...] = ()
    imex_channels: tuple[int, ...] = ()
    gated: tuple[str, ...] = ()
    extra_env: dict[str, str] = field(default_factory=dict)


A100 = "mock-nvml-config-a100.yaml"
H100 = "mock-nvml-config-h100.yaml"
OPERATOR_HOOK = "/usr/local/nvidia/toolkit/nvidia-cdi-hook"
CASES = (
    Case("a100-uuid", A100, ()),
    Case("a100-index", A100, ("--device-id-strategy=index",), id_strategy="index"),
    Case(
        "h100-uuid-extras", H100,
        (f"--nvidia-cdi-hook-path={OPERATOR_HOOK}", "--imex-channel-ids=0", "--gds-enabled",
         "--mofed-enabled", "--gdrcopy-enabled"),
        classes=("gpu", "imex-channel", "gdrcopy", "gds", "mofed"),
        hook_path=OPERATOR_HOOK, imex_channels=(0,), gated=("gdrcopy", "gds", "mofed"),
    ),
    Case(
        "h100-index-flags", H100,
        ("--device-id-strategy=index",
         "--cdi-feature-flags=no-additional-gids-for-device-nodes,disable-ipc-discoverer,"
         "enable-explicit-driver-libraries",
         "--cdi-disable-hooks=enable-cuda-compat,update-application-profile"),
        id_strategy="index",
        feature_flags=("no-additional-gids-for-device-nodes", "disable-ipc-discoverer",
                       "enable-explicit-driver-libraries"),
        disable_hooks=("enable-cuda-compat", "update-application-profile"),
    ),
    Case("a100-uuid-nohooks", A100, ("--cdi-disable-hooks=all",), disable_hooks=("all",)),
)  # fmt: skip


# --- the fake driver root ---------------------------------------------------------------------------


def _mknod(path: Path, major: int, minor: int, mode: int = 0o666, gid: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, stat.S_IFCHR | mode, os.makedev(major, minor))
    os.chmod(path, mode)  # mknod applies the umask
    if gid:
        os.chown(path, 0, gid)


def elf_stub(path: Path, soname: str, work: Path) -> None:
    """A tiny real shared object with DT_SONAME `soname` (the toolkit reads SONAMEs with debug/elf)."""
    source = work / "stub.c"
    source.write_text("int nvdp_stub(void) { return 0; }\n")
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-nostdlib", f"-Wl,-soname,{soname}", "-o", str(path), str(source)],
        check=True, capture_output=True,
    )  # fmt: skip


def _touch(path: Path, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    os.chmod(path, mode)


def _link(path: Path, target: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)


def drm_bus_id(profile: str) -> str:
    """The first GPU's PCI bus ID in sysfs form (lower case, 4-digit domain), from the mock profile."""
    for line in (UPSTREAM_SHARED / "mock-profiles" / profile).read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("bus_id:"):
            return stripped.split(":", 1)[1].strip().strip('"').lower()
    raise RuntimeError(f"no bus_id in {profile}")


def build_fake_root(root: Path, mock_library: Path, bus_id: str) -> None:
    """A driver root as NVIDIA's toolkit and nvdp look at it (needs root: mknod, chown).

    Libraries: empty versioned files, two small ELF files with a SONAME (libcuda, ptxjitcompiler),
    the mock's real libnvidia-ml, their symlinks; graphics and Xorg files; binaries; firmware;
    configs; a persistenced socket; /tmp/nvidia-mps as a directory (which NVIDIA does not mount).
    Nodes: nvidia0..7 (nvidia7 group-owned 0660), the control nodes, DRM nodes for `bus_id` with
    by-path links, an IMEX channel, and the GDS, MOFED and GDRCopy nodes.
    """
    work = root.parent
    v = DRIVER_VERSION
    lib = root / LIB_DIR
    lib.mkdir(parents=True)
    elf_stub(lib / f"libcuda.so.{v}", "libcuda.so.1", work)
    _link(lib / "libcuda.so.1", f"libcuda.so.{v}")
    _link(lib / "libcuda.so", "libcuda.so.1")
    shutil.copyfile(mock_library, lib / f"libnvidia-ml.so.{v}")
    _link(lib / "libnvidia-ml.so.1", f"libnvidia-ml.so.{v}")
    _link(lib / "libnvidia-ml.so", "libnvidia-ml.so.1")
    elf_stub(lib / f"libnvidia-ptxjitcompiler.so.{v}", "libnvidia-ptxjitcompiler.so.1", work)
    _link(lib / "libnvidia-ptxjitcompiler.so.1", f"libnvidia-ptxjitcompiler.so.{v}")
    for name in ("libnvidia-cfg", "libnvidia-opticalflow", "libGLX_nvidia", "libnvidia-allocator",
                 "libnvidia-vulkan-producer", "libnvidia-nvvm"):
        _touch(lib / f"{name}.so.{v}")
    _touch(lib / "vdpau" / f"libvdpau_nvidia.so.{v}")
    _touch(lib / "libnvidia-egl-gbm.so.1.1.1")
    _touch(lib / "libnvidia-nvvm70.so.4")
    _touch(lib / "libGL.so.1.7.0")
    _link(lib / "libGL.so", "libGL.so.1.7.0")
    _touch(root / "usr/lib/xorg/modules/drivers/nvidia_drv.so")
    _touch(root / f"usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.{v}")
    for binary in ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control",
                   "nvidia-cuda-mps-server"):
        _touch(root / "usr/bin" / binary, 0o755)
    _touch(root / "usr/bin/nvidia-imex", 0o644)  # not executable: skipped by both
    _touch(root / "usr/bin/nvidia-ctk", 0o755)  # the hooks, for nvdp's check that the host has them
    _touch(root / OPERATOR_HOOK.lstrip("/"), 0o755)
    _touch(root / f"lib/firmware/nvidia/{v}/gsp_ga10x.bin")
    _touch(root / f"lib/firmware/nvidia/{v}/gsp_tu10x.bin")
    _touch(root / "usr/share/glvnd/egl_vendor.d/10_nvidia.json")
    _touch(root / "etc/vulkan/icd.d/nvidia_icd.json")
    _touch(root / "etc/OpenCL/vendors/nvidia.icd")
    _touch(root / "etc/cufile.json")
    (root / "run/udev").mkdir(parents=True)
    (root / "tmp/nvidia-mps").mkdir(parents=True)
    sock_path = root / "run/nvidia-persistenced/socket"
    sock_path.parent.mkdir(parents=True)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sock_path))

    dev = root / "dev"
    for minor in range(8):
        group_owned = minor == 7
        _mknod(dev / f"nvidia{minor}", NVIDIA_MAJOR, minor, 0o660 if group_owned else 0o666,
               VIDEO_GID if group_owned else 0)
    _mknod(dev / "nvidiactl", NVIDIA_MAJOR, 255)
    _mknod(dev / "nvidia-modeset", NVIDIA_MAJOR, 254)
    _mknod(dev / "nvidia-uvm", UVM_MAJOR, 0)
    _mknod(dev / "nvidia-uvm-tools", UVM_MAJOR, 1)
    _mknod(dev / "dri/card1", DRM_MAJOR, 1, 0o660, VIDEO_GID)
    _mknod(dev / "dri/renderD128", DRM_MAJOR, 128, 0o666, RENDER_GID)
    _link(dev / f"dri/by-path/pci-{bus_id}-card", "../card1")
    _link(dev / f"dri/by-path/pci-{bus_id}-render", "../renderD128")
    _mknod(dev / "nvidia-caps-imex-channels/channel0", 511, 0)
    _mknod(dev / "nvidia-fs0", 240, 0)
    _mknod(dev / "nvidia-fs1", 240, 1)
    _mknod(dev / "infiniband/uverbs0", 231, 192)
    _mknod(dev / "infiniband/rdma_cm", 10, 58)
    _mknod(dev / "gdrdrv", 509, 0)


def fake_sysfs(sysfs: Path, bus_id: str) -> None:
    """The sysfs entries nvdp reads for the DRM nodes of the GPU at `bus_id` (NVIDIA's run makes its
    own in the namespace)."""
    for entry in ("card1", "renderD128"):
        (sysfs / "bus/pci/devices" / bus_id / "drm" / entry).mkdir(parents=True)


# --- NVIDIA's plugin ---------------------------------------------------------------------------------


# NVIDIA's mock NVML hides the GPUs whose /dev/nvidia<i> is missing when some, not all, exist in /dev
# (engine.detectVisibleDevices): a test elsewhere on this machine that makes /dev/nvidia0 would turn
# 8 GPUs into 1. So both plugins run in a mount namespace whose /dev is a tmpfs holding nvidia0..7.
PRIVATE_DEV = (
    "mount -t tmpfs -o mode=755 nvdp-dev /dev && mknod -m 666 /dev/null c 1 3 "
    "&& mknod -m 666 /dev/zero c 1 5 && mknod -m 666 /dev/urandom c 1 9 && mknod -m 666 /dev/random c 1 8 "
    f"&& for i in 0 1 2 3 4 5 6 7; do mknod -m 666 /dev/nvidia$i c {NVIDIA_MAJOR} $i; done"
)


def with_private_dev(argv: list[str]) -> list[str]:
    """`argv` in a mount namespace of its own whose /dev holds only the basic nodes and nvidia0..7."""
    script = f'{PRIVATE_DEV} && exec "$@"'
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", *argv]


def unpack_upstream() -> Path:
    env = {"UPSTREAM_DIR": str(ROOT / ".build" / "nvidia-upstream"), **os.environ}
    out = subprocess.run(["bash", str(UPSTREAM_SHARED / "setup.sh")], check=True, capture_output=True,
                         text=True, env=env)
    return Path(out.stdout.strip().splitlines()[-1])


def why_cannot_run() -> str | None:
    """None when NVIDIA's plugin and a fake root can be run here, else the reason."""
    if os.geteuid() != 0:
        return "needs root: mknod for the fake root's device nodes, unshare -m for NVIDIA's plugin"
    if shutil.which("unshare") is None:
        return "unshare(1) is missing"
    if shutil.which("gcc") is None:
        return "gcc is missing (the fake root's ELF libraries)"
    if not (UPSTREAM_SHARED / "setup.sh").is_file():
        return f"{UPSTREAM_SHARED} (NVIDIA's plugin and mock NVML) is not there"
    return None


def run_nvidia(case: Case, upstream: Path, work: Path) -> dict[str, Any]:
    """NVIDIA's specs for `case`, by class, with the fake root's path replaced by ROOT_MARK."""
    root = work / "root"
    bus_id = drm_bus_id(case.profile)
    build_fake_root(root, upstream / "lib" / f"libnvidia-ml.so.{DRIVER_VERSION}", bus_id)
    overlay = work / "ns-overlay"
    drm = f"/sys/bus/pci/devices/{bus_id}/drm"
    inner = f'mkdir -p {drm}/card1 {drm}/renderD128 && {PRIVATE_DEV} && exec "$@"'
    argv = [
        "bash", str(UPSTREAM_SHARED / "run_in_ns.sh"), str(work / "device-plugins"),
        "sh", "-c", inner, "sh",
        str(upstream / "bin" / "nvidia-device-plugin"), "--fail-on-init-error=true",
        "--device-list-strategy=cdi-annotations", f"--container-driver-root={root}", "--driver-root=/",
        *case.args,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NVIDIA_", "CDI_", "MOCK_NVML"))}
    env.update(NS_OVL_DIR=str(overlay), FAKE_PCI_NUMA=f"{bus_id}=0",
               MOCK_NVML_CONFIG=str(UPSTREAM_SHARED / "mock-profiles" / case.profile), **case.extra_env)
    cdi_dir = overlay / "run" / "upper" / "cdi"
    log_path = work / "nvidia.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + SPEC_WAIT_S
            wanted = {f"k8s.device-plugin.nvidia.com-{c}.json" for c in case.classes}
            while not wanted <= {p.name for p in cdi_dir.glob("*.json")}:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{case.name}: NVIDIA's plugin wrote no spec for {sorted(wanted)}:\n"
                                       f"{log_path.read_text(errors='replace')[-4000:]}")
                time.sleep(0.05)
            time.sleep(0.3)  # every class is written in the same pass; let the last rename land
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
    specs = {}
    for path in sorted(cdi_dir.glob("*.json")):
        cls = path.name.removeprefix("k8s.device-plugin.nvidia.com-").removesuffix(".json")
        specs[cls] = normalise(json.loads(path.read_text()), str(root))
    return specs


def normalise(value: Any, root: str) -> Any:
    """`value` with every occurrence of the fake root's path replaced by ROOT_MARK."""
    if isinstance(value, str):
        return value.replace(root, ROOT_MARK)
    if isinstance(value, list):
        return [normalise(v, root) for v in value]
    if isinstance(value, dict):
        return {k: normalise(v, root) for k, v in value.items()}
    return value


def golden_path(case: Case) -> Path:
    return DATA_DIR / f"nvidia-{case.name}.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="compare with the saved files; write nothing")
    args = parser.parse_args(argv)
    reason = why_cannot_run()
    if reason is not None:
        print(f"cannot run NVIDIA's plugin: {reason}", file=sys.stderr)
        return 1
    upstream = unpack_upstream()
    stale = []
    for case in CASES:
        with tempfile.TemporaryDirectory(prefix="nvdp-cdi-golden-") as tmp:
            specs = run_nvidia(case, upstream, Path(tmp))
        text = json.dumps(specs, indent=1, sort_keys=True) + "\n"
        path = golden_path(case)
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(path.name)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path.relative_to(ROOT)} ({', '.join(specs)})")
    if stale:
        print(f"stale: {', '.join(stale)}; run scripts/cdi_golden.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
