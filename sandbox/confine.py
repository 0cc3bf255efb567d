"""Which isolation layers a run gets, and the child-side plan that applies them in order (issue 3).

Everything that allocates (Landlock rule fds, the seccomp program, the tmpfs, the cgroup
files, ctypes pointers) is prepared in the parent; the child's `preexec_fn` only makes system
calls, in the one order that works as root: join the cgroup (first, so that everything after
is counted) -> network namespace -> mount namespace with the scratch tmpfs (both need root)
-> rlimits -> drop to the run's uid -> Landlock -> seccomp (last: it denies unshare/mount,
and Landlock's calls must still pass).

With the bubblewrap backend the child stops after the uid drop and execs bubblewrap
(sandbox/backends/bubblewrap.py), which adds a PID namespace and a minimal mount tree in
place of Landlock, and installs the same seccomp program just before the command.

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

from sandbox.backends import cgroup, landlock, netns, rlimits, seccomp
from sandbox.backends.bubblewrap import bubblewrap_available
from sandbox.backends.cgroup import RunCgroup
from sandbox.backends.identity import RunIdentity, drop_privileges
from sandbox.backends.scratch import ScratchSpace, scratch_available
from sandbox.errors import SandboxStartError
from sandbox.limits import BACKEND_LAYERS, LAYERS, Limits


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
    """The same probe: bubblewrap's PID namespace (bubblewrap backend)."""

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
        pid_namespace=bubblewrap,
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
        read_only: tuple[Path, ...],
        read_write: tuple[Path, ...],
        *,
        active: Set[str] = frozenset(LAYERS),
        group: RunCgroup | None = None,
        scratch: ScratchSpace | None = None,
    ) -> None:
        if "uid_drop" not in active:
            raise SandboxStartError("layer_unavailable:uid_drop")
        # With bubblewrap, Landlock and seccomp are not applied here: Landlock would forbid
        # bubblewrap's mounts, and the filter its namespaces; bubblewrap installs the filter.
        native = limits.backend == "native"
        self._identity = identity
        self._group = group
        self._unshare_network = "network_namespace" in active and not limits.network
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
        if self._unshare_network:
            netns.unshare_network()
        if self._scratch is not None:
            self._scratch.apply()
        if self._rlimits is not None:
            rlimits.apply(self._rlimits)
        drop_privileges(self._identity.uid, self._identity.gid)
        if self._landlock is not None:
            self._landlock.apply()
        if self._seccomp is not None:
            self._seccomp.apply()

    def close(self) -> None:
        if self._landlock is not None:
            self._landlock.close()

    def __enter__(self) -> Callable[[], None]:
        return self.preexec

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
