"""No network: a fresh network namespace for the child, made in `preexec_fn` (issue 3; research L6).

A new network namespace holds one interface, `lo`, and it is down: no route exists at all, so
TCP, UDP (which Landlock ABI 7 does not cover) and DNS fail, and abstract unix sockets of the
host are out of reach. Pathname unix sockets are files, not network: a netns does not hide them
(Landlock ABI >= 9, seccomp or a mount namespace must).

`unshare(CLONE_NEWNET)` needs CAP_SYS_ADMIN, so it runs before `identity.drop_privileges`.
"""

from __future__ import annotations

import ctypes
import os

from sandbox.backends.probe import child_succeeds

CLONE_NEWNET = 0x40000000
_PROBE_ARGV = ("/bin/true",)

# Resolved in the parent at import so the child only makes the call (preexec_fn must not load libraries).
_unshare = ctypes.CDLL(None, use_errno=True).unshare
_unshare.argtypes = [ctypes.c_int]
_unshare.restype = ctypes.c_int


def unshare_network() -> None:
    """Move the calling process into a new, empty network namespace; raise OSError if the kernel refuses."""
    if _unshare(CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def network_namespace_available() -> bool:
    """Whether a child can be started in a new network namespace here (the runner's own step, in a throwaway child)."""
    return child_succeeds(_PROBE_ARGV, unshare_network)
