"""The kernel's renames that `os` lacks, for applying a change set (sandbox/apply.py, decision 78):
`exchange` (renameat2 RENAME_EXCHANGE), `rename_new` (RENAME_NOREPLACE) and `sync_filesystem` (syncfs).

Each raises OSError with the kernel's errno. A filesystem without RENAME_EXCHANGE or RENAME_NOREPLACE
answers EINVAL (NFS, some FUSE); `UnsupportedError` is raised then, so the caller can take its slower way.
"""

from __future__ import annotations

import ctypes
import errno
import os

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2

_libc = ctypes.CDLL(None, use_errno=True)
_libc.renameat2.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
_libc.renameat2.restype = ctypes.c_int
_libc.syncfs.argtypes = (ctypes.c_int,)
_libc.syncfs.restype = ctypes.c_int


class UnsupportedError(OSError):
    """This filesystem (or kernel) cannot do that rename atomically."""


def _renameat2(folder: int, old: str, new: str, flags: int) -> None:
    if _libc.renameat2(folder, os.fsencode(old), folder, os.fsencode(new), flags) != 0:
        code = ctypes.get_errno()
        if code in (errno.EINVAL, errno.ENOSYS):
            raise UnsupportedError(code, os.strerror(code), new)
        raise OSError(code, os.strerror(code), new)


def exchange(folder: int, first: str, second: str) -> None:
    """Swap the entries `first` and `second` of `folder` at once; both must exist. Neither is followed."""
    _renameat2(folder, first, second, RENAME_EXCHANGE)


def rename_new(folder: int, old: str, new: str) -> None:
    """Rename `old` to `new` in `folder`, or FileExistsError when `new` is there: nothing is replaced."""
    _renameat2(folder, old, new, RENAME_NOREPLACE)


def sync_filesystem(fd: int) -> None:
    """Write the filesystem holding `fd` to disk (one call for every file written to it)."""
    if _libc.syncfs(fd) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
