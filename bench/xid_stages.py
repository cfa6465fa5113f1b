"""Where XID -> Unhealthy goes, stage by stage, for nvdp and the floor in the same rounds.

    .venv/bin/python bench/xid_stages.py [--rounds 4] [--events 7]

Both plugins run on nvdp's stand-in NVML (a100-sxm-8) with the kubelet simulator, as in
plugin_bench.py's XID figure. Each plugin process is started through a wrapper that stamps
`time.perf_counter()` (CLOCK_MONOTONIC, the same clock in every process) at four points, without
changing what the plugin does:

- A: NVML's event wait returned (pynvml's `nvmlEventSetWait_v2`);
- B: the new health reached the serving side (nvdp: `ResourceServer.update`; the floor:
  `DevicePlugin.mark_unhealthy`);
- Y: the ListAndWatch stream hands gRPC the new list (the generator yields);
- R: gRPC has sent it and resumes the generator.

The simulator stamps when its stream reader has the list (S) and when the waiting caller sees it
(end). Printed: the median of every stage over all events, per plugin, and nvdp minus the floor.
The stamps cost a few microseconds each, the same for both.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent)]

from plugin_bench import FLOOR, NVDP, RESOURCE, interleaved, plugin  # noqa: E402

_STAMPS = r"""
import atexit, json, os, sys, time
import pynvml
STAMPS = []
clock = time.perf_counter

def _stamp_wait(wait):
    def stamped(*args):
        data = wait(*args)
        STAMPS.append(("A", clock()))
        return data
    return stamped

def stamp_entry(cls, name, label):
    original = getattr(cls, name)
    def stamped(self, *args, **kwargs):
        STAMPS.append((label, clock()))
        return original(self, *args, **kwargs)
    setattr(cls, name, stamped)

def stamp_stream(cls, name):
    original = getattr(cls, name)
    def stamped(self, *args, **kwargs):
        for message in original(self, *args, **kwargs):
            STAMPS.append(("Y", clock()))
            yield message
            STAMPS.append(("R", clock()))
    setattr(cls, name, stamped)

pynvml.nvmlEventSetWait_v2 = _stamp_wait(pynvml.nvmlEventSetWait_v2)
atexit.register(lambda: json.dump(STAMPS, open(os.environ["XID_STAMPS"], "w")))
"""

_NVDP = _STAMPS + r"""
from nvdp.plugin import server, servicer
stamp_entry(server.ResourceServer, "update", "B")
stamp_stream(servicer.DevicePluginServicer, "_stream")
from nvdp.plugin.main import main
sys.exit(main())
"""

_FLOOR = _STAMPS + r"""
import floor_plugin
stamp_entry(floor_plugin.DevicePlugin, "mark_unhealthy", "B")
stamp_stream(floor_plugin.DevicePlugin, "ListAndWatch")
sys.exit(floor_plugin.main())
"""

STAGES = (
    ("XID written -> NVML returns it (stand-in)", "t0", "A"),
    ("NVML returns -> the server has the new health", "A", "B"),
    ("-> the stream yields the new list", "B", "Y"),
    ("yield -> gRPC has sent it", "Y", "R"),
    ("yield -> the simulator's reader has it", "Y", "S"),
    ("-> the waiting caller sees it", "S", "end"),
    ("XID written -> Unhealthy seen (total)", "t0", "end"),
)


def one_plugin(kind: str, events: int, work: Path) -> list[dict[str, float]]:
    """One plugin process: `events` XIDs, one GPU at a time; each event's stamps by point."""
    stamps_file = work / f"stamps-{kind}.json"
    wrapper = _FLOOR if kind == FLOOR else _NVDP
    marks = []
    with plugin("a100-sxm-8", kind=kind, python_args=["-c", wrapper],
                extra_env={"XID_STAMPS": str(stamps_file)}) as run:
        node, kubelet = run.node, run.kubelet
        assert node is not None
        count = len(node.inventory.gpus)
        kubelet.wait_for_resource(RESOURCE, count=count, healthy=count, timeout=30)
        time.sleep(1.0)  # as plugin_bench.xid_ms: start-up work is over
        for n in range(min(events, count)):
            seen_before = len(kubelet.events)
            t0 = time.perf_counter()
            node.inject_xid(node.inventory.gpus[n].uuid, 48)
            kubelet.wait_for_resource(RESOURCE, count=count, healthy=count - 1 - n, timeout=15)
            end = time.perf_counter()
            lists = [e["monotonic"] for e in kubelet.events[seen_before:] if e["type"] == "devices"]
            marks.append({"t0": t0, "S": lists[-1], "end": end})
            time.sleep(0.2)
    deadline = time.monotonic() + 5
    while not stamps_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    stamps = json.loads(stamps_file.read_text())
    events_seen = []
    for mark in marks:
        points = dict(mark)
        for label, at in stamps:
            # gRPC may resume the stream (R) just after the caller has seen the list.
            if mark["t0"] <= at <= mark["end"] + 0.005 and label not in points:
                points[label] = at
        if all(label in points for label in "ABYR"):
            events_seen.append(points)
    return events_seen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--events", type=int, default=7, help="XIDs per plugin per round (at most 8)")
    args = parser.parse_args(argv)
    kinds = (NVDP, FLOOR)
    with tempfile.TemporaryDirectory(prefix="nvdp-xid-stages-") as tmp:
        per_round, loads = interleaved(kinds, args.rounds,
                                       lambda kind: one_plugin(kind, args.events, Path(tmp)))
    seen = {kind: [event for events in rounds for event in events] for kind, rounds in per_round.items()}
    print(f"{args.rounds} rounds x {args.events} events, medians in ms; load average: {' | '.join(loads)}")
    print(f"{'stage':48} {'nvdp':>7} {'floor':>7} {'nvdp-floor':>10}")
    for title, start, stop in STAGES:
        medians = [statistics.median(e[stop] - e[start] for e in seen[k]) * 1000 for k in kinds]
        print(f"{title:48} {medians[0]:7.3f} {medians[1]:7.3f} {medians[0] - medians[1]:+10.3f}")
    print(f"events with every stamp: nvdp {len(seen[NVDP])}, floor {len(seen[FLOOR])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
