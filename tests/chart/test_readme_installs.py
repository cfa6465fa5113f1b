"""README.md's install commands, run through Helm's engine: each mode's `helm install` line, with the
values and config files it names from the repository, renders, and makes what that mode's check
command looks for.

The README is parsed, not copied: every `helm install` in its `sh` blocks is rendered as written, and
each one that installs an `examples/<mode>/` values file must have a check command after it in the
same block. The plugin's own functions then say what the rendered config makes on a stand-in node
(`nvdp.plan` for the device plugin, the DRA pool for the DRA plugin), and the check must look for that.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import helm_python
import kubernetes_validate
import pytest
import yaml
from chart_helm import CHART_DIR, ROOT, Rendered, Values, env, merge_values, render, values_file

from nvdp.config.loader import load_config
from nvdp.config.model import Config
from nvdp.daemon.pernode.mode import node_mode
from nvdp.dra.pool.contents import DEFAULT_MODE_ENV, pool_devices, published_slices
from nvdp.inventory.profile import load_profile
from nvdp.plan import plan

README = ROOT / "README.md"
EXAMPLES = ROOT / "examples"
PROFILES = ROOT / "sim" / "profiles"
FULLNAME = "nvdp-nvidia-device-plugin"
DEVICE_PLUGIN = FULLNAME
MPS_DAEMON = f"{FULLNAME}-mps-control-daemon"
DRA_PLUGIN = f"{FULLNAME}-dra-plugin"


# --- the README's commands --------------------------------------------------------------------------


def sh_blocks(text: str) -> list[list[str]]:
    """The commands of each ```sh block: continuation lines joined, comments and blank lines dropped."""
    blocks = []
    for body in re.findall(r"^```sh\n(.*?)^```", text, flags=re.M | re.S):
        joined = re.sub(r"\\\n\s*", " ", body)
        commands = [shlex.join(shlex.split(line, comments=True)) for line in joined.splitlines()]
        blocks.append([c for c in commands if c])
    return blocks


@dataclass
class Install:
    command: str
    namespace: str
    values: Values
    files: list[Path] = field(default_factory=list)  # every file it names, values and --set-file
    checks: list[str] = field(default_factory=list)  # the kubectl commands after it in its block

    @property
    def example(self) -> str | None:
        """The examples/<mode> folder of its values files, if any."""
        modes = {p.parent.name for p in self.files if p.parent.parent == EXAMPLES}
        assert len(modes) <= 1, f"{self.command}: files of several examples: {sorted(modes)}"
        return next(iter(modes), None)


def repo_file(path: str, command: str) -> Path:
    found = ROOT / path
    assert found.is_file(), f"{command}: {path} is not a file of the repository"
    return found


def parse_install(command: str) -> Install:
    """`helm install` as Helm reads it: -f files first, in order, then --set-json, --set,
    --set-string and --set-file (Helm's order, whatever the order on the line)."""
    words = shlex.split(command)
    assert words[:2] == ["helm", "install"], command
    positional: list[str] = []
    namespace = "default"
    files: list[Path] = []
    order = ("-f", "--set-json", "--set", "--set-string", "--set-file")
    layers: dict[str, list[Values]] = {flag: [] for flag in order}
    parsers = {"--set-json": helm_python.parse_set_json, "--set": helm_python.parse_set_string,
               "--set-string": helm_python.parse_set_string_values}
    rest = iter(words[2:])
    for word in rest:
        flag, _, inline = word.partition("=") if word.startswith("--") else (word, "", "")
        if not word.startswith("-"):
            positional.append(word)
        elif flag == "--create-namespace":
            pass
        elif flag in ("-n", "--namespace"):
            namespace = inline or next(rest)
        elif flag in ("-f", "--values"):
            values = repo_file(inline or next(rest), command)
            files.append(values)
            layers["-f"].append(values_file(values))
        elif flag == "--set-file":
            key, _, name = (inline or next(rest)).partition("=")
            files.append(repo_file(name, command))
            layers["--set-file"].append(helm_python.parse_set_file(f"{key}={ROOT / name}"))
        elif flag in parsers:
            layers[flag].append(parsers[flag](inline or next(rest)))
        else:
            raise AssertionError(f"{command}: {word} is not an option this test reads; teach it")
    assert len(positional) == 2, f"{command}: expected a release name and the chart, got {positional}"
    chart = positional[1]
    assert (ROOT / chart).resolve() == CHART_DIR, f"{command}: installs {chart}, not the chart"
    merged = merge_values(*(layer for flag in order for layer in layers[flag]))
    return Install(command, namespace, merged, files)


def readme_installs() -> list[Install]:
    installs = []
    for block in sh_blocks(README.read_text(encoding="utf-8")):
        current: Install | None = None
        for command in block:
            if command.startswith("helm install "):
                current = parse_install(command)
                installs.append(current)
            elif current is not None and command.startswith("kubectl "):
                current.checks.append(command)
    return installs


INSTALLS = readme_installs()
BY_MODE = {i.example: i for i in INSTALLS if i.example is not None}


# --- what each mode makes ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Mode:
    profile: str  # the stand-in node it is looked at on
    dra: bool  # served by the DRA plugin (else the device plugin)
    sharing: str = "none"  # the plan's sharing of nvidia.com/gpu (device-plugin modes)
    mig: bool = False  # MIG devices: nvidia.com/mig-* resources, or -mig- devices in the slices


MODES = {
    "whole-gpus": Mode("t4", dra=False),
    "time-slicing": Mode("t4", dra=False, sharing="time-slicing"),
    "mps": Mode("t4", dra=False, sharing="mps"),
    "mig": Mode("h100-mig-8", dra=False, mig=True),
    "dra": Mode("t4", dra=True),
    "dra-dynamic-mig": Mode("h100-mig-dynamic", dra=True, mig=True),
}


def rendered_config(rendered: Rendered, tmp_path: Path) -> Config:
    """The one config entry the install puts in its ConfigMap, loaded as the daemons load it (the
    chart's defaults when it has none)."""
    maps = rendered.find("ConfigMap", f"{FULLNAME}-configs")
    if not maps:
        return load_config(None, {}, {})
    entries = maps[0]["data"]
    assert len(entries) == 1, f"one config entry per mode, got {sorted(entries)}"
    path = tmp_path / "config.yaml"
    path.write_text(next(iter(entries.values())), encoding="utf-8")
    return load_config(str(path), {}, {})


def check_text(install: Install) -> str:
    """The check commands as one text, shell escapes undone (`nvidia\\.com/gpu` -> `nvidia.com/gpu`)."""
    return " ; ".join(install.checks).replace("\\", "")


def test_the_readme_installs_every_mode_of_the_table() -> None:
    assert set(BY_MODE) == set(MODES), (
        f"README installs examples {sorted(BY_MODE)}; the modes are {sorted(MODES)}"
    )
    table = README.read_text(encoding="utf-8").split("## Modes", 1)[1].split("\n## ", 1)[0]
    for mode in MODES:
        assert f"(examples/{mode}/" in table, f"the modes table links no example of {mode}"


def oldest_kubernetes(values: Values) -> str:
    """The oldest Kubernetes the install is for: DRA needs 1.34, GPU feature discovery's admission
    policy 1.30 (the chart refuses older), the chart 1.25."""
    if values.get("dra", {}).get("enabled"):
        return "1.34.0"
    gfd = values.get("gfd", {})
    return "1.30.0" if gfd.get("enabled") or gfd.get("detectNodes") else "1.25.0"


@pytest.mark.parametrize("install", INSTALLS, ids=lambda i: i.example or i.command[-40:])
def test_every_readme_install_renders_valid_objects(install: Install) -> None:
    """As `helm install` on the oldest Kubernetes it is for and on the newest with schemas (1.37)."""
    for version in (oldest_kubernetes(install.values), "1.37.0"):
        rendered = render(install.values, namespace=install.namespace, kube_version=f"v{version}")
        assert rendered.find("DaemonSet"), f"{install.command}: no DaemonSet rendered"
        problems = []
        for obj in rendered.objects:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                problems.append(f"{obj['kind']}/{obj['metadata']['name']} on {version}: {error.message}")
        assert not problems, "\n".join(problems)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_the_check_command_names_what_the_mode_makes(mode: str, tmp_path: Path) -> None:
    install, expect = BY_MODE[mode], MODES[mode]
    assert install.checks, f"{mode}: no check command after its helm install"
    assert install.namespace == "nvidia-device-plugin", install.command
    rendered = render(install.values, namespace=install.namespace)
    daemonsets = rendered.daemonsets()
    config = rendered_config(rendered, tmp_path)
    inventory = load_profile(PROFILES / f"{expect.profile}.yaml")
    checks = check_text(install)
    for selector in re.findall(r"-l (\S+)", checks):  # a pod selector must select the chart's pods
        key, _, value = selector.partition("=")
        assert any(d["spec"]["template"]["metadata"]["labels"].get(key) == value
                   for d in daemonsets.values()), f"{mode}: no DaemonSet's pods carry {selector}"

    if expect.dra:
        assert DRA_PLUGIN in daemonsets and DEVICE_PLUGIN not in daemonsets, sorted(daemonsets)
        assert "kubectl get resourceslices" in checks, f"{mode}: the check does not list ResourceSlices"
        dra_env = env(daemonsets[DRA_PLUGIN]["spec"]["template"]["spec"]["containers"][0])
        mode_env = {DEFAULT_MODE_ENV: dra_env[DEFAULT_MODE_ENV] or ""}
        driver = dra_env["DRA_DRIVER_NAME"] or ""
        slices = published_slices(node_mode(config, mode_env), node=expect.profile, node_uid="",
                                  driver=driver, devices=pool_devices(config, inventory))
        names = [d["name"] for s in slices for d in s["spec"].get("devices", [])]
        assert names, f"{mode}: the DRA plugin would publish nothing on {expect.profile}"
        assert ".spec.devices[*].name" in checks, f"{mode}: the check does not show the devices"
        assert any("-mig-" in n for n in names) == expect.mig, names
        return

    assert DEVICE_PLUGIN in daemonsets and DRA_PLUGIN not in daemonsets, sorted(daemonsets)
    assert (MPS_DAEMON in daemonsets) == (expect.sharing == "mps"), sorted(daemonsets)
    assert "allocatable" in checks, f"{mode}: the check does not read the nodes' allocatable"
    resources = {r.name: r for r in plan(config, inventory).resources}
    if expect.mig:
        assert "nvidia.com/mig-" in checks, f"{mode}: the check does not look for nvidia.com/mig-*"
        assert resources and all(n.startswith("nvidia.com/mig-") for n in resources), sorted(resources)
        return
    assert "allocatable.nvidia.com/gpu" in checks, f"{mode}: the check does not show nvidia.com/gpu"
    assert list(resources) == ["nvidia.com/gpu"], sorted(resources)
    gpu = resources["nvidia.com/gpu"]
    assert gpu.sharing == expect.sharing
    assert len(gpu.devices) == len(inventory.gpus) * gpu.replicas


@pytest.mark.parametrize("mode", sorted(MODES))
def test_each_example_file_says_how_it_is_installed(mode: str) -> None:
    """The values file's header shows the README's own command, so a copy of the file alone still works."""
    values = EXAMPLES / mode / "values.yaml"
    header = " ".join(line.lstrip("# ").rstrip("\\ ") for line in values.read_text().splitlines()
                      if line.startswith("#"))
    for path in BY_MODE[mode].files:
        assert str(path.relative_to(ROOT)) in header, f"{values}: its comment does not name {path.name}"


def test_the_example_claims_are_valid_and_ask_for_the_chart_s_classes() -> None:
    classes = {o["metadata"]["name"] for o in render({"dra": {"enabled": True}}).find("DeviceClass")}
    for path in sorted(EXAMPLES.glob("*/claim.yaml")):
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        for doc in docs:
            for version in ("1.34.0", "1.37.0"):  # the chart's DRA needs 1.34; the newest schemas
                kubernetes_validate.validate(doc, version, strict=True)
        templates = [d for d in docs if d["kind"] == "ResourceClaimTemplate"]
        pods = [d for d in docs if d["kind"] == "Pod"]
        assert templates and pods, path
        for template in templates:
            for request in template["spec"]["spec"]["devices"]["requests"]:
                assert request["exactly"]["deviceClassName"] in classes, (path, request)
        names = {t["metadata"]["name"] for t in templates}
        for pod in pods:
            assert {c["resourceClaimTemplateName"] for c in pod["spec"]["resourceClaims"]} <= names, path


def test_the_image_tag_the_readme_loads_is_the_chart_s() -> None:
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    tags = set(re.findall(r"nvdp-(?:plugin|mps-daemon):(\S+)", README.read_text(encoding="utf-8")))
    version = chart["appVersion"]
    assert tags == {version}, f"README names tags {sorted(tags)}; the chart's appVersion is {version}"
