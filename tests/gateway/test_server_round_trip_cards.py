"""One call, one card, under 2026-07-28 too (docs/console.md, "Invocations: the cards"), through the
MCP server in process (tests/memory_session.py), on SQLite and on PostgreSQL: the round trips that
end before anything runs (refused, timed out, never finished). Those that run in the sandbox are
tests/e2e/test_round_trip_cards.py (real stdio).
"""

from __future__ import annotations

from collections.abc import Callable

from tests.e2e.test_round_trip_cards import accept, asked, cards, modern
from tests.harness import MODERN, GatewayHome
from tests.memory_session import MemorySession
from tests.pg_cluster import on_both_engines
from tests.refusals import past_its_deadline

pytestmark = on_both_engines  # PostgreSQL writes the cards in its own function (migration 0008)
SessionFactory = Callable[..., MemorySession]


def modern_session(open_memory: SessionFactory, gateway: GatewayHome) -> MemorySession:
    return open_memory(gateway, version=MODERN, elicitation=True)


def test_a_denied_round_trip_is_one_card_that_ends_with_the_refusal(
    gateway: GatewayHome, open_memory: SessionFactory
) -> None:
    session = modern_session(open_memory, gateway)
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
    make_gateway: Callable[..., GatewayHome], open_memory: SessionFactory
) -> None:
    gateway = make_gateway({"consent": {"timeout_s": 1}})
    gateway.add_user("alice")
    session = modern_session(open_memory, gateway)
    state = asked(session, gateway)
    past_its_deadline(gateway, state)
    refused = modern(session, gateway, accept("allow_once"), state)
    assert refused["error"]["data"]["reason"] == "consent_timeout", refused
    (card,) = cards(gateway)
    assert (card.run_id, card.status, card.reason) == (state, "error", "consent_timeout")


def test_a_round_trip_the_client_never_finishes_is_one_cancelled_card(
    gateway: GatewayHome, open_memory: SessionFactory
) -> None:
    session = modern_session(open_memory, gateway)
    state = asked(session, gateway)
    (card,) = cards(gateway)
    assert (card.run_id, card.status) == (state, "cancelled")


def test_a_state_naming_an_approvers_question_never_moves_that_calls_card(
    make_gateway: Callable[..., GatewayHome], open_memory: SessionFactory
) -> None:
    """An approver's question's id is its call's run_id too: named as a retry's state, after its deadline,
    it answers as a timeout (nothing of this call was ever asked) and leaves the other call's card alone."""
    gateway = make_gateway({"consent": {"timeout_s": 1}})
    gateway.add_user("alice")
    legacy = open_memory(gateway)  # no elicitation: the question waits for the approver, and times out
    timed_out = legacy.call_tool("run_pytest", {"test_path": "tests"}, gateway.token("alice"))
    other = timed_out["error"]["data"]["run_id"]
    (before,) = cards(gateway)
    session = modern_session(open_memory, gateway)
    refused = modern(session, gateway, accept("allow_once"), other)
    assert refused["error"]["data"]["reason"] == "consent_timeout", refused
    by_run = {c.run_id: c for c in cards(gateway)}
    assert by_run[other] == before, "the other call's card is as its own call left it"
    assert by_run[refused["error"]["data"]["run_id"]].reason == "consent_timeout", "the retry has a card of its own"
