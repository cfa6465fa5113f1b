"""What /readyz and /healthz answer, as plain functions of the plugin's state.

Ready: the kubelet's socket is there and every planned resource is registered with the kubelet, or
is an MPS resource waiting for its control daemon (the plugin is doing what it should; the reason is
in the body, the `nvdp_mps_daemon_ready` series and a Node Event). A kubelet whose socket is gone
(stopped, or restarting) has forgotten the plugin's resources: not ready until they are registered
again. A node without GPUs plans nothing and is ready.
Live: the manager answers (no deadlock), every started gRPC server answers a call on its socket,
and the health loop woke up recently. A kubelet that is away makes the plugin unready, never dead:
restarting the plugin would not bring the kubelet back.
"""

from __future__ import annotations

from collections.abc import Sequence

from msgspec import Struct

from nvdp.daemon.report.endpoints import Response


class ResourceStatus(Struct, frozen=True):
    name: str
    registered: bool
    waiting: str | None = None  # why an MPS resource is held back, while it is
    healthy: int = 0  # devices advertised healthy
    unhealthy: int = 0


class Check(Struct, frozen=True):
    name: str
    problem: str | None = None  # None: fine


def readiness(state: str | None, resources: Sequence[ResourceStatus], kubelet_absent: str | None = None
              ) -> Response:
    """`state`: None once serving; else why the plugin is not serving yet ("starting").
    `kubelet_absent`: why the kubelet cannot be reached (its socket is gone), else None."""
    if state is not None:
        return Response(503, f"not ready: {state}\n".encode())
    lines = []
    ready = True
    if kubelet_absent is not None and resources:
        ready = False
        lines.append(f"kubelet: {kubelet_absent}")
    for resource in resources:
        if kubelet_absent is not None:
            lines.append(f"{resource.name}: not registered (no kubelet)")
        elif resource.registered:
            lines.append(f"{resource.name}: registered")
        elif resource.waiting:
            lines.append(f"{resource.name}: {resource.waiting}")
        else:
            ready = False
            lines.append(f"{resource.name}: not registered with the kubelet yet")
    if not resources:
        lines.append("no resources planned on this node")
    head = "ready" if ready else "not ready"
    return Response(200 if ready else 503, "\n".join([head, *lines, ""]).encode())


def liveness(checks: Sequence[Check]) -> Response:
    failed = [c for c in checks if c.problem is not None]
    lines = [f"{c.name}: {c.problem or 'ok'}" for c in checks]
    head = "not live" if failed else "live"
    return Response(503 if failed else 200, "\n".join([head, *lines, ""]).encode())
