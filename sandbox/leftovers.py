"""What a gateway killed mid-run leaves on the host, and the sweep the next gateway makes at start (issue 10, item 4).

The PID namespace and its watchdog end every process of such a run (backends/pidns.py), and
its cgroups are emptied and reused by the next run of the same uid (backends/cgroup.py). What
stays is the run's scratch folder: empty on the host when the scratch tmpfs layer is on (the
tmpfs lived only in the run's mount namespace), holding the run's files otherwise. While a run
is on, its gateway holds an exclusive `flock` on the folder (`scratch_folder`); a folder nobody
holds belonged to a gateway that died, and the next gateway to start removes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from sandbox.backends.identity import DEFAULT_POOL

SCRATCH_PREFIX = "mcp-run-"
_NASCENT_PREFIX = ".mcp-new-"

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@contextlib.contextmanager
def scratch_folder(tag: str, parent: Path | None = None) -> Iterator[Path]:
    """A new, empty scratch folder (0700, root's) for one run, held until the block ends, then removed.

    It is made under a name the sweep ignores, locked, and only then renamed to its
    `SCRATCH_PREFIX` name: a sweeping gateway never sees it unheld.
    """
    nascent = Path(tempfile.mkdtemp(prefix=_NASCENT_PREFIX, dir=parent))
    fd = os.open(nascent, _DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        folder = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{tag}-", dir=parent))
        os.rename(nascent, folder)  # replaces the empty placeholder mkdtemp reserved the name with
        try:
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.rmdir(nascent)


def sweep_scratch(parent: Path | None = None) -> list[Path]:
    """Remove the scratch folders under `parent` (the temp folder) that no live gateway holds."""
    parent = parent or Path(tempfile.gettempdir())
    removed = []
    with os.scandir(parent) as entries:
        for entry in entries:
            if not entry.name.startswith(SCRATCH_PREFIX) or not entry.is_dir(follow_symlinks=False):
                continue
            owner = entry.stat(follow_symlinks=False).st_uid
            # Only what a gateway made (root's) or a run uid owns: never another user's folder.
            if owner != os.geteuid() and owner not in DEFAULT_POOL:
                continue
            with contextlib.suppress(OSError), _unheld(Path(entry.path)) as free:
                if free:
                    shutil.rmtree(entry.path, ignore_errors=True)
                    removed.append(Path(entry.path))
    return removed


@contextlib.contextmanager
def _unheld(folder: Path) -> Iterator[bool]:
    """Whether no gateway holds `folder`; if so, it stays held (by this one) until the block ends."""
    fd = os.open(folder, _DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)
