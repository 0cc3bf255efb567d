"""`unshare(2)` for the child's namespace steps, and the IPC namespace (decision 37).

Every namespace step runs in `preexec_fn` before the uid drop: `unshare` needs CAP_SYS_ADMIN.

A new IPC namespace gives the run SysV shared memory, semaphores and message queues, and POSIX
message queues, of its own: no other run sees them (the same pool uid used by another tenant's
run later included), and the kernel destroys them with the namespace when the run's last
process is gone, instead of leaving them on the host, charged to nobody's limit.
"""

from __future__ import annotations

import ctypes
import os

from sandbox.backends.probe import child_succeeds

CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

# Resolved in the parent at import so the child only makes the call (preexec_fn must not load libraries).
_unshare = ctypes.CDLL(None, use_errno=True).unshare
_unshare.argtypes = [ctypes.c_int]
_unshare.restype = ctypes.c_int


def unshare(flags: int) -> None:
    """Move the calling process into new namespaces (os.unshare is Python 3.12+); raise OSError if refused."""
    if _unshare(flags) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def unshare_ipc() -> None:
    unshare(CLONE_NEWIPC)


def ipc_namespace_available() -> bool:
    """Whether a child can be started in a new IPC namespace here (the runner's own step, in a throwaway child)."""
    return child_succeeds(("/bin/true",), unshare_ipc)
