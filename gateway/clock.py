"""Injected time and ids, so expiry, windows and lifetimes are tested without sleeping."""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import NewType, Protocol

RunId = NewType("RunId", str)


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch (UTC)."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.time()


def new_run_id() -> RunId:
    return RunId(uuid.uuid4().hex)


def new_token_id() -> str:
    """128 random bits as hex: never starts with `-`, so `token revoke JTI` never reads it as an option."""
    return secrets.token_hex(16)


IdFactory = Callable[[], RunId]


def iso_utc(epoch_s: float) -> str:
    """Fixed-width ISO 8601 in UTC, so strings sort in time order."""
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_iso(text: str) -> float:
    """Parse ISO 8601 (a naive time is taken as UTC) to epoch seconds; ValueError if not ISO."""
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()
