"""The doctor's CDI checks, with a CDI device list strategy only (cdi-annotations, cdi-cri):

- every qualified name the plugin would return in Allocate resolves in the spec directories as the
  container runtime reads them (`/etc/cdi`, then `/var/run/cdi`, which wins; `Where.cdi_dirs`), so no
  container fails with "unresolvable CDI devices";
- the hook binary the specs point at exists on the host, looked up as the plugin looks it up at start.
"""

from __future__ import annotations

from pathlib import Path

from nvdp.config.model import Config
from nvdp.doctor.report import Finding, failed, passed, skipped
from nvdp.doctor.where import Where
from nvdp.plan.model import Plan
from nvdp.text import short_list

NAMES_TITLE = "the names the plugin returns resolve in the CDI specs"
HOOK_TITLE = "the CDI hook exists on the host"
OPTIONAL_CLASSES = ("imex-channel", "gdrcopy", "gds", "mofed")
FIX_WRITE = (
    "the plugin writes its specs before it registers and on every re-plan: see its log for "
    "`CDI spec written` or the error that stopped it (`kubectl logs <plugin pod>`), fix that, and "
    "restart the plugin pod; `nvdp cdi generate` prints what it would write"
)


def cdi_on(config: Config) -> bool:
    return bool(config.flags.plugin.cdi_strategies)


def planned_names(config: Config, plan: Plan, present_classes: frozenset[str]) -> list[str]:
    """Every qualified name Allocate may return under `plan`: each device's `gpu` name, and the names
    of the optional classes whose spec the plugin wrote (it names no other), as Allocate builds them."""
    from nvdp.plan.ids import device_container_ids
    from nvdp.plugin.allocate import cdi_names

    devices = [device for resource in plan.resources for device in resource.devices]
    ids = device_container_ids(devices, config.flags.plugin.device_id_strategy)
    return cdi_names(ids, config, present_classes)


class CdiChecks:
    where: Where
    config: Config
    config_valid: bool
    plan: Plan | None

    def cdi(self) -> list[Finding]:
        """Both CDI findings; none at all without a CDI strategy."""
        if not (self.config_valid and cdi_on(self.config)):
            return []
        return [self.cdi_names(), self.cdi_hook()]

    def cdi_dirs(self) -> tuple[Path, ...]:
        from nvdp.plugin.cdi_specs import CDI_DIR_ENV

        moved = self.where.env.get(CDI_DIR_ENV)
        if moved:  # the plugin writes elsewhere; the runtime must read that directory instead
            return (*self.where.cdi_dirs[:-1], Path(moved))
        return self.where.cdi_dirs

    def cdi_names(self) -> Finding:
        from nvdp.cdi.names import VENDOR as CDI_VENDOR
        from nvdp.cdi.names import kind_of
        from nvdp.doctor.cdi_specs import read_dirs

        if self.plan is None:
            return skipped("cdi", NAMES_TITLE, "no plan (see above), so no names to look up")
        dirs = self.cdi_dirs()
        resolved = read_dirs(dirs)
        written = {name.partition("=")[0] for name in resolved.names}
        present = frozenset(cls for cls in OPTIONAL_CLASSES if kind_of(cls) in written)
        wanted = planned_names(self.config, self.plan, present)
        missing = [name for name in wanted if name not in resolved.names]
        where = " and ".join(str(d) for d in dirs)
        if not missing:
            files = sorted({resolved.names[name] for name in wanted})
            return passed("cdi", NAMES_TITLE, f"{len(wanted)} name(s) resolve in {short_list(files, 3)}")
        problems = [f"{len(missing)} of {len(wanted)} name(s) resolve in no spec in {where}: "
                    f"{short_list(missing, 3)}"]
        conflicted = [f"{name} (in {', '.join(files)})" for name, files in resolved.conflicts.items()
                      if name in missing]
        if conflicted:
            problems.append("defined twice in one directory, which the runtime refuses: "
                            + short_list(conflicted, 2))
        ours = {path: why for path, why in resolved.skipped.items() if CDI_VENDOR in Path(path).name}
        problems += [f"{path} does not load: {why}" for path, why in ours.items()]
        problems += [f"{d} cannot be read: {why}" for d, why in resolved.unreadable_dirs.items()]
        fix = FIX_WRITE
        if conflicted:
            fix = f"remove the other file defining those names (one nvidia-ctk generated, for example); {fix}"
        return failed("cdi", NAMES_TITLE, "; ".join(problems), fix)

    def cdi_hook(self) -> Finding:
        from nvdp.cdi.errors import CdiError
        from nvdp.cdi.host import check_hook, hooks_needed, resolve_roots

        hook = self.config.flags.plugin.nvidia_ctk_path
        if not hooks_needed(self.config):
            return passed("cdi-hook", HOOK_TITLE, "not needed: every hook is disabled (cdiDisableHooks)")
        try:  # as the plugin checks it at start
            check_hook(self.config, resolve_roots(self.config), self.where.env)
        except CdiError as err:
            return failed("cdi-hook", HOOK_TITLE, *_cause_and_fix(str(err)))
        return passed("cdi-hook", HOOK_TITLE, f"{hook} is an executable file on the host")


def _cause_and_fix(message: str) -> tuple[str, str]:
    """nvdp.cdi's messages are "<what was found>. Set ..." or "<what was found>; set ..."."""
    for separator in (". Set ", "; set "):
        head, sep, fix = message.partition(separator)
        if sep:
            return head, "set " + fix
    return message, "see the message"
