"""Applying a change set beneath the pinned workspace: all checked first, then each file swapped in at once (decision 78).

`apply_changes(workspace_fd, changes)` works only through the workspace's pinned fd
(sandbox/pinned.py) and sandbox/beneath.py: every path is resolved beneath it with no link
followed, so renaming the workspace folder, or putting a link in its place, while a person decides
moves nothing outside it: the changes land in the folder that was pinned, wherever it now is.

First every target is checked against what the run began with: an added path must be absent (a
folder may already be there), a modified or deleted file must still hold `sha256_before` with its
mode (a file whose `sha256_before` is not known never does, decision 82), a folder must still be a
folder. If any differs, nothing is written and the result names the
paths (the gateway answers -32004 `changes_conflict`). A set that is too large applies nothing.
Then the files (`_Placing`): every new content staged to a temporary in its folder, one syncfs, and
each file swapped in at once, renameat2 RENAME_EXCHANGE for a modified file (RENAME_NOREPLACE for
an added one; a deleted one renamed aside), the file swapped out checked again to hold
`sha256_before`. A person's save between the first check and a file's own swap is found there: every
file placed is swapped back and nothing applies (`changes_conflict`). What was swapped out is
checked once more to be unwritten (an editor holding it open) and removed once all are placed.
Then the rest in order: folders deleted (deepest first) and added (parents first, never through a
link), files in folders the set adds, folder modes, and a last syncfs. Modes carry permission bits only (never
setuid, setgid or sticky). What is written belongs to the gateway's user, except for a gateway
running as root (decision 80): a modified file keeps its owner and group, an added file or folder
gets those of the folder it lands in, so a root gateway leaves no root-owned file in a user's tree.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import stat
from collections.abc import Callable
from dataclasses import dataclass

from sandbox.beneath import open_beneath
from sandbox.change_set import DEFAULT_PROTECTED, Action, Change, ChangeSet, is_protected_change, read_at_most
from sandbox.renames import UnsupportedError, exchange, rename_new, sync_filesystem
from sandbox.workspace_copy import PERMISSION_BITS, Kind

_FOLDER = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class ApplyResult:
    applied: bool
    reason: str | None = None
    """Why not: `changes_too_large`, `changes_protected`, `changes_conflict`, or `changes_apply_failed`
    (a write failed midway)."""
    conflicts: tuple[str, ...] = ()
    """The paths that no longer hold what the run began with (`changes_conflict`), or protected ones."""
    written: tuple[str, ...] = ()
    """The paths changed, in order (when a write failed midway: those before it)."""


def apply_changes(
    workspace_fd: int,
    changes: ChangeSet,
    *,
    protected: tuple[str, ...] = DEFAULT_PROTECTED,
    git_data: bool = False,
    new_token: Callable[[], str] = lambda: secrets.token_hex(8),
) -> ApplyResult:
    """Apply `changes` beneath the folder `workspace_fd` refers to, or nothing of it (see the module's docstring).

    `protected` is the policy's list again: a set holding a change there (read_changes never makes
    one; a set built by hand might) applies nothing (`changes_protected`, the paths named). `git_data`
    is the rules' `ChangeRules.git_data`: git's data beneath the workspace's `.git` (sandbox/git_data.py, its
    name, content and mode judged again here) is then no protected path; what `.git` is in the workspace is
    judged as every path is, beneath the pinned fd with no link followed. Blocking file I/O: call it on a
    worker thread."""
    if changes.too_large is not None:
        return ApplyResult(False, "changes_too_large")
    if not changes.changes:
        return ApplyResult(True)  # nothing to place, so nothing to make durable: no syncfs (decision 87)
    guarded = tuple(
        change.path for change in changes.changes if is_protected_change(change, protected, git_data=git_data)
    )
    if guarded:
        return ApplyResult(False, "changes_protected", guarded)
    deleted = frozenset(change.path for change in changes.changes if change.action is Action.DELETED)
    conflicts = tuple(change.path for change in changes.changes if not _still_as_it_was(workspace_fd, change, deleted))
    if conflicts:
        return ApplyResult(False, "changes_conflict", conflicts)
    written: list[str] = []
    try:
        placed = _Placing(workspace_fd, new_token)
        try:
            late = placed.stage(changes.changes, deleted)
            sync_filesystem_of(workspace_fd)  # the new contents on disk before any is renamed into place
            try:
                conflict = placed.place() or placed.still_unchanged()
            except OSError:
                placed.undo()  # a write that failed midway: what was placed put back, then -32006
                raise
            if conflict is not None:
                placed.undo()
                return ApplyResult(False, "changes_conflict", (conflict,))
            written += placed.commit()
        finally:
            placed.close()
        for change in _in_order(late):
            _apply_one(workspace_fd, change, new_token)
            written.append(change.path)
        sync_filesystem_of(workspace_fd)
    except OSError:
        return ApplyResult(False, "changes_apply_failed", written=tuple(written))
    return ApplyResult(True, written=tuple(written))


def sync_filesystem_of(workspace_fd: int) -> None:
    """One syncfs for the workspace's filesystem, in place of an fsync per file."""
    fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=workspace_fd)
    try:
        sync_filesystem(fd)
    finally:
        os.close(fd)


@dataclass(slots=True)
class _Step:
    """One file's change in the placing phase: its folder (an O_PATH fd), its temporary, and where the
    earlier file went (`aside`: kept until the whole set is placed, so a conflict can undo it)."""

    change: Change
    folder: int
    name: str
    temporary: str | None = None
    aside: str | None = None
    done: bool = False
    seen: tuple[int, int, int] | None = None
    """The file swapped out as it was checked (size, mtime, ctime): compared again right before it is removed."""


class _Placing:
    """The files of a set placed with the smallest window the kernel allows (docs/security-model.md):
    each new content staged to a temporary in its folder first (all of them, then one syncfs), then
    each file swapped in at once (renameat2 RENAME_EXCHANGE; RENAME_NOREPLACE for an added one; a
    deleted one renamed aside) and the file swapped out checked to be still what the run began with.
    A file a person saved after the check is swapped back, and every file placed before it too:
    nothing of the set is applied (`changes_conflict`)."""

    def __init__(self, workspace_fd: int, new_token: Callable[[], str]) -> None:
        self.workspace_fd, self.new_token = workspace_fd, new_token
        self.steps: list[_Step] = []
        self.made = 0

    def _name(self) -> str:
        self.made += 1
        return f".mcp-write-{self.new_token()}-{self.made}.tmp"  # short: a name may be 255 bytes already

    def stage(self, changes: tuple[Change, ...], deleted: frozenset[str]) -> tuple[Change, ...]:
        """Stage every file whose folder is there and stays (the rest is returned, applied after, in order)."""
        late: list[Change] = []
        for change in changes:
            parent, name = _split(change.path)
            moved = change.action is not Action.DELETED and any(p in deleted for p in _self_and_parents(change.path))
            if change.kind is not Kind.FILE or moved:
                late.append(change)
                continue
            try:
                folder = open_beneath(self.workspace_fd, parent or ".", _FOLDER)
            except FileNotFoundError:  # in a folder the set adds
                late.append(change)
                continue
            step = _Step(change, folder, name)
            self.steps.append(step)
            if change.action is not Action.DELETED:
                owner = _owner(folder, name if change.action is Action.MODIFIED else None)
                mode = (change.mode_after or 0) & PERMISSION_BITS
                step.temporary = self._name()
                _write_temporary(folder, step.temporary, change.content or b"", mode, owner)
        return tuple(late)

    def place(self) -> str | None:
        """Each staged file swapped into place and what it replaced checked; the first path that no longer
        held what the run began with, or None."""
        for step in self.steps:
            if not self._place_one(step):
                return step.change.path
        return None

    def _place_one(self, step: _Step) -> bool:
        change, folder = step.change, step.folder
        if change.action is Action.ADDED and step.temporary is not None:
            try:
                _rename_new(folder, step.temporary, step.name)
            except FileExistsError:  # made meanwhile
                return False
            step.temporary, step.done = None, True
            return True
        if change.action is Action.MODIFIED and step.temporary is not None:
            try:
                _exchange(folder, step.temporary, step.name)
            except FileNotFoundError:
                return False
            step.aside, step.temporary, step.done = step.temporary, None, True
        else:
            step.aside = self._name()
            try:
                _rename_new(folder, step.name, step.aside)
            except FileNotFoundError:
                step.aside = None
                return False
            step.done = True
        step.seen = _holds(folder, step.aside, change)
        return step.seen is not None

    def undo(self) -> None:
        """Every file placed put back as it was, last first (a conflict was found)."""
        for step in reversed([s for s in self.steps if s.done]):
            if step.change.action is Action.ADDED:
                os.unlink(step.name, dir_fd=step.folder)
            elif step.change.action is Action.MODIFIED and step.aside is not None:
                _exchange(step.folder, step.aside, step.name)
                step.temporary, step.aside = step.aside, None  # now holds the new content: removed below
            elif step.aside is not None:
                _rename_new(step.folder, step.aside, step.name)
                step.aside = None
            step.done = False

    def still_unchanged(self) -> str | None:
        """The first path whose file swapped out was written to after it was checked (an editor holding it
        open), or None: checked again right before any is removed."""
        for step in self.steps:
            if step.aside is not None and not _unchanged_since(step.folder, step.aside, step.seen):
                return step.change.path
        return None

    def commit(self) -> list[str]:
        """What was swapped out removed; the paths placed."""
        for step in self.steps:
            if step.aside is not None:
                os.unlink(step.aside, dir_fd=step.folder)
                step.aside = None
        return [step.change.path for step in self.steps]

    def close(self) -> None:
        """Temporaries left (a failure, a conflict) removed; the folders' fds closed."""
        for step in self.steps:
            for left in (step.temporary, step.aside if not step.done else None):
                if left is not None:
                    with contextlib.suppress(OSError):
                        os.unlink(left, dir_fd=step.folder)
            os.close(step.folder)
        self.steps = []


def _exchange(folder: int, first: str, second: str) -> None:
    """renameat2 RENAME_EXCHANGE; where the filesystem lacks it, `second` kept aside by a hard link and
    `first` renamed over it (the same outcome, in two steps)."""
    try:
        exchange(folder, first, second)
    except UnsupportedError:
        exchange_by_link(folder, first, second)


def exchange_by_link(folder: int, first: str, second: str) -> None:
    """`first` and `second` swapped in three steps: `second` kept by a hard link, `first` renamed over it."""
    keep = f"{first}.old"
    os.link(second, keep, src_dir_fd=folder, dst_dir_fd=folder, follow_symlinks=False)
    os.rename(first, second, src_dir_fd=folder, dst_dir_fd=folder)
    os.rename(keep, first, src_dir_fd=folder, dst_dir_fd=folder)


def _rename_new(folder: int, old: str, new: str) -> None:
    """renameat2 RENAME_NOREPLACE; where the filesystem lacks it, a hard link (which never replaces) and an unlink."""
    try:
        rename_new(folder, old, new)
    except UnsupportedError:
        rename_new_by_link(folder, old, new)


def rename_new_by_link(folder: int, old: str, new: str) -> None:
    """`old` renamed to `new` without replacing one, by a hard link (EEXIST when `new` is there) and an unlink."""
    os.link(old, new, src_dir_fd=folder, dst_dir_fd=folder, follow_symlinks=False)
    os.unlink(old, dir_fd=folder)


def _holds(folder: int, name: str, change: Change) -> tuple[int, int, int] | None:
    """The size, mtime and ctime of `name` in `folder` when it is a regular file with the mode, size and
    sha256 the run began with; None when it is not."""
    try:
        reader = os.open(name, _READ, dir_fd=folder)
    except OSError:
        return None
    try:
        info = os.fstat(reader)
        if not stat.S_ISREG(info.st_mode) or info.st_mode & PERMISSION_BITS != change.mode_before:
            return None
        if info.st_size != change.size_before:
            return None
        if hashlib.sha256(read_at_most(reader, info.st_size + 1)).hexdigest() != change.sha256_before:
            return None
        return _stamp(info)
    finally:
        os.close(reader)


def _stamp(info: os.stat_result) -> tuple[int, int, int]:
    return info.st_size, info.st_mtime_ns, info.st_ctime_ns


def _unchanged_since(folder: int, name: str, seen: tuple[int, int, int] | None) -> bool:
    """Whether the file swapped out is as it was checked: nobody wrote into it through an fd opened before."""
    try:
        return seen is None or _stamp(os.stat(name, dir_fd=folder, follow_symlinks=False)) == seen
    except OSError:
        return False


def _self_and_parents(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]


def _in_order(changes: tuple[Change, ...]) -> list[Change]:
    """Deletions first (files, then folders deepest first: a path may change kind), then folders made
    (parents first), files written, folder modes."""

    def depth(change: Change) -> int:
        return change.path.count("/")

    deleted_files = [c for c in changes if c.kind is Kind.FILE and c.action is Action.DELETED]
    deleted_folders = sorted(
        (c for c in changes if c.kind is Kind.FOLDER and c.action is Action.DELETED), key=depth, reverse=True
    )
    added_folders = sorted((c for c in changes if c.kind is Kind.FOLDER and c.action is Action.ADDED), key=depth)
    files = [c for c in changes if c.kind is Kind.FILE and c.action is not Action.DELETED]
    modes = [c for c in changes if c.kind is Kind.FOLDER and c.action is Action.MODIFIED]
    return [*deleted_files, *deleted_folders, *added_folders, *files, *modes]


def _split(path: str) -> tuple[str, str]:
    parent, _, name = path.rpartition("/")
    return parent, name


def _lstat(workspace_fd: int, path: str) -> os.stat_result | None:
    """What `path` is beneath the workspace (not following a last link), None when absent; raises OSError on a link on the way."""
    parent, name = _split(path)
    try:
        folder = open_beneath(workspace_fd, parent or ".", _FOLDER)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return None
        raise
    try:
        return os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return None
    finally:
        os.close(folder)


def _still_as_it_was(workspace_fd: int, change: Change, deleted: frozenset[str]) -> bool:
    """Whether the workspace still holds what the run began with at `change.path`.

    An addition at (or beneath) a path the set deletes first is judged by that deletion's own check."""
    if change.action is Action.ADDED and any(p in deleted for p in _self_and_parents(change.path)):
        return True
    try:
        info = _lstat(workspace_fd, change.path)
    except OSError:
        return False  # a link or a file where a folder was on the way: not what the run saw
    if change.action is Action.ADDED:
        return info is None or (change.kind is Kind.FOLDER and stat.S_ISDIR(info.st_mode))
    if info is None:
        return False
    if change.kind is Kind.FOLDER:
        if change.action is Action.DELETED:  # it must hold nothing the set does not delete too
            return stat.S_ISDIR(info.st_mode) and _holds_only(workspace_fd, change.path, deleted)
        return stat.S_ISDIR(info.st_mode) and info.st_mode & PERMISSION_BITS == change.mode_before
    if change.sha256_before is None:  # what was copied is not known (decision 82): nothing can show it is still there
        return False
    if not stat.S_ISREG(info.st_mode) or info.st_mode & PERMISSION_BITS != change.mode_before:
        return False
    if info.st_size != change.size_before:
        return False
    return _sha256(workspace_fd, change.path, info.st_size) == change.sha256_before


def _holds_only(workspace_fd: int, path: str, deleted: frozenset[str]) -> bool:
    try:
        folder = open_beneath(workspace_fd, path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return all(f"{path}/{name}" in deleted for name in os.listdir(folder))
    finally:
        os.close(folder)


def _sha256(workspace_fd: int, path: str, size: int) -> str | None:
    try:
        reader = open_beneath(workspace_fd, path, _READ)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(reader).st_mode):
            return None
        return hashlib.sha256(read_at_most(reader, size + 1)).hexdigest()
    finally:
        os.close(reader)


def _folder_fd(workspace_fd: int, parent: str) -> int:
    """An O_PATH fd on `parent` beneath the workspace, each missing folder made on the way, no link followed."""
    fd = os.open(".", _FOLDER, dir_fd=workspace_fd)
    try:
        for part in (p for p in parent.split("/") if p):
            try:
                inner = open_beneath(fd, part, _FOLDER)
            except FileNotFoundError:
                owner = _owner(fd, None)
                os.mkdir(part, 0o755, dir_fd=fd)
                if owner is not None:
                    os.chown(part, *owner, dir_fd=fd, follow_symlinks=False)
                inner = open_beneath(fd, part, _FOLDER)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def _owner(folder: int, name: str | None) -> tuple[int, int] | None:
    """Whose a written entry is to be (root only; None: the gateway's own): `name`'s owner and group
    when it is there already, else the folder's."""
    if os.geteuid() != 0:
        return None
    if name is not None:
        with contextlib.suppress(FileNotFoundError):
            info = os.stat(name, dir_fd=folder, follow_symlinks=False)
            return info.st_uid, info.st_gid
    info = os.fstat(folder)
    return info.st_uid, info.st_gid


def _apply_one(workspace_fd: int, change: Change, new_token: Callable[[], str]) -> None:
    parent, name = _split(change.path)
    folder = _folder_fd(workspace_fd, parent)
    try:
        mode = (change.mode_after or 0) & PERMISSION_BITS
        if change.kind is Kind.FOLDER:
            if change.action is Action.ADDED:
                owner = _owner(folder, None)
                with contextlib.suppress(FileExistsError):  # the check found a folder already there
                    os.mkdir(name, mode, dir_fd=folder)
                    if owner is not None:
                        os.chown(name, *owner, dir_fd=folder, follow_symlinks=False)
                _chmod_folder(folder, name, mode)
            elif change.action is Action.DELETED:
                os.rmdir(name, dir_fd=folder)
            else:
                _chmod_folder(folder, name, mode)
        elif change.action is Action.DELETED:
            os.unlink(name, dir_fd=folder)
        else:
            owner = _owner(folder, name if change.action is Action.MODIFIED else None)
            _write_atomically(folder, name, change.content or b"", mode, new_token(), owner=owner)
    finally:
        os.close(folder)


def _chmod_folder(folder: int, name: str, mode: int) -> None:
    fd = open_beneath(folder, name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _write_atomically(
    folder: int, name: str, content: bytes, mode: int, token: str, *, owner: tuple[int, int] | None
) -> None:
    """A file in a folder the set made: written to a temporary, then renamed to `name` without replacing one."""
    temporary = f".mcp-write-{token}.tmp"  # short: `name` may be 255 bytes already
    _write_temporary(folder, temporary, content, mode, owner)
    try:
        _rename_new(folder, temporary, name)
    except BaseException:
        os.unlink(temporary, dir_fd=folder)
        raise


def _write_temporary(folder: int, temporary: str, content: bytes, mode: int, owner: tuple[int, int] | None) -> None:
    """`content` in a new file `temporary` (O_EXCL), its owner then its mode; synced later with the rest."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temporary, flags, 0o600, dir_fd=folder)
    try:
        view = memoryview(content)
        while view:
            view = view[os.write(fd, view) :]
        if owner is not None:
            os.fchown(fd, *owner)  # before the mode: a chown may clear mode bits
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        os.unlink(temporary, dir_fd=folder)
        raise
    os.close(fd)
