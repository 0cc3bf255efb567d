"""Hostile input over real stdio (decision 47): lines that used to kill the gateway, and inputs that
could not be hashed or stored. Each answer is a standard JSON-RPC error under the request's
own id where it can be read, the next request is answered, and nothing unauthenticated
decides how much the audit log stores."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.harness import GatewayHome, StdioSession
from tests.pg_cluster import on_both_engines

SessionFactory = Callable[..., StdioSession]
ELICITATION: dict[str, Any] = {"elicitation": {"form": {}}}


def ping_answered(session: StdioSession, request_id: str = "sentinel") -> None:
    session.send({"jsonrpc": "2.0", "id": request_id, "method": "ping"})
    assert session.wait_response(request_id, timeout=30) == {"jsonrpc": "2.0", "id": request_id, "result": {}}


def error_of(session: StdioSession, raw: bytes, request_id: object) -> dict[str, Any]:
    session.send_raw(raw)
    message = session.read_message(timeout=30)
    assert message["id"] == request_id, (raw[:200], message)
    assert "error" in message, message
    return dict(message["error"])


def no_traceback(session: StdioSession) -> None:
    assert "Traceback" not in session.stderr_text()


# --- one line must not stop the gateway -------------------------------------------------------


def test_a_lone_surrogate_in_id_or_method_before_initialize_is_answered_and_serving_goes_on(
    gateway: GatewayHome, open_session: SessionFactory
) -> None:
    session = open_session(gateway, initialize=False)
    assert error_of(session, b'{"jsonrpc":"2.0","id":"\\ud800","method":"ping"}\n', None)["code"] == -32600
    assert error_of(session, b'{"jsonrpc":"2.0","id":1,"method":"\\ud800"}\n', 1)["code"] == -32600
    assert error_of(session, b'{"jsonrpc":"2.0","id":"a\\udfffb","method":"\\ud800"}\n', None)["code"] == -32600
    ping_answered(session)
    assert "result" in session.initialize()
    ping_answered(session, "after-initialize")
    assert session.close() == 0
    no_traceback(session)


def test_a_lone_surrogate_anywhere_in_a_call_leaves_calls_in_flight_and_the_next_one_alone(
    gateway: GatewayHome, open_session: SessionFactory
) -> None:
    session = open_session(gateway)
    token = gateway.token("alice")
    lines = [
        {"name": "\ud800", "arguments": {}, "auth": {"token": token}},
        {"name": "list_artifacts", "arguments": {"\udc00": 1}, "auth": {"token": token}},
        {"name": "list_artifacts", "arguments": {"k": ["\ud83d"]}, "auth": {"token": token}},
        {"name": "list_artifacts", "arguments": {}, "auth": {"token": token + "\ud800"}},
    ]
    for number, params in enumerate(lines, start=100):
        raw = json.dumps({"jsonrpc": "2.0", "id": number, "method": "tools/call", "params": params}).encode()
        assert error_of(session, raw + b"\n", number)["code"] == -32600
        assert "result" in session.call_tool("list_artifacts", {}, token)
    assert session.close() == 0
    no_traceback(session)


def test_a_call_waiting_for_consent_survives_hostile_lines_and_ends_as_answered(
    gateway: GatewayHome, open_session: SessionFactory
) -> None:
    session = open_session(gateway, capabilities=ELICITATION)
    call_id = session.send_call("run_pytest", {"test_path": "tests"}, gateway.token("alice"))
    prompt = session.read_message(timeout=30)
    assert prompt.get("method") == "elicitation/create", prompt
    for raw in (
        b'{"jsonrpc":"2.0","id":"\\ud800","method":"\\udc00"}\n',
        b'{"jsonrpc":"2.0","id":41,"method":"\\ud800"}\n',
        b'{"jsonrpc":"2.0","id":42,"method":"ping","params":{"x":NaN}}\n',
    ):
        session.send_raw(raw)
        assert "error" in session.read_message(timeout=30)
    ping_answered(session)
    answer = {"action": "accept", "content": {"decision": "deny_once"}}
    session.send({"jsonrpc": "2.0", "id": prompt["id"], "result": answer})
    response = session.wait_response(call_id, timeout=30)
    assert response["error"]["code"] == -32008 and response["error"]["data"]["reason"] == "consent_denied"
    assert session.close() == 0
    no_traceback(session)


# --- inputs that cannot be hashed or stored ----------------------------------------------------


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_parse_errors_under_the_request_id(
    gateway: GatewayHome, open_session: SessionFactory, constant: str
) -> None:
    session = open_session(gateway)
    token = gateway.token("alice")
    raw = (
        '{"jsonrpc":"2.0","id":"n1","method":"tools/call","params":{"name":"run_pytest",'
        f'"arguments":{{"test_path":"tests","timeout_s":{constant}}},"auth":{{"token":"{token}"}}}}}}\n'
    ).encode()
    assert error_of(session, raw, "n1")["code"] == -32700
    ping_answered(session)
    no_traceback(session)


def test_tools_list_with_a_lone_surrogate_in_the_token_gets_a_standard_code(
    gateway: GatewayHome, open_session: SessionFactory
) -> None:
    session = open_session(gateway)
    raw = b'{"jsonrpc":"2.0","id":7,"method":"tools/list","params":{"auth":{"token":"x\\ud800"}}}\n'
    error = error_of(session, raw, 7)
    assert error["code"] == -32600 and "codec" not in error["message"]
    raw = b'{"jsonrpc":"2.0","id":8,"method":"resources/read","params":{"uri":"mcp-gateway://\\udc00"}}\n'
    assert error_of(session, raw, 8)["code"] == -32600
    ping_answered(session)


def test_over_long_tool_names_without_a_token_store_a_bounded_name(
    gateway: GatewayHome, open_session: SessionFactory
) -> None:
    session = open_session(gateway)
    database = gateway.home / "gateway.db"
    assert database.exists()
    before = sum(p.stat().st_size for p in gateway.home.glob("gateway.db*"))
    for index in range(5):
        response = session.call_tool(f"{index}" + "n" * 1_000_000)
        assert response["error"]["code"] == -32001, response["error"]
    for name in ("x" * 129, "nul\x00name", "tab\tname"):
        assert session.call_tool(name)["error"]["code"] == -32001
    calls = [e for e in gateway.audit_events() if e["event_type"] == "MCP_TOOL_CALL"]
    assert len(calls) == 8
    assert all(len(e["tool_name"]) <= 128 and "\x00" not in e["tool_name"] for e in calls), calls
    assert calls[5]["tool_name"].startswith("x" * 40 + "...sha256:")
    after = sum(p.stat().st_size for p in gateway.home.glob("gateway.db*"))
    assert after - before < 256 * 1024, (before, after)  # was 11.8 MiB for the five names
    assert gateway.chain_ok()
    no_traceback(session)


def test_deep_nesting_is_answered_under_the_request_id(gateway: GatewayHome, open_session: SessionFactory) -> None:
    session = open_session(gateway)
    for depth, request_id in ((990, 31), (5000, "deep"), (80, 33)):
        nested = "[" * depth + "]" * depth
        raw = f'{{"jsonrpc":"2.0","id":{json.dumps(request_id)},"method":"tools/call","params":{nested}}}\n'.encode()
        assert error_of(session, raw, request_id)["code"] == -32600
    ping_answered(session)
    no_traceback(session)


def _answer_the_prompt_with(session: StdioSession, gateway: GatewayHome, result: bytes) -> dict[str, Any]:
    call_id = session.send_call("run_pytest", {"test_path": "tests"}, gateway.token("alice"))
    while True:
        message = session.read_message(timeout=30)
        if message.get("method") == "elicitation/create":
            break
    prompt_id = json.dumps(message["id"]).encode()
    session.send_raw(b'{"jsonrpc":"2.0","id":' + prompt_id + b',"result":' + result + b"}\n")
    return session.wait_response(call_id, timeout=30)


@pytest.mark.parametrize(
    "result",
    [
        pytest.param(b"5", id="not-an-object"),
        pytest.param(b'"allow_once"', id="a-string"),
        pytest.param(b'{"action":"accept","content":{"decision":"allow_once","extra":{"x":[1]}}}', id="extra-field"),
        pytest.param(b'{"action":"accept","content":{"decision":"allow_once","x":"\\ud800"}}', id="surrogate"),
        pytest.param(b'{"action":"accept","content":[1]}', id="content-not-an-object"),
    ],
)
def test_a_malformed_consent_answer_denies_once_at_once(
    make_gateway: Callable[..., GatewayHome], open_session: SessionFactory, result: bytes
) -> None:
    gateway = make_gateway({"consent": {"timeout_s": 60}})
    gateway.add_user("alice")
    session = open_session(gateway, capabilities=ELICITATION)
    started = time.monotonic()
    response = _answer_the_prompt_with(session, gateway, result)
    assert time.monotonic() - started < 30  # not the 60 s timeout
    assert response["error"]["code"] == -32008, response
    # Denied once, not by the timeout; audited as nobody's answer (consent_no_answer, decision 46).
    assert response["error"]["data"]["reason"] in ("consent_denied", "consent_no_answer"), response
    run_id = response["error"]["data"]["run_id"]
    kinds = [e["event_type"] for e in gateway.events_of(run_id)]
    assert kinds[0] == "MCP_TOOL_CALL" and "mcp.permission.decision" in kinds
    ping_answered(session)
    no_traceback(session)


@on_both_engines
def test_long_and_nul_names_leave_their_events(
    make_gateway: Callable[..., GatewayHome], open_session: SessionFactory
) -> None:
    """PostgreSQL's text columns cannot hold NUL, SQLite's can: on both, the names are stored cut and escaped."""
    gateway = make_gateway()
    gateway.add_user("alice")
    session = open_session(gateway)
    names = ("x" * 129, "nul\x00name", "y" * 100_000)
    for name in names:
        assert session.call_tool(name)["error"]["code"] == -32001  # no token
        response = session.call_tool(name, {}, gateway.token("alice"))
        assert response["error"]["code"] == -32602 and response["error"]["data"]["reason"] == "unknown_tool"
    calls = [e for e in gateway.audit_events() if e["event_type"] == "MCP_TOOL_CALL"]
    blocked = [e for e in gateway.audit_events() if e["event_type"] == "POLICY_BLOCKED"]
    assert len(calls) == len(blocked) == 2 * len(names)
    assert all(len(e["tool_name"]) <= 128 and "\x00" not in e["tool_name"] for e in calls + blocked)
    assert gateway.chain_ok()
