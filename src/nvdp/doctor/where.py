"""Where the doctor looks (environment, sysfs, /proc, /etc, /dev/shm, the node and its labels)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal

from msgspec import Struct, field

from nvdp.doctor.api import NOT_CONFIGURED, LabelRead
from nvdp.doctor.bounded import DEFAULT_TIMEOUT_S

Context = Literal["container", "host"]


class Where(Struct):
    """Where the doctor looks; tests point these at prepared directories."""

    env: Mapping[str, str]
    context: Context
    sysfs: Path = Path("/sys")
    proc: Path = Path("/proc")
    etc: Path = Path("/etc")
    shm: Path = Path("/dev/shm")
    # The CDI spec directories a container runtime reads, lowest priority first (nvdp.cdi.write.SPEC_DIRS).
    cdi_dirs: tuple[Path, ...] = (Path("/etc/cdi"), Path("/var/run/cdi"))
    node_name: str = ""
    # Node labels from the API when it can be reached, else why not.
    node_labels: Callable[[], LabelRead] = field(default=lambda: NOT_CONFIGURED)
    timeout: float = DEFAULT_TIMEOUT_S  # how long one check may wait for what it reads


def detect_context(env: Mapping[str, str]) -> Context:
    inside = (
        "KUBERNETES_SERVICE_HOST" in env
        or Path("/.dockerenv").exists()
        or Path("/run/.containerenv").exists()
    )
    return "container" if inside else "host"


def read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None
