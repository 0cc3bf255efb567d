"""A question that carries `params.auth` is judged by that token alone (docs/claude-code.md), over real stdio.

Claude Code sends no `params.auth`, so `check_permission` falls back on the server's
MCP_GATEWAY_TOKEN; a client that does send one (of any shape) must get that token's own verdict,
never the environment user's. Here the environment holds alice's valid token and the rules allow
the command, so anything but a refusal would be the environment's token standing in, and no token
reaches `serve`'s stderr. tools/call and tools/list with a bad `params.auth` are
tests/gateway/test_server_permission_bounds.py (in process).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jwt
import pytest

from tests.e2e.test_claude_code import SessionFactory
from tests.harness import GatewayHome
from tests.permission_checks import answer, events

RULES = {"enabled": True, "deny": [], "ask": [], "allow": ["Bash(pytest:*)"]}
CHECK = {"name": "check_permission", "arguments": {"tool_name": "Bash", "input": {"command": "pytest -q"}}}


@pytest.fixture
def gateway(make_gateway: Callable[..., GatewayHome]) -> GatewayHome:
    gw = make_gateway({"permission_prompt": RULES, "auth": {"env_token": True}, "consent": {"mode": "deny"}})
    gw.add_user("alice", "USER")
    gw.add_user("vic", "VIEWER")
    return gw


def bad_auths(gateway: GatewayHome) -> dict[str, Any]:
    """`params.auth` values that must each be refused on their own merits."""
    good = gateway.token("alice")
    claims = jwt.decode(good, options={"verify_signature": False})
    return {
        "garbage": {"token": "not-a-token"},
        "expired": {"token": gateway.token("alice", ttl_s=60, now=time.time() - 3600)},
        "viewer": {"token": gateway.token("vic")},
        "wrong-signature": {"token": jwt.encode(claims, "another key, 32 bytes or more, for HS256", algorithm="HS256")},
        "unknown-user": {"token": gateway.token("mallory")},
        "number": {"token": 12345},
        "object-token": {"token": {"token": good}},
        "list-token": {"token": [good]},
        "null-token": {"token": None},
        "empty": {"token": ""},
        "no-token": {},
        "auth-a-string": good,
        "auth-a-list": [good],
        "auth-null": None,
        "auth-a-number": 7,
    }


def test_a_bad_params_auth_is_refused_never_replaced_by_the_environment_token(
    gateway: GatewayHome, open_session: SessionFactory
) -> None:
    session = open_session(gateway, env={"MCP_GATEWAY_TOKEN": gateway.token("alice")})
    request_id = 900
    session.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": CHECK})
    decided, run_id = answer(session, request_id)
    assert decided["behavior"] == "allow", "without params.auth the environment's token is used"
    assert events(gateway, run_id)["MCP_TOOL_CALL"]["user"] == "alice"

    refused: dict[str, str] = {}
    for case, auth in bad_auths(gateway).items():
        request_id += 1
        session.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {**CHECK, "auth": auth}})
        decided, run_id = answer(session, request_id)
        assert decided["behavior"] == "deny", case
        logged = events(gateway, run_id)
        assert "TOOL_FINISHED" not in logged and "mcp.permission.decision" not in logged, case
        blocked = logged["POLICY_BLOCKED"]
        assert blocked["user"] != "alice" or case == "expired", case  # an expired token names no one trusted
        assert blocked["code"] in (-32001, -32003), case
        refused[case] = blocked["detail"]["blocked_reason"]
        assert "MCP_GATEWAY_TOKEN" not in decided["message"], (case, decided["message"])

    assert refused["viewer"] == "missing_permission"
    assert refused["garbage"] == "token_malformed"
    assert refused["expired"] == "token_expired"
    assert refused["wrong-signature"] == "bad_signature"
    assert {refused[c] for c in ("number", "object-token", "null-token", "empty", "no-token", "auth-a-string")} == {
        "token_missing"
    }
    session.close()
    assert gateway.token("alice") not in session.stderr_text()
    assert gateway.chain_ok()
