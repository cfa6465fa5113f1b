"""Regenerate the gRPC API modules from the .proto files next to them.

    python scripts/generate_api.py            # rewrite the committed modules
    python scripts/generate_api.py --out DIR  # write them under DIR instead (the staleness test does)

Three API packages are generated in one run: the device-plugin API (src/nvdp/plugin/api), the
kubelet's DRA, DRA resource-health and plugin-registration APIs (src/nvdp/dra/kubelet/api), and its
pod-resources API, which every daemon may ask (src/nvdp/daemon/podresources/api). With --out, each
goes to the same relative folder under DIR (DIR/plugin/api, DIR/dra/kubelet/api, ...).

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

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "src" / "nvdp"
GRPC_TOOLS_VERSION = "1.85.1"

# Each API folder (relative to the nvdp package) and the protos in it, generated as one protoc run.
APIS: dict[str, tuple[str, ...]] = {
    "plugin/api": ("deviceplugin.proto",),
    "dra/kubelet/api": ("dra_v1.proto", "dra_v1beta1.proto", "pluginregistration_v1.proto",
                        "dra_health_v1alpha1.proto", "dra_health_v1beta1.proto", "dra_health_v1.proto"),
    "daemon/podresources/api": ("podresources_v1.proto",),
}
API_DIR = PACKAGE_DIR / "plugin" / "api"
DRA_API_DIR = PACKAGE_DIR / "dra" / "kubelet" / "api"

_LINT_OFF = "# ruff: noqa\n"


class GenerateError(RuntimeError):
    pass


def installed_grpc_tools_version() -> str | None:
    try:
        return metadata.version("grpcio-tools")
    except metadata.PackageNotFoundError:
        return None


def generated_names(proto: str) -> tuple[str, str, str]:
    """The three modules protoc writes for `proto`: messages, their type stub, and the services."""
    stem = proto.removesuffix(".proto")
    return (f"{stem}_pb2.py", f"{stem}_pb2.pyi", f"{stem}_pb2_grpc.py")


def _check_version() -> None:
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


def _fix_up(out_dir: Path, proto: str) -> list[Path]:
    """Make the service module import its messages relatively, and mark the stub as generated."""
    messages, stub, services = generated_names(proto)
    module = messages.removesuffix(".py")
    alias = module.replace("_", "__")
    # protoc writes a top-level import, which only works with the api directory on sys.path.
    absolute = re.compile(rf"^import {module} as {alias}$", re.MULTILINE)
    grpc_module = out_dir / services
    text = grpc_module.read_text()
    fixed, count = absolute.subn(f"from . import {module} as {alias}", text)
    if count != 1:
        raise GenerateError(f"expected one 'import {module}' line in {grpc_module}, found {count}")
    grpc_module.write_text(fixed)
    # The stub follows protoc's style, not ours; keep linters from reporting on generated text.
    stub_path = out_dir / stub
    stub_path.write_text(_LINT_OFF + stub_path.read_text())
    return [out_dir / name for name in (messages, stub, services)]


def _generate_folder(source_dir: Path, protos: tuple[str, ...], out_dir: Path) -> list[Path]:
    from grpc_tools import protoc  # imported late: only needed when generating

    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        # Copy the protos so protoc sees the same relative file names wherever the package lives.
        for proto in protos:
            shutil.copy(source_dir / proto, Path(tmp) / proto)
        include = str(Path(protoc.__file__).resolve().parent / "_proto")
        rc = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{tmp}",
                f"-I{include}",
                f"--python_out={out_dir}",
                f"--pyi_out={out_dir}",
                f"--grpc_python_out={out_dir}",
                *(str(Path(tmp) / proto) for proto in protos),
            ]
        )
    if rc != 0:
        names = ", ".join(str(source_dir / proto) for proto in protos)
        raise GenerateError(f"protoc failed on {names} (exit status {rc}); see its message above")
    written: list[Path] = []
    for proto in protos:
        written += _fix_up(out_dir, proto)
    return written


def generate(out_root: Path | None = None) -> list[Path]:
    """Run protoc on every API folder's protos; returns the files written.

    `out_root` None rewrites the committed modules; otherwise each folder goes to out_root/<folder>.
    """
    _check_version()
    written: list[Path] = []
    for folder, protos in APIS.items():
        out_dir = PACKAGE_DIR / folder if out_root is None else out_root / folder
        written += _generate_folder(PACKAGE_DIR / folder, protos, out_dir)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="output root (default: the committed folders under src/nvdp)"
    )
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
