"""The Alembic migrations build exactly the tables the code uses, and an upgrade keeps what is stored:
on SQLite and on PostgreSQL (`empty_db_url`, tests/pg_cluster.py), each test on an empty database."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, insert, inspect, select, text

from gateway import db
from gateway.audit import AuditLog, ChainReport, EventDraft, EventType
from gateway.calls import CardStatus, Opened
from tests.fakes import FakeClock
from tests.pg_cluster import drop_database, new_database, on_postgres_only, suite_server


@pytest.fixture
def unmigrated(empty_db_url: str) -> Iterator[Engine]:
    """An engine on an empty database: no table, no Alembic version."""
    engine = db.make_engine(empty_db_url)
    yield engine
    engine.dispose()


def test_the_migrations_build_the_models_tables(unmigrated: Engine) -> None:
    engine = unmigrated
    db.migrate(engine)
    with engine.connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), db.metadata)
    assert differences == []
    assert db.schema_is_current(engine)


def test_upgrading_from_0002_keeps_open_questions(unmigrated: Engine) -> None:
    engine = unmigrated
    command.upgrade(db._alembic_config(engine), "0002")
    assert "preview" not in {c["name"] for c in inspect(engine).get_columns("consent_requests")}
    row = {
        "id": "q1", "created_at": 1.0, "expires_at": 2.0, "session_id": "s", "user_name": "alice",
        "workspace": "default", "server_id": "mcp-write-gateway", "tool_name": "run_pytest", "args_hash": "a" * 64,
        "args_preview": "{}", "risk_tier": "medium", "destructive": False, "status": "pending",
    }  # fmt: skip
    with engine.begin() as connection:
        connection.execute(insert(db.consent_requests).values(**row))
    assert not db.schema_is_current(engine)

    db.migrate(engine)

    with engine.connect() as connection:
        kept = connection.execute(select(db.consent_requests)).one()._mapping
    assert {k: kept[k] for k in row} == row
    assert kept["preview"] is None


def test_upgrading_from_0004_records_each_grants_channel_from_who_made_it(unmigrated: Engine) -> None:
    engine = unmigrated
    command.upgrade(db._alembic_config(engine), "0004")
    common = {
        "user_name": "alice", "workspace": "default", "server_id": "mcp-write-gateway", "tool_name": "run_pytest",
        "args_hash": None, "decision": "ALLOW", "fingerprint": "f" * 64, "granted_at": 1.0, "expires_at": None,
    }  # fmt: skip
    made_by = ["approvals:root@host", "cli:root@host", "elicitation:alice", "someone_else"]
    with engine.begin() as connection:
        for who in made_by:
            connection.execute(insert(db.consent_grants).values(**common, granted_by=who))

    db.migrate(engine)

    with engine.connect() as connection:
        rows = connection.execute(select(db.consent_grants).order_by(db.consent_grants.c.id)).all()
    assert [(r.granted_by, r.channel, r.arguments) for r in rows] == [
        ("approvals:root@host", "approver", None),
        ("cli:root@host", "cli", None),
        ("elicitation:alice", "elicitation", None),
        ("someone_else", None, None),  # unknown: read as in band
    ]


def test_schema_head_is_alembics_head(unmigrated: Engine) -> None:
    """`schema_is_current` compares with db.SCHEMA_HEAD so that serve starts without Alembic: a new
    migration must move it."""
    engine = unmigrated
    assert ScriptDirectory.from_config(db._alembic_config(engine)).get_current_head() == db.SCHEMA_HEAD
    assert not db.schema_is_current(engine), "no version table: not current"


def _rows(engine: Engine) -> dict[str, list[tuple[object, ...]]]:
    with engine.connect() as connection:
        return {t.name: [tuple(r) for r in connection.execute(select(t))] for t in db.metadata.sorted_tables}


@on_postgres_only
def test_a_tests_postgres_database_is_a_copy_of_the_migrated_template(db_url: str) -> None:
    """`db_url` on PostgreSQL is cloned from the process's migrated template (tests/pg_cluster.py): the newest
    schema without a `migrate`, holding what a database migrated for the test would hold, and no more."""
    base = suite_server()
    fresh_url = new_database(base)
    clone, fresh = db.make_engine(db_url), db.make_engine(fresh_url)
    try:
        assert db.schema_is_current(clone)
        db.migrate(fresh)
        assert _rows(clone) == _rows(fresh)
    finally:
        clone.dispose()
        fresh.dispose()
        drop_database(base, fresh_url)


def test_upgrading_from_0005_keeps_runs_with_no_gateway_session(unmigrated: Engine) -> None:
    """0006 adds `gateway_sessions` and `runs.session_id`: a run recorded before it has no session, and is
    closed by its deadline alone, as before (gateway/recovery.py)."""
    engine = unmigrated
    command.upgrade(db._alembic_config(engine), "0005")
    assert not inspect(engine).has_table("gateway_sessions")
    row = {
        "run_id": "r1", "user_name": "alice", "workspace": "default", "tool_name": "run_pytest",
        "created_at": 1.0, "status": "running", "exit_code": None, "deadline": 20.0,
    }  # fmt: skip
    with engine.begin() as connection:
        connection.execute(insert(db.runs).values(**row))

    db.migrate(engine)

    with engine.connect() as connection:
        kept = connection.execute(select(db.runs)).one()._mapping
        assert connection.execute(select(db.gateway_sessions)).all() == []
    assert {k: kept[k] for k in row} == row
    assert kept["session_id"] is None


def test_0007_adds_tool_calls_and_goes_back(tmp_path: Path) -> None:
    """0007 adds the console's `tool_calls` (gateway/calls.py); its downgrade removes exactly that."""
    engine = db.make_engine(f"sqlite:///{tmp_path / 'g.db'}")
    db.migrate(engine)
    assert "tool_calls" in inspect(engine).get_table_names()
    indexes = {i["name"] for i in inspect(engine).get_indexes("tool_calls")}
    assert indexes == {"ix_tool_calls_last_event", "ix_tool_calls_workspace_event", "ix_tool_calls_open"}
    command.downgrade(db._alembic_config(engine), "0006")
    assert "tool_calls" not in inspect(engine).get_table_names()
    db.migrate(engine)
    assert db.schema_is_current(engine)


def test_a_log_written_before_0008_goes_on_after_it_as_one_chain(unmigrated: Engine) -> None:
    """A deployment upgrading to 0008: events appended the old way (the gateway hashing, at 0007) and
    then the new way (on PostgreSQL, `gateway_audit_append` hashing in the server) are one chain that
    verifies; 0008's downgrade takes the function away and the gateway's own append goes on."""
    engine = unmigrated
    config = db._alembic_config(engine)
    command.upgrade(config, "0007")
    # Written at 0007 by the gateway's own append (as every gateway before this migration wrote).
    old_way = AuditLog(engine, FakeClock())
    old_way._on_server = False
    old_way.append(EventDraft(EventType.USER_ADDED, user="alice"), EventDraft(EventType.TOKEN_ISSUED, user="alice"))
    db.migrate(engine)
    log = AuditLog(engine, FakeClock())
    written = log.append(EventDraft(EventType.MCP_TOOL_CALL, run_id="r1", user="alice", tool_name="run_pytest"))
    assert [e.id for e in written] == [3]
    assert log.verify() == ChainReport(True, 3)
    assert _has_append_function(engine) == (engine.dialect.name == "postgresql")
    command.downgrade(config, "0007")
    assert not _has_append_function(engine)
    old_way.append(EventDraft(EventType.CONSENT_REVOKED, user="alice"))
    assert log.verify() == ChainReport(True, 4)


def _has_append_function(engine: Engine) -> bool:
    if engine.dialect.name != "postgresql":
        return False
    with engine.connect() as connection:
        found = connection.execute(text("SELECT count(*) FROM pg_proc WHERE proname = 'gateway_audit_append'"))
        return bool(found.scalar_one())


def test_0009_records_the_first_decision_and_end_of_each_call_already_logged(unmigrated: Engine) -> None:
    """A log from before 0009 may hold a call's doubled decision and end (the bug it
    fixes, decision 67); `call_ends` starts from the first of each, so the rule holds for those calls too."""
    engine = unmigrated
    command.upgrade(db._alembic_config(engine), "0008")
    logged = [
        (1, "r1", "mcp.permission.decision"), (2, "r1", "POLICY_BLOCKED"), (3, "r1", "mcp.permission.decision"),
        (4, "r1", "POLICY_BLOCKED"), (5, "r2", "MCP_TOOL_CALL"), (6, "r2", "TOOL_FINISHED"), (7, None, "USER_ADDED"),
    ]  # fmt: skip
    with engine.begin() as connection:
        connection.execute(
            insert(db.audit_events),
            [
                {"id": i, "ts": "t", "event_type": kind, "run_id": run, "detail": "{}", "prev_hash": "", "hash": ""}
                for i, run, kind in logged
            ],
        )

    db.migrate(engine)

    with engine.connect() as connection:
        ends = {tuple(row) for row in connection.execute(select(db.call_ends))}
    assert ends == {("r1", "decision", 1), ("r1", "end", 2), ("r2", "end", 6)}


def test_0010_records_each_cards_session_on_both_appends_and_goes_back(unmigrated: Engine) -> None:
    """0010 adds `tool_calls.session_id` (decision 69); the card a call opens carries its gateway
    session, through PostgreSQL's server-side append too; the downgrade takes the column away again."""
    engine = unmigrated
    db.migrate(engine)
    log = AuditLog(engine, FakeClock())
    card = Opened(
        "r1", "alice", "default", "mcp-write-gateway", "run_pytest", {}, CardStatus.PENDING, 1.0, session_id="s1"
    )
    log.append(EventDraft(EventType.MCP_TOOL_CALL, run_id="r1", user="alice", tool_name="run_pytest"), along=[card])
    with engine.connect() as connection:
        assert connection.execute(select(db.tool_calls.c.session_id)).scalar_one() == "s1"
    config = db._alembic_config(engine)
    command.downgrade(config, "0009")
    assert "session_id" not in {c["name"] for c in inspect(engine).get_columns("tool_calls")}
    db.migrate(engine)
    assert db.schema_is_current(engine)
    with engine.connect() as connection:
        assert connection.execute(select(db.tool_calls.c.session_id)).scalar_one() is None, "written before 0010"
    assert AuditLog(engine, FakeClock()).verify().ok


def test_0013_adds_open_connections_keeps_the_cards_and_goes_back(unmigrated: Engine) -> None:
    """Decision 102: the open-connection rows are a table of their own, outside the audit log; down drops it."""
    engine = unmigrated
    command.upgrade(db._alembic_config(engine), "0012")
    assert "open_connections" not in inspect(engine).get_table_names()
    AuditLog(engine, FakeClock(1.0)).append(
        EventDraft(EventType.MCP_TOOL_CALL, run_id="r1", user="alice", workspace="default", tool_name="run_pytest"),
        along=[Opened("r1", "alice", "default", "s", "run_pytest", {}, CardStatus.RUNNING, 1.0)],
    )

    db.migrate(engine)

    row = {
        "card_id": "r1", "number": 1, "run_id": "r1", "host": "example.org", "port": 443, "method": "CONNECT",
        "address": "127.0.0.1", "rule": "example.org", "bytes_up": 10, "bytes_down": 2**40, "opened_at": 1.0,
        "updated_at": 2.0,
    }  # fmt: skip
    with engine.begin() as connection:
        connection.execute(insert(db.open_connections).values(**row))
    with engine.connect() as connection:
        assert dict(connection.execute(select(db.open_connections)).one()._mapping) == row
        assert connection.execute(select(db.tool_calls.c.run_id)).scalars().all() == ["r1"]
    command.downgrade(db._alembic_config(engine), "0012")
    assert "open_connections" not in inspect(engine).get_table_names()
    assert "tool_calls" in inspect(engine).get_table_names()
