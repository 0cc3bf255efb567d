"""The run's own user namespace: confinement without root (decision 57).

A gateway started by an ordinary user cannot give a run a uid of its own, nor make namespaces
or mounts on the host. A user namespace lets it do the rest anyway: the child unshares a new
user namespace together with new network, IPC, UTS, mount and cgroup namespaces, maps its own
uid and gid (and only those) into it, and is then privileged inside it alone: it can mount the
scratch tmpfs (scratch.NamespacedScratch) and make the PID namespace (pidns.py), none of which
reaches the host. Then `seal()` drops every capability it had in the namespace and marks the
supervisors undumpable, before Landlock and seccomp, so the command starts with nothing.

The run's kernel uid is the gateway's (a root gateway drops to a pool uid first, and then maps
that one: decision 56). What a process of that uid could otherwise reach, and what closes it:

- the gateway's files (state folder, keys, database): Landlock's grants or bubblewrap's mount
  tree (`file_grants`, which no policy may waive); their modes, times and extended attributes,
  which Landlock does not see (chmod would make the signing key every local user's): every
  mount of a native run's namespace is read-only but its scratch (scratch.NamespacedScratch);
- the gateway's `/proc/<pid>` (environ, mem, fd): not in the run's PID namespace, `/proc` not
  granted by Landlock (bubblewrap mounts the namespace's own), ptrace and process_vm_* refused
  by seccomp, Landlock's ptrace rule (no access out of the domain);
- signals to the gateway or the user's other processes: their pids do not exist in the run's PID
  namespace; Landlock's signal scope (ABI 6) refuses them as well;
- the user's sockets: no socket() without network (seccomp), abstract sockets in another
  network namespace, Landlock's abstract-socket scope;
- the supervisors (`P`, `I`, which keep the gateway's memory image): undumpable, so neither
  `/proc/1/mem` nor ptrace reaches them, and `I` ignores every signal a pid 1 may ignore;
- the user's per-user kernel quotas (inotify and fanotify instances and watches, which the user's
  editor needs too): the run's namespace gets an eighth of each (`USER_QUOTAS`);
- its limits: RLIMIT_NPROC counts the processes of a uid within one user namespace (Linux
  5.14+), so the run's limit counts the run's processes, not the user's; `rlimits.apply` runs
  after `enter` for that reason.

Writing the maps needs no privilege: an unprivileged process may map its own uid and gid
(after `deny` in `setgroups`), which is all the run needs. The uid inside is the same number,
so files show their real owners and uid 0 is not mapped: nothing in the namespace is "root".
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable

from sandbox.backends.namespaces import CLONE_NEWIPC, CLONE_NEWNET, unshare
from sandbox.backends.probe import child_succeeds

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWUSER = 0x10000000

_PR_SET_DUMPABLE = 4
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_SYS_CAPSET = 126

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_prctl = _libc.prctl
_prctl.restype = ctypes.c_int


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


class UserNamespace:
    """Prepared in the parent for one run of kernel uid `uid`; `enter` and `seal` run in the child."""

    __slots__ = ("_cap_data", "_cap_header", "_flags", "_maps")

    def __init__(self, uid: int, gid: int, *, network: bool) -> None:
        if uid == 0 or gid == 0:
            raise ValueError("a run's user namespace maps an unprivileged uid, never root")
        self._flags = CLONE_NEWUSER | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNS | CLONE_NEWCGROUP
        if not network:
            self._flags |= CLONE_NEWNET
        self._maps = (
            (b"/proc/self/setgroups", b"deny"),
            (b"/proc/self/uid_map", b"%d %d 1" % (uid, uid)),
            (b"/proc/self/gid_map", b"%d %d 1" % (gid, gid)),
            *_share_of_user_quotas(),
        )
        self._cap_header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
        self._cap_data = (_CapData * 2)()

    def enter(self) -> None:
        """New user, network (unless the policy allows it), IPC, UTS, mount and cgroup namespaces; our ids mapped;
        the namespace's share of the user's kernel quotas (`USER_QUOTAS`) set.

        After a drop from root the process is undumpable, which makes its /proc/self files root's: the
        maps could not be written. It is dumpable until `seal`, which is this code's, not the run's."""
        if _prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "dumpable")
        unshare(self._flags)
        for path, line in self._maps:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)

    def seal(self) -> None:
        """After the namespace's mounts: no capability left (not even in the namespace), undumpable, no_new_privs."""
        if _prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "clear ambient capabilities")
        if _syscall(_SYS_CAPSET, ctypes.byref(self._cap_header), self._cap_data) != 0:
            raise OSError(ctypes.get_errno(), "capset")
        if _prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "undumpable")
        if _prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "no_new_privs")


USER_QUOTAS = ("max_inotify_instances", "max_inotify_watches", "max_fanotify_groups", "max_fanotify_marks")
"""Kernel objects counted per user, across the user's namespaces (/proc/sys/user): a run that has the
user's kernel uid would take them from the user's own programs (measured: a run held all 128 inotify
instances, and the user's own programs got EMFILE until it ended). Each run's namespace gets an eighth."""
QUOTA_SHARE = 8


def _share_of_user_quotas() -> tuple[tuple[bytes, bytes], ...]:
    """(file, value) for each quota this kernel has: 1/QUOTA_SHARE of its value here (read in the parent).

    Written in the run's namespace, where its creator may (CAP_SYS_RESOURCE there): the kernel counts
    each object in every namespace up to the host's, so the run stops at its share, the user keeps the rest."""
    out = []
    for name in USER_QUOTAS:
        path = f"/proc/sys/user/{name}"
        try:
            with open(path, "rb") as handle:
                value = int(handle.read())
        except (OSError, ValueError):
            continue  # an older kernel (fanotify's are 5.13+): the object has no per-user quota to share
        out.append((path.encode(), b"%d" % max(1, value // QUOTA_SHARE)))
    return tuple(out)


def probe_entry(uid: int, gid: int) -> Callable[[], None]:
    """A probe child's first step, as a run's: drop to `uid` when root, then enter its user namespace (unsealed)."""
    namespace = UserNamespace(uid, gid, network=False)

    def step() -> None:
        if os.getuid() != uid:
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
        namespace.enter()

    return step


def user_namespace_available(uid: int, gid: int) -> bool:
    """Whether a child here can enter a user namespace with every namespace a run gets, as `uid`, and seal it."""
    if uid == 0 or gid == 0:
        return False
    enter, namespace = probe_entry(uid, gid), UserNamespace(uid, gid, network=False)

    def step() -> None:
        enter()
        namespace.seal()

    return child_succeeds(("/bin/true",), step)
