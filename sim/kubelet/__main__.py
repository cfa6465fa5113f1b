"""Run the kubelet stand-in from the shell: python -m sim.kubelet --dir D [--allocate RES] [--json]"""

from __future__ import annotations

import sys

from sim.kubelet import main

if __name__ == "__main__":
    sys.exit(main())
