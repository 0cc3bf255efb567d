"""One call, one card, under 2026-07-28 too (docs/console.md, "Invocations: the cards").

A 2026-07-28 client asks its person through an `input_required` round trip: two tools/call
requests for one call. The console shows that call as one card: the first round's, which the
retry moves to the decision and the outcome (gateway/calls.py). Each test runs a real
`mcp-gateway serve` over stdio, on SQLite and on PostgreSQL, and reads the cards as the console
does (`CallStore`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gateway.calls import CallStore, Card
from tests.harness import GatewayHome, StdioSession, modern_meta
from tests.pg_cluster import on_both_engines

pytestmark = on_both_engines  # PostgreSQL writes the cards in its own function (migration 0008)
SessionFactory = Callable[..., StdioSession]


def modern(
    session: StdioSession,
    gateway: GatewayHome,
    answer: dict[str, Any] | None = None,
    state: str | None = None,
    arguments: dict[str, Any] | None = None,
) -> dict[str, Any]:
    params: dict[str, Any] = {
        "_meta": modern_meta(),
        "name": "run_pytest",
        "arguments": arguments or {"test_path": "tests"},
        "auth": {"token": gateway.token("alice")},
    }
    if answer is not None:
        params["inputResponses"] = {"consent": answer}
        params["requestState"] = state
    return session.request("tools/call", params, timeout=120)


def accept(decision: str) -> dict[str, Any]:
    return {"action": "accept", "content": {"decision": decision}}


def cards(gateway: GatewayHome) -> list[Card]:
    return CallStore(gateway.engine).fetch_latest(None, 500)


def asked(session: StdioSession, gateway: GatewayHome, arguments: dict[str, Any] | None = None) -> str:
    """The first round: the question comes back; its state names the call's one card."""
    first = modern(session, gateway, arguments=arguments)["result"]
    assert first["resultType"] == "input_required", first
    state = str(first["requestState"])
    (card,) = [c for c in cards(gateway) if c.run_id == state]
    assert card.code is None, card
    return state


def test_an_allowed_round_trip_is_one_card_that_ends_done(gateway: GatewayHome, open_session: SessionFactory) -> None:
    session = open_session(gateway, initialize=False)
    state = asked(session, gateway)
    retry = modern(session, gateway, accept("allow_once"), state)
    assert retry["result"]["structuredContent"]["passed"] > 0, retry
    (card,) = cards(gateway)
    assert (card.run_id, card.status, card.code, card.reason) == (state, "done", None, None)
    assert card.result is not None and card.result[0]["text"] == retry["result"]["content"][0]["text"]
    # The retry's run is the one the card shows: its artifacts are linked from the card's result.
    run_id = retry["result"]["structuredContent"]["run_id"]
    assert any(run_id in block.get("uri", "") for block in card.result), card.result
    assert [e["event_type"] for e in gateway.events_of(run_id)][-1] == "TOOL_FINISHED"


def test_a_denied_round_trip_is_one_card_that_ends_with_the_refusal(
    gateway: GatewayHome, open_session: SessionFactory
) -> None:
    session = open_session(gateway, initialize=False)
    for number, answer in enumerate((accept("deny_once"), {"action": "decline"}, {"action": "cancel"}), start=1):
        state = asked(session, gateway)
        refused = modern(session, gateway, answer, state)
        assert refused["error"]["data"]["reason"] == "consent_denied", refused
        found = cards(gateway)
        assert len(found) == number, [(c.run_id, c.status) for c in found]
        assert (found[0].run_id, found[0].status, found[0].code, found[0].reason) == (
            state,
            "error",
            -32008,
            "consent_denied",
        )
        assert found[0].message == refused["error"]["message"]


def test_an_answer_after_the_timeout_ends_the_one_card_as_a_timeout(
    make_gateway: Callable[..., GatewayHome], open_session: SessionFactory
) -> None:
    gateway = make_gateway({"consent": {"timeout_s": 1}})
    gateway.add_user("alice")
    session = open_session(gateway, initialize=False)
    state = asked(session, gateway)
    time.sleep(1.5)
    refused = modern(session, gateway, accept("allow_once"), state)
    assert refused["error"]["data"]["reason"] == "consent_timeout", refused
    (card,) = cards(gateway)
    assert (card.run_id, card.status, card.reason) == (state, "error", "consent_timeout")


def test_a_state_that_answers_nothing_of_this_call_never_moves_its_card(
    gateway: GatewayHome, open_session: SessionFactory
) -> None:
    """A replayed, transplanted or forged state is a call of its own, with a card of its own: never another's."""
    session = open_session(gateway, initialize=False)
    state = asked(session, gateway)
    transplanted = modern(session, gateway, accept("allow_once"), state, arguments={"test_path": "tests/"})
    assert transplanted["error"]["data"]["reason"] == "consent_state_invalid"
    forged = modern(session, gateway, accept("allow_once"), "f" * 32)
    assert forged["error"]["data"]["reason"] == "consent_state_invalid"
    assert "result" in modern(session, gateway, accept("allow_once"), state)
    replayed = modern(session, gateway, accept("deny_once"), state)
    assert replayed["error"]["data"]["reason"] == "consent_state_invalid"
    by_run = {c.run_id: c for c in cards(gateway)}
    assert by_run[state].status == "done", "the call the state belongs to ends as its own retry left it"
    others = [c for run_id, c in by_run.items() if run_id != state]
    assert len(others) == 3 and all((c.status, c.reason) == ("error", "consent_state_invalid") for c in others)
    for refused in (transplanted, forged, replayed):
        assert refused["error"]["data"]["run_id"] in by_run, "a refused retry keeps its own card"


def test_a_round_trip_the_client_never_finishes_is_one_cancelled_card(
    gateway: GatewayHome, open_session: SessionFactory
) -> None:
    session = open_session(gateway, initialize=False)
    state = asked(session, gateway)
    (card,) = cards(gateway)
    assert (card.run_id, card.status) == (state, "cancelled")


def test_a_state_naming_an_approvers_question_never_moves_that_calls_card(
    make_gateway: Callable[..., GatewayHome], open_session: SessionFactory
) -> None:
    """An approver's question's id is its call's run_id too: named as a retry's state, after its deadline,
    it answers as a timeout (nothing of this call was ever asked) and leaves the other call's card alone."""
    gateway = make_gateway({"consent": {"timeout_s": 1}})
    gateway.add_user("alice")
    legacy = open_session(gateway)  # no elicitation: the question waits for the approver, and times out
    timed_out = legacy.call_tool("run_pytest", {"test_path": "tests"}, gateway.token("alice"))
    other = timed_out["error"]["data"]["run_id"]
    (before,) = cards(gateway)
    session = open_session(gateway, initialize=False)
    refused = modern(session, gateway, accept("allow_once"), other)
    assert refused["error"]["data"]["reason"] == "consent_timeout", refused
    by_run = {c.run_id: c for c in cards(gateway)}
    assert by_run[other] == before, "the other call's card is as its own call left it"
    assert by_run[refused["error"]["data"]["run_id"]].reason == "consent_timeout", "the retry has a card of its own"
