"""Regenerate the device-plugin API modules (src/nvdp/plugin/api) from deviceplugin.proto.

    python scripts/generate_api.py            # rewrite the committed modules
    python scripts/generate_api.py --out DIR  # write them elsewhere (the staleness test does)

The output depends on the grpcio-tools version, so the version used is pinned here; a different
one is refused rather than producing files that differ for no reason.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from importlib import metadata
from pathlib import Path

API_DIR = Path(__file__).resolve().parents[1] / "src" / "nvdp" / "plugin" / "api"
PROTO = "deviceplugin.proto"
GENERATED = ("deviceplugin_pb2.py", "deviceplugin_pb2.pyi", "deviceplugin_pb2_grpc.py")
GRPC_TOOLS_VERSION = "1.85.1"

# protoc writes a top-level import, which only works with the api directory on sys.path.
_ABSOLUTE_IMPORT = re.compile(r"^import deviceplugin_pb2 as deviceplugin__pb2$", re.MULTILINE)
_RELATIVE_IMPORT = "from . import deviceplugin_pb2 as deviceplugin__pb2"
_LINT_OFF = "# ruff: noqa\n"


class GenerateError(RuntimeError):
    pass


def installed_grpc_tools_version() -> str | None:
    try:
        return metadata.version("grpcio-tools")
    except metadata.PackageNotFoundError:
        return None


def generate(out_dir: Path) -> list[Path]:
    """Run protoc on deviceplugin.proto into `out_dir`; returns the files written."""
    version = installed_grpc_tools_version()
    if version is None:
        raise GenerateError(
            f"grpcio-tools is not installed; install it: pip install grpcio-tools=={GRPC_TOOLS_VERSION}"
        )
    if version != GRPC_TOOLS_VERSION:
        raise GenerateError(
            f"grpcio-tools {version} is installed but the committed modules come from {GRPC_TOOLS_VERSION}; "
            f"install that version (pip install grpcio-tools=={GRPC_TOOLS_VERSION}) or, to move to "
            f"{version}, update GRPC_TOOLS_VERSION in {Path(__file__).name} and regenerate"
        )
    from grpc_tools import protoc  # imported late: only needed when generating

    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        # Copy the proto so protoc sees the same relative file name wherever the package lives.
        shutil.copy(API_DIR / PROTO, Path(tmp) / PROTO)
        include = str(Path(protoc.__file__).resolve().parent / "_proto")
        rc = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{tmp}",
                f"-I{include}",
                f"--python_out={out_dir}",
                f"--pyi_out={out_dir}",
                f"--grpc_python_out={out_dir}",
                str(Path(tmp) / PROTO),
            ]
        )
    if rc != 0:
        raise GenerateError(f"protoc failed on {API_DIR / PROTO} (exit status {rc}); see its message above")
    grpc_module = out_dir / "deviceplugin_pb2_grpc.py"
    text = grpc_module.read_text()
    fixed, count = _ABSOLUTE_IMPORT.subn(_RELATIVE_IMPORT, text)
    if count != 1:
        raise GenerateError(f"expected one 'import deviceplugin_pb2' line in {grpc_module}, found {count}")
    grpc_module.write_text(fixed)
    # The stub follows protoc's style, not ours; keep linters from reporting on generated text.
    stub = out_dir / "deviceplugin_pb2.pyi"
    stub.write_text(_LINT_OFF + stub.read_text())
    return [out_dir / name for name in GENERATED]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=API_DIR, help="output directory (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        written = generate(args.out)
    except GenerateError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
