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
import subprocess

CLONE_NEWNET = 0x40000000
_PROBE_ARGV = ("/bin/true",)
_PROBE_TIMEOUT_S = 10

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
    """Whether a child can be started in a new network namespace here (probed in a throwaway child)."""
    try:
        completed = subprocess.run(
            _PROBE_ARGV,
            preexec_fn=unshare_network,  # the same call the runner makes, so the probe tests the real step
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            timeout=_PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return completed.returncode == 0
