"""Drive a simulated node from the shell: python -m sim.nvml inject-xid|lose-gpu|compute-mode|build ..."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sim.nvml import build_library, inject_xid, lose_gpu, read_compute_mode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.nvml", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    xid = sub.add_parser("inject-xid", help="deliver an XID event for a GPU or MIG device")
    xid.add_argument("--state-dir", type=Path, required=True)
    xid.add_argument("--uuid", required=True)
    xid.add_argument("--xid", type=int, required=True)
    lost = sub.add_parser("lose-gpu", help="make a GPU fall off the bus (GPU_IS_LOST, XID 79)")
    lost.add_argument("--state-dir", type=Path, required=True)
    lost.add_argument("--uuid", required=True)
    mode = sub.add_parser("compute-mode", help="print a GPU's compute mode as last set through NVML")
    mode.add_argument("--state-dir", type=Path, required=True)
    mode.add_argument("--uuid", required=True)
    sub.add_parser("build", help="compile the stand-in library and print its path")
    args = parser.parse_args(argv)
    if args.command == "inject-xid":
        inject_xid(args.state_dir, args.uuid, args.xid)
    elif args.command == "lose-gpu":
        lose_gpu(args.state_dir, args.uuid)
    elif args.command == "compute-mode":
        print(read_compute_mode(args.state_dir, args.uuid))
    else:
        print(build_library())
    return 0


if __name__ == "__main__":
    sys.exit(main())
