"""Per-process resource limits, soft = hard, set in the child before the uid drop (docs/security-model.md, layer 5).

Limits as root mean little: root ignores RLIMIT_NPROC and may raise any hard limit again. They
hold once `identity.drop_privileges` has run, so `apply()` goes before it in `preexec_fn`.
What they do not cover: RLIMIT_AS is per process (N processes may each use it), RLIMIT_FSIZE is
per file (a disk fill needs a size-limited tmpfs), RLIMIT_NPROC counts every process of the real
uid (hence one uid per run), RLIMIT_CPU is CPU time, not wall time (the runner's timeout is).
"""

from __future__ import annotations

import math
import resource
from dataclasses import dataclass

from sandbox.errors import SandboxStartError
from sandbox.limits import Limits

MIB = 1024 * 1024
DEFAULT_OPEN_FILES = 256
DEFAULT_FILE_SIZE_BYTES = 256 * MIB
SERVER_CPU_SECONDS = 24 * 3600
"""A long-lived server's CPU time per process (sandbox/server.py): it has no timeout to derive one from; past a day
of CPU the kernel ends that process (SIGXCPU, then SIGKILL): the server has ended, and says so."""


@dataclass(frozen=True, slots=True)
class ResourceLimits:
    address_space_bytes: int
    cpu_seconds: int
    open_files: int
    processes: int
    file_size_bytes: int
    core_bytes: int = 0

    def __post_init__(self) -> None:
        for name in ("address_space_bytes", "cpu_seconds", "open_files", "processes", "file_size_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int")
        if self.core_bytes != 0:
            raise ValueError("core dumps stay off: a core file holds the process's memory")

    @classmethod
    def from_limits(
        cls,
        limits: Limits,
        *,
        open_files: int = DEFAULT_OPEN_FILES,
        file_size_bytes: int = DEFAULT_FILE_SIZE_BYTES,
        cpu_seconds: int | None = None,
    ) -> ResourceLimits:
        """CPU gets the timeout plus one second: a backstop if the gateway stalls, never the first to fire
        (`cpu_seconds`, when given, instead: a long-lived server's SERVER_CPU_SECONDS)."""
        return cls(
            address_space_bytes=limits.memory_limit_mb * MIB,
            cpu_seconds=math.ceil(limits.timeout_s) + 1 if cpu_seconds is None else cpu_seconds,
            open_files=open_files,
            processes=limits.process_limit,
            file_size_bytes=file_size_bytes,
        )

    def settings(self) -> tuple[tuple[int, int], ...]:
        """(resource, value) pairs in the order `apply` sets them."""
        return (
            (resource.RLIMIT_CORE, self.core_bytes),
            (resource.RLIMIT_AS, self.address_space_bytes),
            (resource.RLIMIT_CPU, self.cpu_seconds),
            (resource.RLIMIT_NOFILE, self.open_files),
            (resource.RLIMIT_NPROC, self.processes),
            (resource.RLIMIT_FSIZE, self.file_size_bytes),
        )


def apply(limits: ResourceLimits) -> None:
    """Set every limit with soft = hard and check it took. Safe in `preexec_fn`: system calls only."""
    for which, value in limits.settings():
        resource.setrlimit(which, (value, value))
        if resource.getrlimit(which) != (value, value):
            raise SandboxStartError("rlimit_not_applied")
