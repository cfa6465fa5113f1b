"""What the per-Allocate INFO line costs the kubelet, part by part, in the figures' harness.

    .venv/bin/python bench/allocate_line.py [--rounds 8] [--calls 1000]

nvdp writes one INFO line per Allocate ("Allocate nvidia.com/gpu: GPU-..."); the floor writes none.
This runs nvdp in several variants, each with `logging.Logger.info` wrapped so that only what
happens to the Allocate line changes, and the floor, alternating the order each round:

- `line written`: the line as built (the wrapper calls the logging module unchanged);
- `no line`: the line is dropped;
- `record + format`: the LogRecord is built and formatted, not written;
- `message only`: only the message's %-formatting;
- `fixed os.write`: a fixed, preformatted line written with os.write (the system call alone);
- `line to /dev/null`, `line to a pipe`: as built, with stderr to /dev/null, or to a pipe that a `cat`
  process copies to the log file, as containerd's shim does (the other variants write a file).

Allocate p50 / p99 over `--calls` sequential calls from the kubelet simulator, on NVIDIA's mock NVML
(8x A100; the stand-in where ../shared/upstream is missing). Prints the median over the rounds, each
round's p50 (to show the spread) and the load average.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent)]

from plugin_bench import (  # noqa: E402
    ENTRY_POINT,
    FLOOR,
    NVDP,
    RESOURCE,
    UPSTREAM_DIR,
    allocate_latencies,
    interleaved,
    percentile,
    plugin,
    unpack_upstream,
    wait_until,
)

# The entry point with Logger.info wrapped; BODY handles an Allocate line (msg, args), every other
# line goes to the logging module unchanged.
_WRAPPED = """
import logging, os
_info = logging.Logger.info
_formatter = logging.Formatter("%(asctime)s %(levelname)s %(message)s")
def _wrapped(self, msg, *args, **kwargs):
    if isinstance(msg, str) and msg.startswith("Allocate "):
BODY
        return None
    return _info(self, msg, *args, **kwargs)
logging.Logger.info = _wrapped
"""
_BODIES = {
    "line written": "        _info(self, msg, *args, **kwargs)",
    "no line": "        pass",
    "record + format": "        _formatter.format(self.makeRecord(self.name, logging.INFO, '', 0, msg, args, "
                       "None))",
    "message only": "        msg % args",
    "fixed os.write": "        os.write(2, b'2026-01-01 00:00:00,000 INFO Allocate nvidia.com/gpu: "
                      "GPU-00000000-0000-0000-0000-000000000000\\\\n')",
}
# label -> (kind, body of the wrapper or None for the floor, where stdout and stderr go)
VARIANTS: dict[str, tuple[str, str | None, str]] = {
    **{label: (NVDP, body, "file") for label, body in _BODIES.items()},
    "line to /dev/null": (NVDP, _BODIES["line written"], "devnull"),
    "line to a pipe": (NVDP, _BODIES["line written"], "pipe"),
    "floor": (FLOOR, None, "file"),
}


# Checked after each run, so that a change of the line's wording cannot turn a variant into another.
_LINE_IN_LOG = {"line written": True, "line to a pipe": True, "no line": False}


def entry_point(body: str) -> str:
    return _WRAPPED.replace("BODY", body) + ENTRY_POINT


def measure(label: str, upstream: Path | None, calls: int) -> tuple[float, float]:
    kind, body, log_via = VARIANTS[label]
    python_args = ["-c", entry_point(body)] if body is not None else None
    profile = None if upstream is not None else "a100-sxm-8"
    with plugin(profile, kind=kind, upstream=upstream, python_args=python_args, log_via=log_via) as run:
        wait_until(lambda: bool(run.kubelet.registrations), timeout=30)
        devices = run.kubelet.wait_for_resource(RESOURCE, count=8, timeout=30)
        latencies = allocate_latencies(run.kubelet, devices[0]["id"], calls)
        expected = _LINE_IN_LOG.get(label)
        if expected is not None and (f"Allocate {RESOURCE}: " in run.log_path.read_text()) != expected:
            raise RuntimeError(f"{label}: the Allocate line is {'not ' if expected else ''}in the log; the "
                               "wrapper no longer tells it from the other lines")
    return percentile(latencies, 50), percentile(latencies, 99)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--calls", type=int, default=1000)
    args = parser.parse_args(argv)
    upstream = unpack_upstream() if (UPSTREAM_DIR / "setup.sh").is_file() else None
    results, loads = interleaved(list(VARIANTS), args.rounds,
                                 lambda label: measure(label, upstream, args.calls))
    nvml = "NVIDIA's mock NVML (8x A100)" if upstream is not None else "the stand-in NVML (a100-sxm-8)"
    print(f"{args.rounds} interleaved rounds x {args.calls} sequential Allocate, {nvml}, medians")
    print(f"load average (1/5/15 min) before and after each round: {' | '.join(loads)}\n")
    floor_p50 = statistics.median(r[0] for r in results["floor"])
    print(f"{'variant':20} {'p50':>8} {'p99':>8} {'p50/floor':>10}   p50 of each round")
    for label, rows in results.items():
        p50 = statistics.median(r[0] for r in rows)
        p99 = statistics.median(r[1] for r in rows)
        rounds = " ".join(f"{r[0]:.3f}" for r in rows)
        print(f"{label:20} {p50:5.3f} ms {p99:5.3f} ms {p50 / floor_p50:10.2f}   {rounds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
