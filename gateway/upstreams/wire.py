"""An upstream server's pipes as JSON-RPC messages (docs/upstreams.md, decision 84): lines bounded, notification floods dropped.

The server is untrusted: a line longer than the cap ends the connection (the pending calls fail, and
the caller learns why from `Wire.over_limit`), and notifications past a rate are dropped before the
SDK's session sees them, logged once per connection. What the session writes goes out as one line per
message.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import anyio
import anyio.abc
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage

from sandbox.task_groups import task_group

log = logging.getLogger("gateway.upstreams")

NOTIFICATIONS_PER_S = 50.0
"""A server's notifications (progress, logging, list changes) beyond this rate are dropped."""
NOTIFICATION_BURST = 200.0
ENVELOPE_BYTES = 64 * 1024
"""A message's line may exceed the result cap by this much (the JSON-RPC envelope around a result)."""
_CHUNK = 64 * 1024


@dataclass(slots=True)
class Bucket:
    """A token bucket: `take` is True while the rate allows one more."""

    rate: float
    burst: float
    clock: Callable[[], float] = time.monotonic
    tokens: float = field(init=False)
    at: float = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = self.burst
        self.at = self.clock()

    def take(self) -> bool:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


@dataclass(slots=True)
class Wire:
    """What happened on the pipes of one connection."""

    name: str
    line_cap: int
    over_limit: bool = False
    """The server wrote a line over `line_cap`: the connection was ended for it."""
    dropped: int = 0
    """Notifications dropped for the rate."""
    bucket: Bucket = field(default_factory=lambda: Bucket(NOTIFICATIONS_PER_S, NOTIFICATION_BURST))
    ended: anyio.Event = field(default_factory=anyio.Event)
    """Set when nothing more is read: the server closed its stdout, or a line went over the cap."""
    on_list_changed: Callable[[], None] | None = None
    """Told, as the line is read (before any later message reaches the session), that the server said
    its tools changed."""

    def admit(self, message: types.JSONRPCMessage) -> bool:
        if not isinstance(message, types.JSONRPCNotification) or self.bucket.take():
            return True
        if self.dropped == 0:
            log.warning(
                "upstream %s: notifications over %g a second are dropped (this is logged once per server start)",
                self.name,
                NOTIFICATIONS_PER_S,
            )
        self.dropped += 1
        return False


Streams = tuple[MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]]


@contextlib.asynccontextmanager
async def session_streams(
    wire: Wire, stdin: anyio.abc.ByteSendStream, stdout: anyio.abc.ByteReceiveStream
) -> AsyncIterator[Streams]:
    """The read and write streams a ClientSession takes, over the server's stdin and stdout."""
    to_session, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](16)
    write_stream, from_session = anyio.create_memory_object_stream[SessionMessage](16)

    async def read() -> None:
        try:
            async with to_session:
                await _read_lines(wire, stdout, to_session)
        finally:
            wire.ended.set()

    async def write() -> None:
        async with from_session:
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                async for message in from_session:
                    text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await stdin.send(text.encode() + b"\n")

    async with task_group() as group:
        group.start_soon(read)
        group.start_soon(write)
        try:
            yield read_stream, write_stream
        finally:
            group.cancel_scope.cancel()
            for stream in (read_stream, write_stream):
                await stream.aclose()


async def _read_lines(
    wire: Wire, stdout: anyio.abc.ByteReceiveStream, to_session: MemoryObjectSendStream[SessionMessage | Exception]
) -> None:
    buffer = b""
    with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
        while True:
            buffer += await stdout.receive(_CHUNK)
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if line.strip():
                    await _deliver(wire, line, to_session)
            if len(buffer) > wire.line_cap:
                _over(wire)
                return


def _over(wire: Wire) -> None:
    wire.over_limit = True
    log.warning("upstream %s: a message over %d bytes; the connection is ended", wire.name, wire.line_cap)


async def _deliver(wire: Wire, line: bytes, to_session: MemoryObjectSendStream[SessionMessage | Exception]) -> None:
    if len(line) > wire.line_cap:
        _over(wire)
        raise anyio.ClosedResourceError
    try:
        message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValueError:
        log.info("upstream %s: a line that is not a JSON-RPC message was ignored", wire.name)
        return
    if not wire.admit(message):
        return
    is_change = isinstance(message, types.JSONRPCNotification) and message.method == "notifications/tools/list_changed"
    if is_change and wire.on_list_changed is not None:
        wire.on_list_changed()
    await to_session.send(SessionMessage(message))
