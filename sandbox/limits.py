"""The limits a run is held to, and the isolation layers it must have, as one frozen value."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Literal

from sandbox.pinned import Pinned

MIB = 1024 * 1024
SUPERVISOR_PROCESSES: Mapping[str, int] = MappingProxyType({"native": 2, "bubblewrap": 3})
"""Processes a run holds besides the suite's own, added to its process limits: natively the PID
namespace's two supervisors (backends/pidns.py); with bubblewrap the watchdog, bwrap and its pid 1."""

Backend = Literal["native", "bubblewrap"]
BACKENDS: tuple[Backend, ...] = ("native", "bubblewrap")

BACKEND_LAYERS: Mapping[Backend, tuple[str, ...]] = MappingProxyType(
    {
        # Every layer applied by the gateway itself, in the child between fork and exec.
        "native": (
            "uid_drop", "cgroup", "network_namespace", "ipc_namespace", "scratch_tmpfs", "rlimits", "landlock",
            "seccomp", "pid_namespace",
        ),
        # The same root-only steps, then bubblewrap, started after the uid drop: its mount tree
        # stands in for Landlock (which would forbid bubblewrap's own mounts) and it installs
        # the seccomp program just before the command.
        "bubblewrap": (
            "uid_drop", "cgroup", "network_namespace", "ipc_namespace", "scratch_tmpfs", "rlimits", "mount_tree",
            "pid_namespace", "seccomp",
        ),
    }
)  # fmt: skip
"""The layers each backend applies (sandbox/confine.py; docs/security-model.md)."""

ALWAYS_REQUIRED: Mapping[Backend, frozenset[str]] = MappingProxyType(
    {"native": frozenset({"uid_drop"}), "bubblewrap": frozenset({"uid_drop", "mount_tree"})}
)
"""Layers no policy may waive: without the uid drop a run is root; bubblewrap without its mount
tree would confine no file at all (it has no Landlock)."""


def required_layers(backend: Backend, listed: Iterable[str] | None) -> frozenset[str]:
    """The layers a run of `backend` requires: those `listed` (None: all of the backend's), plus the unwaivable."""
    chosen = BACKEND_LAYERS[backend] if listed is None else listed
    return frozenset(chosen) | ALWAYS_REQUIRED[backend]


LAYERS: tuple[str, ...] = tuple(dict.fromkeys(name for names in BACKEND_LAYERS.values() for name in names))
"""Every layer the sandbox knows, of either backend."""


@dataclass(frozen=True, slots=True)
class Limits:
    timeout_s: float
    memory_limit_mb: int
    max_processes: int
    max_output_bytes: int
    network: bool = False
    allowed_paths: tuple[Path | Pinned, ...] = ()
    """Extra read-only grants; a Pinned one is reached through its fd only (sandbox/pinned.py)."""
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    scratch_bytes: int = 256 * MIB
    """Size of the scratch tmpfs, the run's only writable place (its inode count follows the size)."""
    backend: Backend = "native"
    required_layers: frozenset[str] | None = None
    """Layers without which the run must not start (None: every layer of the backend); any
    other layer of the backend is applied where the host has it."""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown sandbox backend: {self.backend!r}")
        unknown = self.required - set(BACKEND_LAYERS[self.backend])
        if unknown:
            raise ValueError(f"layers the {self.backend} backend does not have: {sorted(unknown)}")

    @property
    def process_limit(self) -> int:
        """`max_processes` for the suite, plus the run's own supervisors."""
        return self.max_processes + SUPERVISOR_PROCESSES[self.backend]

    @property
    def required(self) -> frozenset[str]:
        """The layers this run requires, the backend's never-waived ones included."""
        return required_layers(self.backend, self.required_layers)
