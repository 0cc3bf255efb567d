"""The run's cgroup (v2): memory, swap and process totals for the run as a whole, and a kill that misses no process (decision 58).

The v2 counterpart of cgroup.py (v1, which stays), usable as root and by an ordinary user who
owns a delegated subtree (systemd's `Delegate=yes`, `systemd-run --user --scope -p Delegate=yes`).
One hierarchy holds every controller, so a run is one group: `memory.max` (its processes
together, the scratch tmpfs's pages included), `memory.swap.max` = 0 (swap cannot extend it),
`pids.max`, and `cgroup.kill` (5.14) or `cgroup.freeze` (5.2) for the whole-run kill.

Layout, under G, the group the gateway started in (the `0::` line of /proc/self/cgroup):

    G/gateway/                 the gateway itself, moved here once by `discover_v2`
    G/mcp-write-gateway/       controllers enabled for its children (cgroup.subtree_control)
    G/mcp-write-gateway/<run>  one run: limits, the child joins it, killed and removed at its end

A group with processes of its own cannot give controllers to its children (the kernel's
no-internal-processes rule), so the gateway leaves G for the leaf `gateway`, and G keeps only
groups. The runs share one parent so that none of their names can meet anything else in G, and
an operator can cap all runs together with that parent's `memory.max`. At the hierarchy's real
root (a root gateway outside systemd, this host's unified hierarchy) the rule does not apply and
the gateway stays where it is. A delegated user owns G's `cgroup.procs` and
`cgroup.subtree_control` (systemd chowns them) and every group it makes below; G's own limits
stay root's.

The child joins its group first thing in `preexec_fn` by writing "0" into the group's
`cgroup.procs`, opened by the gateway (the kernel checks the opener's credentials, so the
write needs none of the child's). v2 has no per-thread `tasks` file: the move takes the
threadgroup lock for writing, which waits for an RCU grace period: +6-8 ms p50, up to +15 ms p90
a spawn (bench/cgroup_join.py, kernel 6.18, spawns 50 ms apart; as much as v1's `cgroup.procs`,
while v1's `tasks` costs nothing). `clone3(CLONE_INTO_CGROUP)` avoids the move (no cost over a
fork) but needs a spawn without `subprocess`.

When the gateway runs as its run's uid (rootless), the run owns its group's files like the
gateway does: it could raise its own `memory.max` or move itself out to G. Two things close
that: the run reaches no cgroup filesystem (Landlock grants nothing under it; a mount namespace
hides it), and, on a mount with `nsdelegate` (systemd mounts it so; controls has "nsdelegate"),
`enter_cgroup_namespace` after the join: the kernel then refuses the run any write to its
group's limits (EPERM) and any move out of it (ENOENT), whatever its uid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from sandbox.backends.cgroup import CgroupUsage
from sandbox.backends.namespaces import unshare

CLONE_NEWCGROUP = 0x02000000
GATEWAY_LEAF = "gateway"
RUNS_FOLDER = "mcp-write-gateway"
CONTROLLERS = ("memory", "pids")
_FREEZE_WAIT_S = 1.0
_EMPTY_WAIT_S = 5.0
_SCOPE = "systemd-run --user --scope -p Delegate=yes mcp-gateway serve ..."


@dataclass(frozen=True, slots=True)
class V2Root:
    """The folder runs are made in, and what a run group there enforces.

    `controls` names what holds: "memory" (memory.max), "swap" (memory.swap.max), "pids"
    (pids.max), "kill" (cgroup.kill), "freeze" (cgroup.freeze); a run's whole-run kill is
    complete with either of those two. "nsdelegate": the mount makes a cgroup namespace a
    delegation boundary (`enter_cgroup_namespace`).
    """

    folder: Path
    controls: frozenset[str]


@dataclass(frozen=True, slots=True)
class V2Availability:
    """Where this process may make run groups, or why not: for the runner and `mcp-gateway doctor`.

    `reason` and `fix` are sentences for a person; both are empty when everything holds. A
    `root` with a reason is usable but partial (e.g. no memory controller: kill only).
    """

    root: V2Root | None
    reason: str = ""
    fix: str = ""

    @property
    def controls(self) -> frozenset[str]:
        return frozenset() if self.root is None else self.root.controls


@dataclass(frozen=True, slots=True)
class V2Facts:
    """What the kernel shows this process about its cgroup v2 group; read by `read_v2_facts`."""

    mount: Path | None
    """The cgroup2 mount point (/sys/fs/cgroup, or /sys/fs/cgroup/unified on hybrid hosts)."""
    own: str | None
    """This process's group, as /proc/self/cgroup's `0::` line names it."""
    folder: Path | None
    """That group's folder under the mount; None when the mount does not show it."""
    euid: int
    owner: int = 0
    """The uid owning the group's cgroup.procs (the delegatee, when delegated)."""
    writable: bool = False
    """The folder, its cgroup.procs and cgroup.subtree_control are writable by this process."""
    real_root: bool = False
    """The group is the hierarchy's real root (exempt from the no-internal-processes rule)."""
    controllers: frozenset[str] = frozenset()
    """The group's cgroup.controllers: those it may enable for its children."""
    held_by_v1: frozenset[str] = frozenset()
    others: tuple[int, ...] = ()
    """Processes in the group other than this one."""
    nsdelegate: bool = False
    """The mount has `nsdelegate`: a cgroup namespace is a delegation boundary."""


def parse_v2_mount(mountinfo: str) -> tuple[Path, str] | None:
    """(mount point, root of the mount inside the hierarchy) of the first cgroup2 mount."""
    for line in mountinfo.splitlines():
        fields, _, tail = line.partition(" - ")
        parts, tail_parts = fields.split(), tail.split()
        if len(parts) >= 5 and tail_parts[:1] == ["cgroup2"]:
            return Path(parts[4]), parts[3]
    return None


def parse_v2_options(mountinfo: str) -> frozenset[str]:
    """The first cgroup2 mount's options, per mount and of the hierarchy (`ro`, `nsdelegate`...)."""
    for line in mountinfo.splitlines():
        fields, _, tail = line.partition(" - ")
        parts, tail_parts = fields.split(), tail.split()
        if len(parts) >= 6 and len(tail_parts) >= 3 and tail_parts[0] == "cgroup2":
            return frozenset({*parts[5].split(","), *tail_parts[2].split(",")})
    return frozenset()


def parse_v2_path(self_cgroup: str) -> str | None:
    """This process's path in the v2 hierarchy: the `0::` line of /proc/self/cgroup."""
    for line in self_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:]
    return None


def parse_v1_controllers(mountinfo: str) -> frozenset[str]:
    """The controllers cgroup v1 mounts hold (a controller is in one hierarchy at a time)."""
    held: set[str] = set()
    for line in mountinfo.splitlines():
        tail = line.partition(" - ")[2].split()
        if len(tail) >= 3 and tail[0] == "cgroup":
            held.update(option for option in tail[2].split(",") if option in CONTROLLERS)
    return frozenset(held)


def locate_v2(mountinfo: str, self_cgroup: str) -> tuple[Path | None, str | None, Path | None]:
    """(mount point, own group, own folder) from the two texts; a None where the kernel shows none."""
    mount, own = parse_v2_mount(mountinfo), parse_v2_path(self_cgroup)
    if mount is None or own is None:
        return (None if mount is None else mount[0]), own, None
    mount_point, mount_root = mount
    root = mount_root.rstrip("/")
    if own != root and not own.startswith(root + "/"):
        return mount_point, own, None  # our group is outside what this mount shows (or "/.." beyond a namespace)
    relative = own[len(root) :].strip("/")
    return mount_point, own, mount_point / relative if relative else mount_point


def judge_v2(facts: V2Facts) -> tuple[bool, frozenset[str], str, str]:
    """(usable, controllers the runs get, reason, fix): the decision on `facts`, as a pure function."""
    if facts.mount is None:
        return False, frozenset(), "no cgroup2 mount in /proc/self/mountinfo", _boot_v2()
    if facts.own is None:
        return (
            False,
            frozenset(),
            "this process is in no cgroup v2 group (/proc/self/cgroup has no `0::` line)",
            _boot_v2(),
        )
    if facts.folder is None:
        return (
            False,
            frozenset(),
            f"the gateway's cgroup {facts.own} is outside what the cgroup2 mount at {facts.mount} shows",
            "run the gateway in its own cgroup namespace (`docker run --cgroupns=private`) or mount the hierarchy's root",
        )
    if not facts.writable:
        if facts.euid != 0:
            return (
                False,
                frozenset(),
                f"the gateway's cgroup {facts.own} is not delegated to uid {facts.euid} (its cgroup.procs belongs to uid {facts.owner})",
                f"start the gateway in a delegated scope: `{_SCOPE}`, or in a systemd service with Delegate=yes",
            )
        return (
            False,
            frozenset(),
            f"the cgroup2 mount at {facts.mount} is read-only here",
            "give the gateway a writable cgroup (a container: `--cgroupns=private` and a read-write /sys/fs/cgroup)",
        )
    usable = frozenset(name for name in CONTROLLERS if name in facts.controllers)
    reasons: list[str] = []
    fixes: list[str] = []
    held = sorted(name for name in CONTROLLERS if name not in usable and name in facts.held_by_v1)
    if held:
        reasons.append(f"cgroup v2 is mounted at {facts.mount} but the {_and(held)} controllers are held by cgroup v1")
        fixes.append(
            "boot with systemd.unified_cgroup_hierarchy=1 (or cgroup_no_v1=" + ",".join(held) + ") to give them to v2; "
            "meanwhile the v1 backend enforces them as root"
        )
    withheld = sorted(name for name in CONTROLLERS if name not in usable and name not in facts.held_by_v1)
    if withheld:
        reasons.append(f"the {_and(withheld)} controllers are not enabled for the gateway's cgroup {facts.own}")
        fixes.append(
            "systemd gives them with Delegate=yes; otherwise, as root: "
            f"`echo {' '.join('+' + name for name in withheld)} > {facts.folder.parent}/cgroup.subtree_control`"
        )
    if usable and facts.others and not facts.real_root:
        listed = ", ".join(str(pid) for pid in facts.others[:5])
        reasons.append(
            f"the gateway's cgroup {facts.own} also holds other processes ({listed}): a group with processes "
            "of its own cannot give controllers to its children"
        )
        fixes.append(f"start the gateway alone in its own scope: `{_SCOPE}`")
        usable = frozenset()
    if facts.euid != 0 and not facts.nsdelegate:
        reasons.append(
            f"the cgroup2 mount at {facts.mount} has no nsdelegate: a run of uid {facts.euid} that reached the "
            "cgroup filesystem could lift its own limits or leave its group"
        )
        fixes.append(f"as root, `mount -o remount,nsdelegate {facts.mount}` (systemd mounts it so)")
    return True, usable, "; ".join(reasons), "; ".join(fixes)


def read_v2_facts(mountinfo: str, self_cgroup: str) -> V2Facts:
    mount, own, folder = locate_v2(mountinfo, self_cgroup)
    facts = V2Facts(mount=mount, own=own, folder=folder, euid=os.geteuid(), held_by_v1=parse_v1_controllers(mountinfo))
    if folder is None:
        return facts
    if own is not None and folder.name == GATEWAY_LEAF and (folder.parent / RUNS_FOLDER).is_dir():
        folder = folder.parent  # discovered before: the gateway sits in its leaf
        own = own.rsplit("/", 1)[0] or "/"
    real_root = not (folder / "cgroup.type").exists()  # the root has none (nor cgroup.kill, cgroup.freeze)
    files = (folder, folder / "cgroup.procs", folder / "cgroup.subtree_control")
    procs = [int(pid) for pid in _read(folder / "cgroup.procs").split()]
    options = parse_v2_options(mountinfo)
    return V2Facts(
        mount=mount,
        own=own,
        folder=folder,
        euid=facts.euid,
        owner=os.stat(folder / "cgroup.procs").st_uid,
        writable=all(os.access(path, os.W_OK) for path in files) and "ro" not in options,
        real_root=real_root,
        controllers=frozenset(_read(folder / "cgroup.controllers").split()),
        held_by_v1=facts.held_by_v1,
        others=tuple(pid for pid in procs if pid != os.getpid()),
        nsdelegate="nsdelegate" in options,
    )


def discover_v2() -> V2Availability:
    """Where this process may make run groups, set up on first use: the gateway moves into its leaf.

    The move takes every thread of the gateway along; a second call finds the layout and moves nothing.
    """
    try:
        mountinfo, self_cgroup = Path("/proc/self/mountinfo").read_text(), Path("/proc/self/cgroup").read_text()
        facts = read_v2_facts(mountinfo, self_cgroup)
    except OSError as exc:
        return V2Availability(None, f"cannot read this process's cgroup ({exc.strerror})", _boot_v2())
    usable, controllers, reason, fix = judge_v2(facts)
    if not usable or facts.folder is None:
        return V2Availability(None, reason, fix)
    try:
        root = _settle(facts.folder, controllers, move=not facts.real_root, nsdelegate=facts.nsdelegate)
    except OSError as exc:
        return V2Availability(
            None,
            f"cannot set up run groups under {facts.folder}: {exc.strerror} ({exc.filename})",
            f"start the gateway in a delegated scope: `{_SCOPE}`",
        )
    missing = [name for name in ("kill", "freeze") if name not in root.controls]
    if len(missing) == 2:
        reason = "; ".join(
            filter(None, (reason, f"kernel {os.uname().release} has neither cgroup.kill nor cgroup.freeze"))
        )
        fix = "; ".join(filter(None, (fix, "upgrade to Linux 5.14 or later for a complete whole-run kill")))
    return V2Availability(root, reason, fix)


def _settle(folder: Path, controllers: frozenset[str], *, move: bool, nsdelegate: bool) -> V2Root:
    """Make the layout (module docstring) and return where runs go; each step is skipped when done."""
    runs = folder / RUNS_FOLDER
    if move:
        leaf = folder / GATEWAY_LEAF
        leaf.mkdir(exist_ok=True)
        if str(os.getpid()) in _read(folder / "cgroup.procs").split():
            _write(leaf / "cgroup.procs", "0")  # the whole process, every thread
    runs.mkdir(exist_ok=True)
    for level in (folder, runs):
        enabled = set(_read(level / "cgroup.subtree_control").split())
        wanted = [name for name in CONTROLLERS if name in controllers and name not in enabled]
        if wanted:
            _write(level / "cgroup.subtree_control", " ".join("+" + name for name in wanted))
    controls = set(_read(runs / "cgroup.subtree_control").split()) & set(CONTROLLERS)
    if "memory" in controls and (runs / "memory.swap.max").exists():
        controls.add("swap")
    controls.update(name for name in ("kill", "freeze") if (runs / f"cgroup.{name}").exists())
    if nsdelegate:
        controls.add("nsdelegate")
    return V2Root(runs, frozenset(controls))


class RunCgroup2:
    """One run's group: created and limited in the gateway, joined by the child (same interface as RunCgroup)."""

    __slots__ = ("_join_fd", "_path", "controls")

    def __init__(self, root: V2Root, name: str, memory_bytes: int, max_processes: int) -> None:
        self._path = root.folder / name
        self._join_fd = -1
        # A group a crashed gateway left behind: empty it and start afresh, so limits and counters are this run's.
        self.controls = root.controls
        self.kill_all()
        _remove_tree(self._path)
        self._path.mkdir()
        if "memory" in self.controls:
            _write(self._path / "memory.max", str(memory_bytes))
        if "swap" in self.controls:
            _write(self._path / "memory.swap.max", "0")
        if "pids" in self.controls:
            _write(self._path / "pids.max", str(max_processes))
        self._join_fd = os.open(self._path / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)

    @property
    def path(self) -> Path:
        """The group's folder (for a spawn by `clone3(CLONE_INTO_CGROUP)`, which takes its fd)."""
        return self._path

    def join(self) -> None:
        """In the child (between fork and exec), first: move it into the group; one write, no allocation."""
        os.write(self._join_fd, b"0")

    def enter_cgroup_namespace(self) -> None:
        """In the child, right after `join` (CAP_SYS_ADMIN: root, or in its user namespace): a cgroup
        namespace rooted at the run's group. With "nsdelegate" in `controls`, the kernel refuses the
        run writes to its group's limits and any move out of it, even when the run owns the files."""
        unshare(CLONE_NEWCGROUP)

    def members(self) -> list[int]:
        """The group's processes, those of any group below it included (a rootless run owns its group)."""
        pids: list[int] = []
        for folder, _, _ in os.walk(self._path):
            with contextlib.suppress(FileNotFoundError):
                pids.extend(int(pid) for pid in _read(Path(folder) / "cgroup.procs").split())
        return pids

    def kill_all(self) -> list[int]:
        """Kill every member, wait until the group is empty; return the pids killed.

        `cgroup.kill` kills the group and everything below it, a fork in flight included. Without
        it: freeze (no member can fork or run, so the list read is the whole group), SIGKILL
        each, thaw. Without either, SIGKILL each until none is left (pids.max bounds a fork race).
        """
        members = self.members()
        if not members:
            return []
        killed = set(members)
        by_kernel = "kill" in self.controls
        if by_kernel:
            _write(self._path / "cgroup.kill", "1")
        elif "freeze" in self.controls:
            killed.update(self._kill_frozen())
        deadline = time.monotonic() + _EMPTY_WAIT_S
        pause = 0.0005
        while members and time.monotonic() < deadline:
            if not by_kernel:  # cgroup.kill reached them all; signalling by pid could meet a reused one
                for pid in members:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            killed.update(members)
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
            members = self.members()
        return sorted(killed)

    def _kill_frozen(self) -> list[int]:
        freeze = self._path / "cgroup.freeze"
        _write(freeze, "1")
        deadline = time.monotonic() + _FREEZE_WAIT_S
        while _keyed(self._path / "cgroup.events", "frozen") != 1 and time.monotonic() < deadline:
            time.sleep(0.001)  # a member in the kernel stops at its next safe point
        killed: list[int] = []
        try:
            for _ in range(3):  # a member that forked while the freeze was settling is listed next time
                for pid in self.members():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                        killed.append(pid)
                if _keyed(self._path / "cgroup.events", "frozen") == 1:
                    break
        finally:
            _write(freeze, "0")
        return killed

    def usage(self) -> CgroupUsage:
        """What the group saw over its life, which is this run's; 0 for what `controls` lacks.

        Without `memory.peak` (before 5.19) the peak is `memory.current` when read: a lower bound.
        """
        peak = 0
        if "memory" in self.controls:
            peak_file = self._path / "memory.peak"
            peak = int(_read(peak_file if peak_file.exists() else self._path / "memory.current"))
        return CgroupUsage(
            peak_memory_bytes=peak,
            oom_kills=_keyed(self._path / "memory.events", "oom_kill") if "memory" in self.controls else 0,
            forks_refused=_keyed(self._path / "pids.events", "max") if "pids" in self.controls else 0,
        )

    def close(self) -> None:
        """Close the join fd (once the child is spawned) and remove the group if it is empty."""
        if self._join_fd >= 0:
            os.close(self._join_fd)
            self._join_fd = -1
        if self.members():
            return  # kept: the next run of this name empties it (kill_all in __init__)
        with contextlib.suppress(OSError):
            _remove_tree(self._path)


def _remove_tree(path: Path) -> None:
    """rmdir the group and any below it, deepest first (only empty groups can go)."""
    if not path.exists():
        return
    for folder, _, _ in sorted(os.walk(path), key=lambda entry: -len(entry[0])):
        os.rmdir(folder)


def _boot_v2() -> str:
    return (
        "boot with systemd.unified_cgroup_hierarchy=1 (a cgroup-v2-only host); as root the v1 backend serves meanwhile"
    )


def _and(names: list[str]) -> str:
    return " and ".join(names)


def _keyed(path: Path, key: str) -> int:
    for line in _read(path).splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return 0


def _read(path: Path) -> str:
    return path.read_text()


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)
