"""The workspace view: a copy of the pinned workspace on a tmpfs of its own, mounted over it for one run (decision 78).

A run in `workspace: review` or `write` mode (docs/security-model.md, "Writable workspaces") must
write somewhere that is not the workspace: what it writes is a change set a person (or, in
`write` mode, the gateway's rules) applies afterwards. The gateway, as root, makes a detached
tmpfs (`fsopen`, `fsconfig`, `fsmount`; never mounted in the host's namespace), copies the
workspace into it through its fd (sandbox/workspace_copy.py), then shrinks it to what the copy
holds plus the change caps' headroom (`resize`). In the child, after the scratch step made a
private mount namespace (which carried the cwd, the pinned workspace, into its copy), `apply()`
moves the tmpfs onto that cwd and `fchdir`s into it: the run sees the copy at the workspace's own
path, in its namespace alone. Landlock grants the tmpfs read-write by its mount fd and nothing
else of the workspace; bubblewrap binds the same fd (`--bind-fd`).

When the run has ended and the runner has killed whatever it left, `freeze()` makes the mount
read-only: a writer that somehow outlived the kill gets EROFS, so the change set read afterwards
is the last word. Closing the fd frees the memory.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from sandbox.errors import SandboxStartError

MIB = 1024 * 1024

_SYS_MOVE_MOUNT = 429
_SYS_FSOPEN = 430
_SYS_FSCONFIG = 431
_SYS_FSMOUNT = 432
_SYS_FSPICK = 433
_FSOPEN_CLOEXEC = 0x1
_FSPICK_CLOEXEC = 0x1
_FSPICK_EMPTY_PATH = 0x8
_FSCONFIG_SET_FLAG = 0
_FSCONFIG_SET_STRING = 1
_FSCONFIG_CMD_CREATE = 6
_FSCONFIG_CMD_RECONFIGURE = 7
_FSMOUNT_CLOEXEC = 0x1
_MOUNT_ATTR_NOSUID = 0x2
_MOUNT_ATTR_NODEV = 0x4
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_AT_FDCWD = -100

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_fchdir = _libc.fchdir
_fchdir.argtypes = [ctypes.c_int]
_fchdir.restype = ctypes.c_int


def _checked(result: int, what: str) -> int:
    if result < 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{what}: {os.strerror(number)}")
    return result


def _configure(context: int, options: dict[str, str], command: int) -> None:
    for key, value in options.items():
        _checked(_syscall(_SYS_FSCONFIG, context, _FSCONFIG_SET_STRING, key.encode(), value.encode(), 0), key)
    _checked(_syscall(_SYS_FSCONFIG, context, command, None, None, 0), "fsconfig")


class WorkspaceView:
    """A detached tmpfs of `size_bytes` and `max_files` inodes (nosuid, nodev) that holds a run's copy of the workspace.

    The gateway writes the copy through `mount_fd` before the spawn; `apply()` runs in the child;
    `freeze()` and the change set's walk come after the run; `close()` frees the memory.
    """

    __slots__ = ("_args", "_frozen", "_mount_fd", "_move_only")

    def __init__(self, size_bytes: int, max_files: int, *, mount_at: Path | None = None) -> None:
        """`mount_at`: where `apply()` moves the copy instead of over the cwd (bubblewrap then binds it from
        there over the workspace: it refuses to bind a detached mount, or one of another namespace by fd)."""
        if size_bytes < MIB or max_files < 16:
            raise ValueError("a workspace view needs at least 1 MiB and 16 files")
        try:
            context = _checked(_syscall(_SYS_FSOPEN, b"tmpfs", _FSOPEN_CLOEXEC), "fsopen")
        except OSError as exc:
            raise SandboxStartError("workspace_view_unavailable") from exc
        try:
            options = {"size": str(size_bytes), "nr_inodes": str(max_files), "mode": "0755"}
            _configure(context, options, _FSCONFIG_CMD_CREATE)
            attributes = _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV
            self._mount_fd = _checked(_syscall(_SYS_FSMOUNT, context, _FSMOUNT_CLOEXEC, attributes), "fsmount")
        except OSError as exc:
            raise SandboxStartError("workspace_view_unavailable") from exc
        finally:
            os.close(context)
        self._frozen = False
        self._move_only = mount_at is not None
        # Built now, so the child converts nothing.
        self._args = (
            ctypes.c_long(_SYS_MOVE_MOUNT),
            ctypes.c_int(self._mount_fd),
            ctypes.c_char_p(b""),
            ctypes.c_int(_AT_FDCWD),
            ctypes.c_char_p(b"." if mount_at is None else os.fsencode(mount_at)),
            ctypes.c_uint(_MOVE_MOUNT_F_EMPTY_PATH),
        )

    @property
    def mount_fd(self) -> int:
        """The tmpfs root: the copy is written and the change set read through it; Landlock's read-write rule."""
        return self._mount_fd

    @property
    def frozen(self) -> bool:
        return self._frozen

    def resize(self, size_bytes: int, max_files: int) -> None:
        """Set the tmpfs's size and inode cap (after the copy: what it holds plus the headroom a run may add)."""
        try:
            context = _checked(
                _syscall(_SYS_FSPICK, self._mount_fd, b"", _FSPICK_EMPTY_PATH | _FSPICK_CLOEXEC), "fspick"
            )
        except OSError as exc:
            raise SandboxStartError("workspace_view_unavailable") from exc
        try:
            _configure(context, {"size": str(size_bytes), "nr_inodes": str(max_files)}, _FSCONFIG_CMD_RECONFIGURE)
        except OSError as exc:
            raise SandboxStartError("workspace_view_unavailable") from exc
        finally:
            os.close(context)

    def apply(self) -> None:
        """In the child, in its private mount namespace whose cwd is the workspace: the copy onto it, and into it."""
        nr_move, mount_fd, empty, cwd, here, empty_path = self._args
        if _syscall(nr_move, mount_fd, empty, cwd, here, empty_path) != 0:
            raise OSError(ctypes.get_errno(), "move_mount")
        if not self._move_only and _fchdir(mount_fd) != 0:
            raise OSError(ctypes.get_errno(), "fchdir")

    def freeze(self) -> None:
        """Make the tmpfs itself read-only (its superblock, every mount of it): nothing writes to the copy any more.

        The run's mount namespace is gone by now, and its mount with it (mount_setattr refuses an
        unmounted mount: EINVAL, measured); the superblock is what every writer goes through.
        Raises OSError."""
        context = _checked(_syscall(_SYS_FSPICK, self._mount_fd, b"", _FSPICK_EMPTY_PATH | _FSPICK_CLOEXEC), "fspick")
        try:
            _checked(_syscall(_SYS_FSCONFIG, context, _FSCONFIG_SET_FLAG, b"ro", None, 0), "ro")
            _checked(_syscall(_SYS_FSCONFIG, context, _FSCONFIG_CMD_RECONFIGURE, None, None, 0), "reconfigure")
        finally:
            os.close(context)
        self._frozen = True

    def close(self) -> None:
        if self._mount_fd >= 0:
            os.close(self._mount_fd)
            self._mount_fd = -1

    def __enter__(self) -> WorkspaceView:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
