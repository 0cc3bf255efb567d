"""The console's sign-in state: server-side sessions, CSRF tokens and the sign-in rate limit.

A session is a random 256-bit id in a cookie (HttpOnly, SameSite=Strict, Secure under TLS); what it
stands for (user, CSRF token, expiry) lives only in this process, so a console restart signs
everyone out and nothing in the cookie can be forged or replayed elsewhere. Every form carries the
session's CSRF token, compared in constant time. Before sign-in, the form's token is an HMAC of a
random per-process key and a random cookie value (double submit). Sign-in attempts are counted per
user name and per client address (every loopback address one) over a sliding window, each counted
before its password is checked; past the limit the form answers 429 without checking it.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
import threading
from collections import Counter, deque
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
STREAMS_PER_SESSION = 4
"""Live views one session may hold open at once (a few tabs)."""
STREAMS_PER_USER = 8
"""Live views one user may hold open at once, over all their sessions."""


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


def address_key(address: str) -> str:
    """The key an address's failures are counted under: every loopback address is one key.

    Each process on the host can connect from any address of 127.0.0.0/8 (and from ::1): keyed by
    the address itself, the per-address limit would bind no local process at all. Counted together,
    local sign-ins share the limit, whichever local process or user makes them (decision 65).
    """
    text = address.strip("[]")
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return "loopback" if ip.is_loopback else str(ip)


@dataclass
class SignInLimit:
    """Sign-in attempts per user name and per client address over a sliding window.

    An attempt takes its slot before its password is checked (`reserve`, under one lock), so however
    many sign-ins arrive at once, at most `FAILURES_PER_NAME` passwords of a name are checked per
    window. A failed attempt keeps its slot; an accepted one gives its slots back and clears the
    name's failures (the person who knows the password is not locked out by someone who does not).
    """

    clock: Clock
    _failures: dict[str, deque[float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def reserve(self, name: str, address: str) -> Attempt | int:
        """An `Attempt` holding a slot of `name` and of `address`, or the seconds until one may be tried."""
        now = self.clock.now()
        keys = (f"name:{name}", f"addr:{address_key(address)}")
        with self._lock:
            wait = max(self._wait(keys[0], FAILURES_PER_NAME, now), self._wait(keys[1], FAILURES_PER_ADDRESS, now))
            if wait:
                return wait
            for key in keys:
                self._failures.setdefault(key, deque()).append(now)
            if len(self._failures) > 10_000:  # bounded: the oldest keys go first
                for key in list(self._failures)[:5_000]:
                    del self._failures[key]
        return Attempt(keys, now)

    def succeeded(self, attempt: Attempt) -> None:
        """The attempt's password was right: its slots back, and the name's failures forgotten."""
        name_key, address_key_ = attempt.keys
        with self._lock:
            self._failures.pop(name_key, None)
            times = self._failures.get(address_key_)
            if times is not None and attempt.at in times:
                times.remove(attempt.at)

    def _wait(self, key: str, limit: int, now: float) -> int:
        times = self._failures.get(key)
        if not times:
            return 0
        while times and now - times[0] >= FAILURE_WINDOW_S:
            times.popleft()
        if len(times) < limit:
            return 0
        return max(1, int(times[0] + FAILURE_WINDOW_S - now) + 1)


@dataclass(frozen=True, slots=True)
class Attempt:
    """A sign-in's reserved slots: the keys it counts under and when it was made."""

    keys: tuple[str, str]
    at: float


@dataclass
class StreamSlots:
    """The live views (`/api/stream`) open now, per session and per user: each holds a database poll
    four times a second, so a session or a user that opens more than its share is refused."""

    _by_session: Counter[str] = field(default_factory=Counter)
    _by_user: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, session_id: str, user: str) -> StreamSlot | str:
        """A slot for one more stream, or why there is none (words for the person)."""
        with self._lock:
            if self._by_session[session_id] >= STREAMS_PER_SESSION:
                return (
                    f"this session already has {STREAMS_PER_SESSION} live views open: "
                    "close a console tab, or wait for one to end"
                )
            if self._by_user[user] >= STREAMS_PER_USER:
                return (
                    f"user {user} already has {STREAMS_PER_USER} live views open: "
                    "close console tabs (in any browser signed in as them)"
                )
            self._by_session[session_id] += 1
            self._by_user[user] += 1
        return StreamSlot(self, session_id, user)

    def _give_back(self, session_id: str, user: str) -> None:
        with self._lock:
            for counter, key in ((self._by_session, session_id), (self._by_user, user)):
                counter[key] -= 1
                if counter[key] <= 0:
                    del counter[key]


@dataclass
class StreamSlot:
    """One open stream's place; `release` gives it back, once however often it is called."""

    slots: StreamSlots
    session_id: str
    user: str
    _released: bool = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.slots._give_back(self.session_id, self.user)
