"""The limits a run is held to, and the isolation layers it must have, as one frozen value."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

MIB = 1024 * 1024

LAYERS = ("uid_drop", "cgroup", "network_namespace", "scratch_tmpfs", "rlimits", "landlock", "seccomp")
"""Every isolation layer the sandbox knows (sandbox/confine.py applies them; docs/security-model.md)."""


@dataclass(frozen=True, slots=True)
class Limits:
    timeout_s: float
    memory_limit_mb: int
    max_processes: int
    max_output_bytes: int
    network: bool = False
    allowed_paths: tuple[Path, ...] = ()
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    scratch_bytes: int = 256 * MIB
    """Size of the scratch tmpfs, the run's only writable place (its inode count follows the size)."""
    required_layers: frozenset[str] = frozenset(LAYERS)
    """Layers without which the run must not start; any other layer is applied where the host has it."""

    def __post_init__(self) -> None:
        unknown = self.required_layers - set(LAYERS)
        if unknown:
            raise ValueError(f"unknown sandbox layers: {sorted(unknown)}")
