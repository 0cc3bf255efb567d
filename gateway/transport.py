"""Newline-delimited JSON-RPC over stdin/stdout that answers malformed input (decisions 10 and 47).

The SDK's stdio transport drops a line it cannot parse without a reply. A gateway must
answer every message, and must not let one hostile line cost unbounded memory, so this
transport frames lines itself: a line over `max_message_bytes` gets -32600 without being
held in memory, broken JSON gets -32700, a batch or a non-object gets -32600, and a
message that is not JSON-RPC gets -32600 with its id when it has a usable one. Everything
else goes to the SDK unchanged.

Hostile but well-formed lines are answered here too, under their id when it can be read:
NaN/Infinity (not JSON) get -32700, nesting deeper than `MAX_DEPTH` and strings that are not
Unicode text (lone surrogates, which `json` accepts as escapes) get -32600. A response from
the client that is not valid JSON-RPC (an elicitation answer whose result is not an object)
reaches the SDK as an error for its id, so the question it answers is denied at once.
Everything written is ASCII-escaped JSON, and one answer that cannot be written is logged
and replaced by a -32603 error: no input line stops the writer.

While it serves, fd 0 reads /dev/null and fd 1 writes to stderr, so a stray print or a
child process can never write into the JSON-RPC stream. The client's pipes (or sockets, as a
Node host gives them) are read and written from the event loop without blocking it (`Wire`):
a call's request and answer cost no thread hop.

A client that closes its end of stdout can never be answered again (docs/operations.md, "The client stops reading"): a write
that fails with EPIPE, or a pipe whose reader is gone while there is nothing to write (the
kernel reports that at once), raises `ClientGoneError` out of the transport. That cancels
everything it served (calls in flight end as cancelled calls do: runs killed, terminal events
written) and `serve` exits with one line on stderr. A client that is alive but does not read is
only waited for: its answers queue behind the full pipe while runs keep their time limits.

Such a client may go on writing (decision 70): 20,000 pings it never read the answers of
held 20,000 answers in memory (RSS 101 -> 358 MB). So the reader passes no message on while more
than `MAX_OUTBOUND_BACKLOG` messages wait to be written (`OutboundBacklog`): the client's writes
then wait on its own full pipe, and once it reads, every answer follows, in order.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import select
import socket
import stat
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from gateway.canonical import is_text
from sandbox.task_groups import task_group

log = logging.getLogger("gateway.transport")

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
INTERNAL_ERROR = -32603
DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024
MAX_DEPTH = 64
"""Deepest nesting of objects and arrays a message may have (the message itself is depth 1)."""
_CHUNK = 65536
MAX_OUTBOUND_BACKLOG = 256
"""Messages handed to the writer and not yet written past which no more input is read (see above)."""

CLIENT_GONE = "the client stopped reading stdout (its end of the pipe is closed, EPIPE)"


class ClientGoneError(Exception):
    """The client closed its end of stdout: nothing more can be answered, so serving ends."""


class LineFramer:
    """Splits the bytes read into lines of at most `limit` bytes, the newline not counted.

    A longer line is dropped as it arrives, never held whole, and reported as None once it ends
    (at its newline or the end of input). Lines keep their newline; a last line without one is
    returned by `end`."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._partial = bytearray()
        self._oversized = False

    def feed(self, chunk: bytes) -> list[bytes | None]:
        lines: list[bytes | None] = []
        start = 0
        while (newline := chunk.find(b"\n", start)) >= 0:
            piece = chunk[start : newline + 1]
            start = newline + 1
            if self._oversized or len(self._partial) + len(piece) - 1 > self._limit:
                lines.append(None)
            else:
                lines.append(bytes(self._partial) + piece)
            self._partial.clear()
            self._oversized = False
        rest = chunk[start:]
        if not self._oversized and len(self._partial) + len(rest) > self._limit:
            self._partial.clear()
            self._oversized = True
        elif not self._oversized:
            self._partial += rest
        return lines

    @property
    def held(self) -> int:
        """Bytes held of the unfinished line (never more than the limit)."""
        return len(self._partial)

    def end(self) -> list[bytes | None]:
        """At the end of input: the unfinished last line, if any."""
        last: list[bytes | None] = [None] if self._oversized else [bytes(self._partial)] if self._partial else []
        self._partial.clear()
        self._oversized = False
        return last


class Wire:
    """The client's end of one direction of stdio, read or written from the event loop.

    A pipe is reopened through /proc/self/fd as a descriptor of the gateway's own, made
    non-blocking (the client's descriptor is not changed), and a socket (what a libuv host such
    as Node gives its children) is used with MSG_DONTWAIT: the loop waits for it to be ready, so
    a call costs no thread hop for its request or its answer, and a client that stops reading
    only leaves its answers waiting, never the loop. Anything else (a file, a terminal) is read
    and written by a worker thread, blocking there."""

    def __init__(self, fd: int, write: bool) -> None:
        self.fd = fd
        self._socket: socket.socket | None = None
        self._own: int | None = None
        mode = os.fstat(fd).st_mode
        if stat.S_ISSOCK(mode):
            self._socket = socket.socket(fileno=os.dup(fd))
        elif stat.S_ISFIFO(mode):
            flags = (os.O_WRONLY if write else os.O_RDONLY) | os.O_NONBLOCK | os.O_CLOEXEC
            with contextlib.suppress(OSError):  # no /proc: the worker threads do it
                self._own = os.open(f"/proc/self/fd/{fd}", flags)
        self._ready: int | None = self._socket.fileno() if self._socket is not None else self._own
        """The descriptor the event loop waits on, or None for worker threads."""

    def close(self) -> None:
        """Close the gateway's own descriptor (the one given stays open)."""
        if self._socket is not None:
            self._socket.close()
        elif self._own is not None:
            os.close(self._own)
        self._socket = self._own = self._ready = None

    async def read(self) -> bytes:
        """Some bytes, b"" at the end of input."""
        if self._ready is None:
            return await anyio.to_thread.run_sync(os.read, self.fd, _CHUNK, abandon_on_cancel=True)
        while True:
            try:
                if self._socket is not None:
                    return self._socket.recv(_CHUNK, socket.MSG_DONTWAIT)
                return os.read(self._ready, _CHUNK)
            except BlockingIOError:
                await anyio.wait_readable(self._ready)
            except ConnectionResetError:
                return b""

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            if self._ready is None:
                # In a worker thread: a client that stops reading must not stall the event loop,
                # which is what enforces time limits and kills runs.
                await anyio.to_thread.run_sync(_write_all, self.fd, view)
                return
            while view:
                try:
                    if self._socket is not None:
                        view = view[self._socket.send(view, socket.MSG_DONTWAIT) :]
                    else:
                        view = view[os.write(self._ready, view) :]
                except BlockingIOError:
                    await anyio.wait_writable(self._ready)
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise ClientGoneError(CLIENT_GONE) from exc


class OutboundBacklog:
    """How many outgoing messages wait to be written; `wait_for_room` holds the reader while over `limit`.

    Reading starts again once the writer is down to half the limit, not at each single write."""

    def __init__(self, limit: int = MAX_OUTBOUND_BACKLOG) -> None:
        self.limit = limit
        self.waiting = 0
        self._room = anyio.Event()
        self._room.set()

    def added(self) -> None:
        self.waiting += 1
        if self.waiting > self.limit and self._room.is_set():
            self._room = anyio.Event()

    def written(self) -> None:
        self.waiting -= 1
        if self.waiting <= self.limit // 2:
            self._room.set()

    async def wait_for_room(self) -> None:
        await self._room.wait()


class CountedSendStream:
    """The SDK's write stream: each message counts in the backlog from the moment it is handed over.

    The writer counts it written (`OutboundBacklog.written`); a send that fails never reached it."""

    def __init__(self, inner: MemoryObjectSendStream[SessionMessage], backlog: OutboundBacklog) -> None:
        self._inner = inner
        self._backlog = backlog

    async def send(self, item: SessionMessage, /) -> None:
        self._backlog.added()
        try:
            await self._inner.send(item)
        except BaseException:  # cancelled or closed while waiting: the writer will never count it
            self._backlog.written()
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> CountedSendStream:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        data = data[os.write(fd, data) :]


def _is_pipe_write_end(fd: int) -> bool:
    """Whether `fd` only writes into a pipe: then the kernel flags an error on it once no reader is left."""
    try:
        is_fifo = stat.S_ISFIFO(os.fstat(fd).st_mode)
        write_only = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY
    except OSError:
        return False
    return is_fifo and write_only


def _reader_gone(fd: int) -> bool:
    poller = select.poll()
    poller.register(fd, 0)  # no events asked for: POLLERR and POLLHUP are reported anyway
    return any(events & (select.POLLERR | select.POLLHUP) for _fd, events in poller.poll(0))


async def watch_client_reads(fd: int) -> None:
    """Raise ClientGoneError once the pipe `fd` writes into has no reader left, even with nothing to write.

    Returns at once when `fd` is not the write end of a pipe (a file, a socket): EPIPE alone tells then."""
    if not _is_pipe_write_end(fd):
        return
    while True:
        await anyio.wait_readable(fd)  # epoll reports a write end's error condition to a reader-interest wait
        if _reader_gone(fd):
            raise ClientGoneError(CLIENT_GONE)
        await anyio.sleep(0.1)  # not that condition after all: do not spin on it


def _usable_id(request_id: Any) -> str | int | None:
    if isinstance(request_id, bool) or not isinstance(request_id, str | int):
        return None
    if isinstance(request_id, str) and not is_text(request_id):
        return None
    return request_id


def error_line(request_id: Any, code: int, message: str) -> bytes:
    body = {"jsonrpc": "2.0", "id": _usable_id(request_id), "error": {"code": code, "message": message}}
    return json.dumps(body, separators=(",", ":"), ensure_ascii=True).encode() + b"\n"


class _NotJSON(ValueError):
    """NaN, Infinity or -Infinity: Python's json accepts them, JSON does not."""


def _refuse_constant(name: str) -> Any:
    raise _NotJSON(name)


def _loads(line: bytes) -> Any:
    # Strict UTF-8 first: json.loads(bytes) would let encoded surrogates (b"\xed\xa0\x80") through.
    return json.loads(line.decode("utf-8"), parse_constant=_refuse_constant)


def defect(data: Any) -> str | None:
    """What makes a parsed message unusable (too deep, not text), or None; iterative, never recursive."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            if depth > MAX_DEPTH:
                return f"nested deeper than {MAX_DEPTH} levels"
            for key, item in value.items():
                if not is_text(key):
                    return "a string is not Unicode text (lone surrogate)"
                stack.append((item, depth + 1))
        elif isinstance(value, list):
            if depth > MAX_DEPTH:
                return f"nested deeper than {MAX_DEPTH} levels"
            stack.extend((item, depth + 1) for item in value)
        elif isinstance(value, str) and not is_text(value):
            return "a string is not Unicode text (lone surrogate)"
    return None


_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\]:,]')
_ID_VALUE = re.compile(rb'\s*(-?\d+|"(?:[^"\\]|\\.)*")\s*[,}]')


def sniff_id(line: bytes) -> str | int | None:
    """The top-level `id` of a line `json` could not load (too deep, NaN), when it is a plain string or integer."""
    depth = 0
    previous = b""
    for match in _TOKEN.finditer(line):
        token = match.group()
        if token in (b"{", b"["):
            depth += 1
        elif token in (b"}", b"]"):
            depth -= 1
        elif depth == 1 and previous in (b"{", b",") and token == b'"id"':
            if not line[match.end() :].lstrip().startswith(b":"):
                return None
            colon = line.index(b":", match.end())
            value = _ID_VALUE.match(line, colon + 1)
            if value is None:
                return None
            try:
                return _usable_id(json.loads(value.group(1)))
            except ValueError:
                return None
        previous = token
    return None


def classify(line: bytes) -> SessionMessage | bytes | None:
    """A message for the SDK, an error line to send back, or None for a blank line."""
    if not line.strip():
        return None
    try:
        data = _loads(line)
    except _NotJSON:
        return error_line(sniff_id(line), PARSE_ERROR, "Parse error: NaN and Infinity are not JSON")
    except RecursionError:
        return error_line(sniff_id(line), INVALID_REQUEST, f"Invalid Request: nested deeper than {MAX_DEPTH} levels")
    except ValueError:
        return error_line(None, PARSE_ERROR, "Parse error")
    if not isinstance(data, dict):
        return error_line(None, INVALID_REQUEST, "Invalid Request: expected one JSON-RPC object (no batches)")
    if "id" in data and _usable_id(data["id"]) is None:
        return error_line(None, INVALID_REQUEST, "Invalid Request: id must be a string or a number")
    problem = defect(data)
    if problem is not None:
        if _is_response(data):
            return _failed_response(data["id"], problem)
        if "method" in data and "id" not in data:
            return None  # a malformed notification gets no reply, as JSON-RPC says
        return error_line(data.get("id"), INVALID_REQUEST, f"Invalid Request: {problem}")
    try:
        message = types.jsonrpc_message_adapter.validate_python(data, by_name=False)
    except (ValidationError, RecursionError):
        if _is_response(data):
            return _failed_response(data["id"], "the result is not a JSON-RPC result")
        if "method" in data and "id" not in data:
            return None  # a malformed notification gets no reply, as JSON-RPC says
        return error_line(data.get("id"), INVALID_REQUEST, "Invalid Request")
    return SessionMessage(message)


def _is_response(data: dict[str, Any]) -> bool:
    return "method" not in data and "id" in data and ("result" in data or "error" in data)


def _failed_response(request_id: str | int, problem: str) -> SessionMessage:
    """A client's malformed answer to one of our requests: an error for that request, so nothing waits on it."""
    error = types.ErrorData(code=INVALID_REQUEST, message=f"Invalid response: {problem}")
    return SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error))


def encode_message(session_message: SessionMessage) -> bytes:
    """One outgoing line: ASCII-escaped JSON, so a lone surrogate is written as a valid `\\ud800` escape."""
    body = session_message.message.model_dump(by_alias=True, exclude_unset=True, mode="json")
    return json.dumps(body, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode() + b"\n"


def fallback_line(session_message: SessionMessage) -> bytes | None:
    """What to write instead of an answer that cannot be encoded: -32603 under its id (None for other messages)."""
    message = session_message.message
    if isinstance(message, types.JSONRPCResponse | types.JSONRPCError):
        return error_line(message.id, INTERNAL_ERROR, "Internal error: the answer could not be encoded")
    return None


@contextlib.contextmanager
def _stdio_aside() -> Iterator[tuple[Wire, Wire]]:
    """The client's stdin and stdout as wires; meanwhile fd 0 reads /dev/null and fd 1 writes to stderr."""
    wire_in_fd, wire_out_fd = os.dup(0), os.dup(1)
    saved_in, saved_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    # wire_*_fd are left open on exit: a reader thread may still be blocked on wire_in as the process ends.
    wire_in, wire_out = Wire(wire_in_fd, write=False), Wire(wire_out_fd, write=True)
    try:
        yield wire_in, wire_out
    finally:
        wire_in.close()
        wire_out.close()
        os.dup2(saved_in, 0)
        os.dup2(saved_out, 1)
        os.close(saved_in)
        os.close(saved_out)


@asynccontextmanager
async def stdio_transport(
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, max_backlog: int = MAX_OUTBOUND_BACKLOG
) -> AsyncIterator[tuple[MemoryObjectReceiveStream[SessionMessage | Exception], CountedSendStream]]:
    with _stdio_aside() as (wire_in, wire_out):
        write_lock = anyio.Lock()

        async def write(data: bytes) -> None:
            async with write_lock:
                await wire_out.write(data)

        inbound_send, inbound_receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        outbound_send, outbound_receive = anyio.create_memory_object_stream[SessionMessage](0)
        framer = LineFramer(max_message_bytes)
        backlog = OutboundBacklog(max_backlog)

        async def read_loop() -> None:
            async with inbound_send:
                while True:
                    chunk = await wire_in.read()
                    for line in framer.feed(chunk) if chunk else framer.end():
                        if line is None:
                            await write(
                                error_line(None, INVALID_REQUEST, f"Request too large (over {max_message_bytes} bytes)")
                            )
                            continue
                        outcome = classify(line)
                        if isinstance(outcome, bytes):
                            await write(outcome)
                        elif outcome is not None:
                            await backlog.wait_for_room()  # a client that writes and does not read waits
                            await inbound_send.send(outcome)
                    if not chunk:
                        return

        async def write_loop() -> None:
            async with outbound_receive:
                async for session_message in outbound_receive:
                    try:
                        data: bytes | None = encode_message(session_message)
                    except Exception as exc:  # one bad message must not stop the writer
                        log.error("an outgoing message could not be encoded (%s); answered -32603", type(exc).__name__)  # noqa: TRY400  (one line, no traceback: the message may hold a token)
                        data = fallback_line(session_message)
                    try:
                        if data is not None:
                            await write(data)
                    finally:
                        backlog.written()

        async with task_group() as tg:  # the server's own failure leaves as itself, not as a group
            tg.start_soon(read_loop)
            tg.start_soon(write_loop)
            tg.start_soon(watch_client_reads, wire_out.fd)
            yield inbound_receive, CountedSendStream(outbound_send, backlog)
            tg.cancel_scope.cancel()
