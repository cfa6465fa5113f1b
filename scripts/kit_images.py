"""Build the project's images without a container engine, from the wheel and the k8s kit's Python base.

    python scripts/kit_images.py --kit ../shared/k8s                 # release images, tag = appVersion
    python scripts/kit_images.py --kit ../shared/k8s --stand-ins     # plus stand-in NVML, MPS, nvidia-smi

Each image's entry point, environment, user and working directory are read from its Dockerfile under
`images/`, so this builder and `docker build` produce images that start the same way (tests/images checks
that the Dockerfiles only use what this reader understands). What differs is the base: the kit's Debian
bookworm Python 3.11 in /opt/venv instead of python:3.11-slim in /usr/local.

`--stand-ins` builds, for clusters without GPUs (the end-to-end suite, the chart's
unsupported.simulatedGpus), `<image>-sim` instead: both images plus the stand-in libnvidia-ml.so.1, every
node profile of sim/profiles (as JSON, with its sysfs tree), the stand-in nvidia-cuda-mps-control and a
stand-in nvidia-smi. Which profile a container sees is chosen when it starts, through its environment
(`profile_env`, what the chart sets on every container); their NVML state lives in
/mps/gpu.nvidia.com/nvml-sim, under the MPS root the pods mount from the host, so the plugins and the MPS
daemons see one node.

Release images are tagged with the chart's appVersion, stand-in images with a hash of everything that goes
into them (--tag overrides both). A build whose archive in the kit's image folder came from the same sources
is only re-imported (or nothing at all when containerd has it), so repeated runs cost seconds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGES = {"plugin": "nvdp-plugin", "mps-daemon": "nvdp-mps-daemon"}
# The stand-in images' name: `<repository>-sim`, which the chart's unsupported.simulatedGpus runs.
STAND_IN_SUFFIX = "-sim"
# Where the stand-ins live in an image, and where the NVML stand-in keeps its node-wide state: below the
# DRA driver's folder of the MPS root, which every pod that touches GPUs mounts from the host (the device
# plugin and the MPS daemon all of /mps, the DRA plugin and the dra-mps daemons /mps/gpu.nvidia.com).
SIM_DIR = "/opt/nvml-sim"
SIM_STATE_DIR = "/mps/gpu.nvidia.com/nvml-sim"
SIM_ENV = {
    "LD_LIBRARY_PATH": SIM_DIR,
    "NVML_SIM_STATE_DIR": SIM_STATE_DIR,
    # The driver's MIG capability files (mig-minors), which a node without the kernel module lacks.
    "NVDP_PROC_ROOT": f"{SIM_DIR}/proc",
}
# Every node profile, <name>/profile.json and <name>/sys; no default: a container sees GPUs only once its
# environment names a profile (profile_env).
PROFILES_DIR = f"{SIM_DIR}/profiles"


def profile_env(profile: str) -> dict[str, str]:
    """The environment that shows a stand-in image's container the node profile `profile`: what the chart's
    unsupported.simulatedGpus sets on every container (templates/_helpers.tpl, simulatedGpusEnv)."""
    return {
        "NVML_SIM_PROFILE": f"{PROFILES_DIR}/{profile}/profile.json",
        # The profile's GPUs' PCI devices (their NUMA nodes and PCIe roots), which the host's sysfs lacks.
        "NVDP_SYSFS_ROOT": f"{PROFILES_DIR}/{profile}/sys",
    }

# Instructions of the final stage this builder reproduces, and those it may ignore because the kit's
# base does the same thing another way (ARG/FROM: the base; COPY/RUN: installing the wheel; LABEL:
# metadata the packer does not write).
UNDERSTOOD = {"ENV", "ENTRYPOINT", "CMD", "USER", "WORKDIR"}
IGNORED = {"ARG", "FROM", "COPY", "RUN", "LABEL"}
SOURCES = (
    "pyproject.toml",
    "README.md",
    "src",
    "images",
    "sim/nvml",
    "sim/mps",
    "sim/nvidia-smi",
    "sim/profiles",
    "scripts/kit_images.py",
)


class BuildError(RuntimeError):
    """An image could not be built; the message says which step and why."""


@dataclass(frozen=True)
class ImageSpec:
    """How a container from the image starts, as its Dockerfile's final stage says."""

    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)
    user: str | None = None
    workdir: str | None = None


def logical_lines(text: str) -> list[str]:
    """Dockerfile lines with continuations joined and comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    if pending.strip():
        lines.append(pending.strip())
    return lines


def read_dockerfile(path: Path) -> ImageSpec:
    """The final stage's start-up settings; raises BuildError on an instruction this builder cannot mirror."""
    stage: list[tuple[str, str]] = []
    for line in logical_lines(path.read_text(encoding="utf-8")):
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            stage = []
        elif keyword not in UNDERSTOOD | IGNORED:
            raise BuildError(
                f"{path}: {keyword} is not mirrored by {Path(__file__).name}; teach it or drop it"
            )
        stage.append((keyword, rest.strip()))
    entrypoint = cmd = None
    env: dict[str, str] = {}
    user = workdir = None
    for keyword, rest in stage:
        if keyword in ("ENTRYPOINT", "CMD"):
            value = json.loads(rest)
            if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
                raise BuildError(f"{path}: {keyword} must be a JSON list of strings (exec form)")
            entrypoint, cmd = (value, cmd) if keyword == "ENTRYPOINT" else (entrypoint, value)
        elif keyword == "ENV":
            for word in shlex.split(rest):
                key, sep, value = word.partition("=")
                if not sep:
                    raise BuildError(f"{path}: write ENV as KEY=value pairs ({rest!r})")
                env[key] = value
        elif keyword == "USER":
            user = rest
        elif keyword == "WORKDIR":
            workdir = rest
    return ImageSpec(entrypoint=entrypoint, cmd=cmd, env=env, user=user, workdir=workdir)


def app_version() -> str:
    for line in (ROOT / "charts/nvidia-device-plugin/Chart.yaml").read_text(encoding="utf-8").splitlines():
        if line.startswith("appVersion:"):
            return line.split(":", 1)[1].strip().strip("\"'")
    raise BuildError("charts/nvidia-device-plugin/Chart.yaml has no appVersion")


def source_digest(extra: Iterable[str] = ()) -> str:
    """A hash of every file that goes into the images, so an unchanged tree reuses the last build."""
    digest = hashlib.sha256()
    for name in SOURCES:
        path = ROOT / name
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            if "__pycache__" in file.parts or file.suffix == ".pyc" or not file.exists():
                continue
            digest.update(str(file.relative_to(ROOT)).encode() + b"\0" + file.read_bytes() + b"\0")
    for item in extra:
        digest.update(item.encode() + b"\0")
    return digest.hexdigest()


def run(argv: Sequence[str], what: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        detail = (done.stderr.strip() or done.stdout.strip())[-3000:]
        raise BuildError(f"{what} failed (exit {done.returncode}): {shlex.join(argv)}\n{detail}")
    return done.stdout


def build_wheel(out_dir: Path) -> Path:
    """The wheel, built from a copy of the sources so the checkout gets no build/ or egg-info."""
    with tempfile.TemporaryDirectory(prefix="nvdp-wheel-") as tmp:
        work = Path(tmp)
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(ROOT / name, work / name)
        shutil.copytree(
            ROOT / "src", work / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
        )
        out_dir.mkdir(parents=True, exist_ok=True)
        run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
             "--wheel-dir", str(out_dir), str(work)], "building the wheel")  # fmt: skip
    wheels = sorted(out_dir.glob("nvdp-*.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        raise BuildError(f"no wheel in {out_dir}")
    return wheels[-1]


def add_stand_ins(rootfs: Path, cc: str = "gcc") -> None:
    """The stand-in NVML with every node profile (each as JSON with its sysfs tree, where profile_env
    points), nvidia-cuda-mps-control and nvidia-smi, in `rootfs`."""
    sys.path.insert(0, str(ROOT))
    from sim.nvml import LIBRARY_NAME, list_profiles, profile_as_json, resolve_profile
    from sim.nvml import SIM_DIR as NVML_SOURCES
    from sim.nvml.procfs import write_proc_tree
    from sim.nvml.sysfs import write_sysfs_tree

    target = rootfs / SIM_DIR.lstrip("/")
    target.mkdir(parents=True, exist_ok=True)
    run([cc, "-O2", "-Wall", "-shared", "-fPIC", "-fvisibility=hidden", '-DNVML_SIM_TO_JSON="/nonexistent"',
         f"-Wl,-soname,{LIBRARY_NAME}", "-o", str(target / LIBRARY_NAME),
         str(NVML_SOURCES / "nvml_sim.c"), str(NVML_SOURCES / "json.c"), "-lpthread"],
        "compiling the stand-in NVML")  # fmt: skip
    write_proc_tree(target / "proc")
    for profile in list_profiles():
        paths = {key: rootfs / value.lstrip("/") for key, value in profile_env(profile).items()}
        paths["NVML_SIM_PROFILE"].parent.mkdir(parents=True, exist_ok=True)
        # JSON, so the library never needs Python to read it.
        profile_as_json(resolve_profile(profile), paths["NVML_SIM_PROFILE"])
        gpus = json.loads(paths["NVML_SIM_PROFILE"].read_text())["gpus"]
        write_sysfs_tree(gpus, paths["NVDP_SYSFS_ROOT"])
    bin_dir = rootfs / "usr/local/bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for source in (ROOT / "sim/mps/nvidia-cuda-mps-control", ROOT / "sim/nvidia-smi"):
        shutil.copy(source, bin_dir / source.name)
        (bin_dir / source.name).chmod(0o755)


def packer_arguments(spec: ImageSpec, extra_env: dict[str, str]) -> list[str]:
    """image-from-rootfs.sh options that give the image the Dockerfile's start-up settings."""
    if spec.user not in (None, "root", "0", "0:0"):
        raise BuildError(f"USER {spec.user}: the kit's packer writes no user; images run as root")
    args: list[str] = []
    if spec.entrypoint is not None:
        args += ["--entrypoint", json.dumps(spec.entrypoint)]
    if spec.cmd is not None:
        args += ["--cmd", json.dumps(spec.cmd)]
    for key, value in {**spec.env, **extra_env}.items():
        args += ["--env", f"{key}={value}"]
    if spec.workdir:
        args += ["--workdir", spec.workdir]
    return args


@dataclass(frozen=True)
class BuiltImage:
    name: str  # "plugin"
    ref: str  # docker.io/local/nvdp-plugin:0.1.0
    archive: Path
    reused: bool


def archive_path(k8s_dir: Path, ref: str) -> Path:
    """Where image-from-rootfs.sh writes the docker-archive of `ref` (its naming rule)."""
    repository, tag = ref.rsplit(":", 1)
    safe_tag = "".join(c if c.isalnum() or c in "._-" else "_" for c in tag)
    return k8s_dir / "img" / f"{repository.rsplit('/', 1)[-1]}_{safe_tag}.tar"


def containerd_images() -> set[str]:
    done = subprocess.run(["ctr", "-n", "k8s.io", "images", "ls", "-q"], capture_output=True, text=True,
                          check=False)  # fmt: skip
    return set(done.stdout.split()) if done.returncode == 0 else set()


KEEP_BUILDS = 3


def prune(k8s_dir: Path, ref: str, present: set[str]) -> None:
    """Drop older builds of this repository (archives this builder stamped, containerd's copies), keeping
    the newest few: checkouts of different branches take turns on one kit without rebuilding each time."""
    repository = ref.rsplit(":", 1)[0]
    keep = archive_path(k8s_dir, ref)
    stamps = sorted(keep.parent.glob(f"{repository.rsplit('/', 1)[-1]}_*.source"),
                    key=lambda p: p.stat().st_mtime, reverse=True)  # fmt: skip
    kept = {keep} | {stamp.with_suffix(".tar") for stamp in stamps[:KEEP_BUILDS]}
    for stamp in stamps:
        archive = stamp.with_suffix(".tar")
        if archive not in kept:
            archive.unlink(missing_ok=True)
            stamp.unlink(missing_ok=True)
    stale = [r for r in present if r.rsplit(":", 1)[0] == repository and archive_path(k8s_dir, r) not in kept]
    if stale:
        subprocess.run(["ctr", "-n", "k8s.io", "images", "rm", *stale], capture_output=True, check=False)


def base_rootfs(kit: Path, wheel: Path, work: Path, digest: str, rootfs: Path, env: dict[str, str]) -> None:
    """`rootfs`: the kit's Python base with the wheel installed. Both images, the release ones and the
    stand-in ones, start from the same one, so it is made once per source digest and copied (`cp -a`,
    0.75 s) instead of installed again (python-base.sh, 9.5 s per image on this machine)."""
    cached = work / f"base-rootfs-{digest[:12]}"
    if not cached.is_dir():
        for old in work.glob("base-rootfs-*"):
            shutil.rmtree(old, ignore_errors=True)
        partial = work / f".partial-{cached.name}"
        shutil.rmtree(partial, ignore_errors=True)
        run(["bash", str(kit / "python-base.sh"), str(partial), str(wheel)], "installing the wheel",
            env=env)  # fmt: skip
        partial.rename(cached)
    shutil.rmtree(rootfs, ignore_errors=True)
    run(["cp", "-a", str(cached), str(rootfs)], f"copying the base into {rootfs}")


def build_images(
    kit: Path,
    repository_prefix: str = "docker.io/local",
    tag: str | None = None,
    stand_ins: bool = False,
    work_dir: Path | None = None,
    log: bool = True,
) -> dict[str, BuiltImage]:
    """Build (or reuse) both images and import them into the kit's containerd; returns them by name."""
    if os.geteuid() != 0:
        raise BuildError("the kit's python-base.sh and image-from-rootfs.sh need root")
    k8s_dir = Path(os.environ.get("K8S_DIR", "/tmp/nvdp-k8s"))
    env = {**os.environ, "K8S_DIR": str(k8s_dir)}
    suffix = STAND_IN_SUFFIX if stand_ins else ""
    digest = source_digest([suffix, repository_prefix])
    # Release images carry the chart's appVersion; test images a content hash, so pods of a rebuilt
    # image get a new pod spec and are recreated.
    tag = tag or (f"{app_version()}-{digest[:12]}" if stand_ins else app_version())
    work = work_dir or ROOT / ".build" / "kit-images"
    present = containerd_images()
    built: dict[str, BuiltImage] = {}
    wheel: Path | None = None
    for name, image in IMAGES.items():
        ref = f"{repository_prefix}/{image}{suffix}:{tag}"
        archive = archive_path(k8s_dir, ref)
        stamp = archive.with_suffix(".source")
        if archive.exists() and stamp.exists() and stamp.read_text() == digest:
            if ref not in present:
                run(["ctr", "-n", "k8s.io", "images", "import", str(archive)], f"importing {archive}")
            built[name] = BuiltImage(name, ref, archive, reused=True)
            continue
        spec = read_dockerfile(ROOT / "images" / name / "Dockerfile")
        wheel = wheel or build_wheel(work / "dist")
        rootfs = work / f"rootfs-{name}"
        base_rootfs(kit, wheel, work, source_digest([repository_prefix]), rootfs, env)
        if stand_ins:
            add_stand_ins(rootfs)
        run(["bash", str(kit / "image-from-rootfs.sh"), str(rootfs), ref,
             *packer_arguments(spec, SIM_ENV if stand_ins else {})], f"packing {ref}", env=env)  # fmt: skip
        shutil.rmtree(rootfs, ignore_errors=True)
        stamp.write_text(digest)
        prune(k8s_dir, ref, present)
        built[name] = BuiltImage(name, ref, archive, reused=False)
        if log:
            print(f"built {ref}", file=sys.stderr)
    return built


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--kit",
        type=Path,
        default=ROOT.parent / "shared" / "k8s",
        help="the k8s kit's directory (python-base.sh, image-from-rootfs.sh)",
    )
    parser.add_argument("--repository-prefix", default="docker.io/local")
    parser.add_argument(
        "--tag", help="default: the chart's appVersion (with --stand-ins: plus a hash of the sources)"
    )
    parser.add_argument(
        "--stand-ins",
        action="store_true",
        help="build <image>-sim: plus the stand-in NVML with every node profile, MPS control and nvidia-smi",
    )
    args = parser.parse_args(argv)
    try:
        images = build_images(args.kit, args.repository_prefix, args.tag, args.stand_ins)
    except BuildError as err:
        print(f"kit_images: {err}", file=sys.stderr)
        return 1
    for image in images.values():
        print(image.ref)
    return 0


if __name__ == "__main__":
    sys.exit(main())
