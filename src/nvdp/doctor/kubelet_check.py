"""The doctor's kubelet checks: the kubelet's device-plugin socket, and each planned resource served
and registered (per the plugin's /readyz, else the kubelet's checkpoint)."""

from __future__ import annotations

import http.client
import json
import os
import socket
import urllib.request
from pathlib import Path

from nvdp.config.model import Config
from nvdp.doctor.report import Finding, failed, passed, skipped
from nvdp.doctor.where import Where, read_text
from nvdp.inventory.model import Inventory
from nvdp.plan.model import Plan

CHECKPOINT = "kubelet_internal_checkpoint"
FIX_SCHEDULING = (
    "check that the plugin pod runs on this node: `kubectl -n <namespace> get pods -o wide "
    "--field-selector spec.nodeName=<node>`; if the DaemonSet has no pod here, its nodeSelector or "
    "affinity does not match the node's labels (the chart's default wants nvidia.com/gpu.present=true "
    "or the NFD PCI label: `kubectl label node <node> nvidia.com/gpu.present=true`)"
)


class KubeletChecks:
    where: Where
    config: Config
    inventory: Inventory | None
    plan: Plan | None

    def kubelet(self) -> Finding:
        title = "kubelet device-plugin socket"
        path = self.config.flags.plugin.kubelet_socket_path
        fix = (
            "start the kubelet, or point the plugin at its socket: chart value devicePlugin.kubeletRootDir "
            "(k3s: /var/lib/rancher/k3s/agent/kubelet, microk8s: /var/snap/microk8s/common/var/lib/kubelet), "
            "env DEVICE_PLUGIN_PATH / KUBELET_SOCKET; on Kubernetes before 1.10 the kubelet also needs "
            "--feature-gates=DevicePlugins=true"
        )
        if not os.path.exists(path):
            return failed("kubelet", title, f"no kubelet socket at {path}", fix)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(2.0)
            try:
                sock.connect(path)
            except OSError as err:
                return failed(
                    "kubelet", title, f"{path} exists but does not accept connections ({err.strerror})", fix
                )
        return passed("kubelet", title, f"{path} accepts connections")

    def registration(self) -> Finding:
        from nvdp.doctor.dra_check import dra_node, node_mode
        from nvdp.plugin.grpc_client import server_answers
        from nvdp.plugin.server import socket_path_for

        title = "the plugin serves and is registered"
        dra = dra_node(self.where.env)
        if dra.on and node_mode(self.config, self.where.env, dra) == "dra":
            return skipped("registration", title, f"this node serves its GPUs through DRA (driver "
                           f"{dra.driver}), not the device-plugin API; the dra checks below look at that")
        if self.plan is None:
            why = "NVML did not load" if self.inventory is None else "the config is not usable (see below)"
            return skipped("registration", title, f"cannot tell which resources to expect: {why}")
        if not self.plan.resources:
            return passed("registration", title, "nothing to serve: the plan has no resources on this node")
        registered, how = self._registered()
        problems, served = [], []
        for resource in self.plan.resources:
            path = socket_path_for(resource, self.config)
            if not os.path.exists(path):
                problems.append(f"{resource.name}: no plugin socket {path}")
                continue
            silent = server_answers(path)
            if silent:
                problems.append(f"{resource.name}: the plugin {silent}")
            elif registered is not None and resource.name not in registered:
                problems.append(f"{resource.name}: served, but not registered with the kubelet ({how})")
            else:
                served.append(resource.name)
        if problems:
            fix = (
                FIX_SCHEDULING
                if any("no plugin socket" in p for p in problems)
                else (
                    "read the plugin's log (`kubectl logs` of the plugin pod): it says why registration fails"
                )
            )
            return failed("registration", title, "; ".join(problems), fix)
        state = (
            f"registered ({how})"
            if registered is not None
            else "registration not verifiable (no /readyz, no kubelet checkpoint)"
        )
        return passed("registration", title, f"{', '.join(served)} served; {state}")

    def _registered(self) -> tuple[set[str] | None, str]:
        """Resources the kubelet knows: from the plugin's /readyz, else the kubelet's checkpoint."""
        for variable in ("HEALTH_ADDRESS", "METRICS_ADDRESS"):
            address = self.where.env.get(variable, "")
            if not address:
                continue
            host, _, port = address.rpartition(":")
            host = "127.0.0.1" if host in ("", "0.0.0.0", "[::]") else host.strip("[]")
            try:
                with urllib.request.urlopen(f"http://{host}:{port}/readyz", timeout=3) as answer:
                    body = answer.read().decode()
            except (OSError, http.client.HTTPException, ValueError) as err:
                body = getattr(err, "read", lambda: b"")().decode() if hasattr(err, "read") else ""
            if body:
                names = {
                    line.split(": ", 1)[0] for line in body.splitlines() if line.endswith(": registered")
                }
                return names, "per the plugin's /readyz"
        checkpoint = read_text(Path(self.config.flags.plugin.device_plugin_path) / CHECKPOINT)
        if checkpoint:
            try:
                data = json.loads(checkpoint)["Data"]["RegisteredDevices"] or {}
                return set(data), "per the kubelet's checkpoint"
            except (ValueError, KeyError, TypeError):
                pass
        return None, ""

    # --- 7-9: config, MPS, MIG -------------------------------------------------------------------
