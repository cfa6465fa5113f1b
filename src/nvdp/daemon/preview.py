"""What the preview commands (`nvdp plan`, `nvdp dra slices`) share: the GPUs they compute with and
how they print.

The GPUs are a node profile's when `--node PROFILE` names one, else this node's, read by the
daemons' own `discover` (nvdp.daemon.inputs) with the config's driver roots, so that a preview run
on a GPU node (or in the plugin's pod) computes from what the daemons see. Output is a table by
default; `-o json` and `-o yaml` print the same objects whole.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from msgspec import Struct

from nvdp.config import names
from nvdp.config.model import Config
from nvdp.inventory.model import Inventory

OUTPUTS = ("table", "json", "yaml")
SHIPPED = "t4, a100-sxm-8, h100-mig-8"


class PreviewError(Exception):
    """The GPUs cannot be had; the message is one line naming the cause and the fix."""


class NodeGpus(Struct, frozen=True):
    """The GPUs a preview computes with, and where they come from."""

    inventory: Inventory
    name: str  # the node's name: the profile's file name, or this node's
    profile: Path | None  # None: this node's, through NVML

    def describe(self) -> str:
        """`sim/profiles/t4.yaml (1 GPU, driver 550.54.15)`, `gpu-node-1 through NVML (8 GPUs, ...)`."""
        count = len(self.inventory.gpus)
        where = str(self.profile) if self.profile is not None else f"{self.name} through NVML"
        return f"{where} ({count} GPU{'' if count == 1 else 's'}, driver {self.inventory.driver_version})"


def add_node_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node", metavar="PROFILE", help="a node profile: a YAML/JSON file or the name of "
                        f"one in sim/profiles ({SHIPPED}); default: this node's GPUs, through NVML")


def add_output_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", choices=OUTPUTS, default="table",
                        help="table (the default), or the same objects as json or yaml")


def node_gpus(config: Config, profile: str | None, env: Mapping[str, str] | None = None
              ) -> NodeGpus:
    """The profile's GPUs when `profile` is given, else this node's through NVML; PreviewError when
    neither can be read."""
    from nvdp.inventory.profile import ProfileError, load_profile, resolve_profile

    if profile is not None:
        path = resolve_profile(profile)
        if not path.is_file():
            raise PreviewError(f"--node: no node profile {profile!r}; give a profile file or the name of one "
                               f"in sim/profiles (e.g. {SHIPPED})")
        try:
            return NodeGpus(load_profile(path), path.stem, path)
        except ProfileError as e:
            raise PreviewError(f"--node: {e}; correct the profile") from None
    from nvdp.daemon.errors import NvmlMissing
    from nvdp.daemon.inputs import discover

    try:
        inventory = discover(config)
    except NvmlMissing as e:
        reason = str(e).split(":", 1)[0]  # "NVML is not available (ERROR_LIBRARY_NOT_FOUND)"
        raise PreviewError(f"no --node profile given, and this machine's GPUs cannot be read: {reason}; "
                           f"run it on a GPU node (or in the plugin's pod), or pass --node PROFILE "
                           f"(a profile file or one of sim/profiles: {SHIPPED})") from None
    return NodeGpus(inventory, this_node(os.environ if env is None else env), None)


def this_node(env: Mapping[str, str]) -> str:
    """This node's name: $NODE_NAME (the plugin's pod), else the host name."""
    return names.node_name(env) or socket.gethostname().split(".")[0].lower()


def print_document(document: Any, output: str, out: TextIO) -> None:
    """`document` as JSON (indented) or YAML (in its keys' order)."""
    if output == "yaml":
        import yaml

        out.write(yaml.safe_dump(document, sort_keys=False))
    else:
        json.dump(document, out, indent=2)
        out.write("\n")

