"""What a refusal looks like to the client and in the audit trail, and the bad tokens that earn one.

Shared by the refusal tests in process (tests/gateway/test_server_refusals.py,
test_server_progress_refusals.py) and over real stdio (tests/e2e/test_refusals.py,
test_refusals_with_progress.py): the same assertions on both sides of the transport.
"""

from __future__ import annotations

import base64
import itertools
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import jwt

from gateway.auth import load_keyring
from gateway.calls import CallStore
from gateway.consent.store import ConsentStore
from tests.harness import FORM_ELICITATION, MODERN, GatewayHome, modern_meta, without_acts

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


# --- the same refusal with and without `_meta.progressToken` ------------------------------------------

PROGRESS = "progress-token-1"
VOLATILE = {"id", "ts", "run_id", "prev_hash", "hash", "user", "grant_id", "expires_at"}
"""Fields that differ from one call to the next whatever the call: ids, times, the per-row user."""
MEASURED = {"duration_ms", "peak_memory_kb", "stdout_bytes", "stderr_bytes", "survivors_killed"}
"""What a run measured: its own numbers, not the refusal's."""
_users = itertools.count()


class Requester(Protocol):
    """A client session that sends a request and returns its JSON-RPC answer (`StdioSession`, `MemorySession`)."""

    def request(self, method: str, params: dict[str, Any] | None = None, timeout: float = 60) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Seen:
    """What a refused call left, its run_id and the per-row user's name taken out."""

    answer: dict[str, Any]
    trail: list[dict[str, Any]]
    card: tuple[Any, ...] | None


def new_user(gateway: GatewayHome, role: str = "USER") -> str:
    """A user of the row's own: what one refusal leaves (a grant, a budget) never reaches another."""
    name = f"u{next(_users)}"
    gateway.add_user(name, role)
    return name


def params_of(
    gateway: GatewayHome,
    user: str,
    progress: str | None,
    *,
    era: str,
    arguments: dict[str, Any] | None = None,
    name: str = "run_pytest",
    token: str | None = None,
    capabilities: dict[str, Any] | None = None,
    envelope: bool = True,
) -> dict[str, Any]:
    """tools/call params; on the 2026-07-28 era with the `_meta` envelope unless `envelope` is False
    (the SDK's session stamps its own)."""
    meta: dict[str, Any] = {}
    if era == MODERN and envelope:
        meta = modern_meta(FORM_ELICITATION if capabilities is None else capabilities)
    if progress is not None:
        meta["progressToken"] = progress
    params: dict[str, Any] = {
        "name": name,
        "arguments": {"test_path": "tests"} if arguments is None else arguments,
        "auth": {"token": gateway.token(user) if token is None else token},
    }
    if meta:
        params["_meta"] = meta
    return params


def call(session: Requester, params: dict[str, Any]) -> dict[str, Any]:
    return session.request("tools/call", params, timeout=120)


def round_trip(
    session: Requester, params: dict[str, Any], answer: dict[str, Any], state: str | None = None
) -> dict[str, Any]:
    """A 2026-07-28 call whose first round asks (input_required), then its retry with `answer`."""
    first = call(session, params)
    assert first.get("result", {}).get("resultType") == "input_required", first
    retry = dict(params, inputResponses={"consent": answer}, requestState=state or first["result"]["requestState"])
    return call(session, retry)


def trail_of(gateway: GatewayHome, run_id: str, user: str) -> list[dict[str, Any]]:
    """The call's audit events in order, each without its ids, times and measurements, the user unnamed (an
    approver's or the console's act apart: its own order, `without_acts`; tests/e2e/test_approvals.py checks it)."""
    trail = []
    for event in without_acts(gateway.events_of(run_id)):
        kept = {k: v for k, v in event.items() if k not in VOLATILE}
        detail = {k: v for k, v in event["detail"].items() if k not in VOLATILE | MEASURED}
        if "decided_by" in detail:
            detail["decided_by"] = detail["decided_by"].replace(user, "<user>")
        trail.append(kept | {"detail": detail})
    return trail


def seen(gateway: GatewayHome, response: dict[str, Any], user: str) -> Seen:
    assert "error" in response, response
    error = response["error"]
    run_id = error["data"]["run_id"]
    answer = {"code": error["code"], "message": error["message"]}
    answer["data"] = {k: v for k, v in error["data"].items() if k != "run_id"}
    trail = trail_of(gateway, run_id, user)
    card = CallStore(gateway.engine).fetch(run_id)
    if card is None and trail:  # a 2026-07-28 retry moves its first round's card to the retry
        card = next((c for c in CallStore(gateway.engine).fetch_latest(None, 500) if c.user == user), None)
    shown = None if card is None else (card.status, card.code, card.reason, card.message, card.user == user)
    return Seen(answer, trail, shown)


def same_with_and_without(
    gateway: GatewayHome,
    refuse: Callable[[str, str | None], dict[str, Any]],
    code: int,
    reason: str,
    *logs: Callable[[], str],
    at_once: bool = False,
) -> Seen:
    """`refuse(user, progress)` twice, a user of its own each time: the same refusal, `code` and `reason`;
    no traceback in any of `logs` (what the gateway logged: its stderr, or the test's captured log).
    `at_once`: the two calls side by side, each in a thread of its own (`refuse` must allow that: a session's
    requests do), for a row that waits out a timeout in each call: the same two calls, in the time of one."""
    outcomes = {}
    if at_once:
        users = {progress: new_user(gateway) for progress in (None, PROGRESS)}
        with ThreadPoolExecutor(max_workers=2) as pool:
            answers = {progress: pool.submit(refuse, user, progress) for progress, user in users.items()}
            for progress, user in users.items():
                outcomes[progress] = seen(gateway, answers[progress].result(), user)
    else:
        for progress in (None, PROGRESS):
            user = new_user(gateway)
            outcomes[progress] = seen(gateway, refuse(user, progress), user)
    without, with_token = outcomes[None], outcomes[PROGRESS]
    assert (without.answer["code"], without.answer["data"]["reason"]) == (code, reason), without
    assert with_token.answer == without.answer, "the answer changed with a progressToken"
    assert with_token.trail == without.trail, "the audit trail changed with a progressToken"
    assert with_token.card == without.card, "the card changed with a progressToken"
    for log in logs:
        assert "Traceback" not in log(), log()
    return without


def assert_decision(found: Seen, decision: str, origin: str, channel: str) -> None:
    kinds = [e["event_type"] for e in found.trail]
    assert kinds == ["MCP_TOOL_CALL", "mcp.permission.decision", "POLICY_BLOCKED"], kinds
    detail = found.trail[1]["detail"]
    assert (detail["decision"], detail["origin"], detail["channel"]) == (decision, origin, channel), detail
    assert found.card is not None and found.card[:3] == ("error", found.answer["code"], found.answer["data"]["reason"])


def answering(reply: dict[str, Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def respond(message: dict[str, Any]) -> dict[str, Any]:
        assert message["method"] == "elicitation/create", message
        return reply

    return respond


def accept(decision: str) -> dict[str, Any]:
    return {"action": "accept", "content": {"decision": decision}}


DENIALS = [
    # (name, the client's reply to elicitation/create, decision, reason)
    ("deny once", accept("deny_once"), "DENY_ONCE", "consent_denied"),
    ("deny always", accept("deny_always"), "DENY_ALWAYS", "consent_denied_always"),
    ("decline", {"action": "decline"}, "DENY_ONCE", "consent_denied"),
    ("cancel", {"action": "cancel"}, "DENY_ONCE", "consent_denied"),
]


def past_its_deadline(gateway: GatewayHome, question_id: str) -> None:
    """Wait until the question's `expires_at` (consent.timeout_s after it was asked) is behind the wall clock by
    a margin: a retry sent after this comes after the timeout, as one sent after a fixed sleep did."""
    question = ConsentStore(gateway.engine).fetch_request(question_id)
    assert question is not None, f"no question {question_id}"
    while (left := question.expires_at + 0.1 - time.time()) > 0:
        time.sleep(left)
