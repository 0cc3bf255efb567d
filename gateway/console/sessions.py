"""The console's sign-in state: server-side sessions, CSRF tokens and the sign-in rate limit.

A session is a random 256-bit id in a cookie (HttpOnly, SameSite=Strict, Secure under TLS); what it
stands for (user, CSRF token, expiry) lives only in this process, so a console restart signs
everyone out and nothing in the cookie can be forged or replayed elsewhere. Every form carries the
session's CSRF token, compared in constant time. Before sign-in, the form's token is an HMAC of a
random per-process key and a random cookie value (double submit). Failed sign-ins are counted per
user name and per client address over a sliding window; past the limit the form answers 429.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
from collections import deque
from dataclasses import dataclass, field

from gateway.clock import Clock

IDLE_S = 1800.0
"""A session unused this long is over."""
LIFETIME_S = 12 * 3600.0
"""A session is over this long after sign-in, used or not."""
MAX_SESSIONS = 1000
FAILURES_PER_NAME = 5
FAILURES_PER_ADDRESS = 20
FAILURE_WINDOW_S = 300.0


@dataclass(slots=True)
class Session:
    user: str
    csrf: str
    started_at: float
    seen_at: float


@dataclass
class SessionBook:
    """The open sessions of this console process."""

    clock: Clock
    _sessions: dict[str, Session] = field(default_factory=dict)
    _key: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    _lock: threading.Lock = field(default_factory=threading.Lock)
    """Requests are answered on several threads."""

    def open(self, user: str) -> str:
        """A new session for `user`; returns its id (the cookie's value)."""
        now = self.clock.now()
        sid = secrets.token_urlsafe(32)
        with self._lock:
            self._sweep(now)
            if len(self._sessions) >= MAX_SESSIONS:
                oldest = min(self._sessions, key=lambda known: self._sessions[known].seen_at)
                del self._sessions[oldest]
            self._sessions[sid] = Session(user, secrets.token_urlsafe(32), now, now)
        return sid

    def fetch(self, sid: str | None) -> Session | None:
        """The live session of this id, touched; None when unknown or over."""
        if not sid:
            return None
        now = self.clock.now()
        with self._lock:
            session = self._sessions.get(sid)
            if session is None:
                return None
            if not is_live(session, now):
                del self._sessions[sid]
                return None
            session.seen_at = now
            return session

    def close(self, sid: str | None) -> None:
        if sid:
            with self._lock:
                self._sessions.pop(sid, None)

    def close_user(self, user: str) -> None:
        with self._lock:
            for sid in [sid for sid, s in self._sessions.items() if s.user == user]:
                del self._sessions[sid]

    def pre_token(self, nonce: str) -> str:
        """The sign-in form's CSRF token for the pre-session cookie `nonce`."""
        return hmac.new(self._key, nonce.encode(), hashlib.sha256).hexdigest()

    def _sweep(self, now: float) -> None:
        for sid in [sid for sid, s in self._sessions.items() if not is_live(s, now)]:
            del self._sessions[sid]


def is_live(session: Session, now: float) -> bool:
    return now - session.seen_at < IDLE_S and now - session.started_at < LIFETIME_S


def tokens_match(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


@dataclass
class SignInLimit:
    """Failed sign-ins per user name and per client address over a sliding window."""

    clock: Clock
    _failures: dict[str, deque[float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def retry_after(self, name: str, address: str) -> int:
        """0 when a sign-in may be tried now; else the seconds until one may."""
        now = self.clock.now()
        with self._lock:
            waits = [
                self._wait(f"name:{name}", FAILURES_PER_NAME, now),
                self._wait(f"addr:{address}", FAILURES_PER_ADDRESS, now),
            ]
        return max(waits)

    def failed(self, name: str, address: str) -> None:
        now = self.clock.now()
        with self._lock:
            for key in (f"name:{name}", f"addr:{address}"):
                self._failures.setdefault(key, deque()).append(now)
            if len(self._failures) > 10_000:  # bounded: the oldest keys go first
                for key in list(self._failures)[:5_000]:
                    del self._failures[key]

    def succeeded(self, name: str) -> None:
        with self._lock:
            self._failures.pop(f"name:{name}", None)

    def _wait(self, key: str, limit: int, now: float) -> int:
        times = self._failures.get(key)
        if not times:
            return 0
        while times and now - times[0] >= FAILURE_WINDOW_S:
            times.popleft()
        if len(times) < limit:
            return 0
        return max(1, int(times[0] + FAILURE_WINDOW_S - now) + 1)
