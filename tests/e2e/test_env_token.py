"""`auth.env_token` over real stdio: a call without params.auth authenticates with the server's
MCP_GATEWAY_TOKEN, verified at every call like a per-call token; params.auth wins when present."""

from __future__ import annotations

import json
import time
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


def test_tools_list_without_params_auth_shows_what_the_env_identity_may_call(
    env_gateway: GatewayHome, open_session: SessionFactory
) -> None:
    viewer = open_session(env_gateway, env={"MCP_GATEWAY_TOKEN": env_gateway.token("vic")})
    assert names(viewer.request("tools/list")) == ["list_artifacts", "get_evidence", "get_artifact_content"]
    refused = viewer.call_tool("run_pytest", {"test_path": "tests"})
    assert refused["error"]["code"] == -32003

    user = open_session(env_gateway, env={"MCP_GATEWAY_TOKEN": env_gateway.token("alice")})
    assert "run_pytest" in names(user.request("tools/list"))
    # params.auth still wins on tools/list: vic's token lists vic's tools in alice's server.
    mine = user.request("tools/list", {"auth": {"token": env_gateway.token("vic")}})
    assert "run_pytest" not in names(mine)

    unset = open_session(env_gateway)  # no variable: as without params.auth, the allowlist
    assert names(unset.request("tools/list")) == [
        "run_pytest", "list_artifacts", "get_evidence", "get_artifact_content",
    ]  # fmt: skip
    garbage = open_session(env_gateway, env={"MCP_GATEWAY_TOKEN": "not-a-token"})
    assert refusal(garbage.request("tools/list"))[0] == -32001


def test_revocation_demotion_and_disable_bite_from_the_next_call(
    env_gateway: GatewayHome, open_session: SessionFactory
) -> None:
    env_gateway.add_user("bob", "USER")
    token = env_gateway.token("alice")
    session = open_session(env_gateway, env={"MCP_GATEWAY_TOKEN": token})
    assert "result" in session.call_tool(*READ)
    assert env_gateway.cli("token", "revoke", token).returncode == 0
    assert refusal(session.call_tool(*READ))[2] == "token_revoked"

    bob = open_session(env_gateway, env={"MCP_GATEWAY_TOKEN": env_gateway.token("bob")})
    assert "run_pytest" in names(bob.request("tools/list"))
    assert env_gateway.cli("user", "set-role", "bob", "VIEWER").returncode == 0
    assert "run_pytest" not in names(bob.request("tools/list"))
    assert refusal(bob.call_tool("run_pytest", {"test_path": "tests"}))[0] == -32003
    assert "result" in bob.call_tool(*READ)
    assert env_gateway.cli("user", "disable", "bob").returncode == 0
    assert refusal(bob.call_tool(*READ))[2] == "user_disabled"


def _bad_tokens(gateway: GatewayHome) -> dict[str, str]:
    good = gateway.token("alice")
    claims = jwt.decode(good, options={"verify_signature": False})
    return {
        "garbage": "not-a-token",
        "wrong-signature": jwt.encode(claims, "another key, 32 bytes or more, for HS256", algorithm="HS256"),
        "expired": gateway.token("alice", ttl_s=60, now=time.time() - 3600),
        "unknown-user": gateway.token("mallory"),
    }


def test_a_bad_env_token_is_refused_exactly_like_a_bad_params_auth(
    env_gateway: GatewayHome, open_session: SessionFactory
) -> None:
    bad = _bad_tokens(env_gateway)
    plain = open_session(env_gateway)
    for case, token in bad.items():
        session = open_session(env_gateway, env={"MCP_GATEWAY_TOKEN": token})
        from_env = refusal(session.call_tool(*READ))
        from_params = refusal(plain.call_tool(*READ, token=token))
        assert from_env == from_params, case
        assert from_env[0] == -32001, case
        assert refusal(session.call_tool("run_pytest", {"test_path": "tests"})) == from_env, case
        session.close()
        assert token not in session.stderr_text(), case
    reasons = {refusal(plain.call_tool(*READ, token=t))[2] for t in bad.values()}
    assert reasons == {"token_malformed", "bad_signature", "token_expired", "user_unknown"}
    assert not any(token in json.dumps(env_gateway.audit_events()) for token in bad.values())


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


def test_params_auth_wins_even_when_invalid(env_gateway: GatewayHome, open_session: SessionFactory) -> None:
    session = open_session(env_gateway, env={"MCP_GATEWAY_TOKEN": env_gateway.token("alice")})
    assert "result" in session.call_tool(*READ)

    assert refusal(session.call_tool(*READ, token="not-a-token"))[2] == "token_malformed"
    empty = session.request("tools/call", {"name": "list_artifacts", "arguments": {}, "auth": {}})
    assert refusal(empty) == (-32001, "Authentication required: params.auth.token is required", "token_missing")
    # A valid params.auth is that user, not the environment's: vic may not run pytest.
    viewer = session.call_tool("run_pytest", {"test_path": "tests"}, token=env_gateway.token("vic"))
    assert refusal(viewer)[0] == -32003


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
