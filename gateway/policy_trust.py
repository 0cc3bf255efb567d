"""Which policy file the gateway acts on (decision 42): one nobody but its own user or root could write.

The policy decides what agents may do, so it must come from the person who runs the gateway:
not from the agent it governs, nor from another user of the host. Before the file is read,
every directory entry the kernel passes through to reach it (each folder from `/`, each
symbolic link on the way, the file itself) must belong to the gateway's user or root, and none
may be writable by anyone else: not by a group with other members, not by every user (a
folder with the sticky bit, like /tmp, is fine: others may add entries to it but not replace
ours). After parsing, no entry on the way may lie inside a workspace the policy names, since
the agent's tools write there. Each refusal names the entry, who could write it, and the fix.

What this cannot see: a process running as the gateway's own user (an agent with an
unrestricted shell under the same account) can write whatever that user can; that is what the
permission rules and the approver are for (docs/security-model.md).
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gateway.errors import ConfigError
from gateway.policy import Policy, load_policy
from gateway.settings import Settings

_MAX_LINKS = 40  # as the kernel's ELOOP limit
_REFUSED = "refusing this policy: "
_ACL_XATTR = "system.posix_acl_access"


@dataclass(frozen=True, slots=True)
class Entry:
    """One directory entry on the way to the policy, as lstat saw it."""

    path: Path
    uid: int
    gid: int
    mode: int
    nlink: int
    acl: bool = False
    """An extended POSIX ACL: then the group write bit is the ACL's mask, and may stand for other users."""


GroupIsPrivate = Callable[[int, int], bool]
"""(gid, owner uid) -> whether that group has no member but that owner."""


def group_is_private(gid: int, owner: int) -> bool:
    """A user-private group (Debian's and Fedora's default, umask 002): writable by it is writable by
    its owner alone. As Debian's OpenSSH reads it: no listed member but the owner, and no other account
    with it as primary group."""
    try:
        group = grp.getgrgid(gid)
        name = pwd.getpwuid(owner).pw_name
    except KeyError:
        return False
    if any(member != name for member in group.gr_mem):
        return False
    return all(account.pw_uid == owner for account in pwd.getpwall() if account.pw_gid == gid)


def entries_to(path: Path, lstat: Callable[[Path], os.stat_result] = os.lstat) -> list[Entry]:
    """Every entry the kernel passes through to reach `path` (absolute), in order, links included.

    Resolved component by component as the kernel does (`..` after a link is the link target's
    parent). Raises OSError when an entry is missing or the links loop.
    """
    if not path.is_absolute():
        raise ValueError("an absolute path is needed")

    def seen(at: Path) -> Entry:
        st = lstat(at)
        return Entry(at, st.st_uid, st.st_gid, st.st_mode, st.st_nlink, _has_acl(at, st))

    walked = [seen(Path("/"))]
    pending = list(reversed(path.parts[1:]))
    current, hops = Path("/"), 0
    while pending:
        part = pending.pop()
        if part in ("", "."):
            continue
        if part == "..":
            current = current.parent
            continue
        entry = seen(current / part)
        walked.append(entry)
        if stat.S_ISLNK(entry.mode):
            hops += 1
            if hops > _MAX_LINKS:
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(path))
            target = Path(os.readlink(entry.path))
            if target.is_absolute():
                current = Path("/")
                pending.extend(reversed(target.parts[1:]))
            else:
                pending.extend(reversed(target.parts))
            continue
        if pending and not stat.S_ISDIR(entry.mode):
            raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(entry.path))
        current = entry.path
    return walked


def _has_acl(path: Path, st: os.stat_result) -> bool:
    if stat.S_ISLNK(st.st_mode) or not st.st_mode & stat.S_IWGRP:
        return False  # only a group write bit can hide another user's write access
    try:
        return _ACL_XATTR in os.listxattr(path, follow_symlinks=False)
    except OSError:
        return False  # no extended attributes here: no ACL either


def _name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _user(uid: int) -> str:
    name = _name(uid)
    return f"{name} (uid {uid})" if name != str(uid) else f"uid {uid}"


def _group(gid: int) -> str:
    try:
        return f"{grp.getgrgid(gid).gr_name} (gid {gid})"
    except KeyError:
        return f"gid {gid}"


def writable_by_others(entry: Entry, uid: int, private: GroupIsPrivate = group_is_private) -> str | None:
    """Why someone other than `uid` or root could change what this entry leads to; None: nobody could."""
    mode = stat.S_IMODE(entry.mode)
    if entry.uid not in (uid, 0):
        return (
            f"{entry.path} belongs to {_user(entry.uid)}, who could change it; fix: `chown {_name(uid)} {entry.path}`"
            " (as root), or keep the policy in a folder of your own"
        )
    if stat.S_ISLNK(entry.mode):
        return None  # a link's own mode means nothing; replacing it needs its folder, checked on its own
    sticky = stat.S_ISDIR(entry.mode) and bool(mode & stat.S_ISVTX)
    if mode & stat.S_IWOTH and not sticky:
        return f"{entry.path} is writable by every user (mode {mode:04o}); fix: `chmod go-w {entry.path}`"
    if mode & stat.S_IWGRP and not sticky and entry.acl:
        return f"{entry.path} has an ACL that lets others write it; fix: `setfacl -b {entry.path}`"
    if mode & stat.S_IWGRP and not sticky and not private(entry.gid, entry.uid):
        return (
            f"{entry.path} is writable by group {_group(entry.gid)}, which has other members (mode {mode:04o});"
            f" fix: `chmod go-w {entry.path}`"
        )
    return None


def check_policy_location(
    path: Path, uid: int | None = None, private: GroupIsPrivate = group_is_private
) -> list[Entry]:
    """The entries on the way to the policy file, when nobody but `uid` (default: ours) or root could
    have written any of them; else ConfigError naming the entry and the fix."""
    me = os.geteuid() if uid is None else uid
    who = "root" if me == 0 else f"{_name(me)} or root"
    why = f"the gateway, running as {_user(me)}, acts only on a policy nobody but {who} could have written"
    try:
        walked = entries_to(path)
    except OSError as exc:
        raise ConfigError(f"cannot read policy file ({exc.strerror})", str(path)) from exc
    target = walked[-1]
    if not stat.S_ISREG(target.mode):
        raise ConfigError("the policy is not a regular file", str(path))
    for entry in walked:
        problem = writable_by_others(entry, me, private)
        if problem is not None:
            raise ConfigError(f"{_REFUSED}{problem} ({why})", str(path))
    if target.nlink != 1:
        raise ConfigError(
            f"{_REFUSED}the file has {target.nlink} names (hard links), and another of them may be"
            f" where others or the agent write; fix: keep one copy (`cp` it to a new file) ({why})",
            str(path),
        )
    return walked


def check_outside_workspaces(policy: Policy, walked: Sequence[Entry]) -> None:
    """ConfigError when the way to the policy goes inside a workspace it names (the agent writes there)."""
    for name, root in policy.workspaces.items():
        real_root = Path(os.path.realpath(root))
        inside = next((e.path for e in walked if real_root in e.path.parents), None)
        if inside is not None:
            raise ConfigError(
                f"{_REFUSED}{inside} is inside workspace {name!r} ({real_root}), where the agent's"
                " tools write; keep the policy outside every workspace (`mcp-gateway init` writes"
                " <home>/policy.yaml) and point --policy at it",
                str(policy.source),
            )


def load_trusted_policy(path: Path, known_tools: frozenset[str], uid: int | None = None) -> Policy:
    """`load_policy`, for a file nobody else could have written and that lies outside its workspaces."""
    walked = check_policy_location(path, uid)
    policy = load_policy(path, known_tools)
    check_outside_workspaces(policy, walked)
    return policy


def policy_for(settings: Settings, known_tools: frozenset[str]) -> Policy:
    """The policy every command acts on: the one given, else `<home>/policy.yaml`; never one in the
    working folder (an MCP client may start the gateway in the agent's project)."""
    path = settings.policy_path
    if settings.policy_given is None and not os.path.lexists(path):
        raise ConfigError(
            f"no policy found; looked at {path} (the state folder's, from --home, MCP_GATEWAY_HOME or"
            " ~/.mcp-gateway); --policy and MCP_GATEWAY_POLICY are not set, and the working folder is never"
            f" read; run `mcp-gateway --home {settings.home} init [--workspace PATH]` to write one from the"
            " shipped default, or pass --policy FILE",
            str(path),
        )
    return load_trusted_policy(path, known_tools)
