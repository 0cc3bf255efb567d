"""Whether this user can use the state folder, its database and its policy (docs/operations.md, "The state folder"), said in one line.

Another user's state folder used to read as "no policy ... run init" (the folder could not be
searched, so the policy looked absent), and `init` then ended in a PermissionError traceback.
Before a command touches its state, `check_state_access` finds the first
path it would need and cannot use: a folder on the way it may not enter, the state folder, the
SQLite database and its -wal/-shm, the signing keys, the policy, each checked for the access
the command needs, and names that path, its owner and what to do instead.
"""

from __future__ import annotations

import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from gateway.errors import CommandError
from gateway.settings import Settings

KEY_FILES = ("signing.key", "signing-rs256.pem", "signing-eddsa.pem")
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


@dataclass(frozen=True, slots=True)
class AccessProblem:
    path: Path
    owner: int
    need: str
    """What the command needs of the path, in words: `entered`, `read`, `read and written`, `owned`."""


def check_state_access(settings: Settings, *, init: bool = False) -> None:
    """Raise CommandError naming the first path the command needs and this user cannot use.

    `init` also needs to own an existing state folder: it makes the folder private (0700)."""
    problem = find_access_problem(settings, init=init)
    if problem is not None:
        raise CommandError(describe(problem))


def find_access_problem(settings: Settings, *, init: bool = False) -> AccessProblem | None:
    home = settings.home
    owner = _owner(home)
    if init and owner is not None and owner != os.geteuid() and os.geteuid() != 0:
        return _blocked_on_the_way(home) or AccessProblem(home, owner, "owned")
    wanted: list[tuple[Path, int, str]] = [(home, os.R_OK | os.W_OK | os.X_OK, "read and written")]
    wanted += [(home / name, os.R_OK, "read") for name in KEY_FILES]
    wanted.append((home / "artifacts", os.R_OK | os.W_OK | os.X_OK, "read and written"))
    database = sqlite_file(settings.db_url)
    if database is not None:
        wanted.append((database.parent, os.W_OK | os.X_OK, "written"))  # SQLite makes its -wal and -shm there
        wanted += [
            (Path(f"{database}{end}"), os.R_OK | os.W_OK, "read and written") for end in ("", *SQLITE_SIDE_FILES)
        ]
    wanted.append((settings.policy_path, os.R_OK, "read"))
    for path, mode, need in wanted:
        problem = _blocked_on_the_way(path) or _refused(path, mode, need)
        if problem is not None:
            return problem
    return None


def policy_access_problem(settings: Settings) -> AccessProblem | None:
    """Why the policy cannot be read, if this user may not reach or read it."""
    return _blocked_on_the_way(settings.policy_path) or _refused(settings.policy_path, os.R_OK, "read")


def sqlite_file(url: str) -> Path | None:
    """The file a SQLite URL names (None: another engine, or in memory)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return None
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    return Path(parsed.database)


def _owner(path: Path) -> int | None:
    try:
        return path.lstat().st_uid
    except OSError:
        return None


def _blocked_on_the_way(path: Path) -> AccessProblem | None:
    """The first folder above `path` this user may not enter (search permission), if any."""
    for folder in reversed(Path(os.path.abspath(path)).parents):
        try:
            info = folder.stat()
        except OSError:
            return None  # missing (made later), or beyond a folder reported already
        if stat.S_ISDIR(info.st_mode) and not os.access(folder, os.X_OK, effective_ids=_effective()):
            return AccessProblem(folder, info.st_uid, "entered")
    return None


def _refused(path: Path, mode: int, need: str) -> AccessProblem | None:
    try:
        info = path.stat()
    except FileNotFoundError:
        return None  # made later, where the folder above allows it
    except OSError:
        return AccessProblem(path, _owner(path) or 0, need)
    if os.access(path, mode, effective_ids=_effective()) or _bits_allow(info, mode):
        return None
    return AccessProblem(path, info.st_uid, need)


def _bits_allow(info: os.stat_result, mode: int) -> bool:
    """Whether the permission bits that apply to this user allow `mode`: then what refuses it is no
    owner's business (an immutable or append-only file, a read-only mount, root included), and the
    database's own guard names it (gateway/db/file_guard.py)."""
    me = os.geteuid()
    if me == 0:
        return True
    if info.st_uid == me:
        shift = 6
    elif info.st_gid == os.getegid() or info.st_gid in os.getgroups():
        shift = 3
    else:
        shift = 0
    return (info.st_mode >> shift) & mode == mode


def _effective() -> bool:
    return os.access in os.supports_effective_ids


def who(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid} (no account)"


def describe(problem: AccessProblem) -> str:
    """One line: the path, whose it is, what this user needs of it, and what to do."""
    me = os.geteuid()
    path, owner = problem.path, problem.owner
    if owner == me:
        try:
            mode = f"mode {stat.S_IMODE(path.stat().st_mode):04o}"
        except OSError:
            mode = "its mode"
        return (
            f"{path} is yours ({who(me)}) but cannot be {problem.need} by you ({mode}); give yourself access"
            f" (chmod u+rwX {path}), or use another state folder (--home DIR or MCP_GATEWAY_HOME)"
        )
    if problem.need == "owned":
        cannot = "init makes the state folder private (0700), which only its owner may do"
    else:
        cannot = f"it cannot be {problem.need} by you ({who(me)})"
    return (
        f"{path} belongs to {who(owner)}: {cannot}; use a state folder of your own (--home DIR or"
        f" MCP_GATEWAY_HOME, then `mcp-gateway --home DIR init`), or run this command as {who(owner)}"
    )


def describe_os_error(exc: PermissionError) -> str:
    """One line for a PermissionError that got past `check_state_access` (a file changed meanwhile)."""
    if exc.filename is None:
        return f"permission denied ({exc.strerror}); check the state folder's owner and mode"
    path = Path(os.fsdecode(exc.filename))
    owner = _owner(path)
    if owner is None:
        blocked = _blocked_on_the_way(path)
        if blocked is not None:
            return describe(blocked)
        owner = os.geteuid()
    return describe(AccessProblem(path, owner, "used"))
