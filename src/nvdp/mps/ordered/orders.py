"""Orders for MPS control daemons: what the DRA plugin wants running, as files the MPS image carries out.

The daemons of DRA claims do not run in the DRA plugin's container: a restart, crash or upgrade of the
plugin would take every MPS server and its clients with it. The DRA plugin writes one order per GPU set
that MPS claims share, and the MPS control-daemon image (`nvidia-mps-control-daemon --dra-driver`,
the chart's `<release>-dra-mps` DaemonSet) starts, retunes and stops the daemons to match; a plugin
that restarts finds its orders in place and the daemons untouched. The layout, under the MPS root:

    <root>/<driver>/orders/<set>.json   an order (`DaemonOrder`): the daemon's settings, its claims
    <root>/<driver>/<set>/applied.json  the generation the MPS image carried out, and its error if any
    <root>/<driver>/<set>/.ready        present while that daemon answers (nvdp.mps.paths)

`<set>` is the GPU's UUID, or `gpus-<hash>` for several (the DRA plugin's `daemon_name`). The
writer bumps `generation` on every change, so a reader can tell a new order from one it carried out
already. Files are replaced atomically; a removed order means "stop that daemon". Plain data and files:
no NVML, no processes.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

import msgspec
from msgspec import Struct

from nvdp.mps.commands import MpsSettings
from nvdp.mps.status import read_record, replace_file

T = TypeVar("T")

ORDERS_DIR = "orders"
APPLIED_FILE = "applied.json"
SUFFIX = ".json"
# An order is a few KiB at most (8 GPUs); anything larger is not ours.
MAX_BYTES = 256 * 1024
# The file names the writer makes: a GPU UUID or gpus-<hash>; anything else in the folder is not ours.
_SET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class DaemonOrder(Struct, frozen=True):
    """One daemon the DRA plugin wants running: its settings (GPUs and ceiling) and the claims on it."""

    settings: MpsSettings
    generation: int
    claims: tuple[str, ...] = ()  # the UIDs of the claims using it, for logs and nvdp doctor

    @property
    def name(self) -> str:
        """`<driver>/<set>`, the daemon's resource name (its folder under the MPS root)."""
        return self.settings.resource_name


class Applied(Struct, frozen=True):
    """What the MPS image last did with a daemon's order: its generation, and why it failed (None: done)."""

    generation: int
    error: str | None = None


def orders_dir(root: Path, driver: str) -> Path:
    return root / driver / ORDERS_DIR


def set_name(resource_name: str) -> str:
    """The order's file stem: the last part of `<driver>/<set>`."""
    return resource_name.rsplit("/", 1)[-1]


def order_path(root: Path, order: DaemonOrder) -> Path:
    driver = order.name.rsplit("/", 1)[0]
    return orders_dir(root, driver) / f"{set_name(order.name)}{SUFFIX}"


def write_order(root: Path, order: DaemonOrder) -> None:
    """Replace the order's file atomically (OSError when the MPS root cannot be written)."""
    path = order_path(root, order)
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_file(path, msgspec.json.encode(order) + b"\n")


def remove_order(root: Path, driver: str, resource_name: str) -> None:
    """Withdraw an order: the MPS image stops its daemon."""
    with contextlib.suppress(FileNotFoundError):
        (orders_dir(root, driver) / f"{set_name(resource_name)}{SUFFIX}").unlink()


def _read(path: Path, kind: type[T]) -> T | None:
    return read_record(path, kind, MAX_BYTES)


def read_order(path: Path) -> DaemonOrder | None:
    """One order, or None when the file is missing, too large or not an order."""
    return _read(path, DaemonOrder)


def read_orders(root: Path, driver: str) -> dict[str, DaemonOrder]:
    """Every order of `driver`, by daemon name. Files that are not orders (another tool's, a half
    written temporary) are skipped, never removed: they are not ours to judge."""
    folder = orders_dir(root, driver)
    try:
        names = sorted(p.name for p in folder.iterdir())
    except OSError:
        return {}
    found: dict[str, DaemonOrder] = {}
    for name in names:
        stem = name.removesuffix(SUFFIX)
        if not name.endswith(SUFFIX) or not _SET_NAME.match(stem):
            continue
        order = read_order(folder / name)
        # The file's name and the order's daemon must agree: a copied or renamed file is not an order.
        if order is not None and order.name == f"{driver}/{stem}":
            found[order.name] = order
    return found


def applied_path(daemon_base: Path) -> Path:
    return daemon_base / APPLIED_FILE


def write_applied(daemon_base: Path, applied: Applied) -> None:
    daemon_base.mkdir(parents=True, exist_ok=True)
    replace_file(applied_path(daemon_base), msgspec.json.encode(applied) + b"\n")


def read_applied(daemon_base: Path) -> Applied | None:
    return _read(applied_path(daemon_base), Applied)


def remove_applied(daemon_base: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        applied_path(daemon_base).unlink()


def changed(before: DaemonOrder | None, settings: MpsSettings, claims: Mapping[str, object]) -> bool:
    """Whether an order with these settings and claims differs from `before` (a new generation)."""
    return before is None or before.settings != settings or set(before.claims) != set(claims)
