"""Requests of the wrong shape through the MCP server in process: each gets its error, and the next
request works. Bytes that are not JSON-RPC at all (framing, size, blank lines) are the wire's:
tests/e2e/test_protocol.py."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.harness import LEGACY, MODERN, GatewayHome
from tests.memory_session import MemorySession

SessionFactory = Callable[..., MemorySession]


def assert_still_serving(session: MemorySession, gateway: GatewayHome) -> None:
    response = session.call_tool("list_artifacts", {}, gateway.token("alice"))
    assert "result" in response, response


@pytest.mark.parametrize("version", [LEGACY, MODERN])
def test_wrong_param_types_get_invalid_params(gateway: GatewayHome, open_memory: SessionFactory, version: str) -> None:
    session = open_memory(gateway, version=version)
    token = gateway.token("alice")
    for params in (
        {"name": 5, "arguments": {}},
        {"arguments": {"test_path": "tests"}},
        {"name": "run_pytest", "arguments": "tests"},
        {"name": "run_pytest", "arguments": ["tests"]},
    ):
        response = session.request("tools/call", {**params, "auth": {"token": token}})
        assert response["error"]["code"] == -32602, (params, response)
        assert_still_serving(session, gateway)
    for auth in ("a string", {"token": 42}, {"token": None}, {"token": ["x"]}, {}):
        response = session.request("tools/call", {"name": "list_artifacts", "arguments": {}, "auth": auth})
        assert response["error"]["code"] == -32001, (auth, response)
    assert session.request("no/such/method")["error"]["code"] == -32601
    assert_still_serving(session, gateway)


def test_a_call_just_under_the_size_cap_is_answered_by_the_schema(
    gateway: GatewayHome, open_memory: SessionFactory
) -> None:
    session = open_memory(gateway)
    response = session.call_tool("run_pytest", {"test_path": "tests", "keyword": "k" * 100_000}, gateway.token("alice"))
    assert response["error"]["code"] == -32602
    assert_still_serving(session, gateway)
