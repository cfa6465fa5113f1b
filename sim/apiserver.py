"""A throwaway etcd + kube-apiserver (the envtest convention), for the tests and the DRA demo.

Binaries come from `$KUBEBUILDER_ASSETS` (default /tmp/nvdp-k8s/assets/bin: kube-apiserver, etcd,
kubectl), as controller-runtime's setup-envtest provides them. Each control plane gets free ports, its
own PKI (openssl) and etcd data in the folder it is given, and the API server runs with the Node and
RBAC authorizers and the default admission plugins including ValidatingAdmissionPolicy, like a real
cluster. Never installed with nvdp.

`ControlPlane.service_account_kubeconfig(namespace, name)` mints a token kubeconfig for a
ServiceAccount (created if missing), so RBAC can be tested as the workload would see it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

DEFAULT_ASSETS = "/tmp/nvdp-k8s/assets/bin"
BINARIES = ("kube-apiserver", "etcd", "kubectl")
START_TIMEOUT_S = 60.0


def assets_dir() -> Path:
    return Path(os.environ.get("KUBEBUILDER_ASSETS") or DEFAULT_ASSETS)


def missing(assets: Path) -> list[str]:
    """What a control plane needs and `assets` (or this machine: openssl) lacks; [] when nothing."""
    lacking = [name for name in BINARIES if not os.access(assets / name, os.X_OK)]
    if shutil.which("openssl") is None:
        lacking.append("openssl (on PATH)")
    return lacking


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(directory: Path) -> None:
    """CA, API-server serving cert (127.0.0.1/localhost), admin client cert, service-account key."""
    directory.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=nvdp-test-ca", cwd=directory)
    signed = {
        "apiserver": ("/CN=kube-apiserver", "extendedKeyUsage=serverAuth\n"
                      "subjectAltName=IP:127.0.0.1,DNS:localhost,IP:10.0.0.1,DNS:kubernetes.default.svc\n"),
        "admin": ("/O=system:masters/CN=nvdp-test-admin", "extendedKeyUsage=clientAuth\n"),
    }
    for name, (subject, ext) in signed.items():
        (directory / f"{name}.ext").write_text("basicConstraints=CA:FALSE\n" + ext)
        _openssl("req", "-new", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject,
                 cwd=directory)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.crt",
                 cwd=directory)
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=directory)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=directory)


class ControlPlane:
    """etcd + kube-apiserver on free ports under `workdir`; `start()`, `restart_apiserver()`, `stop()`."""

    def __init__(self, workdir: Path, assets: Path | None = None, feature_gates: str = "") -> None:
        """`feature_gates`: kube-apiserver's --feature-gates ("DRADeviceTaints=false"); empty: defaults."""
        self.workdir = workdir
        self.feature_gates = feature_gates
        self.assets = assets or assets_dir()
        self.pki = workdir / "pki"
        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()
        self.port = free_port()
        self.server = f"https://127.0.0.1:{self.port}"
        self.admin_kubeconfig = workdir / "admin.kubeconfig"
        self._etcd: subprocess.Popen[bytes] | None = None
        self._apiserver: subprocess.Popen[bytes] | None = None

    # -- processes -------------------------------------------------------------------------------
    def start(self) -> None:
        make_pki(self.pki)
        self._write_kubeconfig(self.admin_kubeconfig, "admin", {
            "client-certificate": str(self.pki / "admin.crt"), "client-key": str(self.pki / "admin.key")})
        self._start_etcd()
        self.start_apiserver()

    def _start_etcd(self) -> None:
        data = self.workdir / "etcd"
        client, peer = f"http://127.0.0.1:{self.etcd_port}", f"http://127.0.0.1:{self.etcd_peer_port}"
        self._etcd = self._spawn("etcd", [
            str(self.assets / "etcd"), "--name", "test", "--data-dir", str(data),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"test={peer}", "--log-level", "warn"])
        self._wait("etcd healthy", lambda: self._http_ok(f"{client}/health"))

    def start_apiserver(self) -> None:
        p = self.pki
        self._apiserver = self._spawn("kube-apiserver", [
            str(self.assets / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.port}",
            f"--tls-cert-file={p / 'apiserver.crt'}", f"--tls-private-key-file={p / 'apiserver.key'}",
            f"--client-ca-file={p / 'ca.crt'}", f"--cert-dir={self.workdir / 'certs'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={p / 'sa.pub'}",
            f"--service-account-signing-key-file={p / 'sa.key'}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--authorization-mode=Node,RBAC",
            # The defaults (ValidatingAdmissionPolicy among them, GA since 1.30) plus NodeRestriction.
            "--enable-admission-plugins=NodeRestriction,ValidatingAdmissionPolicy",
            "--allow-privileged=true", "--v=0",
            *([f"--feature-gates={self.feature_gates}"] if self.feature_gates else [])])
        self._wait("kube-apiserver ready", lambda: self._api_ok("/readyz"))
        # RBAC bootstrap roles and the default namespace appear just after /readyz.
        self._wait("default namespace", lambda: self._api_ok("/api/v1/namespaces/default"))

    def kill_apiserver(self) -> None:
        """SIGKILL, as a crashed or OOM-killed API server; etcd keeps the state."""
        if self._apiserver is not None:
            self._apiserver.send_signal(signal.SIGKILL)
            self._apiserver.wait(10)
            self._apiserver = None

    def restart_apiserver(self) -> None:
        self.kill_apiserver()
        self.start_apiserver()

    def stop(self) -> None:
        # A throwaway API server has nothing to drain; SIGTERM would make it wait ~10 s for that.
        self.kill_apiserver()
        for proc in (self._etcd,):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        self._apiserver = self._etcd = None

    @property
    def apiserver_pid(self) -> int | None:
        return self._apiserver.pid if self._apiserver is not None else None

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def _wait(self, what: str, ready: object) -> None:
        assert callable(ready)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for proc, name in ((self._etcd, "etcd"), (self._apiserver, "kube-apiserver")):
                if proc is not None and proc.poll() is not None:
                    raise RuntimeError(f"{name} exited ({proc.returncode}); log: {self.log_tail(name)}")
            if ready():
                return
            time.sleep(0.1)
        raise RuntimeError(f"timed out waiting for {what}; apiserver log: {self.log_tail('kube-apiserver')}")

    def log_tail(self, name: str, lines: int = 20) -> str:
        path = self.workdir / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    # -- HTTP ------------------------------------------------------------------------------------
    def _ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx

    @staticmethod
    def _http_ok(url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                return bool(resp.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def _api_ok(self, path: str) -> bool:
        try:
            with urllib.request.urlopen(self.server + path, timeout=2, context=self._ssl_context()) as resp:
                return bool(resp.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def metrics(self) -> str:
        """The API server's Prometheus /metrics text (admin)."""
        ctx = self._ssl_context()
        with urllib.request.urlopen(self.server + "/metrics", timeout=10, context=ctx) as resp:
            return str(resp.read().decode())

    # -- kubectl and kubeconfigs -----------------------------------------------------------------
    def kubectl(self, *args: str, kubeconfig: Path | None = None, input_text: str | None = None,
                check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.assets / "kubectl"), "--kubeconfig", str(kubeconfig or self.admin_kubeconfig), *args],
            input=input_text, capture_output=True, text=True, check=check, timeout=60)

    def apply(self, manifest: str) -> None:
        self.kubectl("apply", "-f", "-", input_text=manifest)

    def create_node(self, name: str, labels: dict[str, str] | None = None) -> None:
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}}}
        self.kubectl("create", "-f", "-", input_text=json.dumps(node))

    def service_account_kubeconfig(self, namespace: str, name: str, duration: str = "2h") -> Path:
        """A kubeconfig that authenticates as ServiceAccount namespace/name with a fresh bound token."""
        if self.kubectl("get", "namespace", namespace, check=False).returncode != 0:
            self.kubectl("create", "namespace", namespace)
        if self.kubectl("-n", namespace, "get", "serviceaccount", name, check=False).returncode != 0:
            self.kubectl("-n", namespace, "create", "serviceaccount", name)
        token = self.kubectl("-n", namespace, "create", "token", name,
                             f"--duration={duration}").stdout.strip()
        path = self.workdir / f"sa-{namespace}-{name}.kubeconfig"
        self._write_kubeconfig(path, f"system:serviceaccount:{namespace}:{name}", {"token": token})
        return path

    def _write_kubeconfig(self, path: Path, user: str, credentials: dict[str, str]) -> None:
        config = {
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "test", "cluster": {"server": self.server,
                                                      "certificate-authority": str(self.pki / "ca.crt")}}],
            "users": [{"name": user, "user": credentials}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": user}}],
            "current-context": "test",
        }
        path.write_text(json.dumps(config, indent=2))
        path.chmod(0o600)
