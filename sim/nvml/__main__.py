"""Drive a simulated node from the shell: python -m sim.nvml inject-xid|lose-gpu|reset-gpu|... (--help)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sim.nvml import (
    MigError,
    NodeSim,
    RunningProcess,
    build_library,
    ecc_errors,
    find_gpu,
    inject_xid,
    lose_gpu,
    pending_remap,
    pending_retirement,
    read_compute_mode,
    reboot,
    recovery_action,
    remap_failure,
    reset_gpu,
    set_processes,
    unanswering,
)

# Subcommands that set or clear a GPU's marker (--off clears it), with the function that does it.
MARKERS = {
    "pending-retirement": (pending_retirement, "pages wait for retirement (pre-Ampere GPUs)"),
    "pending-remap": (pending_remap, "a row remap waits for a GPU reset (Ampere and newer)"),
    "remap-failure": (remap_failure, "row remapping failed"),
    "unanswering": (unanswering, "the GPU stops answering: NVML_ERROR_UNKNOWN from its calls"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.nvml", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def gpu_command(name: str, help: str) -> argparse.ArgumentParser:
        command = sub.add_parser(name, help=help)
        command.add_argument("--state-dir", type=Path, required=True)
        command.add_argument("--uuid", required=True)
        return command

    gpu_command("inject-xid", "deliver an XID event for a GPU or MIG device").add_argument(
        "--xid", type=int, required=True
    )
    gpu_command("lose-gpu", "make a GPU fall off the bus (GPU_IS_LOST, XID 79)")
    gpu_command("find-gpu", "a lost GPU is back on the bus")
    gpu_command("reset-gpu", "as after a GPU reset: found, answering, nothing pending, volatile ECC 0")
    gpu_command("compute-mode", "print a GPU's compute mode as last set through NVML")
    for name, (_, help) in MARKERS.items():
        gpu_command(name, f"{help}; --off clears it").add_argument("--off", action="store_true")
    ecc = gpu_command("ecc-errors", "set the uncorrected ECC error counts")
    ecc.add_argument("--volatile", type=int, required=True)
    ecc.add_argument("--aggregate", type=int, help="default: grows by as much as the volatile count grew")
    gpu_command("recovery-action", "set the driver's recommended recovery action").add_argument(
        "--action", type=int, required=True, choices=range(8), metavar="0..7"
    )
    gpu_command("processes", "set the processes NVML lists on a GPU or MIG device").add_argument(
        "processes", nargs="?", default="[]", metavar="JSON",
        help='a list of {"pid", "usedGpuMemory" (bytes), "smUtil", "memUtil" (percent), "mps"}; '
             "omitted or []: nothing runs there")
    sub.add_parser("build", help="compile the stand-in library and print its path")
    # MIG instances through the library, as nvidia-smi mig makes them (needs the node's profile).
    mig_create = gpu_command("mig-create", "make a GPU instance at a placement plus its compute instance")
    mig_create.add_argument("--gi-profile", type=int, required=True, help="GI profile id (mig -lgip)")
    mig_create.add_argument("--start", type=int, required=True, help="first memory slice of the placement")
    gpu_command("mig-destroy", "destroy a GPU instance and its compute instances").add_argument(
        "--gi-id", type=int, required=True
    )
    gpu_command("mig-instances", "print a GPU's MIG instances as JSON")
    mode = gpu_command("set-mig-mode", "turn MIG mode on or off (refused while instances exist)")
    mode.add_argument("--off", action="store_true")
    for command in (mig_create, mode, sub.choices["mig-destroy"], sub.choices["mig-instances"]):
        command.add_argument("--profile", required=True, help="the node profile (name or path)")
    reboot_help = "drop every MIG instance; the profile's static layout is back"
    sub.add_parser("reboot", help=reboot_help).add_argument("--state-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command.startswith("mig-") or args.command == "set-mig-mode":
        return _mig_command(args)
    if args.command == "inject-xid":
        inject_xid(args.state_dir, args.uuid, args.xid)
    elif args.command == "lose-gpu":
        lose_gpu(args.state_dir, args.uuid)
    elif args.command == "find-gpu":
        find_gpu(args.state_dir, args.uuid)
    elif args.command == "reset-gpu":
        reset_gpu(args.state_dir, args.uuid)
    elif args.command == "compute-mode":
        print(read_compute_mode(args.state_dir, args.uuid))
    elif args.command in MARKERS:
        MARKERS[args.command][0](args.state_dir, args.uuid, not args.off)
    elif args.command == "ecc-errors":
        try:
            ecc_errors(args.state_dir, args.uuid, args.volatile, args.aggregate)
        except ValueError as err:
            parser.error(str(err))
    elif args.command == "recovery-action":
        recovery_action(args.state_dir, args.uuid, args.action)
    elif args.command == "reboot":
        reboot(args.state_dir)
    elif args.command == "processes":
        try:
            set_processes(args.state_dir, args.uuid, _processes(args.processes))
        except (ValueError, TypeError) as err:
            parser.error(f"processes: {err}")
    else:
        print(build_library())
    return 0


def _processes(text: str) -> list[RunningProcess]:
    """The JSON list of the command line (the state file's own keys) as RunningProcess records."""
    entries = json.loads(text)
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ValueError("give a JSON list of objects")
    keys = {"pid": "pid", "usedGpuMemory": "used_memory", "smUtil": "sm_util", "memUtil": "mem_util",
            "mps": "mps"}
    unknown = sorted({key for entry in entries for key in entry} - set(keys))
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(unknown)}; known: {', '.join(keys)}")
    return [RunningProcess(**{keys[k]: v for k, v in entry.items()}) for entry in entries]


def _mig_command(args: argparse.Namespace) -> int:
    node = NodeSim(args.profile, args.state_dir)
    try:
        if args.command == "mig-create":
            print(node.mig_create(args.uuid, args.gi_profile, args.start))
        elif args.command == "mig-destroy":
            node.mig_destroy(args.uuid, args.gi_id)
        elif args.command == "mig-instances":
            print(json.dumps(node.mig_instances(args.uuid), indent=2))
        else:
            node.set_mig_mode(args.uuid, not args.off)
    except (MigError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
