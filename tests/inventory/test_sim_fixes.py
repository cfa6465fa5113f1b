"""The stand-in NVML as a real node needs it: it makes its state folder, event sets see only later events,
and a YAML profile is converted once, when the library is loaded."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from sim.nvml import LIBRARY_NAME, PROFILES_DIR, NodeSim, build_library

from .conftest import python_env

pytestmark = pytest.mark.slow  # starts processes

RunPy = Callable[..., subprocess.CompletedProcess[str]]
T4 = "GPU-a4d98c34-f034-41fa-9519-b5bab976e4df"


def sim_env(state_dir: Path, profile: Path, **extra: str) -> dict[str, str]:
    return python_env({
        "LD_LIBRARY_PATH": str(build_library().parent),
        "NVML_SIM_PROFILE": str(profile),
        "NVML_SIM_STATE_DIR": str(state_dir),
        **extra,
    })  # fmt: skip


def run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    import sys

    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                          check=False)  # fmt: skip


def test_library_creates_a_missing_state_dir_and_sets_the_compute_mode(tmp_path: Path) -> None:
    node = NodeSim("t4", tmp_path / "node")
    state = tmp_path / "nobody" / "made" / "this"
    code = (
        "import pynvml as n; n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0);"
        "n.nvmlDeviceSetComputeMode(h, n.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS); print('ok')"
    )
    done = run(code, sim_env(state, node.profile_json))
    assert done.returncode == 0, done.stderr
    assert (state / "compute-mode" / T4).read_text().strip() == "EXCLUSIVE_PROCESS"


def test_an_event_set_sees_only_events_after_its_creation(tmp_path: Path) -> None:
    node = NodeSim("t4", tmp_path / "state")
    # An XID before the set exists (as one delivered before a SIGHUP re-plan), then one after.
    code = f"""
import pynvml as n, subprocess, sys
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
open({str(node.state_dir / "events")!r}, "a").write("{T4} 48\\n")
s = n.nvmlEventSetCreate()
n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, s)
try:
    n.nvmlEventSetWait_v2(s, 200)
    print("stale event delivered")
except n.NVMLError_Timeout:
    print("no stale event")
open({str(node.state_dir / "events")!r}, "a").write("{T4} 79\\n")
print("xid", n.nvmlEventSetWait_v2(s, 2000).eventData)
"""
    done = run(code, sim_env(node.state_dir, node.profile_json))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["no stale event", "xid 79"], done.stdout


def test_yaml_profile_is_converted_once_at_load_not_in_each_init(tmp_path: Path) -> None:
    build_library()
    counter = tmp_path / "conversions"
    # A converter that counts its runs, then does the real work.
    converter = tmp_path / "to_json.py"
    real = PROFILES_DIR.parent / "nvml" / "to_json.py"
    converter.write_text(
        f"import runpy, sys\nopen({str(counter)!r}, 'a').write('x')\n"
        f"sys.argv = [{str(real)!r}, *sys.argv[1:]]\n"
        f"runpy.run_path({str(real)!r}, run_name='__main__')\n"
    )
    code = """
import threading, pynvml as n
n.nvmlInit(); n.nvmlShutdown()
def again():
    n.nvmlInit(); print(n.nvmlDeviceGetCount()); n.nvmlShutdown()
t = threading.Thread(target=again); t.start(); t.join()
again()
"""
    import sys

    env = sim_env(tmp_path / "state", PROFILES_DIR / "t4.yaml", NVML_SIM_TO_JSON=str(converter),
                  NVML_SIM_PYTHON=sys.executable)  # fmt: skip
    done = run(code, env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "1"]
    assert counter.read_text() == "x", "one conversion for three nvmlInit calls"
    assert LIBRARY_NAME == "libnvidia-ml.so.1"
