"""CDI specs on a real node: the plugin writes them, containerd injects what they say, a switch rewrites them.

The node's containerd (2.x, CDI on) resolves the names the plugin hands out through the spec the
plugin writes to /var/run/cdi/k8s.device-plugin.nvidia.com-gpu.json. No GPU: the images carry the
stand-in NVML (one T4); the driver files the spec points at are a fake driver root the test makes on
the host, with real ELF libraries (compiled here, the T4 profile's driver version) and device nodes:

    <dir>/driver/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15   (SONAME libcuda.so.1; cuInit,
        cuDriverGetVersion), libcuda.so.1 -> it, libcuda.so -> libcuda.so.1, and two more versioned
        libraries with their SONAME links (no libnvidia-ml: the plugin would load it instead of the
        image's stand-in NVML)
    <dir>/driver/usr/bin/nvidia-smi                                   a shell stub
    <dir>/driver/dev/nvidia0 (c 195:0), dev/nvidiactl (c 195:255)
    <dir>/hook/nvidia-cdi-hook                                        a stand-in hook: records its
        arguments in <dir>/hook-calls.log and exits 0 (containerd's runc runs it on the host)
    /dev/nvidia0, /dev/nvidiactl on the host (mknod; only when absent, and removed at the end)

Installed with `nvidiaDriverRoot=<dir>/driver` (mounted at /driver-root in the plugin, where it
finds the libraries and, as the root has a dev/, stats the device nodes), `nvidiaDevRoot=/` (so the
spec's device nodes are the host's /dev/nvidia0 and /dev/nvidiactl) and `cdi.nvidiaHookPath` = the
stand-in hook. Three per-node config entries (`--set-file config.map.<entry>=`), picked by the
`nvidia.com/device-plugin.config` label: uuid (the default), index, no-hooks (index, cdiDisableHooks
[all]).

The story, each step on the one before:
1. install with deviceListStrategy=cdi-cri: the spec exists (mode 0644) and was written before the
   kubelet got the plugin's registration; it names the T4's UUID and `all`, the host's device nodes,
   the fake root's libraries (host paths under the fake root, container paths under /), the common env
   (NVIDIA_VISIBLE_DEVICES=void, NVIDIA_CTK_LIBCUDA_DIR) and createContainer hooks at the hook path;
   `nvdp doctor` in the plugin pod finds every name resolving and the hook on the host.
2. a pod asking for nvidia.com/gpu: 1 runs; containerd took the name from the CRI's CDIDevices; the
   pod sees /dev/nvidia0 (c 195:0) and /dev/nvidiactl, every env entry of the spec, the libraries
   mounted read-only (libcuda loads and answers cuDriverGetVersion), the stub nvidia-smi; the hooks ran.
3. upgrade to deviceListStrategy=cdi-annotations: read every 50 ms while the plugin pod is replaced,
   the spec is always there with the same names; a pod gets the same, containerd took the name from
   the container's annotation.
4. label -> index: the spec's names become `0` and `all` (no UUID left) in the same plugin pod; read
   every 50 ms meanwhile, the spec is never torn and names only the old set, the old set plus the new
   one, or the new set (a name the kubelet may hand out always resolves); still 0644, no temp file
   left; the doctor looks up `gpu=0` (the node's entry) and finds it; a new pod gets `gpu=0`.
5. label -> no-hooks: a spec without hooks, libcuda also mounted at libcuda.so.1: a pod loads
   libcuda.so.1 by its SONAME with no hook having run; the doctor says no hook is needed.
6. uninstall: the spec stays (a container restarted later must still resolve its devices); the
   fixture removes it, with everything else the test made, whatever the outcome.
"""

from __future__ import annotations

import base64
import json
import shlex
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from .e2e_cluster import DATA, Cluster, Images, KubeletView, Release, Timings, device_plugin_lines, gpu_pod

SCENARIO = "CDI specs"
pytestmark = pytest.mark.incremental
T4_UUID = "GPU-a4d98c34-f034-41fa-9519-b5bab976e4df"
DRIVER_VERSION = "550.54.15"  # sim/profiles/t4.yaml
CUDA_VERSION = 12040  # what the fake libcuda's cuDriverGetVersion answers (the profile's 12.4)
LABEL = "nvidia.com/device-plugin.config"
VENDOR = "k8s.device-plugin.nvidia.com"
KIND = f"{VENDOR}/gpu"
CDI_DIR = "/var/run/cdi"
SPEC = f"{CDI_DIR}/{VENDOR}-gpu.json"
LIBDIR = "/usr/lib/x86_64-linux-gnu"
STORY = "nvdp-e2e-story=cdi"  # the workload pods' label
CDI_VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")
# name (the file is <name>.so.<driver version>) -> SONAME; libcuda exports what the pods call.
LIBRARIES = {
    "libcuda": "libcuda.so.1",
    "libnvidia-ptxjitcompiler": "libnvidia-ptxjitcompiler.so.1",
    "libnvidia-nvvm": "libnvidia-nvvm.so.4",
}
LIBCUDA_C = f"""
int cuInit(unsigned int flags) {{ (void)flags; return 0; }}
int cuDriverGetVersion(int *version) {{ *version = {CUDA_VERSION}; return 0; }}
"""
OTHER_C = "int nvdp_e2e_stand_in(void) { return 0; }\n"
SMI_MARK = "nvdp-e2e stand-in nvidia-smi from the fake driver root"
# Host device nodes the spec points at (nvidiaDevRoot=/): (name, minor), major 195.
DEV_NODES = (("nvidia0", 0), ("nvidiactl", 255))


@dataclass
class HostSetup:
    """What the test made on the node, so that teardown removes exactly that."""

    dir: str = ""
    made_nodes: list[str] = field(default_factory=list)

    @property
    def driver_root(self) -> str:
        return f"{self.dir}/driver"

    @property
    def hook(self) -> str:
        return f"{self.dir}/hook/nvidia-cdi-hook"

    @property
    def hook_log(self) -> str:
        return f"{self.dir}/hook-calls.log"


def compile_library(source: str, soname: str) -> bytes:
    """A real x86-64 shared object with `soname`, built with the host's gcc (the images are bookworm too)."""
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp, "lib.c"), Path(tmp, "lib.so")
        src.write_text(source)
        done = subprocess.run(["gcc", "-shared", "-fPIC", "-s", f"-Wl,-soname,{soname}", "-o", str(out),
                               str(src)], capture_output=True, text=True, check=False)  # fmt: skip
        assert done.returncode == 0, f"gcc failed: {done.stderr}"
        return out.read_bytes()


def put_file(cluster: Cluster, path: str, data: bytes, mode: str = "0644") -> None:
    """Write `data` to `path` on the node (through the command line: works for every backend)."""
    encoded = base64.b64encode(data).decode()
    cluster.host(f"echo {encoded} | base64 -d > {shlex.quote(path)} && chmod {mode} {shlex.quote(path)}")


def make_host(cluster: Cluster, host: HostSetup) -> None:
    host.dir = cluster.host("mktemp -d /tmp/nvdp-e2e-cdi.XXXXXX").stdout.strip()
    assert host.dir.startswith("/tmp/nvdp-e2e-cdi."), host.dir
    root, lib = host.driver_root, f"{host.driver_root}{LIBDIR}"
    cluster.host(f"chmod 755 {host.dir} && mkdir -p {lib} {root}/usr/bin {root}/dev {host.dir}/hook")
    for name, soname in LIBRARIES.items():
        data = compile_library(LIBCUDA_C if name == "libcuda" else OTHER_C, soname)
        put_file(cluster, f"{lib}/{name}.so.{DRIVER_VERSION}", data)
        cluster.host(f"ln -s {name}.so.{DRIVER_VERSION} {lib}/{soname} && ln -s {soname} {lib}/{name}.so")
    put_file(cluster, f"{root}/usr/bin/nvidia-smi", f"#!/bin/sh\necho '{SMI_MARK}'\n".encode(), "0755")
    hook = (
        "#!/bin/sh\n"
        "# nvdp e2e: a stand-in nvidia-cdi-hook. Records its arguments, changes nothing.\n"
        "cat >/dev/null\n"
        f'echo "$*" >> {host.hook_log}\n'
        "exit 0\n"
    )
    put_file(cluster, host.hook, hook.encode(), "0755")
    for name, minor in DEV_NODES:
        cluster.host(f"mknod -m 666 {root}/dev/{name} c 195 {minor}")
        path = f"/dev/{name}"
        made = cluster.host(f"[ -e {path} ] || {{ mknod -m 666 {path} c 195 {minor} && echo made; }}").stdout
        if made.strip() == "made":
            host.made_nodes.append(path)
        else:  # someone's node (a self-test's, a real driver's): used as it is, if it is the right one
            kind = cluster.host(f"stat -c '%F %t:%T' {path}").stdout.strip()
            assert kind == f"character special file c3:{minor:x}", f"{path} on the node is {kind}"


def remove_host(cluster: Cluster, host: HostSetup) -> None:
    # The plugin's own spec files: uninstall leaves them by design; nobody else uses them while the
    # suite holds the node.
    cluster.host(f"rm -f {CDI_DIR}/{VENDOR}-*.json", check=False)
    for path in host.made_nodes:
        cluster.host(f"rm -f {path}", check=False)
    if host.dir.startswith("/tmp/nvdp-e2e-cdi."):
        cluster.host(f"rm -rf {host.dir}", check=False)


@pytest.fixture(scope="module")
def host(cluster: Cluster) -> Iterator[HostSetup]:
    setup = HostSetup()
    try:
        # A spec left from an earlier run would hide one this run fails to write.
        cluster.host(f"rm -f {CDI_DIR}/{VENDOR}-*.json")
        make_host(cluster, setup)
        yield setup
    finally:
        remove_host(cluster, setup)


@pytest.fixture(scope="module")
def release(cluster: Cluster, images: Images, host: HostSetup) -> Iterator[Release]:
    cluster.label({"nvidia.com/gpu.present": "true", LABEL: None})
    release = Release(cluster, images, "nvdp-cdi", "nvdp-e2e-cdi")
    yield release
    delete_workloads(cluster)
    release.uninstall()
    # Gone before the host fixture removes the spec and the driver root the plugin mounts.
    try:
        cluster.wait_for("the release's pods to go", lambda: not release.pods(), 90)
    finally:
        cluster.label({"nvidia.com/gpu.present": None, LABEL: None})
        cluster.kubectl("delete", "namespace", release.namespace, "--wait=false", check=False)


def values(host: HostSetup, strategy: str) -> list[str]:
    return [
        "--set-file", f"config.map.uuid={DATA / 'cdi-uuid.yaml'}",
        "--set-file", f"config.map.index={DATA / 'cdi-index.yaml'}",
        "--set-file", f"config.map.no-hooks={DATA / 'cdi-no-hooks.yaml'}",
        "--set", "config.default=uuid",
        "--set", f"deviceListStrategy={strategy}",
        "--set", f"nvidiaDriverRoot={host.driver_root}",
        "--set", "nvidiaDevRoot=/",
        "--set", f"cdi.nvidiaHookPath={host.hook}",
    ]  # fmt: skip


# --- reading the spec on the node


def read_spec(cluster: Cluster) -> dict[str, Any] | None:
    """The spec as JSON; None while there is no file. A torn file fails the JSON parse (ValueError)."""
    done = cluster.host(f"cat {SPEC}", check=False)
    if done.returncode != 0:
        return None
    spec: dict[str, Any] = json.loads(done.stdout)
    return spec


def names(spec: dict[str, Any]) -> frozenset[str]:
    return frozenset(device["name"] for device in spec.get("devices") or [])


def device(spec: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [d for d in spec["devices"] if d["name"] == name]
    edits: dict[str, Any] = found.get("containerEdits") or {}
    return edits


def spec_mtime(cluster: Cluster) -> float:
    """The spec's modification time as seconds since midnight on the node's clock (the kubelet's)."""
    stamp = cluster.host(f"date -r {SPEC} +%H:%M:%S.%N").stdout.strip()
    hours, minutes, seconds = stamp.split(":")
    return int(hours) * 3600 + int(minutes) * 60 + float(seconds)


def assert_spec_file(cluster: Cluster) -> None:
    """The spec is a plain file, mode 0644, and the writer left nothing else of nvdp's in the directory (no
    temp file, no other class: the node has no IMEX channel and no gated mode)."""
    assert cluster.host(f"stat -c '%F %a' {SPEC}").stdout.strip() == "regular file 644"
    listing = cluster.host(f"ls -A {CDI_DIR}").stdout.split()
    ours = [n for n in listing if n.startswith((VENDOR, ".nvdp")) or n.endswith(".tmp")]
    assert ours == [SPEC.rsplit("/", 1)[1]], f"{CDI_DIR} holds {listing}"


def assert_spec(spec: dict[str, Any], host: HostSetup, want: frozenset[str], hooks: bool = True) -> None:
    """What the gpu spec must say for the fake driver root, whatever the device names."""
    text = json.dumps(spec, indent=1)
    assert names(spec) == want, f"devices {sorted(names(spec))}, wanted {sorted(want)}:\n{text}"
    assert spec["kind"] == KIND, text
    assert spec["cdiVersion"] in CDI_VERSIONS and spec["cdiVersion"] >= "0.5.0", (
        f"cdiVersion {spec['cdiVersion']}: host paths and names starting with a digit need 0.5.0"
    )
    every = [spec.get("containerEdits") or {}] + [d.get("containerEdits") or {} for d in spec["devices"]]
    host_paths = [x["hostPath"] for e in every for x in (e.get("deviceNodes") or []) + (e.get("mounts") or [])
                  if "hostPath" in x]  # fmt: skip
    inside = [path for path in host_paths if path.startswith("/driver-root")]
    assert not inside, f"host paths name the plugin's container path /driver-root: {inside}"
    common = spec.get("containerEdits") or {}
    env = common.get("env") or []
    assert "NVIDIA_VISIBLE_DEVICES=void" in env, env
    assert f"NVIDIA_CTK_LIBCUDA_DIR={LIBDIR}" in env, env
    (gpu,) = want - {"all"}
    for name in (gpu, "all"):
        nodes = {node["path"]: node for node in device(spec, name).get("deviceNodes") or []}
        assert "/dev/nvidia0" in nodes, f"device {name} has no /dev/nvidia0:\n{text}"
        node = nodes["/dev/nvidia0"]
        assert node.get("hostPath", "/dev/nvidia0") == "/dev/nvidia0", "nvidiaDevRoot=/: the host's node"
        assert (node.get("major"), node.get("minor", 0)) == (195, 0), node
    ctl = {node["path"]: node for node in common.get("deviceNodes") or []}.get("/dev/nvidiactl")
    assert ctl is not None, f"no /dev/nvidiactl in the common edits:\n{text}"
    assert ctl.get("hostPath", "/dev/nvidiactl") == "/dev/nvidiactl" and ctl.get("minor") == 255, ctl
    mounts = {m["containerPath"]: m for m in common.get("mounts") or []}
    files = [f"{LIBDIR}/{name}.so.{DRIVER_VERSION}" for name in LIBRARIES] + ["/usr/bin/nvidia-smi"]
    for path in files:
        assert path in mounts, f"{path} is not mounted:\n{text}"
        assert mounts[path]["hostPath"] == f"{host.driver_root}{path}", mounts[path]
        assert "ro" in mounts[path].get("options", []), mounts[path]
    all_hooks = [h for edits in [common] + [device(spec, n) for n in want] for h in edits.get("hooks") or []]
    if hooks:
        called = {h["args"][1] for h in all_hooks if len(h.get("args") or []) > 1}
        assert {"create-symlinks", "update-ldcache"} <= called, f"hooks: {sorted(called)}:\n{text}"
        for hook in all_hooks:
            assert hook["hookName"] == "createContainer" and hook["path"] == host.hook, hook
            assert hook["args"][0] == "nvidia-cdi-hook", hook
    else:
        assert not all_hooks, f"cdiDisableHooks [all] and still hooks:\n{text}"
        soname = f"{LIBDIR}/{LIBRARIES['libcuda']}"
        assert soname in mounts, f"hook-less: libcuda is not also mounted at its SONAME path:\n{text}"
        assert mounts[soname]["hostPath"].startswith(f"{host.driver_root}{LIBDIR}/libcuda.so"), mounts[soname]


class SpecWatcher:
    """Reads the spec every `every` seconds on a background thread: each distinct read, in order."""

    def __init__(self, cluster: Cluster, every: float = 0.05) -> None:
        self.cluster, self.every = cluster, every
        self.seen: list[frozenset[str] | str] = []  # names, or "missing" / "torn: ..."
        self.reads = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="spec watcher", daemon=True)

    def __enter__(self) -> SpecWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                spec = read_spec(self.cluster)
                seen: frozenset[str] | str = "missing" if spec is None else names(spec)
            except ValueError as err:
                seen = f"torn: {err}"
            self.reads += 1
            if not self.seen or self.seen[-1] != seen:
                self.seen.append(seen)
            self._stop.wait(self.every)


# --- workload pods


PROBE = rf"""
import ctypes, json, os, stat, subprocess
out = {{"env": sorted(f"{{k}}={{v}}" for k, v in os.environ.items())}}
for path in ("/dev/nvidia0", "/dev/nvidiactl"):
    try:
        st = os.stat(path)
        out[path] = [stat.S_ISCHR(st.st_mode), os.major(st.st_rdev), os.minor(st.st_rdev)]
    except OSError as err:
        out[path] = str(err)
def cuda(name):
    try:
        lib = ctypes.CDLL(name)
        version = ctypes.c_int()
        return [lib.cuInit(0), lib.cuDriverGetVersion(ctypes.byref(version)), version.value]
    except OSError as err:
        return str(err)
out["versioned"] = cuda("{LIBDIR}/libcuda.so.{DRIVER_VERSION}")
out["soname"] = cuda("libcuda.so.1")
try:
    out["smi"] = subprocess.run(["/usr/bin/nvidia-smi"], capture_output=True, text=True).stdout
except OSError as err:
    out["smi"] = str(err)
out["mounts"] = [line.split()[1:4] for line in open("/proc/mounts")]
print(json.dumps(out))
"""


def delete_workloads(cluster: Cluster) -> None:
    cluster.kubectl("delete", "pods", "-n", "default", "-l", STORY, "--wait=true", check=False, timeout=90)


def run_pod(cluster: Cluster, images: Images, timings: Timings, name: str, step: str) -> dict[str, Any]:
    """A pod asking for one GPU: created, Ready (recorded), probed from inside, deleted; what it saw."""
    cluster.apply(gpu_pod(name, images.plugin, labels={"nvdp-e2e-story": "cdi"}))

    def ready() -> bool:
        pod = cluster.kubectl_json("get", "pod", "-n", "default", name)
        conditions = pod["status"].get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def diagnose() -> str:
        pod = cluster.kubectl_json("get", "pod", "-n", "default", name)
        events = cluster.kubectl("get", "events", "-n", "default", "--field-selector",
                                 f"involvedObject.name={name}", check=False).stdout  # fmt: skip
        return f"{json.dumps(pod['status'], indent=1)}\n{events}"

    try:
        _, seconds = cluster.wait_for(f"pod {name} Ready", ready, timeout=90, diagnose=diagnose)
        timings.add(SCENARIO, step, seconds)
        seen: dict[str, Any] = json.loads(cluster.exec("default", name, "python", "-c", PROBE))
    finally:
        delete_workloads(cluster)
    return seen


def assert_pod_saw(seen: dict[str, Any], spec: dict[str, Any]) -> None:
    assert seen["/dev/nvidia0"] == [True, 195, 0], f"/dev/nvidia0 in the pod: {seen['/dev/nvidia0']}"
    assert seen["/dev/nvidiactl"] == [True, 195, 255], f"/dev/nvidiactl in the pod: {seen['/dev/nvidiactl']}"
    missing = [kv for kv in (spec.get("containerEdits") or {}).get("env") or [] if kv not in seen["env"]]
    assert not missing, f"the spec's env is not in the pod: {missing}; pod env {seen['env']}"
    assert seen["versioned"] == [0, 0, CUDA_VERSION], f"the mounted libcuda: {seen['versioned']}"
    assert seen["smi"].strip() == SMI_MARK, f"/usr/bin/nvidia-smi: {seen['smi']!r}"
    mounts = {target: (fstype, options) for target, fstype, options in seen["mounts"]}
    libcuda = f"{LIBDIR}/libcuda.so.{DRIVER_VERSION}"
    assert libcuda in mounts and "ro" in mounts[libcuda][1].split(","), f"{libcuda}: {mounts.get(libcuda)}"


def runtime_names(cluster: Cluster, mark: str | None, source: str) -> list[str]:
    """The CDI names containerd took from `source` ("CRI Config.CDIDevices" or "annotations") after mark,
    from its debug log; [] where the backend has none (then nothing is asserted about it)."""
    if mark is None:
        return []
    wanted = f"CDI devices from {source}: ["
    out = []
    for line in cluster.runtime_log_since(mark).splitlines():
        if wanted in line:
            out += line.split(wanted, 1)[1].split("]", 1)[0].split()
    return out


def hook_calls(cluster: Cluster, host: HostSetup) -> list[str]:
    return cluster.host(f"cat {host.hook_log} 2>/dev/null || true").stdout.splitlines()


def doctor_cdi(cluster: Cluster, release: Release) -> dict[str, dict[str, Any]]:
    """`nvdp doctor --json` in the plugin pod: its two CDI findings (the names the plugin returns
    resolve in the specs; the hook exists on the host), by check id."""
    (pod,) = release.pods("device-plugin")
    done = cluster.kubectl("exec", "-n", release.namespace, pod["metadata"]["name"], "--", "nvdp", "doctor",
                           "--json", check=False)  # fmt: skip
    checks = {c["check"]: c for c in json.loads(done.stdout)["checks"]}
    assert "cdi" in checks and "cdi-hook" in checks, f"no CDI findings in the report: {sorted(checks)}"
    return {name: checks[name] for name in ("cdi", "cdi-hook")}


def plugin_pod(release: Release) -> tuple[str, int]:
    (pod,) = release.pods("device-plugin")
    restarts = sum(c.get("restartCount", 0) for c in pod["status"].get("containerStatuses") or [])
    return pod["metadata"]["uid"], restarts


Seen = list[frozenset[str] | str]


def switch(cluster: Cluster, release: Release, timings: Timings, entry: str, done: str,
           ok: Callable[[dict[str, Any]], bool]) -> tuple[dict[str, Any], Seen]:  # fmt: skip
    """Label the node for `entry`; wait until the spec satisfies `ok`; the spec and every read of it."""
    before = read_spec(cluster)
    assert before is not None
    uid, _ = plugin_pod(release)
    with SpecWatcher(cluster) as watcher:
        start = time.monotonic()
        cluster.label({LABEL: entry})

        def written() -> dict[str, Any] | None:
            spec = read_spec(cluster)
            return spec if spec is not None and ok(spec) else None

        def diagnose() -> str:
            return f"spec now:\n{json.dumps(read_spec(cluster), indent=1)}\n{release.logs()}"

        what = f"the spec {done}"
        spec, _ = cluster.wait_for(what, written, timeout=90, every=0.1, diagnose=diagnose)
        timings.add(SCENARIO, f"label {LABEL}={entry} -> spec {done}", time.monotonic() - start)
        time.sleep(1.0)  # a write that should not come after the new spec has a second to show
    assert plugin_pod(release) == (uid, 0), "the plugin pod was replaced or restarted for the switch"
    assert watcher.reads > 10, f"too few reads of the spec: {watcher.reads}"
    assert_spec_file(cluster)
    return spec, watcher.seen


# --- the story


def test_install_cdi_cri_writes_the_spec_before_registering(
    cluster: Cluster, release: Release, host: HostSetup, timings: Timings
) -> None:
    mark = cluster.kubelet_log_mark()
    with timings.measure(SCENARIO, "helm install --wait (cdi-cri, fake driver root, stub hook)"):
        release.install(*values(host, "cdi-cri"))
    seconds = cluster.wait_allocatable(1, namespace=release.namespace)
    timings.add(SCENARIO, "installed -> allocatable 1", seconds)
    spec = read_spec(cluster)
    assert spec is not None, f"no {SPEC} on the node once allocatable is 1:\n{release.logs()}"
    print(f"{SPEC} after the install:\n{json.dumps(spec, indent=1)}")
    assert_spec_file(cluster)
    assert_spec(spec, host, frozenset({T4_UUID, "all"}))
    registered = [
        line.at
        for line in KubeletView(device_plugin_lines(cluster.kubelet_log_since(mark))).lines
        if line.message.startswith("Got registration request")
    ]
    assert registered, "the kubelet logged no registration of nvidia.com/gpu"
    written = spec_mtime(cluster)
    timings.add(SCENARIO, "spec written -> the kubelet's registration request", registered[0] - written)
    assert written <= registered[0], (
        f"the spec was written {written - registered[0]:.3f} s after the kubelet got the registration"
    )
    assert "Traceback" not in release.logs()
    found = doctor_cdi(cluster, release)
    assert [f["status"] for f in found.values()] == ["PASS", "PASS"], found


def test_cdi_cri_pod_gets_the_spec(
    cluster: Cluster, release: Release, host: HostSetup, images: Images, timings: Timings
) -> None:
    spec = read_spec(cluster)
    assert spec is not None
    mark, calls = cluster.runtime_log_mark(), len(hook_calls(cluster, host))
    seen = run_pod(cluster, images, timings, "cdi-cri-gpu", "cdi-cri: pod created -> Ready")
    assert_pod_saw(seen, spec)
    if mark is not None:
        assert f"{KIND}={T4_UUID}" in runtime_names(cluster, mark, "CRI Config.CDIDevices")
    ran = hook_calls(cluster, host)[calls:]
    assert any(call.startswith("update-ldcache") for call in ran), f"the hooks that ran: {ran}"
    assert any(call.startswith("create-symlinks") for call in ran), f"the hooks that ran: {ran}"


def test_upgrade_to_cdi_annotations(
    cluster: Cluster, release: Release, host: HostSetup, images: Images, timings: Timings
) -> None:
    uid, _ = plugin_pod(release)
    uuid = frozenset({T4_UUID, "all"})
    # The plugin pod is replaced: the spec stays (a container started meanwhile still resolves).
    with SpecWatcher(cluster) as watcher:
        with timings.measure(SCENARIO, "helm upgrade --wait (cdi-annotations)"):
            release.upgrade(*values(host, "cdi-annotations"))
        cluster.wait_for("the new plugin pod", lambda: plugin_pod(release)[0] != uid, 90)
        release.wait_ready()
        cluster.wait_allocatable(1, namespace=release.namespace)
    assert watcher.seen == [uuid], f"the spec across the upgrade: {watcher.seen}"
    spec = read_spec(cluster)
    assert spec is not None, "the spec is gone after the upgrade"
    assert_spec(spec, host, uuid)
    assert_spec_file(cluster)
    mark, calls = cluster.runtime_log_mark(), len(hook_calls(cluster, host))
    seen = run_pod(cluster, images, timings, "cdi-annotations-gpu", "cdi-annotations: pod created -> Ready")
    assert_pod_saw(seen, spec)
    if mark is not None:
        assert f"{KIND}={T4_UUID}" in runtime_names(cluster, mark, "annotations")
        assert f"{KIND}={T4_UUID}" not in runtime_names(cluster, mark, "CRI Config.CDIDevices")
    assert hook_calls(cluster, host)[calls:], "no hook ran for the pod"


def test_label_switch_to_index_rewrites_the_spec(
    cluster: Cluster, release: Release, host: HostSetup, images: Images, timings: Timings
) -> None:
    old, new = frozenset({T4_UUID, "all"}), frozenset({"0", "all"})
    spec, seen = switch(cluster, release, timings, "index", "names 0, all", lambda spec: names(spec) == new)
    print(f"spec reads across uuid -> index: {[sorted(s) if isinstance(s, frozenset) else s for s in seen]}")
    assert all(s in (old, old | new, new) for s in seen), (
        f"the spec named other sets (or was torn or missing) across the switch: {seen}"
    )
    assert seen[-1] == new, f"the spec did not stay at {sorted(new)}: {seen}"
    assert_spec(spec, host, new)
    assert cluster.allocatable() == 1
    # The doctor follows the node's entry: it looks up gpu=0, not the default entry's UUID.
    found = doctor_cdi(cluster, release)
    assert [f["status"] for f in found.values()] == ["PASS", "PASS"], found
    mark = cluster.runtime_log_mark()
    seen_pod = run_pod(cluster, images, timings, "cdi-index-gpu", "index: pod created -> Ready")
    assert_pod_saw(seen_pod, spec)
    if mark is not None:
        assert runtime_names(cluster, mark, "annotations") == [f"{KIND}=0"]


def test_label_switch_to_no_hooks(
    cluster: Cluster, release: Release, host: HostSetup, images: Images, timings: Timings
) -> None:
    new = frozenset({"0", "all"})

    def hookless(spec: dict[str, Any]) -> bool:
        every = [spec.get("containerEdits") or {}] + [d.get("containerEdits") or {} for d in spec["devices"]]
        return not any(edits.get("hooks") for edits in every)

    spec, seen = switch(cluster, release, timings, "no-hooks", "without hooks", hookless)
    assert all(s == new for s in seen), f"the names changed on a hooks-only switch: {seen}"
    assert_spec(spec, host, new, hooks=False)
    found = doctor_cdi(cluster, release)
    assert found["cdi"]["status"] == "PASS", found
    assert found["cdi-hook"]["status"] == "PASS" and "not needed" in found["cdi-hook"]["detail"], found
    calls = len(hook_calls(cluster, host))
    seen_pod = run_pod(cluster, images, timings, "cdi-no-hooks-gpu", "no hooks: pod created -> Ready")
    assert_pod_saw(seen_pod, spec)
    assert seen_pod["soname"] == [0, 0, CUDA_VERSION], f"libcuda.so.1 by its SONAME: {seen_pod['soname']}"
    assert hook_calls(cluster, host)[calls:] == [], "a hook ran with cdiDisableHooks [all]"


def test_uninstall_leaves_the_spec(cluster: Cluster, release: Release, host: HostSetup,
                                   timings: Timings) -> None:  # fmt: skip
    before = read_spec(cluster)
    assert before is not None
    with timings.measure(SCENARIO, "helm uninstall --wait"):
        release.uninstall()
    cluster.wait_for("the release's pods to go", lambda: not release.pods(), 90)
    spec = read_spec(cluster)
    assert spec is not None, "uninstall removed the spec: a container restarted later cannot resolve its GPU"
    assert spec == before, "the spec changed at uninstall"
    assert_spec_file(cluster)
