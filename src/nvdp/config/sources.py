"""Where values besides the config file come from: environment variables and command-line flags.

Both give text; `convert_text` turns it into what the schema expects at that path, so env, flag and
file values then go through the same schema validation.
"""

from __future__ import annotations

from collections.abc import Mapping

from nvdp.config.issues import ConfigIssue, show_value
from nvdp.config.schema import accepted_types, alternatives, node_at, resolve
from nvdp.config.validate import expected_phrase

CONFIG_FILE_ENV = "CONFIG_FILE"

# NVIDIA's environment variable names (plus ours for the kubelet paths) -> dotted config path.
# When two names lead to one path, the first one set wins, as in NVIDIA's plugin.
ENV_VARS: Mapping[str, str] = {
    CONFIG_FILE_ENV: "",
    "MIG_STRATEGY": "flags.migStrategy",
    "MIG_DYNAMIC_PROFILES": "flags.migDynamicProfiles",
    "FAIL_ON_INIT_ERROR": "flags.failOnInitError",
    "MPS_ROOT": "flags.mpsRoot",
    "NVIDIA_DRIVER_ROOT": "flags.nvidiaDriverRoot",
    "NVIDIA_DEV_ROOT": "flags.nvidiaDevRoot",
    "GDRCOPY_ENABLED": "flags.gdrcopyEnabled",
    "GDS_ENABLED": "flags.gdsEnabled",
    "MOFED_ENABLED": "flags.mofedEnabled",
    "DEVICE_DISCOVERY_STRATEGY": "flags.deviceDiscoveryStrategy",
    "PASS_DEVICE_SPECS": "flags.plugin.passDeviceSpecs",
    "DEVICE_LIST_STRATEGY": "flags.plugin.deviceListStrategy",
    "DEVICE_ID_STRATEGY": "flags.plugin.deviceIDStrategy",
    "CDI_ANNOTATION_PREFIX": "flags.plugin.cdiAnnotationPrefix",
    "NVIDIA_CDI_HOOK_PATH": "flags.plugin.nvidiaCTKPath",
    "NVIDIA_CTK_PATH": "flags.plugin.nvidiaCTKPath",
    "CDI_FEATURE_FLAGS": "flags.plugin.cdiFeatureFlags",
    "CDI_DISABLE_HOOKS": "flags.plugin.cdiDisableHooks",
    "DRIVER_ROOT_CTR_PATH": "flags.plugin.containerDriverRoot",
    "CONTAINER_DRIVER_ROOT": "flags.plugin.containerDriverRoot",
    "SHARED_DEVICES_ALLOCATION_POLICY": "flags.plugin.sharedDevicesAllocationPolicy",
    "DEVICE_PLUGIN_PATH": "flags.plugin.devicePluginPath",
    "KUBELET_SOCKET": "flags.plugin.kubeletSocket",
    "DP_DISABLE_HEALTHCHECKS": "flags.plugin.disableHealthChecks",
    "DP_ENABLE_HEALTHCHECKS": "flags.plugin.enableHealthChecks",
    "HEALTH_RECOVERY_AFTER": "flags.plugin.healthRecoveryAfter",
    "HEALTH_FLAP_LIMIT": "flags.plugin.healthFlapLimit",
    "HEALTH_STATE_DIR": "flags.plugin.healthStateDir",
    "HEALTH_TAINT_EFFECT": "flags.plugin.healthTaintEffect",
    "IMEX_CHANNEL_IDS": "imex.channelIDs",
    "IMEX_REQUIRED": "imex.required",
}

# Command-line flag (its main name) -> dotted config path; aliases are declared in flags.py.
FLAG_PATHS: Mapping[str, str] = {
    "--mig-strategy": "flags.migStrategy",
    "--mig-dynamic-profiles": "flags.migDynamicProfiles",
    "--fail-on-init-error": "flags.failOnInitError",
    "--mps-root": "flags.mpsRoot",
    "--driver-root": "flags.nvidiaDriverRoot",
    "--dev-root": "flags.nvidiaDevRoot",
    "--gdrcopy-enabled": "flags.gdrcopyEnabled",
    "--gds-enabled": "flags.gdsEnabled",
    "--mofed-enabled": "flags.mofedEnabled",
    "--device-discovery-strategy": "flags.deviceDiscoveryStrategy",
    "--pass-device-specs": "flags.plugin.passDeviceSpecs",
    "--device-list-strategy": "flags.plugin.deviceListStrategy",
    "--device-id-strategy": "flags.plugin.deviceIDStrategy",
    "--cdi-annotation-prefix": "flags.plugin.cdiAnnotationPrefix",
    "--nvidia-cdi-hook-path": "flags.plugin.nvidiaCTKPath",
    "--cdi-feature-flags": "flags.plugin.cdiFeatureFlags",
    "--cdi-disable-hooks": "flags.plugin.cdiDisableHooks",
    "--driver-root-ctr-path": "flags.plugin.containerDriverRoot",
    "--shared-devices-allocation-policy": "flags.plugin.sharedDevicesAllocationPolicy",
    "--device-plugin-path": "flags.plugin.devicePluginPath",
    "--kubelet-socket": "flags.plugin.kubeletSocket",
    "--health-recovery-after": "flags.plugin.healthRecoveryAfter",
    "--health-flap-limit": "flags.plugin.healthFlapLimit",
    "--health-state-dir": "flags.plugin.healthStateDir",
    "--health-taint-effect": "flags.plugin.healthTaintEffect",
    "--imex-channel-ids": "imex.channelIDs",
    "--imex-required": "imex.required",
}

_TRUE = {"true", "1", "yes"}
_FALSE = {"false", "0", "no"}
BOOL_WORDS = "true/false, 1/0 or yes/no"


def flag_for_path(path: str) -> str | None:
    return next((flag for flag, p in FLAG_PATHS.items() if p == path), None)


def parse_bool(text: str) -> bool | None:
    """true/false/1/0/yes/no in any case; None for anything else."""
    word = text.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    return None


def split_path(path: str) -> tuple[str, ...]:
    return tuple(path.split(".")) if path else ()


def convert_text(path: str, text: str, source: str) -> tuple[object, ConfigIssue | None]:
    """Turn an env/flag string into the value the schema expects at `path`.

    Booleans must be a boolean word, integers a whole number; list-valued settings take a
    comma-separated list (integers where the list holds only integers). Everything else stays text
    and is checked by the schema.
    """
    node = node_at(split_path(path))
    if node is None:
        return text, ConfigIssue(source, path, "not a config setting", fix="check the name")
    types = accepted_types(node)
    if types - {"null"} == {"boolean"}:  # a nullable boolean (useNodeFeatureAPI) takes the same words
        value = parse_bool(text)
        if value is None:
            return text, ConfigIssue(
                source, path, "not a boolean", value=show_value(text), fix=f"use {BOOL_WORDS}"
            )
        return value, None
    if types - {"null"} == {"integer"}:  # healthFlapLimit; bounds are the schema's to check
        try:
            return int(text.strip()), None
        except ValueError:
            return text, ConfigIssue(
                source,
                path,
                "not an integer",
                value=show_value(text),
                fix=f"expected {expected_phrase(node)}",
            )
    array = next((alt for alt in alternatives(node) if "array" in accepted_types(alt)), None)
    if array is None:
        return text, None
    items = [item.strip() for item in text.split(",") if item.strip()]
    item_schema = array.get("items")
    if isinstance(item_schema, dict) and accepted_types(resolve(item_schema)) == {"integer"}:
        numbers: list[object] = []
        for item in items:
            try:
                numbers.append(int(item))
            except ValueError:
                return text, ConfigIssue(
                    source,
                    path,
                    f"{item!r} is not an integer",
                    value=show_value(text),
                    fix="use a comma-separated list of integers, e.g. 0",
                )
        return numbers, None
    return items, None
