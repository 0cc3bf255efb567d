"""`notifications/progress` for a call that waits: for a person's consent, and for its run.

A client that sends `_meta.progressToken` with its `tools/call` hears from the gateway while the
call waits: at once when the wait begins, then every HEARTBEAT_S, and as soon as what it waits
for moves (a test finished), at most one notification every MIN_GAP_S. So a client that resets
its request timeout on progress (the TypeScript SDK's `resetTimeoutOnProgress`) keeps waiting
as long as the gateway does, and the person sees what the call waits for.

`progress` is the seconds since the call began: the protocol wants it to grow with every
notification, and time does, through every phase of the call. `total` is left out (no phase
knows the whole call's length). `message` is the part to read: what the call waits for and,
for consent, where to answer and the time left; for a suite, the tests done of those collected.
Nothing the run wrote is copied into it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Protocol

import anyio

from sandbox.task_groups import task_group

log = logging.getLogger("gateway.progress")

HEARTBEAT_S = 5.0
"""Seconds between two notifications while nothing moves (clients time out after 60 s and more)."""
MIN_GAP_S = 1.0
"""At most one notification a second, however fast the suite moves."""

Send = Callable[[float, str], Awaitable[None]]
"""Sends one notification: (progress, message)."""


class CallProgress(Protocol):
    """What the stages that wait use: a phase of waiting, and a nudge when it moves."""

    def waiting(self, describe: Callable[[], str]) -> contextlib.AbstractAsyncContextManager[None]: ...

    def moved(self) -> None: ...


class NoProgress:
    """For a call whose client asked for no progress (no progressToken): nothing is sent."""

    @contextlib.asynccontextmanager
    async def waiting(self, describe: Callable[[], str]) -> AsyncIterator[None]:
        yield

    def moved(self) -> None:
        return None


NO_PROGRESS = NoProgress()


class Notifier:
    """Progress notifications for one call, sent by `send` (gateway/server.py: to the caller's token).

    `waiting(describe)` sends `describe()` when the phase begins, then every `heartbeat_s` and
    after each `moved()`, until the phase ends. Whatever ends the phase leaves it as itself (a
    person's "no" is a ConsentDeniedError, never a group: sandbox/task_groups.py). A notification
    that cannot be made or sent (`describe()` failing, the client gone) ends the notifications of
    this call, never the call: what ends a call whose client is gone is the transport
    (gateway/transport.py).
    """

    def __init__(
        self,
        send: Send,
        *,
        clock: Callable[[], float] = time.monotonic,
        heartbeat_s: float = HEARTBEAT_S,
        min_gap_s: float = MIN_GAP_S,
    ) -> None:
        self._send = send
        self._clock = clock
        self._began = clock()
        self._heartbeat_s = heartbeat_s
        self._min_gap_s = min_gap_s
        self._last_progress = -1.0
        self._last_sent_at = float("-inf")
        self._moved = anyio.Event()
        self._broken = False

    @contextlib.asynccontextmanager
    async def waiting(self, describe: Callable[[], str]) -> AsyncIterator[None]:
        async with task_group() as group:
            group.start_soon(self._beat, describe)
            try:
                yield
            finally:
                group.cancel_scope.cancel()

    def moved(self) -> None:
        self._moved.set()

    async def _beat(self, describe: Callable[[], str]) -> None:
        while not self._broken:
            await anyio.sleep(max(0.0, self._last_sent_at + self._min_gap_s - self._clock()))
            self._moved = anyio.Event()
            try:
                message = describe()
            except Exception:  # a bug in a describer must not end the call it describes
                log.exception("progress notifications stopped: the message could not be made")
                self._broken = True
                return
            await self._notify(message)
            with anyio.move_on_after(self._heartbeat_s):
                await self._moved.wait()

    async def _notify(self, message: str) -> None:
        # Rounded to the millisecond, and strictly above the last one even if the clock stood still.
        progress = max(round(self._clock() - self._began, 3), round(self._last_progress + 0.001, 3))
        try:
            await self._send(progress, message)
        except Exception as exc:  # the client went away, or its stream broke
            log.info("progress notifications stopped: %s", type(exc).__name__)
            self._broken = True
            return
        self._last_progress = progress
        self._last_sent_at = self._clock()


def progress_token(params: Any) -> str | int | None:
    """The request's `_meta.progressToken`, when it is one (a string or an integer, as the protocol says)."""
    meta = params.get("_meta") if isinstance(params, Mapping) else None
    token = meta.get("progressToken") if isinstance(meta, Mapping) else None
    if isinstance(token, bool) or not isinstance(token, str | int):
        return None
    return token


def seconds_left(deadline: float, clock: Callable[[], float] = time.monotonic) -> int:
    return max(0, round(deadline - clock()))
