"""`auth.env_token` over real stdio: a call without params.auth authenticates with the server's
MCP_GATEWAY_TOKEN, verified at every call like a per-call token; params.auth wins when present.

Here: a whole run without params.auth, what `serve` logs about the variable on stderr (never its
value) and one bad variable end to end. Every other case is tests/gateway/test_server_env_token.py
(the same server in process)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import jwt
import pytest

from tests.e2e.test_run_pytest import ELICITATION, answer
from tests.harness import GatewayHome, StdioSession

SessionFactory = Callable[..., StdioSession]
ENV_TOKEN_ON: dict[str, Any] = {"auth": {"env_token": True}}
READ: tuple[str, dict[str, Any]] = ("list_artifacts", {})


@pytest.fixture
def env_gateway(make_gateway: Callable[..., GatewayHome]) -> GatewayHome:
    gw = make_gateway(ENV_TOKEN_ON)
    gw.add_user("alice", "USER")
    gw.add_user("vic", "VIEWER")
    return gw


def names(response: dict[str, Any]) -> list[str]:
    return [tool["name"] for tool in response["result"]["tools"]]


def refusal(response: dict[str, Any]) -> tuple[int, str, str]:
    """What a refusal says, without its run id: code, message, data.reason."""
    error = response["error"]
    return error["code"], error["message"], error["data"]["reason"]


def test_a_session_without_params_auth_runs_pytest_end_to_end(
    env_gateway: GatewayHome, open_session: SessionFactory
) -> None:
    token = env_gateway.token("alice")
    session = open_session(env_gateway, capabilities=ELICITATION, env={"MCP_GATEWAY_TOKEN": token})
    session.responder = answer("allow_once")

    response = session.call_tool("run_pytest", {"test_path": "tests"})

    result = response["result"]
    assert result["isError"] is False, result
    structured = result["structuredContent"]
    assert structured["exit_code"] == 0 and structured["passed"] > 0
    events = env_gateway.events_of(structured["run_id"])
    kinds = [e["event_type"] for e in events]
    assert kinds[0] == "MCP_TOOL_CALL" and "SANDBOX_EXEC" in kinds and kinds[-1] == "TOOL_FINISHED"
    assert {e["user"] for e in events} == {"alice"}
    assert [e["detail"]["decision"] for e in events if e["event_type"] == "mcp.permission.decision"] == ["ALLOW_ONCE"]
    assert [m["method"] for m in session.unsolicited] == ["elicitation/create"]
    # The read tools and the run's resource answer to the same identity.
    listed = session.call_tool("list_artifacts", {})
    assert structured["run_id"] in json.dumps(listed["result"])
    link = next(c for c in result["content"] if c["type"] == "resource_link")
    read = session.request("resources/read", {"uri": link["uri"]})
    assert "contents" in read["result"], read

    session.close()
    stderr = session.stderr_text()
    assert "auth.env_token is on" in stderr and "MCP_GATEWAY_TOKEN, which is set" in stderr
    assert token not in stderr
    assert token not in json.dumps(env_gateway.audit_events())
    assert token.split(".")[2] not in stderr + json.dumps(env_gateway.audit_events())


def test_a_bad_env_token_is_refused_exactly_like_a_bad_params_auth(
    env_gateway: GatewayHome, open_session: SessionFactory
) -> None:
    """One bad variable end to end (a signature from another key); every kind: test_server_env_token.py."""
    claims = jwt.decode(env_gateway.token("alice"), options={"verify_signature": False})
    token = jwt.encode(claims, "another key, 32 bytes or more, for HS256", algorithm="HS256")
    plain = open_session(env_gateway)
    session = open_session(env_gateway, env={"MCP_GATEWAY_TOKEN": token})
    from_env = refusal(session.call_tool(*READ))
    assert from_env == refusal(plain.call_tool(*READ, token=token))
    assert from_env[0] == -32001 and from_env[2] == "bad_signature"
    assert refusal(session.call_tool("run_pytest", {"test_path": "tests"})) == from_env
    session.close()
    assert token not in session.stderr_text()
    assert token not in json.dumps(env_gateway.audit_events())


@pytest.mark.parametrize("value", [None, "", "  "], ids=["unset", "empty", "blank"])
def test_a_missing_env_token_is_token_missing_and_names_the_variable(
    env_gateway: GatewayHome, open_session: SessionFactory, value: str | None
) -> None:
    env = {} if value is None else {"MCP_GATEWAY_TOKEN": value}
    session = open_session(env_gateway, env=env)

    response = session.call_tool(*READ)

    assert refusal(response) == (
        -32001,
        "Authentication required: MCP_GATEWAY_TOKEN is not set for the gateway",
        "token_missing",
    )
    blocked = env_gateway.events_of(response["error"]["data"]["run_id"])[-1]
    assert blocked["event_type"] == "POLICY_BLOCKED" and blocked["detail"]["blocked_reason"] == "token_missing"
    session.close()
    assert "MCP_GATEWAY_TOKEN, which is NOT set" in session.stderr_text()


def test_env_token_off_ignores_the_variable(gateway: GatewayHome, open_session: SessionFactory) -> None:
    token = gateway.token("alice")
    session = open_session(gateway, env={"MCP_GATEWAY_TOKEN": token})

    response = session.call_tool(*READ)

    assert refusal(response) == (-32001, "Authentication required: params.auth.token is required", "token_missing")
    assert "run_pytest" in names(session.request("tools/list"))  # the allowlist, as for anyone
    assert "get_evidence" in names(session.request("tools/list"))
    session.close()
    stderr = session.stderr_text()
    assert "auth.env_token is off" in stderr and token not in stderr
