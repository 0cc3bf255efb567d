"""Bodies relayed socket to socket by the kernel, never through Python's buffers (decision 97).

Once the proxy has let a connection through and checked its head (a tunnel's first bytes, a request's or a
response's head), what follows is a byte stream with a known end: a length, or the sender's close. `relay`
moves it with `splice(2)` (socket -> pipe -> socket, one pipe per direction) in a worker thread that polls
the sockets and a wake pipe, all non-blocking: it never sits in a system call the gateway cannot end.

Every bound of the Python copy is kept: each direction's bytes are taken from the run's `Budget` before they
are read (a splice of at most what is left, so the cap is exact over all the run's connections, whatever
thread moves them); a framed direction moves its length and not a byte past it; nothing moving either way
for `idle_s` ends the relay; `wake()` ends it within one poll, which is how a cancelled call or an ended run
stops it. What the sockets are and who closes them stays with the caller; the relay only shuts a socket's
sending side where the copy would have sent an EOF.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

PIPE_BYTES = 1024 * 1024
"""A relay pipe's size (F_SETPIPE_SZ; the default 64 KiB where the host refuses more): bytes per splice."""

_FLAGS = getattr(os, "SPLICE_F_MOVE", 1) | getattr(os, "SPLICE_F_NONBLOCK", 2)
_GONE = frozenset({errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, errno.ESHUTDOWN, errno.ETIMEDOUT})


def can_splice() -> bool:
    """Whether this Python and kernel splice (Linux, Python 3.10+)."""
    return hasattr(os, "splice")


class Ended(StrEnum):
    """How a relay ended."""

    DONE = "done"
    """The main direction reached its end: its length moved, or its sender closed."""
    BYTE_CAP = "byte_cap"
    """A direction had more to send than the run's budget left."""
    IDLE = "idle"
    GONE = "gone"
    """A socket failed (reset, or its peer stopped reading and went away)."""
    WOKEN = "woken"


@dataclass(slots=True)
class Budget:
    """One run's bytes each way, shared by every connection and thread: taken before a read, the unused part
    given back after, so that the sum never passes `max_bytes`."""

    max_bytes: int
    up: int = 0
    down: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, n: int, *, up: bool) -> int:
        """Up to `n` bytes reserved for one direction; 0 when none is left."""
        with self.lock:
            used = self.up if up else self.down
            got = max(0, min(n, self.max_bytes - used))
            if up:
                self.up += got
            else:
                self.down += got
            return got

    def give_back(self, n: int, *, up: bool) -> None:
        with self.lock:
            if up:
                self.up -= n
            else:
                self.down -= n

    def add(self, n: int, *, up: bool) -> bool:
        """All `n` bytes counted, or none and False when they would pass the cap."""
        with self.lock:
            used = self.up if up else self.down
            if used + n > self.max_bytes:
                return False
            if up:
                self.up += n
            else:
                self.down += n
            return True


@dataclass(slots=True)
class Direction:
    """One way of a relay: from `source` to `sink`, `length` bytes or (None) until `source` closes."""

    source: socket.socket
    sink: socket.socket
    up: bool
    length: int | None
    shut_at_end: bool = True
    """At the source's close, shut the sink's sending side (the copy's write_eof); a length never does."""
    moved: int = 0
    _pipe: tuple[int, int] = (-1, -1)
    _in_pipe: int = 0
    _ended: Ended | None = None

    def _left(self) -> int:
        return PIPE_BYTES if self.length is None else min(PIPE_BYTES, self.length - self.moved)


@dataclass(slots=True)
class Relay:
    """One connection's bodies: `main` decides when the relay ends; `side`, if any, runs beside it and ends it
    only by failing (a side that reaches its end leaves `main` going)."""

    budget: Budget
    idle_s: float
    main: Direction
    side: Direction | None = None
    on_moved: Callable[[], None] = lambda: None
    """Called from the relay's thread whenever bytes move (the connection's idle clock)."""
    _wake: tuple[int, int] = field(default_factory=os.pipe)

    def wake(self) -> None:
        """End the relay within one poll; safe from any thread, any number of times."""
        with contextlib.suppress(OSError):  # already woken (the pipe is full) or closed
            os.write(self._wake[1], b"x")

    def run(self) -> Ended:
        """Relay until `main` ends (or a bound, a failure, a wake); blocks: call it in a worker thread."""
        directions = [d for d in (self.main, self.side) if d is not None]
        try:
            for d in directions:
                d._pipe = _pipe()
            return self._loop(directions)
        finally:
            for d in directions:
                for fd in d._pipe:
                    if fd >= 0:
                        os.close(fd)
                d._pipe = (-1, -1)

    def close(self) -> None:
        """The wake pipe closed: only once `run` has returned (or never ran), so no wake writes to a reused fd."""
        for fd in self._wake:
            os.close(fd)
        self._wake = (-1, -1)

    def _loop(self, directions: list[Direction]) -> Ended:
        poller = select.poll()
        poller.register(self._wake[0], select.POLLIN)
        last = time.monotonic()
        while True:
            for d in directions:
                if d._ended is None and _step(d, self.budget):
                    last = time.monotonic()
                    self.on_moved()
            if self.main._ended is not None:
                return self.main._ended
            side = self.side
            if side is not None and side._ended not in (None, Ended.DONE):
                return side._ended
            wanted: dict[int, int] = {}
            for d in directions:
                if d._ended is None:
                    fd, event = (d.sink.fileno(), select.POLLOUT) if d._in_pipe else (d.source.fileno(), select.POLLIN)
                    wanted[fd] = wanted.get(fd, 0) | event
            for fd, events in wanted.items():
                poller.register(fd, events)
            left = self.idle_s - (time.monotonic() - last)
            if left <= 0:
                return Ended.IDLE
            ready = poller.poll(max(1, int(left * 1000) + 1))
            for fd in wanted:
                poller.unregister(fd)
            if any(fd == self._wake[0] for fd, _ in ready):
                return Ended.WOKEN


def _pipe() -> tuple[int, int]:
    read_end, write_end = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    with contextlib.suppress(OSError):  # the default size: more splices, same bytes
        fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    return read_end, write_end


def _step(d: Direction, budget: Budget) -> bool:
    """Move what can move without waiting; whether anything did. Sets `d._ended` when the direction ends."""
    progressed = False
    try:
        while True:
            if d._in_pipe:
                n = os.splice(d._pipe[0], d.sink.fileno(), d._in_pipe, flags=_FLAGS)
                d._in_pipe -= n
                progressed = True
                if d._in_pipe:
                    continue
            if d.length is not None and d.moved >= d.length:
                d._ended = Ended.DONE
                return progressed
            want = d._left()
            got = budget.take(want, up=d.up)
            if not got:
                if _has_more(d.source):
                    d._ended = Ended.BYTE_CAP
                elif _at_end(d.source):
                    _source_closed(d)
                return progressed
            try:
                n = os.splice(d.source.fileno(), d._pipe[1], got, flags=_FLAGS)
            except BaseException:
                budget.give_back(got, up=d.up)
                raise
            budget.give_back(got - n, up=d.up)
            if n == 0:
                _source_closed(d)
                return progressed
            d.moved += n
            d._in_pipe = n
            progressed = True
    except BlockingIOError:
        return progressed
    except OSError as exc:
        if exc.errno in _GONE or exc.errno == errno.EBADF:
            d._ended = Ended.GONE
            return progressed
        raise


def _source_closed(d: Direction) -> None:
    """The source sent its end: the direction is done; until-close directions pass the end on."""
    if d.length is None and d.shut_at_end:
        with contextlib.suppress(OSError):
            d.sink.shutdown(socket.SHUT_WR)
    d._ended = Ended.DONE


def _has_more(sock: socket.socket) -> bool:
    try:
        return bool(sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return False


def _at_end(sock: socket.socket) -> bool:
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except OSError:
        return False
