"""The wheel, built once per session the way both images build it."""

from __future__ import annotations

from pathlib import Path

import kit_images
import pytest


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pip wheel --no-deps --no-build-isolation` of a copy of the sources, as the Dockerfiles and the kit
    builder run it; the checkout gets no build/ or egg-info."""
    return kit_images.build_wheel(tmp_path_factory.mktemp("wheel"))
