"""Paths pinned by identity: opened once without following links, then used by fd (decision 30).

A policy names its workspaces and `allowed_paths` by path, and a path can be re-pointed
later: a tenant who may rename their workspace folder can put a symlink to a parent (or to
`/`) in its place. An fd cannot be re-pointed. `pin(path)` opens an absolute path component
by component from `/`, never following a link, and keeps that `O_PATH` fd (close-on-exec)
with the inode's `(st_dev, st_ino)`. The sandbox uses the fd, never the path again: the
Landlock rule is added on it, the run's cwd is `fchdir` to it, bubblewrap binds it
(`--ro-bind-fd`). `is_intact` says whether the path still leads, without a link in any
component, to that very inode; the gateway refuses a call whose pins are not intact.

While the fd is held the inode stays alive, so its number cannot be handed to a new folder
on the same filesystem: equal `(st_dev, st_ino)` means the same folder.
"""

from __future__ import annotations

import errno
import os
import stat
import weakref
from dataclasses import dataclass, field
from pathlib import Path

_WALK_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


class _Handle:
    """Owns one fd; closes it once, when asked or when the last reference to it goes."""

    __slots__ = ("__weakref__", "_finalizer", "fd")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._finalizer = weakref.finalize(self, os.close, fd)

    def close(self) -> None:
        self._finalizer()


@dataclass(frozen=True, slots=True, eq=False)
class Pinned:
    """An absolute path as it was when pinned: its inode, reached without links, and an fd on it."""

    path: Path
    dev: int
    ino: int
    is_dir: bool
    _handle: _Handle = field(repr=False)

    @property
    def fd(self) -> int:
        """An `O_PATH | O_CLOEXEC` fd on the pinned inode (duplicate it to hand it on)."""
        return self._handle.fd

    def close(self) -> None:
        """Close the fd now rather than when the last reference goes; call once nothing uses it."""
        self._handle.close()


def open_without_links(path: Path) -> int:
    """An `O_PATH | O_CLOEXEC` fd on absolute `path`, opened component by component from `/`.

    Raises OSError: ELOOP when any component is a symlink (the last one included), ENOENT,
    ENOTDIR, EACCES as the walk meets them, EINVAL for a relative path or one with `.`/`..`.
    """
    if not path.is_absolute() or any(part in (".", "..") for part in path.parts):
        raise OSError(errno.EINVAL, "not an absolute path without '.' or '..'", str(path))
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in path.parts[1:]:
            child = os.open(part, _WALK_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
            # O_PATH | O_NOFOLLOW opens a symlink itself rather than failing: refuse it here.
            if stat.S_ISLNK(os.fstat(fd).st_mode):
                raise OSError(errno.ELOOP, "a component is a symlink", str(path))
    except BaseException:
        os.close(fd)
        raise
    return fd


def pin(path: Path) -> Pinned:
    """Pin absolute `path` (a folder or a file); raises OSError as `open_without_links` does."""
    fd = open_without_links(path)
    try:
        info = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    return Pinned(path, info.st_dev, info.st_ino, stat.S_ISDIR(info.st_mode), _Handle(fd))


def is_intact(pinned: Pinned) -> bool:
    """Whether `pinned.path` still leads, with no link in any component, to the pinned inode."""
    try:
        fd = open_without_links(pinned.path)
    except OSError:
        return False
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    return (info.st_dev, info.st_ino) == (pinned.dev, pinned.ino)
