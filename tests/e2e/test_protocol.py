"""Malformed JSON-RPC on the wire never crashes the server: each gets an error, and the next request works.

Requests of the wrong shape that parse (param types, params.auth, unknown methods) are
tests/gateway/test_server_protocol.py (in process, both protocol eras)."""

from __future__ import annotations

import json
from collections.abc import Callable

from tests.harness import GatewayHome, StdioSession

SessionFactory = Callable[..., StdioSession]


def assert_still_serving(session: StdioSession, gateway: GatewayHome) -> None:
    response = session.call_tool("list_artifacts", {}, gateway.token("alice"))
    assert "result" in response, response


def test_broken_and_wrongly_shaped_messages_get_errors(gateway: GatewayHome, open_session: SessionFactory) -> None:
    session = open_session(gateway)
    cases: list[tuple[bytes, int, object]] = [
        (b"{broken json\n", -32700, None),
        (b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"\n', -32700, None),
        (b"[1, 2, 3]\n", -32600, None),
        (b'[{"jsonrpc":"2.0","id":5,"method":"ping"}]\n', -32600, None),
        (b'"just a string"\n', -32600, None),
        (b"42\n", -32600, None),
        (b'{"jsonrpc":"1.0","id":11,"method":"ping"}\n', -32600, 11),
        (b'{"jsonrpc":"2.0","id":12,"method":"tools/call","params":"not an object"}\n', -32600, 12),
        (b'{"jsonrpc":"2.0","id":{"nested":true},"method":"ping"}\n', -32600, None),
        (b'{"jsonrpc":"2.0","id":13}\n', -32600, 13),
        (b"\xff\xfe not utf-8\n", -32700, None),
    ]
    for raw, code, request_id in cases:
        session.send_raw(raw)
        message = session.read_message(timeout=30)
        assert message["error"]["code"] == code, (raw, message)
        assert message["id"] == request_id, (raw, message)
        assert_still_serving(session, gateway)


def test_huge_messages_are_refused_without_being_held(gateway: GatewayHome, open_session: SessionFactory) -> None:
    session = open_session(gateway)
    huge = {
        "jsonrpc": "2.0",
        "id": 99,
        "method": "tools/call",
        "params": {"name": "run_pytest", "arguments": {"test_path": "x" * (3 * 1024 * 1024)}},
    }
    session.send_raw(json.dumps(huge).encode() + b"\n")
    message = session.read_message(timeout=30)
    assert message["error"]["code"] == -32600 and "too large" in message["error"]["message"]
    assert_still_serving(session, gateway)
    # Large but under the cap: answered by the schema (-32602), not by the framing.
    big = {"test_path": "tests", "keyword": "k" * 100_000}
    response = session.call_tool("run_pytest", big, gateway.token("alice"))
    assert response["error"]["code"] == -32602
    assert_still_serving(session, gateway)


def test_notifications_and_blank_lines_get_no_reply(gateway: GatewayHome, open_session: SessionFactory) -> None:
    session = open_session(gateway)
    session.send_raw(b"\n   \n")
    session.send_raw(b'{"jsonrpc":"2.0","method":"notifications/unknown","params":{}}\n')
    session.send_raw(b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":12345}}\n')
    assert_still_serving(session, gateway)
    assert session.unsolicited == []


def test_stdout_carries_only_json_rpc_and_eof_ends_the_server(
    gateway: GatewayHome, open_session: SessionFactory
) -> None:
    session = open_session(gateway)
    assert_still_serving(session, gateway)
    assert session.close() == 0
    assert "serving on stdio" in session.stderr_text()
