"""gateway/transport.py: classifying each line, and framing lines with a size limit."""

from __future__ import annotations

import io
import json
from typing import Any

import mcp_types as types
import pytest
from mcp.shared.message import SessionMessage

from gateway.transport import (
    INVALID_REQUEST,
    PARSE_ERROR,
    LineReader,
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


# --- LineReader ----------------------------------------------------------------------------

LIMIT = 10


def reader(data: bytes) -> LineReader:
    return LineReader(io.BytesIO(data), LIMIT)


def test_reads_normal_lines_then_eof() -> None:
    lines = reader(b"one\ntwo\n\nlast-no-nl")

    assert lines.read() == b"one\n"
    assert lines.read() == b"two\n"
    assert lines.read() == b"\n"
    assert lines.read() == b"last-no-nl"
    assert isinstance(lines.read(), EOFError)
    assert isinstance(lines.read(), EOFError)


def test_empty_stream_is_eof() -> None:
    assert isinstance(reader(b"").read(), EOFError)


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
def test_line_at_the_limit(data: bytes, expected: bytes | None) -> None:
    assert reader(data).read() == expected


@pytest.mark.parametrize("size", [LIMIT + 1, LIMIT + 2, 70_000, 300_000])
def test_oversized_line_is_drained_and_the_next_line_reads_fine(size: int) -> None:
    lines = reader(b"x" * size + b"\nnext\n")

    assert lines.read() is None
    assert lines.read() == b"next\n"
    assert isinstance(lines.read(), EOFError)


def test_two_oversized_lines_in_a_row() -> None:
    lines = reader(b"y" * 50 + b"\n" + b"z" * 50 + b"\nok\n")

    assert lines.read() is None
    assert lines.read() is None
    assert lines.read() == b"ok\n"
