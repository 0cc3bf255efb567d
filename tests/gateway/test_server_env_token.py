"""`auth.env_token` through the MCP server in process: a call without params.auth authenticates with the
server's MCP_GATEWAY_TOKEN (`Services.environ`), verified at every call like a per-call token;
params.auth wins when present. What `serve` logs about the variable, and a whole run without
params.auth, are tests/e2e/test_env_token.py (real stdio)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import jwt
import pytest

from tests.harness import GatewayHome
from tests.memory_session import MemorySession

SessionFactory = Callable[..., MemorySession]
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


def test_tools_list_without_params_auth_shows_what_the_env_identity_may_call(
    env_gateway: GatewayHome, open_memory: SessionFactory
) -> None:
    viewer = open_memory(env_gateway, environ={"MCP_GATEWAY_TOKEN": env_gateway.token("vic")})
    assert names(viewer.request("tools/list")) == ["list_artifacts", "get_evidence", "get_artifact_content"]
    refused = viewer.call_tool("run_pytest", {"test_path": "tests"})
    assert refused["error"]["code"] == -32003

    user = open_memory(env_gateway, environ={"MCP_GATEWAY_TOKEN": env_gateway.token("alice")})
    assert "run_pytest" in names(user.request("tools/list"))
    # params.auth still wins on tools/list: vic's token lists vic's tools in alice's server.
    mine = user.request("tools/list", {"auth": {"token": env_gateway.token("vic")}})
    assert "run_pytest" not in names(mine)

    unset = open_memory(env_gateway)  # no variable: as without params.auth, the allowlist
    assert names(unset.request("tools/list")) == [
        "run_pytest", "list_artifacts", "get_evidence", "get_artifact_content",
    ]  # fmt: skip
    garbage = open_memory(env_gateway, environ={"MCP_GATEWAY_TOKEN": "not-a-token"})
    assert refusal(garbage.request("tools/list"))[0] == -32001


def test_revocation_demotion_and_disable_bite_from_the_next_call(
    env_gateway: GatewayHome, open_memory: SessionFactory
) -> None:
    env_gateway.add_user("bob", "USER")
    token = env_gateway.token("alice")
    session = open_memory(env_gateway, environ={"MCP_GATEWAY_TOKEN": token})
    assert "result" in session.call_tool(*READ)
    assert env_gateway.cli("token", "revoke", token).returncode == 0
    assert refusal(session.call_tool(*READ))[2] == "token_revoked"

    bob = open_memory(env_gateway, environ={"MCP_GATEWAY_TOKEN": env_gateway.token("bob")})
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
    env_gateway: GatewayHome, open_memory: SessionFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # every line the gateway logs, as `serve` would write it to stderr
    bad = _bad_tokens(env_gateway)
    plain = open_memory(env_gateway)
    for case, token in bad.items():
        session = open_memory(env_gateway, environ={"MCP_GATEWAY_TOKEN": token})
        from_env = refusal(session.call_tool(*READ))
        from_params = refusal(plain.call_tool(*READ, token=token))
        assert from_env == from_params, case
        assert from_env[0] == -32001, case
        assert refusal(session.call_tool("run_pytest", {"test_path": "tests"})) == from_env, case
        assert token not in caplog.text, case
    reasons = {refusal(plain.call_tool(*READ, token=t))[2] for t in bad.values()}
    assert reasons == {"token_malformed", "bad_signature", "token_expired", "user_unknown"}
    assert not any(token in json.dumps(env_gateway.all_events()) for token in bad.values())


@pytest.mark.parametrize("value", [None, "", "  "], ids=["unset", "empty", "blank"])
def test_a_missing_env_token_is_token_missing_and_names_the_variable(
    env_gateway: GatewayHome, open_memory: SessionFactory, value: str | None
) -> None:
    environ = {} if value is None else {"MCP_GATEWAY_TOKEN": value}
    session = open_memory(env_gateway, environ=environ)

    response = session.call_tool(*READ)

    assert refusal(response) == (
        -32001,
        "Authentication required: MCP_GATEWAY_TOKEN is not set for the gateway",
        "token_missing",
    )
    blocked = env_gateway.events_of(response["error"]["data"]["run_id"])[-1]
    assert blocked["event_type"] == "POLICY_BLOCKED" and blocked["detail"]["blocked_reason"] == "token_missing"


def test_params_auth_wins_even_when_invalid(env_gateway: GatewayHome, open_memory: SessionFactory) -> None:
    session = open_memory(env_gateway, environ={"MCP_GATEWAY_TOKEN": env_gateway.token("alice")})
    assert "result" in session.call_tool(*READ)

    assert refusal(session.call_tool(*READ, token="not-a-token"))[2] == "token_malformed"
    empty = session.request("tools/call", {"name": "list_artifacts", "arguments": {}, "auth": {}})
    assert refusal(empty) == (-32001, "Authentication required: params.auth.token is required", "token_missing")
    # A valid params.auth is that user, not the environment's: vic may not run pytest.
    viewer = session.call_tool("run_pytest", {"test_path": "tests"}, token=env_gateway.token("vic"))
    assert refusal(viewer)[0] == -32003


def test_env_token_off_ignores_the_variable(gateway: GatewayHome, open_memory: SessionFactory) -> None:
    session = open_memory(gateway, environ={"MCP_GATEWAY_TOKEN": gateway.token("alice")})

    response = session.call_tool(*READ)

    assert refusal(response) == (-32001, "Authentication required: params.auth.token is required", "token_missing")
    assert "run_pytest" in names(session.request("tools/list"))  # the allowlist, as for anyone
    assert "get_evidence" in names(session.request("tools/list"))
