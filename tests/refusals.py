"""What a refusal looks like to the client and in the audit trail, and the bad tokens that earn one.

Shared by the refusal tests in process (tests/gateway/test_server_refusals.py) and over real
stdio (tests/e2e/test_refusals.py): the same assertions on both sides of the transport.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import jwt

from gateway.auth import load_keyring
from tests.harness import GatewayHome

RUN = ("run_pytest", {"test_path": "tests"})


def refusal(response: dict[str, Any], code: int, reason: str | None = None) -> str:
    """Assert a JSON-RPC error with `code` (and `reason`); return its run_id."""
    assert "error" in response, response
    error = response["error"]
    assert error["code"] == code, error
    assert isinstance(error["message"], str) and error["message"]
    if reason is not None:
        assert error["data"]["reason"] == reason, error
    run_id = error["data"]["run_id"]
    assert isinstance(run_id, str) and len(run_id) == 32
    return str(run_id)


def assert_blocked_trail(
    gateway: GatewayHome, run_id: str, code: int, reason: str | None = None, label: str = ""
) -> None:
    """Exactly one MCP_TOOL_CALL and one terminal POLICY_BLOCKED with the same code, on a sound chain."""
    events = gateway.events_of(run_id)
    kinds = [e["event_type"] for e in events]
    assert kinds == ["MCP_TOOL_CALL", "POLICY_BLOCKED"], (label, events)
    assert events[1]["code"] == code, label
    if reason is not None:
        assert events[1]["detail"]["blocked_reason"] == reason, label
    assert gateway.chain_ok()


def b64(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def claims(user: str = "alice", **overrides: Any) -> dict[str, Any]:
    """A token's claims as the gateway issues them; an override of None leaves the claim out."""
    now = int(time.time())
    made = {
        "sub": user,
        "iss": "mcp-gateway",
        "aud": "mcp-gateway",
        "iat": now,
        "nbf": now,
        "exp": now + 600,
        "jti": f"t-{time.time_ns()}",
    }
    made.update(overrides)
    return {k: v for k, v in made.items() if v is not None}


def signed(gateway: GatewayHome, **overrides: Any) -> str:
    return jwt.encode(claims(**overrides), load_keyring(gateway.home).hmac_secret, algorithm="HS256")


def bad_tokens(gateway: GatewayHome) -> dict[str, tuple[str | None, str]]:
    """Every way a token fails authentication: label -> (token, the refusal's reason)."""
    now = time.time()
    return {
        "missing token": (None, "token_missing"),
        "garbage": ("not-a-jwt", "token_malformed"),
        "bad signature": (jwt.encode(claims(), b"x" * 32, algorithm="HS256"), "bad_signature"),
        "alg none": (f"{b64({'alg': 'none', 'typ': 'JWT'})}.{b64(claims())}.", "alg_not_allowed"),
        "HS512 not in policy": (
            jwt.encode(claims(), load_keyring(gateway.home).hmac_secret, algorithm="HS512"),
            "alg_not_allowed",
        ),
        "expired": (gateway.token("alice", ttl_s=60, now=now - 3600), "token_expired"),
        "not yet valid": (signed(gateway, nbf=int(now) + 3600, iat=int(now)), "token_not_yet_valid"),
        "issued in the future": (gateway.token("alice", ttl_s=60, now=now + 3600), "token_not_yet_valid"),
        "wrong iss": (signed(gateway, iss="someone-else"), "wrong_issuer"),
        "wrong aud": (signed(gateway, aud="another-service"), "wrong_audience"),
        "no jti": (signed(gateway, jti=None), "missing_claim"),
        "no exp": (signed(gateway, exp=None), "missing_claim"),
        "unknown user": (gateway.token("mallory"), "user_unknown"),
    }
