"""The CDI specs the plugin serves with: built when it prepares, written before it registers,
rewritten around every re-plan, never deleted.

With a CDI device-list strategy (cdi-annotations, cdi-cri) Allocate returns names such as
`k8s.device-plugin.nvidia.com/gpu=<uuid>` that the container runtime resolves through the spec files in
/var/run/cdi. So no name may be advertised that the specs on disk do not resolve:

- `build` runs in prepare() (nvdp.cdi.generate); a CdiError is a StartupError, so a first start stops
  with its message and a reload is refused with the old config still serving;
- `CdiSpecs.stage` writes the specs before any resource starts (and so before any registration); on a
  re-plan it writes the union of the old and new specs (every name either plan advertises resolves
  while the resources switch), and `settle`, once the plan is applied, the new specs alone (no removed
  device stays);
- nothing is deleted when the plugin stops: containers created during a rolling update must still resolve
  their devices. /var/run is a tmpfs on most nodes, so the files go at reboot and come back at the next
  start, as NVIDIA's do.

`NVDP_CDI_DIR` moves the directory the specs are written to (tests, and runtimes configured with another
CDI directory); the chart leaves it at /var/run/cdi.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from nvdp.config.model import KNOWN_CDI_FEATURE_FLAGS, Config
from nvdp.daemon.errors import StartupError
from nvdp.inventory.model import Inventory
from nvdp.plan.model import Plan

if TYPE_CHECKING:
    from nvdp.cdi.build import SpecSet
    from nvdp.cdi.write import WriteResult

CDI_DIR_ENV = "NVDP_CDI_DIR"
LOGGER = "nvidia-device-plugin"


def spec_dir(env: Mapping[str, str]) -> str | None:
    """Where the plugin writes its specs: $NVDP_CDI_DIR, else None for nvdp.cdi.write.CDI_DIR
    (/var/run/cdi), looked up only once there is a spec to write."""
    return env.get(CDI_DIR_ENV) or None


def build(config: Config, inventory: Inventory, plan: Plan) -> SpecSet | None:
    """The specs for `plan` (None without a CDI strategy); raises StartupError with the cause and fix."""
    # Checked on the config, so that a plugin without CDI loads none of nvdp.cdi's builders (the
    # serving process's footprint, tests/footprint).
    if not config.flags.plugin.cdi_strategies:
        return None
    from nvdp.cdi import generate
    from nvdp.cdi.errors import CdiError

    _warn_unknown_feature_flags(config)
    try:
        return generate(config, inventory, plan)
    except CdiError as err:
        message = f"cannot generate the CDI specs (deviceListStrategy {','.join(_strategies(config))}): {err}"
        raise StartupError(message) from None


def classes(specs: SpecSet | None) -> frozenset[str]:
    """The CDI classes Allocate may name: those of the specs written."""
    return specs.classes() if specs is not None else frozenset()


class CdiSpecs:
    """The specs on disk and the set they were written from. Used from the main thread only."""

    def __init__(self, directory: str | None, log: logging.Logger) -> None:
        self.directory = directory  # None: nvdp.cdi.write.CDI_DIR
        self.log = log
        self.written: SpecSet | None = None  # what the files in `directory` resolve now

    def stage(self, new: SpecSet | None) -> None:
        """Before `new` is put in force: write it, together with the specs written before (a re-plan), so
        that every name of either plan resolves while the resources switch. Raises StartupError: the
        start stops, or the reload is refused, with nothing changed. None (CDI off) writes nothing: the
        old files stay for the containers that use them."""
        old = self.written
        if new is None or new == old:
            return
        self._write(new if old is None else old.merged(new), "before registering" if old is None else
                    "for the re-plan")

    def settle(self, new: SpecSet | None) -> None:
        """Once `new` serves: write it alone, so no removed device stays; a failure is a warning (the
        union written by `stage` still resolves every name advertised)."""
        if new is None or new == self.written:
            return
        try:
            self._write(new, "after the re-plan")
        except StartupError as err:
            self.log.warning("%s; the specs written before the re-plan stay, which also resolve devices "
                             "no longer advertised", err)

    def _write(self, specs: SpecSet, when: str) -> None:
        from nvdp.cdi.errors import CdiError
        from nvdp.cdi.write import CDI_DIR, write_specs

        try:
            result = write_specs(specs, self.directory or CDI_DIR)
        except CdiError as err:
            raise StartupError(f"cannot write the CDI specs {when}: {err}") from None
        self.written = specs
        self._log(result, when)

    def _log(self, result: WriteResult, when: str) -> None:
        for path in result.written:
            self.log.info("CDI spec written %s: %s", when, path)
        for path in result.removed:
            self.log.info("CDI spec removed %s (its class is no longer served): %s", when, path)
        if result.unchanged and not result.written and not result.removed:
            self.log.info("CDI specs unchanged %s: %s", when, ", ".join(result.unchanged))


def _strategies(config: Config) -> list[str]:
    return list(config.flags.plugin.cdi_strategies)


def _warn_unknown_feature_flags(config: Config) -> None:
    unknown = unknown_feature_flags(config)
    if unknown:
        logging.getLogger(LOGGER).warning(
            "Unknown CDI feature flag(s) %s (flags.plugin.cdiFeatureFlags / CDI_FEATURE_FLAGS): accepted and "
            "ignored, as NVIDIA does; the known ones are %s", ", ".join(unknown),
            ", ".join(KNOWN_CDI_FEATURE_FLAGS))


def unknown_feature_flags(config: Config) -> list[str]:
    return [f for f in config.flags.plugin.cdi_feature_flags if f not in KNOWN_CDI_FEATURE_FLAGS]
