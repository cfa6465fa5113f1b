"""Build an API client: the pod's service account inside a cluster, `KUBECONFIG` (or a given file) outside."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import httpx2
from lightkube import Client, KubeConfig
from lightkube.config.client_adapter import verify_cluster
from lightkube.core.exceptions import ConfigError

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
FIELD_MANAGER = "nvidia-device-plugin"
# Connect, TLS handshake and each read of requests other than watches (a watch has no read timeout):
# a hung API server costs a caller at most this long per call, so loops stay responsive to SIGTERM.
REQUEST_TIMEOUT_S = 5.0
# A watch has no read timeout (it idles until something changes), so a connection that died without
# a FIN/RST (node partitioned, NAT entry dropped) is found by TCP keepalive: dead after ~60 s.
KEEPALIVE_OPTIONS: list[tuple[int, int, int]] = [
    (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
    (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 30),
    (socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 10),
    (socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3),
]


class KubeConnectError(Exception):
    """No usable API-server configuration; the message names what was tried and the fix."""


class NoApiAccess(KubeConnectError):
    """A pod without a service account token: the install gave this daemon no API access on purpose
    (the chart mounts the token only where a feature of the install needs the API)."""


def connect(kubeconfig: str | os.PathLike[str] | None = None, *,
            service_account_dir: Path = SERVICE_ACCOUNT_DIR) -> Client:
    """A client for the API server; nothing is sent until the first request.

    An explicit `kubeconfig` wins; else the service account (in a pod); else `$KUBECONFIG`, else
    `~/.kube/config`.
    """
    try:
        if kubeconfig is not None:
            config = KubeConfig.from_file(kubeconfig)
        elif (service_account_dir / "token").exists() and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config = KubeConfig.from_service_account(service_account_dir)
        else:
            path = os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
            if not Path(path).exists():
                if os.environ.get("KUBERNETES_SERVICE_HOST"):
                    # A pod whose token is not mounted (automountServiceAccountToken: false): the
                    # chart mounts it only where a feature of the install needs the API.
                    raise NoApiAccess(
                        f"no Kubernetes API access: this pod has no service account token "
                        f"({service_account_dir}/token; automountServiceAccountToken is false) and no "
                        f"kubeconfig at {path}"
                    )
                raise KubeConnectError(
                    f"no Kubernetes API configuration: not in a pod (no {service_account_dir}/token or "
                    f"KUBERNETES_SERVICE_HOST) and no kubeconfig at {path}; "
                    "set KUBECONFIG or pass --kubeconfig"
                )
            config = KubeConfig.from_file(path)
        single = config.get()
        if single is None or single.user is None:
            raise KubeConnectError("the kubeconfig has no current context (cluster and user); "
                                   "set current-context or pass a kubeconfig that has one")
        # The transport is built here (not by lightkube) only to add keepalive; it gets the same TLS
        # set-up lightkube would have made from the kubeconfig (CA, client certificate).
        tls = verify_cluster(single.cluster, single.user, single.abs_file, trust_env=False)
    except ConfigError as err:
        raise KubeConnectError(f"invalid Kubernetes API configuration: {err}") from err
    except OSError as err:
        raise KubeConnectError(f"cannot read the Kubernetes API configuration: {err}") from err
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        # lightkube reads the YAML without a schema: a missing key surfaces as KeyError('contexts').
        raise KubeConnectError(f"invalid kubeconfig (missing or malformed {err}); "
                               "check it with `kubectl config view`") from err
    transport = httpx2.HTTPTransport(verify=tls, socket_options=KEEPALIVE_OPTIONS)
    # trust_env=False: a proxy set for image pulls or pip must not capture API-server traffic.
    return Client(single, timeout=httpx2.Timeout(REQUEST_TIMEOUT_S), field_manager=FIELD_MANAGER,
                  trust_env=False, transport=transport)
