"""No caller can pile up consent questions (docs/operations.md, "Open questions are bounded, and purged").

Before the fix, 1,200 concurrent `check_permission` "ask" questions all queued for the approver,
and 2,000 first rounds of a 2026-07-28 client left 2,000 `awaiting_client` rows; and one 2025-era session held 2,000 of its client's own elicitation dialogs open. Now a user has
at most `MAX_OPEN_QUESTIONS` open questions (pending + awaiting_client, unexpired); past it a call
is refused at once with -32008 `consent_questions_limit`, and still leaves its audit events.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import func, select

from gateway import db
from gateway.consent.store import MAX_OPEN_QUESTIONS
from tests.harness import GatewayHome, StdioSession
from tests.pg_cluster import on_both_engines

SessionFactory = Callable[..., StdioSession]
FORM: dict[str, Any] = {"elicitation": {"form": {}}}
LIMIT = "consent_questions_limit"
EXTRA = 4
ASK_ALL = {"enabled": True, "deny": [], "ask": ["Bash"], "allow": []}
ROOMY_BUDGET = {"budget": {"elapsed_ms_total": 10**9}}
"""Concurrent calls each reserve their whole timeout_s (gateway/budget.py): room for all, so only the cap stops them."""


def modern_params(gateway: GatewayHome, user: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    """A 2026-07-28 tools/call's params: the envelope in `_meta`, a client that declared elicitation."""
    return {
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "e2e", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": FORM,
        },
        "name": "run_pytest",
        "arguments": arguments or {"test_path": "tests"},
        "auth": {"token": gateway.token(user)},
    }


def send_only(session: StdioSession, calls: list[tuple[str, dict[str, Any]]]) -> list[int]:
    """Send every (method, params) at once, without waiting; their JSON-RPC ids."""
    ids = []
    for method, params in calls:
        session._next_id += 1
        session.send({"jsonrpc": "2.0", "id": session._next_id, "method": method, "params": params})
        ids.append(session._next_id)
    return ids


def send_all(session: StdioSession, calls: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Send every (method, params) at once, then collect the answers in order."""
    return [session.wait_response(request_id, timeout=90) for request_id in send_only(session, calls)]


def rows_of(gateway: GatewayHome, user: str, status: str) -> int:
    r = db.consent_requests
    with gateway.engine.connect() as connection:
        count = connection.execute(select(func.count()).where(r.c.user_name == user, r.c.status == status)).scalar()
    return int(count or 0)


def assert_refused_with_its_trail(gateway: GatewayHome, response: dict[str, Any]) -> None:
    error = response["error"]
    assert error["code"] == -32008 and error["data"]["reason"] == LIMIT, error
    assert "answer them or let them expire" in error["message"] and f"at most {MAX_OPEN_QUESTIONS}" in error["message"]
    assert 1 <= error["data"]["retry_after_s"] <= 300
    kinds = [
        (e["event_type"], e["code"], e["detail"].get("blocked_reason"))
        for e in gateway.events_of(error["data"]["run_id"])
    ]
    assert kinds[0] == ("MCP_TOOL_CALL", None, None)
    assert kinds[-1] == ("POLICY_BLOCKED", -32008, LIMIT)
    assert_decided_by_policy(gateway, error["data"]["run_id"])


def assert_decided_by_policy(gateway: GatewayHome, run_id: str) -> None:
    """The refusal is a decision nobody was asked for: DENY_ONCE by the gateway (origin policy)."""
    (decision,) = [e["detail"] for e in gateway.events_of(run_id) if e["event_type"] == "mcp.permission.decision"]
    assert (decision["decision"], decision["origin"], decision["reason"]) == ("DENY_ONCE", "policy", LIMIT), decision


def test_2026_first_rounds_stop_at_the_cap_and_another_user_is_unaffected(
    make_gateway: Callable[..., GatewayHome], open_session: SessionFactory
) -> None:
    gateway = make_gateway(ROOMY_BUDGET)
    gateway.add_user("alice", "USER")
    gateway.add_user("bob", "USER")
    session = open_session(gateway, initialize=False)
    answers = send_all(
        session, [("tools/call", modern_params(gateway, "alice")) for _ in range(MAX_OPEN_QUESTIONS + EXTRA)]
    )
    asked = [a for a in answers if a.get("result", {}).get("resultType") == "input_required"]
    refused = [a for a in answers if "error" in a]
    assert (len(asked), len(refused)) == (MAX_OPEN_QUESTIONS, EXTRA)
    for response in refused:
        assert_refused_with_its_trail(gateway, response)
    assert rows_of(gateway, "alice", "awaiting_client") == MAX_OPEN_QUESTIONS
    with gateway.engine.connect() as connection:
        attempts = connection.execute(select(func.count()).select_from(db.budget_charges)).scalar()
    assert attempts == EXTRA, "a first round costs no attempt, a refused call does: the budget bounds the rest"

    bobs = send_all(session, [("tools/call", modern_params(gateway, "bob"))])[0]
    assert bobs["result"]["resultType"] == "input_required", "another user's questions are their own"

    # Answering one frees its place: the next first round is asked again.
    state = asked[0]["result"]["requestState"]
    params = modern_params(gateway, "alice") | {
        "inputResponses": {"consent": {"action": "accept", "content": {"decision": "deny_once"}}},
        "requestState": state,
    }
    denied = send_all(session, [("tools/call", params)])[0]
    assert denied["error"]["data"]["reason"] == "consent_denied"
    again = send_all(session, [("tools/call", modern_params(gateway, "alice"))])[0]
    assert again["result"]["resultType"] == "input_required"
    assert rows_of(gateway, "alice", "awaiting_client") == MAX_OPEN_QUESTIONS
    assert gateway.chain_ok()


def check_permission(command: str) -> tuple[str, dict[str, Any]]:
    return "tools/call", {"name": "check_permission", "arguments": {"tool_name": "Bash", "input": {"command": command}}}


def behavior_of(response: dict[str, Any]) -> dict[str, Any]:
    (block,) = response["result"]["content"]
    parsed: dict[str, Any] = json.loads(block["text"])
    return parsed


@on_both_engines
def test_concurrent_check_permission_questions_stop_at_the_cap(
    make_gateway: Callable[..., GatewayHome], open_session: SessionFactory
) -> None:
    gateway = make_gateway({"permission_prompt": ASK_ALL, "consent": {"timeout_s": 10}})
    gateway.add_user("alice", "USER")
    gateway.add_user("bob", "USER")
    alice = open_session(gateway, env={"MCP_GATEWAY_TOKEN": gateway.token("alice")})
    bob = open_session(gateway, env={"MCP_GATEWAY_TOKEN": gateway.token("bob")})

    ids = send_only(alice, [check_permission(f"git push origin b{n}") for n in range(MAX_OPEN_QUESTIONS + EXTRA)])
    # The refused questions (whichever came in last) are answered at once, long before the others time out.
    refused = [alice.read_message(timeout=8) for _ in range(EXTRA)]
    for response in refused:
        answer = behavior_of(response)
        assert answer["behavior"] == "deny" and "answer them or let them expire" in answer["message"], answer
        run_id = response["result"]["_meta"]["mcp-write-gateway/run_id"]
        events = gateway.events_of(run_id)
        assert events[0]["event_type"] == "MCP_TOOL_CALL"
        assert (events[-1]["event_type"], events[-1]["detail"]["reason"]) == ("TOOL_FINISHED", LIMIT)
        assert_decided_by_policy(gateway, run_id)
    assert rows_of(gateway, "alice", "pending") == MAX_OPEN_QUESTIONS, "the approver sees at most the cap"

    (bob_id,) = send_only(bob, [check_permission("git push origin main")])  # asked while alice is full
    waited = [alice.wait_response(i, timeout=30) for i in set(ids) - {r["id"] for r in refused}]
    assert all("no person answered" in behavior_of(w)["message"] for w in waited), "the asked ones timed out"
    assert "no person answered" in behavior_of(bob.wait_response(bob_id, timeout=30))["message"]
    assert rows_of(gateway, "alice", "pending") == 0
    assert rows_of(gateway, "alice", "expired") == MAX_OPEN_QUESTIONS
    assert rows_of(gateway, "bob", "expired") == 1, "bob's question was asked, not refused"
    assert gateway.chain_ok()


@on_both_engines
def test_a_mix_of_out_of_band_runs_and_first_rounds_shares_one_cap(
    make_gateway: Callable[..., GatewayHome], open_session: SessionFactory
) -> None:
    gateway = make_gateway({"consent": {"timeout_s": 8}} | ROOMY_BUDGET)
    gateway.add_user("alice", "USER")
    legacy = open_session(gateway)  # no elicitation: each question waits for the approver
    half = MAX_OPEN_QUESTIONS // 2
    waiting = [legacy.send_call("run_pytest", {"test_path": "tests"}, gateway.token("alice")) for _ in range(half)]
    modern = open_session(gateway, initialize=False)
    answers = send_all(modern, [("tools/call", modern_params(gateway, "alice")) for _ in range(half + EXTRA)])
    # The out-of-band questions may still be on their way in: whatever the order, the total is the cap.
    refused = [a for a in answers if "error" in a]
    late = [legacy.wait_response(i, timeout=30) for i in waiting]
    refused += [a for a in late if a["error"]["data"]["reason"] == LIMIT]
    assert len(refused) == EXTRA
    for response in refused:
        assert_refused_with_its_trail(gateway, response)
    asked = rows_of(gateway, "alice", "awaiting_client") + rows_of(gateway, "alice", "expired")
    assert asked == MAX_OPEN_QUESTIONS
    assert all(a["error"]["data"]["reason"] in ("consent_timeout", LIMIT) for a in late)
    assert gateway.chain_ok()


def legacy_call(gateway: GatewayHome, user: str) -> tuple[str, dict[str, Any]]:
    token = gateway.token(user)
    return "tools/call", {"name": "run_pytest", "arguments": {"test_path": "tests"}, "auth": {"token": token}}


def dialogs_of(session: StdioSession) -> list[dict[str, Any]]:
    return [m for m in session.unsolicited if m["method"] == "elicitation/create"]


def withdrawn_dialogs(session: StdioSession) -> set[Any]:
    """The ids of the dialogs the gateway cancelled (a call cancelled while its question was open)."""
    return {m["params"]["requestId"] for m in session.unsolicited if m["method"] == "notifications/cancelled"}


@on_both_engines
def test_in_band_elicitations_stop_at_the_cap_and_share_it_with_every_other_channel(
    make_gateway: Callable[..., GatewayHome], open_session: SessionFactory
) -> None:
    gateway = make_gateway({"consent": {"timeout_s": 15}} | ROOMY_BUDGET)
    gateway.add_user("alice", "USER")
    gateway.add_user("bob", "USER")
    dialog = open_session(gateway, capabilities=FORM)  # declares elicitation and never answers a dialog
    ids = send_only(dialog, [legacy_call(gateway, "alice") for _ in range(MAX_OPEN_QUESTIONS + EXTRA)])
    deadline = time.monotonic() + 12
    while len(dialog._pending) < EXTRA or len(dialogs_of(dialog)) < MAX_OPEN_QUESTIONS:
        assert time.monotonic() < deadline, (len(dialog._pending), len(dialogs_of(dialog)))
        dialog.pump(0.2)
    refused = [dialog._pending.pop(i) for i in ids if i in dialog._pending]
    assert len(refused) == EXTRA, "the calls past the cap are answered at once, the others wait for their dialog"
    for response in refused:
        assert_refused_with_its_trail(gateway, response)
    dialog.pump(1.0)
    assert len(dialogs_of(dialog)) == MAX_OPEN_QUESTIONS, "nobody is asked past the cap"
    assert rows_of(gateway, "alice", "in_dialog") == MAX_OPEN_QUESTIONS

    # One cap for every channel, on every gateway of the database: an out-of-band question from
    # another gateway, and a 2026-07-28 first round, are refused too; another user is asked.
    elsewhere = open_session(gateway)  # no elicitation: its questions wait for the approver
    (out_of_band,) = send_all(elsewhere, [legacy_call(gateway, "alice")])
    assert_refused_with_its_trail(gateway, out_of_band)
    modern = open_session(gateway, initialize=False)
    (first_round,) = send_all(modern, [("tools/call", modern_params(gateway, "alice"))])
    assert_refused_with_its_trail(gateway, first_round)
    (bob_id,) = send_only(dialog, [legacy_call(gateway, "bob")])
    while len(dialogs_of(dialog)) < MAX_OPEN_QUESTIONS + 1:
        assert time.monotonic() < deadline + 10, "bob was not asked"
        dialog.pump(0.2)

    # Unanswered, the dialogs time out and free their places: the next call is asked again.
    waited = [dialog.wait_response(i, timeout=60) for i in ids if i not in {r["id"] for r in refused}]
    assert all(w["error"]["data"]["reason"] == "consent_timeout" for w in waited), waited[0]
    assert dialog.wait_response(bob_id, timeout=60)["error"]["data"]["reason"] == "consent_timeout"
    assert rows_of(gateway, "alice", "in_dialog") == 0 and rows_of(gateway, "alice", "expired") == MAX_OPEN_QUESTIONS
    send_only(dialog, [legacy_call(gateway, "alice")])
    deadline = time.monotonic() + 20
    while len(dialogs_of(dialog)) < MAX_OPEN_QUESTIONS + 2:
        assert time.monotonic() < deadline, "a place freed, and still nobody asked"
        dialog.pump(0.2)
    with gateway.engine.connect() as connection:
        attempts = connection.execute(select(func.count()).select_from(db.budget_charges)).scalar()
    # Every call past the budget stage holds one attempt, refused ones too (decision 1).
    assert attempts == MAX_OPEN_QUESTIONS + EXTRA + 2 + 1 + 1
    assert gateway.chain_ok()


def test_a_dialog_that_ends_without_an_answer_frees_its_place_at_once(
    make_gateway: Callable[..., GatewayHome], open_session: SessionFactory
) -> None:
    """A cancelled call and a dialog the client fails each close their question: the next call is asked."""
    gateway = make_gateway({"consent": {"timeout_s": 120}} | ROOMY_BUDGET)
    gateway.add_user("alice", "USER")
    dialog = open_session(gateway, capabilities=FORM)
    ids = send_only(dialog, [legacy_call(gateway, "alice") for _ in range(MAX_OPEN_QUESTIONS)])
    deadline = time.monotonic() + 90  # generous: the suite runs beside 16-gateway fleets
    while len(dialogs_of(dialog)) < MAX_OPEN_QUESTIONS:
        assert time.monotonic() < deadline, len(dialogs_of(dialog))
        dialog.pump(0.2)
    (over,) = send_all(dialog, [legacy_call(gateway, "alice")])
    assert over["error"]["data"]["reason"] == LIMIT

    dialog.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": ids[0]}})
    # The calls are asked in whatever order they reach consent: the cancelled call's dialog is the one
    # the gateway withdraws (its own notifications/cancelled); another one is failed.
    deadline = time.monotonic() + 90  # generous: the suite runs beside 16-gateway fleets
    while not (withdrawn := withdrawn_dialogs(dialog)):
        assert time.monotonic() < deadline, "the cancelled call's dialog was not withdrawn"
        dialog.pump(0.2)
    failed = next(d for d in dialogs_of(dialog) if d["id"] not in withdrawn)
    dialog.send({"jsonrpc": "2.0", "id": failed["id"], "error": {"code": -32603, "message": "dialog crashed"}})
    while not dialog._pending:
        assert time.monotonic() < deadline, f"the call whose dialog failed was not answered: {dialog.stderr_text()}"
        dialog.pump(0.2)
    (answered,) = dialog._pending.values()
    assert answered["error"]["data"]["reason"] == "consent_no_answer", answered
    while rows_of(gateway, "alice", "in_dialog") > MAX_OPEN_QUESTIONS - 2:
        assert time.monotonic() < deadline, "the cancelled call's question stays open"
        dialog.pump(0.2)
    send_only(dialog, [legacy_call(gateway, "alice") for _ in range(2)])
    while len(dialogs_of(dialog)) < MAX_OPEN_QUESTIONS + 2:
        assert time.monotonic() < deadline, "two places freed, and still nobody asked"
        dialog.pump(0.2)
    assert rows_of(gateway, "alice", "in_dialog") == MAX_OPEN_QUESTIONS
