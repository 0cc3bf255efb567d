"""No network: a fresh network namespace for the child, made in `preexec_fn` (docs/security-model.md, layer 3).

A new network namespace holds one interface, `lo`, and it is down: no route exists at all, so
TCP, UDP (which Landlock ABI 7 does not cover) and DNS fail, and abstract unix sockets of the
host are out of reach. Pathname unix sockets are files, not network: a netns does not hide them
(Landlock ABI >= 9, seccomp or a mount namespace must).

`unshare(CLONE_NEWNET)` needs CAP_SYS_ADMIN, so it runs before `identity.drop_privileges`.
"""

from __future__ import annotations

from sandbox.backends.namespaces import CLONE_NEWNET, unshare
from sandbox.backends.probe import child_succeeds

_PROBE_ARGV = ("/bin/true",)


def unshare_network() -> None:
    """Move the calling process into a new, empty network namespace; raise OSError if the kernel refuses."""
    unshare(CLONE_NEWNET)


def network_namespace_available() -> bool:
    """Whether a child can be started in a new network namespace here (the runner's own step, in a throwaway child)."""
    return child_succeeds(_PROBE_ARGV, unshare_network)
