"""Kubernetes extended-resource names as the plugin advertises them (nvidia.com/<name>)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from nvdp.config.model import RESOURCE_PREFIX

# The DRA driver: NVIDIA's name for it, and the variable the chart sets on every daemon beside a DRA
# plugin (the plugin, GPU feature discovery and the MPS daemon follow the node's mode by it).
DEFAULT_DRA_DRIVER = "gpu.nvidia.com"
DRA_DRIVER_ENV = "DRA_DRIVER_NAME"
# The mode a node is in when its config entry sets none (the chart's dra.defaultMode).
DEFAULT_MODE_ENV = "NVDP_DEFAULT_MODE"
# This node's name: the chart sets it from the pod's spec.nodeName (the downward API).
NODE_NAME_ENV = "NODE_NAME"
MAX_RESOURCE_NAME = 63
SHARED_SUFFIX = ".shared"
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")


def node_name(env: Mapping[str, str], given: str | None = None) -> str:
    """This node's name: `given` (a --node-name flag) when set, else $NODE_NAME; "" when neither is."""
    return given or env.get(NODE_NAME_ENV, "")


def qualify_resource_name(name: str) -> str:
    """Add the nvidia.com/ prefix when missing, as NVIDIA's plugin does."""
    return name if name.startswith(RESOURCE_PREFIX) else RESOURCE_PREFIX + name


def resource_name_problem(qualified: str) -> str | None:
    """Why a fully qualified resource name cannot be advertised, or None when it can."""
    short = qualified.removeprefix(RESOURCE_PREFIX)
    if "/" in short:
        return f"resource names must be in the {RESOURCE_PREFIX} domain"
    if len(qualified) > MAX_RESOURCE_NAME:
        return f"{qualified!r} is {len(qualified)} characters long, more than {MAX_RESOURCE_NAME}"
    if not _DNS_SUBDOMAIN.fullmatch(short):
        return (
            f"{short!r} is not a valid name: use lower-case letters, digits, '-' and '.', "
            "starting and ending with a letter or digit"
        )
    return None
