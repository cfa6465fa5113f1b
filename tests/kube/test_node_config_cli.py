"""`nvdp config show --node` against a real API server, and `nvdp plan --config-dir --label`."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.kube.envtest import ControlPlane

pytestmark = pytest.mark.slow  # starts processes

LABEL = "nvidia.com/device-plugin.config"
TS = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - {name: nvidia.com/gpu, replicas: 4}\n"
BROKEN = "version: v1\nflags:\n  migStrategy: sometimes\n"


def nvdp(*args: str, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin"}
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    return subprocess.run(
        [sys.executable, "-m", "nvdp.cli", *args], capture_output=True, text=True, env=env, timeout=60
    )


def test_config_show_node_reads_the_label_and_the_configmap(kube_api: ControlPlane) -> None:
    node = f"gpu-{uuid.uuid4().hex[:8]}"
    kube_api.create_node(node, {LABEL: "ts"})
    ns = f"cli-{uuid.uuid4().hex[:6]}"
    kube_api.kubectl("create", "namespace", ns)
    kube_api.apply(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "cfgs", "namespace": ns},
                "data": {"default": "version: v1\n", "ts": TS, "broken": BROKEN},
            }
        )
    )
    shown = nvdp(
        "config", "show", "--node", node, "--configmap", f"{ns}/cfgs", kubeconfig=kube_api.admin_kubeconfig
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"# node {node} ({LABEL}=ts) gets entry 'ts' (from label) of {ns}/cfgs")
    assert "replicas: 4" in shown.stdout

    kube_api.kubectl("label", "node", node, f"{LABEL}-")
    shown = nvdp(
        "config", "show", "--node", node, "--configmap", f"{ns}/cfgs", kubeconfig=kube_api.admin_kubeconfig
    )
    assert shown.returncode == 0 and "gets entry 'default' (from fallback named)" in shown.stdout, (
        shown.stderr
    )

    kube_api.kubectl("label", "node", node, f"{LABEL}=h100")
    shown = nvdp(
        "config", "show", "--node", node, "--configmap", f"{ns}/cfgs", kubeconfig=kube_api.admin_kubeconfig
    )
    assert shown.returncode == 2
    assert "names config 'h100', which does not exist (entries: broken, default, ts)" in shown.stderr

    kube_api.kubectl("label", "node", node, f"{LABEL}=broken", "--overwrite")
    shown = nvdp(
        "config", "show", "--node", node, "--configmap", f"{ns}/cfgs", kubeconfig=kube_api.admin_kubeconfig
    )
    assert (
        shown.returncode == 2
        and "migStrategy" in shown.stderr
        and "keeps its previous config" in shown.stderr
    )

    missing = nvdp(
        "config",
        "show",
        "--node",
        "no-such-node",
        "--configmap",
        f"{ns}/cfgs",
        kubeconfig=kube_api.admin_kubeconfig,
    )
    assert missing.returncode == 2 and "404" in missing.stderr and "Traceback" not in missing.stderr


def test_plan_with_config_dir_and_label(tmp_path: Path) -> None:
    (tmp_path / "default").write_text("version: v1\n")
    (tmp_path / "ts").write_text(TS)
    planned = nvdp("plan", "--config-dir", str(tmp_path), "--label", "ts", "--node", "t4")
    assert planned.returncode == 0, planned.stderr
    assert "Entry: entry 'ts' (from label)" in planned.stdout
    assert "time-slicing x4" in planned.stdout
    unlabelled = nvdp("plan", "--config-dir", str(tmp_path), "--node", "t4", "--json")
    assert json.loads(unlabelled.stdout)["entry"].startswith("Entry: entry 'default' (from fallback named)")
    unknown = nvdp("plan", "--config-dir", str(tmp_path), "--label", "mps", "--node", "t4")
    assert unknown.returncode == 2 and "entries: default, ts" in unknown.stderr
