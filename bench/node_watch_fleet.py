"""Fleet cost of per-node config: N Node watchers against a real kube-apiserver.

Starts a throwaway etcd + kube-apiserver (the kit's binaries, $KUBEBUILDER_ASSETS, free ports: never
the shared 6443 server), creates N Node objects, then runs two phases of equal length:
  1. baseline: no watchers;
  2. watchers: N `nvdp.kube.NodeWatcher`s (threads, each with its own client and connection, exactly
     what each plugin runs), while a few labels are flipped every interval.
For each phase it reports the API server's requests by verb for nodes (from its /metrics), its CPU
(utime+stime of the process) and RSS, and for phase 2 the label-change delivery latency.

    .venv/bin/python bench/node_watch_fleet.py                      # 200 watchers, 2 x 10 min
    .venv/bin/python bench/node_watch_fleet.py --nodes 20 --minutes 1   # smoke run
Needs root and KUBEBUILDER_ASSETS (scripts/test.sh sets the kit up).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nvdp.kube import NodeLabels, NodeWatcher, connect, patch_node_labels
from nvdp.kube.watch import WATCH_TIMEOUT_RANGE_S
from tests.kube.envtest import ControlPlane, unavailable_reason

LABEL = "nvidia.com/device-plugin.config"
REQUEST_LINE = re.compile(r'^apiserver_request_total\{([^}]*)\} ([0-9.e+]+)$')
CLK_TCK = os.sysconf("SC_CLK_TCK")


def node_requests(metrics: str) -> dict[str, float]:
    """verb -> count of API requests on nodes (all codes), from the apiserver's /metrics."""
    out: dict[str, float] = {}
    for line in metrics.splitlines():
        match = REQUEST_LINE.match(line)
        if not match:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
        if labels.get("resource") != "nodes" or labels.get("subresource"):
            continue
        out[labels["verb"]] = out.get(labels["verb"], 0.0) + float(match.group(2))
    return out


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class Phase:
    name: str
    seconds: float = 0.0
    requests: dict[str, float] = field(default_factory=dict)
    cpu_s: float = 0.0
    rss_start: float = 0.0
    rss_end: float = 0.0
    rss_max: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    flips: int = 0


def measure(plane: ControlPlane, phase: Phase, seconds: float, during: threading.Event | None = None,
            tick: object = None) -> None:
    pid = plane.apiserver_pid
    assert pid is not None
    before = node_requests(plane.metrics())
    cpu0, phase.rss_start = cpu_seconds(pid), rss_mib(pid)
    phase.rss_max = phase.rss_start
    start = time.monotonic()
    while (left := seconds - (time.monotonic() - start)) > 0:
        time.sleep(min(10.0, left))
        phase.rss_max = max(phase.rss_max, rss_mib(pid))
        if callable(tick):
            tick()
    phase.seconds = time.monotonic() - start
    phase.cpu_s = cpu_seconds(pid) - cpu0
    phase.rss_end = rss_mib(pid)
    after = node_requests(plane.metrics())
    phase.requests = delta(before, after)


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {verb: after.get(verb, 0) - before.get(verb, 0) for verb in sorted(set(after) | set(before))}


def open_watches(metrics: str) -> float:
    """Watches on nodes the API server is serving right now."""
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith("apiserver_longrunning_requests{") and 'resource="nodes"' in line \
                and 'verb="WATCH"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--flip-every", type=float, default=30.0, help="seconds between label flips")
    parser.add_argument("--flip-count", type=int, default=2, help="nodes flipped each time")
    parser.add_argument("--watch-timeout", type=int, nargs=2, metavar=("MIN", "MAX"),
                        default=list(WATCH_TIMEOUT_RANGE_S),
                        help="server-side watch timeout range in seconds (the plugin's by default)")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = parser.parse_args()
    # SIGTERM ends the run through `finally`, so the throwaway API server and etcd are stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    reason = unavailable_reason()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    workdir = Path(tempfile.mkdtemp(prefix="nvdp-fleet-", dir=shm))
    plane = ControlPlane(workdir)
    plane.start()
    try:
        names = [f"gpu-{i:04d}" for i in range(args.nodes)]
        items = [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": n, "labels": {LABEL: "a"}}}
                 for n in names]
        plane.kubectl("create", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                   "items": items}))
        seconds = args.minutes * 60
        print(f"{args.nodes} nodes; baseline {args.minutes} min, then {args.nodes} watchers "
              f"{args.minutes} min", flush=True)
        baseline = Phase("no watchers")
        measure(plane, baseline, seconds)

        sent: dict[str, tuple[str, float]] = {}
        watched = Phase(f"{args.nodes} watchers")
        lock = threading.Lock()
        connected = threading.Semaphore(0)

        def make_callback(name: str) -> object:
            first = [True]

            def on_change(node: NodeLabels) -> None:
                if first[0]:
                    first[0] = False
                    connected.release()
                    return
                with lock:
                    value, at = sent.get(name, ("", 0.0))
                    if node.labels.get(LABEL) == value:
                        watched.latencies_ms.append((time.monotonic() - at) * 1e3)
            return on_change

        before_start = node_requests(plane.metrics())
        started_at = time.monotonic()
        watchers = []
        for name in names:
            callback = make_callback(name)
            assert callable(callback)
            watcher = NodeWatcher(connect(plane.admin_kubeconfig), name, callback,
                                  watch_timeout_range_s=(args.watch_timeout[0], args.watch_timeout[1]))
            watcher.start()
            watchers.append(watcher)
        for _ in names:
            if not connected.acquire(timeout=120):
                print("not every watcher connected within 120 s", file=sys.stderr)
                break
        start_s = time.monotonic() - started_at
        start_requests = delta(before_start, node_requests(plane.metrics()))
        admin = connect(plane.admin_kubeconfig)
        next_flip = [time.monotonic() + args.flip_every]
        current = dict.fromkeys(names, "a")

        def flip() -> None:
            if time.monotonic() < next_flip[0]:
                return
            next_flip[0] += args.flip_every
            for name in random.sample(names, args.flip_count):
                value = random.choice([v for v in ("a", "b", "c") if v != current[name]])
                current[name] = value
                with lock:
                    sent[name] = (value, time.monotonic())
                patch_node_labels(admin, name, {LABEL: value})
                watched.flips += 1

        measure(plane, watched, seconds, tick=flip)
        watches_open = open_watches(plane.metrics())
        for watcher in watchers:
            watcher.stop(timeout_s=0.1)
    finally:
        plane.stop()

    hours = watched.seconds / 3600
    flips = watched.requests.get("PATCH", 0)
    watcher_requests = sum(v for k, v in watched.requests.items() if k != "PATCH")
    baseline_requests = sum(baseline.requests.values())
    print()
    print("| phase | length | node requests by verb | apiserver CPU (% of a core) "
          "| RSS start / end / max (MiB) |")
    print("|---|---|---|---|---|")
    for phase in (baseline, watched):
        verbs = ", ".join(f"{k} {v:.0f}" for k, v in phase.requests.items() if v) or "none"
        cpu = 100 * phase.cpu_s / phase.seconds
        print(f"| {phase.name} | {phase.seconds / 60:.1f} min | {verbs} | {cpu:.2f} "
              f"| {phase.rss_start:.0f} / {phase.rss_end:.0f} / {phase.rss_max:.0f} |")
    per_node_hour = (watcher_requests - baseline_requests) / args.nodes / hours
    verbs = ", ".join(f"{k} {v:.0f}" for k, v in start_requests.items() if v)
    print()
    print(f"start-up: {args.nodes} watchers connected in {start_s:.1f} s ({verbs}; a watch is counted when "
          f"it ends); {watches_open:.0f} node watches open at the end")
    print(f"steady state: {watcher_requests - baseline_requests:.0f} watcher requests (all but the flips' "
          f"PATCH, minus baseline) = {per_node_hour:.2f} per node per hour")
    if watched.latencies_ms:
        lat = sorted(watched.latencies_ms)
        print(f"label flips: {watched.flips} (PATCH {flips:.0f}); delivered {len(lat)}; latency p50 "
              f"{statistics.median(lat):.0f} ms, max {lat[-1]:.0f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps({"baseline": baseline.__dict__, "watched": watched.__dict__,
                                               "per_node_hour": per_node_hour, "start_s": start_s,
                                               "start_requests": start_requests}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
