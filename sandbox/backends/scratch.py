"""A bounded scratch space: a private tmpfs over the run's scratch folder, in a mount namespace of its own (issue 3; research L6).

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
import tempfile
from pathlib import Path

from sandbox.backends.probe import child_succeeds
from sandbox.errors import SandboxStartError

MIB = 1024 * 1024
FILES_PER_MIB = 32  # an inode per 32 KiB on average: 8192 files in the default 256 MiB

# x86_64 system call numbers and uapi constants (linux/mount.h, linux/sched.h).
_SYS_MOVE_MOUNT = 429
_SYS_FSOPEN = 430
_SYS_FSCONFIG = 431
_SYS_FSMOUNT = 432
_FSOPEN_CLOEXEC = 0x1
_FSCONFIG_SET_STRING = 1
_FSCONFIG_CMD_CREATE = 6
_FSMOUNT_CLOEXEC = 0x1
_MOUNT_ATTR_NOSUID = 0x2
_MOUNT_ATTR_NODEV = 0x4
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_AT_FDCWD = -100
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
