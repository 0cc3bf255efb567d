"""The consent questions' store: bounded, purged, and storing only what a
column holds, on real SQLite and PostgreSQL databases (`engine`, tests/gateway/conftest.py)."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest
from sqlalchemy import Engine, func, select

from gateway import db
from gateway.audit import AuditLog, EventDraft, EventType, verify_chain
from gateway.clock import SystemClock
from gateway.consent.store import (
    MAX_OPEN_QUESTIONS,
    ConsentStore,
    Grant,
    GrantDecision,
    PendingRequest,
    QuestionStatus,
    check_open_questions,
    is_question_id,
)
from gateway.errors import ConsentDeniedError
from gateway.users import UserStore
from gateway.visible import storable, visible
from tests.pg_cluster import on_postgres_only

T0 = 1_900_000_000.0
TIMEOUT_S = 300.0


def question(qid: str, user: str = "alice", at: float = T0, **fields: Any) -> PendingRequest:
    base = PendingRequest(
        id=qid,
        created_at=at,
        expires_at=at + TIMEOUT_S,
        session_id="s1",
        user=user,
        workspace="default",
        server_id="mcp-write-gateway",
        tool_name="run_pytest",
        args_hash="0" * 64,
        args_preview='test_path: "tests"',
        risk_tier="medium",
        destructive=False,
    )
    return dataclasses.replace(base, **fields)


def with_users(engine: Engine, *names: str) -> ConsentStore:
    users = UserStore(engine, SystemClock())
    for name in names:
        users.add(name, "USER", ("default",))
    return ConsentStore(engine)


def count_rows(engine: Engine, **where: str) -> int:
    r = db.consent_requests
    query = select(func.count()).select_from(r)
    for column, value in where.items():
        query = query.where(r.c[column] == value)
    with engine.connect() as connection:
        return int(connection.execute(query).scalar() or 0)


# --- pure ---------------------------------------------------------------------------------------------


def test_storable_escapes_only_what_no_column_holds() -> None:
    assert storable("a\x00b") == "a\\u0000b"
    assert storable("x\ud800y") == "x\\ud800y"
    kept = "tab\there, new\nline, \u202e bidi, 日本, \U0001f600"
    assert storable(kept) == kept, "everything else is the channel's to escape (`visible`)"
    assert storable(storable("\x00")) == storable("\x00")
    assert storable("\x00") == visible("\x00"), "the same escape the person is shown"


@pytest.mark.parametrize(
    ("text_", "ok"),
    [("0" * 32, True), ("x" * 64, True), ("x" * 65, False), ("", False), ("ab\x00", False), ("\udc80", False)],
)
def test_is_question_id(text_: str, ok: bool) -> None:
    assert is_question_id(text_) is ok


@pytest.mark.parametrize(("open_count", "refused"), [(0, False), (15, False), (16, True), (40, True)])
def test_check_open_questions_at_the_cap(open_count: int, refused: bool) -> None:
    if not refused:
        check_open_questions(open_count, 16, T0 + 10, T0)
        return
    with pytest.raises(ConsentDeniedError) as caught:
        check_open_questions(open_count, 16, T0 + 9.2, T0)
    assert caught.value.code == -32008 and caught.value.reason == "consent_questions_limit"
    assert caught.value.data == {"retry_after_s": 10}
    assert "answer them or let them expire" in caught.value.public_message()


def test_retry_after_is_never_past_a_questions_lifetime() -> None:
    # A question another call stored while this one waited for the lock expires 300.4 s after `now`:
    # still at most consent.timeout_s from when it could be answered.
    with pytest.raises(ConsentDeniedError) as caught:
        check_open_questions(16, 16, T0 + 300.4, T0, lifetime_s=300)
    assert caught.value.data == {"retry_after_s": 300}


# --- the cap, on the database -------------------------------------------------------------------------


def test_the_cap_counts_open_questions_of_the_user_only(engine: Engine) -> None:
    store = with_users(engine, "alice", "bob")
    for n in range(MAX_OPEN_QUESTIONS):
        store.insert_request(
            question(f"a{n}"), status=QuestionStatus.AWAITING_CLIENT if n % 2 else QuestionStatus.PENDING
        )
    with pytest.raises(ConsentDeniedError):
        store.insert_request(question("over"))
    store.insert_request(question("b0", user="bob"))
    assert store.decide("a0", "DENY_ONCE", "approvals:x", T0 + 1)
    store.insert_request(question("a-after-decision", at=T0 + 1))
    with pytest.raises(ConsentDeniedError):
        store.insert_request(question("over2", at=T0 + 1))
    later = T0 + TIMEOUT_S  # every one of alice's questions has expired by now, closed or not
    store.insert_request(question("a-after-expiry", at=later))
    assert count_rows(engine, user_name="alice") == MAX_OPEN_QUESTIONS + 2


def race_inserts(engine: Engine, attempts: int) -> tuple[int, int]:
    store = ConsentStore(engine)
    barrier = threading.Barrier(attempts)
    outcomes: list[bool] = []

    def insert(n: int) -> None:
        own = ConsentStore(engine)  # one store per gateway, one database
        barrier.wait()
        try:
            own.insert_request(question(f"race{n}"), status=QuestionStatus.AWAITING_CLIENT)
            outcomes.append(True)
        except ConsentDeniedError:
            outcomes.append(False)

    threads = [threading.Thread(target=insert, args=(n,)) for n in range(attempts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    del store
    return outcomes.count(True), outcomes.count(False)


@pytest.mark.parametrize("decision", list(GrantDecision))
def test_a_grant_is_stored_as_allow_or_deny_and_read_back_as_the_enum(engine: Engine, decision: GrantDecision) -> None:
    store = ConsentStore(engine)
    grant = Grant(0, "alice", "default", "mcp-write-gateway", "run_pytest", None, decision, "f" * 64, T0, None, "test")
    grant_id = store.insert_grant(grant)
    with engine.connect() as connection:
        stored = connection.execute(select(db.consent_grants.c.decision)).scalar_one()
    assert type(stored) is str and stored == decision.value, "the column holds the strings it always held"
    (read,) = store.fetch_grants("alice", "default", "mcp-write-gateway", "run_pytest")
    assert read == dataclasses.replace(grant, id=grant_id) and read.decision is decision


def test_racing_inserts_stop_exactly_at_the_cap(engine: Engine) -> None:
    with_users(engine, "alice")
    assert race_inserts(engine, 3 * MAX_OPEN_QUESTIONS) == (MAX_OPEN_QUESTIONS, 2 * MAX_OPEN_QUESTIONS)
    assert count_rows(engine) == MAX_OPEN_QUESTIONS


# --- NUL: what PostgreSQL's text columns cannot hold --------------------------------------------------


@on_postgres_only
def test_every_text_of_a_question_is_stored_without_nul_on_postgres(engine: Engine) -> None:
    store = with_users(engine, "alice")
    store.insert_request(
        question("q1", args_preview="command: a\x00b", preview="$ a\x00b\n+\ud800", tool_name="Ba\x00sh"),
        status=QuestionStatus.AWAITING_CLIENT,
    )
    assert store.decide("q1", "DENY_ONCE", "client:ali\x00ce", T0 + 1, waiting=QuestionStatus.AWAITING_CLIENT)
    stored = store.fetch_request("q1")
    assert stored is not None
    assert (stored.args_preview, stored.preview) == ("command: a\\u0000b", "$ a\\u0000b\n+\\ud800")
    assert (stored.tool_name, stored.decided_by) == ("Ba\\u0000sh", "client:ali\\u0000ce")
    # An id no question can have (a client's forged request_state) finds nothing, and fails nothing.
    assert store.fetch_request("q1\x00") is None
    assert store.decide("q1\x00", "ALLOW_ONCE", "x", T0 + 2) is False
    assert store.expire("\x00", T0 + 2) is False


# --- the purge ------------------------------------------------------------------------------------------


def test_purge_deletes_questions_closed_or_expired_long_ago_and_leaves_the_audit_log(engine: Engine) -> None:
    store = with_users(engine, "alice", "bob")
    audit = AuditLog(engine, SystemClock())
    day = 86400.0
    store.insert_request(question("decided-old", at=T0))
    store.decide("decided-old", "ALLOW_ONCE", "approvals:x", T0 + 5)
    store.insert_request(question("expired-old", at=T0))
    store.expire("expired-old", T0 + TIMEOUT_S)
    store.insert_request(question("abandoned-old", at=T0), status=QuestionStatus.AWAITING_CLIENT)  # never answered
    store.insert_request(question("decided-recent", at=T0 + day))
    store.decide("decided-recent", "DENY_ONCE", "approvals:x", T0 + day + 5)
    store.insert_request(question("open", user="bob", at=T0 + day + 500))
    for qid in ("decided-old", "expired-old", "abandoned-old", "decided-recent", "open"):
        audit.append(EventDraft(EventType.PERMISSION_DECISION, run_id=qid, user="alice", detail={"q": qid}))
    events_before = [e.hash for e in audit.events()]

    now = T0 + day + 600  # the old ones closed or expired (T0 + 300) more than a day ago
    assert store.purge_expired(now, keep_s=day) == 3
    assert {r.id for r in store.fetch_pending(now)} == {"open"}
    assert store.fetch_request("decided-recent") is not None, "decided less than keep_s ago: kept"
    for gone in ("decided-old", "expired-old", "abandoned-old"):
        assert store.fetch_request(gone) is None
    assert store.purge_expired(now, keep_s=day) == 0, "idempotent"
    assert store.purge_expired(now, keep_s=0) == 1, "keep_s 0: every closed question, not the open one"
    assert store.fetch_request("open") is not None
    assert [e.hash for e in audit.events()] == events_before
    assert verify_chain(audit.events(), audit.head()).ok
    with pytest.raises(ValueError, match="keep_s"):
        store.purge_expired(now, keep_s=-1)
