"""grpc imported the plugin's way: without Python's ssl, which stays importable for everything else."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_CHECK = """
import sys
from nvdp.plugin.grpc_import import grpc
assert "ssl" not in sys.modules and "_ssl" not in sys.modules, "grpc loaded ssl"
import asyncio.sslproto
assert asyncio.sslproto.ssl is None
import ssl  # an HTTPS client later in the process still gets the real module
assert ssl.create_default_context().verify_mode == ssl.CERT_REQUIRED
channel = grpc.insecure_channel("unix:///nonexistent.sock")
channel.close()
print("ok")
"""


def test_grpc_without_ssl_and_ssl_still_importable() -> None:
    result = subprocess.run([sys.executable, "-c", _CHECK], capture_output=True, text=True, timeout=60,
                            env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
