"""Reading a GPU's MIG profiles through NVML: what a driver without the calls, or a lost GPU, gives."""

from __future__ import annotations

from typing import Any

import pynvml
import pytest

from nvdp.inventory import nvml


def refusing(code: int) -> Any:
    def call(*_: Any) -> Any:
        raise pynvml.NVMLError(code)

    return call


def test_a_driver_without_the_calls_gives_no_profiles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pynvml, "nvmlDeviceGetGpuInstanceProfileInfo",
                        refusing(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND))  # fmt: skip
    assert nvml.read_mig_profiles(object()) == ()


def test_profile_indices_the_gpu_lacks_are_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    profile_info = "nvmlDeviceGetGpuInstanceProfileInfo"
    monkeypatch.setattr(pynvml, profile_info, refusing(pynvml.NVML_ERROR_NOT_SUPPORTED))
    assert nvml.read_mig_profiles(object()) == ()
    monkeypatch.setattr(pynvml, "nvmlDeviceGetGpuInstanceProfileInfo",
                        refusing(pynvml.NVML_ERROR_INVALID_ARGUMENT))  # fmt: skip
    assert nvml.read_mig_profiles(object()) == ()


def test_a_lost_gpu_is_reported_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    profile_info = "nvmlDeviceGetGpuInstanceProfileInfo"
    monkeypatch.setattr(pynvml, profile_info, refusing(pynvml.NVML_ERROR_GPU_IS_LOST))
    with pytest.raises(pynvml.NVMLError) as err:
        nvml.read_mig_profiles(object())
    assert err.value.value == pynvml.NVML_ERROR_GPU_IS_LOST
