"""What a writing run changed in its copy of the workspace, as one frozen value (decisions 78, 82).

`read_changes(view, originals, rules)` walks the run's copy (sandbox/backends/view.py) once the
run is over and the copy frozen, and compares it with what was copied (sandbox/workspace_copy.py
`Originals`): folders and regular files added, modified or deleted, each with its hashes, sizes
and modes and, for what is to be written, its content. What cannot be applied is listed as
refused with why: symlinks (anywhere, to anywhere), hard links, devices, FIFOs, sockets,
setuid/setgid bits, protected paths (and anything named `.git` or beneath one), anything in a
folder git would take for a repository (it holds a `HEAD`), what the run could not read (never
read here, nor named beneath a folder it could not read), and modes that add write for others
(decision 80, "Reviewed"); with `ChangeRules.git_data`, git's data in the workspace's own `.git` is
no protected path (sandbox/git_data.py, decision 83). Past `max_files` changes or `max_bytes` of content the walk
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
import functools
import hashlib
import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from sandbox.beneath import open_beneath
from sandbox.git_data import HEAD_HOLDERS, is_git_data
from sandbox.workspace_copy import (
    MAX_DEPTH,
    PERMISSION_BITS,
    RACY_NS,
    Kind,
    Original,
    Originals,
    Owner,
    hash_if_unchanged,
)

MIB = 1024 * 1024
DEFAULT_MAX_FILES = 1000
DEFAULT_MAX_BYTES = 16 * MIB
DEFAULT_PROTECTED = (".git/hooks", ".git/config", ".mcp.json", ".vscode", ".claude", ".cursor", ".envrc")
GIT_FOLDER = ".git"
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
TEXT_PROBE = 8192


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
    GIT_DIRECTORY = "git_directory"
    """In (or itself) a folder holding a `HEAD`, before or after the run: git reads such a folder as a repository
    (a bare one, or a `.git` a `gitdir:` file names), its `config`, `commondir` and `hooks` included (`git_folders`)."""
    NOT_READABLE = "not_readable_by_the_run"
    """An entry the run could not read (not its own, not readable by others, or beneath such a folder), or a folder
    holding one: its change is neither applied nor shown, and nothing beneath it is named (`_Walk._hidden_entry`)."""
    WRITABLE = "group_or_world_writable"
    """A mode that adds write for others, or for the group where the file (or the folder an added entry lands in)
    had none (`adds_write_bits`): apply such a mode in the workspace yourself if it is meant."""


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
    git_data: bool = False
    """Whether git's data in the workspace's own repository may change (sandbox/git_data.py `is_git_data`: objects,
    refs, logs, index, HEAD, the state files; never config, hooks, commondir, info/, alternates, a new name): only
    beneath a `.git` folder the workspace had at its root as a real folder, only what the policy's list leaves,
    each file's content and mode checked. An upstream server's sync (a git server commits, decision 83); a declared
    tool's run keeps False."""
    racy_ns: int = RACY_NS
    """The copy's racy window (sandbox/workspace_copy.py `RACY_NS`). No policy key sets it; a test shortens it to
    copy the files it made a moment before as past the window, where it would otherwise wait two seconds."""

    def __post_init__(self) -> None:
        if self.max_files < 1 or self.max_bytes < 0 or self.max_copy_files < 1 or self.max_copy_bytes < 0:
            raise ValueError("max_change_files and the copy's files must be at least 1, the bytes not negative")
        if self.racy_ns < 0:
            raise ValueError("the copy's racy window is not negative")
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


_IGNORED_BY_HFS = dict.fromkeys([*range(0x200C, 0x2010), *range(0x202A, 0x202F), *range(0x206A, 0x2070), 0xFEFF])
"""Code points HFS+ drops from a name (git's is_hfs_dotgit): `.g\u200cit` is `.git` on a Mac the tree is synced to."""


def is_dot_git(name: str) -> bool:
    """Whether git, or a filesystem that folds case, drops trailing dots and spaces or ignores some code
    points (ext4's casefold folders, vfat, NTFS and its 8.3 short name, HFS+), could take `name` for `.git`."""
    return name.translate(_IGNORED_BY_HFS).casefold().rstrip(". ") in (".git", "git~1")


def is_protected(path: str, protected: tuple[str, ...]) -> bool:
    """Whether `path` is a protected path or lies beneath one, at the workspace's root or in any folder
    beneath it (`.envrc` and `.vscode` act wherever a person opens or enters a folder; compared
    component-wise, case as given), or is a `.git` entry or beneath one, at any depth, whatever the
    policy lists: git obeys a `.git` folder's `config`, `commondir`, `hooks`, `info/attributes`,
    `worktrees/` and `modules/`, and a `.git` file's `gitdir:` line (decision 78)."""
    return is_listed(path, protected) or is_in_dot_git(path)


def is_listed(path: str, protected: tuple[str, ...]) -> bool:
    """Whether `path` is one of the `protected` paths or lies beneath one, in any folder (is_protected)."""
    parts = _parts(path)
    listed, first_names = _split_protected(protected)
    if first_names.isdisjoint(parts) and () not in listed:  # no protected path can start in `path`
        return False
    for guarded in listed:
        size = len(guarded)
        if any(parts[start : start + size] == guarded for start in range(len(parts) - size + 1)):
            return True
    return False


@functools.lru_cache(maxsize=32)
def _split_protected(protected: tuple[str, ...]) -> tuple[tuple[tuple[str, ...], ...], frozenset[str]]:
    """`protected`'s paths as components, and their first components (a policy's list, parsed once: a change
    set's read asks about every entry the run changed, 1,000 times a set measured 2 ms of 10 parsing it)."""
    listed = tuple(map(_parts, protected))
    return listed, frozenset(guarded[0] for guarded in listed if guarded)


def is_in_dot_git(path: str) -> bool:
    """Whether `path` is a `.git` entry or lies beneath one, in any spelling a filesystem may fold (is_dot_git)."""
    folded = path.translate(_IGNORED_BY_HFS).casefold()  # one look at the whole path first: most have no "git"
    return "git" in folded and any(is_dot_git(part) for part in _parts(path))


def is_protected_change(change: Change, protected: tuple[str, ...], *, git_data: bool = False) -> bool:
    """Whether `change` touches a protected path (is_protected), unless `git_data` and it is a change of git's data
    in the workspace's own `.git` the policy does not list (sandbox/git_data.py; the caller has checked that `.git`
    is the workspace's own folder, read_changes `_Walk.own_git`)."""
    if not is_protected(change.path, protected):
        return False
    if not git_data or is_listed(change.path, protected) or is_in_dot_git("/".join(_parts(change.path)[1:])):
        return True  # a `.git` again beneath the own one (`refs/heads/.g\u200cit` on HFS+): a repository in git's data
    deleted = change.action is Action.DELETED
    mode = None if deleted else change.mode_after
    modified = change.action is Action.MODIFIED
    return not is_git_data(change.path, change.kind, mode, change.content, deleted=deleted, modified=modified)


def git_folders(present: Iterable[str]) -> frozenset[str]:
    """The folders among `present` (relative paths) that hold an entry named `HEAD` (any case): git takes a
    folder with a `HEAD`, and `objects` and `refs` there or in its `commondir`, for a repository (a bare
    one, found from any folder beneath it), so nothing in one may change (Refusal.GIT_DIRECTORY)."""
    split = (entry.rpartition("/") for entry in present)
    return frozenset(folder for folder, _, name in split if name.casefold() == "head")


def adds_write_bits(change: Change, folder_mode: int | None) -> bool:
    """Whether `change` gives write to others where its entry had none (an added one had none), or to the
    group where it had none (for an added entry: where the folder it lands in, `folder_mode` as copied,
    had none; None: not known, so none)."""
    if change.mode_after is None or change.action is Action.DELETED:
        return False
    had = (change.mode_before if change.action is Action.MODIFIED else (folder_mode or 0) & 0o070) or 0
    return bool(change.mode_after & ~had & 0o022)


def guarding_folders(
    present: Iterable[str], protected: tuple[str, ...], deletable: Callable[[str], bool] = lambda _: False
) -> frozenset[str]:
    """The folders among whose contents `present` (the workspace's entries, as copied) has a protected path
    (one `deletable` does not let go: git's data under `ChangeRules.git_data`): none of them can be deleted
    without deleting that."""
    found: set[str] = set()
    for entry in present:
        if is_protected(entry, protected) and not deletable(entry):
            parts = _parts(entry)
            found.update("/".join(parts[:end]) for end in range(1, len(parts)))
    return frozenset(found)


def read_changes(
    view_fd: int,
    originals: Originals,
    rules: ChangeRules,
    workspace_fd: int,
    *,
    run_owner: Owner | None = None,
) -> ChangeSet:
    """The change set of the frozen copy under `view_fd` against `originals` (what it was copied from
    `workspace_fd`, the pinned workspace).

    Each modified or deleted file's present content in the workspace is kept for the diff when it
    still holds what was copied (`_with_before`). `run_owner` is the one copy_workspace was given: the
    run's uid, which could read what was given to it and what others may read; None, the run had the
    gateway's uid and could read all that was copied."""
    walk = _Walk(originals, rules, workspace_fd)
    root = os.open(".", _DIR, dir_fd=view_fd)
    try:
        walk.judge_as(run_owner, root, workspace_fd)
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
    """Each modified or deleted file's earlier content for the diff, from the workspace when it still has
    `sha256_before` (read already while it was hashed, `read_before`, or read now): smallest first, at most
    `budget` bytes in all (a budget of its own, besides the new content's), and none for a file whose new
    content a diff could not show. What is not read is said in the patch (sandbox/patch.py `not_shown`),
    never taken for a conflict."""
    wanted = sorted((i for i, c in enumerate(changes) if _wants_before(c)), key=lambda i: changes[i].size_before or 0)
    kept = list(changes)
    for index in wanted:
        change = changes[index]
        size = change.size_before or 0
        if size > budget:
            break
        before = read_before.get(change.path)  # hashed as it was read: `sha256_before` is its hash (_sha256_before)
        if before is None:
            before = _read_workspace(workspace_fd, change.path, size)
            if before is not None and hashlib.sha256(before).hexdigest() != change.sha256_before:
                before = None
        if before is not None:
            budget -= size
            kept[index] = dataclasses.replace(change, content_before=before)
    return tuple(kept)


def _wants_before(change: Change) -> bool:
    if change.kind is not Kind.FILE or change.sha256_before is None or change.sha256_before == change.sha256_after:
        return False
    return change.content is None or is_text(change.content)


def is_text(content: bytes) -> bool:
    """Whether a diff shows `content`: UTF-8 with no NUL in its first 8 KiB."""
    if b"\0" in content[:TEXT_PROBE]:
        return False
    try:
        content.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


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
        own = originals.get(GIT_FOLDER)
        self.own_git = rules.git_data and own is not None and own.kind is Kind.FOLDER
        """git's data may change (ChangeRules.git_data), and the workspace had `.git` at its root as a real folder."""
        self._guarding: frozenset[str] | None = None
        self._children: dict[str, list[str]] | None = None
        self.run_uid: int | None = None
        """The uid whose rights judge what the run could read (None: it could read all that was copied)."""
        self._hiding_folders: frozenset[str] | None = None
        self.git_before = git_folders(originals)
        self._root = -1
        self._git_after: dict[str, bool] = {}
        self._root_mode: int | None = None
        self.root_hidden = False
        """The run could not enter its copy's root: nothing in it was the run's to change."""

    def _deletable_git_data(self, path: str) -> bool:
        original = self.originals[path]
        change = Change(path, Action.DELETED, original.kind, None, None, None, None, original.mode, None)
        return self.own_git and not is_protected_change(change, self.rules.protected, git_data=True)

    def judge_as(self, run_owner: Owner | None, root: int, workspace_fd: int | None) -> None:
        """What the run could read, from the copy's root (`root`) and `run_owner` (read_changes)."""
        self._root = root
        if workspace_fd is not None:
            self._root_mode = os.fstat(workspace_fd).st_mode & PERMISSION_BITS
        if self.own_git:  # the workspace's own .git, still a real folder in the copy (not a `gitdir:` file now)
            try:
                self.own_git = stat.S_ISDIR(os.stat(GIT_FOLDER, dir_fd=root, follow_symlinks=False).st_mode)
            except FileNotFoundError:
                self.own_git = False
        if run_owner is None:
            return
        self.run_uid = run_owner.uid
        self.root_hidden = not self._readable(os.fstat(root))

    def _was_hidden(self, original: Original) -> bool:
        """Whether the run could not read this copied entry itself (its folders aside): copy_workspace gave it
        only what others may read."""
        return self.run_uid is not None and (self.root_hidden or not _readable_by_others(original))

    def _readable(self, info: os.stat_result) -> bool:
        """Whether the run's uid could read an entry of the copy as it is now (its own, which it could chmod,
        or readable by others; a folder readable and searchable)."""
        if self.run_uid is None or info.st_uid == self.run_uid:
            return True
        wanted = 0o005 if stat.S_ISDIR(info.st_mode) else 0o004
        return info.st_mode & wanted == wanted

    def _hidden_at(self, path: str) -> str | None:
        """The copied entry, `path` or a folder above it, the run could not read (the topmost), or None."""
        if self.run_uid is None:
            return None
        parts = _parts(path)
        return next(
            (above for above in ("/".join(parts[:end]) for end in range(1, len(parts) + 1))
             if self._was_hidden(self.originals[above])),
            None,
        )  # fmt: skip

    def _hiding(self, folder: str) -> bool:
        """Whether the copied folder held an entry the run could not read (its deletion would delete that);
        the set is made at the first folder deleted by a run that could not read everything."""
        if self.run_uid is None:
            return False
        if self._hiding_folders is None:
            self._hiding_folders = frozenset(
                "/".join(_parts(path)[:end])
                for path, was in self.originals.items()
                if self._was_hidden(was)
                for end in range(1, len(_parts(path)))
            )
        return folder in self._hiding_folders

    def _in_git_folder(self, path: str, kind: Kind) -> bool:
        """Whether `path` (a folder), or a folder above it, holds a `HEAD` as copied or in the copy now
        (git_folders; the walk notes each folder it lists, an added one is listed here first)."""
        parts = _parts(path)
        for end in range(len(parts) + (kind is Kind.FOLDER)):
            folder = "/".join(parts[:end])
            if self.own_git and folder in HEAD_HOLDERS and len(parts) > 1:
                continue  # the own .git's `HEAD` and `logs/HEAD`: what is beneath is judged by is_git_data
            if folder in self.git_before or self._holds_head(folder):
                return True
        return False

    def _holds_head(self, folder: str) -> bool:
        if folder not in self._git_after:
            try:
                fd = open_beneath(self._root, folder or ".", _DIR)
            except OSError:  # not a folder of the copy now (deleted, a file): judged as copied
                self._git_after[folder] = False
            else:
                try:
                    self._git_after[folder] = any(name.casefold() == "head" for name in os.listdir(fd))
                finally:
                    os.close(fd)
        return self._git_after[folder]

    def _folder_mode(self, path: str) -> int | None:
        """The mode, as copied, of the folder `path` is added to (the nearest one copied above it)."""
        parts = _parts(path)
        for end in range(len(parts) - 1, 0, -1):
            original = self.originals.get("/".join(parts[:end]))
            if original is not None:
                return original.mode
        return self._root_mode

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
            git = {"/".join(_parts(f)[:end]) for f in self.git_before for end in range(1, len(_parts(f)) + 1)}
            self._guarding = guarding_folders(self.originals, self.rules.protected, self._deletable_git_data) | git
        return path in self._guarding

    def _add(self, change: Change) -> None:
        if is_protected_change(change, self.rules.protected, git_data=self.own_git):
            self._refuse(change.path, Refusal.PROTECTED)
            return
        if self._in_git_folder(change.path, change.kind):
            self._refuse(change.path, Refusal.GIT_DIRECTORY)
            return
        if adds_write_bits(change, self._folder_mode(change.path)):
            self._refuse(change.path, Refusal.WRITABLE)
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
        names = sorted(os.listdir(fd))
        self._git_after[prefix.removesuffix("/")] = any(name.casefold() == "head" for name in names)
        for name in names:
            path = f"{prefix}{name}"
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            original = self.originals.get(path)
            if (
                original is not None
                and original.copy_ctime_ns == info.st_ctime_ns
                and original.copy_ino == info.st_ino
                and original.kind is Kind.FILE
            ):  # untouched (most of a workspace): a link, a chmod or a write would have moved its ctime. Tested
                # before `_hidden_entry`, which ends an untouched file the run could not read the same way (seen,
                # nothing refused, nothing read): 2,000 of its calls a read of the bench's project (decision 101)
                self.seen.add(path)
                continue
            if self._hidden_entry(fd, name, path, info, depth):
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

    def _hidden_entry(self, fd: int, name: str, path: str, info: os.stat_result, depth: int) -> bool:
        """Whether the entry at `path` was one the run could not read, as copied or as it is now (a folder it
        could not read renamed there): then it is refused if anything of it changed, and neither read,
        shown nor applied, nor anything beneath it named (the run never learnt those names)."""
        original = self.originals.get(path)
        was_hidden = self.root_hidden or (original is not None and self._was_hidden(original))
        if not was_hidden and self._readable(info):
            return False
        self.seen.add(path)
        if original is not None and original.kind is Kind.FOLDER:
            self.seen.update(self._beneath(path))
        same = original is not None and (original.copy_ino, original.copy_ctime_ns) == (info.st_ino, info.st_ctime_ns)
        if same and stat.S_ISDIR(info.st_mode):
            same = not self._changed_beneath(fd, name, path, depth + 1)
        if not same:
            self._refuse(path, Refusal.NOT_READABLE)
        return True

    def _changed_beneath(self, fd: int, name: str, path: str, depth: int) -> bool:
        """Whether anything beneath the folder `path` differs from the copy as made: its names, an inode, a ctime
        (the gateway lists and stats it; nothing of it is read or named)."""
        if depth >= MAX_DEPTH:
            return True
        inner = os.open(name, _DIR, dir_fd=fd)
        try:
            names = os.listdir(inner)
            if {f"{path}/{child}" for child in names} != set(self._index().get(path, ())):
                return True
            for child in names:
                info = os.stat(child, dir_fd=inner, follow_symlinks=False)
                original = self.originals[f"{path}/{child}"]
                if (original.copy_ino, original.copy_ctime_ns) != (info.st_ino, info.st_ctime_ns):
                    return True
                if stat.S_ISDIR(info.st_mode) and self._changed_beneath(inner, child, f"{path}/{child}", depth + 1):
                    return True
            return False
        finally:
            os.close(inner)

    def _file(self, fd: int, name: str, path: str, info: os.stat_result, before: Original | None) -> None:
        mode = info.st_mode & PERMISSION_BITS
        digest_before = None if before is None else self._sha256_before(path, before)
        # Touched, perhaps rewritten as it was: hashed in chunks first, so a file the run only touched is
        # never held whole, whatever its size.
        same_size = before is not None and (before.size, before.mode) == (info.st_size, mode)
        if same_size and digest_before is not None and _sha256_of(fd, name, info) == digest_before:
            self._unread(path)
            return
        # Judged by st_size before a byte is read: a sparse file of any size costs one fstat.
        if self.bytes + info.st_size > self.rules.max_bytes:
            raise _TooLargeStop(TooLarge.BYTES)
        content = _read(fd, name, info)
        digest = hashlib.sha256(content).hexdigest()
        if before is None:
            self._add(Change(path, Action.ADDED, Kind.FILE, None, digest, None, len(content), None, mode, content))
            return
        if digest_before != digest or before.mode != mode:  # unknown before: listed, and a conflict when applied
            change = Change(
                path, Action.MODIFIED, Kind.FILE, digest_before, digest, before.size, len(content), before.mode, mode,
                content,
            )  # fmt: skip
            self._add(change)

    def _unread(self, path: str) -> None:
        """Give back the budget of a workspace file read for a diff that will not be shown (no change)."""
        content = self.read_before.pop(path, None)
        if content is not None:
            self._read_budget += len(content)

    def _index(self) -> dict[str, list[str]]:
        """Each copied folder's entries (built once, when first needed)."""
        if self._children is None:
            self._children = {}
            for entry in self.originals:
                self._children.setdefault(entry.rpartition("/")[0], []).append(entry)
        return self._children

    def _beneath(self, path: str) -> list[str]:
        """What the copy held beneath the folder `path`."""
        children = self._index()
        found, waiting = [], [path]
        while waiting:
            for child in children.get(waiting.pop(), ()):
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
        hidden = self._hidden_at(path)
        if hidden is not None:
            if hidden == path:  # its name the run could list; anything beneath it, never
                self._refuse(path, Refusal.NOT_READABLE)
            return
        original = self.originals[path]
        if original.kind is Kind.FOLDER and self._hiding(path):
            self._refuse(path, Refusal.NOT_READABLE)
            return
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


def _readable_by_others(original: Original) -> bool:
    """What copy_workspace gives the run's uid (`_Copier.give`): a file readable by others, a folder readable
    and searchable by them; a symlink is only its target's name."""
    if original.kind is Kind.SYMLINK:
        return True
    wanted = 0o005 if original.kind is Kind.FOLDER else 0o004
    return original.mode & wanted == wanted


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


def _opened(fd: int, name: str, info: os.stat_result) -> int:
    """`name` opened without following a link, checked to be the inode walked to."""
    reader = os.open(name, _READ, dir_fd=fd)
    opened = os.fstat(reader)
    if opened.st_ino != info.st_ino or not stat.S_ISREG(opened.st_mode):
        os.close(reader)
        raise OSError(116, "replaced while read", name)  # ESTALE: the copy is frozen, so never expected
    return reader


def _read(fd: int, name: str, info: os.stat_result) -> bytes:
    """The file's content (at most the size it was walked with)."""
    reader = _opened(fd, name, info)
    try:
        return read_at_most(reader, info.st_size)
    finally:
        os.close(reader)


def _sha256_of(fd: int, name: str, info: os.stat_result) -> str:
    """The sha256 of the file's first `st_size` bytes, read 1 MiB at a time: never held whole."""
    reader = _opened(fd, name, info)
    try:
        digest, left = hashlib.sha256(), info.st_size
        while left > 0:
            chunk = os.read(reader, min(left, 1 << 20))
            if not chunk:
                break
            digest.update(chunk)
            left -= len(chunk)
        return digest.hexdigest()
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
