"""Render the chart with Helm's own engine (helm-python-sdk, in-process) for the chart tests."""

from __future__ import annotations

import copy
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = ROOT / "charts" / "nvidia-device-plugin"
CI_DIR = CHART_DIR / "ci"
NAMESPACE = "nvidia-device-plugin"
RELEASE = "nvdp"
NOTES = "NOTES.txt"

Values = dict[str, Any]
Manifest = dict[str, Any]
# libyaml's safe loader where PyYAML has it (the same documents, 7-10 times faster): parsing the
# rendered manifests took most of a render (0.17-0.34 s of 0.2-0.4 s for a DRA install).
SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.lru_cache(maxsize=1)
def chart() -> helm_python.Chart:
    return helm_python.Chart.load(str(CHART_DIR))


def merge_values(*layers: Values) -> Values:
    """Later layers win, maps merge key by key: how Helm combines -f files and --set flags."""
    merged: Values = {}
    for layer in layers:
        _merge_into(merged, copy.deepcopy(layer))
    return merged


def _merge_into(base: Values, layer: Values) -> None:
    for key, value in layer.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge_into(base[key], value)
        else:
            base[key] = value


def values_file(path: Path) -> Values:
    """A values file read the way `helm install -f` reads it."""
    return helm_python.values_from_yaml(path.read_text(encoding="utf-8"))


def set_file(expression: str) -> Values:
    """`--set-file key=path`: the file's text as a string value."""
    return helm_python.parse_set_file(expression)


@dataclass(frozen=True)
class Rendered:
    objects: list[Manifest]
    notes: str

    def find(self, kind: str, name: str | None = None) -> list[Manifest]:
        return [
            o for o in self.objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
        ]

    def one(self, kind: str, name: str | None = None) -> Manifest:
        found = self.find(kind, name)
        assert len(found) == 1, (
            f"expected one {kind} {name or ''}, got {[o['metadata']['name'] for o in found]}"
        )
        return found[0]

    def daemonsets(self) -> dict[str, Manifest]:
        return {o["metadata"]["name"]: o for o in self.find("DaemonSet")}


def _render(values: Values, release: str, namespace: str, kube_version: str | None) -> dict[str, str]:
    if kube_version is None:
        return chart().render(values, name=release, namespace=namespace, is_install=True)
    # Chart.render has no Kubernetes version to pass; the library behind it takes one (as `helm template
    # --kube-version` does).
    from helm_python import _native

    opts = {"name": release, "namespace": namespace, "is_install": True, "kube_version": kube_version}
    rendered = _native.call_string("helm_render", chart()._raw(), json.dumps(values), json.dumps(opts))
    manifests: dict[str, str] = json.loads(rendered)
    return manifests


def render(values: Values | None = None, *, release: str = RELEASE, namespace: str = NAMESPACE,
           kube_version: str | None = None) -> Rendered:
    """Render as `helm install` would (values schema checked); raises Helm's error otherwise.
    `kube_version` ("v1.29.0") renders for that Kubernetes version instead of the library's default."""
    manifests = _render(values or {}, release, namespace, kube_version)
    objects: list[Manifest] = []
    notes = ""
    for path, text in sorted(manifests.items()):
        if path.endswith(NOTES):
            notes = text
            continue
        for doc in yaml.load_all(text, Loader=SAFE_LOADER):
            if doc:
                objects.append(doc)
    return Rendered(objects=objects, notes=notes)


def render_error(values: Values, *, release: str = RELEASE, namespace: str = NAMESPACE,
                 kube_version: str | None = None) -> str:
    """The message Helm gives when it refuses to install these values."""
    try:
        _render(values, release, namespace, kube_version)
    except helm_python.HelmError as error:
        return str(error)
    raise AssertionError(f"values were accepted: {values}")


def container(daemonset: Manifest, name: str) -> Manifest:
    spec = daemonset["spec"]["template"]["spec"]
    for c in [*spec.get("initContainers", []), *spec["containers"]]:
        if c["name"] == name:
            found: Manifest = c
            return found
    raise AssertionError(f"no container {name} in {daemonset['metadata']['name']}")


def env(c: Manifest) -> dict[str, str | None]:
    """A container's env as name -> value (None for valueFrom)."""
    return {e["name"]: e.get("value") for e in c.get("env", [])}


def ci_values_files() -> list[Path]:
    return sorted(CI_DIR.glob("*-values.yaml"))
