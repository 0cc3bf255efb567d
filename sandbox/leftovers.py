"""What a gateway killed mid-run leaves on the host, and the sweep that removes it (decisions 38 and 68).

The PID namespace and its watchdog end every process of such a run (backends/pidns.py), and
its cgroups are emptied and reused by the next run of the same uid (backends/cgroup.py). What
stays is the run's scratch folder: empty on the host when the scratch tmpfs layer is on (the
tmpfs lived only in the run's mount namespace), holding the run's files otherwise. While a run
is on, its gateway holds an exclusive `flock` on the folder (`scratch_folder`); a folder nobody
holds belonged to a gateway that died, and the sweep removes it.

The folders live in `mcp-runs-<euid>` in the temp folder (`scratch_root`): the gateway's user's
own, mode 0711, so no other user can put an entry where the sweep looks (they may only pass
through it, as a run's uid must to reach its folder). The sweep still treats every entry as
something that may vanish or change under it (another gateway of the same user sweeps too):
it works on file descriptors, never follows a symbolic link, and removes only a folder it
holds the lock of, that still has the name it found and is the user's or a run uid's.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from sandbox.backends.containment import sweep
from sandbox.backends.identity import DEFAULT_POOL, default_lock_dir, live_uids
from sandbox.errors import SandboxStartError

SCRATCH_PREFIX = "mcp-run-"
ROOT_PREFIX = "mcp-runs-"
ROOT_MODE = 0o711
"""The owner lists and creates entries; anyone may pass through (a run's uid, to its own folder)."""
_NASCENT_PREFIX = ".mcp-new-"
UNSAFE_ROOT = "scratch_root_unsafe"
"""The `SandboxStartError` slug when `scratch_root` refuses the folder (gateway/start_failures.py)."""

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def scratch_root(temp: Path | None = None) -> Path:
    """`mcp-runs-<euid>` in `temp` (the temp folder), made if missing, checked every time.

    Refused (SandboxStartError, slug `scratch_root_unsafe:<why>`) when it is a symbolic link or
    not a folder, belongs to another user, or others may write in it: someone else made it,
    and what is in it cannot be trusted. Its mode is set to 0711 otherwise.
    """
    root = (temp or Path(tempfile.gettempdir())) / f"{ROOT_PREFIX}{os.geteuid()}"
    with contextlib.suppress(FileExistsError):
        os.mkdir(root, ROOT_MODE)
    try:
        fd = os.open(root, _DIRECTORY)
    except OSError as exc:  # ELOOP: a symbolic link; ENOTDIR: a file; EACCES...
        raise SandboxStartError(f"{UNSAFE_ROOT}:{root} cannot be opened as a folder ({exc.strerror})") from exc
    try:
        found = os.fstat(fd)
        if found.st_uid != os.geteuid():
            raise SandboxStartError(f"{UNSAFE_ROOT}:{root} belongs to uid {found.st_uid}, not to this gateway's")
        if found.st_mode & 0o022:
            raise SandboxStartError(f"{UNSAFE_ROOT}:others may write in {root} (mode {stat.S_IMODE(found.st_mode):o})")
        if stat.S_IMODE(found.st_mode) != ROOT_MODE:
            os.fchmod(fd, ROOT_MODE)
    finally:
        os.close(fd)
    return root


@contextlib.contextmanager
def scratch_folder(tag: str, parent: Path | None = None) -> Iterator[Path]:
    """A new, empty scratch folder (0700, the gateway user's) for one run, held until the block ends, then removed.

    It is made under a name the sweep ignores, locked, and only then renamed to a fresh
    `SCRATCH_PREFIX` name: a sweeping gateway never sees it unheld. `parent` defaults to
    `scratch_root()`.
    """
    parent = parent or scratch_root()
    nascent = Path(tempfile.mkdtemp(prefix=_NASCENT_PREFIX, dir=parent))
    fd = os.open(nascent, _DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        # 128 random bits: no placeholder reserves the name (an unheld one the sweep could take).
        folder = parent / f"{SCRATCH_PREFIX}{tag}-{secrets.token_hex(16)}"
        os.rename(nascent, folder)
        try:
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.rmdir(nascent)


def sweep_scratch(parent: Path | None = None) -> list[Path]:
    """Remove the scratch folders under `parent` (default `scratch_root()`) that no live gateway holds."""
    parent = parent or scratch_root()
    try:
        parent_fd = os.open(parent, _DIRECTORY)
    except FileNotFoundError:
        return []
    removed = []
    try:
        for name in os.listdir(parent_fd):
            if name.startswith(SCRATCH_PREFIX) and remove_if_abandoned(parent_fd, name):
                removed.append(parent / name)
    finally:
        os.close(parent_fd)
    return removed


def remove_if_abandoned(parent_fd: int, name: str) -> bool:
    """Remove the folder `name` in `parent_fd` if it is a gateway's and nobody holds it; whether it did.

    Whatever `name` is by now (gone, a file, a link, another folder) is left alone, and so is
    anything that changes while this looks at it: no step follows a link or raises.
    """
    try:
        fd = os.open(name, _DIRECTORY, dir_fd=parent_fd)
    except OSError:  # gone, not a folder, a link (ELOOP), not ours to open
        return False
    try:
        if not _is_a_gateways(os.fstat(fd).st_uid):
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held by a live gateway (or the lock refused): not abandoned
            return False
        if not _still_named(parent_fd, name, os.fstat(fd)):
            return False
        # File descriptor based on Linux: a link inside is removed, never followed.
        shutil.rmtree(name, ignore_errors=True, dir_fd=parent_fd)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _is_a_gateways(owner: int) -> bool:
    """What a gateway made (its user's) or a run uid owns: never another user's folder."""
    return owner == os.geteuid() or owner in DEFAULT_POOL


def _still_named(parent_fd: int, name: str, held: os.stat_result) -> bool:
    try:
        now = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)


def kill_unheld_uids(pool: range = DEFAULT_POOL, lock_dir: Path | None = None) -> dict[int, list[int]]:
    """Kill every process of a run uid that no gateway holds; {uid: pids killed} (decision 69).

    A gateway holds each run uid it hands out with a `flock` on the uid's file in the host's
    lock folder (backends/identity.py `UidPool`) until the run is swept; the lock dies with the
    gateway. A process of a pool uid nobody holds is what a dead gateway's run left: its
    supervisors' parent-death signals end it at once and the watchdog at the deadline, and this
    is the backstop that needs neither. Taking the lock first means no gateway hands the uid out
    meanwhile (a uid with a live process is never handed out anyway). As root only: the lock
    folder is root's, and only root can signal another uid's processes.
    """
    lock_dir = lock_dir or default_lock_dir()
    if os.geteuid() != 0 or not lock_dir.is_dir() or lock_dir.is_symlink():
        return {}
    killed: dict[int, list[int]] = {}
    for uid in sorted(live_uids() & set(pool)):
        try:
            fd = os.open(lock_dir / str(uid), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # a live gateway's run
        try:
            pids = sweep(uid)
        finally:
            os.close(fd)
        if pids:
            killed[uid] = pids
    return killed
