"""Shared test set-up: make the repository's `sim` package (stand-ins for NVML and MPS) importable."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# The throwaway kube-apiserver fixtures (`kube_api`, `kube_api_private`), for every test folder.
from tests.kube.envtest import kube_api, kube_api_private  # noqa: E402, F401
