"""Dynamic MIG benchmark: a claim's prepare with its MIG device made, and the pool's size on 8 H100s.

    .venv/bin/python bench/mig_bench.py [--rounds 200]

**Prepare** runs the DRA plugin's real `ClaimPreparer` (checkpoint written with fsync under its file
lock) with `ClaimInstances` over `nvdp.inventory.mig_control.MigControl`, on the stand-in NVML of the
profile h100-mig-dynamic (its MIG state in a temporary folder, as on a node), the claims from an
in-memory `get_claim` and the CDI specs in memory (their cost is `dra_bench.py --prepare`'s). Each round
prepares one claim for each of 3g.40gb (placement 0), 2g.20gb (4) and 1g.10gb (6), then unprepares the
three. The time inside NVML's create and destroy calls is measured apart, so nvdp's share is the rest.

**Pool** is what `nvdp.dra.pool.contents` publishes for 8 such GPUs: slices, devices, counter sets, and the
largest slice's JSON size, against the API's limits. **Offered profiles** compares that pool with the one
`flags.migDynamicProfiles: [1g.10gb, 3g.40gb]` gives (`--profiles` for another list): devices, slices and
the bytes the node's slices hold (what the API server stores and the scheduler converts for every node
it checks).

The prepare part re-runs itself in a process whose NVML is the stand-in (the library is found by
LD_LIBRARY_PATH at process start). Exit status 0 with the tables.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src"), str(ROOT / "bench")]

from plugin_bench import load_average, percentile, print_rows  # noqa: E402

MARK = "NVDP_MIG_BENCH_CHILD"
CLAIMS = (("big", "gpu-0-mig-3g40gb-9-0"), ("mid", "gpu-0-mig-2g20gb-14-4"),
          ("small", "gpu-0-mig-1g10gb-19-6"))


def child(rounds: int) -> dict[str, Any]:
    """In the stand-in's process: the prepare rounds; their times, as JSON-able lists."""
    from nvdp.config.loader import load_config
    from nvdp.dra.claims.check import NodeView
    from nvdp.dra.claims.mig import ClaimInstances
    from nvdp.dra.claims.preparer import ClaimPreparer
    from nvdp.dra.claims.records import ClaimRef
    from nvdp.dra.pool.contents import pool_devices
    from nvdp.dra.pool.devices import by_name
    from nvdp.inventory.mig_control import MigControl
    from nvdp.inventory.nvml import discover
    from tests.dra.test_prepare import Cluster, Specs, claim

    class Timed(MigControl):
        spent = 0.0

        def create(self, *args: Any) -> Any:
            start = time.perf_counter()
            try:
                return super().create(*args)
            finally:
                Timed.spent += time.perf_counter() - start

        def destroy(self, *args: Any) -> None:
            start = time.perf_counter()
            try:
                super().destroy(*args)
            finally:
                Timed.spent += time.perf_counter() - start

    log = logging.getLogger("mig-bench")
    log.addHandler(logging.NullHandler())
    log.propagate = False
    config = load_config(None, {}, {"flags.migStrategy": "dynamic", "flags.mode": "dra"})
    view = by_name(pool_devices(config, discover()))
    work = Path(tempfile.mkdtemp(prefix="mig-bench-"))
    out: dict[str, list[float]] = {"prepare": [], "prepare_nvml": [], "unprepare": [], "unprepare_nvml": []}
    for r in range(rounds + 10):
        cluster = Cluster(*(claim(name, f"u-{name}-{r}", device) for name, device in CLAIMS))
        preparer = ClaimPreparer(driver="gpu.nvidia.com", pool="node-a",
                                 checkpoint_path=str(work / "cp.json"), lock_path=str(work / "pu.lock"),
                                 specs=Specs(), get_claim=cluster.get, view=lambda: NodeView(view), log=log,
                                 instances=ClaimInstances(Timed(), log))
        preparer.restore(None)
        for name, _ in CLAIMS:
            ref = ClaimRef(namespace="default", uid=f"u-{name}-{r}", name=name)
            Timed.spent = 0.0
            start = time.perf_counter()
            answer = preparer.prepare([ref])[ref.uid]
            took = time.perf_counter() - start
            if answer.error:
                raise RuntimeError(answer.error)
            if r >= 10:
                out["prepare"].append(took)
                out["prepare_nvml"].append(Timed.spent)
        for name, _ in CLAIMS:
            ref = ClaimRef(namespace="default", uid=f"u-{name}-{r}", name=name)
            Timed.spent = 0.0
            start = time.perf_counter()
            error = preparer.unprepare([ref])[ref.uid]
            took = time.perf_counter() - start
            if error:
                raise RuntimeError(error)
            if r >= 10:
                out["unprepare"].append(took)
                out["unprepare_nvml"].append(Timed.spent)
    return out


def prepare_rows(rounds: int) -> list[tuple[str, ...]]:
    from sim.nvml import NodeSim

    with tempfile.TemporaryDirectory() as folder, NodeSim("h100-mig-dynamic", Path(folder) / "state") as node:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NVML_SIM_")}
        env.update(node.env)
        env.update({MARK: str(rounds), "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])})
        done = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True,
                              timeout=900, check=False)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    times = json.loads(done.stdout.strip().splitlines()[-1])
    rows: list[tuple[str, ...]] = [
        ("call (per claim, one MIG device)", "p50 ms", "p99 ms", "NVML's part p50 ms", "nvdp's part p50 ms")]
    for call in ("prepare", "unprepare"):
        total, nvml = times[call], times[f"{call}_nvml"]
        own = [t - n for t, n in zip(total, nvml, strict=True)]
        rows.append((f"Node{call.title()}Resources ({len(total)} claims)",
                     f"{percentile(total, 50) * 1000:.2f}", f"{percentile(total, 99) * 1000:.2f}",
                     f"{percentile(nvml, 50) * 1000:.2f}", f"{percentile(own, 50) * 1000:.2f}"))
    return rows


def _eight_h100s() -> Any:
    from msgspec.structs import replace

    from nvdp.inventory.model import Inventory
    from nvdp.inventory.profile import load_profile
    from sim.nvml import resolve_profile

    one = load_profile(resolve_profile("h100-mig-dynamic")).gpus[0]
    gpus = tuple(replace(one, index=i, minor=i, uuid=f"{one.uuid[:-2]}{i:02d}") for i in range(8))
    return Inventory(driver_version="580.159.04", cuda_driver_version="13.0", gpus=gpus)


def pool_rows() -> list[tuple[str, ...]]:
    from nvdp.config.loader import load_config
    from nvdp.dra.pool.contents import pool_devices
    from nvdp.dra.pool.slices import desired_slices

    inventory = _eight_h100s()
    config = load_config(None, {}, {"flags.migStrategy": "dynamic", "flags.mode": "dra"})
    devices = pool_devices(config, inventory)
    slices = desired_slices(node="node-a", node_uid="uid", driver="gpu.nvidia.com", devices=devices)
    sizes = [len(json.dumps(s)) for s in slices]
    held = [len(s["spec"].get("devices") or []) for s in slices]
    sets = [len(s["spec"].get("sharedCounters") or []) for s in slices]
    counters = max(len(c["counters"]) for s in slices for c in s["spec"].get("sharedCounters") or [])
    fields = max(len(d.get("attributes", {})) + len(d.get("capacity", {}))
                 for s in slices for d in s["spec"].get("devices") or [])
    return [
        ("8 x H100 80GB, migStrategy dynamic", "measured", "the API's limit"),
        ("slices (counter slices + device slices)", f"{len(slices)} ({sum(1 for n in sets if n)} + "
         f"{sum(1 for n in held if n)})", "-"),
        ("devices", str(len(devices)), "-"),
        ("devices per slice (largest)", str(max(held)), "64 (devices consuming counters)"),
        ("counter sets per slice", str(max(sets)), "8"),
        ("counters per set", str(counters), "32"),
        ("attributes + capacities per device (largest)", str(fields), "32"),
        ("largest slice, JSON bytes", str(max(sizes)), "1.5 MiB (etcd's request limit)"),
    ]


def offered_rows(profiles: list[str]) -> list[tuple[str, ...]]:
    """The node's slices with every profile and with `profiles` only: devices, slices, bytes."""
    from nvdp.config.loader import load_config
    from nvdp.dra.pool.contents import pool_devices
    from nvdp.dra.pool.slices import desired_slices

    inventory = _eight_h100s()
    columns = []
    for offered in (None, profiles):
        overrides: dict[str, object] = {"flags.migStrategy": "dynamic", "flags.mode": "dra"}
        if offered is not None:
            overrides["flags.migDynamicProfiles"] = offered
        devices = pool_devices(load_config(None, {}, overrides), inventory)
        slices = desired_slices(node="node-a", node_uid="uid", driver="gpu.nvidia.com", devices=devices)
        # As the API server stores them (compact JSON), metadata as the plugin writes it.
        sizes = [len(json.dumps(s, separators=(",", ":"))) for s in slices]
        columns.append((len(devices), len(slices), sum(sizes), max(sizes)))
    (d0, s0, b0, m0), (d1, s1, b1, m1) = columns
    return [
        ("8 x H100 80GB, migStrategy dynamic", "every profile", f"[{', '.join(profiles)}]", "saved"),
        ("devices", str(d0), str(d1), f"{1 - d1 / d0:.0%}"),
        ("slices", str(s0), str(s1), str(s0 - s1)),
        ("the node's slices, JSON bytes", str(b0), str(b1), f"{1 - b1 / b0:.0%}"),
        ("largest slice, JSON bytes", str(m0), str(m1), f"{1 - m1 / m0:.0%}"),
        ("... for 50 / 200 / 500 such nodes, MB", " / ".join(f"{b0 * n / 1e6:.1f}" for n in (50, 200, 500)),
         " / ".join(f"{b1 * n / 1e6:.1f}" for n in (50, 200, 500)), ""),
    ]


def main(argv: list[str] | None = None) -> int:
    if os.environ.get(MARK):
        print(json.dumps(child(int(os.environ[MARK]))))
        return 0
    parser = argparse.ArgumentParser(description="Benchmark dynamic MIG: prepare with MIG devices, pools.")
    parser.add_argument("--rounds", type=int, default=200, help="rounds of three claims (default 200)")
    parser.add_argument("--profiles", default="1g.10gb,3g.40gb",
                        help="comma list of the offered profiles to compare (default %(default)s)")
    parser.add_argument("--pool-only", action="store_true", help="the pool tables only, no prepare rounds")
    args = parser.parse_args(argv)
    print(f"load average: {load_average()}")
    if not args.pool_only:
        print_rows(prepare_rows(args.rounds))
        print()
    print_rows(pool_rows())
    print()
    print_rows(offered_rows([p.strip() for p in args.profiles.split(",") if p.strip()]))
    print(f"load average: {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
