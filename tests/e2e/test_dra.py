"""DRA driver mode on a real node: slices, a claim prepared through CDI, restarts, and a CEL selector.

The chart installed with `dra.enabled=true` runs `nvidia-dra-plugin` instead of the device plugin. The
stand-in NVML shows one T4 (from step 6 `unsupported.simulatedGpus=mixed-4`, the same images), and the
driver files the claim specs point at are the fake driver root of the CDI scenario (tests/e2e/test_cdi.py:
real ELF libraries, the host's /dev/nvidia0 and /dev/nvidiactl, a stand-in hook).

The story, each step on the one before:
1. install: no device-plugin pod, no `nvidia.com/gpu` allocatable; the node's ResourceSlice for driver
   gpu.nvidia.com lists gpu-0 with NVIDIA's attributes; the DeviceClasses exist; the kubelet accepted
   the registration.
2. a pod with a ResourceClaimTemplate for one gpu.nvidia.com device is Running; it sees /dev/nvidia0 and
   NVIDIA_VISIBLE_DEVICES=void (the CDI devices carry the GPU, as in NVIDIA's specs); the claim's spec
   /var/run/cdi/k8s.gpu.nvidia.com-claim_<uid>.json names `<uid>-gpu-0`.
3. a second such pod stays Pending (the one GPU is allocated); deleting the first pod unprepares (the
   claim spec goes) and the second pod then runs.
4. the plugin killed after the claim was prepared and before the pod started: the pod runs, the new
   plugin instance knows the claim from its checkpoint and unprepares it when the pod goes.
5. the kubelet restarted: it wipes the node's slices on start; the plugin publishes them again and is
   registered again, and a new claim is prepared.
6. the mixed profile (two T4 on NUMA node 0, two V100 on NUMA node 1): every device publishes its
   `resource.kubernetes.io/numaNode`; a claim whose CEL selector asks for productName V100 gets a V100;
   its container reads the request's device metadata file at the template path (KEP-5304), and the
   claim's status names the GPU's UUID (KEP-4817).
7. a second DRA driver (tests/e2e/data/second_driver.py, a NIC on NUMA node 1 in a slice the test
   writes): a claim for a GPU and the NIC with `matchAttribute: resource.kubernetes.io/numaNode` runs
   on a V100, its metadata file at the claim's path; the same asking for a T4 stays Pending.
8. uninstall: the node's slices are gone.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from .e2e_cluster import Cluster, Images, Release, Timings, story_release
from .test_cdi import DRIVER_VERSION, LIBDIR, LIBRARIES, T4_UUID, HostSetup, make_host, remove_host

SCENARIO = "DRA driver"
pytestmark = pytest.mark.incremental
DRIVER = "gpu.nvidia.com"
CDI_DIR = "/var/run/cdi"
CLAIM_SPEC_PREFIX = f"{CDI_DIR}/k8s.gpu.nvidia.com-claim_"
NAMESPACE = "nvdp-e2e-dra-work"
STORY = "nvdp-e2e-story=dra"
V100 = "Tesla V100-SXM2-16GB"
MIXED_DRIVER_VERSION = "535.161.08"  # sim/profiles/mixed-4.yaml: the libraries it needs under the root
NUMA_NODE = "resource.kubernetes.io/numaNode"
METADATA_DIR = "/var/run/kubernetes.io/dra-device-attributes"
NIC_DRIVER = "nic.e2e.nvdp.example"
SECOND_DRIVER = Path(__file__).parent / "data" / "second_driver.py"
SECOND = "second-driver"


@contextmanager
def claim_host(cluster: Cluster) -> Iterator[HostSetup]:
    """The CDI scenario's fake driver root for claim specs, and no claim spec left before or after."""
    setup = HostSetup()
    try:
        cluster.host(f"rm -f {CLAIM_SPEC_PREFIX}*.json")
        make_host(cluster, setup)
        yield setup
    finally:
        cluster.host(f"rm -f {CLAIM_SPEC_PREFIX}*.json", check=False)
        remove_host(cluster, setup)


@pytest.fixture(scope="module")
def host(cluster: Cluster) -> Iterator[HostSetup]:
    with claim_host(cluster) as setup:
        # The mixed profile's GPUs 1-3 need their device nodes too (the claim spec stats them).
        for minor in (1, 2, 3):
            path = f"/dev/nvidia{minor}"
            make = f"[ -e {path} ] || {{ mknod -m 666 {path} c 195 {minor} && echo made; }}"
            made = cluster.host(make).stdout
            if made.strip() == "made":
                setup.made_nodes.append(path)
            cluster.host(f"mknod -m 666 {setup.driver_root}/dev/nvidia{minor} c 195 {minor}")
        yield setup


@pytest.fixture(scope="module")
def release(cluster: Cluster, images: Images, host: HostSetup) -> Iterator[Release]:
    with story_release(cluster, images, "nvdp-dra", "nvdp-e2e-dra", work=[NAMESPACE]) as release:
        yield release


def values(host: HostSetup) -> list[str]:
    return [
        "--set", "dra.enabled=true",
        "--set", f"nvidiaDriverRoot={host.driver_root}",
        "--set", "nvidiaDevRoot=/",
        "--set", f"cdi.nvidiaHookPath={host.hook}",
    ]  # fmt: skip


# --- reading the cluster -----------------------------------------------------------------------------


def slices(cluster: Cluster) -> list[dict[str, Any]]:
    found = cluster.kubectl_json("get", "resourceslices", "--field-selector",
                                 f"spec.nodeName={cluster.node},spec.driver={DRIVER}")["items"]
    return list(found)


def slice_devices(cluster: Cluster) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices(cluster) for d in s["spec"].get("devices") or []}


def plugin_log(cluster: Cluster, release: Release) -> str:
    return cluster.logs(release.namespace, f"{release.selector},app.kubernetes.io/component=dra-plugin", 200)


def claim_template(name: str, selector: str | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": DRIVER}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }  # fmt: skip


def claim_pod(name: str, image: str, template: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"nvdp-e2e-story": "dra"}},
        "spec": {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "containers": [{"name": "cuda", "image": image, "imagePullPolicy": "Never",
                            "command": ["sleep", "infinity"], "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }  # fmt: skip


def pod_phase(cluster: Cluster, name: str) -> str:
    pod = cluster.kubectl_json("get", "pod", "-n", NAMESPACE, name)
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])
    return "Ready" if ready else str(pod["status"].get("phase"))


def pod_claim_uid(cluster: Cluster, name: str) -> str:
    pod = cluster.kubectl_json("get", "pod", "-n", NAMESPACE, name)
    (status,) = pod["status"]["resourceClaimStatuses"]
    claim = cluster.kubectl_json("get", "resourceclaim", "-n", NAMESPACE, status["resourceClaimName"])
    return str(claim["metadata"]["uid"])


def diagnose(cluster: Cluster, release: Release, pod: str) -> Any:
    def text() -> str:
        events = cluster.kubectl("get", "events", "-n", NAMESPACE, check=False).stdout
        described = cluster.kubectl("get", "pod", "-n", NAMESPACE, pod, "-o", "yaml", check=False).stdout
        return f"{described}\n{events}\n{plugin_log(cluster, release)}"
    return text


def run_ready(cluster: Cluster, release: Release, images: Images, timings: Timings, name: str, template: str,
              step: str) -> None:
    cluster.apply(claim_pod(name, images.plugin, template))
    _, seconds = cluster.wait_for(f"pod {name} Ready", lambda: pod_phase(cluster, name) == "Ready", 120,
                                  diagnose=diagnose(cluster, release, name))
    timings.add(SCENARIO, step, seconds)


def seen_in_pod(cluster: Cluster, name: str) -> dict[str, Any]:
    # The GPU's node: /dev/nvidia<minor> (nvidiactl and the like are not GPUs).
    script = ("import json, os, stat\n"
              "gpus = sorted(n for n in os.listdir('/dev') if n.startswith('nvidia') and n[6:].isdigit())\n"
              "st = os.stat('/dev/' + gpus[0])\n"
              "print(json.dumps({'env': dict(os.environ), 'gpus': gpus, "
              "'dev': [stat.S_ISCHR(st.st_mode), os.major(st.st_rdev), os.minor(st.st_rdev)]}))")
    seen: dict[str, Any] = json.loads(cluster.exec(NAMESPACE, name, "python", "-c", script))
    return seen


def delete_pod(cluster: Cluster, name: str) -> None:
    cluster.kubectl("delete", "pod", "-n", NAMESPACE, name, "--wait=true", check=False, timeout=90)


def metadata_in_pod(cluster: Cluster, name: str, path: str) -> dict[str, Any]:
    """The first object of the device metadata file at `path` in the pod (a JSON stream, newest API
    version first) and the versions the stream holds."""
    script = ("import json, sys\n"
              "text, decoder, found, at = open(sys.argv[1]).read(), json.JSONDecoder(), [], 0\n"
              "while text[at:].strip():\n"
              "    at += len(text[at:]) - len(text[at:].lstrip())\n"
              "    value, at = decoder.raw_decode(text, at)\n"
              "    found.append(value)\n"
              "print(json.dumps({'first': found[0], 'versions': [o['apiVersion'] for o in found]}))")
    seen: dict[str, Any] = json.loads(cluster.exec(NAMESPACE, name, "python", "-c", script, path))
    return seen


def claim_of(cluster: Cluster, pod: str) -> dict[str, Any]:
    found = cluster.kubectl_json("get", "pod", "-n", NAMESPACE, pod)
    (status,) = found["status"]["resourceClaimStatuses"]
    claim: dict[str, Any] = cluster.kubectl_json("get", "resourceclaim", "-n", NAMESPACE,
                                                 status["resourceClaimName"])
    return claim


def our_status(claim: dict[str, Any]) -> list[dict[str, Any]]:
    """The claim's status.devices entries of nvdp's driver, without the API server's nulls."""
    return [{k: v for k, v in e.items() if v is not None}
            for e in (claim.get("status") or {}).get("devices") or [] if e["driver"] == DRIVER]


# --- the story ----------------------------------------------------------------------------------------


def test_install_publishes_the_gpu(cluster: Cluster, release: Release, host: HostSetup, timings: Timings
                                   ) -> None:
    with timings.measure(SCENARIO, "helm install (dra.enabled) --wait"):
        done = release.install(*values(host), check=False)
    if done.returncode != 0:
        pods = cluster.kubectl("get", "pods", "-n", release.namespace, "-o", "wide", check=False).stdout
        events = cluster.kubectl("get", "events", "-n", release.namespace, check=False).stdout
        raise AssertionError(f"helm install failed:\n{done.stderr[-2000:]}\n{pods}\n{events}\n"
                             f"{plugin_log(cluster, release)}")
    assert not release.pods("device-plugin"), "dra.enabled must not run the device plugin too"
    devices, seconds = cluster.wait_for("the node's ResourceSlice", lambda: slice_devices(cluster) or None,
                                        60, diagnose=lambda: plugin_log(cluster, release))
    timings.add(SCENARIO, "slice published after install", seconds)
    assert list(devices) == ["gpu-0"]
    attributes = devices["gpu-0"]["attributes"]
    assert attributes["type"] == {"string": "gpu"}
    assert attributes["uuid"] == {"string": T4_UUID}
    assert attributes["productName"] == {"string": "Tesla T4"}
    assert attributes["cudaComputeCapability"] == {"version": "7.5.0"}
    assert "resource.kubernetes.io/pciBusID" in attributes
    assert int(devices["gpu-0"]["capacity"]["memory"]["value"]) > 0
    (published,) = slices(cluster)
    assert published["spec"]["pool"]["name"] == cluster.node
    owner = published["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("Node", cluster.node)
    classes = {c["metadata"]["name"] for c in cluster.kubectl_json("get", "deviceclasses")["items"]}
    assert {"gpu.nvidia.com", "mig.nvidia.com"} <= classes
    cluster.wait_for("the kubelet's registration", lambda: "Registered with the kubelet" in plugin_log(
        cluster, release), 60, diagnose=lambda: plugin_log(cluster, release))
    # No nvidia.com/gpu through the device-plugin API. (Not the Node's allocatable: after an earlier
    # scenario's device plugin the kubelet keeps that count for its 5-minute grace.)
    sockets = cluster.host("ls /var/lib/kubelet/device-plugins/", check=False).stdout.split()
    assert not [s for s in sockets if s.startswith("nvidia")], sockets


def test_a_claim_gets_the_gpu_through_cdi(cluster: Cluster, release: Release, images: Images,
                                         timings: Timings) -> None:
    cluster.apply(claim_template("one-gpu"))
    run_ready(cluster, release, images, timings, "dra-a", "one-gpu", "claim created -> pod Ready")
    seen = seen_in_pod(cluster, "dra-a")
    assert seen["gpus"] == ["nvidia0"] and seen["dev"] == [True, 195, 0]
    # void, as NVIDIA writes it: a legacy nvidia runtime hook must not inject the GPU a second time
    assert seen["env"].get("NVIDIA_VISIBLE_DEVICES") == "void"
    uid = pod_claim_uid(cluster, "dra-a")
    spec = json.loads(cluster.host(f"cat {CLAIM_SPEC_PREFIX}{uid}.json").stdout)
    assert spec["kind"] == "k8s.gpu.nvidia.com/claim"
    # the GPU, and the request's device metadata file (KEP-5304) its spec mounts
    assert [d["name"] for d in spec["devices"]] == [f"{uid}-gpu-0", f"{uid}-metadata-gpu"]


def test_the_gpu_is_not_handed_out_twice(cluster: Cluster, release: Release, images: Images,
                                         timings: Timings) -> None:
    cluster.apply(claim_pod("dra-b", images.plugin, "one-gpu"))
    time.sleep(8)
    assert pod_phase(cluster, "dra-b") == "Pending"
    uid = pod_claim_uid(cluster, "dra-a")
    delete_pod(cluster, "dra-a")
    cluster.wait_for("the first claim's spec to go", lambda: cluster.host(
        f"test -e {CLAIM_SPEC_PREFIX}{uid}.json", check=False).returncode != 0, 60,
        diagnose=lambda: plugin_log(cluster, release))
    _, seconds = cluster.wait_for("pod dra-b Ready", lambda: pod_phase(cluster, "dra-b") == "Ready", 120,
                                  diagnose=diagnose(cluster, release, "dra-b"))
    timings.add(SCENARIO, "GPU freed -> waiting pod Ready", seconds)
    delete_pod(cluster, "dra-b")


def test_a_plugin_restart_between_prepare_and_start_keeps_the_claim(
        cluster: Cluster, release: Release, images: Images) -> None:
    before = {p["metadata"]["name"] for p in release.pods("dra-plugin")}
    cluster.apply(claim_pod("dra-c", images.plugin, "one-gpu"))

    def prepared() -> str | None:
        found = cluster.host(f"ls {CLAIM_SPEC_PREFIX}*.json 2>/dev/null", check=False).stdout.split()
        return found[0] if found else None

    spec, _ = cluster.wait_for("the claim to be prepared", prepared, 60, every=0.1,
                               diagnose=diagnose(cluster, release, "dra-c"))
    cluster.kubectl("delete", "pod", "-n", release.namespace, *before, "--grace-period=0", "--force",
                    "--wait=false")
    cluster.wait_for("pod dra-c Ready", lambda: pod_phase(cluster, "dra-c") == "Ready", 120,
                     diagnose=diagnose(cluster, release, "dra-c"))

    def replaced() -> bool:
        pods = release.pods("dra-plugin")
        names = {p["metadata"]["name"] for p in pods}
        return bool(names) and not names & before and all(pod_ready(p) for p in pods)

    cluster.wait_for("a new plugin pod", replaced, 120, diagnose=lambda: plugin_log(cluster, release))
    assert "Prepared claims on this node: 1" in plugin_log(cluster, release)
    delete_pod(cluster, "dra-c")
    cluster.wait_for("the new plugin to unprepare the claim", lambda: cluster.host(
        f"test -e {spec}", check=False).returncode != 0, 60, diagnose=lambda: plugin_log(cluster, release))


def pod_ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])


def plugin_replaced(release: Release, before: set[str]) -> bool:
    """Whether the DRA plugin's pods are all new (none of `before`) and Ready."""
    pods = release.pods("dra-plugin")
    names = {p["metadata"]["name"] for p in pods}
    return bool(names) and not names & before and all(pod_ready(p) for p in pods)


def test_a_kubelet_restart_re_registers_and_republishes(cluster: Cluster, release: Release, images: Images,
                                                       timings: Timings) -> None:
    start = time.monotonic()
    cluster.restart_kubelet()
    cluster.wait_for("the slice again", lambda: "gpu-0" in slice_devices(cluster), 90,
                     diagnose=lambda: plugin_log(cluster, release))
    run_ready(cluster, release, images, timings, "dra-d", "one-gpu",
              "claim after kubelet restart -> pod Ready")
    timings.add(SCENARIO, "kubelet restart -> claim pod Ready", time.monotonic() - start)
    delete_pod(cluster, "dra-d")


def test_a_cel_selector_picks_the_gpu_by_product(cluster: Cluster, release: Release, host: HostSetup,
                                                 timings: Timings) -> None:
    lib = f"{host.driver_root}{LIBDIR}"
    for name in LIBRARIES:
        cluster.host(f"cp {lib}/{name}.so.{DRIVER_VERSION} {lib}/{name}.so.{MIXED_DRIVER_VERSION}")
    mixed = release.images.with_profile("mixed-4")  # the same images, another profile
    release.images = mixed
    release.upgrade(*values(host))
    cluster.wait_for("four devices", lambda: len(slice_devices(cluster)) == 4, 120,
                     diagnose=lambda: plugin_log(cluster, release))
    devices = slice_devices(cluster)
    v100 = sorted(n for n, d in devices.items() if d["attributes"]["productName"] == {"string": V100})
    assert v100 == ["gpu-2", "gpu-3"], devices
    selector = f"device.attributes['{DRIVER}'].productName == '{V100}'"
    cluster.apply(claim_template("one-v100", selector))
    # The profile's GPUs hang off two NUMA nodes (the stand-in's sysfs): both values are published.
    assert {n: d["attributes"][NUMA_NODE] for n, d in devices.items()} == {
        "gpu-0": {"int": 0}, "gpu-1": {"int": 0}, "gpu-2": {"int": 1}, "gpu-3": {"int": 1}}
    run_ready(cluster, release, mixed, timings, "dra-e", "one-v100", "CEL-selected claim -> pod Ready")
    seen = seen_in_pod(cluster, "dra-e")
    # the V100s are gpu-2 and gpu-3: the pod has the device node of one of them
    assert seen["gpus"] in (["nvidia2"], ["nvidia3"]) and seen["dev"][:2] == [True, 195], seen["gpus"]
    # Who uses which GPU: the claim's status (what dcgm-exporter joins on), and in the container the
    # request's metadata file at the path of a claim from a template (its name in the pod: "gpu").
    claim = claim_of(cluster, "dra-e")
    (allocated,) = claim["status"]["allocation"]["devices"]["results"]
    uuid = devices[allocated["device"]]["attributes"]["uuid"]["string"]
    assert our_status(claim) == [{"driver": DRIVER, "pool": cluster.node, "device": allocated["device"],
                                  "data": {"type": "gpu", "uuid": uuid}}]
    path = f"{METADATA_DIR}/resourceclaimtemplates/gpu/gpu/{DRIVER}-metadata.json"
    metadata = metadata_in_pod(cluster, "dra-e", path)
    assert metadata["versions"] == ["metadata.resource.k8s.io/v1beta1", "metadata.resource.k8s.io/v1alpha1"]
    first = metadata["first"]
    assert (first["metadata"]["name"], first["podClaimName"]) == (claim["metadata"]["name"], "gpu")
    (request,) = first["requests"]
    (device,) = request["devices"]
    assert (request["name"], device["driver"], device["name"]) == ("gpu", DRIVER, allocated["device"])
    assert device["attributes"]["uuid"] == {"string": uuid}
    assert device["attributes"][NUMA_NODE] == {"int": 1}
    assert device["attributes"]["healthy"] == {"bool": True}
    delete_pod(cluster, "dra-e")


def nic_objects(node: str, numa: int) -> list[dict[str, Any]]:
    """The second driver's DeviceClass and its node's slice: one NIC on NUMA node `numa`."""
    return [
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": NIC_DRIVER},
         "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{NIC_DRIVER}'"}}]}},
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-nic"},
         "spec": {"driver": NIC_DRIVER, "nodeName": node,
                  "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                  "devices": [{"name": "nic-0", "attributes": {NUMA_NODE: {"int": numa}}}]}},
    ]  # fmt: skip


def second_driver_pod(image: str, node: str) -> dict[str, Any]:
    registry, plugins = "/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins"
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "second-driver", "namespace": NAMESPACE, "labels": {"app": SECOND}},
        "spec": {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 5,
            "automountServiceAccountToken": False,
            "containers": [{
                "name": "driver", "image": image, "imagePullPolicy": "Never",
                "command": ["python", "/driver/second_driver.py", NIC_DRIVER, node, "nic-0", "nic"],
                "volumeMounts": [{"name": "driver", "mountPath": "/driver"},
                                 {"name": "registry", "mountPath": registry},
                                 {"name": "plugins", "mountPath": plugins}]}],
            "volumes": [{"name": "driver", "configMap": {"name": "second-driver"}},
                        {"name": "registry", "hostPath": {"path": registry, "type": "DirectoryOrCreate"}},
                        {"name": "plugins", "hostPath": {"path": plugins, "type": "DirectoryOrCreate"}}],
        },
    }  # fmt: skip


def gpu_and_nic_claim(name: str, selector: str | None = None) -> dict[str, Any]:
    gpu: dict[str, Any] = {"deviceClassName": DRIVER}
    if selector:
        gpu["selectors"] = [{"cel": {"expression": selector}}]
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": gpu},
                         {"name": "nic", "exactly": {"deviceClassName": NIC_DRIVER}}],
            "constraints": [{"requests": ["gpu", "nic"], "matchAttribute": NUMA_NODE}]}},
    }  # fmt: skip


def claim_pod_of(name: str, image: str, claim: str) -> dict[str, Any]:
    """A pod holding the ResourceClaim `claim` by its name (not from a template)."""
    pod = claim_pod(name, image, "unused")
    pod["spec"]["resourceClaims"] = [{"name": "devices", "resourceClaimName": claim}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "devices"}]}
    return pod


def unschedulable(cluster: Cluster, name: str) -> bool:
    pod = cluster.kubectl_json("get", "pod", "-n", NAMESPACE, name)
    return any(c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable"
               for c in pod["status"].get("conditions") or [])


def test_a_gpu_and_another_drivers_nic_are_put_on_one_numa_node(cluster: Cluster, release: Release,
                                                                timings: Timings) -> None:
    image = release.images.plugin
    cluster.kubectl("create", "configmap", SECOND, "-n", NAMESPACE,
                    f"--from-file=second_driver.py={SECOND_DRIVER}")

    def driver_log() -> str:
        return cluster.logs(NAMESPACE, f"app={SECOND}")

    started = time.monotonic()
    try:
        cluster.apply(second_driver_pod(image, cluster.node))
        cluster.wait_for("the second driver's registration",
                         lambda: "Registered with the kubelet" in driver_log(), 60, diagnose=driver_log)
        cluster.apply(nic_objects(cluster.node, numa=1))  # after its registration, which clears nothing
        t4 = f"device.attributes['{DRIVER}'].productName == 'Tesla T4'"
        cluster.apply([gpu_and_nic_claim("t4-and-nic", t4), gpu_and_nic_claim("gpu-and-nic")])
        cluster.apply([claim_pod_of("dra-far", image, "t4-and-nic"),
                       claim_pod_of("dra-near", image, "gpu-and-nic")])
        created = time.monotonic()
        _, seconds = cluster.wait_for("pod dra-near Ready", lambda: pod_phase(cluster, "dra-near") == "Ready",
                                      120, diagnose=diagnose(cluster, release, "dra-near"))
        timings.add(SCENARIO, "GPU + NIC on one NUMA node -> pod Ready", seconds)
        claim = cluster.kubectl_json("get", "resourceclaim", "-n", NAMESPACE, "gpu-and-nic")
        results = {r["request"]: r for r in claim["status"]["allocation"]["devices"]["results"]}
        assert results["gpu"]["device"] in ("gpu-2", "gpu-3"), "the V100s share the NIC's NUMA node"
        assert (results["nic"]["driver"], results["nic"]["device"]) == (NIC_DRIVER, "nic-0")
        # The metadata file at the path of a claim the pod names itself; the NIC's is its driver's
        # business (this one writes none).
        path = f"{METADATA_DIR}/resourceclaims/gpu-and-nic/gpu/{DRIVER}-metadata.json"
        (device,) = metadata_in_pod(cluster, "dra-near", path)["first"]["requests"][0]["devices"]
        assert (device["name"], device["attributes"][NUMA_NODE]) == (results["gpu"]["device"], {"int": 1})
        assert [e["device"] for e in our_status(claim)] == [results["gpu"]["device"]]
        # The T4s are on NUMA node 0, the only NIC on 1: never allocated together.
        time.sleep(max(0.0, 10 - (time.monotonic() - created)))
        assert pod_phase(cluster, "dra-far") == "Pending" and unschedulable(cluster, "dra-far")
    finally:
        # The claim pods first: their NIC is unprepared by the second driver, which must still run.
        cluster.kubectl("delete", "pod", "-n", NAMESPACE, "dra-far", "dra-near", "--wait=true", check=False,
                        timeout=90)
        cluster.kubectl("delete", "pod", "-n", NAMESPACE, SECOND, "--wait=true", check=False, timeout=60)
        cluster.kubectl("delete", "resourceclaim", "-n", NAMESPACE, "t4-and-nic", "gpu-and-nic", check=False)
        cluster.kubectl("delete", "resourceslice", f"{cluster.node}-nic", check=False)
        cluster.kubectl("delete", "deviceclass", NIC_DRIVER, check=False)
    timings.add(SCENARIO, "GPU + NIC step: second driver up, two claims, Pending check, clean-up",
                time.monotonic() - started)


def test_uninstall_removes_the_slices(cluster: Cluster, release: Release, timings: Timings) -> None:
    release.uninstall()
    _, seconds = cluster.wait_for("the node's slices to go", lambda: not slices(cluster), 120)
    timings.add(SCENARIO, "uninstall -> slices gone", seconds)
