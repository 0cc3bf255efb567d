"""Open a file beneath a pinned folder, following no link, with no check-then-open gap (decision 28).

A path checked and then opened can be re-pointed in between: a folder swapped for a symlink after
`realpath` said "inside" sends the open outside. `open_beneath(dir_fd, relative, flags)` resolves
`relative` from the folder `dir_fd` refers to (a pinned workspace, sandbox/pinned.py) in the open
itself:

- with openat2(2) and RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS (Linux 5.6+), the
  kernel refuses an absolute path or a `..` that leaves the folder (EXDEV), and any symlink on the way
  (ELOOP), and retries or fails (EAGAIN) when a rename races its walk;
- where openat2 is missing (ENOSYS: an older kernel, a seccomp filter hiding it, an architecture whose
  number is not known here), it walks component by component from `dir_fd`, each opened `O_PATH |
  O_NOFOLLOW` and checked not to be a link, with `..` going back to the fd it came from and never
  above `dir_fd`; the last component is opened with `flags | O_NOFOLLOW`.

Either way only a file beneath the folder, reached without a link, can be opened.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import stat
from pathlib import PurePosixPath

RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
# openat2 came after the syscall tables were unified (Linux 5.1): 437 on every architecture but alpha.
_OPENAT2 = 437 if platform.system() == "Linux" and not platform.machine().startswith("alpha") else None
_WALK = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


class _OpenHow(ctypes.Structure):
    _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64))


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def open_beneath(dir_fd: int, relative: str, flags: int) -> int:
    """An fd on `relative` opened with `flags` beneath the folder `dir_fd`, no link followed.

    Raises OSError: EXDEV for an absolute path or one leaving the folder, ELOOP for a link on the way,
    ENOENT, ENOTDIR, EACCES as the kernel meets them.
    """
    if _OPENAT2 is not None:
        resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
        try:
            return _openat2(_OPENAT2, dir_fd, relative, flags, resolve)
        except OSError as exc:
            if exc.errno not in (errno.ENOSYS, errno.EPERM):  # EPERM: a seccomp filter refusing the call
                raise
    return walk_beneath(dir_fd, relative, flags)


def _openat2(number: int, dir_fd: int, relative: str, flags: int, resolve: int) -> int:
    how = _OpenHow(flags, 0, resolve)
    path = os.fsencode(relative)
    for _ in range(8):  # EAGAIN: a rename raced the walk; the kernel asks to try again
        fd = _libc.syscall(
            ctypes.c_long(number), ctypes.c_int(dir_fd), ctypes.c_char_p(path), ctypes.byref(how),
            ctypes.c_size_t(ctypes.sizeof(how)),
        )  # fmt: skip
        if fd >= 0:
            return int(fd)
        code = ctypes.get_errno()
        if code != errno.EAGAIN:
            raise OSError(code, os.strerror(code), relative)
    raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN), relative)


def walk_beneath(dir_fd: int, relative: str, flags: int) -> int:
    """`open_beneath` without openat2: an O_NOFOLLOW walk from `dir_fd` (public for its tests)."""
    path = PurePosixPath(relative)
    if path.is_absolute():
        raise OSError(errno.EXDEV, "an absolute path is not beneath the folder", relative)
    parts = [p for p in relative.split("/") if p not in ("", ".")]
    stack = [os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)]
    try:
        for i, part in enumerate(parts):
            if part == "..":
                if len(stack) == 1:
                    raise OSError(errno.EXDEV, "'..' leaves the folder", relative)
                os.close(stack.pop())
                continue
            last = i == len(parts) - 1
            if last:
                return os.open(part, flags | os.O_NOFOLLOW, dir_fd=stack[-1])
            child = os.open(part, _WALK, dir_fd=stack[-1])
            stack.append(child)
            mode = os.fstat(child).st_mode
            if stat.S_ISLNK(mode):  # O_PATH | O_NOFOLLOW opens a link itself rather than failing
                raise OSError(errno.ELOOP, "a component is a symlink", relative)
            if not stat.S_ISDIR(mode):
                raise OSError(errno.ENOTDIR, "a component is not a folder", relative)
        return os.open(".", flags & ~os.O_NOFOLLOW, dir_fd=stack[-1])  # the folder itself (`.`, `a/..`)
    finally:
        for fd in stack:
            os.close(fd)
