"""Landlock through raw syscalls: filesystem, TCP and scope rules for a child (docs/security-model.md, layer 7).

Two halves, because the rules must be applied in the child between fork and exec:

- `prepare_landlock(rules)` runs in the parent and does everything that allocates: it
  resolves the ABI, computes the handled rights, opens every granted path with
  `O_PATH | O_CLOEXEC`, builds the ctypes structures and argument objects, and looks up
  the libc function pointers.
- `PreparedLandlock.apply()` runs in the child (as `subprocess` `preexec_fn`). It imports
  nothing and builds no structures; it only calls `landlock_create_ruleset`,
  `landlock_add_rule` once per prepared fd, `prctl(PR_SET_NO_NEW_PRIVS)`,
  `landlock_restrict_self` and `close`. The only Python objects it creates are the
  integers ctypes returns and, on failure, the `OSError` it raises; an exception in
  `preexec_fn` makes `Popen` raise `SubprocessError`, so a failed layer never runs the
  command (fail closed). `preexec_fn` itself is unsafe in a threaded parent.

Landlock is allow-list only: anything beneath a granted tree is reachable. The minimum
for a Python child to start (measured) is read-only `sys.prefix` (`pyvenv.cfg`,
site-packages), `sys.base_prefix` (stdlib, the interpreter, libpython) and `/usr` (the
loader and libc); `/lib` and `/lib64` matter only where they are not symlinks into `/usr`.
`runtime_read_only_paths()` returns that set. `/etc` is NOT needed and is left out on
purpose: granting it lets a root child read `/etc/shadow`; grant single files
(`/etc/localtime`, `/etc/ssl/...`) if a suite needs them. Grant the child's cwd and a
writable TMPDIR, or pytest fails. Not covered by ABI 7: UDP, `connect()` to pathname
unix sockets, and `/proc/<pid>/environ` for a root child (the uid drop closes that).
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from sandbox.errors import SandboxStartError
from sandbox.pinned import Pinned

# x86_64 / generic syscall numbers and constants from include/uapi/linux/landlock.h.
_SYS_LANDLOCK_CREATE_RULESET = 444
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_RULE_NET_PORT = 2
_PR_SET_NO_NEW_PRIVS = 38

_FS_EXECUTE = 1 << 0
_FS_WRITE_FILE = 1 << 1
_FS_READ_FILE = 1 << 2
_FS_READ_DIR = 1 << 3
_FS_ABI_1 = (1 << 13) - 1  # EXECUTE .. MAKE_SYM
_FS_REFER = 1 << 13  # ABI 2
_FS_TRUNCATE = 1 << 14  # ABI 3
_FS_IOCTL_DEV = 1 << 15  # ABI 5
# Rights that mean something on a non-directory; any other bit in a file rule is EINVAL.
_FS_FILE_RIGHTS = _FS_EXECUTE | _FS_WRITE_FILE | _FS_READ_FILE | _FS_TRUNCATE | _FS_IOCTL_DEV
_FS_READ_ONLY = _FS_EXECUTE | _FS_READ_FILE | _FS_READ_DIR
_NET_CONNECT_TCP = 1 << 1
_NET_TCP = (1 << 0) | _NET_CONNECT_TCP  # BIND_TCP | CONNECT_TCP, ABI 4
_SCOPE_ALL = (1 << 0) | (1 << 1)  # ABSTRACT_UNIX_SOCKET | SIGNAL, ABI 6

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_prctl = _libc.prctl
_prctl.restype = ctypes.c_int
_close = _libc.close
_close.restype = ctypes.c_int


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # the uapi struct is __attribute__((packed)): 12 bytes
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPortAttr(ctypes.Structure):
    _pack_ = 1  # struct landlock_net_port_attr, packed: 16 bytes
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


@dataclass(frozen=True, slots=True)
class LandlockRules:
    read_only: tuple[Path | Pinned, ...]
    """A Pinned grant is made on its fd (the inode pinned at policy load), a Path is opened now."""
    read_write: tuple[Path, ...]
    allow_tcp: bool = False
    read_write_fds: tuple[int, ...] = ()
    """Granted by an open fd rather than a path: a mount the child will attach (scratch.ScratchSpace).
    A rule on a mount point does not reach the mount on top of it: Landlock skips mount points
    when it walks up, so the mount's own root must carry the rule."""
    late_read_write: int = 0
    """How many more read-write rules have an fd the child supplies (`PreparedLandlock.set_late_fd`): the
    scratch tmpfs a run in its own user namespace mounts itself (scratch.NamespacedScratch), and a
    writing run's copy (view.NamespacedView)."""
    connect_ports: tuple[int, ...] = ()
    """Without `allow_tcp`: the TCP ports a connect may still reach (ABI >= 4; a proxied run's PROXY_PORT,
    decision 89); no bind is granted either way."""


@dataclass(frozen=True, slots=True)
class HandledAccess:
    """What a ruleset restricts: every right of the ABI, except TCP when it is allowed."""

    fs: int
    net: int
    scoped: int

    @property
    def attr_size(self) -> int:
        """Bytes of `landlock_ruleset_attr` this ABI knows (the struct grew with ABI 4 and 6)."""
        return 24 if self.scoped else 16 if self.net else 8


def abi_version() -> int:
    """The kernel's Landlock ABI, or 0 when Landlock is not built in or is disabled."""
    version = int(_syscall(ctypes.c_long(_SYS_LANDLOCK_CREATE_RULESET), None, ctypes.c_size_t(0), ctypes.c_uint32(1)))
    return max(version, 0)


def handled_access(abi: int, *, allow_tcp: bool) -> HandledAccess:
    fs = _FS_ABI_1 if abi >= 1 else 0
    fs |= _FS_REFER if abi >= 2 else 0
    fs |= _FS_TRUNCATE if abi >= 3 else 0
    fs |= _FS_IOCTL_DEV if abi >= 5 else 0
    net = _NET_TCP if abi >= 4 and not allow_tcp else 0
    scoped = _SCOPE_ALL if abi >= 6 else 0
    return HandledAccess(fs=fs, net=net, scoped=scoped)


def runtime_read_only_paths() -> tuple[Path, ...]:
    """The smallest read-only grants a Python child of this interpreter needs, those that exist."""
    candidates = (sys.prefix, sys.base_prefix, "/usr", "/lib", "/lib64")
    return tuple(dict.fromkeys(Path(p) for p in candidates if Path(p).exists()))


class PreparedLandlock:
    """A ruleset ready to apply in a forked child; holds O_PATH fds until `close()`."""

    __slots__ = ("_args", "_attr", "_fds", "_late", "_net_args", "_port_attrs", "_rule_attrs", "_ruleset_fd", "handled")

    def __init__(
        self, handled: HandledAccess, grants: list[tuple[int, int]], *, late: int = 0, ports: tuple[int, ...] = ()
    ) -> None:
        self.handled = handled
        self._fds = tuple(fd for fd, _ in grants)
        self._attr = _RulesetAttr(handled.fs, handled.net, handled.scoped)
        # A late rule's fd is -1 until the child sets it: applied unset, the rule fails (EBADF), closed.
        self._late = tuple(_PathBeneathAttr(handled.fs, -1) for _ in range(late))
        self._rule_attrs = tuple(_PathBeneathAttr(access, fd) for fd, access in grants) + self._late
        # A port rule exists only where the ABI handles TCP (>= 4): below it, TCP is not restricted here at all.
        self._port_attrs = tuple(_NetPortAttr(_NET_CONNECT_TCP, port) for port in ports if handled.net)
        self._ruleset_fd = ctypes.c_long(-1)
        # Every argument is a ctypes object built now, so apply() converts nothing.
        self._args = (
            ctypes.c_long(_SYS_LANDLOCK_CREATE_RULESET),
            ctypes.pointer(self._attr),
            ctypes.c_size_t(handled.attr_size),
            ctypes.c_uint32(0),
            ctypes.c_long(_SYS_LANDLOCK_ADD_RULE),
            ctypes.c_long(_RULE_PATH_BENEATH),
            tuple(ctypes.pointer(a) for a in self._rule_attrs),
            ctypes.c_int(_PR_SET_NO_NEW_PRIVS),
            ctypes.c_ulong(1),
            ctypes.c_ulong(0),
            ctypes.c_long(_SYS_LANDLOCK_RESTRICT_SELF),
        )
        self._net_args = (ctypes.c_long(_RULE_NET_PORT), tuple(ctypes.pointer(a) for a in self._port_attrs))

    def set_late_fd(self, fd: int, index: int = 0) -> None:
        """In the child, before `apply`: the fd of late read-write rule `index` (LandlockRules.late_read_write)."""
        if index >= len(self._late):
            raise OSError(0, "this ruleset has no such late rule")
        self._late[index].parent_fd = fd

    def apply(self) -> None:
        """Restrict the calling process for good; raises OSError(errno) at the first failing call.

        Safe after fork: no imports, no allocation beyond returned ints and the error.
        """
        nr_create, attr, attr_size, zero, nr_add, rule_type, rules, pr_nnp, one, ulong0, nr_restrict = self._args
        port_type, port_rules = self._net_args
        fd: int = _syscall(nr_create, attr, attr_size, zero)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
        ruleset = self._ruleset_fd
        ruleset.value = fd
        for rule in rules:
            if _syscall(nr_add, ruleset, rule_type, rule, zero) != 0:
                raise OSError(ctypes.get_errno(), "landlock_add_rule")
        for port_rule in port_rules:
            if _syscall(nr_add, ruleset, port_type, port_rule, zero) != 0:
                raise OSError(ctypes.get_errno(), "landlock_add_rule")
        if _prctl(pr_nnp, one, ulong0, ulong0, ulong0) != 0:
            raise OSError(ctypes.get_errno(), "prctl_no_new_privs")
        if _syscall(nr_restrict, ruleset, zero) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
        if _close(ruleset) != 0:
            raise OSError(ctypes.get_errno(), "close_ruleset")

    def close(self) -> None:
        """Close the parent's O_PATH fds; call once every child using them has been spawned."""
        for fd in self._fds:
            os.close(fd)
        self._fds = ()

    def __enter__(self) -> PreparedLandlock:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def prepare_landlock(rules: LandlockRules, abi: int | None = None) -> PreparedLandlock:
    """Open the granted paths and build the ruleset for `abi` (default: the running kernel's).

    Raises SandboxStartError when Landlock is unavailable or a granted path cannot be opened.
    """
    abi = abi_version() if abi is None else abi
    if abi < 1:
        raise SandboxStartError("landlock_unavailable")
    handled = handled_access(abi, allow_tcp=rules.allow_tcp)
    grants: list[tuple[int, int]] = []
    try:
        for paths, access in ((rules.read_only, _FS_READ_ONLY), (rules.read_write, handled.fs)):
            for path in paths:
                grants.append(_grant(_open_grant(path), access & handled.fs))
        for given in rules.read_write_fds:
            grants.append(_grant(fcntl.fcntl(given, fcntl.F_DUPFD_CLOEXEC, 0), handled.fs))
    except OSError as exc:
        for fd, _ in grants:
            os.close(fd)
        raise SandboxStartError("landlock_path_unopenable") from exc
    return PreparedLandlock(handled, grants, late=rules.late_read_write, ports=rules.connect_ports)


def _open_grant(path: Path | Pinned) -> int:
    if isinstance(path, Pinned):
        return fcntl.fcntl(path.fd, fcntl.F_DUPFD_CLOEXEC, 0)
    return os.open(path, os.O_PATH | os.O_CLOEXEC)


def _grant(fd: int, access: int) -> tuple[int, int]:
    """(fd, rights) for one rule; a non-directory takes only file rights (a directory-only right is EINVAL)."""
    if not stat.S_ISDIR(os.fstat(fd).st_mode):
        access &= _FS_FILE_RIGHTS
    return fd, access
