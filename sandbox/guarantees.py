"""What a run is promised, and which mechanisms of this host keep each promise (decision 56).

A policy says what must hold for a run (`sandbox.require`), not how: the same guarantee is kept
by different mechanisms on different hosts. A gateway started as root gives each run a pool uid
of its own; started by an ordinary user (how Claude Code, VS Code and Cursor start a stdio server)
it gives each run a user namespace instead. Both are `own_identity`. `probe_host` finds the
mechanisms this host has (sandbox/confine.py `LayerReport`); `held` maps them to guarantees;
the runner applies every mechanism it has and refuses to start a run when a required guarantee
has none.

Mechanism names are the runner's layers (`sandbox.layers.Layer`), and they are what evidence.json
and the audit's `SANDBOX_EXEC` report as `layers`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from enum import StrEnum
from types import MappingProxyType

from sandbox.layers import Layer


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
    NETWORK_THROUGH_PROXY = "network_through_proxy"


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
        Guarantee.NETWORK_THROUGH_PROXY: (
            "a proxied run reaches nothing but the gateway's proxy: its own loopback, where only the gateway listens"
        ),
    }
)  # fmt: skip

_KEPT_BY: Mapping[Guarantee, tuple[frozenset[Layer], ...]] = MappingProxyType(
    {
        # Each entry: alternative sets of mechanisms; the guarantee holds when one set is all there.
        Guarantee.OWN_IDENTITY: (frozenset({Layer.UID_DROP}), frozenset({Layer.USER_NAMESPACE})),
        Guarantee.FILE_GRANTS: (frozenset({Layer.LANDLOCK}), frozenset({Layer.MOUNT_TREE})),
        Guarantee.NO_NETWORK: (frozenset({Layer.NETWORK_NAMESPACE}),),
        Guarantee.BOUNDED_SCRATCH: (frozenset({Layer.SCRATCH_TMPFS}),),
        Guarantee.MEMORY_TOTAL: (frozenset({Layer.CGROUP}),),
        # RLIMIT_NPROC counts the processes of a uid in a user namespace: the run's alone when the
        # uid is a pool uid of its own, or when the run has a user namespace of its own (Linux 5.14+).
        Guarantee.PROCESS_TOTAL: (
            frozenset({Layer.CGROUP}),
            frozenset({Layer.RLIMITS, Layer.UID_DROP}),
            frozenset({Layer.RLIMITS, Layer.USER_NAMESPACE}),
        ),
        Guarantee.PROCESS_LIMITS: (frozenset({Layer.RLIMITS}),),
        Guarantee.SYSCALL_FILTER: (frozenset({Layer.SECCOMP}),),
        Guarantee.WHOLE_RUN_KILL: (frozenset({Layer.PID_NAMESPACE}), frozenset({Layer.CGROUP})),
        Guarantee.PROCESS_ISOLATION: (frozenset({Layer.PID_NAMESPACE}),),
        Guarantee.IPC_ISOLATION: (frozenset({Layer.IPC_NAMESPACE}),),
        # The same namespace, its loopback up and the gateway's listener made in it (backends/proxy_listener.py).
        Guarantee.NETWORK_THROUGH_PROXY: (frozenset({Layer.NETWORK_NAMESPACE}),),
    }
)

ALWAYS_REQUIRED = frozenset({Guarantee.OWN_IDENTITY, Guarantee.FILE_GRANTS})
"""No policy may waive these: without its own identity a run is the gateway (root, or the user
whose state folder holds the keys), and without file grants it reads that state folder."""

DEFAULT_REQUIRED = frozenset(Guarantee) - {Guarantee.MEMORY_TOTAL, Guarantee.NETWORK_THROUGH_PROXY}
"""Required when the policy does not say: everything an ordinary user's gateway gets on a current
Linux. A memory total needs a cgroup the gateway may manage (root, or a delegated cgroup v2
subtree); where it has one, runs get it anyway (docs/security-model.md). network_through_proxy is
required of a proxied run whatever is listed (sandbox/limits.py `required_guarantees`)."""

LAYER_GUARANTEES: Mapping[str, tuple[Guarantee, ...]] = MappingProxyType(
    {
        Layer.UID_DROP: (Guarantee.OWN_IDENTITY,),
        Layer.CGROUP: (Guarantee.MEMORY_TOTAL, Guarantee.PROCESS_TOTAL),
        Layer.NETWORK_NAMESPACE: (Guarantee.NO_NETWORK,),
        Layer.IPC_NAMESPACE: (Guarantee.IPC_ISOLATION,),
        Layer.SCRATCH_TMPFS: (Guarantee.BOUNDED_SCRATCH,),
        Layer.RLIMITS: (Guarantee.PROCESS_LIMITS,),
        Layer.LANDLOCK: (Guarantee.FILE_GRANTS,),
        Layer.MOUNT_TREE: (Guarantee.FILE_GRANTS,),
        Layer.SECCOMP: (Guarantee.SYSCALL_FILTER,),
        Layer.PID_NAMESPACE: (Guarantee.WHOLE_RUN_KILL, Guarantee.PROCESS_ISOLATION),
    }
)
"""The guarantees each name of the old `sandbox.required_layers` stood for (policy migration)."""


def held(mechanisms: Set[Layer]) -> dict[Guarantee, tuple[Layer, ...]]:
    """Each guarantee these mechanisms keep -> the mechanisms keeping it (every alternative that holds)."""
    out: dict[Guarantee, tuple[Layer, ...]] = {}
    for guarantee, alternatives in _KEPT_BY.items():
        keeping = [name for option in alternatives if option <= mechanisms for name in sorted(option)]
        if keeping:
            out[guarantee] = tuple(dict.fromkeys(keeping))
    return out


def missing(mechanisms: Set[Layer], required: Iterable[Guarantee]) -> list[Guarantee]:
    """The required guarantees no set of these mechanisms keeps, in declaration order."""
    kept = held(mechanisms)
    wanted = set(required)
    return [g for g in Guarantee if g in wanted and g not in kept]


def mechanisms_for(guarantee: Guarantee) -> tuple[frozenset[Layer], ...]:
    """The alternative mechanism sets that keep `guarantee`."""
    return _KEPT_BY[guarantee]


def from_layers(layers: Iterable[str]) -> frozenset[Guarantee]:
    """The guarantees an old `sandbox.required_layers` list asked for (unknown names raise KeyError)."""
    return frozenset(g for name in layers for g in LAYER_GUARANTEES[name])
