"""Import time and RSS of candidate Kubernetes clients, each in a fresh interpreter.

Usage: python bench/kube_client_choice.py NAME=PYTHON [NAME=PYTHON ...] [--kubeconfig FILE] [--runs 5]
where NAME is lightkube, kr8s, kubernetes or none (bare interpreter) and PYTHON is an interpreter
with that client installed (one virtualenv per client, so none pays for another's dependencies).
Prints a table of medians: import time (what the plugin imports to watch a Node and write Events),
time to build a client from a kubeconfig, RSS after both, and the number of loaded modules.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess

PROBE = r'''
import json, sys, time
which, kubeconfig = sys.argv[1], sys.argv[2]
def rss_kib():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))
t0 = time.perf_counter()
if which == "lightkube":
    from lightkube import Client, KubeConfig
    from lightkube.resources.core_v1 import Event, Node
    t1 = time.perf_counter()
    Client(KubeConfig.from_file(kubeconfig))
elif which == "kr8s":
    import kr8s
    from kr8s.objects import Event, Node
    t1 = time.perf_counter()  # kr8s.api() contacts the server (version check): not built here
elif which == "kubernetes":
    from kubernetes import client, config, watch
    t1 = time.perf_counter()
    config.load_kube_config(kubeconfig)
    client.CoreV1Api()
else:
    t1 = time.perf_counter()
t2 = time.perf_counter()
print(json.dumps({"import_ms": (t1 - t0) * 1e3, "client_ms": (t2 - t1) * 1e3,
                  "rss_mib": rss_kib() / 1024, "modules": len(sys.modules)}))
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("clients", nargs="+", help="NAME=PYTHON")
    parser.add_argument("--kubeconfig", default="/tmp/nvdp-k8s/admin.kubeconfig")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(f"| client | import (ms) | build client (ms) | RSS (MiB) | modules |  (median of {args.runs})")
    print("|---|---|---|---|---|")
    for spec in args.clients:
        name, python = spec.split("=", 1)
        runs = [json.loads(subprocess.run([python, "-c", PROBE, name, args.kubeconfig], check=True,
                                          capture_output=True, text=True).stdout) for _ in range(args.runs)]
        med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        print(f"| {name} | {med['import_ms']:.0f} | {med['client_ms']:.0f} | {med['rss_mib']:.1f} "
              f"| {med['modules']:.0f} |")


if __name__ == "__main__":
    main()
