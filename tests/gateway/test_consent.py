"""Consent's decisions, table by table, and the stage on a real SQLite database with an injected clock."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from sqlalchemy import Engine, event

from gateway.audit import AuditLog
from gateway.consent import (
    ConsentRequest,
    ConsentStage,
    Decision,
    choices_for,
    is_destructive,
    parse_duration,
    pick_grant,
    redacted_preview,
    risk_tier,
    tool_fingerprint,
)
from gateway.consent_store import ConsentStore, Grant
from gateway.errors import ConsentDeniedError
from gateway.policy import ConsentPolicy
from tests.fakes import T0, FakeClock, SequentialRunIds

RUN_PYTEST = {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": True, "openWorldHint": False}


@pytest.mark.parametrize(
    ("annotations", "trusted", "declared", "tier"),
    [
        ({"readOnlyHint": True, "openWorldHint": False}, True, None, "low"),
        ({"readOnlyHint": True, "openWorldHint": False}, False, None, "medium"),
        (RUN_PYTEST, True, None, "medium"),
        ({**RUN_PYTEST, "destructiveHint": True}, True, None, "high"),
        ({**RUN_PYTEST, "openWorldHint": True}, True, None, "high"),
        ({"readOnlyHint": False}, True, None, "high"),  # the MCP defaults: destructive, open world
        ({}, True, None, "high"),
        (None, True, None, "high"),
        (RUN_PYTEST, True, "low", "low"),  # the server's own tier in _meta wins
        (RUN_PYTEST, True, "extreme", "medium"),  # ...when it is a tier
    ],
)
def test_risk_tier(annotations: dict[str, Any] | None, trusted: bool, declared: object, tier: str) -> None:
    assert risk_tier(annotations, trusted, declared) == tier


@pytest.mark.parametrize(
    ("annotations", "destructive"),
    [
        (RUN_PYTEST, False),
        ({"readOnlyHint": False}, True),
        ({"readOnlyHint": True}, False),  # destructiveHint means nothing for a read-only tool
        ({"readOnlyHint": True, "destructiveHint": True}, False),
        (None, True),
    ],
)
def test_is_destructive(annotations: dict[str, Any] | None, destructive: bool) -> None:
    assert is_destructive(annotations) is destructive


def test_allow_always_is_never_offered_for_a_destructive_tool() -> None:
    assert Decision.ALLOW_ALWAYS not in choices_for(destructive=True)
    assert choices_for(destructive=False) == tuple(Decision)


def test_the_fingerprint_changes_with_the_schema_or_the_annotations() -> None:
    base = tool_fingerprint("run_pytest", {"type": "object"}, RUN_PYTEST)
    assert base == tool_fingerprint("run_pytest", {"type": "object"}, dict(reversed(list(RUN_PYTEST.items()))))
    assert base != tool_fingerprint("run_pytest", {"type": "object", "required": ["x"]}, RUN_PYTEST)
    assert base != tool_fingerprint("run_pytest", {"type": "object"}, {**RUN_PYTEST, "destructiveHint": True})


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("90s", 90), ("15m", 900), ("8h", 28800), ("7d", 604800)])
def test_parse_duration(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "0s", "7w", "-1d", "1.5h", "d"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


def test_the_preview_hides_secret_looking_values_and_is_cut() -> None:
    shown = redacted_preview({"test_path": "tests", "nested": {"api_token": "s3cr3t", "Password": "x"}})
    assert "s3cr3t" not in shown and '"api_token":"[redacted]"' in shown and '"Password":"[redacted]"' in shown
    assert redacted_preview({"k": "v" * 1000}, limit=50).endswith("…")


def grant(decision: str = "ALLOW", **changes: Any) -> Grant:
    values: dict[str, Any] = {
        "id": 1,
        "user": "alice",
        "workspace": "default",
        "server_id": "mcp-write-gateway",
        "tool_name": "run_pytest",
        "args_hash": None,
        "decision": decision,
        "fingerprint": "f" * 64,
        "granted_at": T0,
        "expires_at": T0 + 100,
        "granted_by": "test",
    }
    values.update(changes)
    return Grant(**values)


@pytest.mark.parametrize(
    ("grants", "now", "args_hash", "expected"),
    [
        ([grant()], T0 + 99, "a", 1),
        ([grant()], T0 + 100, "a", None),  # expired at expires_at
        ([grant(expires_at=None)], T0 + 10**9, "a", 1),
        ([grant(fingerprint="0" * 64)], T0, "a", None),  # made for another tool definition
        ([grant(args_hash="b")], T0, "a", None),  # made for other arguments
        ([grant(args_hash="a")], T0, "a", 1),
        ([grant(id=1), grant("DENY", id=2, granted_at=T0 - 5)], T0, "a", 2),  # deny beats allow
        ([grant(id=1), grant(id=3, granted_at=T0 + 1)], T0 + 2, "a", 3),  # the newest of a kind
        ([grant(revoked_at=T0)], T0, "a", None),
    ],
    ids=[
        "live",
        "expired",
        "no-expiry",
        "other-fingerprint",
        "other-args",
        "same-args",
        "deny-wins",
        "newest",
        "revoked",
    ],
)
def test_pick_grant(grants: list[Grant], now: float, args_hash: str, expected: int | None) -> None:
    picked = pick_grant(grants, now, "f" * 64, args_hash)
    assert (picked.id if picked else None) == expected


# --- the stage on a real database -----------------------------------------------------------------


class Asker:
    """The person behind the client, as a queue of answers; counts the times asked."""

    def __init__(self, *answers: Decision | None) -> None:
        self.answers = list(answers)
        self.asked: list[tuple[Decision, ...]] = []

    async def ask(self, message: str, choices: tuple[Decision, ...]) -> Decision | None:
        self.asked.append(choices)
        return self.answers.pop(0)


@pytest.fixture
def stage(engine: Engine, clock: FakeClock) -> ConsentStage:
    return ConsentStage(
        ConsentPolicy(timeout_s=5), AuditLog(engine, clock), ConsentStore(engine), clock, SequentialRunIds()
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def request(run_id: str = "r1", fingerprint: str = "f" * 64, destructive: bool = False) -> ConsentRequest:
    return ConsentRequest(
        run_id=run_id,
        user="alice",
        workspace="default",
        server_id="mcp-write-gateway",
        tool_name="run_pytest",
        args_hash="a" * 64,
        arguments={"test_path": "tests"},
        risk="medium",
        fingerprint=fingerprint,
        destructive=destructive,
    )


def require(stage: ConsentStage, req: ConsentRequest, asker: Asker) -> Decision:
    return anyio.run(stage.require, req, asker)


def test_t7_allow_always_expires_after_the_tiers_days(stage: ConsentStage, clock: FakeClock) -> None:
    asker = Asker(Decision.ALLOW_ALWAYS, Decision.ALLOW_ONCE)
    assert require(stage, request("r1"), asker) is Decision.ALLOW_ALWAYS
    clock.advance(30 * 86400 - 1)
    assert require(stage, request("r2"), asker) is Decision.ALLOW_ALWAYS, "still within 30 days (medium)"
    clock.advance(1)
    assert require(stage, request("r3"), asker) is Decision.ALLOW_ONCE, "expired: asked again"
    assert len(asker.asked) == 2


def test_a_changed_tool_definition_is_asked_again(stage: ConsentStage) -> None:
    asker = Asker(Decision.ALLOW_ALWAYS, Decision.DENY_ONCE)
    require(stage, request("r1"), asker)
    with pytest.raises(ConsentDeniedError):
        require(stage, request("r2", fingerprint="e" * 64), asker)
    assert len(asker.asked) == 2


def test_a_destructive_tool_is_never_offered_allow_always(stage: ConsentStage) -> None:
    asker = Asker(Decision.ALLOW_ONCE)
    require(stage, request(destructive=True), asker)
    assert Decision.ALLOW_ALWAYS not in asker.asked[0]


def test_a_cache_hit_costs_one_query_of_the_grants(stage: ConsentStage, engine: Engine) -> None:
    require(stage, request("r1"), Asker(Decision.ALLOW_ALWAYS))
    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", seen)
    try:
        assert require(stage, request("r2"), Asker()) is Decision.ALLOW_ALWAYS
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    reads = [s for s in statements if s.lstrip().upper().startswith("SELECT") and "consent" in s]
    assert len(reads) == 1, reads
    assert "consent_grants" in reads[0]


def test_out_of_band_a_decision_made_before_the_question_closed_counts(
    stage: ConsentStage, engine: Engine, clock: FakeClock
) -> None:
    store = ConsentStore(engine)

    async def approve_soon() -> None:
        while store.fetch_request("r1") is None:
            await anyio.sleep(0.01)
        assert store.decide("r1", "ALLOW_ONCE", "approver-a", clock.now())
        assert not store.decide("r1", "DENY_ALWAYS", "approver-b", clock.now()), "decided once"

    async def main() -> Decision:
        async with anyio.create_task_group() as group:
            group.start_soon(approve_soon)
            with anyio.fail_after(10):
                return await stage.require(request("r1"), None)

    assert anyio.run(main) is Decision.ALLOW_ONCE
    assert store.fetch_request("r1").decided_by == "approver-a"  # type: ignore[union-attr]


def test_out_of_band_allow_always_for_a_destructive_tool_is_a_deny(
    stage: ConsentStage, engine: Engine, clock: FakeClock
) -> None:
    store = ConsentStore(engine)

    async def answer() -> None:
        while store.fetch_request("r1") is None:
            await anyio.sleep(0.01)
        store.decide("r1", "ALLOW_ALWAYS", "approver", clock.now())  # not offered for this tool

    async def main() -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(answer)
            with anyio.fail_after(10), pytest.raises(ConsentDeniedError):
                await stage.require(request("r1", destructive=True), None)

    anyio.run(main)
    assert store.list_grants() == [], "nothing stored"
