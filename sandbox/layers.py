"""The names of the sandbox's isolation layers, spelled once.

They are stored and reported as they are spelled here: `layers` in evidence.json and in the audit's
`SANDBOX_EXEC` detail, `doctor`'s output, and the old `sandbox.required_layers` of a policy. Which
layers each backend applies is `sandbox.limits.BACKEND_LAYERS`; which guarantees they keep,
`sandbox.guarantees`.
"""

from __future__ import annotations

from enum import StrEnum


class Layer(StrEnum):
    UID_DROP = "uid_drop"
    """A pool uid of its own for each run (the gateway runs as root, with CAP_SETUID)."""
    USER_NAMESPACE = "user_namespace"
    """A user namespace of the run's own, which makes the other namespaces without root."""
    CGROUP = "cgroup"
    """A group with a memory and a process limit and a whole-group kill (cgroup v1 or v2)."""
    NETWORK_NAMESPACE = "network_namespace"
    IPC_NAMESPACE = "ipc_namespace"
    SCRATCH_TMPFS = "scratch_tmpfs"
    """A private mount namespace with a size-limited tmpfs as the scratch folder."""
    RLIMITS = "rlimits"
    LANDLOCK = "landlock"
    SECCOMP = "seccomp"
    PID_NAMESPACE = "pid_namespace"
    MOUNT_TREE = "mount_tree"
    """bubblewrap's minimal mount tree, in place of Landlock (bubblewrap backend)."""
