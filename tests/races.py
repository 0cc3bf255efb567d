"""A folder swapped for a symlink, over and over, by another process: the race a check-then-open loses (decision 28).

`FolderSwapper(folder, link_target)` keeps exchanging `folder` (a real folder) with a symlink to
`link_target`, atomically (renameat2 RENAME_EXCHANGE), in a child process so the swaps run truly in
parallel with the reader under test. `folder` always exists: half the time as the folder, half
the time as the link.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import TracebackType

_SWAP = textwrap.dedent(
    """
    import ctypes, os, sys
    libc = ctypes.CDLL(None, use_errno=True)
    folder, spare = (os.fsencode(a) for a in sys.argv[1:3])
    AT_FDCWD, RENAME_EXCHANGE = -100, 2
    print("ready", flush=True)
    while True:
        if libc.renameat2(AT_FDCWD, folder, AT_FDCWD, spare, RENAME_EXCHANGE) != 0:
            sys.exit(f"renameat2: errno {ctypes.get_errno()}")
    """
)


class FolderSwapper:
    def __init__(self, folder: Path, link_target: Path) -> None:
        self.folder = folder
        self.spare = folder.with_name(folder.name + ".swap")
        self.spare.symlink_to(link_target, target_is_directory=True)
        self._process: subprocess.Popen[str] | None = None

    def __enter__(self) -> FolderSwapper:
        self._process = subprocess.Popen(
            [sys.executable, "-c", _SWAP, str(self.folder), str(self.spare)], stdout=subprocess.PIPE, text=True
        )
        assert self._process.stdout is not None
        assert self._process.stdout.readline().strip() == "ready"
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        assert self._process is not None
        self._process.kill()
        self._process.wait(timeout=10)
        assert self._process.stdout is not None
        self._process.stdout.close()
        if self.folder.is_symlink():  # put the folder back in place
            exchange(self.folder, self.spare)
        self.spare.unlink()


def exchange(a: Path, b: Path) -> None:
    """Swap two names atomically (renameat2 RENAME_EXCHANGE)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(-100, os.fsencode(a), -100, os.fsencode(b), 2) != 0:
        raise OSError(ctypes.get_errno(), "renameat2")
