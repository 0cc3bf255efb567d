"""Which isolation layers a run gets, and the child-side plan that applies them in order (decisions 17, 57).

Everything that allocates (Landlock rule fds, the seccomp program, the tmpfs, the cgroup
files, ctypes pointers) is prepared in the parent; the child's `preexec_fn` only makes system
calls. Two orders, by what the gateway may do:

- as root with CAP_SYS_ADMIN: join the cgroup (first, so that everything after is counted) ->
  `fchdir` to the workspace's pinned fd (sandbox/pinned.py; before the mount namespace, which
  takes the cwd along) -> network and IPC namespaces -> mount namespace with the scratch tmpfs
  -> PID namespace (all four need root) -> rlimits -> drop to the run's pool uid;
- rootless (an ordinary user; or root without CAP_SYS_ADMIN, after the drop to the pool uid):
  join the cgroup -> `fchdir` -> the run's own user namespace with its network, IPC, UTS, mount
  and cgroup namespaces (backends/userns.py) -> the scratch tmpfs, made inside it -> PID
  namespace -> rlimits (after the user namespace: RLIMIT_NPROC then counts the run alone) ->
  seal: every capability dropped, undumpable;

then, both: Landlock -> seccomp (it denies unshare/mount, and Landlock's calls must still
pass) -> the fork into the supervisors (sandbox/backends/pidns.py), last, so that they are as
confined as the command.

With the bubblewrap backend the child skips Landlock and seccomp, and its supervisor's child
execs bubblewrap (sandbox/backends/bubblewrap.py), which adds a PID namespace and a minimal
mount tree in place of Landlock, and installs the same seccomp program just before the command.

A policy requires guarantees, not layers (sandbox/guarantees.py): every layer the host has is
applied, and `plan_layers` refuses a run when a required guarantee has no layer to keep it.

`preexec_fn` is a deliberate choice (decision 17): it is the cheapest way to apply the
layers (+1-2 ms a spawn against +15-30 ms for a second Python interpreter), and the steps it
runs take no Python-level lock, import nothing and allocate almost nothing after fork.
"""

from __future__ import annotations

import contextlib
import os
import platform
from collections.abc import Callable, Set
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import TracebackType
from typing import assert_never

from sandbox import guarantees
from sandbox.backends import capabilities, cgroup, cgroup2, landlock, namespaces, netns, pidns, rlimits, seccomp, userns
from sandbox.backends.bubblewrap import bubblewrap_available
from sandbox.backends.cgroup import RunCgroup
from sandbox.backends.cgroup2 import RunCgroup2
from sandbox.backends.identity import DEFAULT_POOL, RunIdentity, drop_privileges, holding
from sandbox.backends.proxy_listener import ProxyListener
from sandbox.backends.scratch import (
    NamespacedScratch,
    NamespacedTree,
    ScratchSpace,
    namespaced_scratch_available,
    namespaced_tree_available,
    scratch_available,
)
from sandbox.backends.view import NamespacedView, WorkspaceView
from sandbox.errors import SandboxStartError
from sandbox.guarantees import Guarantee
from sandbox.layers import Layer
from sandbox.limits import BACKEND_LAYERS, LAYERS, Backend, Limits
from sandbox.pinned import Pinned
from sandbox.proxy_port import PROXY_PORT


@dataclass(frozen=True, slots=True)
class LayerReport:
    """What this kernel and process can enforce, for start-up logs, `policy check` and `doctor`."""

    uid_drop: bool
    """A pool uid of its own for each run (the gateway runs as root, with CAP_SETUID)."""
    cgroup: bool
    """Groups the gateway may create with a memory and a process limit and a whole-group kill:
    cgroup v1 (memory, pids, freezer hierarchies) or cgroup v2 (backends/cgroup2.py)."""
    network_namespace: bool
    scratch_tmpfs: bool
    """A private mount namespace with a size-limited tmpfs as the scratch folder."""
    rlimits: bool
    landlock: int
    """The Landlock ABI version, 0 when unavailable."""
    seccomp: bool
    mount_tree: bool = False
    """bubblewrap runs here as an unprivileged uid: its minimal mount tree (bubblewrap backend)."""
    pid_namespace: bool = False
    """A PID namespace whose pid 1 takes the run down with it (native: pidns.py; bubblewrap: its own)."""
    ipc_namespace: bool = False
    """A new IPC namespace: the run's SysV and POSIX IPC objects are its own and die with it."""
    user_namespace: bool = False
    """Each run in a user namespace of its own, which makes the other namespaces without root
    (backends/userns.py); used when the gateway lacks CAP_SYS_ADMIN."""
    cgroup_version: int = 1
    """Which hierarchy `cgroup` uses: 1 or 2."""
    cgroup_why: str = ""
    """Without `cgroup`: why not, and the fix (`cgroup_fix`), as discovery found them."""
    cgroup_fix: str = ""

    def has(self, layer: Layer) -> bool:
        """Whether this host can apply `layer`."""
        match layer:
            case Layer.UID_DROP:
                return self.uid_drop
            case Layer.USER_NAMESPACE:
                return self.user_namespace
            case Layer.CGROUP:
                return self.cgroup
            case Layer.NETWORK_NAMESPACE:
                return self.network_namespace
            case Layer.IPC_NAMESPACE:
                return self.ipc_namespace
            case Layer.SCRATCH_TMPFS:
                return self.scratch_tmpfs
            case Layer.RLIMITS:
                return self.rlimits
            case Layer.LANDLOCK:
                return self.landlock > 0
            case Layer.SECCOMP:
                return self.seccomp
            case Layer.PID_NAMESPACE:
                return self.pid_namespace
            case Layer.MOUNT_TREE:
                return self.mount_tree
            case _:
                assert_never(layer)

    def available(self, backend: Backend | None = None) -> frozenset[Layer]:
        """The layers this host has (of `backend`, when given)."""
        names = LAYERS if backend is None else BACKEND_LAYERS[backend]
        return frozenset(layer for layer in names if self.has(layer))

    def guarantees(self, backend: Backend) -> dict[Guarantee, tuple[Layer, ...]]:
        """Each guarantee a run of `backend` gets here -> the layers keeping it."""
        return guarantees.held(self.available(backend))

    def missing(self, backend: Backend, required: Set[Guarantee]) -> list[Guarantee]:
        """The required guarantees no layer of `backend` keeps on this host."""
        return guarantees.missing(self.available(backend), required)

    @property
    def rootless(self) -> bool:
        """Runs get their identity from a user namespace, not from a pool uid made by root."""
        return self.user_namespace and not self.uid_drop


def probe_layers() -> LayerReport:
    """Try each layer's real step in a throwaway child, as the runs here would get it.

    As root with CAP_SYS_ADMIN, the namespaces and the tmpfs are made as root before the drop to
    the pool uid. Without it (an ordinary user, or root in a container without CAP_SYS_ADMIN),
    they are made inside a user namespace of the run's own, when the kernel allows one.
    """
    can_drop = os.geteuid() == 0 and capabilities.has(capabilities.CAP_SETUID, capabilities.CAP_SETGID)
    groups = run_groups()
    if os.geteuid() == 0 and capabilities.has(capabilities.CAP_SYS_ADMIN) and can_drop:
        bubblewrap = bubblewrap_available()
        return LayerReport(
            uid_drop=True,
            cgroup=groups.version > 0,
            cgroup_version=groups.version,
            cgroup_why=groups.why,
            cgroup_fix=groups.fix,
            network_namespace=netns.network_namespace_available(),
            scratch_tmpfs=scratch_available(),
            rlimits=True,
            landlock=landlock.abi_version(),
            seccomp=_seccomp_platform(),
            mount_tree=bubblewrap,
            pid_namespace=pidns.pid_namespace_available(),
            ipc_namespace=namespaces.ipc_namespace_available(),
        )
    run_uid, run_gid = (DEFAULT_POOL.start, DEFAULT_POOL.start) if can_drop else (os.getuid(), os.getgid())
    with holding(run_uid) if can_drop else contextlib.nullcontext():  # no sweep takes a probe for a leftover
        return _rootless_layers(can_drop, groups, run_uid, run_gid)


def _rootless_layers(can_drop: bool, groups: RunGroups, run_uid: int, run_gid: int) -> LayerReport:
    # The read-only tree (and the hidden state folder) is part of a rootless run's file grants: without it, no mode.
    user_ns = userns.user_namespace_available(run_uid, run_gid) and namespaced_tree_available(run_uid, run_gid)
    return LayerReport(
        uid_drop=can_drop,
        cgroup=groups.version > 0,
        cgroup_version=groups.version,
        cgroup_why=groups.why,
        cgroup_fix=groups.fix,
        network_namespace=user_ns,
        scratch_tmpfs=user_ns and namespaced_scratch_available(run_uid, run_gid),
        rlimits=True,
        landlock=landlock.abi_version(),
        seccomp=_seccomp_platform(),
        mount_tree=user_ns and bubblewrap_available(run_uid, run_gid),
        pid_namespace=user_ns and pidns.pid_namespace_available(userns.probe_entry(run_uid, run_gid)),
        ipc_namespace=user_ns,
        user_namespace=user_ns,
    )


@dataclass(frozen=True, slots=True)
class RunGroups:
    """Where run groups are made here: cgroup `version` 1 or 2 (0: nowhere, and why not, and the fix)."""

    version: int
    v2: cgroup2.V2Root | None = None
    why: str = ""
    fix: str = ""


@cache
def run_groups() -> RunGroups:
    """cgroup v1 where it has memory, pids and freezer and the gateway may write there (root); else cgroup v2
    with memory, pids and a whole-group kill (root, or a delegated subtree). Found once per process:
    v2 discovery moves the gateway into its leaf group (backends/cgroup2.py), so call it before threads."""
    if os.geteuid() == 0 and cgroup.discover() is not None:
        return RunGroups(1)
    found = cgroup2.discover_v2()
    controls = found.controls
    if found.root is not None and {"memory", "pids"} <= controls and controls & {"kill", "freeze"}:
        return RunGroups(2, found.root)
    why = found.reason or "cgroup v2 here lacks the memory or pids controller, or a whole-group kill"
    return RunGroups(0, None, why, found.fix)


def _seccomp_platform() -> bool:
    return platform.system() == "Linux" and platform.machine() == "x86_64"


def plan_layers(report: LayerReport, limits: Limits) -> frozenset[Layer]:
    """The layers a run gets: every layer of its backend the host has; raises if a required guarantee is missing."""
    gaps = report.missing(limits.backend, limits.required)
    if gaps:
        raise SandboxStartError(f"guarantee_unavailable:{','.join(gaps)}")
    return report.available(limits.backend)


ROOT_LAYERS = frozenset(LAYERS) - {Layer.USER_NAMESPACE}
"""Every layer but the user namespace: a root gateway's runs (ChildPlan's default)."""


class ChildPlan:
    """The prepared layers for one spawn; `preexec` runs in the child, `close` in the parent after.

    `group` and `scratch` are made by the runner (they outlive the spawn); the rest is made here.
    """

    def __init__(
        self,
        limits: Limits,
        identity: RunIdentity | None,
        read_only: tuple[Path | Pinned, ...],
        read_write: tuple[Path, ...],
        *,
        active: Set[Layer] = ROOT_LAYERS,
        group: RunCgroup | RunCgroup2 | None = None,
        scratch: ScratchSpace | None = None,
        child_scratch: NamespacedScratch | None = None,
        status_fd: int = -1,
        cwd_fd: int | None = None,
        view: WorkspaceView | None = None,
        child_view: NamespacedView | None = None,
        long_lived: bool = False,
        proxy: ProxyListener | None = None,
    ) -> None:
        """`long_lived`: a server (sandbox/server.py): no time limit for the watchdog, and a CPU rlimit of
        rlimits.SERVER_CPU_SECONDS rather than the run's timeout.
        `identity`: the run's pool uid (root), None for a rootless run (the gateway's own uid, in a user namespace).
        `scratch`: a tmpfs the gateway made (root); `child_scratch`: one the child makes in its user namespace.
        `view`: the workspace's copy a writing run works on, moved over its cwd in the scratch's mount
        namespace (backends/view.py): root, with the scratch tmpfs and a `cwd_fd`; `child_view`: the same
        made by the child in its user namespace (rootless, with a `cwd_fd`).
        `proxy`: with `limits.proxy`, the listener the child makes in its new network namespace, loopback up
        (backends/proxy_listener.py), right after entering it."""
        rootless = Layer.USER_NAMESPACE in active
        if not rootless and (identity is None or Layer.UID_DROP not in active):
            raise SandboxStartError("guarantee_unavailable:own_identity")
        if view is not None and (rootless or scratch is None or cwd_fd is None):
            raise SandboxStartError("workspace_view_unavailable")
        if child_view is not None and (not rootless or cwd_fd is None):
            raise SandboxStartError("workspace_view_unavailable")
        if limits.proxy and (proxy is None or Layer.NETWORK_NAMESPACE not in active):
            raise SandboxStartError("guarantee_unavailable:network_through_proxy")
        self._view = view
        self._child_view = child_view
        self._proxy = proxy if limits.proxy else None
        # With bubblewrap, Landlock and seccomp are not applied here: Landlock would forbid
        # bubblewrap's mounts, and the filter its namespaces; bubblewrap installs the filter.
        native = limits.backend == "native"
        self._identity = identity if Layer.UID_DROP in active else None
        self._group = group
        self._cgroup_namespace = isinstance(group, RunCgroup2) and "nsdelegate" in group.controls
        # The run's cwd by fd (a pinned workspace), not by path: Popen(cwd=path) would resolve the
        # path again, and before preexec_fn runs (sandbox/pinned.py).
        self._cwd_fd = cwd_fd
        self._namespace: userns.UserNamespace | None = None
        if rootless:
            uid, gid = (identity.uid, identity.gid) if identity is not None else (os.getuid(), os.getgid())
            self._namespace = userns.UserNamespace(uid, gid, network=limits.network)
        # Rootless, the user namespace's own unshare makes the network and IPC namespaces.
        self._unshare_network = not rootless and Layer.NETWORK_NAMESPACE in active and not limits.network
        self._unshare_ipc = not rootless and Layer.IPC_NAMESPACE in active
        # Natively the supervisors make the PID namespace (`status_fd` gets the command's status);
        # bubblewrap makes its own, and one supervisor outside it is the watchdog (pidns.py).
        self._supervisor = (
            pidns.RunSupervisor(
                timeout_s=None if long_lived else limits.timeout_s,
                status_fd=status_fd if native else -1,
                namespace=native,
            )
            if not native or Layer.PID_NAMESPACE in active
            else None
        )
        self._scratch = scratch
        self._child_scratch = child_scratch
        # bubblewrap builds its own tree of read-only binds (and writes its maps through /proc).
        # Hidden only when the run has the gateway's uid: a pool uid is kept out of the state folder by
        # its permissions already (and may not even reach it to mount over it).
        hidden = limits.hidden if identity is None else ()
        self._tree = NamespacedTree(hidden) if rootless and native else None
        cpu = rlimits.SERVER_CPU_SECONDS if long_lived else None
        self._rlimits = rlimits.ResourceLimits.from_limits(limits, cpu_seconds=cpu) if Layer.RLIMITS in active else None
        self._landlock: landlock.PreparedLandlock | None = None
        self._seccomp: seccomp.SeccompProgram | None = None
        if native and Layer.LANDLOCK in active:
            rules = landlock.LandlockRules(
                read_only=read_only,
                read_write=read_write,
                allow_tcp=limits.network,
                connect_ports=(PROXY_PORT,) if limits.proxy else (),
                read_write_fds=tuple(space.mount_fd for space in (scratch, view) if space is not None),
                late_read_write=(child_scratch is not None) + (child_view is not None),
            )
            self._landlock = landlock.prepare_landlock(rules)
        if native and Layer.SECCOMP in active:
            try:
                self._seccomp = seccomp.prepare(allow_network=limits.network, proxy=limits.proxy)
            except BaseException:
                self.close()
                raise

    def preexec(self) -> None:
        if self._group is not None:
            self._group.join()
        if self._cwd_fd is not None:
            os.fchdir(self._cwd_fd)  # before the mount namespace: unshare moves the cwd into its copy
        if self._namespace is not None:
            self._rootless_steps(self._namespace)
        else:
            self._root_steps()
        if self._landlock is not None:
            self._landlock.apply()
        if self._seccomp is not None:
            self._seccomp.apply()
        if self._supervisor is not None:
            self._supervisor.fork()  # returns only in the command's process
        if self._view is not None:
            self._view.await_go()  # the gateway filled the copy meanwhile (decision 82)

    def _root_steps(self) -> None:
        """As root: the namespaces and the tmpfs, the limits, then the drop to the pool uid."""
        if self._cgroup_namespace and isinstance(self._group, RunCgroup2):
            self._group.enter_cgroup_namespace()  # rooted at the run's group (its user namespace does this rootless)
        if self._unshare_network:
            netns.unshare_network()
            if self._proxy is not None:
                self._proxy.apply()  # as root in the new namespace: CAP_NET_ADMIN there
        if self._unshare_ipc:
            namespaces.unshare_ipc()
        if self._scratch is not None:
            self._scratch.apply()
        if self._view is not None:
            self._view.apply()  # in the scratch's namespace, over the cwd it carried: the workspace
        if self._supervisor is not None:
            self._supervisor.enter()
        if self._rlimits is not None:
            rlimits.apply(self._rlimits)
        if self._identity is None:
            raise SandboxStartError("guarantee_unavailable:own_identity")
        drop_privileges(self._identity.uid, self._identity.gid)

    def _rootless_steps(self, namespace: userns.UserNamespace) -> None:
        """In the run's own user namespace (after the drop to a pool uid, when root): the same steps, then sealed."""
        if self._identity is not None:
            drop_privileges(self._identity.uid, self._identity.gid)
        namespace.enter()
        if self._proxy is not None:
            self._proxy.apply()  # in its new network namespace, which its user namespace owns: CAP_NET_ADMIN there
        if self._tree is not None:
            self._tree.apply()  # before the scratch tmpfs, which then stays writable
        late = 0
        if self._child_scratch is not None:
            mount_fd = self._child_scratch.apply()
            if self._landlock is not None:
                self._landlock.set_late_fd(mount_fd, late)
            late += 1
        if self._child_view is not None:
            view_fd = self._child_view.apply()  # waits for the gateway to fill it, then over the cwd
            if self._landlock is not None:
                self._landlock.set_late_fd(view_fd, late)
        if self._supervisor is not None:
            self._supervisor.enter()
        if self._rlimits is not None:
            rlimits.apply(self._rlimits)  # after enter: RLIMIT_NPROC then counts this namespace's processes
        namespace.seal()

    def close(self) -> None:
        if self._landlock is not None:
            self._landlock.close()

    def __enter__(self) -> Callable[[], None]:
        return self.preexec

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
