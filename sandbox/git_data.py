"""Git's data in the workspace's own `.git`: what a git server's commit may change there, and nothing else (decision 83).

`is_git_data(path, kind, mode, content, deleted=...)` is the one judgement, pure: whether an entry
beneath the workspace root's `.git` folder is one of the files git keeps its data in, named as
git names it, holding what git writes there, with a mode git gives it. It is asked only for a
`ChangeRules(git_data=True)` (an upstream server's sync), only for a `.git` that was copied as a
real folder, and only after the policy's own protected list (sandbox/change_set.py): whatever it
allows is a path git reads as data (hashes, refs, messages, compressed objects), never one it
executes or takes configuration, another folder or a command from.

Allowed, beneath `.git/`: `objects/` (loose objects `XX/<hash>`, zlib; packs `pack/pack-<hash>.*`
with their magic; the commit-graph), `refs/` (each file a hash or `ref: refs/<name>`), `logs/`
(`HEAD` and `refs/...`, each line two hashes), `index` (`DIRC`), `HEAD` (a hash or `ref: refs/<name>`),
`packed-refs`, the state files `ORIG_HEAD`, `FETCH_HEAD`, `MERGE_HEAD`, `AUTO_MERGE`, `REBASE_HEAD`,
`CHERRY_PICK_HEAD`, `REVERT_HEAD` (hashes), `MERGE_MODE` (`no-ff`), `COMMIT_EDITMSG` and `MERGE_MSG`
(messages). Never: `config`, `hooks/`, `commondir`, `worktrees/`, `modules/`, `info/` (attributes
name filters), `objects/info/alternates` and `http-alternates` (other object stores), `shallow`
(it rewrites which history git shows, and no commit writes it), `sequencer/` and `rebase-*/` (their
todo lists run `exec` lines), lock and temporary files, and any name not on the list. Files are
0644 at most (git writes objects 0444), folders 0755 at most: nothing executable, nothing writable by
the group or others. Nothing of `objects/` is deleted (git deletes objects only when it packs or
prunes them, which frees space and nothing else; a set deleting a referenced one would corrupt
the history), nor is an object named by its hash modified, nor `HEAD`, `index` or git's own folders (`refs`, `logs`, `refs/heads`, ...); a
ref, a ref's folder below `refs/<kind>/`, their reflogs and the state files may be.
"""

from __future__ import annotations

import re

from sandbox.workspace_copy import Kind

GIT = ".git"
FILE_MODES = 0o644
"""A file's mode may hold these bits only (git's 0444 objects and 0644 refs, index, logs)."""
FOLDER_MODES = 0o755

_HASH = rb"(?:[0-9a-f]{40}|[0-9a-f]{64})"
_HASH_NAME = re.compile(r"[0-9a-f]{38}|[0-9a-f]{62}")
_FAN_OUT = re.compile(r"[0-9a-f]{2}")
_PACK = re.compile(r"pack-(?:[0-9a-f]{40}|[0-9a-f]{64})\.(pack|idx|rev|mtimes|bitmap|keep)")
_PACK_MAGIC = {"pack": b"PACK", "idx": b"\xfftOc", "rev": b"RIDX", "mtimes": b"MTME", "bitmap": b"BITM", "keep": b""}
_GRAPH = re.compile(r"graph-(?:[0-9a-f]{40}|[0-9a-f]{64})\.graph")
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
    return all(
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


def _is_zlib(content: bytes) -> bool:
    """A loose object: zlib's header (deflate, a window of at most 32 KiB, the check bits)."""
    return (
        len(content) >= 2
        and content[0] & 0x0F == 8
        and content[0] >> 4 <= 7
        and (content[0] << 8 | content[1]) % 31 == 0
    )


def _file_content_ok(name: str, content: bytes) -> bool:
    """Whether `content` is what git writes in the file `name` (relative to `.git`)."""
    parts = name.split("/")
    if name == "HEAD" or parts[0] == "refs":
        return _is_ref_content(content)
    if parts[0] == "logs":
        return all(_REFLOG_LINE.fullmatch(line) for line in content.splitlines(keepends=True))
    if parts[0] == "objects":
        if len(parts) == 3 and _FAN_OUT.fullmatch(parts[1]):
            return _is_zlib(content)
        if parts[1] == "pack":
            return content.startswith(_PACK_MAGIC[name.rpartition(".")[2]])
        if parts[-1] == "commit-graph-chain":
            return _HASH_LINES.fullmatch(content) is not None
        return content.startswith(b"CGPH")
    if name == "index":
        return content.startswith(b"DIRC")
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
    if parts[1] == "info":
        return parts[2:] in (["commit-graph"], ["commit-graphs", "commit-graph-chain"]) or (
            len(parts) == 4 and parts[2] == "commit-graphs" and _GRAPH.fullmatch(parts[3]) is not None
        )
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
        return name == "objects/info/commit-graphs" or (len(parts) == 2 and _FAN_OUT.fullmatch(parts[1]) is not None)
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
