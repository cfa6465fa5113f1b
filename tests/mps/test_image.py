"""The MPS daemon image asks the NVIDIA runtime for what the daemon needs."""

from __future__ import annotations

from pathlib import Path

DOCKERFILE = Path(__file__).resolve().parents[2] / "images" / "mps-daemon" / "Dockerfile"


def test_entrypoint_and_driver_capabilities() -> None:
    text = DOCKERFILE.read_text()
    assert 'ENTRYPOINT ["mps-control-daemon"]' in text
    # compute brings nvidia-cuda-mps-control from the host driver, utility brings NVML.
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in text
    assert "NVIDIA_VISIBLE_DEVICES=all" in text
    assert "FROM ${PYTHON_IMAGE} AS wheel" in text
