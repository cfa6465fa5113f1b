"""Print a YAML node profile as JSON on stdout; the stand-in NVML library runs this at init for .yaml paths.

Run as a script (`python to_json.py PROFILE`), so it needs nothing but PyYAML on the interpreter's path.
"""

from __future__ import annotations

import json
import sys

import yaml


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: to_json.py PROFILE.yaml", file=sys.stderr)
        return 2
    try:
        with open(argv[1], encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as e:
        print(f"cannot read profile {argv[1]}: {e}", file=sys.stderr)
        return 1
    json.dump(doc, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
