"""The workspace view: a copy of the pinned workspace on a tmpfs of its own, mounted over it for one run (decisions 78, 82).

A run in `workspace: review` or `write` mode (docs/security-model.md, "Writable workspaces") must
write somewhere that is not the workspace: what it writes is a change set a person (or, in
`write` mode, the gateway's rules) applies afterwards. The gateway, as root, makes a detached
tmpfs (`fsopen`, `fsconfig`, `fsmount`; never mounted in the host's namespace) and, while the
child starts, copies the workspace into it through its fd (sandbox/workspace_copy.py), then
shrinks it to what the copy holds plus the change caps' headroom (`resize`) and says `go`. In the
child, after the scratch step made a private mount namespace (which carried the cwd, the pinned
workspace, into its copy), `apply()` moves the tmpfs onto that cwd and `fchdir`s into it: the run
sees the copy at the workspace's own path, in its namespace alone; `await_go` waits for the copy,
last thing before the exec. Landlock grants the tmpfs read-write by its mount fd and nothing
else of the workspace; bubblewrap binds the same fd (`--bind-fd`).

When the run has ended and the runner has killed whatever it left, `freeze()` makes the mount
read-only: a writer that somehow outlived the kill gets EROFS, so the change set read afterwards
is the last word. Closing the fd frees the memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import socket
import struct
from pathlib import Path

from sandbox.errors import SandboxStartError

MIB = 1024 * 1024
GO_WAIT_MS = 120_000
"""How long a root run's child waits, before its exec, for the gateway to fill its copy."""

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


def _detached_tmpfs(options: dict[str, str]) -> int:
    """A new tmpfs with `options`, nosuid and nodev, mounted nowhere: its mount fd. Raises OSError."""
    context = _checked(_syscall(_SYS_FSOPEN, b"tmpfs", _FSOPEN_CLOEXEC), "fsopen")
    try:
        _configure(context, options, _FSCONFIG_CMD_CREATE)
        return _checked(
            _syscall(_SYS_FSMOUNT, context, _FSMOUNT_CLOEXEC, _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV), "fsmount"
        )
    finally:
        os.close(context)


def _reconfigure(mount_fd: int, options: dict[str, str], flags: tuple[bytes, ...] = ()) -> None:
    """Change the tmpfs behind `mount_fd` (its size, its inode cap, read-only). Raises OSError."""
    context = _checked(_syscall(_SYS_FSPICK, mount_fd, b"", _FSPICK_EMPTY_PATH | _FSPICK_CLOEXEC), "fspick")
    try:
        for flag in flags:
            _checked(_syscall(_SYS_FSCONFIG, context, _FSCONFIG_SET_FLAG, flag, None, 0), flag.decode())
        _configure(context, options, _FSCONFIG_CMD_RECONFIGURE)
    finally:
        os.close(context)


class WorkspaceView:
    """A detached tmpfs of `size_bytes` and `max_files` inodes (nosuid, nodev) that holds a run's copy of the workspace.

    The gateway writes the copy through `mount_fd` before the spawn; `apply()` runs in the child;
    `freeze()` and the change set's walk come after the run; `close()` frees the memory.
    """

    __slots__ = ("_args", "_frozen", "_go_read", "_go_write", "_mount_fd", "_move_only")

    def __init__(self, size_bytes: int, max_files: int, *, mount_at: Path | None = None) -> None:
        """`mount_at`: where `apply()` moves the copy instead of over the cwd (bubblewrap then binds it from
        there over the workspace: it refuses to bind a detached mount, or one of another namespace by fd)."""
        if size_bytes < MIB or max_files < 16:
            raise ValueError("a workspace view needs at least 1 MiB and 16 files")
        try:
            self._mount_fd = _detached_tmpfs({"size": str(size_bytes), "nr_inodes": str(max_files), "mode": "0755"})
        except OSError as exc:
            raise SandboxStartError("workspace_view_unavailable") from exc
        self._frozen = False
        self._move_only = mount_at is not None
        self._go_read, self._go_write = os.pipe2(os.O_CLOEXEC)
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
            _reconfigure(self._mount_fd, {"size": str(size_bytes), "nr_inodes": str(max_files)})
        except OSError as exc:
            raise SandboxStartError("workspace_view_unavailable") from exc

    def apply(self) -> None:
        """In the child, in its private mount namespace whose cwd is the workspace: the copy onto it, and into it.

        Before any fork of the child: its copy of the gateway's end of the word to go is closed here, so that
        end closing is seen (`await_go`), whichever process of the child holds the other."""
        os.close(self._go_write)
        nr_move, mount_fd, empty, cwd, here, empty_path = self._args
        if _syscall(nr_move, mount_fd, empty, cwd, here, empty_path) != 0:
            raise OSError(ctypes.get_errno(), "move_mount")
        if not self._move_only and _fchdir(mount_fd) != 0:
            raise OSError(ctypes.get_errno(), "fchdir")

    def await_go(self) -> None:
        """In the child, last thing before the exec: wait (at most GO_WAIT_MS) for the gateway's word that the
        copy is filled (decision 82: it is filled while the child makes its namespaces). Raises OSError."""
        waiting = select.poll()
        waiting.register(self._go_read, select.POLLIN)
        if not waiting.poll(GO_WAIT_MS):
            raise OSError(110, "the workspace copy was not made in time")  # ETIMEDOUT
        if os.read(self._go_read, 1) != b"g":
            raise OSError(5, "the workspace copy was not made")  # EIO: the gateway closed its end

    def go(self) -> None:
        """In the gateway, once the copy is filled and resized: the child, waiting in `await_go`, may exec.

        The pipe stays open until `end_go`, after the spawn: closed sooner (a copy filled before the fork),
        its numbers could be another fd's by the time the child is forked."""
        os.write(self._go_write, b"g")

    def refuse(self) -> None:
        """In the gateway, when the copy cannot be made: the child, waiting, fails (nothing runs)."""
        with contextlib.suppress(OSError):
            os.write(self._go_write, b"n")

    def end_go(self) -> None:
        """In the gateway, once the spawn is over (the child exec'd or failed): the word's pipe closed."""
        self._close_go()

    def _close_go(self) -> None:
        for fd in (self._go_read, self._go_write):
            if fd >= 0:
                os.close(fd)
        self._go_read = self._go_write = -1

    def freeze(self) -> None:
        """Make the tmpfs itself read-only (its superblock, every mount of it): nothing writes to the copy any more.

        The run's mount namespace is gone by now, and its mount with it (mount_setattr refuses an
        unmounted mount: EINVAL, measured); the superblock is what every writer goes through.
        Raises OSError."""
        _reconfigure(self._mount_fd, {}, (b"ro",))
        self._frozen = True

    def close(self) -> None:
        self._close_go()
        if self._mount_fd >= 0:
            os.close(self._mount_fd)
            self._mount_fd = -1

    def __enter__(self) -> WorkspaceView:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


_GO = struct.Struct("=cQQ")  # b"g", then the size and the inode cap the copy is to keep


class NamespacedView:
    """A rootless writing run's copy: a tmpfs the child makes in its own user namespace, the gateway fills.

    An ordinary user's gateway cannot make a tmpfs; the run's child can, in the mount namespace its
    user namespace owns (as NamespacedScratch does). `apply()` (in the child, after its scratch)
    makes the tmpfs detached, sends its mount fd to the gateway, and waits (at most `wait_s`) for
    the word to go: meanwhile a thread of the gateway fills it (`receive`, the copy, `go`), as
    Popen holds the gateway's spawning thread until the exec. Then the child sets the size and
    inode cap the gateway sent, moves the tmpfs over its cwd (the workspace) and enters it.
    The gateway cannot freeze it afterwards (fspick needs CAP_SYS_ADMIN over the gateway's own mount
    namespace): the run's PID namespace ending with it is what makes its last writer gone.
    """

    __slots__ = ("_args", "_child_end", "_gateway_end", "_mount_at", "_options")

    def __init__(
        self, size_bytes: int, max_files: int, uid: int, gid: int, wait_s: float, *, mount_at: Path | None = None
    ) -> None:
        """`mount_at`: a folder to make in the child's scratch tmpfs and move the copy onto, instead of over
        the cwd (bubblewrap binds it from there, as WorkspaceView's `mount_at`)."""
        if size_bytes < MIB or max_files < 16:
            raise ValueError("a workspace view needs at least 1 MiB and 16 files")
        self._options = {"size": str(size_bytes), "nr_inodes": str(max_files), "mode": "0755"}
        self._options |= {"uid": str(uid), "gid": str(gid)}
        self._gateway_end, self._child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        seconds = int(wait_s)
        timeout = struct.pack("ll", seconds, int((wait_s - seconds) * 1_000_000))
        self._child_end.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeout)  # the child's wait is bounded
        self._mount_at = None if mount_at is None else os.fsencode(mount_at)
        target = b"." if self._mount_at is None else self._mount_at
        self._args = (
            ctypes.c_long(_SYS_MOVE_MOUNT),
            ctypes.c_char_p(b""),
            ctypes.c_int(_AT_FDCWD),
            ctypes.c_char_p(target),
        )

    def apply(self) -> int:
        """In the child, inside its user and mount namespaces: the filled copy over the cwd; its mount fd. Raises OSError."""
        self._gateway_end.close()  # the child's own copy of it: else the gateway's end closing is never seen
        mount_fd = _detached_tmpfs(self._options)
        self._child_end.sendmsg([b"v"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", mount_fd))])
        answer = self._child_end.recv(_GO.size)  # a timeout raises; the gateway's end closed reads b""
        if len(answer) != _GO.size or answer[:1] != b"g":
            raise OSError(5, "the workspace copy was not made")  # EIO
        _, size, files = _GO.unpack(answer)
        _reconfigure(mount_fd, {"size": str(size), "nr_inodes": str(files)})
        if self._mount_at is not None:
            os.mkdir(self._mount_at, 0o755)  # in the scratch tmpfs the child made just before
        nr_move, empty, cwd, here = self._args
        if _syscall(nr_move, mount_fd, empty, cwd, here, _MOVE_MOUNT_F_EMPTY_PATH) != 0:
            raise OSError(ctypes.get_errno(), "move_mount")
        if self._mount_at is None and _fchdir(mount_fd) != 0:
            raise OSError(ctypes.get_errno(), "fchdir")
        return mount_fd

    def receive(self, timeout_s: float) -> int:
        """In the gateway (a thread of its own, while the spawn waits): the empty tmpfs's mount fd. Raises OSError."""
        self._gateway_end.settimeout(timeout_s)
        _, fds, _, _ = socket.recv_fds(self._gateway_end, 1, 1)
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise OSError(5, "no workspace copy was sent")
        os.set_inheritable(fds[0], False)
        return fds[0]

    def go(self, size_bytes: int, max_files: int) -> None:
        """In the gateway, once the copy is made: the child may go on, with the tmpfs capped at these."""
        self._gateway_end.send(_GO.pack(b"g", size_bytes, max_files))

    def refuse(self) -> None:
        """In the gateway, when the copy cannot be made: the child, waiting, fails (nothing runs)."""
        with contextlib.suppress(OSError):
            self._gateway_end.send(b"n")

    def close(self) -> None:
        """Close both ends (a thread of the gateway waiting on its end wakes; the child, waiting, fails)."""
        with contextlib.suppress(OSError):
            self._gateway_end.shutdown(socket.SHUT_RDWR)
        self._gateway_end.close()
        self._child_end.close()
