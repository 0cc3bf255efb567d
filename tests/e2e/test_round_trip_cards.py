"""One call, one card, under 2026-07-28 too (docs/console.md, "Invocations: the cards").

A 2026-07-28 client asks its person through an `input_required` round trip: two tools/call
requests for one call. The console shows that call as one card: the first round's, which the
retry moves to the decision and the outcome (gateway/calls.py). Each test runs a real
`mcp-gateway serve` over stdio, on SQLite and on PostgreSQL, and reads the cards as the console
does (`CallStore`). Here the round trips that run in the sandbox; those that end before any run
(refused, timed out, never finished) are tests/gateway/test_server_round_trip_cards.py (in process).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.calls import CallStore, Card
from tests.harness import GatewayHome, StdioSession, modern_meta
from tests.memory_session import MemorySession
from tests.pg_cluster import on_both_engines

pytestmark = on_both_engines  # PostgreSQL writes the cards in its own function (migration 0008)
SessionFactory = Callable[..., StdioSession]


def modern(
    session: StdioSession | MemorySession,
    gateway: GatewayHome,
    answer: dict[str, Any] | None = None,
    state: str | None = None,
    arguments: dict[str, Any] | None = None,
) -> dict[str, Any]:
    params: dict[str, Any] = {
        "name": "run_pytest",
        "arguments": arguments or {"test_path": "tests"},
        "auth": {"token": gateway.token("alice")},
    }
    if isinstance(session, StdioSession):  # a MemorySession's own SDK session stamps the envelope
        params["_meta"] = modern_meta()
    if answer is not None:
        params["inputResponses"] = {"consent": answer}
        params["requestState"] = state
    return session.request("tools/call", params, timeout=120)


def accept(decision: str) -> dict[str, Any]:
    return {"action": "accept", "content": {"decision": decision}}


def cards(gateway: GatewayHome) -> list[Card]:
    return CallStore(gateway.engine).fetch_latest(None, 500)


def asked(session: StdioSession | MemorySession, gateway: GatewayHome, arguments: dict[str, Any] | None = None) -> str:
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
