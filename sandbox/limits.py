"""The limits a run is held to, as one frozen value."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class Limits:
    timeout_s: float
    memory_limit_mb: int
    max_processes: int
    max_output_bytes: int
    network: bool = False
    allowed_paths: tuple[Path, ...] = ()
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
