"""Git's data in the workspace's own `.git`: what a git server's commit may change there, and nothing else (decision 83).

`is_git_data(path, kind, mode, content, deleted=...)` is the one judgement, pure: whether an entry
beneath the workspace root's `.git` folder is one of the files git keeps its data in, named as
git names it, holding what git writes there, with a mode git gives it. It is asked only for a
`ChangeRules(git_data=True)` (an upstream server's sync), only for a `.git` that was copied as a
real folder, and only after the policy's own protected list (sandbox/change_set.py): whatever it
allows is a path git reads as data (hashes, refs, messages, compressed objects), never one it
executes or takes configuration, another folder or a command from.

Allowed, beneath `.git/`: `objects/` (loose objects `XX/<hash>` whose inflated content hashes to
their name; packs `pack/pack-<hash>.{pack,idx,rev,mtimes,keep}` with their magic), `refs/` (each
file a hash or `ref: refs/<name>`), `logs/` (`HEAD` and `refs/...`, each line two hashes), `index`
(its checksum right, no entry marked assume-unchanged or skip-worktree), `HEAD` (a hash or `ref:
refs/<name>`), `packed-refs`, the state files `ORIG_HEAD`, `FETCH_HEAD`, `MERGE_HEAD`, `AUTO_MERGE`,
`REBASE_HEAD`, `CHERRY_PICK_HEAD`, `REVERT_HEAD` (hashes), `MERGE_MODE` (`no-ff`), `COMMIT_EDITMSG`
and `MERGE_MSG` (messages). Never: `config`, `hooks/`, `commondir`, `worktrees/`, `modules/`,
`info/` (attributes name filters, `exclude` hides files, `grafts` rewrites history),
`objects/info/alternates` and `http-alternates` (other object stores), `shallow`, `refs/replace/`,
the commit-graph and bitmaps (git trusts what they say of commits and trees: each would let the
host's `git log`, `git show` or `git status` show what the tree does not hold), `sequencer/` and
`rebase-*/` (their todo lists run `exec` lines), lock and temporary files, and any name not on the
list. Files are 0644 at most (git writes objects 0444), folders 0755 at most: nothing executable,
nothing writable by the group or others. Nothing of `objects/` is deleted (git deletes objects only
when it packs or prunes them, which frees space and nothing else; a set deleting a referenced one
would corrupt the history), nor is an object named by its hash modified, nor `HEAD`, `index` or
git's own folders (`refs`, `logs`, `refs/heads`, ...); a ref, a ref's folder below `refs/<kind>/`,
their reflogs and the state files may be. A pack's objects are not checked against their names
(that takes inflating and resolving every delta): a pack is data git reads as data, and the
host's `git fsck` finds a false one.
"""

from __future__ import annotations

import hashlib
import re
import zlib

from sandbox.workspace_copy import Kind

GIT = ".git"
FILE_MODES = 0o644
"""A file's mode may hold these bits only (git's 0444 objects and 0644 refs, index, logs)."""
FOLDER_MODES = 0o755

_HASH = rb"(?:[0-9a-f]{40}|[0-9a-f]{64})"
_HASH_NAME = re.compile(r"[0-9a-f]{38}|[0-9a-f]{62}")
_FAN_OUT = re.compile(r"[0-9a-f]{2}")
_PACK = re.compile(r"pack-(?:[0-9a-f]{40}|[0-9a-f]{64})\.(pack|idx|rev|mtimes|keep)")
_PACK_MAGIC = {"pack": b"PACK", "idx": b"\xfftOc", "rev": b"RIDX", "mtimes": b"MTME", "keep": b""}
_OBJECT_HEADER = re.compile(rb"(blob|tree|commit|tag) (0|[1-9][0-9]{0,18})\x00")
INFLATE_RATIO = 32
"""A loose object may inflate to at most this many times its size (or 1 MiB): a zlib bomb costs no more."""
_REF_COMPONENT = re.compile(r"[^\x00-\x20\x7f ~^:?*\[\\./][^\x00-\x20\x7f ~^:?*\[\\/]*")
"""A component of a ref's name as git's check_refname_format allows it (minus `.`-first, `..`, `.lock`, `@{`)."""
_HASH_LINES = re.compile(rb"(?:" + _HASH + rb"\n)+")
_ONE_HASH = re.compile(_HASH + rb"\n?")
_FETCH_LINE = re.compile(_HASH + rb"\t(?:not-for-merge)?\t[^\n]*\n")
_REFLOG_LINE = re.compile(_HASH + rb" " + _HASH + rb" [^\n]*\n")
_PACKED_LINE = re.compile(_HASH + rb" refs/([^\n]+)\n|\^" + _HASH + rb"\n")
_PACKED_HEADER = re.compile(rb"# pack-refs with:[a-z\- ]*\n")

HASH_FILES = frozenset({"ORIG_HEAD", "AUTO_MERGE", "REBASE_HEAD", "CHERRY_PICK_HEAD", "REVERT_HEAD"})
"""State files holding one commit's hash."""
MESSAGES = frozenset({"COMMIT_EDITMSG", "MERGE_MSG"})
"""Messages git shows or commits, never runs nor reads a setting from."""
KEPT = frozenset({"HEAD", "index"})
"""Files git rewrites and never deletes: a change set deleting them is refused."""
OWN_FOLDERS = frozenset({
    "objects", "objects/pack", "objects/info", "refs", "refs/heads", "refs/tags", "refs/remotes", "logs", "logs/refs",
    "logs/refs/heads", "logs/refs/tags", "logs/refs/remotes",
})  # fmt: skip
"""git's own folders: added or given a mode (within FOLDER_MODES), never deleted."""
HEAD_HOLDERS = frozenset({GIT, f"{GIT}/logs"})
"""The folders of the own `.git` that hold a `HEAD` as git lays them out (`HEAD`, `logs/HEAD`): exempt from the rule
that a folder holding a `HEAD` is a repository; `logs/` can never be one (it holds no `objects`)."""


def is_ref_name(name: str) -> bool:
    """Whether `name` (after `refs/`) is a ref's name git could have written: `/`-separated components, none
    starting with `.`, none ending with `.` or `.lock`, no `..`, `@{`, control character, space or `~^:?*[\\`."""
    parts = name.split("/")
    return parts[0] != "replace" and all(
        _REF_COMPONENT.fullmatch(part) and not part.endswith((".", ".lock")) and ".." not in part and "@{" not in part
        for part in parts
    )


def _is_ref_content(content: bytes) -> bool:
    """A loose ref, or `HEAD`: one hash, or `ref: refs/<name>`, and a newline."""
    if _ONE_HASH.fullmatch(content):
        return True
    if not content.startswith(b"ref: refs/"):
        return False
    try:
        target = content.removeprefix(b"ref: refs/").removesuffix(b"\n").decode("utf-8")
    except UnicodeDecodeError:
        return False
    return bool(target) and "\n" not in target and is_ref_name(target)


def _is_packed_refs(content: bytes) -> bool:
    lines = content.splitlines(keepends=True)
    if lines and _PACKED_HEADER.fullmatch(lines[0]):
        lines = lines[1:]
    for line in lines:
        matched = _PACKED_LINE.fullmatch(line)
        if matched is None:
            return False
        name = matched.group(1)
        if name is not None and not _decodes_to_ref_name(name):
            return False
    return True


def _decodes_to_ref_name(name: bytes) -> bool:
    try:
        return is_ref_name(name.decode("utf-8"))
    except UnicodeDecodeError:
        return False


def is_loose_object(oid: str, content: bytes) -> bool:
    """Whether `content` inflates to an object (`<type> <size>\\0` and that many bytes) whose hash is `oid`
    (SHA-1 for 40 hex digits, SHA-256 for 64), inflating at most INFLATE_RATIO times its size (or 1 MiB):
    an object whose content is not its name would let `git show` display what the tree does not hold."""
    inflater = zlib.decompressobj()
    digest = hashlib.sha1(usedforsecurity=False) if len(oid) == 40 else hashlib.sha256()
    limit = max(1 << 20, INFLATE_RATIO * len(content))
    try:
        data = inflater.decompress(content, limit + 1)
    except zlib.error:
        return False
    header = _OBJECT_HEADER.match(data)
    if len(data) > limit or header is None or not inflater.eof or inflater.unused_data:
        return False
    digest.update(data)
    return len(data) - header.end() == int(header.group(2)) and digest.hexdigest() == oid


_ASSUME_VALID, _EXTENDED, _SKIP_WORKTREE = 0x8000, 0x4000, 0x4000
_NAME_MASK = 0x0FFF
_ENTRY_FIXED = 40
"""An index entry's ctime, mtime, dev, ino, mode, uid, gid and size, before its object's hash."""


def is_index_showing_all(content: bytes) -> bool:
    """Whether `content` is an index (`DIRC`, version 2, 3 or 4, ending with the SHA-1 or SHA-256 of what comes
    before, which tells the hash its entries hold, as git checks it) none of whose entries is marked
    assume-unchanged or skip-worktree: either makes `git status` and `git diff` on the host skip that file, so
    a file the server changed would show no change. An index git wrote without its checksum (`index.skipHash`)
    is refused: which hash it holds is not known."""
    if not content.startswith(b"DIRC") or len(content) < 12 + 20:
        return False
    version, count = int.from_bytes(content[4:8]), int.from_bytes(content[8:12])
    if hashlib.sha1(content[:-20], usedforsecurity=False).digest() == content[-20:]:
        hash_size = 20
    elif len(content) >= 12 + 32 and hashlib.sha256(content[:-32]).digest() == content[-32:]:
        hash_size = 32
    else:
        return False
    return version in (2, 3, 4) and _entries_show_all(content[:-hash_size], version, count, hash_size) is True


def _entries_show_all(content: bytes, version: int, count: int, hash_size: int) -> bool | None:
    """Whether every entry shows (False: one is hidden; None: not an index with hashes of `hash_size` bytes),
    each entry's length found as git's read-cache.c finds it: from the name's length in its flags."""
    at, previous = 12, 0
    for _ in range(count):
        start = at
        at += _ENTRY_FIXED + hash_size
        if at + 4 > len(content):
            return None
        flags = int.from_bytes(content[at : at + 2])
        at += 2
        if flags & _ASSUME_VALID:
            return False
        if flags & _EXTENDED:
            if version < 3 or int.from_bytes(content[at : at + 2]) & _SKIP_WORKTREE:
                return False
            at += 2
        length, kept = flags & _NAME_MASK, 0
        if version == 4:  # the name: how much of the previous one to drop (git's varint), then the rest
            dropped, at = _varint(content, at)
            kept = previous - dropped
        if length == _NAME_MASK:
            end = content.find(b"\x00", at)
            if end < 0:
                return None
            length = kept + end - at
        if kept < 0 or length < kept or at + length - kept >= len(content):
            return None
        if version == 4:
            at, previous = at + length - kept + 1, length
        else:
            at = start + ((at - start + length + 8) & ~7)
    return True if at <= len(content) else None


def _varint(content: bytes, at: int) -> tuple[int, int]:
    """git's varint.c decode_varint: the value and the offset past it."""
    value = content[at] & 0x7F if at < len(content) else 0
    while at < len(content) and content[at] & 0x80 and at < len(content) - 1:
        at += 1
        value = ((value + 1) << 7) + (content[at] & 0x7F)
    return value, at + 1


def _file_content_ok(name: str, content: bytes) -> bool:
    """Whether `content` is what git writes in the file `name` (relative to `.git`)."""
    parts = name.split("/")
    if name == "HEAD" or parts[0] == "refs":
        return _is_ref_content(content)
    if parts[0] == "logs":
        return all(_REFLOG_LINE.fullmatch(line) for line in content.splitlines(keepends=True))
    if parts[0] == "objects":
        if parts[1] == "pack":
            return content.startswith(_PACK_MAGIC[name.rpartition(".")[2]])
        return is_loose_object(parts[1] + parts[2], content)
    if name == "index":
        return is_index_showing_all(content)
    if name in HASH_FILES:
        return _ONE_HASH.fullmatch(content) is not None
    if name == "MERGE_HEAD":
        return _HASH_LINES.fullmatch(content) is not None
    if name == "FETCH_HEAD":
        return all(_FETCH_LINE.fullmatch(line) for line in content.splitlines(keepends=True))
    if name == "MERGE_MODE":
        return content in (b"", b"no-ff", b"no-ff\n")
    if name == "packed-refs":
        return _is_packed_refs(content)
    return name in MESSAGES


def _is_file_name(name: str) -> bool:
    """Whether `name` (relative to `.git`) names one of git's data files."""
    parts = name.split("/")
    if len(parts) == 1:
        return name in KEPT or name in HASH_FILES or name in MESSAGES or name in (
            "MERGE_HEAD", "FETCH_HEAD", "MERGE_MODE", "packed-refs",
        )  # fmt: skip
    if parts[0] == "refs":
        return len(parts) >= 2 and is_ref_name(name.removeprefix("refs/"))
    if parts[0] == "logs":
        return name == "logs/HEAD" or (len(parts) >= 3 and parts[1] == "refs" and is_ref_name("/".join(parts[2:])))
    if parts[0] != "objects" or len(parts) < 3:
        return False
    if len(parts) == 3 and _FAN_OUT.fullmatch(parts[1]):
        return _HASH_NAME.fullmatch(parts[2]) is not None
    if len(parts) == 3 and parts[1] == "pack":
        return _PACK.fullmatch(parts[2]) is not None
    return False


def _is_immutable(name: str) -> bool:
    parts = name.split("/")
    if len(parts) != 3 or parts[0] != "objects":
        return False
    return _FAN_OUT.fullmatch(parts[1]) is not None or (parts[1] == "pack" and not parts[2].endswith(".keep"))


def _is_folder_name(name: str, *, deleted: bool) -> bool:
    """Whether `name` (relative to `.git`) names one of git's data folders (one git itself may delete)."""
    if name in OWN_FOLDERS:
        return not deleted
    parts = name.split("/")
    if parts[0] == "objects":
        return len(parts) == 2 and _FAN_OUT.fullmatch(parts[1]) is not None
    if parts[0] == "logs" and len(parts) >= 2 and parts[1] == "refs":
        parts = parts[1:]
    return parts[0] == "refs" and len(parts) >= 2 and is_ref_name("/".join(parts[1:]))


def is_git_data(
    path: str, kind: Kind, mode: int | None, content: bytes | None, *, deleted: bool, modified: bool = False
) -> bool:
    """Whether changing the entry at `path` (workspace-relative, `/`-separated) is changing git's data in the
    workspace's own `.git`, as the module's docstring lists it: its name, its content (None: not known, so
    no), its mode; for a deletion (`deleted`), its name and kind only. An object named by its hash (a loose
    one, a pack and the files beside it but `.keep`) is only ever added (`modified`: it was there)."""
    if not path.startswith(f"{GIT}/") or "//" in path or path.endswith("/"):
        return False
    name = path.removeprefix(f"{GIT}/")
    if deleted and name.startswith("objects/"):
        return False  # git deletes objects only to pack or prune them; a set deleting one may corrupt the history
    if modified and kind is Kind.FILE and _is_immutable(name):
        return False  # its name is its content's hash: another content under it is another object
    if kind is Kind.FOLDER:
        if not _is_folder_name(name, deleted=deleted):
            return False
        return deleted or (mode is not None and mode & ~FOLDER_MODES == 0 and mode & 0o700 == 0o700)
    if kind is not Kind.FILE or not _is_file_name(name):
        return False
    if deleted:
        return name not in KEPT
    if mode is None or mode & ~FILE_MODES or not mode & 0o400 or content is None:
        return False
    return _file_content_ok(name, content)
