"""Which isolation layers a run gets, and the child-side plan that applies them in order (issue 3).

Everything that allocates (Landlock rule fds, the seccomp program, the tmpfs, the cgroup
files, ctypes pointers) is prepared in the parent; the child's `preexec_fn` only makes system
calls, in the one order that works as root: join the cgroup (first, so that everything after
is counted) -> `fchdir` to the workspace's pinned fd (sandbox/pinned.py; before the mount
namespace, which takes the cwd along) -> network and IPC namespaces -> mount namespace with
the scratch tmpfs -> PID namespace (all four need root) -> rlimits -> drop to the run's uid ->
Landlock -> seccomp (it denies unshare/mount, and Landlock's calls must still pass) -> the
fork into the supervisors (sandbox/backends/pidns.py), last, so that they are as confined as
the command.

With the bubblewrap backend the child skips Landlock and seccomp, and its supervisor's child
execs bubblewrap (sandbox/backends/bubblewrap.py), which adds a PID namespace and a minimal
mount tree in place of Landlock, and installs the same seccomp program just before the command.

A layer the host lacks is left out of a run only when the policy does not require it
(`sandbox.required_layers`, every layer of the backend by default); `plan_layers` decides,
and the runner refuses to start otherwise. `uid_drop` can never be left out (without it a
run would be root), nor, with bubblewrap, `mount_tree`.

`preexec_fn` is a deliberate choice (docs/decisions.md): it is the cheapest way to apply the
layers (+1-2 ms a spawn against +15-30 ms for a second Python interpreter), and the steps it
runs take no Python-level lock, import nothing and allocate almost nothing after fork.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Set
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from sandbox.backends import cgroup, landlock, namespaces, netns, pidns, rlimits, seccomp
from sandbox.backends.bubblewrap import bubblewrap_available
from sandbox.backends.cgroup import RunCgroup
from sandbox.backends.identity import RunIdentity, drop_privileges
from sandbox.backends.scratch import ScratchSpace, scratch_available
from sandbox.errors import SandboxStartError
from sandbox.limits import BACKEND_LAYERS, LAYERS, Limits
from sandbox.pinned import Pinned


@dataclass(frozen=True, slots=True)
class LayerReport:
    """What this kernel and process can enforce, for start-up logs and `policy check`."""

    uid_drop: bool
    cgroup: bool
    """cgroup v1 memory, pids and freezer groups the gateway may create."""
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

    def available(self) -> frozenset[str]:
        return frozenset(name for name in LAYERS if getattr(self, name))

    def missing(self, required: Set[str] = frozenset(LAYERS)) -> list[str]:
        """The required layers this host lacks, in LAYERS order."""
        return [name for name in LAYERS if name in required and not getattr(self, name)]


def probe_layers() -> LayerReport:
    root = os.geteuid() == 0
    bubblewrap = root and bubblewrap_available()
    return LayerReport(
        uid_drop=root,
        cgroup=root and cgroup.discover() is not None,
        network_namespace=root and netns.network_namespace_available(),
        scratch_tmpfs=root and scratch_available(),
        rlimits=True,
        landlock=landlock.abi_version(),
        seccomp=platform.system() == "Linux" and platform.machine() == "x86_64",
        mount_tree=bubblewrap,
        pid_namespace=root and pidns.pid_namespace_available(),
        ipc_namespace=root and namespaces.ipc_namespace_available(),
    )


def plan_layers(report: LayerReport, limits: Limits) -> frozenset[str]:
    """The layers a run gets: every layer of its backend the host has; raises if a required one is missing."""
    missing = report.missing(limits.required)
    if missing:
        raise SandboxStartError(f"layer_unavailable:{','.join(missing)}")
    return report.available() & frozenset(BACKEND_LAYERS[limits.backend])


class ChildPlan:
    """The prepared layers for one spawn; `preexec` runs in the child, `close` in the parent after.

    `group` and `scratch` are made by the runner (they outlive the spawn); the rest is made here.
    """

    def __init__(
        self,
        limits: Limits,
        identity: RunIdentity,
        read_only: tuple[Path | Pinned, ...],
        read_write: tuple[Path, ...],
        *,
        active: Set[str] = frozenset(LAYERS),
        group: RunCgroup | None = None,
        scratch: ScratchSpace | None = None,
        status_fd: int = -1,
        cwd_fd: int | None = None,
    ) -> None:
        if "uid_drop" not in active:
            raise SandboxStartError("layer_unavailable:uid_drop")
        # With bubblewrap, Landlock and seccomp are not applied here: Landlock would forbid
        # bubblewrap's mounts, and the filter its namespaces; bubblewrap installs the filter.
        native = limits.backend == "native"
        self._identity = identity
        self._group = group
        # The run's cwd by fd (a pinned workspace), not by path: Popen(cwd=path) would resolve the
        # path again, and before preexec_fn runs (sandbox/pinned.py).
        self._cwd_fd = cwd_fd
        self._unshare_network = "network_namespace" in active and not limits.network
        self._unshare_ipc = "ipc_namespace" in active
        # Natively the supervisors make the PID namespace (`status_fd` gets the command's status);
        # bubblewrap makes its own, and one supervisor outside it is the watchdog (pidns.py).
        self._supervisor = (
            pidns.RunSupervisor(timeout_s=limits.timeout_s, status_fd=status_fd if native else -1, namespace=native)
            if not native or "pid_namespace" in active
            else None
        )
        self._scratch = scratch
        self._rlimits = rlimits.ResourceLimits.from_limits(limits) if "rlimits" in active else None
        self._landlock: landlock.PreparedLandlock | None = None
        self._seccomp: seccomp.SeccompProgram | None = None
        if native and "landlock" in active:
            rules = landlock.LandlockRules(
                read_only=read_only,
                read_write=read_write,
                allow_tcp=limits.network,
                read_write_fds=() if scratch is None else (scratch.mount_fd,),
            )
            self._landlock = landlock.prepare_landlock(rules)
        if native and "seccomp" in active:
            try:
                self._seccomp = seccomp.prepare(allow_network=limits.network)
            except BaseException:
                self.close()
                raise

    def preexec(self) -> None:
        if self._group is not None:
            self._group.join()
        if self._cwd_fd is not None:
            os.fchdir(self._cwd_fd)  # before the mount namespace: unshare moves the cwd into its copy
        if self._unshare_network:
            netns.unshare_network()
        if self._unshare_ipc:
            namespaces.unshare_ipc()
        if self._scratch is not None:
            self._scratch.apply()
        if self._supervisor is not None:
            self._supervisor.enter()
        if self._rlimits is not None:
            rlimits.apply(self._rlimits)
        drop_privileges(self._identity.uid, self._identity.gid)
        if self._landlock is not None:
            self._landlock.apply()
        if self._seccomp is not None:
            self._seccomp.apply()
        if self._supervisor is not None:
            self._supervisor.fork()  # returns only in the command's process

    def close(self) -> None:
        if self._landlock is not None:
            self._landlock.close()

    def __enter__(self) -> Callable[[], None]:
        return self.preexec

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
