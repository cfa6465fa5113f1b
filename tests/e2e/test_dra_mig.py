"""Dynamic MIG on a real node: MIG devices made when claims are prepared, on one stand-in H100 80GB.

The chart with `dra.enabled=true` and a config entry `flags.migStrategy: dynamic`, the stand-in images
showing `h100-mig-dynamic` (`unsupported.simulatedGpus`: one H100, MIG mode on, no MIG device), the
claim specs pointing at the CDI scenario's fake driver root. The stand-in's MIG state lives below the MPS
root on the host, where this test reads it (and makes a MIG device behind the plugin's back) through the
same library. The story, each step on the one before:
1. install: the node's pool holds one slice of shared counters (`gpu-0-mig`: 8 memory slices, 7 compute
   slices, one `+me` instance) and one of 26 devices: the whole GPU and every placement (7 of 1g.10gb,
   4 of 1g.20gb, 3 of 2g.20gb, 2 of 3g.40gb, 1 of 4g.40gb, 1 of 7g.80gb, 7 of 1g.10gb+me), each
   consuming its counters.
2. claims for 3g.40gb, 2g.20gb and 1g.10gb run together: each pod gets the capability nodes of its own
   MIG device only, the claim's status carries the MIG device's UUID, and the stand-in has those three.
3. a second 3g.40gb claim stays Pending (no free placement); it runs once the first 3g.40gb pod is
   deleted (the scheduler's time and nvdp's prepare time reported apart).
4. a whole-GPU claim is unschedulable while MIG devices exist; once they are gone a whole-GPU pod runs
   (MIG mode turned off), and a MIG claim after it waits for it in turn.
5. the plugin restarted with MIG claims prepared: the new instance keeps them, and after the pods go
   every MIG device is destroyed: nothing leaked.
6. an XID on the GPU reaches the MIG claims' pods (Unhealthy in their status), and clears.
7. a MIG device made behind the plugin's back over a published placement: a claim allocated that
   placement fails to prepare with NVML's cause and the fix, leaving nothing half-made.
8. the kit's control plane is v1.36.2, older than the scheduler fix: each of the three plugin starts
   logged one scale WARNING and recorded one DynamicMigSchedulerCost Event. `flags.migDynamicProfiles:
   [1g.10gb, 3g.40gb]` (helm upgrade, read by the running plugin: no further warning): the pool holds 10
   devices (7 + 2 placements and the whole GPU); a 3g.40gb claim runs, a 2g.20gb claim stays Pending
   with the scheduler's reason.
9. uninstall.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .e2e_cluster import ROOT, SIM_STATE_DIR, Cluster, Images, Release, Timings, story_release
from .test_cdi import DRIVER_VERSION, LIBDIR, LIBRARIES, HostSetup
from .test_dra import claim_host, pod_ready

SCENARIO = "DRA dynamic MIG"
pytestmark = pytest.mark.incremental
DRIVER = "gpu.nvidia.com"
NAMESPACE = "nvdp-e2e-dra-mig-work"
PROFILE = "h100-mig-dynamic"
H100_DRIVER_VERSION = "580.159.04"  # sim/profiles/h100-mig-dynamic.yaml
CLAIM_SPEC_PREFIX = "/var/run/cdi/k8s.gpu.nvidia.com-claim_"
CONFIG = "version: v1\nflags:\n  migStrategy: dynamic\n  mode: dra\n"
OFFERED = "  migDynamicProfiles: [1g.10gb, 3g.40gb]\n"
POD_READY_S = 120
METRICS_PORT = 9445  # the chart's metrics.port


# --- the stand-in's MIG state, read and changed from the host through the same library ----------------


def sim_env() -> dict[str, str]:
    from sim.nvml import build_library

    library = build_library()
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVML_SIM_")}
    env.update({"LD_LIBRARY_PATH": str(library.parent), "NVML_SIM_STATE_DIR": SIM_STATE_DIR,
                "NVML_SIM_PROFILE": str(ROOT / "sim" / "profiles" / f"{PROFILE}.yaml"),
                "NVML_SIM_PYTHON": sys.executable, "PYTHONPATH": str(ROOT)})
    return env


def sim_mig(*args: str) -> Any:
    done = subprocess.run([sys.executable, "-m", "sim.nvml.mig", *args], env=sim_env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)["result"] if done.stdout.strip() else None


def gpu_uuid() -> str:
    from nvdp.inventory.profile import load_profile

    return load_profile(ROOT / "sim" / "profiles" / f"{PROFILE}.yaml").gpus[0].uuid


def live() -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = sim_mig("list", "--uuid", gpu_uuid())
    return found


def live_profiles() -> list[str]:
    return sorted(f"{m['profile']}@{m['start']}" for m in live())


def forget_mig(cluster: Cluster) -> None:
    cluster.host(f"rm -rf {SIM_STATE_DIR}/mig {SIM_STATE_DIR}/mig-mode")


# --- fixtures ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def host(cluster: Cluster) -> Iterator[HostSetup]:
    with claim_host(cluster) as setup:
        lib = f"{setup.driver_root}{LIBDIR}"
        for name in LIBRARIES:
            cluster.host(f"cp {lib}/{name}.so.{DRIVER_VERSION} {lib}/{name}.so.{H100_DRIVER_VERSION}")
        forget_mig(cluster)
        cluster.forget_health()
        yield setup
        forget_mig(cluster)
        cluster.forget_health()


@pytest.fixture(scope="module")
def mig_images(images: Images) -> Images:
    return images.with_profile(PROFILE)  # the suite's images, showing the H100


@pytest.fixture(scope="module")
def release(cluster: Cluster, mig_images: Images, host: HostSetup) -> Iterator[Release]:
    with story_release(cluster, mig_images, "nvdp-dra-mig", "nvdp-e2e-dra-mig", work=[NAMESPACE]) as release:
        yield release


@pytest.fixture(scope="module")
def config_file() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "config.yaml"
        path.write_text(CONFIG)
        yield path


def values(host: HostSetup, config: Path) -> list[str]:
    return ["--set", "dra.enabled=true", "--set", f"nvidiaDriverRoot={host.driver_root}",
            "--set", "nvidiaDevRoot=/", "--set", f"cdi.nvidiaHookPath={host.hook}",
            "--set", "metrics.enabled=true", "--set-file", f"config.map.config={config}"]


# --- the cluster ------------------------------------------------------------------------------------


def slices(cluster: Cluster) -> list[dict[str, Any]]:
    found = cluster.kubectl_json("get", "resourceslices", "--field-selector",
                                 f"spec.nodeName={cluster.node},spec.driver={DRIVER}")["items"]
    return list(found)


def plugin_log(cluster: Cluster, release: Release) -> str:
    return cluster.logs(release.namespace, f"{release.selector},app.kubernetes.io/component=dra-plugin", 300)


def template(name: str, profile: str | None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "mig.nvidia.com" if profile else "gpu.nvidia.com"}
    if profile:
        expression = f"device.attributes['{DRIVER}'].profile == '{profile}'"
        exactly["selectors"] = [{"cel": {"expression": expression}}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}}


def pod(name: str, image: str, claim_template: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": claim_template}],
            "containers": [{"name": "cuda", "image": image, "imagePullPolicy": "Never",
                            "command": ["sleep", "infinity"], "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }  # fmt: skip


def get_pod(cluster: Cluster, name: str) -> dict[str, Any] | None:
    done = cluster.kubectl("get", "pod", "-n", NAMESPACE, name, "-o", "json", check=False)
    return json.loads(done.stdout) if done.returncode == 0 else None


def delete_pod(cluster: Cluster, name: str) -> None:
    cluster.kubectl("delete", "pod", "-n", NAMESPACE, name, "--wait=true", check=False, timeout=90)


def ready(cluster: Cluster, name: str) -> bool:
    found = get_pod(cluster, name)
    return found is not None and pod_ready(found)


def unschedulable(cluster: Cluster, name: str) -> bool:
    found = get_pod(cluster, name) or {}
    return any(c["type"] == "PodScheduled" and c["status"] == "False"
               for c in found.get("status", {}).get("conditions") or [])


def pod_claim(cluster: Cluster, name: str) -> dict[str, Any]:
    found = get_pod(cluster, name)
    assert found is not None
    (status,) = found["status"]["resourceClaimStatuses"]
    claim: dict[str, Any] = cluster.kubectl_json("get", "resourceclaim", "-n", NAMESPACE,
                                                 status["resourceClaimName"])
    return claim


def diagnose(cluster: Cluster, release: Release, *names: str) -> Any:
    def text() -> str:
        described = "\n".join(cluster.kubectl("get", "pod", "-n", NAMESPACE, n, "-o", "yaml",
                                               check=False).stdout for n in names)
        events = cluster.kubectl("get", "events", "-n", NAMESPACE, check=False).stdout
        return f"{described}\n{events}\n{plugin_log(cluster, release)[-6000:]}"
    return text


def run_ready(cluster: Cluster, release: Release, images: Images, name: str, claim_template: str) -> float:
    cluster.apply(pod(name, images.plugin, claim_template))
    _, seconds = cluster.wait_for(f"pod {name} Ready", lambda: ready(cluster, name), POD_READY_S,
                                  diagnose=diagnose(cluster, release, name))
    return seconds


def caps_in_pod(cluster: Cluster, name: str) -> list[list[int]]:
    script = ("import json, os\n"
              "d = '/dev/nvidia-caps'\n"
              "names = sorted(os.listdir(d)) if os.path.isdir(d) else []\n"
              "rdev = [os.stat(d + '/' + n).st_rdev for n in names]\n"
              "print(json.dumps([[os.major(r), os.minor(r)] for r in rdev]))")
    found: list[list[int]] = json.loads(cluster.exec(NAMESPACE, name, "python", "-c", script))
    return found


def kernel_minors(gi: int, ci: int) -> list[int]:
    """The capability minors of GPU 0's GI and CI, as mig-minors numbers them (sim/nvml/procfs.py)."""
    from sim.nvml.procfs import mig_minors

    table = dict(line.rsplit(" ", 1) for line in mig_minors(1).splitlines())
    return sorted([int(table[f"gpu0/gi{gi}/access"]), int(table[f"gpu0/gi{gi}/ci{ci}/access"])])


def prepare_seconds(cluster: Cluster, release: Release) -> float:
    """The DRA plugin's prepare time so far (the sum of its request-duration histogram)."""
    pods = release.pods("dra-plugin")
    ip = pods[0]["status"].get("podIP") if pods else None
    text = cluster.host(f"curl -sS --max-time 5 http://{ip}:{METRICS_PORT}/metrics", check=False).stdout
    for line in text.splitlines():
        if line.startswith("nvidia_dra_request_duration_seconds_sum") and 'operation="prepare"' in line:
            return float(line.rsplit(" ", 1)[1])
    return float("nan")


# --- the story ----------------------------------------------------------------------------------------


def test_install_publishes_counters_and_every_placement(cluster: Cluster, release: Release, host: HostSetup,
                                                        config_file: Path, timings: Timings) -> None:
    with timings.measure(SCENARIO, "helm install (migStrategy dynamic) --wait"):
        done = release.install(*values(host, config_file), check=False)
    assert done.returncode == 0, f"{done.stderr[-2000:]}\n{plugin_log(cluster, release)}"
    found, seconds = cluster.wait_for("the pool's slices",
                                      lambda: slices(cluster) if len(slices(cluster)) == 2 else None, 60,
                                      diagnose=lambda: plugin_log(cluster, release))
    timings.add(SCENARIO, "slices published after install", seconds)
    (counters,) = [s for s in found if s["spec"].get("sharedCounters")]
    (holder,) = [s for s in found if s["spec"].get("devices")]
    (counter_set,) = counters["spec"]["sharedCounters"]
    assert counter_set["name"] == "gpu-0-mig"
    assert {k: v["value"] for k, v in counter_set["counters"].items()} == {
        **{f"memory-slice-{i}": "1" for i in range(8)}, "compute-slices": "7", "profile-20-instances": "1"}
    devices = {d["name"]: d for d in holder["spec"]["devices"]}
    assert len(devices) == 26 and "gpu-0" in devices
    profiles: dict[str, int] = {}
    for d in devices.values():
        if d["attributes"]["type"]["string"] == "mig":
            profile = d["attributes"]["profile"]["string"]
            profiles[profile] = profiles.get(profile, 0) + 1
            assert "uuid" not in d["attributes"]
            assert d["consumesCounters"][0]["counterSet"] == "gpu-0-mig"
    assert profiles == {"1g.10gb": 7, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1,
                        "1g.10gb+me": 7}
    assert live() == []


def test_three_mig_claims_run_together_each_with_its_own_device(
        cluster: Cluster, release: Release, mig_images: Images, timings: Timings) -> None:
    for profile in ("3g.40gb", "2g.20gb", "1g.10gb"):
        cluster.apply(template(f"mig-{profile.replace('.', '-')}", profile))
    versions = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in slices(cluster)}
    for name, profile in (("mig-big", "3g.40gb"), ("mig-mid", "2g.20gb"), ("mig-small", "1g.10gb")):
        seconds = run_ready(cluster, release, mig_images, name, f"mig-{profile.replace('.', '-')}")
        timings.add(SCENARIO, f"{profile} claim -> pod Ready (MIG device made)", seconds)
    made = {m["uuid"]: m for m in live()}
    assert sorted(m["profile"] for m in made.values()) == ["1g.10gb", "2g.20gb", "3g.40gb"]
    for name in ("mig-big", "mig-mid", "mig-small"):
        claim = pod_claim(cluster, name)
        assert claim["status"].get("devices"), plugin_log(cluster, release)[-4000:]
        (entry,) = claim["status"]["devices"]
        mig = made[entry["data"]["uuid"]]
        assert entry["data"]["profile"] == mig["profile"] and entry["data"]["parentUUID"] == gpu_uuid()
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert result["device"] == entry["device"]
        assert result["device"].endswith(f"-{mig['gi_profile_id']}-{mig['start']}")
        assert [minor for _, minor in caps_in_pod(cluster, name)] == kernel_minors(mig["gi_id"], mig["ci_id"])
    # Making MIG devices changes nothing published: the scheduler's counters already account for them.
    after = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in slices(cluster)}
    timings.add(SCENARIO, "slice writes for the three MIG claims (a count)",
                sum(after.get(name) != version for name, version in versions.items()))
    assert after == versions


def test_a_claim_no_placement_fits_waits_for_one_to_free(
        cluster: Cluster, release: Release, mig_images: Images, timings: Timings) -> None:
    cluster.apply(pod("mig-big-2", mig_images.plugin, "mig-3g-40gb"))
    cluster.wait_for("mig-big-2 unschedulable", lambda: unschedulable(cluster, "mig-big-2"), 60,
                     diagnose=diagnose(cluster, release, "mig-big-2"))
    time.sleep(3)
    assert not ready(cluster, "mig-big-2") and len(live()) == 3
    before = prepare_seconds(cluster, release)
    start = time.monotonic()
    delete_pod(cluster, "mig-big")
    deleted = time.monotonic()
    _, _ = cluster.wait_for("mig-big-2 Ready", lambda: ready(cluster, "mig-big-2"), POD_READY_S,
                            diagnose=diagnose(cluster, release, "mig-big-2"))
    total = time.monotonic() - deleted
    nvdp = prepare_seconds(cluster, release) - before
    timings.add(SCENARIO, "placement freed (pod deleted) -> waiting pod Ready", total)
    timings.add(SCENARIO, "... of which nvdp's prepare, with the MIG device made (ms)", nvdp * 1000)
    print(f"pod deletion took {deleted - start:.1f} s; then {total:.1f} s to Ready, nvdp's prepare "
          f"{nvdp * 1000:.1f} ms of it")
    assert sorted(m["profile"] for m in live()) == ["1g.10gb", "2g.20gb", "3g.40gb"]


def test_a_whole_gpu_claim_waits_until_the_mig_devices_are_gone(
        cluster: Cluster, release: Release, mig_images: Images, timings: Timings) -> None:
    cluster.apply(template("whole", None))
    cluster.apply(pod("whole-early", mig_images.plugin, "whole"))
    cluster.wait_for("whole-early unschedulable", lambda: unschedulable(cluster, "whole-early"), 60,
                     diagnose=diagnose(cluster, release, "whole-early"))
    time.sleep(3)
    assert not ready(cluster, "whole-early")
    # The scheduler retries a pod it found unschedulable after its back-off (85 s in one run, all of
    # it the scheduler's): the story creates the whole-GPU pod again once the MIG devices are gone.
    delete_pod(cluster, "whole-early")
    for name in ("mig-big-2", "mig-mid", "mig-small"):
        delete_pod(cluster, name)
    cluster.wait_for("every MIG device destroyed", lambda: live() == [], 60,
                     diagnose=lambda: plugin_log(cluster, release))
    seconds = run_ready(cluster, release, mig_images, "whole", "whole")
    timings.add(SCENARIO, "MIG devices gone: whole-GPU pod created -> Ready (MIG mode turned off)", seconds)
    assert live() == []
    assert "turned MIG mode off" in plugin_log(cluster, release)
    cluster.apply(pod("mig-after", mig_images.plugin, "mig-1g-10gb"))
    cluster.wait_for("mig-after unschedulable", lambda: unschedulable(cluster, "mig-after"), 60,
                     diagnose=diagnose(cluster, release, "mig-after"))
    delete_pod(cluster, "whole")
    cluster.wait_for("mig-after Ready", lambda: ready(cluster, "mig-after"), POD_READY_S,
                     diagnose=diagnose(cluster, release, "mig-after"))
    assert live_profiles() == [m for m in live_profiles() if m.startswith("1g.10gb@")] and len(live()) == 1


def test_a_plugin_restart_loses_and_leaks_nothing(cluster: Cluster, release: Release, mig_images: Images
                                                  ) -> None:
    run_ready(cluster, release, mig_images, "mig-big", "mig-3g-40gb")
    kept = live_profiles()
    before = {p["metadata"]["name"] for p in release.pods("dra-plugin")}
    cluster.kubectl("delete", "pod", "-n", release.namespace, *before, "--wait=true", timeout=90)

    def replaced() -> bool:
        pods = release.pods("dra-plugin")
        names = {p["metadata"]["name"] for p in pods}
        return bool(names) and not names & before and all(pod_ready(p) for p in pods)

    cluster.wait_for("a new plugin pod", replaced, 120, diagnose=lambda: plugin_log(cluster, release))
    assert "Prepared claims on this node: 2" in plugin_log(cluster, release)
    assert live_profiles() == kept
    assert "ForeignMigDevices" not in cluster.kubectl("get", "events", "-A", check=False).stdout
    assert len(slices(cluster)) == 2 and len(slices(cluster)[1]["spec"].get("devices") or
                                            slices(cluster)[0]["spec"].get("devices")) == 26
    for name in ("mig-after", "mig-big"):
        delete_pod(cluster, name)
    cluster.wait_for("every MIG device destroyed", lambda: live() == [], 60,
                     diagnose=lambda: plugin_log(cluster, release))
    leftover = cluster.host(f"ls {CLAIM_SPEC_PREFIX}*.json 2>/dev/null", check=False).stdout.split()
    assert leftover == []


def test_an_xid_on_the_gpu_reaches_the_mig_claims_pods(cluster: Cluster, release: Release,
                                                       mig_images: Images, timings: Timings) -> None:
    run_ready(cluster, release, mig_images, "mig-x", "mig-2g-20gb")
    start = time.monotonic()
    cluster.inject_xid(gpu_uuid(), 48)

    def unhealthy() -> dict[str, Any] | None:
        found = get_pod(cluster, "mig-x") or {}
        for status in found.get("status", {}).get("containerStatuses") or []:
            for claim in status.get("allocatedResourcesStatus") or []:
                for resource in claim.get("resources") or []:
                    if resource.get("health") == "Unhealthy":
                        return dict(resource)
        return None

    shown, _ = cluster.wait_for("mig-x Unhealthy", unhealthy, 90,
                                diagnose=diagnose(cluster, release, "mig-x"))
    timings.add(SCENARIO, "XID 48 on the GPU -> MIG pod shows Unhealthy", time.monotonic() - start)
    assert "XID 48" in shown.get("message", ""), shown
    delete_pod(cluster, "mig-x")
    cluster.kubectl("exec", "-n", release.namespace, release.pods("dra-plugin")[0]["metadata"]["name"], "--",
                    "nvdp", "health", "clear", "--all", check=False)
    cluster.forget_health()
    cluster.wait_for("every MIG device destroyed", lambda: live() == [], 60,
                     diagnose=lambda: plugin_log(cluster, release))


def test_a_foreign_mig_device_fails_the_prepare_with_the_cause(
        cluster: Cluster, release: Release, mig_images: Images) -> None:
    # Restart the plugin so the node's pool is clean of health marks, then make 7g.80gb's placement busy.
    before = {p["metadata"]["name"] for p in release.pods("dra-plugin")}
    cluster.kubectl("delete", "pod", "-n", release.namespace, *before, "--wait=true", timeout=90)
    cluster.wait_for("a new plugin pod", lambda: bool(release.pods("dra-plugin")) and all(
        pod_ready(p) for p in release.pods("dra-plugin")) and not {
        p["metadata"]["name"] for p in release.pods("dra-plugin")} & before, 120,
        diagnose=lambda: plugin_log(cluster, release))
    foreign = sim_mig("create", "--uuid", gpu_uuid(), "--gi-profile", "19", "--start", "3")
    cluster.apply(template("mig-7g-80gb", "7g.80gb"))
    cluster.apply(pod("mig-full", mig_images.plugin, "mig-7g-80gb"))

    def refused() -> str | None:
        events = cluster.kubectl("get", "events", "-n", NAMESPACE, "--field-selector",
                                 "involvedObject.name=mig-full", "-o", "json", check=False).stdout
        for event in json.loads(events or "{}").get("items", []):
            if "holds those memory slices" in event.get("message", ""):
                return str(event["message"])
        return None

    message, _ = cluster.wait_for("the prepare refused", refused, 90,
                                  diagnose=diagnose(cluster, release, "mig-full"))
    # Refused before any NVML change: the placement is looked at before the intent is recorded.
    assert "this plugin did not make it" in message and "nvidia-smi mig" in message, message
    assert "memory slices 3..3" in message, message
    assert live_profiles() == ["1g.10gb@3"]  # the foreign one only: nothing half-made
    delete_pod(cluster, "mig-full")
    uuid = foreign["uuid"] if isinstance(foreign, dict) else None
    gi = next(m["gi_id"] for m in live() if m["uuid"] == uuid or uuid is None)
    sim_mig("destroy", "--uuid", gpu_uuid(), "--gi-id", str(gi))
    assert live() == []


def whole_log(cluster: Cluster, release: Release) -> str:
    selector = f"{release.selector},app.kubernetes.io/component=dra-plugin"
    return cluster.logs(release.namespace, selector, 100000)


def scale_events(cluster: Cluster) -> list[dict[str, Any]]:
    found = cluster.kubectl_json("get", "events", "-n", "default", "--field-selector",
                                 f"involvedObject.name={cluster.node},reason=DynamicMigSchedulerCost")["items"]
    return list(found)


def test_a_profile_list_offers_those_profiles_only(cluster: Cluster, release: Release, host: HostSetup,
                                                  mig_images: Images, timings: Timings) -> None:
    from nvdp.dra.pool.scale import scale_warning

    # The kit's API server is v1.36.2: each plugin start so far (install, two restarts) warned once.
    message = scale_warning("v1.36.2", (1, 36, 2), 26)
    assert message is not None and whole_log(cluster, release).count(message) == 1
    before = scale_events(cluster)
    assert len(before) == 3 and {e["message"] for e in before} == {message}, before
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "config.yaml"
        path.write_text(CONFIG + OFFERED)
        running = {p["metadata"]["name"] for p in release.pods("dra-plugin")}
        with timings.measure(SCENARIO, "helm upgrade (migDynamicProfiles) -> the pool of 10 devices"):
            release.upgrade(*values(host, path))
            cluster.refresh_config_volumes(release.namespace, release.selector)

            def offered() -> list[str] | None:
                devices = [d["name"] for s in slices(cluster) for d in s["spec"].get("devices") or []]
                return devices if len(devices) == 10 else None

            devices, _ = cluster.wait_for("the pool of the offered profiles", offered, 90,
                                          diagnose=lambda: plugin_log(cluster, release))
    assert sorted(devices) == sorted(["gpu-0", *(f"gpu-0-mig-1g10gb-19-{i}" for i in range(7)),
                                      "gpu-0-mig-3g40gb-9-0", "gpu-0-mig-3g40gb-9-4"])
    (counters,) = [s for s in slices(cluster) if s["spec"].get("sharedCounters")]
    assert len(counters["spec"]["sharedCounters"][0]["counters"]) == 10  # the GPU's, unchanged
    # The same plugin start read the new config: no second warning, no second Event.
    assert {p["metadata"]["name"] for p in release.pods("dra-plugin")} == running
    assert len(scale_events(cluster)) == 3 and whole_log(cluster, release).count("kube-scheduler before") == 1
    seconds = run_ready(cluster, release, mig_images, "offered", "mig-3g-40gb")
    timings.add(SCENARIO, "offered profile (3g.40gb) claim -> pod Ready", seconds)
    cluster.apply(pod("not-offered", mig_images.plugin, "mig-2g-20gb"))
    _, seconds = cluster.wait_for("the 2g.20gb pod unschedulable",
                                  lambda: unschedulable(cluster, "not-offered"), 60,
                                  diagnose=diagnose(cluster, release, "not-offered"))
    timings.add(SCENARIO, "profile not offered (2g.20gb) claim -> pod Unschedulable", seconds)

    def reason() -> str | None:
        found = cluster.kubectl_json("get", "events", "-n", NAMESPACE, "--field-selector",
                                     "involvedObject.name=not-offered,reason=FailedScheduling")["items"]
        return next((str(e["message"]) for e in found), None)

    said, _ = cluster.wait_for("the scheduler's reason", reason, 30)
    print(f"the scheduler on the 2g.20gb pod: {said}")
    assert "cannot allocate all claims" in said, said
    assert not ready(cluster, "not-offered") and [m["profile"] for m in live()] == ["3g.40gb"]
    for name in ("not-offered", "offered"):
        delete_pod(cluster, name)
    cluster.wait_for("every MIG device destroyed", lambda: live() == [], 60,
                     diagnose=lambda: plugin_log(cluster, release))


def test_uninstall(cluster: Cluster, release: Release) -> None:
    release.uninstall()  # the slices go 30 s after, with the kubelet's registration (tests/e2e/test_dra.py)
    assert live() == []
