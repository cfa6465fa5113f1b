"""What the serving process carries, counted rather than timed (timings live in bench/).

A plugin process on the stand-in NVML (8x A100), registered with the kubelet simulator, is probed
after start and after a burst of Allocate calls: the modules it imported, its threads, the NVML
calls an Allocate makes (none: answers come from the plan), and, in-process, what one Allocate
allocates. Each bound says what it protects; raise one only with the reason in bench/RESULTS.md.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sim.kubelet import KubeletSim
from sim.nvml import NodeSim

pytestmark = pytest.mark.slow  # starts processes

ROOT = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).with_name("serving_probe.py")
GPU = "nvidia.com/gpu"
ALLOCATES = 200

# Loaded only for work the serving process does not do: gRPC's asyncio server and channel (asyncio
# and grpc.aio stay stand-ins, see nvdp.daemon.grpc_import; their submodules come with the real
# ones), validating an invalid config (jsonschema and its helpers), parsing a config file (yaml),
# TLS (ssl: gRPC over unix sockets needs none), hashing config-directory entries (hashlib loads
# libcrypto; only with CONFIG_DIR), suggesting key names (difflib), packaging (importlib.resources,
# zipfile), and what those pull in. (uuid and platform do load: msgspec, the records' library, imports
# them.) No dataclasses either: each frozen one compiles six methods at import, ~0.6 ms a class; records
# are msgspec Structs (see bench/RESULTS.md).
NOT_IMPORTED = (
    "jsonschema", "referencing", "rpds", "attrs", "yaml", "ssl", "_ssl", "difflib", "dataclasses",
    "importlib.resources", "zipfile", "email", "http", "urllib.request", "multiprocessing",
    "google.protobuf.json_format", "fastjsonschema", "hashlib", "_hashlib", "asyncio.events",
    "asyncio.base_events", "grpc.aio._server", "grpc.aio._channel",
)  # fmt: skip
# 306 modules on Python 3.11 with grpcio 1.85, 16 of them msgspec's and 5 the health rules' (nvdp.health
# and the duration parser; the NVML re-check and the record's module load only when used), 14 the
# daemon skeleton's (nvdp.daemon: 8 more than the same code had inside nvdp.plugin); the bound leaves
# room for a library upgrade, not for a new dependency of the serving path (an HTTP client alone adds
# ~100).
MAX_MODULES = 310
# Main, health events, kubelet.sock watcher; per resource its own thread (start, register, retry),
# gRPC's accept thread and pool workers (the ListAndWatch stream holds one). C threads: gRPC's event
# engine and timers.
MAX_PYTHON_THREADS = 8
MAX_OS_THREADS = 16
# gRPC's pool starts workers as calls arrive, up to its size (8), even for sequential calls.
MAX_PYTHON_THREADS_SERVING = 14


@dataclass
class Served:
    process: subprocess.Popen[bytes]
    kubelet: KubeletSim
    probe_path: Path
    log_path: Path

    def probe(self) -> dict[str, Any]:
        self.probe_path.unlink(missing_ok=True)
        self.process.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while not self.probe_path.exists():
            assert self.process.poll() is None, self.log_path.read_text()
            assert time.monotonic() < deadline, "the probe did not answer SIGUSR1"
            time.sleep(0.01)
        result: dict[str, Any] = json.loads(self.probe_path.read_text())
        return result


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with tempfile.TemporaryDirectory(prefix="nvdp-fp-") as tmp:
        work = Path(tmp)
        node = NodeSim("a100-sxm-8", work / "state")
        plugin_dir = work / "dp"
        env = {k: v for k, v in os.environ.items() if k not in ("CONFIG_FILE", "DEVICE_PLUGIN_PATH")}
        env.update(node.env)
        env.update(DEVICE_PLUGIN_PATH=str(plugin_dir), NVDP_PROBE_OUT=str(work / "probe.json"),
                   PYTHONPATH=os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")]))
        log_path = work / "plugin.log"
        with KubeletSim(plugin_dir) as kubelet, open(log_path, "wb") as log:
            process = subprocess.Popen([sys.executable, str(PROBE)], env=env, stdout=log,
                                       stderr=subprocess.STDOUT)
            try:
                kubelet.wait_for_resource(GPU, count=8, healthy=8, timeout=30)
                deadline = time.monotonic() + 30
                while "Health checks:" not in log_path.read_text():
                    assert time.monotonic() < deadline, log_path.read_text()
                    time.sleep(0.02)
                yield Served(process, kubelet, work / "probe.json", log_path)
            finally:
                process.send_signal(signal.SIGTERM)
                process.wait(15)


@pytest.fixture(scope="module")
def probes(served: Served) -> tuple[dict[str, Any], dict[str, Any]]:
    # Start-up ends a few statements after the "Health checks:" line, by freezing the heap: a probe
    # taken in between sees nothing frozen yet, so it is taken again (a plugin that never freezes
    # still fails the freeze test once this gives up).
    after_start = served.probe()
    deadline = time.monotonic() + 10
    while after_start["gc_frozen"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
        after_start = served.probe()
    device = served.kubelet.devices(GPU)[0]["id"]
    for _ in range(ALLOCATES):
        served.kubelet.allocate(GPU, [[device]])
    return after_start, served.probe()


@pytest.mark.slow
def test_serving_process_imports_only_what_it_serves_with(probes: tuple[dict[str, Any], ...]) -> None:
    after_start, after_allocates = probes
    for probe in probes:
        loaded = set(probe["modules"])
        assert [m for m in NOT_IMPORTED if m in loaded] == []
        assert probe["not_loaded"] == ["asyncio", "grpc.aio"]
    assert len(after_start["modules"]) <= MAX_MODULES, after_start["modules"]
    assert set(after_allocates["modules"]) == set(after_start["modules"]), "Allocate imported modules"


def test_allocate_makes_no_nvml_calls(probes: tuple[dict[str, Any], ...]) -> None:
    after_start, after_allocates = probes
    calls = after_start["nvml_calls"]
    assert calls.get("nvmlInit", 0) + calls.get("nvmlInitWithFlags", 0) > 0, "the probe counts nothing"
    # The health thread waits for events in a loop; anything else counted here came from Allocate.
    waits = ("nvmlEventSetWait", "nvmlEventSetWait_v2")
    made = {k: v - after_start["nvml_calls"].get(k, 0) for k, v in after_allocates["nvml_calls"].items()}
    assert {k: v for k, v in made.items() if v and k not in waits} == {}


def test_threads_after_start_and_after_allocates(probes: tuple[dict[str, Any], ...]) -> None:
    after_start, after_allocates = probes
    assert len(after_start["threads"]) <= MAX_PYTHON_THREADS, after_start["threads"]
    assert after_start["os_threads"] <= MAX_OS_THREADS
    assert len(after_allocates["threads"]) <= MAX_PYTHON_THREADS_SERVING, after_allocates["threads"]


def test_allocate_allocates_little_and_keeps_nothing(tmp_path: Path) -> None:
    """In-process: the handler answering from the plan; tracemalloc counts what it allocates."""
    from nvdp.config.loader import load_config
    from nvdp.inventory.profile import load_profile
    from nvdp.plan import plan
    from nvdp.plugin.api import deviceplugin_pb2 as pb
    from nvdp.plugin.server import ResourceServer
    from sim.nvml import resolve_profile

    inventory = load_profile(resolve_profile("a100-sxm-8"))
    config = load_config(None, {}, {})
    [resource] = plan(config, inventory).resources
    log = logging.getLogger("footprint")
    handler = logging.FileHandler(tmp_path / "plugin.log")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False  # pytest's log capture keeps every record
    server = ResourceServer(resource, config, inventory, logger=log, dev_paths_present=bool)
    request = pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devices_ids=[resource.devices[0].id])]
    )
    try:
        first = server.service.Allocate(request, None)
        gc.collect()
        blocks_before = sys.getallocatedblocks()
        for _ in range(ALLOCATES):
            assert server.service.Allocate(request, None) is first  # the plan's answer, not a new one
        gc.collect()
        kept_blocks = sys.getallocatedblocks() - blocks_before
        tracemalloc.start()
        server.service.Allocate(request, None)
        tracemalloc.reset_peak()
        server.service.Allocate(request, None)
        current, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    finally:
        log.removeHandler(handler)
        handler.close()
    assert kept_blocks < ALLOCATES / 20
    # One call's transient allocations: the log record and its formatting, nothing per device.
    assert peak - current < 4096, peak - current


def test_start_up_objects_are_frozen_out_of_the_cyclic_gc(probes: tuple[dict[str, Any], ...]) -> None:
    """A full collection must not walk the ~34k objects loaded at start (a multi-ms Allocate stall)."""
    after_start, after_allocates = probes
    assert after_start["gc_frozen"] > 10_000
    # What the resource threads made after the freeze (starting, registering): under 1k measured.
    assert after_start["gc_tracked"] < 5_000
    assert after_allocates["gc_tracked"] - after_start["gc_tracked"] < ALLOCATES, "Allocate leaves objects"
