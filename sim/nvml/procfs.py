"""The driver's /proc files about MIG capabilities, for a node without the NVIDIA kernel module.

`nvidia-caps/mig-minors` lists the character-device minor of every GPU instance's and compute
instance's capability (`gpu<N>/gi<G>/access`, `gpu<N>/gi<G>/ci<C>/access`), whether the instance exists
or not, numbered as the kernel module numbers them: after `config` (1) and `monitor` (2), each GPU has
15 GPU instances of 1 + 8 entries. `devices` names the `nvidia-caps` character major. The plugin reads
them under `NVDP_PROC_ROOT` (the stand-in images set it to the tree `write_proc_tree` makes).

Run as a script: `python procfs.py DIR [GPUS]` writes the tree under DIR (for images built without
this package on the path).
"""

from __future__ import annotations

import sys
from pathlib import Path

GPU_INSTANCES = 15
COMPUTE_INSTANCES = 8
CAPS_MAJOR = 237  # what the kernel usually gives nvidia-caps; any unused major does for a stand-in


def mig_minors(gpus: int) -> str:
    lines = ["config 1", "monitor 2"]
    minor = 3
    for gpu in range(gpus):
        for gi in range(GPU_INSTANCES):
            lines.append(f"gpu{gpu}/gi{gi}/access {minor}")
            minor += 1
            for ci in range(COMPUTE_INSTANCES):
                lines.append(f"gpu{gpu}/gi{gi}/ci{ci}/access {minor}")
                minor += 1
    return "\n".join(lines) + "\n"


def write_proc_tree(root: Path, gpus: int = 8) -> None:
    (root / "driver/nvidia-caps").mkdir(parents=True, exist_ok=True)
    (root / "driver/nvidia-caps/mig-minors").write_text(mig_minors(gpus))
    (root / "devices").write_text(f"Character devices:\n195 nvidia-frontend\n{CAPS_MAJOR} nvidia-caps\n")


if __name__ == "__main__":
    write_proc_tree(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 8)
