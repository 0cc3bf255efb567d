"""What a writing run changed in its copy of the workspace, as one frozen value (decisions 78, 82).

`read_changes(view, originals, rules)` walks the run's copy (sandbox/backends/view.py) once the
run is over and the copy frozen, and compares it with what was copied (sandbox/workspace_copy.py
`Originals`): folders and regular files added, modified or deleted, each with its hashes, sizes
and modes and, for what is to be written, its content. What cannot be applied is listed as
refused with why: symlinks (anywhere, to anywhere), hard links, devices, FIFOs, sockets,
setuid/setgid bits, protected paths. Past `max_files` changes or `max_bytes` of content the walk
stops (at the cap plus one) and the whole set is `too_large`: nothing of it applies.

Bounded by construction: the copy's tmpfs holds at most as many inodes as the copy plus the
headroom, a file is judged by `st_size` before a byte of it is read (a sparse 5 GiB file costs
one fstat), and an entry the run did not touch keeps its inode and ctime, so it is not read.

`sha256_before` is the hash of what was copied, always: taken as the file was copied, or now, from
the workspace's file when it still has the identity it had then (decision 82,
sandbox/workspace_copy.py `hash_if_unchanged`). When it has not (the workspace's file was written,
replaced or touched since), nothing can say what was copied: `sha256_before` is None, and applying
the set is a conflict (sandbox/apply.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from sandbox.beneath import open_beneath
from sandbox.workspace_copy import MAX_DEPTH, PERMISSION_BITS, Kind, Original, Originals, hash_if_unchanged

MIB = 1024 * 1024
DEFAULT_MAX_FILES = 1000
DEFAULT_MAX_BYTES = 16 * MIB
DEFAULT_PROTECTED = (".git/hooks", ".git/config", ".mcp.json", ".vscode", ".claude", ".cursor", ".envrc")
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class Action(StrEnum):
    ADDED = "added"
    MODIFIED = "modified"
    DELETED = "deleted"


class Refusal(StrEnum):
    """Why an entry of the copy is not applied (the slug shown and audited)."""

    SYMLINK = "symlink"
    HARD_LINK = "hard_link"
    DEVICE = "device"
    FIFO = "fifo"
    SOCKET = "socket"
    SETUID = "setuid_or_setgid_bit"
    PROTECTED = "protected_path"
    TOO_DEEP = "too_deep"
    """A folder MAX_DEPTH folders down: neither it nor anything in it is read."""


class TooLarge(StrEnum):
    FILES = "max_change_files"
    BYTES = "max_change_bytes"


@dataclass(frozen=True, slots=True)
class ChangeRules:
    """What a writing run's change set may hold (the policy's `sandbox.protected_paths`, `max_change_files`,
    `max_change_bytes`), and how much of the workspace its copy may take (sandbox/workspace_copy.py)."""

    protected: tuple[str, ...] = DEFAULT_PROTECTED
    """Relative paths: nothing is added, modified or deleted at or beneath one (at the root or in any folder),
    nor a folder holding one deleted (`is_protected`)."""
    max_files: int = DEFAULT_MAX_FILES
    max_bytes: int = DEFAULT_MAX_BYTES
    max_copy_bytes: int = 1024 * MIB
    """A workspace holding more cannot be copied: the run does not start (`workspace_too_large_for_view`)."""
    max_copy_files: int = 100_000

    def __post_init__(self) -> None:
        if self.max_files < 1 or self.max_bytes < 0 or self.max_copy_files < 1 or self.max_copy_bytes < 0:
            raise ValueError("max_change_files and the copy's files must be at least 1, the bytes not negative")
        for entry in self.protected:
            if not _parts(entry) or entry.startswith("/") or ".." in _parts(entry):
                raise ValueError(f"a protected path is relative, inside the workspace: {entry!r}")


@dataclass(frozen=True, slots=True)
class Change:
    """One folder or regular file to add, modify or delete, beneath the workspace."""

    path: str
    """Relative, `/`-separated, os.fsdecode'd (exact bytes through os.fsencode); shown escaped (sandbox/patch.py)."""
    action: Action
    kind: Kind
    sha256_before: str | None
    """The file as copied when the run began (None: added, a folder, or a file the workspace no longer held as
    copied when the set was read, decision 82: then the set cannot apply); applying checks the workspace still has it."""
    sha256_after: str | None
    size_before: int | None
    size_after: int | None
    mode_before: int | None
    mode_after: int | None
    content: bytes | None = field(default=None, repr=False)
    """What an added or modified file is to hold (None for a folder or a deletion)."""
    content_before: bytes | None = field(default=None, repr=False)
    """A modified or deleted file as the workspace holds it, for the diff (None: not read, or no longer that)."""


@dataclass(frozen=True, slots=True)
class RefusedEntry:
    path: str
    why: Refusal


@dataclass(frozen=True, slots=True)
class ChangeSet:
    changes: tuple[Change, ...]
    refused: tuple[RefusedEntry, ...]
    too_large: TooLarge | None = None
    """Past a cap: the walk stopped there, `changes` is incomplete, and nothing of the set applies."""

    @property
    def content_bytes(self) -> int:
        return sum(change.size_after or 0 for change in self.changes if change.content is not None)

    @property
    def is_empty(self) -> bool:
        return not self.changes and not self.refused and self.too_large is None


class _TooLargeStop(Exception):
    def __init__(self, which: TooLarge) -> None:
        self.which = which


def _parts(path: str) -> tuple[str, ...]:
    return tuple(part for part in path.split("/") if part not in ("", "."))


GIT_CONTROL = frozenset({"hooks", "config"})
"""Beneath any `.git` folder, at any depth (a nested repository's, a submodule's in `.git/modules/`), a
component named so makes the path protected whatever the policy lists: git runs hooks and reads
`core.fsmonitor`, `core.hooksPath` and filter commands from there."""


def is_protected(path: str, protected: tuple[str, ...]) -> bool:
    """Whether `path` is a protected path or lies beneath one, at the workspace's root or in any folder
    beneath it (`.envrc` and `.vscode` act wherever a person opens or enters a folder; compared
    component-wise, case as given), or is git's control beneath a `.git` folder (GIT_CONTROL)."""
    parts = _parts(path)
    for guarded in map(_parts, protected):
        size = len(guarded)
        if any(parts[start : start + size] == guarded for start in range(len(parts) - size + 1)):
            return True
    if ".git" in parts:
        return any(part in GIT_CONTROL for part in parts[parts.index(".git") + 1 :])
    return False


def guarding_folders(present: Iterable[str], protected: tuple[str, ...]) -> frozenset[str]:
    """The folders among whose contents `present` (the workspace's entries, as copied) has a protected path:
    none of them can be deleted without deleting that."""
    found: set[str] = set()
    for entry in present:
        if is_protected(entry, protected):
            parts = _parts(entry)
            found.update("/".join(parts[:end]) for end in range(1, len(parts)))
    return frozenset(found)


def read_changes(view_fd: int, originals: Originals, rules: ChangeRules, workspace_fd: int) -> ChangeSet:
    """The change set of the frozen copy under `view_fd` against `originals` (what it was copied from
    `workspace_fd`, the pinned workspace).

    Each modified or deleted file's present content in the workspace is kept for the diff when it
    still holds what was copied (at most `max_bytes` of it in all)."""
    walk = _Walk(originals, rules, workspace_fd)
    root = os.open(".", _DIR, dir_fd=view_fd)
    try:
        walk.folder(root, "")
        walk.deletions()
    except _TooLargeStop as stop:
        return ChangeSet(tuple(walk.changes), tuple(walk.refused), stop.which)
    finally:
        os.close(root)
    return ChangeSet(
        _with_before(tuple(walk.changes), walk.read_before, workspace_fd, rules.max_bytes), tuple(walk.refused)
    )


def _with_before(
    changes: tuple[Change, ...], read_before: dict[str, bytes], workspace_fd: int, budget: int
) -> tuple[Change, ...]:
    """Each modified or deleted file with the workspace's content for the diff, when it still holds `sha256_before`:
    read already while it was hashed (`read_before`), or read now."""
    kept: list[Change] = []
    for change in changes:
        size = change.size_before or 0
        if change.kind is Kind.FILE and change.sha256_before is not None and size <= budget:
            before = read_before.get(change.path)
            if before is None:
                before = _read_workspace(workspace_fd, change.path, size)
                if before is not None and hashlib.sha256(before).hexdigest() != change.sha256_before:
                    before = None
            if before is not None:
                budget -= size
                kept.append(dataclasses.replace(change, content_before=before))
                continue
        kept.append(change)
    return tuple(kept)


def _read_workspace(workspace_fd: int, path: str, size: int) -> bytes | None:
    try:
        reader = open_beneath(workspace_fd, path, _READ)
    except OSError:
        return None
    try:
        info = os.fstat(reader)
        if not stat.S_ISREG(info.st_mode) or info.st_size != size:
            return None
        return read_at_most(reader, size)
    finally:
        os.close(reader)


class _Walk:
    def __init__(self, originals: Originals, rules: ChangeRules, workspace_fd: int) -> None:
        self.originals, self.rules, self.workspace_fd = originals, rules, workspace_fd
        self.changes: list[Change] = []
        self.refused: list[RefusedEntry] = []
        self.seen: set[str] = set()
        self.bytes = 0
        self.read_before: dict[str, bytes] = {}
        """Workspace content read while hashing it (decision 82), for the diff: at most `max_bytes` in all."""
        self._read_budget = rules.max_bytes
        self._guarding: frozenset[str] | None = None
        self._children: dict[str, list[str]] | None = None

    def _sha256_before(self, path: str, original: Original) -> str | None:
        """The hash of the file as copied: taken then, or now from the workspace if it is as it was (else None)."""
        if original.sha256 is not None or original.identity is None:
            return original.sha256
        digest, content = hash_if_unchanged(self.workspace_fd, path, original.identity, self._read_budget)
        if content is not None:
            self.read_before[path] = content
            self._read_budget -= len(content)
        return digest

    def _guards(self, path: str) -> bool:
        """Whether the folder `path` holds a protected path in the workspace (worked out at the first folder deleted)."""
        if self._guarding is None:
            self._guarding = guarding_folders(self.originals, self.rules.protected)
        return path in self._guarding

    def _add(self, change: Change) -> None:
        if is_protected(change.path, self.rules.protected):
            self._refuse(change.path, Refusal.PROTECTED)
            return
        self.bytes += (change.size_after or 0) if change.content is not None else 0
        self.changes.append(change)
        self._check_caps()

    def _refuse(self, path: str, why: Refusal) -> None:
        self.refused.append(RefusedEntry(path, why))
        self._check_caps()

    def _check_caps(self) -> None:
        if len(self.changes) + len(self.refused) > self.rules.max_files:
            raise _TooLargeStop(TooLarge.FILES)
        if self.bytes > self.rules.max_bytes:
            raise _TooLargeStop(TooLarge.BYTES)

    def folder(self, fd: int, prefix: str, depth: int = 0) -> None:
        for name in sorted(os.listdir(fd)):
            path = f"{prefix}{name}"
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            original = self.originals.get(path)
            if (
                original is not None
                and original.copy_ctime_ns == info.st_ctime_ns
                and original.copy_ino == info.st_ino
                and original.kind is Kind.FILE
            ):  # untouched (most of a workspace): a link, a chmod or a write would have moved its ctime
                self.seen.add(path)
                continue
            if original is not None and original.kind is not _kind(info.st_mode):
                self._deleted(path)  # replaced by another kind: the old one goes, the new one is judged below
                original = None
            else:
                self.seen.add(path)
            why = _refusal(info)
            if why is not None:
                if original is None or (original.copy_ino, original.copy_ctime_ns) != (info.st_ino, info.st_ctime_ns):
                    self._refuse(path, why)  # an untouched symlink the workspace had is no change
                continue
            mode = info.st_mode & PERMISSION_BITS
            if stat.S_ISDIR(info.st_mode) and depth + 1 >= MAX_DEPTH:
                self._refuse(path, Refusal.TOO_DEEP)
            elif stat.S_ISDIR(info.st_mode):
                if original is None:
                    self._add(Change(path, Action.ADDED, Kind.FOLDER, None, None, None, None, None, mode))
                elif original.mode != mode:
                    self._add(Change(path, Action.MODIFIED, Kind.FOLDER, None, None, None, None, original.mode, mode))
                inner = os.open(name, _DIR, dir_fd=fd)
                try:
                    self.folder(inner, f"{path}/", depth + 1)
                finally:
                    os.close(inner)
            elif original is None or (original.copy_ino, original.copy_ctime_ns) != (info.st_ino, info.st_ctime_ns):
                self._file(fd, name, path, info, original)

    def _file(self, fd: int, name: str, path: str, info: os.stat_result, before: Original | None) -> None:
        unchanged_size = before is not None and before.size == info.st_size
        # Judged by st_size before a byte is read: a sparse file of any size costs one fstat.
        if not unchanged_size and self.bytes + info.st_size > self.rules.max_bytes:
            raise _TooLargeStop(TooLarge.BYTES)
        content = _read(fd, name, info)
        digest = hashlib.sha256(content).hexdigest()
        mode = info.st_mode & PERMISSION_BITS
        if before is None:
            self._add(Change(path, Action.ADDED, Kind.FILE, None, digest, None, len(content), None, mode, content))
            return
        digest_before = self._sha256_before(path, before)
        if digest_before != digest or before.mode != mode:  # unknown before: listed, and a conflict when applied
            change = Change(
                path, Action.MODIFIED, Kind.FILE, digest_before, digest, before.size, len(content), before.mode, mode,
                content,
            )  # fmt: skip
            self._add(change)

    def _beneath(self, path: str) -> list[str]:
        """What the copy held beneath the folder `path` (an index built once, at the first folder replaced)."""
        if self._children is None:
            self._children = {}
            for entry in self.originals:
                self._children.setdefault(entry.rpartition("/")[0], []).append(entry)
        found, waiting = [], [path]
        while waiting:
            for child in self._children.get(waiting.pop(), ()):
                found.append(child)
                waiting.append(child)
        return found

    def _deleted(self, path: str) -> None:
        """`path` and, for a folder, everything the copy held beneath it, as deletions (deepest first)."""
        held = self.originals[path].kind is Kind.FOLDER
        beneath = [p for p in self._beneath(path) if p not in self.seen] if held else []
        for inner in sorted(beneath, key=lambda p: p.count("/"), reverse=True):
            self.seen.add(inner)
            self._delete_one(inner)
        self.seen.add(path)
        self._delete_one(path)

    def _delete_one(self, path: str) -> None:
        original = self.originals[path]
        if original.kind is Kind.SYMLINK:
            self._refuse(path, Refusal.SYMLINK)
            return
        if original.kind is Kind.FOLDER and self._guards(path):
            self._refuse(path, Refusal.PROTECTED)
            return
        digest = self._sha256_before(path, original) if original.kind is Kind.FILE else None
        self._add(Change(path, Action.DELETED, original.kind, digest, None, original.size, None, original.mode, None))

    def deletions(self) -> None:
        gone = [path for path in self.originals if path not in self.seen]
        for path in sorted(gone, key=lambda p: p.count("/"), reverse=True):
            if path not in self.seen:
                self.seen.add(path)
                self._delete_one(path)


def _kind(mode: int) -> Kind | None:
    if stat.S_ISDIR(mode):
        return Kind.FOLDER
    if stat.S_ISREG(mode):
        return Kind.FILE
    if stat.S_ISLNK(mode):
        return Kind.SYMLINK
    return None


def _refusal(info: os.stat_result) -> Refusal | None:
    mode = info.st_mode
    if stat.S_ISLNK(mode):
        return Refusal.SYMLINK
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return Refusal.DEVICE
    if stat.S_ISFIFO(mode):
        return Refusal.FIFO
    if stat.S_ISSOCK(mode):
        return Refusal.SOCKET
    if mode & (stat.S_ISUID | stat.S_ISGID):
        return Refusal.SETUID
    if stat.S_ISREG(mode) and info.st_nlink > 1:
        return Refusal.HARD_LINK
    return None


def _read(fd: int, name: str, info: os.stat_result) -> bytes:
    """The file's content, opened without following a link and checked to be the inode walked to."""
    reader = os.open(name, _READ, dir_fd=fd)
    try:
        opened = os.fstat(reader)
        if opened.st_ino != info.st_ino or not stat.S_ISREG(opened.st_mode):
            raise OSError(116, "replaced while read", name)  # ESTALE: the copy is frozen, so never expected
        return read_at_most(reader, opened.st_size)
    finally:
        os.close(reader)


def read_at_most(reader: int, size: int) -> bytes:
    """At most `size` bytes of `reader`, read in chunks (never more, whatever the file grew to)."""
    chunks, left = [], size
    while left > 0:
        chunk = os.read(reader, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
