"""The run's cgroup (v1): one memory and one process limit for the run as a whole, and a kill that misses no process (decision 22).

RLIMIT_AS is per process and RLIMIT_NPROC per uid: N processes may each hold the memory limit.
A memory cgroup holds the run's processes together to `memory_limit_mb` (swap included, and
the scratch tmpfs's pages too, which are charged to their writer); the pids cgroup to
`max_processes`. The freezer cgroup is the containment unit: freeze, SIGKILL every member,
thaw, and wait until it is empty. A process cannot leave its cgroup (every `cgroup.procs` and
`tasks` is root's), so membership is complete by construction, double-forked daemons included.

The child joins its three groups first thing in `preexec_fn`, as root, by writing "0" into
the groups' `tasks` files the gateway opened: that moves the calling thread, and a child
between fork and exec has exactly one thread, so it moves the whole process. Through
`cgroup.procs` the same move takes the kernel's global threadgroup lock for writing, which
waits for an RCU grace period (7-13 ms a spawn measured here); a thread moving itself
through `tasks` skips that lock (measured: no cost over the spawn). Creating, limiting,
emptying and removing the groups costs about a millisecond.

Groups live under the gateway's own cgroup in each hierarchy, in `mcp-write-gateway/run-<uid>`:
the uid is the run's own (identity.UidPool holds a host-wide lock on it), so no two runs share
a group, and a group left by a crashed gateway is emptied and reused by the next run of its uid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

CONTROLLERS = ("memory", "pids", "freezer")
GROUP_FOLDER = "mcp-write-gateway"
_FREEZE_WAIT_S = 1.0
_EMPTY_WAIT_S = 5.0


@dataclass(frozen=True, slots=True)
class CgroupRoots:
    """The gateway's own cgroup folder in each v1 hierarchy the run needs."""

    folders: Mapping[str, Path]

    def group(self, controller: str, name: str) -> Path:
        return self.folders[controller] / GROUP_FOLDER / name


@dataclass(frozen=True, slots=True)
class CgroupUsage:
    peak_memory_bytes: int
    oom_kills: int
    """Processes the kernel's OOM killer killed because the group hit its memory limit."""
    forks_refused: int
    """fork/clone calls refused because the group was at its process limit."""


def parse_mountinfo(text: str) -> dict[str, tuple[Path, str]]:
    """controller -> (mount point, root of the mount inside its hierarchy), for cgroup v1 mounts."""
    mounts: dict[str, tuple[Path, str]] = {}
    for line in text.splitlines():
        fields, _, tail = line.partition(" - ")
        parts, tail_parts = fields.split(), tail.split()
        if len(parts) < 5 or len(tail_parts) < 3 or tail_parts[0] != "cgroup":
            continue
        for option in tail_parts[2].split(","):
            if option in CONTROLLERS:
                mounts.setdefault(option, (Path(parts[4]), parts[3]))
    return mounts


def parse_self_cgroup(text: str) -> dict[str, str]:
    """controller -> this process's path in that v1 hierarchy, from /proc/self/cgroup."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        _, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        for controller in controllers.split(","):
            if controller in CONTROLLERS:
                paths[controller] = path
    return paths


def own_folders(mountinfo: str, self_cgroup: str) -> CgroupRoots | None:
    """Where this process's cgroups are, for every controller the run needs; None if one is missing."""
    mounts, paths = parse_mountinfo(mountinfo), parse_self_cgroup(self_cgroup)
    folders: dict[str, Path] = {}
    for controller in CONTROLLERS:
        if controller not in mounts or controller not in paths:
            return None
        mount_point, mount_root = mounts[controller]
        path = paths[controller]
        if not path.startswith(mount_root):
            return None  # our group is outside what this mount shows
        relative = path[len(mount_root) :].strip("/")
        folders[controller] = mount_point / relative if relative else mount_point
    return CgroupRoots(MappingProxyType(folders))


def discover() -> CgroupRoots | None:
    try:
        roots = own_folders(Path("/proc/self/mountinfo").read_text(), Path("/proc/self/cgroup").read_text())
    except OSError:
        return None
    if roots is None or not all(os.access(folder, os.W_OK) for folder in roots.folders.values()):
        return None
    return roots


class RunCgroup:
    """One run's memory, pids and freezer groups: created and limited in the gateway, joined by the child."""

    __slots__ = ("_join_fds", "_paths", "_zero")

    def __init__(self, roots: CgroupRoots, name: str, memory_bytes: int, max_processes: int) -> None:
        self._paths = {controller: roots.group(controller, name) for controller in CONTROLLERS}
        self._join_fds: tuple[int, ...] = ()
        self._zero = b"0"
        # A group a crashed gateway left behind: empty it and start afresh, so limits and counters are this run's.
        self.kill_all()
        for path in self._paths.values():
            if path.exists():
                path.rmdir()
        for path in self._paths.values():
            path.mkdir(parents=True)
        memory = self._paths["memory"]
        _write(memory / "memory.limit_in_bytes", str(memory_bytes))
        swap_limit = memory / "memory.memsw.limit_in_bytes"
        if swap_limit.exists():  # only with swap accounting; must be written after limit_in_bytes
            _write(swap_limit, str(memory_bytes))
        _write(self._paths["pids"] / "pids.max", str(max_processes))
        fds = []
        try:
            for path in self._paths.values():
                fds.append(os.open(path / "tasks", os.O_WRONLY | os.O_CLOEXEC))
        except OSError:
            for fd in fds:
                os.close(fd)
            raise
        self._join_fds = tuple(fds)

    def join(self) -> None:
        """In the child (one thread, between fork and exec), as root, first: move it into every group."""
        zero = self._zero
        for fd in self._join_fds:
            os.write(fd, zero)

    def members(self) -> list[int]:
        try:
            text = (self._paths["freezer"] / "cgroup.procs").read_text()
        except FileNotFoundError:
            return []
        return [int(pid) for pid in text.split()]

    def kill_all(self) -> list[int]:
        """Freeze the group, SIGKILL every member, thaw, wait until it is empty; return the pids killed.

        Frozen, no member can fork or run, so the list read is the whole group; the kill is
        delivered when the group thaws, before any of them returns to user space.
        """
        members = self.members()
        if not members:
            return []
        state = self._paths["freezer"] / "freezer.state"
        _write(state, "FROZEN")
        deadline = time.monotonic() + _FREEZE_WAIT_S
        while state.read_text().strip() != "FROZEN" and time.monotonic() < deadline:
            time.sleep(0.001)  # FREEZING: a member is in the kernel; it stops at its next safe point
        killed: list[int] = []
        try:
            for _ in range(3):  # a member that forked while the freeze was settling is listed next time
                members = self.members()
                for pid in members:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                        killed.append(pid)
                if state.read_text().strip() == "FROZEN":
                    break
        finally:
            _write(state, "THAWED")
        deadline = time.monotonic() + _EMPTY_WAIT_S
        pause = 0.0005
        while self.members() and time.monotonic() < deadline:
            for pid in self.members():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
        return sorted(set(killed))

    def usage(self) -> CgroupUsage:
        """What the group saw over its life, which is this run's (a reused group is made afresh)."""
        memory, pids = self._paths["memory"], self._paths["pids"]
        return CgroupUsage(
            peak_memory_bytes=int((memory / "memory.max_usage_in_bytes").read_text()),
            oom_kills=_keyed(memory / "memory.oom_control", "oom_kill"),
            forks_refused=_keyed(pids / "pids.events", "max"),
        )

    def close(self) -> None:
        """Close the join fds (once the child is spawned) and remove the groups if they are empty."""
        for fd in self._join_fds:
            os.close(fd)
        self._join_fds = ()
        if self.members():
            return  # kept: the next run of this uid empties it (kill_all in __init__)
        for path in self._paths.values():
            with contextlib.suppress(OSError):
                path.rmdir()


def _keyed(path: Path, key: str) -> int:
    for line in path.read_text().splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return 0


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)
