"""gateway/audit.py: the hash chain, checked against independent hashing and direct SQL tampering."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from gateway.audit import GENESIS, AuditLog, ChainHead, ChainReport, EventDraft, EventType, chain_hash, verify_chain
from gateway.calls import CardStatus, Moved, Opened
from gateway.clock import iso_utc
from gateway.db import GENESIS_HASH, make_engine
from gateway.errors import InternalError
from tests.fakes import T0, FakeClock

DRAFTS = [
    EventDraft(EventType.MCP_TOOL_CALL, run_id="r1", user="alice", tool_name="run_pytest", args_hash="a" * 64),
    EventDraft(EventType.TOOL_STARTED, run_id="r1", user="alice", workspace="default", tool_name="run_pytest"),
    EventDraft(
        EventType.SANDBOX_EXEC,
        run_id="r1",
        user="alice",
        workspace="default",
        tool_name="run_pytest",
        detail={"exit_code": 0, "duration_ms": 812, "killed_by": None, "note": "ação ✓ 測試"},
    ),
    EventDraft(EventType.TOOL_FINISHED, run_id="r1", user="alice", workspace="default", tool_name="run_pytest"),
    EventDraft(
        EventType.POLICY_BLOCKED,
        run_id="r2",
        user="bob",
        tool_name="run_pytest",
        code=-32004,
        detail={"blocked_reason": "path_outside_workspace"},
    ),
]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def log(engine: Engine, clock: FakeClock) -> AuditLog:
    audit = AuditLog(engine, clock)
    for draft in DRAFTS:
        audit.append(draft)
        clock.advance(1.5)
    return audit


def verify(log: AuditLog) -> ChainReport:
    return verify_chain(log.events(), log.head())


def execute(engine: Engine, sql: str, **params: Any) -> None:
    with engine.begin() as connection:
        connection.execute(text(sql), params)


# --- what is written -----------------------------------------------------------------------


def test_intact_chain_verifies(log: AuditLog) -> None:
    assert verify(log) == ChainReport(ok=True, checked=len(DRAFTS))


def test_empty_log_verifies(engine: Engine, clock: FakeClock) -> None:
    log = AuditLog(engine, clock)

    assert log.head() == ChainHead(0, GENESIS_HASH)
    assert verify(log) == ChainReport(ok=True, checked=0)


def test_events_are_numbered_and_stamped_with_the_injected_clock(log: AuditLog) -> None:
    events = list(log.events())

    assert [e.id for e in events] == [1, 2, 3, 4, 5]
    assert [e.ts for e in events] == [iso_utc(T0 + 1.5 * i) for i in range(5)]
    assert [e.event_type for e in events] == [str(d.event_type) for d in DRAFTS]
    assert events[2].detail == DRAFTS[2].detail
    assert events[4].code == -32004
    assert log.head() == ChainHead(5, events[-1].hash)


def test_hash_is_sha256_of_prev_hash_and_canonical_json_of_the_body(log: AuditLog, engine: Engine) -> None:
    # Recomputed from the raw rows, without the gateway's own canonical_json or AuditEvent.
    with engine.connect() as connection:
        rows = connection.execute(text("SELECT * FROM audit_events ORDER BY id")).mappings().all()
    prev = "0" * 64
    for row in rows:
        body = {
            "id": row["id"],
            "ts": row["ts"],
            "event_type": row["event_type"],
            "run_id": row["run_id"],
            "user": row["user_name"],
            "workspace": row["workspace"],
            "tool_name": row["tool_name"],
            "args_hash": row["args_hash"],
            "code": row["code"],
            "detail": json.loads(row["detail"]),
        }
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        assert row["prev_hash"] == prev
        assert row["hash"] == hashlib.sha256((prev + canonical).encode("utf-8")).hexdigest()
        prev = row["hash"]
    assert len(rows) == len(DRAFTS)


HOSTILE = [
    EventDraft(
        EventType.POLICY_BLOCKED,
        run_id='r"3',
        user="ann\\o'neil",
        workspace='ws,"id":1',
        tool_name='"id":7,"run_id":"x"',
        args_hash=None,
        code=-32004,
        detail={"id": 99, "nul": "a\x00b", "emoji": "🧪" * 3, "ctl": "\t\n\u2028", "deep": {"z": [1, None, 2.5]}},
    ),
    EventDraft(EventType.USER_ADDED),
    EventDraft(EventType.TOKEN_ISSUED, user="é" * 64, detail={"long": "x" * 100_000}),
    # What PostgreSQL's array text form gives a meaning to (the append sends its columns so):
    # a bare NULL, braces, commas, spaces at the ends, an empty string, a trailing backslash.
    EventDraft(EventType.POLICY_BLOCKED, run_id="NULL", user="{a,b}", workspace=" ws ", tool_name="", args_hash="x\\"),
]


def test_hostile_fields_hash_alike_in_the_gateway_and_in_the_database(engine: Engine, clock: FakeClock) -> None:
    """On PostgreSQL the server hashes (migration 0008) what the gateway cut around the id; the cut must
    give back the canonical JSON byte for byte, whatever the fields hold (quotes, `"id":` in a value,
    escapes, 4-byte UTF-8, nothing at all), or `audit verify` would fail on an honest log."""
    log = AuditLog(engine, clock)
    log.append(DRAFTS[0])
    written = log.append(*HOSTILE)
    assert [e.id for e in written] == [2, 3, 4, 5]
    assert list(log.events())[1:] == written
    for event in written:
        canonical = json.dumps(event.body(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        assert event.hash == hashlib.sha256((event.prev_hash + canonical).encode("utf-8")).hexdigest()
    assert verify(log).ok


def test_unicode_detail_is_stored_as_utf8_not_escaped(log: AuditLog, engine: Engine) -> None:
    with engine.connect() as connection:
        stored = connection.execute(text("SELECT detail FROM audit_events WHERE id = 3")).scalar_one()

    assert "ação ✓ 測試" in stored
    assert "\\u" not in stored
    assert stored == json.dumps(json.loads(stored), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def test_export_carries_the_spec_fields(log: AuditLog) -> None:
    exported = next(iter(log.events())).to_json()

    assert set(exported) == {
        "id", "ts", "event_type", "run_id", "user", "workspace", "tool_name", "args_hash", "code", "detail",
        "prev_hash", "hash",
    }  # fmt: skip


def test_append_of_several_drafts_chains_them_in_one_go(engine: Engine, clock: FakeClock) -> None:
    log = AuditLog(engine, clock)

    written = log.append(*DRAFTS[:3])

    assert [e.id for e in written] == [1, 2, 3]
    assert written[1].prev_hash == written[0].hash
    assert written[2].prev_hash == written[1].hash
    assert list(log.events()) == written
    assert verify(log).ok


def test_events_filter_by_time_and_run(log: AuditLog) -> None:
    assert [e.id for e in log.events(run_id="r2")] == [5]
    assert [e.id for e in log.events(since_ts=iso_utc(T0 + 3))] == [3, 4, 5]
    assert list(log.events(since_ts=iso_utc(T0 + 100))) == []


def test_append_fails_closed_when_the_log_cannot_be_written(tmp_path: Path, clock: FakeClock) -> None:
    unmigrated = make_engine(f"sqlite:///{tmp_path}/empty.db")
    try:
        with pytest.raises(InternalError) as caught:
            AuditLog(unmigrated, clock).append(DRAFTS[0])
    finally:
        unmigrated.dispose()
    assert caught.value.reason == "audit_unavailable"
    assert caught.value.code == -32603


def test_a_card_is_committed_with_its_events_or_neither_is(engine: Engine, clock: FakeClock) -> None:
    # On SQLite the events and the card share the driver's cursor of one transaction (decision 100): a card that
    # cannot be written (its run already has one) takes the events back with it, on either engine.
    audit = AuditLog(engine, clock)
    entry, refusal = DRAFTS[0], dataclasses.replace(DRAFTS[4], run_id="r1", user="alice")
    card = Opened("r1", "alice", None, "gw", "run_pytest", {"test_path": "t"}, CardStatus.ERROR, T0, code=-32004)
    written = audit.append(entry, refusal, along=[card])
    with pytest.raises(InternalError) as caught:
        audit.append(dataclasses.replace(entry, run_id="r3"), along=[card])
    assert caught.value.reason == "audit_unavailable"
    moved = audit.append(DRAFTS[2], along=[Moved("r1", CardStatus.DONE, T0 + 1, message="moved")])
    assert [e.id for e in written + moved] == [1, 2, 3]
    assert verify(audit).ok and audit.head().last_id == 3
    with engine.connect() as connection:
        rows = connection.execute(text("SELECT run_id, status, code, message, last_event_id FROM tool_calls")).all()
    assert [tuple(row) for row in rows] == [("r1", "done", -32004, "moved", 3)]


# --- tampering -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("detail", '{"exit_code":0,"duration_ms":1,"killed_by":null,"note":"ação ✓ 測試"}'),
        ("detail", "not json at all"),
        ("code", 0),
        ("user_name", "mallory"),
        ("user_name", None),
        ("workspace", "other"),
        ("tool_name", "get_evidence"),
        ("args_hash", "b" * 64),
        ("run_id", "r9"),
        ("event_type", "TOOL_FINISHED"),
        ("ts", "2000-01-01T00:00:00.000000Z"),
        ("prev_hash", "f" * 64),
        ("hash", "f" * 64),
    ],
)
def test_editing_a_row_is_detected_at_that_row(log: AuditLog, engine: Engine, column: str, value: object) -> None:
    execute(engine, f"UPDATE audit_events SET {column} = :value WHERE id = 3", value=value)

    report = verify(log)

    assert not report.ok
    assert report.first_bad_id == 3
    assert report.checked == 2


def test_editing_the_last_row_is_detected(log: AuditLog, engine: Engine) -> None:
    execute(engine, "UPDATE audit_events SET code = NULL WHERE id = 5")

    assert verify(log).first_bad_id == 5


def test_deleting_a_middle_row_is_detected(log: AuditLog, engine: Engine) -> None:
    execute(engine, "DELETE FROM audit_events WHERE id = 3")

    report = verify(log)

    assert not report.ok
    assert report.first_bad_id == 3


def test_deleting_the_first_row_is_detected(log: AuditLog, engine: Engine) -> None:
    execute(engine, "DELETE FROM audit_events WHERE id = 1")

    report = verify(log)

    assert not report.ok
    assert report.first_bad_id == 1


def test_deleting_the_last_row_is_detected_by_the_head(log: AuditLog, engine: Engine) -> None:
    execute(engine, "DELETE FROM audit_events WHERE id = 5")

    report = verify(log)

    assert not report.ok
    assert report.first_bad_id == 5
    assert report.checked == 4


def test_deleting_every_row_is_detected(log: AuditLog, engine: Engine) -> None:
    execute(engine, "DELETE FROM audit_events")

    report = verify(log)

    assert not report.ok
    assert report.first_bad_id == 1


def test_swapping_two_rows_ids_is_detected(log: AuditLog, engine: Engine) -> None:
    execute(engine, "UPDATE audit_events SET id = -2 WHERE id = 2")
    execute(engine, "UPDATE audit_events SET id = 2 WHERE id = 4")
    execute(engine, "UPDATE audit_events SET id = 4 WHERE id = -2")

    report = verify(log)

    assert not report.ok
    assert report.first_bad_id == 2


def test_renumbering_to_hide_a_deletion_is_detected(log: AuditLog, engine: Engine) -> None:
    execute(engine, "DELETE FROM audit_events WHERE id = 3")
    execute(engine, "UPDATE audit_events SET id = id - 1 WHERE id > 3")

    report = verify(log)

    assert not report.ok
    assert report.first_bad_id == 3


def test_a_head_that_disagrees_with_the_last_row_is_detected_at_that_row(log: AuditLog, engine: Engine) -> None:
    execute(engine, "UPDATE audit_head SET last_hash = :h WHERE id = 1", h="e" * 64)

    report = verify(log)

    assert not report.ok
    assert report.first_bad_id == 5


def test_an_event_forged_after_the_head_is_detected_at_that_event(log: AuditLog, engine: Engine) -> None:
    # The forger knows the algorithm and links the new row correctly, but cannot move the head
    # without it showing: the head still says 5.
    last = list(log.events())[-1]
    forged = dataclasses.replace(last, id=6, code=None, detail={"note": "all fine"}, prev_hash=last.hash)
    forged = dataclasses.replace(forged, hash=chain_hash(last.hash, forged.body()))
    execute(
        engine,
        "INSERT INTO audit_events (id, ts, event_type, run_id, user_name, workspace, tool_name, args_hash, code,"
        " detail, prev_hash, hash) VALUES (:id, :ts, :event_type, :run_id, :user, :workspace, :tool_name,"
        " :args_hash, :code, :detail, :prev_hash, :hash)",
        **{**forged.to_json(), "detail": json.dumps(forged.detail)},
    )

    report = verify(log)

    assert not report.ok
    assert report.first_bad_id == 6
    assert report.checked == 6


def test_a_head_moved_back_is_detected(log: AuditLog, engine: Engine) -> None:
    third = list(log.events())[2]
    execute(engine, "UPDATE audit_head SET last_id = 3, last_hash = :h WHERE id = 1", h=third.hash)

    report = verify(log)

    assert not report.ok
    assert report.first_bad_id == 4


def test_a_tampered_head_of_an_empty_log_is_detected(engine: Engine, clock: FakeClock) -> None:
    execute(engine, "UPDATE audit_head SET last_hash = :h WHERE id = 1", h="e" * 64)

    report = verify(AuditLog(engine, clock))

    assert not report.ok
    assert report.first_bad_id == 1


def test_appending_after_a_truncation_does_not_heal_the_chain(log: AuditLog, engine: Engine) -> None:
    execute(engine, "DELETE FROM audit_events WHERE id = 5")

    log.append(EventDraft(EventType.TOOL_FINISHED, run_id="r3"))

    report = verify(log)
    assert not report.ok
    assert report.first_bad_id == 5


def test_verifying_from_a_verified_point_checks_what_came_after(log: AuditLog, engine: Engine) -> None:
    """The web console's incremental check: from a point verified before, the events appended since."""
    report, point = log.verify_after(GENESIS)
    assert report == ChainReport(ok=True, checked=len(DRAFTS)) and point == log.head()
    log.append(*(dataclasses.replace(d, run_id=f"{d.run_id}-again") for d in DRAFTS))  # r1 and r2 have their ends
    assert log.verify_after(point) == (ChainReport(ok=True, checked=2 * len(DRAFTS)), log.head())
    assert log.verify_after(log.head()) == (ChainReport(ok=True, checked=2 * len(DRAFTS)), log.head())
    # A new event edited: found from the point. An old one: only a check from the start finds it.
    execute(engine, "UPDATE audit_events SET user_name = 'mallory' WHERE id = :id", id=len(DRAFTS) + 1)
    assert log.verify_after(point)[0] == ChainReport(
        False, len(DRAFTS), len(DRAFTS) + 1, "hash does not match the event's content"
    )
    execute(engine, "UPDATE audit_events SET user_name = 'alice' WHERE id = :id", id=len(DRAFTS) + 1)
    execute(engine, "UPDATE audit_events SET code = 1 WHERE id = 1")
    assert log.verify_after(point)[0].ok
    assert log.verify_after(GENESIS)[0] == ChainReport(False, 0, 1, "hash does not match the event's content")
    # A point beyond the head (the tail was cut since): not ok.
    assert not log.verify_after(ChainHead(10 * len(DRAFTS), GENESIS_HASH))[0].ok


def _trail(engine: Engine, run_id: str) -> list[str]:
    with engine.connect() as connection:
        rows = connection.execute(
            text("SELECT event_type FROM audit_events WHERE run_id = :r ORDER BY id"), {"r": run_id}
        ).all()
    return [row.event_type for row in rows]


def _question_closed(run_id: str) -> list[EventDraft]:
    """What a sweep writes for a consent question it closes as abandoned: the decision and the POLICY_BLOCKED."""
    decided = EventDraft(
        EventType.PERMISSION_DECISION,
        run_id=run_id,
        user="alice",
        workspace="default",
        tool_name="run_pytest",
        detail={"decision": "DENY_ONCE", "origin": "no_answer"},
    )
    blocked = dataclasses.replace(
        decided, event_type=EventType.POLICY_BLOCKED, code=-32008, detail={"status": "abandoned"}
    )
    return [decided, blocked]


def test_a_call_gets_one_decision_and_one_end_whoever_writes_them(engine: Engine, clock: FakeClock) -> None:
    """A gateway whose question another gateway closed (its lease having run out) wrote
    a second decision and a second POLICY_BLOCKED. The store writes only the first of each kind."""
    audit = AuditLog(engine, clock)
    audit.append(EventDraft(EventType.MCP_TOOL_CALL, run_id="q1", user="alice", tool_name="run_pytest"))
    assert len(audit.append(*_question_closed("q1"))) == 2  # the sweep's closure
    head = audit.head()
    # The live gateway, later: its decision alone, its POLICY_BLOCKED alone, both together, a TOOL_FINISHED.
    late = _question_closed("q1")
    finished = EventDraft(EventType.TOOL_FINISHED, run_id="q1", detail={"status": "error"})
    for drafts in ([late[0]], [late[1]], late, [finished]):
        assert audit.append(*drafts) == []
    assert audit.head() == head
    assert _trail(engine, "q1") == ["MCP_TOOL_CALL", "mcp.permission.decision", "POLICY_BLOCKED"]
    assert verify(audit).ok


def test_an_append_with_a_second_end_writes_nothing_of_itself(engine: Engine, clock: FakeClock) -> None:
    """Variants: the refused append's other events (and another call's in it) are not written either: an
    append is all or nothing; calls without a run id (CLI events) and other calls are not held back."""
    audit = AuditLog(engine, clock)
    audit.append(*_question_closed("q1"))
    mixed = [EventDraft(EventType.MCP_TOOL_CALL, run_id="q2"), *_question_closed("q1")]
    assert audit.append(*mixed) == []
    assert _trail(engine, "q2") == []
    assert len(audit.append(*_question_closed("q2"))) == 2
    cli = EventDraft(EventType.PERMISSION_DECISION, detail={"decision": "ALLOW_ALWAYS"})
    assert len(audit.append(cli)) == 1 and len(audit.append(cli)) == 1
    assert verify(audit).ok


def test_a_call_gets_one_change_review_decision_besides_its_decision(engine: Engine, clock: FakeClock) -> None:
    """Decision 80: the decision on a run's change set (`detail.about: change_set`) is its own kind, at most one;
    the same words inside a value of another decision's detail are not that key (both engines agree)."""
    audit = AuditLog(engine, clock)
    decided = EventDraft(EventType.PERMISSION_DECISION, run_id="q1", detail={"decision": "ALLOW_ONCE"})
    reviewed = dataclasses.replace(decided, detail={"decision": "ALLOW_ONCE", "about": "change_set"})
    assert len(audit.append(decided)) == 1
    assert len(audit.append(reviewed)) == 1
    assert audit.append(dataclasses.replace(reviewed, detail={"decision": "DENY_ONCE", "about": "change_set"})) == []
    lookalike = dataclasses.replace(decided, run_id="q2", detail={"decided_by": '"about":"change_set"'})
    assert len(audit.append(lookalike)) == 1
    assert audit.append(dataclasses.replace(decided, run_id="q2")) == [], "the look-alike was the call's decision"
    assert len(audit.append(dataclasses.replace(reviewed, run_id="q2"))) == 1
    assert _trail(engine, "q1") == ["mcp.permission.decision", "mcp.permission.decision"]
    assert verify(audit).ok
