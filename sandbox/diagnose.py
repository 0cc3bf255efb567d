"""Why a guarantee is missing on this host, and the fix, in words an operator can act on (`mcp-gateway doctor`; decision 56).

`probe_host` says which layers work here; this module says why the others do not, from facts
of the host (who the gateway runs as, its capabilities, the kernel's user-namespace switches,
Landlock's ABI, bubblewrap, the cgroup hierarchies). `mcp-gateway doctor`, the -32006 refusal of
a call and `policy check` all take their words from here.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from sandbox.backends import capabilities, cgroup
from sandbox.backends.bubblewrap import BWRAP
from sandbox.confine import LayerReport
from sandbox.guarantees import Guarantee, held, mechanisms_for
from sandbox.layers import Layer
from sandbox.limits import Backend

OPERATIONS = "docs/operations.md"


@dataclass(frozen=True, slots=True)
class HostFacts:
    """What decides which layers a gateway gets here; read once, printed by `doctor`."""

    euid: int
    sys_admin: bool
    set_uid: bool
    sysctls: Mapping[str, int | None] = field(default_factory=lambda: MappingProxyType({}))
    """The user-namespace switches: value, or None where the kernel has no such file."""
    cgroup_v1: bool = False
    cgroup2_mounted: bool = False
    bwrap_installed: bool = False
    kernel: str = ""

    @property
    def root(self) -> bool:
        return self.euid == 0


_USERNS_SYSCTLS = (
    "user/max_user_namespaces",
    "kernel/unprivileged_userns_clone",
    "kernel/apparmor_restrict_unprivileged_userns",
)


def host_facts() -> HostFacts:
    sysctls: dict[str, int | None] = {}
    for name in _USERNS_SYSCTLS:
        try:
            sysctls[name.replace("/", ".")] = int(Path("/proc/sys", name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            sysctls[name.replace("/", ".")] = None
    try:
        mounts = Path("/proc/self/mountinfo").read_text()
    except OSError:
        mounts = ""
    return HostFacts(
        euid=os.geteuid(),
        sys_admin=capabilities.has(capabilities.CAP_SYS_ADMIN),
        set_uid=capabilities.has(capabilities.CAP_SETUID, capabilities.CAP_SETGID),
        sysctls=MappingProxyType(sysctls),
        cgroup_v1=bool(cgroup.parse_mountinfo(mounts)),
        cgroup2_mounted=" - cgroup2 " in mounts,
        bwrap_installed=BWRAP.is_file(),
        kernel=platform.release(),
    )


def userns_blocker(facts: HostFacts) -> tuple[str, str] | None:
    """(why, fix) when the kernel's switches forbid this user a user namespace; None when none does."""
    if facts.sysctls.get("user.max_user_namespaces") == 0:
        return "user namespaces are disabled (user.max_user_namespaces = 0)", "sysctl -w user.max_user_namespaces=15000"
    if facts.sysctls.get("kernel.unprivileged_userns_clone") == 0:
        return (
            "unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone = 0)",
            "sysctl -w kernel.unprivileged_userns_clone=1",
        )
    if facts.sysctls.get("kernel.apparmor_restrict_unprivileged_userns") == 1:
        return (
            "AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns = 1, "
            "Ubuntu 23.10+)",
            "give the gateway's interpreter an AppArmor profile with `userns,` (see docs/operations.md), or "
            "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0",
        )
    return None


def _namespaces(facts: HostFacts, report: LayerReport) -> tuple[str, str]:
    """Why the namespace layers are missing, and the fix."""
    if facts.root and facts.sys_admin:
        return "the kernel refused the namespace (seccomp or a security module?)", f"see {OPERATIONS}"
    if report.user_namespace:
        return "the kernel refused it inside the run's user namespace", f"see {OPERATIONS}"
    blocker = userns_blocker(facts)
    who = "the gateway runs as root without CAP_SYS_ADMIN" if facts.root else "the gateway is not root"
    if blocker is not None:
        return f"{who} and {blocker[0]}", blocker[1]
    return (
        f"{who}, and the kernel refused it a user namespace (a container's seccomp profile?)",
        "allow unshare(CLONE_NEWUSER) (Docker: --security-opt seccomp=unconfined, or a profile that allows it), "
        "or run the gateway as root",
    )


def _cgroup(facts: HostFacts, report: LayerReport) -> tuple[str, str]:
    if facts.root and facts.cgroup_v1:
        return (
            "the gateway may not create groups under the v1 memory and pids hierarchies",
            "check /sys/fs/cgroup is writable",
        )
    if not facts.root and facts.cgroup_v1:
        return (
            "memory and pids are on cgroup v1 here, where only root may create groups",
            "run the gateway as root, or boot with cgroup v2 only (systemd.unified_cgroup_hierarchy=1) and delegate it",
        )
    if report.cgroup_why:
        return report.cgroup_why, report.cgroup_fix or f"see {OPERATIONS}"
    if facts.cgroup2_mounted:
        return (
            "the gateway's cgroup v2 group is not delegated to it",
            "start it with `systemd-run --user --scope -p Delegate=yes mcp-gateway serve`, or in a unit with Delegate=yes",
        )
    return "no cgroup hierarchy is mounted", "mount cgroup2 on /sys/fs/cgroup"


def why_missing(
    guarantee: Guarantee, report: LayerReport, backend: Backend = "native", facts: HostFacts | None = None
) -> str:
    """One phrase: why no layer keeps `guarantee` here, and its fix."""
    why, fix = cause(guarantee, report, backend, facts or host_facts())
    return f"{guarantee}: {why}; fix: {fix}"


def cause(guarantee: Guarantee, report: LayerReport, backend: Backend, facts: HostFacts) -> tuple[str, str]:
    """(why, fix) for a guarantee no layer keeps here."""
    if guarantee is Guarantee.OWN_IDENTITY:
        if facts.root and not facts.set_uid:
            return "the gateway runs as root without CAP_SETUID and CAP_SETGID", "give it back those capabilities"
        return _namespaces(facts, report)
    if guarantee is Guarantee.FILE_GRANTS:
        if backend == "bubblewrap":
            if not facts.bwrap_installed:
                return "bubblewrap is not installed", "apt-get install bubblewrap (or use sandbox.backend: native)"
            return "bwrap cannot build a mount tree here", "check bwrap may create user namespaces; " + _namespaces(
                facts, report
            )[1]
        return (
            "the kernel has no Landlock",
            "boot a kernel with CONFIG_SECURITY_LANDLOCK and landlock in lsm=, or use sandbox.backend: bubblewrap",
        )
    if guarantee is Guarantee.SYSCALL_FILTER:
        return (
            f"the seccomp filter exists for Linux x86_64 only (this is {platform.machine()})",
            "leave syscall_filter out of sandbox.require",
        )
    if guarantee is Guarantee.MEMORY_TOTAL:
        return _cgroup(facts, report)
    if guarantee is Guarantee.PROCESS_TOTAL:
        why, fix = _cgroup(facts, report)
        return f"{why}, and the run has no uid or user namespace of its own for RLIMIT_NPROC", fix
    if guarantee is Guarantee.PROCESS_LIMITS:
        return "setrlimit failed in a probe", f"see {OPERATIONS}"
    return _namespaces(facts, report)  # no_network, network_through_proxy, bounded_scratch, whole_run_kill, isolation


@dataclass(frozen=True, slots=True)
class Line:
    """One guarantee on this host: the layers keeping it, or why none does and the fix."""

    guarantee: Guarantee
    required: bool
    layers: tuple[Layer, ...]
    options: tuple[str, ...] = ()
    """Each way it is kept here, for humans: `cgroup`, `rlimits + uid_drop`."""
    why: str = ""
    fix: str = ""

    @property
    def holds(self) -> bool:
        return bool(self.layers)


def diagnose(report: LayerReport, backend: Backend, required: frozenset[Guarantee], facts: HostFacts) -> list[Line]:
    """Every guarantee, in declaration order, as this host keeps it for a run of `backend`."""
    available = report.available(backend)
    kept = held(available)
    lines = []
    for guarantee in Guarantee:
        layers = kept.get(guarantee, ())
        options = tuple(" + ".join(sorted(o)) for o in mechanisms_for(guarantee) if o <= available)
        why, fix = ("", "") if layers else cause(guarantee, report, backend, facts)
        lines.append(Line(guarantee, guarantee in required, layers, options, why, fix))
    return lines


def alternatives(guarantee: Guarantee) -> str:
    """The layer sets that can keep `guarantee`, for humans: `uid_drop | user_namespace`."""
    return " | ".join(" + ".join(sorted(option)) for option in mechanisms_for(guarantee))
