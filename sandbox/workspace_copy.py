"""The copy of a pinned workspace a writing run works on, and what each copied entry was (decision 78).

`copy_workspace(workspace_fd, view_fd, owner)` copies the folder `workspace_fd` refers to (a pinned
workspace, sandbox/pinned.py) into the folder `view_fd` refers to (the root of a WorkspaceView,
sandbox/backends/view.py), through fds only, following no link: folders and regular files with
their permission bits (never setuid, setgid or sticky) and modification times, symlinks as the same
symlinks; FIFOs, sockets and devices are left out. A copy is owned by `owner`, the run's uid, so
that the run may change it, when the run could read the original as it is (the run's uid is
"others" to the workspace's files: a file readable by others, a folder readable and searchable by
others); anything else keeps its owner and mode, so a developer's 0600 `.env` is no more readable
in the copy than in the workspace. It returns `Originals`: for each copied path, what it was (kind,
sha256, size, mode) and the copy's inode and ctime right after the copy. A copy the run never
touched keeps both (a ctime cannot be set back), so the change set reads only what changed.

Bounded: at most `max_entries` entries, `max_bytes` bytes and MAX_DEPTH nested folders, else
WorkspaceTooLarge (nothing ran).
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from sandbox.errors import SandboxStartError

PERMISSION_BITS = 0o777
MAX_DEPTH = 128
"""Folders at this depth or deeper are not copied (the workspace is too large) nor read in a change set
(sandbox/change_set.py refuses them): both walks are bounded in depth, and Python's recursion with them."""
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CHUNK = 1 << 20


class Kind(StrEnum):
    FILE = "file"
    FOLDER = "folder"
    SYMLINK = "symlink"


@dataclass(frozen=True, slots=True)
class Original:
    """A copied entry as it was in the workspace, and its copy's identity right after the copy."""

    kind: Kind
    sha256: str | None
    """A file's content hash (None for a folder or a symlink)."""
    size: int
    mode: int
    """Permission bits only."""
    copy_ino: int
    copy_ctime_ns: int
    link: bytes | None = None
    """A symlink's target, as the workspace had it."""


Originals = Mapping[str, Original]
"""Relative path (`/`-separated, os.fsdecode'd: exact bytes through os.fsencode) -> what it was."""


class WorkspaceTooLarge(SandboxStartError):
    def __init__(self) -> None:
        super().__init__("workspace_too_large_for_view")


@dataclass(frozen=True, slots=True)
class Owner:
    uid: int
    gid: int


def copy_workspace(
    workspace_fd: int, view_fd: int, owner: Owner | None, *, max_entries: int, max_bytes: int
) -> Originals:
    """Copy the workspace into the view; raises WorkspaceTooLarge past a bound, SandboxStartError if unreadable.

    `owner` None: nothing is given away, every copy is the gateway's (a rootless gateway: the run has its uid)."""
    copier = _Copier(owner, max_entries, max_bytes)
    source = os.open(".", _DIR, dir_fd=workspace_fd)
    target = os.open(".", _DIR, dir_fd=view_fd)
    try:
        info = os.fstat(source)
        copier.give(target, info)
        os.fchmod(target, info.st_mode & PERMISSION_BITS)
        copier.folder(source, target, "")
    except OSError as exc:
        if exc.errno in (28, 122):  # ENOSPC, EDQUOT: the view's tmpfs is full
            raise WorkspaceTooLarge from exc
        raise SandboxStartError("workspace_copy_failed") from exc
    finally:
        os.close(source)
        os.close(target)
    return MappingProxyType(copier.originals)


class _Copier:
    def __init__(self, owner: Owner | None, max_entries: int, max_bytes: int) -> None:
        self.owner, self.max_entries, self.max_bytes = owner, max_entries, max_bytes
        self.originals: dict[str, Original] = {}
        self.bytes = 0

    def give(self, fd: int, info: os.stat_result) -> None:
        """To the run's uid what it could read as it is; anything else to the original's own owner."""
        if self.owner is None:
            return
        wanted = 0o005 if stat.S_ISDIR(info.st_mode) else 0o004
        if info.st_mode & wanted == wanted:
            os.fchown(fd, self.owner.uid, self.owner.gid)
        else:
            os.fchown(fd, info.st_uid, info.st_gid)

    def _count(self, size: int) -> None:
        self.bytes += size
        if len(self.originals) >= self.max_entries or self.bytes > self.max_bytes:
            raise WorkspaceTooLarge

    def folder(self, source: int, target: int, prefix: str, depth: int = 0) -> None:
        for name in sorted(os.listdir(source)):
            path = f"{prefix}{name}"
            info = os.stat(name, dir_fd=source, follow_symlinks=False)
            mode = info.st_mode & PERMISSION_BITS
            if stat.S_ISDIR(info.st_mode):
                self._count(0)
                if depth + 1 >= MAX_DEPTH:
                    raise WorkspaceTooLarge
                os.mkdir(name, 0o700, dir_fd=target)
                inner_source = os.open(name, _DIR, dir_fd=source)
                try:
                    inner_target = os.open(name, _DIR, dir_fd=target)
                    try:
                        self.folder(inner_source, inner_target, f"{path}/", depth + 1)
                        self.give(inner_target, info)
                        os.fchmod(inner_target, mode)
                        copy = os.fstat(inner_target)
                    finally:
                        os.close(inner_target)
                finally:
                    os.close(inner_source)
                self.originals[path] = Original(Kind.FOLDER, None, 0, mode, copy.st_ino, copy.st_ctime_ns)
            elif stat.S_ISREG(info.st_mode):
                self._count(info.st_size)
                digest, copy = self._file(source, target, name, mode, info)
                self.originals[path] = Original(Kind.FILE, digest, info.st_size, mode, copy.st_ino, copy.st_ctime_ns)
            elif stat.S_ISLNK(info.st_mode):
                self._count(0)
                link = os.readlink(os.fsencode(name), dir_fd=source)
                os.symlink(link, name, dir_fd=target)
                if self.owner is not None:
                    os.chown(name, self.owner.uid, self.owner.gid, dir_fd=target, follow_symlinks=False)
                copy = os.stat(name, dir_fd=target, follow_symlinks=False)
                self.originals[path] = Original(Kind.SYMLINK, None, 0, mode, copy.st_ino, copy.st_ctime_ns, link)
            # FIFOs, sockets and devices are not copied: a run works on files.

    def _file(self, source: int, target: int, name: str, mode: int, info: os.stat_result) -> tuple[str, os.stat_result]:
        reader = os.open(name, _READ, dir_fd=source)
        try:
            if os.fstat(reader).st_ino != info.st_ino:
                raise OSError(116, "replaced while copied", name)  # ESTALE
            writer = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=target)
            try:
                digest = hashlib.sha256()
                copied = 0
                while True:  # a small file in one read: size + 1 asked, size got, so that was all
                    wanted = min(_CHUNK, info.st_size - copied + 1)
                    chunk = os.read(reader, wanted)
                    digest.update(chunk)
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(writer, view) :]
                    copied += len(chunk)
                    if len(chunk) < wanted or copied > info.st_size:  # a short read is the end of a regular file
                        break
                if copied != info.st_size:
                    raise OSError(116, "changed while copied", name)
                self.give(writer, info)
                os.fchmod(writer, mode)
                os.utime(writer, ns=(info.st_atime_ns, info.st_mtime_ns))
                return digest.hexdigest(), os.fstat(writer)
            finally:
                os.close(writer)
        finally:
            os.close(reader)
