"""Newline-delimited JSON-RPC over stdin/stdout that answers malformed input (spec section 4).

The SDK's stdio transport drops a line it cannot parse without a reply. A gateway must
answer every message, and must not let one hostile line cost unbounded memory, so this
transport frames lines itself: a line over `max_message_bytes` gets -32600 without being
held in memory, broken JSON gets -32700, a batch or a non-object gets -32600, and a
message that is not JSON-RPC gets -32600 with its id when it has a usable one. Everything
else goes to the SDK unchanged.

While it serves, fd 0 reads /dev/null and fd 1 writes to stderr, so a stray print or a
child process can never write into the JSON-RPC stream.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, BinaryIO

import anyio
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024
_CHUNK = 65536


class LineReader:
    """Reads lines of at most `limit` bytes; a longer line is skipped and reported as None."""

    def __init__(self, stream: BinaryIO, limit: int) -> None:
        self._stream = stream
        self._limit = limit

    def read(self) -> bytes | EOFError | None:
        line = self._stream.readline(self._limit + 1)
        if not line:
            return EOFError()
        fits = len(line) <= self._limit or (len(line) == self._limit + 1 and line.endswith(b"\n"))
        if fits:
            return line
        while line and not line.endswith(b"\n"):  # drain the rest of the oversized line
            line = self._stream.readline(_CHUNK)
        return None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def error_line(request_id: Any, code: int, message: str) -> bytes:
    usable = request_id if isinstance(request_id, str | int) and not isinstance(request_id, bool) else None
    body = {"jsonrpc": "2.0", "id": usable, "error": {"code": code, "message": message}}
    return json.dumps(body, separators=(",", ":")).encode() + b"\n"


def classify(line: bytes) -> SessionMessage | bytes | None:
    """A message for the SDK, an error line to send back, or None for a blank line."""
    if not line.strip():
        return None
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):
        return error_line(None, PARSE_ERROR, "Parse error")
    if not isinstance(data, dict):
        return error_line(None, INVALID_REQUEST, "Invalid Request: expected one JSON-RPC object (no batches)")
    if "id" in data and (not isinstance(data["id"], str | int) or isinstance(data["id"], bool)):
        return error_line(None, INVALID_REQUEST, "Invalid Request: id must be a string or a number")
    try:
        message = types.jsonrpc_message_adapter.validate_python(data, by_name=False)
    except (ValidationError, RecursionError):
        if "method" in data and "id" not in data:
            return None  # a malformed notification gets no reply, as JSON-RPC says
        return error_line(data.get("id"), INVALID_REQUEST, "Invalid Request")
    return SessionMessage(message)


@asynccontextmanager
async def stdio_transport(
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> AsyncIterator[
    tuple[MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]]
]:
    wire_in_fd, wire_out_fd = os.dup(0), os.dup(1)
    saved_in, saved_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    # Left open on exit: a reader thread may still be blocked on wire_in as the process ends.
    wire_in = os.fdopen(wire_in_fd, "rb", buffering=_CHUNK)
    write_lock = anyio.Lock()

    async def write(data: bytes) -> None:
        # In a worker thread: a client that stops reading must not stall the event loop,
        # which is what enforces time limits and kills runs.
        async with write_lock:
            await anyio.to_thread.run_sync(_write_all, wire_out_fd, data)

    inbound_send, inbound_receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    outbound_send, outbound_receive = anyio.create_memory_object_stream[SessionMessage](0)
    reader = LineReader(wire_in, max_message_bytes)

    async def read_loop() -> None:
        async with inbound_send:
            while True:
                line = await anyio.to_thread.run_sync(reader.read, abandon_on_cancel=True)
                if isinstance(line, EOFError):
                    return
                if line is None:
                    await write(
                        error_line(None, INVALID_REQUEST, f"Request too large (over {max_message_bytes} bytes)")
                    )
                    continue
                outcome = classify(line)
                if isinstance(outcome, bytes):
                    await write(outcome)
                elif outcome is not None:
                    await inbound_send.send(outcome)

    async def write_loop() -> None:
        async with outbound_receive:
            async for session_message in outbound_receive:
                data = session_message.message.model_dump_json(by_alias=True, exclude_unset=True)
                await write(data.encode() + b"\n")

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(read_loop)
            tg.start_soon(write_loop)
            yield inbound_receive, outbound_send
            tg.cancel_scope.cancel()
    finally:
        os.dup2(saved_in, 0)
        os.dup2(saved_out, 1)
        os.close(saved_in)
        os.close(saved_out)
