"""The claim transaction (nvdp.dra.claims) against a real kube-apiserver:

- under migStrategy dynamic, a prepared claim whose MIG device is destroyed behind the plugin's back
  gets it made again at the kubelet's next prepare, with a new UUID, and its `status.devices` entry
  (server-side apply, nvdp.dra.serving.claim_status) is rewritten with that UUID;
- a checkpoint that cannot be read, at a start while the API server does not answer, keeps the claim
  specs and prepares nothing; the next catch-up once it answers rebuilds the prepared claims from
  the claims it lists.

The preparer with dynamic MIG runs in a process of its own on the stand-in NVML (the library is loaded
per process): this module, run with `python -m`, reads one JSON command a line and answers one JSON
line each, so the test drives the same running preparer between its own steps.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

import pytest

from nvdp.dra.claims.check import NodeView
from nvdp.dra.claims.preparer import ClaimPreparer
from nvdp.dra.claims.records import COMPLETED, ClaimRef
from nvdp.kube import connect, get_claim, list_claims
from sim.nvml import REPO_ROOT, NodeSim
from tests.dra.test_prepare import DEVICES, NODE, Specs, no_container_holds_a_claim
from tests.kube.envtest import ControlPlane
from tests.kube.test_claim_reads import allocate, claim_json, create

if TYPE_CHECKING:
    from nvdp.dra.claims.cdi_specs import ClaimSpecWriter

pytestmark = pytest.mark.slow  # a kube-apiserver, and a process on the stand-in's NVML

DRIVER = "gpu.nvidia.com"
PROFILE = "h100-mig-dynamic"
PLACEMENT = "gpu-0-mig-1g10gb-19-0"  # a 1g.10gb MIG device at memory slice 0 of the first H100
ANSWER_TIMEOUT_S = 120.0
LOG = logging.getLogger("test-claim-transaction-api")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def driver_entries(claim: dict[str, Any] | None, device: str) -> list[dict[str, Any]]:
    """The claim's `status.devices` entries of this driver for `device`."""
    assert claim is not None, "the claim is gone from the API server"
    return [e for e in (claim.get("status") or {}).get("devices") or []
            if e.get("driver") == DRIVER and e.get("device") == device]


# --- the preparer's process (python -m tests.kube.test_claim_transaction_api KUBECONFIG WORK POOL) ----


def serve_commands(kubeconfig: str, work: str, pool: str) -> None:
    """A preparer as the DRA plugin wires it for migStrategy dynamic: the stand-in's NVML, the claims
    read from the API server, the MIG devices' UUIDs written into the claims' status. Commands, one
    JSON object a line on stdin: {"do": "devices"} and {"do": "prepare", "namespace", "name", "uid"}."""
    from nvdp.config.loader import load_config
    from nvdp.dra.claims.checkpoint import read_owned_mig
    from nvdp.dra.pool.contents import pool_devices
    from nvdp.dra.pool.devices import DraDevice, by_name
    from nvdp.dra.serving import Serving, claim_instances, claim_status
    from nvdp.inventory.nvml import discover

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    config = load_config(None, {}, {"flags.migStrategy": "dynamic", "flags.mode": "dra"})
    checkpoint = str(Path(work) / "checkpoint.json")
    client = connect(kubeconfig)

    def devices() -> dict[str, DraDevice]:
        return by_name(pool_devices(config, discover(), read_owned_mig(checkpoint).owns))

    # claim_instances reads the config's flags only; the claim specs are the test's own (Specs).
    serving = Serving(config=config, inventory=discover(), devices=devices(),
                      specs=cast("ClaimSpecWriter", None))
    specs = Specs()
    preparer = ClaimPreparer(driver=DRIVER, pool=pool, checkpoint_path=checkpoint,
                             lock_path=str(Path(work) / "pu.lock"), specs=specs,
                             get_claim=lambda ns, name: get_claim(client, ns, name),
                             view=lambda: NodeView(devices()), log=LOG,
                             instances=claim_instances(serving, LOG), status=claim_status(client, DRIVER))
    preparer.restore(lambda: list_claims(client))
    for line in sys.stdin:
        command = json.loads(line)
        answer: dict[str, Any]
        if command["do"] == "devices":
            answer = {"devices": sorted(devices())}
        elif command["do"] == "prepare":
            ref = ClaimRef(namespace=command["namespace"], uid=command["uid"], name=command["name"])
            result = preparer.prepare([ref])[ref.uid]
            entry = preparer.prepared().get(ref.uid)
            made = {} if entry is None else {
                s.device: {"uuid": s.mig.uuid, "parent": s.mig.parent_uuid, "profile": s.mig.profile,
                           "gi_id": s.gi_id}
                for s in entry.made if s.mig is not None}
            answer = {"error": result.error, "devices": [d.device for d in result.devices], "made": made,
                      "state": None if entry is None else entry.state,
                      "status_pending": None if entry is None else entry.status_pending,
                      "spec_made": specs.made.get(ref.uid)}
        else:
            answer = {"error": f"unknown command {command['do']!r}"}
        print(json.dumps(answer), flush=True)


class PreparerProcess:
    """The preparer's process on a NodeSim, driven one command at a time."""

    def __init__(self, node: NodeSim, kubeconfig: Path, work: Path, pool: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NVML_SIM_")}
        env.update(node.env)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT / "src"), str(REPO_ROOT)])
        self.stderr_path = work / "preparer.stderr"
        self._stderr = open(self.stderr_path, "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.kube.test_claim_transaction_api", str(kubeconfig), str(work), pool],
            env=env, cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr)
        self._selector = selectors.DefaultSelector()
        assert self.proc.stdout is not None
        self._selector.register(self.proc.stdout, selectors.EVENT_READ)

    def ask(self, **command: str) -> dict[str, Any]:
        stdin, stdout = cast(IO[bytes], self.proc.stdin), cast(IO[bytes], self.proc.stdout)
        stdin.write(json.dumps(command).encode() + b"\n")
        stdin.flush()
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        while not self._selector.select(timeout=max(0.0, deadline - time.monotonic())):
            if time.monotonic() >= deadline:
                raise AssertionError(f"no answer to {command} in {ANSWER_TIMEOUT_S:.0f} s; "
                                     f"its log: {self.log_tail()}")
        line = stdout.readline()
        if not line:
            raise AssertionError(f"the preparer's process ended ({self.proc.wait(10)}) at {command}; "
                                 f"its log: {self.log_tail()}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def log_tail(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-4000:]

    def close(self) -> None:
        self._selector.close()
        if self.proc.stdin is not None:
            self.proc.stdin.close()  # end of the commands: the process ends
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()


# --- a remade MIG device's UUID in the claim's status ----------------------------------------------


def test_a_remade_mig_device_rewrites_the_claims_status_with_its_new_uuid(
        kube_api: ControlPlane, tmp_path: Path) -> None:
    namespace = unique("mig-status")
    kube_api.kubectl("create", "namespace", namespace)
    work = tmp_path / "work"
    work.mkdir()
    node = NodeSim(PROFILE, tmp_path / "state")
    plugin = PreparerProcess(node, kube_api.admin_kubeconfig, work, NODE)
    try:
        assert PLACEMENT in plugin.ask(do="devices")["devices"], "a placement device the pool publishes"
        made = create(kube_api, claim_json(namespace, "mig"))
        allocate(kube_api, made, NODE, PLACEMENT)
        meta = made["metadata"]
        ref = {"do": "prepare", "namespace": namespace, "name": "mig", "uid": meta["uid"]}
        client = connect(kube_api.admin_kubeconfig)

        first = plugin.ask(**ref)
        assert first["error"] == "" and first["devices"] == [PLACEMENT], plugin.log_tail()
        assert (first["state"], first["status_pending"]) == (COMPLETED, False)
        mig_a = first["made"][PLACEMENT]
        assert mig_a["uuid"].startswith("MIG-") and mig_a["profile"] == "1g.10gb"
        [entry] = driver_entries(get_claim(client, namespace, "mig"), PLACEMENT)
        assert (entry["pool"], entry["data"]) == (
            NODE, {"type": "mig", "uuid": mig_a["uuid"], "parentUUID": mig_a["parent"], "profile": "1g.10gb"})

        # An admin destroys it (nvidia-smi mig -dci / -dgi), behind the plugin's back.
        node.mig_destroy(mig_a["parent"], mig_a["gi_id"])
        assert [m["uuid"] for m in node.mig_instances(mig_a["parent"])] == []

        again = plugin.ask(**ref)  # the kubelet asks again
        assert again["error"] == "" and again["devices"] == [PLACEMENT], plugin.log_tail()
        mig_b = again["made"][PLACEMENT]
        assert mig_b["uuid"].startswith("MIG-") and mig_b["uuid"] != mig_a["uuid"]
        assert [m["uuid"] for m in node.mig_instances(mig_a["parent"])] == [mig_b["uuid"]]
        assert again["spec_made"] == {PLACEMENT: mig_b["uuid"]}, "the CDI spec names the new device"
        assert again["status_pending"] is False, f"the status write is still pending: {plugin.log_tail()}"
        found = get_claim(client, namespace, "mig")
        entries = driver_entries(found, PLACEMENT)
        assert len(entries) == 1, f"one entry of {DRIVER} for {PLACEMENT}, not {entries}"
        assert (entries[0]["pool"], entries[0]["data"]) == (
            NODE, {"type": "mig", "uuid": mig_b["uuid"], "parentUUID": mig_b["parent"], "profile": "1g.10gb"})
        assert found is not None
        assert [e for e in found["status"]["devices"] if e["driver"] == DRIVER] == entries
    finally:
        plugin.close()


# --- a lost checkpoint's rebuild, once the API server answers ----------------------------------------


def test_a_lost_checkpoint_is_rebuilt_at_the_catch_up_once_the_api_server_answers(
        kube_api_private: ControlPlane, tmp_path: Path) -> None:
    plane = kube_api_private
    namespace = unique("rebuild")
    plane.kubectl("create", "namespace", namespace)
    running = [create(plane, claim_json(namespace, f"run-{i}")) for i in (0, 1)]
    for made, device in zip(running, ("gpu-0", "gpu-1"), strict=True):
        allocate(plane, made, NODE, device)
    uids = sorted(c["metadata"]["uid"] for c in running)
    by_device = {d: c["metadata"]["uid"] for c, d in zip(running, ("gpu-0", "gpu-1"), strict=True)}
    deleted = str(uuid.uuid4())  # a spec whose claim the API server does not have
    specs = Specs()
    for uid in (*uids, deleted):
        specs.files[uid] = ["gpu-0"]  # what the pods' containers were started with
    before = dict(specs.files)
    checkpoint = tmp_path / "checkpoint.json"
    checkpoint.write_bytes(b"\x00 not json {")
    client = connect(plane.admin_kubeconfig)
    preparer = ClaimPreparer(driver=DRIVER, pool=NODE, checkpoint_path=str(checkpoint),
                             lock_path=str(tmp_path / "pu.lock"), specs=specs,
                             get_claim=lambda ns, name: get_claim(client, ns, name),
                             view=lambda: NodeView(DEVICES), log=LOG, in_use=no_container_holds_a_claim)

    plane.kill_apiserver()  # the node starts while the API server is away
    assert preparer.restore(lambda: list_claims(client)) is not None, "the checkpoint's problem"
    assert preparer.prepared() == {}
    assert specs.files == before, "no spec removed while nothing is known"
    preparer.catch_up()  # a tick while the API server is still away
    assert preparer.prepared() == {}
    assert specs.files == before

    plane.start_apiserver()
    preparer.catch_up()
    prepared = preparer.prepared()
    assert sorted(prepared) == uids, "both running claims rebuilt"
    assert all(e.state == COMPLETED for e in prepared.values())
    assert {e.devices[0].device: uid for uid, e in prepared.items()} == by_device
    assert specs.files == {by_device["gpu-0"]: ["gpu-0"], by_device["gpu-1"]: ["gpu-1"]}, \
        "the running claims' specs written again; the deleted claim's removed"
    # Rebuilt for good: the claims are prepared, and a prepare answers them without a rebuild.
    again = preparer.prepare([ClaimRef(namespace=namespace, uid=by_device["gpu-1"], name="run-1")])
    assert again[by_device["gpu-1"]].error == ""
    assert [d.device for d in again[by_device["gpu-1"]].devices] == ["gpu-1"]


if __name__ == "__main__":
    serve_commands(sys.argv[1], sys.argv[2], sys.argv[3])
