"""DRA benchmark: the DRA kubelet plugin's claim preparation and its API traffic in steady state.

    .venv/bin/python bench/dra_bench.py [--rounds 300]          # both parts
    .venv/bin/python bench/dra_bench.py --prepare               # NodePrepareResources only (root: mknod)
    .venv/bin/python bench/dra_bench.py --api [--minutes 2]     # API requests per node per hour
    .venv/bin/python bench/dra_bench.py --mps [--rounds 40]     # prepare with MPS claim config (root)
    .venv/bin/python bench/dra_bench.py --quick                 # a smoke run of both

**Prepare** times NodePrepareResources and NodeUnprepareResources as the kubelet calls them: a gRPC
client on the real unix socket of a real `DraServer`, whose callbacks are a real `ClaimPreparer` (the
checkpoint file written with fsync under its file lock) and the real per-claim CDI spec writer, on a
fake driver root with real device nodes (the one `plugin_bench.py --cdi` builds), for the stand-in
profile a100-sxm-8's inventory (`nvdp.inventory.profile`). Claims of 1 and of 8 GPUs come from an
in-memory `get_claim`; each round prepares a fresh claim of each size and unprepares it, sizes
alternating so both see the same load. Latencies are client-side, after 20 warm-up rounds.

**MPS** times NodePrepareResources of a claim of 1 GPU carrying MPS config (GpuConfig, 25 % threads,
2 GiB) on the same set-up, with `ClaimMps` supervising nvdp's MPS daemons (the stand-in
`nvidia-cuda-mps-control` of sim/mps, compute modes not touched): *daemon not up* prepares and unprepares
a lone MPS claim each round, so each prepare starts the GPU's daemon and waits until it answers, and each
unprepare stops it; *daemon up* keeps another MPS claim prepared on the same (shared) GPU, so the
prepare joins the running daemon.

**API** runs the `SlicePublisher` with its watch against a throwaway etcd + kube-apiserver (the one
the tests start, `tests/kube/envtest.py`, from $KUBEBUILDER_ASSETS), publishes the node's 8 devices,
then for `--minutes` calls `publish()` with unchanged devices every `--republish-s` seconds (as the
daemon does whenever the GPUs' health is looked at again) and counts the API requests the publisher
sends (`requests()`). In steady state the only requests are the watch's: when the API server ends a
watch (its timeout, 15-30 min at random) the watcher lists the slices again and starts a new watch,
2 requests. To see cycles within minutes the watch timeout is shortened to `--watch-cycle` seconds;
requests per hour are then the measured requests per cycle times the cycles an hour at the real
timeouts (3600 s / 1350 s mean), plus what the re-publish calls cost per hour (measured).
`--real-timeouts` keeps the watch's own timeouts and extrapolates the raw count instead.

Exit status 0 with the table; 1 when the benchmark could not run.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from msgspec.structs import replace  # noqa: E402
from plugin_bench import _cdi_node, load_average, percentile, print_rows  # noqa: E402

from nvdp.dra.pool.devices import DraDevice, dra_devices  # noqa: E402
from nvdp.inventory.model import Inventory  # noqa: E402
from nvdp.inventory.profile import load_profile  # noqa: E402

PROFILE = ROOT / "sim" / "profiles" / "a100-sxm-8.yaml"
DRIVER = "gpu.nvidia.com"
NODE = "bench-node"
NAMESPACE = "default"
SIZES = (1, 8)
WARMUP_ROUNDS = 20
CALL_TIMEOUT_S = 45.0  # the kubelet's deadline for a DRA call


def quiet_log(name: str) -> logging.Logger:
    """A logger at INFO, as the daemon's, that formats every line but writes it nowhere."""
    log = logging.getLogger(name)
    log.setLevel(logging.INFO)
    log.propagate = False
    handler = logging.StreamHandler(open(os.devnull, "w"))  # noqa: SIM115 - lives as long as the process
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    log.addHandler(handler)
    return log


# --- NodePrepareResources / NodeUnprepareResources -------------------------------------------------


def allocated_claim(name: str, uid: str, devices: Sequence[str], sharing: dict[str, Any] | None = None
                    ) -> dict[str, Any]:
    """A ResourceClaim as the scheduler leaves it: allocated on this node's pool, reserved for a pod;
    with `sharing`, a GpuConfig for its request and a share ID on each result (a shared GPU)."""
    results: list[dict[str, Any]] = [{"request": "gpus", "driver": DRIVER, "pool": NODE, "device": d}
                                     for d in devices]
    claim: dict[str, Any] = {
        "metadata": {"namespace": NAMESPACE, "name": name, "uid": uid},
        "status": {"allocation": {"devices": {"results": results}},
                   "reservedFor": [{"resource": "pods", "name": f"pod-{name}", "uid": f"pod-{uid}"}]}}
    if sharing is not None:
        for result in results:
            result["shareID"] = str(uuid.uuid4())
        parameters = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": sharing}
        claim["spec"] = {"devices": {"config": [{"requests": ["gpus"],
                                                 "opaque": {"driver": DRIVER, "parameters": parameters}}]}}
    return claim


class NoModes:
    """Compute modes left alone: the stand-in NVML's are not what is measured."""

    def set_exclusive(self, uuids: object) -> None:
        pass

    def restore(self, uuids: object) -> None:
        pass

    def close(self) -> None:
        pass


@contextmanager
def dra_plugin(work: Path, inventory: Inventory, claims: Mapping[tuple[str, str], dict[str, Any]],
               mps: bool = False) -> Iterator[str]:
    """A DraServer serving a ClaimPreparer with the real CDI writer on a fake driver root; its socket.
    With `mps`, its GPUs are published shared (4 replicas) and MPS claims run nvdp's MPS daemons."""
    from nvdp.cdi.host import discover_host
    from nvdp.config.model import Config, Flags, PluginFlags
    from nvdp.dra.claims.cdi_specs import ClaimSpecWriter
    from nvdp.dra.claims.check import NodeView
    from nvdp.dra.claims.preparer import ClaimPreparer
    from nvdp.dra.kubelet.server import DraServer

    root, proc = _cdi_node(work, inventory)
    config = Config(flags=Flags(plugin=PluginFlags(container_driver_root=str(root))))
    facts = discover_host(config, inventory, sysfs_root=str(work / "sys"), proc_root=str(proc))
    devices = dra_devices(inventory)
    if mps:
        devices = tuple(replace(d, replicas=4, sharing="time-slicing") for d in devices)
    view = NodeView({d.name: d for d in devices})
    plugin_dir = work / "plugins" / DRIVER
    plugin_dir.mkdir(parents=True)
    log = quiet_log("bench-dra-plugin")
    sharing = None
    if mps:
        from nvdp.daemon.report.recording import Recorder
        from nvdp.dra.claims.sharing.mps import ClaimMps
        from nvdp.dra.claims.sharing.node import NodeSharing

        mps_root = Path(tempfile.mkdtemp(prefix="mps", dir="/tmp"))  # unix socket paths are short
        manager = ClaimMps(root=mps_root, host_root="/run/nvidia/mps", driver=DRIVER, inventory=inventory,
                           modes_factory=NoModes, log=log, recorder=Recorder())
        sharing = NodeSharing(driver=DRIVER, mps=manager, log=log, no_mps_reason="")
    preparer = ClaimPreparer(driver=DRIVER, pool=NODE, checkpoint_path=str(plugin_dir / "checkpoint.json"),
                             lock_path=str(plugin_dir / "pu.lock"),
                             specs=ClaimSpecWriter(str(work / "cdi"), config, inventory, facts),
                             get_claim=lambda ns, name: claims.get((ns, name)), view=lambda: view, log=log,
                             sharing=sharing)
    preparer.restore(None)
    server = DraServer(driver=DRIVER, plugin_dir=str(plugin_dir), registry_dir=str(work / "registry"),
                       prepare=preparer.prepare, unprepare=preparer.unprepare, log=log,
                       on_registered=lambda registered, error: None)
    server.start()
    try:
        yield server.plugin_socket
    finally:
        server.stop()
        if sharing is not None:
            sharing.stop()
            shutil.rmtree(mps_root, ignore_errors=True)


def bench_prepare(rounds: int) -> list[tuple[str, ...]]:
    """Prepare and unprepare p50 / p99 over the plugin's gRPC socket, for claims of 1 and 8 GPUs."""
    from nvdp.daemon.grpc_import import grpc
    from nvdp.dra.kubelet.api import dra_v1_pb2 as api
    from nvdp.dra.kubelet.api import dra_v1_pb2_grpc

    inventory = load_profile(PROFILE)
    names = [d.name for d in dra_devices(inventory)]
    claims: dict[tuple[str, str], dict[str, Any]] = {}
    times: dict[tuple[str, int], list[float]] = {(call, n): [] for call in ("prepare", "unprepare")
                                                 for n in SIZES}
    with tempfile.TemporaryDirectory(prefix="nvdp-bench-dra-") as tmp, \
            dra_plugin(Path(tmp), inventory, claims) as socket_path, \
            grpc.insecure_channel(f"unix://{socket_path}") as channel:
        stub: Any = dra_v1_pb2_grpc.DRAPluginStub(channel)  # type: ignore[no-untyped-call]
        for n in range(WARMUP_ROUNDS + rounds):
            for size in SIZES:
                uid = str(uuid.uuid4())
                name = f"claim-{size}-{n}"
                claims[(NAMESPACE, name)] = allocated_claim(name, uid, names[:size])
                claim = api.Claim(namespace=NAMESPACE, uid=uid, name=name)
                t0 = time.perf_counter()
                prepared = stub.NodePrepareResources(api.NodePrepareResourcesRequest(claims=[claim]),
                                                     timeout=CALL_TIMEOUT_S)
                t1 = time.perf_counter()
                unprepared = stub.NodeUnprepareResources(api.NodeUnprepareResourcesRequest(claims=[claim]),
                                                         timeout=CALL_TIMEOUT_S)
                t2 = time.perf_counter()
                answer = prepared.claims[uid]
                if answer.error or len(answer.devices) != size or unprepared.claims[uid].error:
                    raise RuntimeError(f"claim of {size}: prepare {answer.error or len(answer.devices)}, "
                                       f"unprepare {unprepared.claims[uid].error or 'ok'}")
                del claims[(NAMESPACE, name)]
                if n >= WARMUP_ROUNDS:
                    times[("prepare", size)].append((t1 - t0) * 1000)
                    times[("unprepare", size)].append((t2 - t1) * 1000)
    table: list[tuple[str, ...]] = [("call", "claim", f"p50 ({rounds} calls)", "p99")]
    for (call, size), values in times.items():
        table.append((f"Node{call.capitalize()}Resources", f"{size} GPU{'s' if size > 1 else ''}",
                      f"{percentile(values, 50):.2f} ms", f"{percentile(values, 99):.2f} ms"))
    return table


def bench_mps(rounds: int) -> list[tuple[str, ...]]:
    """Prepare p50 / p99 of an MPS claim of 1 GPU, with its GPU's MPS daemon not up, and up."""
    from nvdp.daemon.grpc_import import grpc
    from nvdp.dra.kubelet.api import dra_v1_pb2 as api
    from nvdp.dra.kubelet.api import dra_v1_pb2_grpc
    from sim.mps import BIN_DIR

    os.environ["PATH"] = f"{BIN_DIR}:{os.environ['PATH']}"
    inventory = load_profile(PROFILE)
    gpu0 = dra_devices(inventory)[0].name
    sharing = {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 25,
                                                "defaultPinnedDeviceMemoryLimit": "2Gi"}}
    claims: dict[tuple[str, str], dict[str, Any]] = {}
    times: dict[str, list[float]] = {"not up": [], "up": []}
    with tempfile.TemporaryDirectory(prefix="nvdp-bench-dra-") as tmp, \
            dra_plugin(Path(tmp), inventory, claims, mps=True) as socket_path, \
            grpc.insecure_channel(f"unix://{socket_path}") as channel:
        stub: Any = dra_v1_pb2_grpc.DRAPluginStub(channel)  # type: ignore[no-untyped-call]

        def one(name: str) -> tuple[Any, float]:
            uid = str(uuid.uuid4())
            claims[(NAMESPACE, name)] = allocated_claim(name, uid, [gpu0], sharing)
            claim = api.Claim(namespace=NAMESPACE, uid=uid, name=name)
            t0 = time.perf_counter()
            answer = stub.NodePrepareResources(api.NodePrepareResourcesRequest(claims=[claim]),
                                               timeout=CALL_TIMEOUT_S).claims[uid]
            if answer.error:
                raise RuntimeError(f"MPS claim {name}: {answer.error}")
            return claim, (time.perf_counter() - t0) * 1000

        def done(claim: Any) -> None:
            stub.NodeUnprepareResources(api.NodeUnprepareResourcesRequest(claims=[claim]),
                                        timeout=CALL_TIMEOUT_S)

        warmup = 3
        # A lone claim: its prepare starts the daemon, its unprepare stops it.
        for n in range(warmup + rounds):
            claim, ms = one(f"lone-{n}")
            done(claim)
            if n >= warmup:
                times["not up"].append(ms)
        anchor, _ = one("anchor")
        for n in range(warmup + rounds):  # the anchor keeps the daemon up: a prepare joins it
            claim, ms = one(f"joining-{n}")
            done(claim)
            if n >= warmup:
                times["up"].append(ms)
        done(anchor)
    table: list[tuple[str, ...]] = [("NodePrepareResources, MPS claim of 1 GPU", f"p50 ({rounds} calls)",
                                     "p99")]
    for case, values in times.items():
        table.append((f"its GPU's MPS daemon {case}", f"{percentile(values, 50):.1f} ms",
                      f"{percentile(values, 99):.1f} ms"))
    return table


# --- API requests in steady state -----------------------------------------------------------------------


class Cycles:
    """Counts the watch's lists (one per watch cycle) and shortens its server-side timeout."""

    def __init__(self, seconds: int | None) -> None:
        self.seconds = seconds
        self.lists = 0

    def watcher_class(self) -> type:
        from nvdp.kube import SliceWatcher

        cycles = self

        class CountedWatcher(SliceWatcher):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                if cycles.seconds is not None:
                    kwargs["watch_timeout_range_s"] = (cycles.seconds, cycles.seconds)
                super().__init__(*args, **kwargs)

            def _list(self) -> str:
                cycles.lists += 1
                return super()._list()

        return CountedWatcher


def api_requests(plane: Any) -> dict[str, int]:
    """Requests the API server has finished, for ResourceSlices and Nodes, by "VERB resource" (its own
    apiserver_request_total; a watch counts when it ends)."""
    counts: dict[str, int] = {}
    for line in plane.metrics().splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels, _, value = line.rpartition(" ")
        fields = dict(part.split("=", 1) for part in labels[labels.index("{") + 1:-1].split(","))
        resource = fields.get("resource", "").strip('"')
        if resource in ("resourceslices", "nodes"):
            key = f"{fields.get('verb', '').strip(chr(34))} {resource}"
            counts[key] = counts.get(key, 0) + int(float(value))
    return counts


def delta(after: Mapping[str, int], before: Mapping[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in sorted(after) if after[k] != before.get(k, 0)}


def bench_api(minutes: float, republish_s: float, watch_cycle_s: int | None) -> list[tuple[str, ...]]:
    """The publisher with its watch against a throwaway API server: requests per node per hour, counted
    by the API server and by the publisher."""
    from nvdp.dra.pool.publish import SlicePublisher
    from nvdp.kube import connect
    from nvdp.kube.watch import WATCH_TIMEOUT_RANGE_S
    from tests.kube.envtest import ControlPlane, unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"no throwaway kube-apiserver: {reason}")
    devices: Sequence[DraDevice] = dra_devices(load_profile(PROFILE))
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="nvdp-bench-kube-", dir=base) as tmp:
        plane = ControlPlane(Path(tmp))
        try:
            plane.start()
            plane.create_node(NODE)
            cycles = Cycles(watch_cycle_s)
            before_start = api_requests(plane)
            publisher = SlicePublisher(connect(str(plane.admin_kubeconfig)), node=NODE, driver=DRIVER,
                                       log=quiet_log("bench-dra-publish"))
            first_writes = publisher.publish(devices, frozenset())
            with mock.patch("nvdp.dra.pool.publish.SliceWatcher", cycles.watcher_class()):
                publisher.start_watch(connect(str(plane.admin_kubeconfig)))
            deadline = time.monotonic() + 30
            while cycles.lists == 0:
                if time.monotonic() > deadline:
                    raise RuntimeError("the slice watch did not start within 30 s")
                time.sleep(0.05)
            time.sleep(1.0)  # the watch request is on its way
            at_start, ours_at_start = api_requests(plane), publisher.requests()
            republished = republish_writes = 0
            stop_at = time.monotonic() + minutes * 60
            while time.monotonic() < stop_at:
                time.sleep(min(republish_s, max(0.0, stop_at - time.monotonic())))
                republish_writes += publisher.publish(devices, frozenset())
                republished += 1
            steady = delta(api_requests(plane), at_start)
            ours = publisher.requests() - ours_at_start
            publisher.stop()
        finally:
            plane.stop()
    start = delta(at_start, before_start)
    hours = minutes / 60
    total = sum(steady.values())
    watches = steady.get("WATCH resourceslices", 0)
    lists = steady.get("LIST resourceslices", 0)
    other = total - watches - lists
    mean_cycle_s = sum(WATCH_TIMEOUT_RANGE_S) / 2

    def verbs(counts: Mapping[str, int]) -> str:
        return ", ".join(f"{n} {k}" for k, n in counts.items()) or "none"

    table: list[tuple[str, ...]] = [("figure", "measured")]
    table.append((f"start (publish: {first_writes} write; the watch), per the API server",
                   f"{sum(start.values())}: {verbs(start)}"))
    table.append((f"steady {minutes:g} min, {republished} publish() calls every {republish_s:g} s, "
                  "per the API server", f"{total}: {verbs(steady)}"))
    table.append(("steady, per publisher.requests() / API writes", f"{ours} / {republish_writes}"))
    if watch_cycle_s is None:
        table.append(("requests per node per hour (steady count extrapolated)", f"{total / hours:.1f}"))
        return table
    if not watches:
        raise RuntimeError(f"no watch ended in {minutes:g} min with a {watch_cycle_s} s watch timeout")
    per_hour = (watches + lists) / watches * 3600 / mean_cycle_s + other / hours
    table.append((f"requests per watch cycle (timeout shortened to {watch_cycle_s} s)",
                  f"{(watches + lists) / watches:.2f}"))
    table.append((f"requests per node per hour at the watch's timeout {WATCH_TIMEOUT_RANGE_S[0]}-"
                  f"{WATCH_TIMEOUT_RANGE_S[1]} s (mean {mean_cycle_s:g} s)", f"{per_hour:.1f}"))
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Benchmark the DRA plugin: prepare latency, API traffic.")
    parser.add_argument("--prepare", action="store_true", help="NodePrepareResources / Unprepare only")
    parser.add_argument("--api", action="store_true", help="API requests per node per hour only")
    parser.add_argument("--mps", action="store_true", help="NodePrepareResources of MPS claims only")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 50 rounds, 0.5 min")
    parser.add_argument("--rounds", type=int, default=300, help="prepare+unprepare rounds per claim size")
    parser.add_argument("--minutes", type=float, default=2.0, help="steady-state window of --api")
    parser.add_argument("--republish-s", type=float, default=5.0,
                        help="seconds between publish() calls with unchanged devices (default 5)")
    parser.add_argument("--watch-cycle", type=int, default=20, metavar="S",
                        help="shorten the watch's server-side timeout to S seconds (default 20)")
    parser.add_argument("--real-timeouts", action="store_true",
                        help="keep the watch's own 15-30 min timeout and extrapolate the raw count")
    args = parser.parse_args(argv)
    both = not (args.prepare or args.api or args.mps)
    rounds, minutes = (50, 0.5) if args.quick else (args.rounds, args.minutes)
    print(f"load average: {load_average()}")
    try:
        if args.prepare or both:
            if os.geteuid() != 0:
                print("skipped the prepare part: the fake driver root's device nodes need root (mknod)")
            else:
                print_rows(bench_prepare(rounds))
        if args.mps:
            if os.geteuid() != 0:
                print("skipped the MPS part: the fake driver root's device nodes need root (mknod)")
            else:
                print_rows(bench_mps(min(rounds, 40) if args.quick else rounds))
        if args.api or both:
            print()
            print_rows(bench_api(minutes, args.republish_s, None if args.real_timeouts else args.watch_cycle))
    except (RuntimeError, OSError, TimeoutError) as err:
        print(f"benchmark failed: {err}", file=sys.stderr)
        return 1
    print(f"load average: {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
