"""API requests per node per hour of gpu-feature-discovery in steady state, on a real kube-apiserver.

Starts a throwaway etcd + kube-apiserver from the kit's binaries (KUBEBUILDER_ASSETS, as the tests do),
applies the chart's labeller RBAC and admission policy, creates N Nodes and runs one unmodified
`gpu-feature-discovery` process per Node (stand-in NVML, T4 profile), each with a pod-bound token as in
a cluster. Once every Node carries its labels, it counts the API server's own request counter
(apiserver_request_total) over a window and prints requests per node per hour by verb and resource.

    python bench/gfd_api_requests.py --nodes 5 --window 660 --interval 60s

A window longer than the watch's server-side timeout (300-600 s) includes the watch re-opens.
Needs root and the kit (../shared/k8s/setup.sh); prints why and exits 2 otherwise.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nvdp.gfd.options import parse_duration  # noqa: E402
from sim.nvml import NodeSim, build_library  # noqa: E402
from tests.gfd.test_apiserver import NAMESPACE, RELEASE, pod_token_kubeconfig, unique  # noqa: E402
from tests.kube.envtest import ControlPlane, unavailable_reason  # noqa: E402

_SAMPLE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")


def request_counts(plane: ControlPlane) -> Counter[tuple[str, str]]:
    """(verb, resource) -> requests answered so far, for the resources the labeller touches."""
    counts: Counter[tuple[str, str]] = Counter()
    for line in plane.metrics().splitlines():
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group("labels")))
        if labels.get("resource") in ("nodes", "events", "nodefeatures"):
            counts[(labels["verb"], labels["resource"])] += int(float(m.group("value")))
    return counts


def apply_chart_objects(plane: ControlPlane) -> None:
    import json

    import helm_python
    import yaml

    manifests = helm_python.Chart.load(str(ROOT / "charts" / "nvidia-device-plugin")).render(
        {"gfd": {"enabled": True}}, name=RELEASE, namespace=NAMESPACE, is_install=True
    )
    kinds = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
             "ValidatingAdmissionPolicyBinding"}  # fmt: skip
    objects = [d for p, t in manifests.items() if not p.endswith("NOTES.txt")
               for d in yaml.safe_load_all(t) if d and d["kind"] in kinds]  # fmt: skip
    plane.kubectl("create", "namespace", NAMESPACE)
    plane.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5)
    parser.add_argument("--window", type=float, default=660.0, help="seconds of steady state counted")
    parser.add_argument("--interval", default="60s", help="GFD_SLEEP_INTERVAL of the labellers")
    args = parser.parse_args()
    reason = unavailable_reason()
    if reason:
        print(f"cannot run: {reason}")
        return 2
    build_library()
    workdir = Path(tempfile.mkdtemp(prefix="gfd-bench-", dir="/dev/shm"))
    plane = ControlPlane(workdir)
    plane.start()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        apply_chart_objects(plane)
        time.sleep(3)  # the admission policy becomes active
        nodes = [unique("bench") for _ in range(args.nodes)]
        sim = NodeSim("t4", workdir / "state")
        for node in nodes:
            plane.create_node(node)
            env = {k: v for k, v in os.environ.items() if not k.startswith(("GFD_", "NVML_SIM_"))
                   and k not in ("CONFIG_FILE", "KUBECONFIG", "LD_LIBRARY_PATH")}  # fmt: skip
            env.update(sim.env)
            env.update({"NODE_NAME": node, "KUBECONFIG": str(pod_token_kubeconfig(plane, node)),
                        "GFD_SLEEP_INTERVAL": args.interval})  # fmt: skip
            log = open(workdir / f"{node}.log", "ab")  # noqa: SIM115 - closed with the process
            procs.append(subprocess.Popen([sys.executable, "-m", "nvdp.gfd.main"], env=env, stdout=log,
                                          stderr=subprocess.STDOUT))  # fmt: skip
        admin = ["get", "nodes", "-o", "jsonpath={.items[*].metadata.labels.nvidia\\.com/gpu\\.product}"]
        deadline = time.monotonic() + 120
        while plane.kubectl(*admin).stdout.split().count("Tesla-T4") < len(nodes):
            if time.monotonic() > deadline:
                print("labellers did not converge in 120 s")
                return 1
            time.sleep(0.5)
        time.sleep(2)
        before = request_counts(plane)
        start = time.monotonic()
        time.sleep(args.window)
        elapsed = time.monotonic() - start
        after = request_counts(plane)
        labelled = plane.kubectl(*admin).stdout.split().count("Tesla-T4")
        load = os.getloadavg()
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        plane.stop()
    delta = after - before
    per_hour = 3600.0 / elapsed / len(nodes)
    print(f"{len(nodes)} nodes, GFD_SLEEP_INTERVAL={args.interval}, window {elapsed:.0f} s, "
          f"{labelled}/{len(nodes)} labelled at the end, load average {load[0]:.2f} {load[1]:.2f}")
    print(f"{'verb':8} {'resource':14} {'in window':>10} {'per node per hour':>18}")
    total = 0.0
    for (verb, resource), n in sorted(delta.items()):
        print(f"{verb:8} {resource:14} {n:>10} {n * per_hour:>18.1f}")
        total += n * per_hour
    print(f"{'all':8} {'':14} {sum(delta.values()):>10} {total:>18.1f}")
    writes = sum(n for (verb, _), n in delta.items() if verb in ("PATCH", "UPDATE", "POST", "CREATE", "PUT"))
    checks = int(elapsed // parse_duration(args.interval))
    print(f"writes in window: {writes}; NVML re-checks per node in window: {checks}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
