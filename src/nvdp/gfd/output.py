"""Where the labels go: the features.d file (or standard output) for NFD's local source.

The Node and NodeFeature outputs talk to the API server and live in `nvdp.gfd.publish`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger(__name__)


def render(labels: Mapping[str, str]) -> str:
    """NFD's features.d format: one `key=value` line per label, sorted so equal sets give equal files."""
    return "".join(f"{k}={v}\n" for k, v in sorted(labels.items()))


def write_features_file(path: str, labels: Mapping[str, str]) -> bool:
    """Write the labels atomically (NFD never reads half a file); "" prints them. True if it changed."""
    text = render(labels)
    if not path:
        sys.stdout.write(text)
        sys.stdout.flush()
        return True
    target = Path(path)
    with contextlib.suppress(OSError):
        if target.read_text() == text:
            return False
    target.parent.mkdir(parents=True, exist_ok=True)
    # The temporary file sits beside the target (same filesystem, so the rename is atomic) under a
    # name NFD skips: it ignores dot-files in features.d.
    fd, tmp = tempfile.mkstemp(prefix=".gfd-", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return True


def read_features_file(path: str) -> dict[str, str]:
    """The labels a previous run left in the file (empty when there is none)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return {}
    pairs = (line.partition("=") for line in text.splitlines() if "=" in line)
    return {k: v for k, _, v in pairs}


def remove_features_file(path: str) -> None:
    """Withdraw the labels on exit, so NFD stops applying labels nobody maintains (NVIDIA #796)."""
    if not path:
        return
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    except OSError as e:
        log.warning("could not remove %s: %s", path, e.strerror)
