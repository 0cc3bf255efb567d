"""gateway/transport.py: classifying each line, and framing lines with a size limit."""

from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp.shared.message import SessionMessage

from gateway.transport import (
    INVALID_REQUEST,
    PARSE_ERROR,
    ClientGoneError,
    LineFramer,
    OutboundBacklog,
    Wire,
    classify,
    encode_message,
    error_line,
    fallback_line,
)


def error_of(reply: object) -> dict[str, Any]:
    assert isinstance(reply, bytes)
    assert reply.endswith(b"\n")
    assert reply.count(b"\n") == 1
    body: dict[str, Any] = json.loads(reply)
    assert body["jsonrpc"] == "2.0"
    assert "result" not in body
    return body


# --- classify ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "code", "request_id"),
    [
        pytest.param(b"{broken", PARSE_ERROR, None, id="broken-json"),
        pytest.param(b'{"jsonrpc":"2.0","id":1,', PARSE_ERROR, None, id="truncated"),
        pytest.param(b"\xff\xfe{}", PARSE_ERROR, None, id="not-utf8"),
        pytest.param(b"[" * 100_000 + b"]" * 100_000, INVALID_REQUEST, None, id="nested-too-deep"),
        pytest.param(b'[{"jsonrpc":"2.0","id":1,"method":"ping"}]', INVALID_REQUEST, None, id="batch"),
        pytest.param(b"[]", INVALID_REQUEST, None, id="empty-batch"),
        pytest.param(b'"ping"', INVALID_REQUEST, None, id="string"),
        pytest.param(b"42", INVALID_REQUEST, None, id="number"),
        pytest.param(b"null", INVALID_REQUEST, None, id="null"),
        pytest.param(b'{"id":7,"hello":"world"}', INVALID_REQUEST, 7, id="id-but-not-jsonrpc"),
        pytest.param(b'{"jsonrpc":"1.0","id":"abc","method":"ping"}', INVALID_REQUEST, "abc", id="wrong-version"),
        pytest.param(b'{"jsonrpc":"2.0","id":5}', INVALID_REQUEST, 5, id="id-without-method-or-result"),
        pytest.param(b'{"jsonrpc":"2.0","id":9,"method":42}', INVALID_REQUEST, 9, id="method-not-a-string"),
        pytest.param(b'{"jsonrpc":"2.0","id":true,"method":"ping"}', INVALID_REQUEST, None, id="bool-id-not-echoed"),
        pytest.param(b'{"jsonrpc":"2.0","id":[1],"method":"ping"}', INVALID_REQUEST, None, id="list-id-not-echoed"),
        pytest.param(b'{"jsonrpc":"2.0","id":"\\ud800","method":"ping"}', INVALID_REQUEST, None, id="surrogate-id"),
        pytest.param(b'{"jsonrpc":"2.0","id":3,"method":"\\ud800"}', INVALID_REQUEST, 3, id="surrogate-method"),
        pytest.param(
            b'{"jsonrpc":"2.0","id":3,"method":"x","params":{"\\udfff":1}}', INVALID_REQUEST, 3, id="surrogate-key"
        ),
        pytest.param(b'{"jsonrpc":"2.0","id":4,"method":"x","params":{"a":[NaN]}}', PARSE_ERROR, 4, id="nan"),
        pytest.param(
            b'{"jsonrpc":"2.0","method":"x","params":{"a":-Infinity},"id":"q"}', PARSE_ERROR, "q", id="infinity"
        ),
        pytest.param(
            b'{"jsonrpc":"2.0","id":5,"method":"x","params":' + b"[" * 990 + b"]" * 990 + b"}",
            INVALID_REQUEST,
            5,
            id="deep-990-keeps-id",
        ),
        pytest.param(
            b'{"jsonrpc":"2.0","method":"x","params":' + b"[" * 70 + b"]" * 70 + b',"id":6}',
            INVALID_REQUEST,
            6,
            id="deep-70-keeps-id",
        ),
        pytest.param(
            b'{"a":{"id":9},"jsonrpc":"2.0","method":"x","params":' + b"[" * 2000 + b"]" * 2000 + b"}",
            INVALID_REQUEST,
            None,
            id="deep-nested-id-not-taken",
        ),
    ],
)
def test_classify_answers_bad_lines(line: bytes, code: int, request_id: object) -> None:
    body = error_of(classify(line))

    assert body["error"]["code"] == code
    assert body["id"] == request_id


@pytest.mark.parametrize(
    "line",
    [
        pytest.param(b'{"jsonrpc":"1.0","method":"notifications/x"}', id="notification-wrong-version"),
        pytest.param(b'{"method":5}', id="notification-bad-method"),
        pytest.param(b'{"jsonrpc":"2.0","method":"notifications/x","params":5}', id="notification-bad-params"),
        pytest.param(b"\n", id="blank"),
        pytest.param(b"   \r\n", id="whitespace"),
    ],
)
def test_classify_does_not_answer_notifications_or_blank_lines(line: bytes) -> None:
    assert classify(line) is None


def test_classify_passes_a_valid_request_on() -> None:
    outcome = classify(b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"auth":{"token":"t"}}}\n')

    assert isinstance(outcome, SessionMessage)
    assert isinstance(outcome.message, types.JSONRPCRequest)
    assert (outcome.message.id, outcome.message.method) == (1, "tools/list")


def test_classify_passes_a_valid_notification_on() -> None:
    outcome = classify(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')

    assert isinstance(outcome, SessionMessage)
    assert isinstance(outcome.message, types.JSONRPCNotification)


@pytest.mark.parametrize(
    ("request_id", "echoed"),
    [(7, 7), ("x", "x"), (None, None), (True, None), (1.5, None), ({"a": 1}, None)],
)
def test_error_line_echoes_only_usable_ids(request_id: object, echoed: object) -> None:
    body = error_of(error_line(request_id, INVALID_REQUEST, "Invalid Request"))

    assert body == {"jsonrpc": "2.0", "id": echoed, "error": {"code": -32600, "message": "Invalid Request"}}


def test_error_line_never_echoes_a_lone_surrogate() -> None:
    body = error_of(error_line("\ud800", INVALID_REQUEST, "Invalid Request"))

    assert body["id"] is None


@pytest.mark.parametrize(
    "result",
    [
        pytest.param(b"5", id="not-an-object"),
        pytest.param(b'{"action":"accept","content":{"decision":"\\ud800"}}', id="surrogate-in-answer"),
    ],
)
def test_a_malformed_response_becomes_an_error_for_its_request(result: bytes) -> None:
    outcome = classify(b'{"jsonrpc":"2.0","id":0,"result":' + result + b"}")

    assert isinstance(outcome, SessionMessage)
    assert isinstance(outcome.message, types.JSONRPCError)
    assert (outcome.message.id, outcome.message.error.code) == (0, INVALID_REQUEST)


def test_outgoing_messages_are_ascii_json_even_with_a_lone_surrogate() -> None:
    message = types.JSONRPCError(jsonrpc="2.0", id="\ud800", error=types.ErrorData(code=-32601, message="\udc00 é"))

    line = encode_message(SessionMessage(message))

    assert line.isascii() and line.endswith(b"\n")
    assert json.loads(line)["error"]["message"] == "\udc00 é"


def test_an_answer_that_cannot_be_encoded_is_replaced_by_an_internal_error() -> None:
    response = types.JSONRPCResponse(jsonrpc="2.0", id=8, result={"x": float("nan")})
    strict = json.loads(encode_message(SessionMessage(response)), parse_constant=pytest.fail)
    assert strict["id"] == 8  # NaN is never written as `NaN`

    body = error_of(fallback_line(SessionMessage(response)))

    assert (body["id"], body["error"]["code"]) == (8, -32603)
    notification = types.JSONRPCNotification(jsonrpc="2.0", method="notifications/x")
    assert fallback_line(SessionMessage(notification)) is None


# --- LineFramer ---------------------------------------------------------------------------

LIMIT = 10
CHUNKINGS = [1, 3, 10, 11, 64, 1 << 16]
"""Bytes per read: lines arrive whole, split anywhere, or many to a read."""


def framed(data: bytes, chunk: int) -> list[bytes | None]:
    framer = LineFramer(LIMIT)
    lines: list[bytes | None] = []
    for start in range(0, len(data), chunk):
        lines += framer.feed(data[start : start + chunk])
    return lines + framer.end()


@pytest.mark.parametrize("chunk", CHUNKINGS)
def test_reads_normal_lines_then_eof(chunk: int) -> None:
    assert framed(b"one\ntwo\n\nlast-no-nl", chunk) == [b"one\n", b"two\n", b"\n", b"last-no-nl"]


def test_empty_stream_has_no_lines() -> None:
    assert framed(b"", 1) == []


@pytest.mark.parametrize("chunk", CHUNKINGS)
@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param(b"0123456789\n", b"0123456789\n", id="limit-with-newline"),
        pytest.param(b"0123456789", b"0123456789", id="limit-at-eof"),
        pytest.param(b"012345678\n", b"012345678\n", id="one-under"),
        pytest.param(b"0123456789A\n", None, id="one-over"),
        pytest.param(b"0123456789A", None, id="one-over-at-eof"),
    ],
)
def test_line_at_the_limit(data: bytes, expected: bytes | None, chunk: int) -> None:
    assert framed(data, chunk) == [expected]


@pytest.mark.parametrize(
    ("size", "chunk"),
    [(size, chunk) for size in (LIMIT + 1, LIMIT + 2) for chunk in CHUNKINGS]
    + [(size, chunk) for size in (70_000, 300_000) for chunk in (64, 1 << 16)],
)
def test_oversized_line_is_dropped_and_the_next_line_reads_fine(size: int, chunk: int) -> None:
    assert framed(b"x" * size + b"\nnext\n", chunk) == [None, b"next\n"]


@pytest.mark.parametrize("chunk", CHUNKINGS)
def test_two_oversized_lines_in_a_row(chunk: int) -> None:
    assert framed(b"y" * 50 + b"\n" + b"z" * 50 + b"\nok\n", chunk) == [None, None, b"ok\n"]


def test_an_oversized_line_is_never_held_in_memory() -> None:
    framer = LineFramer(LIMIT)
    for _ in range(1000):
        assert framer.feed(b"x" * 4096) == []
        assert framer.held <= LIMIT
    assert framer.feed(b"\nok\n") == [None, b"ok\n"]


# --- Wire: the client's pipe or socket, from the event loop ---------------------------------


def ends(kind: str) -> tuple[int, int]:
    """(read end, write end) of a pipe or of a socketpair."""
    if kind == "pipe":
        return os.pipe()
    left, right = socket.socketpair()
    return left.detach(), right.detach()


def no_worker_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pipe's or a socket's wire is served by the event loop alone: a worker thread would fail the test."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a worker thread was asked for")

    monkeypatch.setattr(anyio.to_thread, "run_sync", refuse)


@pytest.mark.parametrize("kind", ["pipe", "socket"])
def test_a_client_that_stops_reading_leaves_the_answer_waiting_not_the_loop(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, gateway = ends(kind)
    wire = Wire(gateway, write=True)
    answer = b"x" * (4 << 20)  # far more than a pipe or a socket buffer holds
    ticks = 0
    received = bytearray()

    def client_reads() -> None:
        while len(received) < len(answer):
            received.extend(os.read(client, 1 << 20))

    async def main() -> None:
        nonlocal ticks
        async with anyio.create_task_group() as group:
            group.start_soon(wire.write, answer)
            for _ in range(20):  # the loop keeps running while the answer waits for the client
                await anyio.sleep(0.01)
                ticks += 1
            reader = threading.Thread(target=client_reads)  # the client reads at last
            reader.start()
        reader.join(timeout=30)

    no_worker_threads(monkeypatch)
    anyio.run(main)
    wire.close()
    assert bytes(received) == answer, "every byte arrives, in order"
    assert ticks == 20
    assert os.get_blocking(gateway), "the client's descriptor keeps its mode: only the gateway's own is non-blocking"
    os.close(client)
    os.close(gateway)


@pytest.mark.parametrize("kind", ["pipe", "socket"])
def test_lines_arrive_through_a_wire_then_the_end(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    gateway, client = ends(kind)
    wire = Wire(gateway, write=False)
    no_worker_threads(monkeypatch)

    async def main() -> bytes:
        received = bytearray()
        async with anyio.create_task_group() as group:

            async def client_writes() -> None:
                for part in (b'{"a":', b"1}\n", b"two\n"):
                    await anyio.sleep(0.01)
                    os.write(client, part)
                os.close(client)

            group.start_soon(client_writes)
            while chunk := await wire.read():
                received += chunk
        return bytes(received)

    assert anyio.run(main) == b'{"a":1}\ntwo\n'
    wire.close()
    assert os.get_blocking(gateway)
    os.close(gateway)


@pytest.mark.parametrize("kind", ["pipe", "socket"])
def test_writing_to_a_client_that_closed_its_end_is_client_gone(kind: str) -> None:
    client, gateway = ends(kind)
    wire = Wire(gateway, write=True)
    os.close(client)
    with pytest.raises(ClientGoneError):
        anyio.run(wire.write, b"answer\n")
    wire.close()
    os.close(gateway)


def test_a_file_is_read_and_written_by_worker_threads(tmp_path: Path) -> None:
    path = tmp_path / "wire"
    path.write_bytes(b"one\ntwo\n")
    with path.open("rb") as source, path.open("ab") as sink:
        reading, writing = Wire(source.fileno(), write=False), Wire(sink.fileno(), write=True)
        assert anyio.run(reading.read) == b"one\ntwo\n"
        assert anyio.run(reading.read) == b""
        anyio.run(writing.write, b"three\n")
    assert path.read_bytes() == b"one\ntwo\nthree\n"


def test_the_backlog_holds_the_reader_past_its_limit_and_lets_it_go_at_half() -> None:
    async def main() -> list[int]:
        backlog = OutboundBacklog(limit=4)
        released_at: list[int] = []
        for _ in range(5):
            backlog.added()
        with anyio.move_on_after(0.05):
            await backlog.wait_for_room()
            released_at.append(backlog.waiting)  # not reached: 5 wait, over the limit of 4
        for _ in range(3):
            backlog.written()
            with anyio.move_on_after(0.01):
                await backlog.wait_for_room()
                released_at.append(backlog.waiting)
        with anyio.fail_after(1):
            await backlog.wait_for_room()  # stays open until the limit is passed again
        return released_at

    assert anyio.run(main) == [2], "held at 4 and 3 (over half the limit), let go at 2"
