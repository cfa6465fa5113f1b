"""Shared test set-up: make the repository's `sim` package (stand-ins for NVML, MPS and the kubelet) and
the tools in `scripts/` (image builder, code generators) importable."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _path in (str(ROOT), str(ROOT / "scripts")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

# The throwaway kube-apiserver fixtures (`kube_api`, `kube_api_private`), for every test folder.
from tests.kube.envtest import kube_api, kube_api_private  # noqa: E402, F401
