"""A bounded scratch space: a private tmpfs over the run's scratch folder, in a mount namespace of its own (decision 23).

RLIMIT_FSIZE bounds one file, not a disk: many files, or many empty ones (inodes), still fill
it. A tmpfs has a size and an inode count of its own, so the run's only writable place is
bounded by both. Its pages are charged to the writer's memory cgroup as well.

The tmpfs is made by the gateway, detached (`fsopen`, `fsconfig`, `fsmount`), and never
mounted in the host's namespace: the child, still root, enters a new mount namespace, makes
every mount in it private (so nothing propagates back to the host), and moves the tmpfs onto
the scratch folder (`move_mount`). When the run's last process is gone, its namespace and the
mount go with it; the gateway still holds the mount's fd, reads the run's junit XML through
it, and closing the fd frees the memory. A crashed gateway therefore leaves no mount behind.

Landlock must grant the tmpfs by its mount fd (`mount_fd`), not by the scratch folder's path:
when it walks up from a file, it skips the mount point the tmpfs sits on, so a rule on that
folder would not reach the files above it (measured: EACCES).
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
import tempfile
from pathlib import Path

from sandbox.backends.probe import child_succeeds
from sandbox.backends.userns import probe_entry
from sandbox.errors import SandboxStartError

MIB = 1024 * 1024
FILES_PER_MIB = 32  # an inode per 32 KiB on average: 8192 files in the default 256 MiB

# x86_64 system call numbers and uapi constants (linux/mount.h, linux/sched.h).
_SYS_MOVE_MOUNT = 429
_SYS_FSOPEN = 430
_SYS_FSCONFIG = 431
_SYS_FSMOUNT = 432
_SYS_MOUNT_SETATTR = 442
_FSOPEN_CLOEXEC = 0x1
_FSCONFIG_SET_STRING = 1
_FSCONFIG_CMD_CREATE = 6
_FSMOUNT_CLOEXEC = 0x1
_MOUNT_ATTR_NOSUID = 0x2
_MOUNT_ATTR_NODEV = 0x4
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_AT_FDCWD = -100
_AT_RECURSIVE = 0x8000
_MOUNT_ATTR_RDONLY = 0x1
_CLONE_NEWNS = 0x00020000
_MS_REC = 0x4000
_MS_PRIVATE = 1 << 18

# Resolved in the parent at import so the child only makes the calls (preexec_fn must not load libraries).
_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_unshare = _libc.unshare
_unshare.argtypes = [ctypes.c_int]
_unshare.restype = ctypes.c_int
_mount = _libc.mount
_mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
_mount.restype = ctypes.c_int


class _MountAttr(ctypes.Structure):
    """struct mount_attr (linux/mount.h), for mount_setattr(2)."""

    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _checked(result: int, what: str) -> int:
    if result < 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{what}: {os.strerror(number)}")
    return result


class ScratchSpace:
    """A detached tmpfs of `size_bytes` and `max_files` inodes, root folder owned by `uid`:`gid`, mode 0700.

    `apply()` runs in the child (as root, before the uid drop); `open_file()` reads what the
    run left, during or after it; `close()` frees the memory once no process uses the mount.
    """

    __slots__ = ("_args", "_mount_fd", "max_files", "size_bytes", "target")

    def __init__(self, target: Path, size_bytes: int, max_files: int, uid: int, gid: int) -> None:
        if size_bytes < MIB or max_files < 16:
            raise ValueError("a scratch space needs at least 1 MiB and 16 files")
        self.target = target
        self.size_bytes = size_bytes
        self.max_files = max_files
        options = {
            "size": str(size_bytes),
            "nr_inodes": str(max_files),
            "mode": "0700",
            "uid": str(uid),
            "gid": str(gid),
        }
        try:
            context = _checked(_syscall(_SYS_FSOPEN, b"tmpfs", _FSOPEN_CLOEXEC), "fsopen")
        except OSError as exc:
            raise SandboxStartError("scratch_unavailable") from exc
        try:
            for key, value in options.items():
                _checked(_syscall(_SYS_FSCONFIG, context, _FSCONFIG_SET_STRING, key.encode(), value.encode(), 0), key)
            _checked(_syscall(_SYS_FSCONFIG, context, _FSCONFIG_CMD_CREATE, None, None, 0), "fsconfig create")
            attributes = _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV
            self._mount_fd = _checked(_syscall(_SYS_FSMOUNT, context, _FSMOUNT_CLOEXEC, attributes), "fsmount")
        except OSError as exc:
            raise SandboxStartError("scratch_unavailable") from exc
        finally:
            os.close(context)
        # Every argument of apply() is built now, so the child converts nothing.
        self._args = (
            ctypes.c_int(_CLONE_NEWNS),
            ctypes.c_char_p(b"/"),
            ctypes.c_ulong(_MS_REC | _MS_PRIVATE),
            ctypes.c_long(_SYS_MOVE_MOUNT),
            ctypes.c_int(self._mount_fd),
            ctypes.c_char_p(b""),
            ctypes.c_int(_AT_FDCWD),
            ctypes.c_char_p(os.fsencode(target)),
            ctypes.c_uint(_MOVE_MOUNT_F_EMPTY_PATH),
        )

    @classmethod
    def adopt(cls, target: Path, mount_fd: int, size_bytes: int, max_files: int) -> ScratchSpace:
        """A scratch space whose tmpfs a run's child made (NamespacedScratch), held by its mount fd."""
        space = cls.__new__(cls)
        space.target, space.size_bytes, space.max_files = target, size_bytes, max_files
        space._mount_fd = mount_fd  # no `_args`: its tmpfs is already mounted, apply() is never called
        return space

    def apply(self) -> None:
        """In the child, as root: a private mount namespace with the tmpfs on the target. Raises OSError."""
        newns, root, private, nr_move, mount_fd, empty, cwd, target, empty_path = self._args
        if _unshare(newns) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
        if _mount(None, root, None, private, None) != 0:
            raise OSError(ctypes.get_errno(), "mount(MS_REC|MS_PRIVATE)")
        if _syscall(nr_move, mount_fd, empty, cwd, target, empty_path) != 0:
            raise OSError(ctypes.get_errno(), "move_mount")

    @property
    def mount_fd(self) -> int:
        """The tmpfs root, for Landlock's rule (landlock.LandlockRules.read_write_fds)."""
        return self._mount_fd

    def open_file(self, name: str) -> int:
        """An O_RDONLY fd of `name` at the tmpfs root, never through a link; raises OSError."""
        if "/" in name or name in ("", ".", ".."):
            raise ValueError("a scratch file name is one path component")
        return os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=self._mount_fd)

    def close(self) -> None:
        if self._mount_fd >= 0:
            os.close(self._mount_fd)
            self._mount_fd = -1

    def __enter__(self) -> ScratchSpace:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _tmpfs_onto(options: tuple[tuple[bytes, bytes], ...], target: bytes, attributes: int) -> int:
    """In the child: a new tmpfs with `options` and mount `attributes`, moved onto `target`; its mount fd."""
    context = _checked(_syscall(_SYS_FSOPEN, b"tmpfs", _FSOPEN_CLOEXEC), "fsopen")
    try:
        for key, value in options:
            _checked(_syscall(_SYS_FSCONFIG, context, _FSCONFIG_SET_STRING, key, value, 0), "fsconfig")
        _checked(_syscall(_SYS_FSCONFIG, context, _FSCONFIG_CMD_CREATE, None, None, 0), "fsconfig create")
        mount_fd = _checked(_syscall(_SYS_FSMOUNT, context, _FSMOUNT_CLOEXEC, attributes), "fsmount")
    finally:
        os.close(context)
    _checked(_syscall(_SYS_MOVE_MOUNT, mount_fd, b"", _AT_FDCWD, target, _MOVE_MOUNT_F_EMPTY_PATH), "move_mount")
    return mount_fd


class NamespacedTree:
    """A rootless native run's view of the host's files, in its own mount namespace: read-only, the state folder hidden.

    Such a run has the gateway's kernel uid, which owns the state folder (signing.key, the
    database, the policy) and the user's files. Landlock refuses reading and writing them, but
    not chmod, chown, utime or setxattr, nor stat and inotify, which it does not see: through the
    first a run could make the signing key readable and writable by every local user, through the
    second learn the names made in the state folder and when the database changes (measured:
    tests/rootless/). `apply()` (in the child, after `UserNamespace.enter`, before the scratch
    tmpfs) makes every mount private and read-only (each of those calls then fails with EROFS;
    the scratch tmpfs, mounted afterwards, stays writable, and so do device nodes such as
    /dev/null), then mounts an empty read-only tmpfs over each `hidden` folder: the run finds
    nothing there to read, measure or watch. Only the run's own mount namespace changes, never
    the host's. bubblewrap's runs skip it: their tree holds only the grants, read-only, and bwrap
    writes its own maps through /proc. Needs mount_setattr (Linux 5.12).
    """

    __slots__ = ("_hidden", "_read_only")

    def __init__(self, hidden: tuple[Path, ...] = ()) -> None:
        # Built now (as every argument of apply()), so the child only makes the calls.
        self._read_only = (ctypes.pointer(_MountAttr(attr_set=_MOUNT_ATTR_RDONLY)), ctypes.sizeof(_MountAttr))
        self._hidden = tuple(os.fsencode(path) for path in hidden if path.is_dir())

    def apply(self) -> None:
        """In the child, inside its user and mount namespaces. Raises OSError."""
        if _mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
            raise OSError(ctypes.get_errno(), "mount(MS_REC|MS_PRIVATE)")
        attributes, size = self._read_only
        _checked(_syscall(_SYS_MOUNT_SETATTR, _AT_FDCWD, b"/", _AT_RECURSIVE, attributes, size), "mount_setattr")
        for folder in self._hidden:
            flags = _MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV
            os.close(_tmpfs_onto(_HIDING, folder, flags))


_HIDING = ((b"size", b"4096"), (b"nr_inodes", b"16"), (b"mode", b"0500"))


class NamespacedScratch:
    """The scratch tmpfs of a run in a user namespace of its own (backends/userns.py), made by the child.

    Without root the gateway cannot make a tmpfs; the run's child can, in the mount namespace
    its user namespace owns. `apply()` (in the child, after `UserNamespace.enter`) makes every
    mount private and read-only, makes the tmpfs with the same size, inode cap, mode and owner as
    ScratchSpace, moves it onto the scratch folder, and sends its mount fd to the gateway over a
    socket pair made here; it returns that fd, for Landlock's rule on the tmpfs root. `receive()`
    (in the gateway, once the child is spawned) takes the fd: the gateway reads the run's files
    through it after the namespace is gone, exactly as with a ScratchSpace it made itself.
    Mounted after NamespacedTree's read-only step, it stays writable.
    """

    __slots__ = ("_child_end", "_gateway_end", "_options", "files", "size", "target")

    def __init__(self, target: Path, size_bytes: int, max_files: int, uid: int, gid: int) -> None:
        if size_bytes < MIB or max_files < 16:
            raise ValueError("a scratch space needs at least 1 MiB and 16 files")
        self.target, self.size, self.files = target, size_bytes, max_files
        options = {"size": size_bytes, "nr_inodes": max_files, "mode": "0700", "uid": uid, "gid": gid}
        self._options = tuple((key.encode(), str(value).encode()) for key, value in options.items())
        self._gateway_end, self._child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)

    def apply(self) -> int:
        """In the child, inside its user and mount namespaces: the tmpfs on the target; its mount fd. Raises OSError."""
        if _mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
            raise OSError(ctypes.get_errno(), "mount(MS_REC|MS_PRIVATE)")
        mount_fd = _tmpfs_onto(self._options, os.fsencode(self.target), _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV)
        rights = struct.pack("i", mount_fd)
        self._child_end.sendmsg([b"m"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)])
        return mount_fd

    def receive(self) -> ScratchSpace:
        """In the gateway, after the spawn: the tmpfs the child made. Raises SandboxStartError if it sent none."""
        self._child_end.close()
        try:
            _, fds, _, _ = socket.recv_fds(self._gateway_end, 1, 1, socket.MSG_DONTWAIT)
        except OSError as exc:
            raise SandboxStartError("scratch_unavailable") from exc
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise SandboxStartError("scratch_unavailable")
        os.set_inheritable(fds[0], False)
        return ScratchSpace.adopt(self.target, fds[0], self.size, self.files)

    def close(self) -> None:
        self._gateway_end.close()
        self._child_end.close()


def files_for(size_bytes: int) -> int:
    """The inode count that goes with a scratch size (FILES_PER_MIB per MiB)."""
    return max(16, size_bytes // MIB * FILES_PER_MIB)


def scratch_available() -> bool:
    """Whether a child can get a scratch space here (the runner's own step, in a throwaway child)."""
    try:
        with (
            tempfile.TemporaryDirectory(prefix="mcp-scratch-probe-") as folder,
            ScratchSpace(Path(folder), MIB, 16, os.getuid(), os.getgid()) as space,
        ):
            return child_succeeds(("/bin/true",), space.apply)
    except (OSError, SandboxStartError):
        return False


def namespaced_scratch_available(uid: int, gid: int) -> bool:
    """Whether a run's child in its own user namespace (as `uid`) can mount its scratch tmpfs here."""
    try:
        with tempfile.TemporaryDirectory(prefix="mcp-scratch-probe-") as folder:
            if os.geteuid() == 0:
                os.chown(folder, uid, gid)
            space = NamespacedScratch(Path(folder), MIB, 16, uid, gid)
            enter, tree = probe_entry(uid, gid), NamespacedTree()

            def step() -> None:
                enter()
                tree.apply()
                space.apply()

            try:
                if not child_succeeds(("/bin/true",), step):
                    return False
                space.receive().close()
                return True
            except SandboxStartError:
                return False
            finally:
                space.close()
    except OSError:
        return False


def namespaced_tree_available(uid: int, gid: int) -> bool:
    """Whether a run's child in its own user namespace (as `uid`) can make its tree read-only and hide a folder."""
    try:
        with tempfile.TemporaryDirectory(prefix="mcp-tree-probe-") as folder:
            os.chmod(folder, 0o711)  # noqa: S103  (empty; the probe, as `uid`, must reach the folder it hides)
            enter, tree = probe_entry(uid, gid), NamespacedTree((Path(folder),))

            def step() -> None:
                enter()
                tree.apply()

            return child_succeeds(("/bin/true",), step)
    except OSError:
        return False
