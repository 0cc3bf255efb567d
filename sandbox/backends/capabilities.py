"""This process's effective capabilities, read from /proc/self/status (root without CAP_SYS_ADMIN: decision 57)."""

from __future__ import annotations

from pathlib import Path

CAP_SETGID = 6
CAP_SETUID = 7
CAP_NET_ADMIN = 12
CAP_SYS_ADMIN = 21


def effective(status: str | None = None) -> int:
    """The CapEff bit mask (0 when it cannot be read: then nothing is assumed)."""
    try:
        text = Path("/proc/self/status").read_text() if status is None else status
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def has(*capabilities: int) -> bool:
    """Whether this process holds every one of `capabilities` in its effective set."""
    mask = effective()
    return all(mask >> number & 1 for number in capabilities)
