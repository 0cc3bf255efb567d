"""Whether the run's identity can reach a path, from permission bits alone (preflight: decision 54).

The run does not have the gateway's uid: as root, each run gets a pool uid of its own with no
supplementary groups (sandbox/backends/identity.py), so `os.access` (which answers for the
gateway) says nothing about it. `first_unreachable` walks a path from `/` and checks each
component's mode, owner and group against the run's `Access`, the way the kernel's DAC check does:
the owner's bits if the uid owns it, else the group's if its gid (or a supplementary group) is
the file's, else the others' bits; a directory on the way needs search (x), the last component
what the caller asks for.

Assumed, not checked: no POSIX ACL and no capability widens or narrows what the bits say (an
ACL granting the run access makes a false "unreachable"; one denying it is missed, and the run
then fails to start); Landlock and bubblewrap grants are the runner's business, not this check's.
Symbolic links are followed as the gateway sees them: the path as written and the path it
resolves to are both walked, so a link into a folder the run cannot search is caught.
"""

from __future__ import annotations

import os
import pwd
import stat
from dataclasses import dataclass
from enum import IntFlag
from pathlib import Path

from sandbox.backends.identity import DEFAULT_POOL


class Need(IntFlag):
    READ = 4
    WRITE = 2
    SEARCH = 1
    """x: search on a folder, execute on a file."""


@dataclass(frozen=True, slots=True)
class Access:
    """Who the run is, for DAC: its uid, its gid and its supplementary groups."""

    uid: int
    gid: int
    groups: frozenset[int] = frozenset()

    def describe(self) -> str:
        return f"uid {self.uid}"


def run_access(drops_uid: bool) -> Access:
    """The run's identity: a pool uid (gid the same, no groups) when the host drops to one, else the gateway's."""
    if drops_uid:
        return Access(DEFAULT_POOL.start, DEFAULT_POOL.start)
    return Access(os.getuid(), os.getgid(), frozenset(os.getgroups()))


@dataclass(frozen=True, slots=True)
class Unreachable:
    """The first component of `path` the run cannot get through, and why in words."""

    path: Path
    component: Path
    why: str
    fix: str


def allowed(info: os.stat_result, who: Access, need: Need) -> bool:
    """The kernel's DAC decision for `who` on a file with `info` (root: everything but a file no one may run)."""
    if who.uid == 0:
        return not (need & Need.SEARCH and stat.S_ISREG(info.st_mode) and not info.st_mode & 0o111)
    if info.st_uid == who.uid:
        bits = (info.st_mode >> 6) & 7
    elif info.st_gid == who.gid or info.st_gid in who.groups:
        bits = (info.st_mode >> 3) & 7
    else:
        bits = info.st_mode & 7
    return bits & need == need


_VERBS = {Need.READ: "read", Need.WRITE: "write", Need.SEARCH: "search"}
_CHMOD = {Need.READ: "r", Need.WRITE: "w", Need.SEARCH: "x"}


def _owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _refusal(path: Path, component: Path, info: os.stat_result, who: Access, need: Need) -> Unreachable:
    lacking = Need(need)
    verbs = " and ".join(_VERBS[n] for n in (Need.READ, Need.WRITE, Need.SEARCH) if n & lacking)
    if lacking == Need.SEARCH and stat.S_ISREG(info.st_mode):
        verbs = "execute"
    mode = stat.S_IMODE(info.st_mode)
    why = f"{component} is {mode:04o}, owned by {_owner(info.st_uid)}: the run's {who.describe()} cannot {verbs} it"
    letters = "".join(_CHMOD[n] for n in (Need.READ, Need.WRITE, Need.SEARCH) if n & lacking)
    return Unreachable(path, component, why, f"chmod {_bits_class(info, who)}+{letters} {component}")


def _bits_class(info: os.stat_result, who: Access) -> str:
    """Which of the file's permission classes applies to `who`: the one a chmod must widen."""
    if info.st_uid == who.uid:
        return "u"
    return "g" if info.st_gid == who.gid or info.st_gid in who.groups else "o"


def _walk(path: str, who: Access, last: Need) -> Unreachable | None:
    """Each prefix of the absolute `path` (links followed by stat), folders searchable, the last `last`."""
    names = [name for name in path.split("/") if name]
    prefix = ""
    for index, name in enumerate(names, 1):
        prefix = f"{prefix}/{name}"
        try:
            info = os.stat(prefix)
        except FileNotFoundError:
            return Unreachable(Path(path), Path(prefix), f"{prefix} does not exist", f"create {prefix} or fix the path")
        except OSError as exc:
            why = f"{prefix} cannot be inspected ({exc.strerror})"
            return Unreachable(Path(path), Path(prefix), why, "check the path")
        need = Need.SEARCH
        if index == len(names):
            need = Need.READ | Need.SEARCH if stat.S_ISDIR(info.st_mode) and last & Need.READ else last
        if not allowed(info, who, need):
            missing = Need(need & ~_granted(info, who))
            return _refusal(Path(path), Path(prefix), info, who, missing or need)
    return None


def _granted(info: os.stat_result, who: Access) -> int:
    return sum(n for n in (Need.READ, Need.WRITE, Need.SEARCH) if allowed(info, who, n))


def first_unreachable(path: Path, who: Access, need: Need = Need.READ, *, resolve: bool = True) -> Unreachable | None:
    """The first component of `path` (as written, then as resolved) that `who` cannot get through, or None.

    `resolve=False` walks the path as written only: for a path known to hold no link (a pinned
    one, sandbox/pinned.py), which spares `realpath`'s lstat of every component.
    """
    absolute = os.path.abspath(path)
    found = _walk(absolute, who, need)
    if found is not None or not resolve:
        return found
    resolved = os.path.realpath(absolute)
    if resolved == absolute:
        return None
    found = _walk(resolved, who, need)
    return None if found is None else Unreachable(path, found.component, found.why, found.fix)
