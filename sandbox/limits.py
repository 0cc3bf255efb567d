"""The limits a run is held to, and the guarantees it requires, as one frozen value."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Literal

from sandbox.guarantees import ALWAYS_REQUIRED, DEFAULT_REQUIRED, Guarantee
from sandbox.layers import Layer
from sandbox.pinned import Pinned

MIB = 1024 * 1024
SUPERVISOR_PROCESSES: Mapping[str, int] = MappingProxyType({"native": 2, "bubblewrap": 3})
"""Processes a run holds besides the suite's own, added to its process limits: natively the PID
namespace's two supervisors (backends/pidns.py); with bubblewrap the watchdog, bwrap and its pid 1."""

Backend = Literal["native", "bubblewrap"]
BACKENDS: tuple[Backend, ...] = ("native", "bubblewrap")

BACKEND_LAYERS: Mapping[Backend, tuple[Layer, ...]] = MappingProxyType(
    {
        # Every layer applied by the gateway itself, in the child between fork and exec.
        "native": (
            Layer.UID_DROP, Layer.USER_NAMESPACE, Layer.CGROUP, Layer.NETWORK_NAMESPACE, Layer.IPC_NAMESPACE,
            Layer.SCRATCH_TMPFS, Layer.RLIMITS, Layer.LANDLOCK, Layer.SECCOMP, Layer.PID_NAMESPACE,
        ),
        # The same steps up to the uid drop (or the user namespace), then bubblewrap: its mount
        # tree stands in for Landlock (which would forbid bubblewrap's own mounts) and it installs
        # the seccomp program just before the command.
        "bubblewrap": (
            Layer.UID_DROP, Layer.USER_NAMESPACE, Layer.CGROUP, Layer.NETWORK_NAMESPACE, Layer.IPC_NAMESPACE,
            Layer.SCRATCH_TMPFS, Layer.RLIMITS, Layer.MOUNT_TREE, Layer.PID_NAMESPACE, Layer.SECCOMP,
        ),
    }
)  # fmt: skip
"""The layers (mechanisms) each backend applies where the host has them (sandbox/confine.py;
sandbox/guarantees.py maps them to what a policy requires)."""

LAYERS: tuple[Layer, ...] = tuple(dict.fromkeys(name for names in BACKEND_LAYERS.values() for name in names))
"""Every layer the sandbox knows, of either backend."""


@dataclass(frozen=True, slots=True)
class Limits:
    timeout_s: float
    memory_limit_mb: int
    max_processes: int
    max_output_bytes: int
    network: bool = False
    """The host's network (no network namespace): all or nothing, never with `proxy`."""
    allowed_paths: tuple[Path | Pinned, ...] = ()
    """Extra read-only grants; a Pinned one is reached through its fd only (sandbox/pinned.py)."""
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    scratch_bytes: int = 256 * MIB
    """Size of the scratch tmpfs, the run's only writable place (its inode count follows the size)."""
    backend: Backend = "native"
    hidden: tuple[Path, ...] = ()
    """Folders the run must not even see (the gateway's state folder): a rootless native run, which
    has the gateway's uid, finds an empty read-only tmpfs there (backends/scratch.py NamespacedTree)."""
    require: frozenset[Guarantee] | None = None
    """Guarantees without which the run must not start (None: guarantees.DEFAULT_REQUIRED); every
    layer of the backend the host has is applied anyway."""
    proxy: bool = False
    """The run's network goes through the gateway's proxy only: a network namespace of its own whose
    loopback is up, with the gateway's listener at sandbox/proxy_port.py PROXY_URL made in it before the
    command starts and handed to the caller's `on_proxy` (sandbox/backends/proxy_listener.py, decision 89)."""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown sandbox backend: {self.backend!r}")
        if self.proxy and self.network:
            raise ValueError("a run has the host's network (network) or the gateway's proxy (proxy), not both")

    @property
    def process_limit(self) -> int:
        """`max_processes` for the suite, plus the run's own supervisors."""
        return self.max_processes + SUPERVISOR_PROCESSES[self.backend]

    @property
    def required(self) -> frozenset[Guarantee]:
        """The guarantees this run requires, the never-waived ones included."""
        return required_guarantees(self.require, network=self.network, proxy=self.proxy)


def required_guarantees(
    listed: Iterable[Guarantee] | None, *, network: bool, proxy: bool = False
) -> frozenset[Guarantee]:
    """Those `listed` (None: the default set), plus the unwaivable; no_network only for a run without network.

    A proxied run requires network_through_proxy in place of no_network, listed or not: without its own
    namespace it would have the host's network (and its listener could not be made); a run without the
    proxy does not require it (nothing to route)."""
    chosen = DEFAULT_REQUIRED if listed is None else frozenset(listed)
    required = chosen | ALWAYS_REQUIRED
    if proxy:
        return (required - {Guarantee.NO_NETWORK}) | {Guarantee.NETWORK_THROUGH_PROXY}
    required -= {Guarantee.NETWORK_THROUGH_PROXY}
    return required - {Guarantee.NO_NETWORK} if network else required
