"""The chart's extended-resource DeviceClasses (dra.extendedResourceNames, KEP-5004) and sharing
DeviceClasses (dra.sharingClasses): their names, selectors and config, and the install-time checks."""

from __future__ import annotations

from typing import Any

import pytest
from chart_helm import Manifest, merge_values, render, render_error
from test_dra import DRA, DRA_VERSIONS, TWO_ENTRIES
from test_render import assert_valid

DRIVER = "gpu.nvidia.com"
GPUS = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'gpu'"
TIME_SLICING = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}
MPS = {
    "strategy": "MPS",
    "mpsConfig": {
        "defaultActiveThreadPercentage": 50,
        "defaultPinnedDeviceMemoryLimit": "10Gi",
        "defaultPerDevicePinnedMemoryLimit": {"0": "5Gi"},
    },
}
SHARED = {"name": "shared-gpu.nvidia.com", "sharing": TIME_SLICING}


def classes(values: dict[str, Any] | None = None) -> dict[str, Manifest]:
    objects = render(merge_values(DRA, values or {})).objects
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == "DeviceClass"}


def expression(device_class: Manifest) -> str:
    (selector,) = device_class["spec"]["selectors"]
    found: str = selector["cel"]["expression"]
    return found


def resource_selector(name: str, driver: str = DRIVER) -> str:
    return (
        f"device.driver == '{driver}' && 'resource' in device.attributes['{driver}'] && "
        f"device.attributes['{driver}'].resource == '{name}'"
    )


def test_by_default_nvidia_com_gpu_has_its_class() -> None:
    found = classes()
    assert set(found) == {"gpu.nvidia.com", "mig.nvidia.com", "nvidia.com-gpu"}
    spec = found["nvidia.com-gpu"]["spec"]
    assert spec["extendedResourceName"] == "nvidia.com/gpu"
    assert expression(found["nvidia.com-gpu"]) == resource_selector("nvidia.com/gpu")
    assert "config" not in spec
    # The claim classes stay as they were: no extended resource of their own.
    assert "extendedResourceName" not in found["gpu.nvidia.com"]["spec"]
    assert "extendedResourceName" not in found["mig.nvidia.com"]["spec"]


def test_one_class_per_name_named_after_it() -> None:
    names = ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/gpu.shared", "example.com/t4"]
    found = classes({"dra": {"extendedResourceNames": names, "driverName": "gpu.example.com"}})
    expected = {
        "nvidia.com-gpu": "nvidia.com/gpu",
        "nvidia.com-mig-1g.10gb": "nvidia.com/mig-1g.10gb",
        "nvidia.com-gpu.shared": "nvidia.com/gpu.shared",
        "example.com-t4": "example.com/t4",
    }
    assert set(found) == {"gpu.example.com", "mig.example.com", *expected}
    for class_name, resource in expected.items():
        assert found[class_name]["spec"]["extendedResourceName"] == resource
        assert expression(found[class_name]) == resource_selector(resource, "gpu.example.com")
        assert found[class_name]["metadata"]["labels"]["app.kubernetes.io/instance"] == "nvdp"


def test_no_extended_resource_classes_when_asked_for_none_or_without_classes() -> None:
    assert set(classes({"dra": {"extendedResourceNames": []}})) == {"gpu.nvidia.com", "mig.nvidia.com"}
    assert not classes({"dra": {"deviceClasses": False, "sharingClasses": [SHARED]}})
    # Outside DRA mode nothing is checked or rendered, even a bad name.
    plain = render(
        {"dra": {"extendedResourceNames": ["gpu"], "sharingClasses": [{"name": "x", "sharing": {}}]}}
    )
    assert not plain.find("DeviceClass")


def test_a_sharing_class_carries_its_gpu_config() -> None:
    entries = [
        SHARED,
        {
            "name": "mps-t4",
            "sharing": MPS,
            "extendedResourceName": "nvidia.com/gpu.mps",
            "selector": f"device.attributes['{DRIVER}'].productName == 'Tesla T4'",
        },
    ]
    found = classes({"dra": {"sharingClasses": entries}})
    assert set(found) == {
        "gpu.nvidia.com",
        "mig.nvidia.com",
        "nvidia.com-gpu",
        "shared-gpu.nvidia.com",
        "mps-t4",
    }
    shared = found["shared-gpu.nvidia.com"]["spec"]
    assert expression(found["shared-gpu.nvidia.com"]) == GPUS
    assert "extendedResourceName" not in shared
    assert shared["config"] == [
        {
            "opaque": {
                "driver": DRIVER,
                "parameters": {
                    "apiVersion": "resource.nvidia.com/v1beta1",
                    "kind": "GpuConfig",
                    "sharing": TIME_SLICING,
                },
            }
        }
    ]
    mps = found["mps-t4"]["spec"]
    assert (
        expression(found["mps-t4"]) == f"{GPUS} && (device.attributes['{DRIVER}'].productName == 'Tesla T4')"
    )
    assert mps["extendedResourceName"] == "nvidia.com/gpu.mps"
    (config,) = mps["config"]
    assert config["opaque"]["parameters"]["sharing"] == MPS


@pytest.mark.parametrize("kube", ["1.34", "1.36"])
def test_the_classes_are_valid_kubernetes_objects(kube: str) -> None:
    values = {
        **TWO_ENTRIES,
        "dra": {
            "extendedResourceNames": ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb"],
            "sharingClasses": [
                SHARED,
                {"name": "mps", "sharing": MPS, "extendedResourceName": "nvidia.com/gpu.mps"},
            ],
        },
    }
    found = list(classes(values).values())
    assert len(found) == 6
    assert_valid(found, [v for v in DRA_VERSIONS if v.startswith(kube + ".")])


def test_lint_strict_clean_with_every_class() -> None:
    import helm_python
    from chart_helm import CHART_DIR, NAMESPACE

    values = merge_values(
        DRA,
        {
            "dra": {
                "extendedResourceNames": ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb"],
                "sharingClasses": [SHARED, {"name": "mps", "sharing": MPS}],
            }
        },
    )
    for kube_version in ("v1.34.0", "v1.36.0"):
        report = helm_python.lint(
            str(CHART_DIR), values, strict=True, namespace=NAMESPACE, kube_version=kube_version
        )
        problems = [m for m in report["messages"] if m["error"] != "icon is recommended"]
        assert not problems and not report["errors"], (problems, report["errors"])


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (
            ["gpu"],
            "'dra.extendedResourceNames[0]' is \"gpu\", which is not an extended resource name: it must be "
            "<domain>/<name>, with exactly one '/'. Use <domain>/<name>, e.g. nvidia.com/gpu",
        ),
        (["nvidia.com/gpu/x"], "with exactly one '/'"),
        (
            ["nvidia.com/gpu", "kubernetes.io/gpu"],
            "'dra.extendedResourceNames[1]' is \"kubernetes.io/gpu\", which is not an extended "
            "resource name: the "
            "kubernetes.io domains are Kubernetes' own",
        ),
        (["example.kubernetes.io/gpu"], "the kubernetes.io domains are Kubernetes' own"),
        (["requests.nvidia.com/gpu"], "names starting with 'requests.' are taken by resource quotas"),
        (["NVIDIA.com/gpu"], "its domain must be a lower-case DNS subdomain of at most 244 characters"),
        (["/gpu"], "its domain must be a lower-case DNS subdomain"),
        ([("a" * 63 + ".") * 3 + "b" * 53 + "/gpu"], "of at most 244 characters"),
        (["nvidia.com/-gpu"], "the part after '/' must be at most 63 letters"),
        (["nvidia.com/" + "g" * 64], "the part after '/' must be at most 63 letters"),
        (["nvidia.com/"], "the part after '/' must be"),
    ],
)
def test_a_bad_extended_resource_name_is_refused(names: list[str], message: str) -> None:
    error = render_error(merge_values(DRA, {"dra": {"extendedResourceNames": names}}))
    assert message in error
    assert "or remove it from 'dra.extendedResourceNames'" in error


@pytest.mark.parametrize(
    ("name", "class_name"),
    [
        ("nvidia.com/GPU", "nvidia.com-GPU"),
        ("nvidia.com/big_gpu", "nvidia.com-big_gpu"),
        ("nvidia.com/gpu.-x", "nvidia.com-gpu.-x"),
        (("a" * 60 + ".") * 3 + "b" * 60 + "/" + "g" * 63, ("a" * 60 + ".") * 3 + "b" * 60 + "-" + "g" * 63),
    ],
)
def test_a_name_whose_class_name_is_invalid_is_refused(name: str, class_name: str) -> None:
    error = render_error(merge_values(DRA, {"dra": {"extendedResourceNames": [name]}}))
    assert (
        f'\'dra.extendedResourceNames[0]\' is "{name}": its DeviceClass would be named "{class_name}", '
        in error
    )
    assert "which is not a DNS subdomain of at most 253 characters" in error
    assert "Use a lower-case name without '_'" in error


@pytest.mark.parametrize(
    ("dra", "message"),
    [
        (
            {"extendedResourceNames": ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/gpu"]},
            "'dra.extendedResourceNames[2]' is \"nvidia.com/gpu\", which "
            "'dra.extendedResourceNames[0]' names too; one "
            "DeviceClass per extended resource name (the scheduler would use only one). Remove one of them.",
        ),
        (
            {"extendedResourceNames": ["a.com/b-c", "a.com-b/c"]},
            '\'dra.extendedResourceNames[1]\' is "a.com-b/c", whose DeviceClass "a.com-b-c" is '
            "already the class of "
            "'dra.extendedResourceNames[0]'. Remove one of them.",
        ),
        (
            {"sharingClasses": [{"name": "gpu.nvidia.com", "sharing": TIME_SLICING}]},
            "'dra.sharingClasses[0].name' is \"gpu.nvidia.com\", which is already the chart's "
            "full-GPU class. Give the "
            "sharing class another name.",
        ),
        (
            {"sharingClasses": [{"name": "nvidia.com-gpu", "sharing": TIME_SLICING}]},
            "'dra.sharingClasses[0].name' is \"nvidia.com-gpu\", which is already the class of "
            "'dra.extendedResourceNames[0]'",
        ),
        (
            {"sharingClasses": [SHARED, SHARED]},
            "'dra.sharingClasses[1].name' is \"shared-gpu.nvidia.com\", which is already the name of "
            "'dra.sharingClasses[0]'",
        ),
        (
            {"sharingClasses": [{**SHARED, "extendedResourceName": "nvidia.com/gpu"}]},
            "'dra.sharingClasses[0].extendedResourceName' is \"nvidia.com/gpu\", which "
            "'dra.extendedResourceNames[0]' "
            "names too",
        ),
        (
            {
                "sharingClasses": [
                    {**SHARED, "extendedResourceName": "x.com/s"},
                    {"name": "other", "sharing": TIME_SLICING, "extendedResourceName": "x.com/s"},
                ]
            },
            "'dra.sharingClasses[1].extendedResourceName' is \"x.com/s\", which "
            "'dra.sharingClasses[0].extendedResourceName' "
            "names too",
        ),
    ],
)
def test_two_classes_of_one_name_or_one_resource_are_refused(dra: dict[str, Any], message: str) -> None:
    assert message in render_error(merge_values(DRA, {"dra": dra}))


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            {"name": "Shared", "sharing": TIME_SLICING},
            "'dra.sharingClasses[0].name' is \"Shared\", which is not a DNS subdomain of at most 253 "
            "characters",
        ),
        (
            {"name": "shared_gpu", "sharing": TIME_SLICING},
            "Set it to a DeviceClass name such as shared-gpu.nvidia.com.",
        ),
        (
            {"name": "shared", "sharing": {"strategy": "timeslicing"}},
            "'dra.sharingClasses[0]' (\"shared\"): 'sharing.strategy' is \"timeslicing\", but it "
            "must be TimeSlicing or "
            "MPS (case-sensitive). Set 'sharing.strategy' of this entry to one of them.",
        ),
        (
            {"name": "shared", "sharing": {"timeSlicingConfig": {"interval": "Long"}}},
            "'sharing.strategy' is \"\", but it must be TimeSlicing or MPS",
        ),
        (
            {"name": "shared", "sharing": {"strategy": "TimeSlicing", "mpsConfig": {}}},
            "'dra.sharingClasses[0]' (\"shared\") sets 'sharing.mpsConfig', but its strategy is "
            "TimeSlicing. Remove "
            "'mpsConfig', or set 'sharing.strategy: MPS'.",
        ),
        (
            {"name": "shared", "sharing": {"strategy": "MPS", "timeSlicingConfig": {"interval": "Long"}}},
            "sets 'sharing.timeSlicingConfig', but its strategy is MPS",
        ),
        (
            {"name": "shared", "sharing": TIME_SLICING, "extendedResourceName": "shared"},
            "'dra.sharingClasses[0].extendedResourceName' is \"shared\", which is not an extended "
            "resource name: it must "
            "be <domain>/<name>, with exactly one '/'. Use <domain>/<name>, e.g. "
            "nvidia.com/gpu.shared, or leave it out.",
        ),
    ],
)
def test_a_bad_sharing_class_is_refused_naming_the_entry(entry: dict[str, Any], message: str) -> None:
    error = render_error(merge_values(DRA, {"dra": {"sharingClasses": [entry]}}))
    assert message in error


def test_an_mps_class_needs_dra_mps() -> None:
    error = render_error(
        merge_values(DRA, {"dra": {"mps": False, "sharingClasses": [{"name": "m", "sharing": MPS}]}})
    )
    assert (
        "'dra.sharingClasses[0]' (\"m\") shares GPUs with MPS, but 'dra.mps' is false, so the DRA plugin "
        "refuses MPS claims. Set 'dra.mps=true', or use 'sharing.strategy: TimeSlicing' in this entry."
    ) in error
    assert "shared-gpu.nvidia.com" in classes({"dra": {"mps": False, "sharingClasses": [SHARED]}})


@pytest.mark.parametrize(
    ("dra", "message"),
    [
        (
            {"extendedResourceNames": "nvidia.com/gpu"},
            "- at '/dra/extendedResourceNames': got string, want array",
        ),
        ({"extendedResourceNames": [""]}, "- at '/dra/extendedResourceNames/0': minLength: got 0, want 1"),
        ({"sharingClasses": [{"name": "x"}]}, "- at '/dra/sharingClasses/0': missing property 'sharing'"),
        (
            {"sharingClasses": [{"name": "x", "sharing": TIME_SLICING, "config": {}}]},
            "Unknown value 'dra.sharingClasses[0].config'. Keys under 'dra.sharingClasses[0]': "
            "extendedResourceName, name, selector, sharing.",
        ),
        (
            {
                "sharingClasses": [
                    {
                        "name": "x",
                        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Longer"}},
                    }
                ]
            },
            "- at '/dra/sharingClasses/0/sharing/timeSlicingConfig/interval': value must be one of",
        ),
        (
            {
                "sharingClasses": [
                    {
                        "name": "x",
                        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 0}},
                    }
                ]
            },
            "- at '/dra/sharingClasses/0/sharing/mpsConfig/defaultActiveThreadPercentage': minimum",
        ),
        (
            {"sharingClasses": [{"name": "x", "sharing": {"strategy": "MPS", "replicas": 2}}]},
            "Unknown value 'dra.sharingClasses[0].sharing.replicas'. "
            "Keys under 'dra.sharingClasses[0].sharing': mpsConfig, strategy, timeSlicingConfig.",
        ),
        ({"mps": "yes"}, "- at '/dra/mps': got string, want boolean"),
    ],
)
def test_the_schema_refuses_malformed_class_values(dra: dict[str, Any], message: str) -> None:
    assert message in render_error(merge_values(DRA, {"dra": dra}))
