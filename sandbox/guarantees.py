"""What a run is promised, and which mechanisms of this host keep each promise (issue 14, item 3).

A policy says what must hold for a run (`sandbox.require`), not how: the same guarantee is kept
by different mechanisms on different hosts. A gateway started as root gives each run a pool uid
of its own; started by an ordinary user (how Claude Code, VS Code and Cursor start a stdio server)
it gives each run a user namespace instead. Both are `own_identity`. `probe_host` finds the
mechanisms this host has (sandbox/confine.py `LayerReport`); `held` maps them to guarantees;
the runner applies every mechanism it has and refuses to start a run when a required guarantee
has none.

Mechanism names are the runner's layers (`sandbox.limits.LAYERS`, plus `user_namespace`), and
they are what evidence.json and the audit's `SANDBOX_EXEC` report as `layers`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from enum import StrEnum
from types import MappingProxyType


class Guarantee(StrEnum):
    OWN_IDENTITY = "own_identity"
    FILE_GRANTS = "file_grants"
    NO_NETWORK = "no_network"
    BOUNDED_SCRATCH = "bounded_scratch"
    MEMORY_TOTAL = "memory_total"
    PROCESS_TOTAL = "process_total"
    PROCESS_LIMITS = "process_limits"
    SYSCALL_FILTER = "syscall_filter"
    WHOLE_RUN_KILL = "whole_run_kill"
    PROCESS_ISOLATION = "process_isolation"
    IPC_ISOLATION = "ipc_isolation"


MEANING: Mapping[Guarantee, str] = MappingProxyType(
    {
        Guarantee.OWN_IDENTITY: "the run holds no privilege of the gateway's: an identity of its own, no capability on the host",
        Guarantee.FILE_GRANTS: "the run reads only its grants (interpreter, workspace, allowed_paths) and writes only its scratch",
        Guarantee.NO_NETWORK: "the run reaches no network: no interface but a loopback that is down",
        Guarantee.BOUNDED_SCRATCH: "the run's only writable place is a tmpfs of scratch_limit_mb, with an inode cap",
        Guarantee.MEMORY_TOTAL: "the run's processes together stay under memory_limit_mb, swap included",
        Guarantee.PROCESS_TOTAL: "the run's processes together stay under max_processes",
        Guarantee.PROCESS_LIMITS: "each process has limits on address space, CPU time, file size, open files, no core",
        Guarantee.SYSCALL_FILTER: "a seccomp filter refuses ptrace, mounts, namespaces, keyrings, io_uring, sockets",
        Guarantee.WHOLE_RUN_KILL: "nothing the run starts, daemons included, outlives its end, its time limit or the gateway",
        Guarantee.PROCESS_ISOLATION: "the run sees and signals its own processes only",
        Guarantee.IPC_ISOLATION: "the run's SysV and POSIX IPC objects are its own and die with it",
    }
)  # fmt: skip

_KEPT_BY: Mapping[Guarantee, tuple[frozenset[str], ...]] = MappingProxyType(
    {
        # Each entry: alternative sets of mechanisms; the guarantee holds when one set is all there.
        Guarantee.OWN_IDENTITY: (frozenset({"uid_drop"}), frozenset({"user_namespace"})),
        Guarantee.FILE_GRANTS: (frozenset({"landlock"}), frozenset({"mount_tree"})),
        Guarantee.NO_NETWORK: (frozenset({"network_namespace"}),),
        Guarantee.BOUNDED_SCRATCH: (frozenset({"scratch_tmpfs"}),),
        Guarantee.MEMORY_TOTAL: (frozenset({"cgroup"}),),
        # RLIMIT_NPROC counts the processes of a uid in a user namespace: the run's alone when the
        # uid is a pool uid of its own, or when the run has a user namespace of its own (Linux 5.14+).
        Guarantee.PROCESS_TOTAL: (
            frozenset({"cgroup"}),
            frozenset({"rlimits", "uid_drop"}),
            frozenset({"rlimits", "user_namespace"}),
        ),
        Guarantee.PROCESS_LIMITS: (frozenset({"rlimits"}),),
        Guarantee.SYSCALL_FILTER: (frozenset({"seccomp"}),),
        Guarantee.WHOLE_RUN_KILL: (frozenset({"pid_namespace"}), frozenset({"cgroup"})),
        Guarantee.PROCESS_ISOLATION: (frozenset({"pid_namespace"}),),
        Guarantee.IPC_ISOLATION: (frozenset({"ipc_namespace"}),),
    }
)

ALWAYS_REQUIRED = frozenset({Guarantee.OWN_IDENTITY, Guarantee.FILE_GRANTS})
"""No policy may waive these: without its own identity a run is the gateway (root, or the user
whose state folder holds the keys), and without file grants it reads that state folder."""

DEFAULT_REQUIRED = frozenset(Guarantee) - {Guarantee.MEMORY_TOTAL}
"""Required when the policy does not say: everything an ordinary user's gateway gets on a current
Linux. A memory total needs a cgroup the gateway may manage (root, or a delegated cgroup v2
subtree); where it has one, runs get it anyway (docs/security-model.md)."""

LAYER_GUARANTEES: Mapping[str, tuple[Guarantee, ...]] = MappingProxyType(
    {
        "uid_drop": (Guarantee.OWN_IDENTITY,),
        "cgroup": (Guarantee.MEMORY_TOTAL, Guarantee.PROCESS_TOTAL),
        "network_namespace": (Guarantee.NO_NETWORK,),
        "ipc_namespace": (Guarantee.IPC_ISOLATION,),
        "scratch_tmpfs": (Guarantee.BOUNDED_SCRATCH,),
        "rlimits": (Guarantee.PROCESS_LIMITS,),
        "landlock": (Guarantee.FILE_GRANTS,),
        "mount_tree": (Guarantee.FILE_GRANTS,),
        "seccomp": (Guarantee.SYSCALL_FILTER,),
        "pid_namespace": (Guarantee.WHOLE_RUN_KILL, Guarantee.PROCESS_ISOLATION),
    }
)
"""The guarantees each name of the old `sandbox.required_layers` stood for (policy migration)."""


def held(mechanisms: Set[str]) -> dict[Guarantee, tuple[str, ...]]:
    """Each guarantee these mechanisms keep -> the mechanisms keeping it (every alternative that holds)."""
    out: dict[Guarantee, tuple[str, ...]] = {}
    for guarantee, alternatives in _KEPT_BY.items():
        keeping = [name for option in alternatives if option <= mechanisms for name in sorted(option)]
        if keeping:
            out[guarantee] = tuple(dict.fromkeys(keeping))
    return out


def missing(mechanisms: Set[str], required: Iterable[Guarantee]) -> list[Guarantee]:
    """The required guarantees no set of these mechanisms keeps, in declaration order."""
    kept = held(mechanisms)
    wanted = set(required)
    return [g for g in Guarantee if g in wanted and g not in kept]


def mechanisms_for(guarantee: Guarantee) -> tuple[frozenset[str], ...]:
    """The alternative mechanism sets that keep `guarantee`."""
    return _KEPT_BY[guarantee]


def from_layers(layers: Iterable[str]) -> frozenset[Guarantee]:
    """The guarantees an old `sandbox.required_layers` list asked for (unknown names raise KeyError)."""
    return frozenset(g for name in layers for g in LAYER_GUARANTEES[name])
