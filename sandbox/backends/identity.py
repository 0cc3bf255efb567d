"""Unprivileged identity: one pool uid per run and the preexec step that drops to it (decision 18).

Running as root breaks RLIMIT_NPROC, lets the child raise its own rlimits, and lets it read
`/proc/<gateway>/environ` and every root-only file. Each run therefore gets a uid (and a gid of
the same number) of its own, taken from a pool no account uses, so that DAC, NPROC and the
containment sweep (`containment.sweep`) all have one owner to work with.

Order inside the child (`preexec_fn`) is fixed:

1. steps that need root: `netns.unshare_network()`, mounts, joining a cgroup;
2. `rlimits.apply()` (lowering works as anyone; doing it first keeps NPROC in force from the
   first instruction the uid runs);
3. `drop_privileges()`: after it the child holds no capability, so nothing above can follow;
4. Landlock and seccomp: both need `no_new_privs` (set here), and a seccomp filter that denies
   `setuid`/`setgroups` would otherwise block this very step.

Do not use `Popen(user=..., group=..., extra_groups=...)`: CPython applies those before
`preexec_fn`, so step 1 would then run without the capability it needs.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import grp
import os
import pwd
import tempfile
import threading
from collections.abc import Callable, Iterator, Set
from dataclasses import dataclass
from pathlib import Path

from sandbox.errors import SandboxStartError

DEFAULT_POOL = range(61000, 62000)
MIN_RUN_UID = 1000  # below this live system accounts; never run as, never sweep
_PR_SET_NO_NEW_PRIVS = 38
_PR_GET_NO_NEW_PRIVS = 39

# Resolved in the parent at import so the child only makes the call (preexec_fn must not load libraries).
_prctl = ctypes.CDLL(None, use_errno=True).prctl
_prctl.restype = ctypes.c_int


@dataclass(frozen=True, slots=True)
class RunIdentity:
    uid: int
    gid: int

    def __post_init__(self) -> None:
        if self.uid < MIN_RUN_UID or self.gid < MIN_RUN_UID:
            raise ValueError("run identity must be an unprivileged uid/gid (>= 1000)")


def pick_uid(pool: range, busy: Set[int], start: int = 0, *, has_account: Callable[[int], bool]) -> int:
    """The first uid of `pool` from offset `start` (wrapping) that is neither busy nor an account's."""
    for step in range(len(pool)):
        uid = pool[(start + step) % len(pool)]
        if uid >= MIN_RUN_UID and uid not in busy and not has_account(uid):
            return uid
    raise SandboxStartError("uid_pool_exhausted")


def has_account(uid: int) -> bool:
    """Whether `uid` (as a user or as a group) names something in passwd/group: its files would be the run's."""
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(uid)
        except KeyError:
            continue
        return True
    return False


def live_uids() -> set[int]:
    """Every real, effective or saved uid of a live process (a zombie's too: the `Uid:` line of each
    /proc/<pid>/status). Read here rather than by psutil's `process_iter`, which takes about twice the
    CPU for the same lines: the pool scans once a run (decision 109)."""
    owners: set[int] = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            owners.update(_uids_of(name))
    return owners


def _uids_of(pid: str) -> tuple[int, ...]:
    """The real, effective and saved uid of `pid`; none when it is gone or unreadable (as psutil skips it)."""
    try:
        fd = os.open(f"/proc/{pid}/status", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return ()
    try:
        status = os.read(fd, 4096)  # `Uid:` comes within the first few hundred bytes, after the short name
    except OSError:
        return ()
    finally:
        os.close(fd)
    start = status.find(b"\nUid:")
    if start < 0:
        return ()
    end = status.find(b"\n", start + 1)
    return tuple(int(field) for field in status[start + len(b"\nUid:") : end].split()[:3])


def default_lock_dir() -> Path:
    """Where every gateway on this host records the uids it holds (root-only)."""
    run = Path("/run")
    base = run if os.access(run, os.W_OK) else Path(tempfile.gettempdir())
    return base / "mcp-write-gateway-uids"


class UidPool:
    """Hands out run identities; a uid returns to the pool only once no process of it is left.

    A uid is held with an exclusive `flock` on its own file in a host-wide folder, so two
    gateways on one host never hand out the same uid (the sweep of one would kill the run
    of the other); the lock dies with the process that held it.
    """

    def __init__(self, pool: range = DEFAULT_POOL, lock_dir: Path | None = None) -> None:
        self._pool = pool
        self._lock_dir = lock_dir or default_lock_dir()
        self._held: dict[int, int] = {}  # uid -> fd of its lock file
        self._cursor = 0
        self._lock = threading.Lock()
        self._reserve: RunIdentity | None = None

    def acquire(self) -> RunIdentity:
        """A uid for a run: the one `refill` set aside, else one found now (a scan of the process table)."""
        with self._lock:
            if self._reserve is not None:
                identity, self._reserve = self._reserve, None
                return identity
            return self._take()

    def refill(self) -> None:
        """Set aside the next run's uid now, while a run is going, so that its spawn skips the scan (decision 95).

        It is found and locked exactly as `acquire` finds and locks one, and it stays locked until a run takes
        it or this process ends: no other gateway hands it out and no sweep of unheld uids touches it, so it
        is as free when the next run takes it as when it was checked. An exhausted pool sets nothing aside
        (the next `acquire` says so)."""
        with self._lock:
            if self._reserve is None:
                # A run is going: a failure here is not its failure. The next acquire scans again, and says so.
                with contextlib.suppress(SandboxStartError, OSError):
                    self._reserve = self._take()

    def _take(self) -> RunIdentity:
        """Find a free uid (no account, no live process, not held here or by another gateway) and lock it."""
        self._lock_dir.mkdir(mode=0o700, exist_ok=True)
        refused: set[int] = set()
        while True:
            busy = set(self._held) | refused | live_uids()
            uid = pick_uid(self._pool, busy, self._cursor, has_account=has_account)
            fd = os.open(self._lock_dir / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                refused.add(uid)  # another gateway holds it
                continue
            self._held[uid] = fd
            # Rotate so a just-released uid is reused last: a missed survivor has time to show up.
            self._cursor = (self._pool.index(uid) + 1) % len(self._pool)
            return RunIdentity(uid=uid, gid=uid)

    def release(self, identity: RunIdentity) -> None:
        """Call after `containment.sweep`; a uid with a surviving process stays out via `live_uids`."""
        with self._lock:
            fd = self._held.pop(identity.uid, None)
            if fd is not None:
                os.close(fd)  # closing drops the flock


@contextlib.contextmanager
def holding(uid: int, lock_dir: Path | None = None) -> Iterator[None]:
    """Hold `uid`'s lock, as `UidPool` does for a run, while something else runs as it (a probe): the
    sweep of unheld run uids (sandbox/leftovers.py) then leaves it alone. Held already by a live
    gateway's run: just as good. Without a lock folder (not root): nothing to hold, nobody sweeps."""
    fd = None
    with contextlib.suppress(OSError):
        lock_dir = lock_dir or default_lock_dir()
        lock_dir.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(lock_dir / str(uid), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)


def drop_privileges(uid: int, gid: int) -> None:
    """Become `uid`/`gid` for good, with no groups and no_new_privs; raise unless that verifiably holds.

    Safe in `preexec_fn`: only system calls, no imports, no locks. Must run as root.
    """
    if uid < MIN_RUN_UID or gid < MIN_RUN_UID:
        raise SandboxStartError("run_uid_privileged")
    os.setgroups([])
    os.setresgid(gid, gid, gid)  # group first: after setresuid there is no right left to change it
    os.setresuid(uid, uid, uid)
    if _prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise SandboxStartError("no_new_privs_failed")
    if (
        os.getresuid() != (uid, uid, uid)
        or os.getresgid() != (gid, gid, gid)
        or os.getgroups() != []
        or _prctl(_PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1
    ):
        raise SandboxStartError("privilege_drop_unverified")
    try:
        os.setresuid(0, 0, 0)
    except PermissionError:
        return
    raise SandboxStartError("privilege_drop_reversible")
