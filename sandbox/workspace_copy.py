"""The copy of a pinned workspace a writing run works on, and what each copied entry was (decisions 78, 82).

`copy_workspace(workspace_fd, view_fd, owner)` copies the folder `workspace_fd` refers to (a pinned
workspace, sandbox/pinned.py) into the folder `view_fd` refers to (the root of a WorkspaceView,
sandbox/backends/view.py), through fds only, following no link: folders and regular files with
their permission bits (never setuid, setgid or sticky) and modification times, symlinks as the same
symlinks; FIFOs, sockets and devices are left out. A copy is owned by `owner`, the run's uid, so
that the run may change it, when the run could read the original as it is (the run's uid is
"others" to the workspace's files: a file readable by others, a folder readable and searchable by
others); anything else keeps its owner and mode, so a developer's 0600 `.env` is no more readable
in the copy than in the workspace. It returns `Originals`: for each copied path, what it was (kind,
size, mode, and a file's sha256 or its `Identity`) and the copy's inode and ctime right after the
copy. A copy the run never touched keeps both (a ctime cannot be set back), so the change set reads
only what changed.

A file's sha256 is taken later, and only for the files the run changed (decision 82): the copy
notes the file's identity (device, inode, size, mtime, ctime) and the change set hashes the
workspace's file when it still has that identity (`hash_if_unchanged`). A write after the copy
gives the file a later ctime, which nothing can set back. What identity cannot vouch for is hashed
as it is copied, as before: a file whose ctime is within RACY_NS of the copy's start (a write in
the same clock tick as the copy would keep it), and every file on a filesystem not in
LAZY_FILESYSTEMS (its timestamps are not known to be the kernel's own, fine-grained ones).

Bounded: at most `max_entries` entries, `max_bytes` bytes and MAX_DEPTH nested folders, else
WorkspaceTooLarge (nothing ran).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import NamedTuple

from sandbox.beneath import open_beneath
from sandbox.errors import SandboxStartError

PERMISSION_BITS = 0o777
MAX_DEPTH = 128
"""Folders at this depth or deeper are not copied (the workspace is too large) nor read in a change set
(sandbox/change_set.py refuses them): both walks are bounded in depth, and Python's recursion with them."""
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CHUNK = 1 << 20
RACY_NS = 2_000_000_000
"""A file whose ctime is less than this before the copy's start is hashed as it is copied: a write right after
the copy may share its clock tick (coarse timestamps: a jiffy; some filesystems: a second), so its identity
would not tell. Two seconds cover a one-second granularity and a write() caught between its timestamp and its
data."""
LAZY_FILESYSTEMS = frozenset({0xEF53, 0x58465342, 0x9123683E, 0x01021994})
"""statfs f_type of the filesystems whose identity is trusted (ext2/3/4, xfs, btrfs, tmpfs): local, with the
kernel's own ctime. Any other (NFS and FUSE take times from a server, overlayfs from its layers) is hashed as copied."""
_STATFS_BUFFER = 256  # struct statfs is 120 bytes on 64-bit Linux; f_type is its first word


class Identity(NamedTuple):
    """What a workspace file was when it was copied: a write since gives it at least another ctime.

    A NamedTuple, as Original: immutable too, and made 2,000 times per copy of a 2,000-file project, where a
    frozen dataclass's `__init__` cost 2 µs more per file (4 ms a copy, measured)."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, info: os.stat_result) -> Identity:
        return cls(info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


class Kind(StrEnum):
    FILE = "file"
    FOLDER = "folder"
    SYMLINK = "symlink"


class Original(NamedTuple):
    """A copied entry as it was in the workspace, and its copy's identity right after the copy (immutable;
    a NamedTuple for the speed of making one per copied entry, as Identity)."""

    kind: Kind
    sha256: str | None
    """A file's content hash when it was taken as the file was copied (None for a folder, a symlink, or a file
    whose hash is left to `hash_if_unchanged` by its `identity`)."""
    size: int
    mode: int
    """Permission bits only."""
    copy_ino: int
    copy_ctime_ns: int
    link: bytes | None = None
    """A symlink's target, as the workspace had it."""
    identity: Identity | None = None
    """A file copied without its hash: what the workspace's file was, for `hash_if_unchanged`."""


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
    workspace_fd: int,
    view_fd: int,
    owner: Owner | None,
    *,
    max_entries: int,
    max_bytes: int,
    now_ns: int | None = None,
    racy_ns: int = RACY_NS,
    trusted: frozenset[int] = LAZY_FILESYSTEMS,
) -> Originals:
    """Copy the workspace into the view; raises WorkspaceTooLarge past a bound, SandboxStartError if unreadable.

    `owner` None: nothing is given away, every copy is the gateway's (a rootless gateway: the run has its uid).
    A file whose ctime is at or after `now_ns` (default: the wall clock now) less `racy_ns`, or on a filesystem
    whose statfs type is not in `trusted`, is hashed as copied; any other's sha256 is left to `hash_if_unchanged`."""
    started = time.time_ns() if now_ns is None else now_ns
    copier = _Copier(owner, max_entries, max_bytes, started - racy_ns, trusted)
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
    def __init__(
        self, owner: Owner | None, max_entries: int, max_bytes: int, hash_from_ns: int, trusted: frozenset[int]
    ) -> None:
        self.owner, self.max_entries, self.max_bytes = owner, max_entries, max_bytes
        self.hash_from_ns, self.trusted = hash_from_ns, trusted
        self.originals: dict[str, Original] = {}
        self.bytes = 0
        self._lazy_devices: dict[int, bool] = {}

    def _hashed_as_copied(self, reader: int, info: os.stat_result) -> bool:
        """Whether identity cannot vouch for this file: too recent a ctime, or a filesystem not trusted."""
        if info.st_ctime_ns >= self.hash_from_ns:
            return True
        lazy = self._lazy_devices.get(info.st_dev)
        if lazy is None:
            lazy = self._lazy_devices[info.st_dev] = filesystem_type(reader) in self.trusted
        return not lazy

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
        for entry in sorted(os.scandir(source), key=_name):
            name = entry.name
            path = f"{prefix}{name}"
            if entry.is_file(follow_symlinks=False):  # the directory's own type: no lstat (the open's fstat checks)
                self._file(source, target, name, path)
                continue
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
            elif stat.S_ISREG(info.st_mode):  # a file the directory did not type
                self._file(source, target, name, path)
            elif stat.S_ISLNK(info.st_mode):
                self._count(0)
                link = os.readlink(os.fsencode(name), dir_fd=source)
                os.symlink(link, name, dir_fd=target)
                if self.owner is not None:
                    os.chown(name, self.owner.uid, self.owner.gid, dir_fd=target, follow_symlinks=False)
                copy = os.stat(name, dir_fd=target, follow_symlinks=False)
                self.originals[path] = Original(Kind.SYMLINK, None, 0, mode, copy.st_ino, copy.st_ctime_ns, link)
            # FIFOs, sockets and devices are not copied: a run works on files.

    def _file(self, source: int, target: int, name: str, path: str) -> None:
        """Copy one file, noting its sha256 or, for `hash_if_unchanged`, its identity (decision 82)."""
        reader = os.open(name, _READ, dir_fd=source)
        try:
            info = os.fstat(reader)  # the identity: taken before a byte is read, so any later write moves it
            if not stat.S_ISREG(info.st_mode):
                raise OSError(116, "replaced while copied", name)  # ESTALE
            self._count(info.st_size)
            mode = info.st_mode & PERMISSION_BITS
            writer = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=target)
            try:
                if self._hashed_as_copied(reader, info):
                    digest: str | None = _copy_hashing(reader, writer, info.st_size, name)
                    identity = None
                else:
                    _copy_in_kernel(reader, writer, info.st_size, name)
                    digest, identity = None, Identity.of(info)
                self.give(writer, info)
                os.fchmod(writer, mode)
                os.utime(writer, ns=(info.st_atime_ns, info.st_mtime_ns))
                copy = os.fstat(writer)
            finally:
                os.close(writer)
        finally:
            os.close(reader)
        self.originals[path] = Original(
            Kind.FILE, digest, info.st_size, mode, copy.st_ino, copy.st_ctime_ns, identity=identity
        )


def _name(entry: os.DirEntry[str]) -> str:
    return entry.name


def _copy_hashing(reader: int, writer: int, size: int, name: str) -> str:
    """Copy `size` bytes through this process, hashing them; raises OSError if the file is not that size."""
    digest = hashlib.sha256()
    copied = 0
    while True:  # a small file in one read: size + 1 asked, size got, so that was all
        wanted = min(_CHUNK, size - copied + 1)
        chunk = os.read(reader, wanted)
        digest.update(chunk)
        view = memoryview(chunk)
        while view:
            view = view[os.write(writer, view) :]
        copied += len(chunk)
        if len(chunk) < wanted or copied > size:  # a short read is the end of a regular file
            break
    if copied != size:
        raise OSError(116, "changed while copied", name)  # ESTALE
    return digest.hexdigest()


def _copy_in_kernel(reader: int, writer: int, size: int, name: str) -> None:
    """Copy `size` bytes by sendfile(2), never through this process; raises OSError if the file is not that size."""
    copied = 0
    while True:  # as _copy_hashing: size + 1 asked, size sent, so that was all (one call for most files)
        wanted = size - copied + 1
        sent = os.sendfile(writer, reader, None, wanted)
        copied += sent
        if sent < wanted or copied > size:
            break
    if copied != size:
        raise OSError(116, "changed while copied", name)  # ESTALE


_libc = ctypes.CDLL(None, use_errno=True)
_fstatfs = _libc.fstatfs
_fstatfs.argtypes = [ctypes.c_int, ctypes.c_void_p]
_fstatfs.restype = ctypes.c_int


def filesystem_type(fd: int) -> int:
    """statfs(2)'s f_type of the filesystem `fd` is on (0 when it cannot be told: no file is then trusted)."""
    buffer = ctypes.create_string_buffer(_STATFS_BUFFER)
    if _fstatfs(fd, buffer) != 0:
        return 0
    return ctypes.c_ulong.from_buffer(buffer).value & 0xFFFFFFFF


def hash_if_unchanged(
    workspace_fd: int, path: str, identity: Identity, keep_up_to: int
) -> tuple[str | None, bytes | None]:
    """The sha256 of the workspace's file at `path` if it still has `identity` (so still holds what was copied),
    and its content when at most `keep_up_to` bytes; (None, None) when it changed, moved or cannot be read.

    Read through the pinned fd, beneath it, following no link; the identity is checked before and after
    the read, so a write while it is read is seen too."""
    try:
        reader = open_beneath(workspace_fd, path, _READ)
    except OSError:
        return None, None
    try:
        if Identity.of(os.fstat(reader)) != identity:
            return None, None
        digest = hashlib.sha256()
        chunks: list[bytes] = []
        left = identity.size
        while left > 0:
            chunk = os.read(reader, min(left, _CHUNK))
            if not chunk:
                return None, None
            digest.update(chunk)
            if identity.size <= keep_up_to:
                chunks.append(chunk)
            left -= len(chunk)
        if Identity.of(os.fstat(reader)) != identity:
            return None, None
        return digest.hexdigest(), b"".join(chunks) if identity.size <= keep_up_to else None
    except OSError:
        return None, None
    finally:
        os.close(reader)
