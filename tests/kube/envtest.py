"""A throwaway etcd + kube-apiserver for tests (the envtest convention, `sim.apiserver`), and pytest
fixtures for it.

Binaries come from `$KUBEBUILDER_ASSETS` (default /tmp/nvdp-k8s/assets/bin: kube-apiserver, etcd,
kubectl). Each control plane gets free ports, its own PKI and etcd data in a temporary directory, and
the API server runs with the Node and RBAC authorizers and the default admission plugins including
ValidatingAdmissionPolicy, like a real cluster. It never touches the shared node's 6443 server.

Fixtures (activated for every test folder by tests/conftest.py):
- `kube_api` (session): one shared control plane; use unique object names per test.
- `kube_api_private` (function): a control plane of one's own, for tests that restart or stop it.
Both skip with the reason printed when the binaries or root are missing.

`ControlPlane.service_account_kubeconfig(namespace, name)` mints a token kubeconfig for a
ServiceAccount (created if missing), so RBAC can be tested as the workload would see it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sim.apiserver import ControlPlane, assets_dir, missing

__all__ = ["ControlPlane", "kube_api", "kube_api_private", "kube_api_without_device_taints",
           "unavailable_reason"]


def unavailable_reason() -> str | None:
    """Why no control plane can be started here, or None."""
    if os.geteuid() != 0:
        return "needs root (the kit's binaries and state are root-owned)"
    lacking = missing(assets_dir())
    if lacking:
        return (f"KUBEBUILDER_ASSETS={assets_dir()} lacks {', '.join(lacking)}: "
                "run ../shared/k8s/setup.sh as root (scripts/test.sh does when it can)")
    return None


def _control_plane(prefix: str, feature_gates: str = "") -> Iterator[ControlPlane]:
    reason = unavailable_reason()
    if reason is not None:
        print(f"\nSKIP (no throwaway kube-apiserver): {reason}")
        pytest.skip(reason)
    # /dev/shm keeps etcd's fsyncs off the disk: the suite shares two cores with everything else.
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    workdir = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    plane = ControlPlane(workdir, feature_gates=feature_gates)
    try:
        try:
            plane.start()
        except (RuntimeError, subprocess.CalledProcessError, OSError) as err:
            plane.stop()
            print(f"\nSKIP (throwaway kube-apiserver did not start): {err}")
            pytest.skip(f"throwaway control plane did not start: {err}")
        yield plane
    finally:
        plane.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def kube_api() -> Iterator[ControlPlane]:
    """One etcd + kube-apiserver for the whole session; tests must use unique object names."""
    yield from _control_plane("nvdp-kube-")


@pytest.fixture
def kube_api_private() -> Iterator[ControlPlane]:
    """A control plane for one test only: for tests that kill or restart the API server."""
    yield from _control_plane("nvdp-kube-private-")


@pytest.fixture
def kube_api_without_device_taints() -> Iterator[ControlPlane]:
    """A control plane for one test whose API server has the DRADeviceTaints gate off (it drops taints)."""
    yield from _control_plane("nvdp-kube-notaints-", feature_gates="DRADeviceTaints=false")
