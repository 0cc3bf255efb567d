"""Engine settings per dialect (gateway/db/__init__.py): PostgreSQL connections carry bounds on every wait (decision 49),
and a pooled connection cut while idle is replaced before use (decision 62)."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.pool import NullPool

from gateway import db
from gateway.audit import AuditLog, EventDraft, EventType
from gateway.db import POSTGRES_BOUNDS, make_engine, migrate
from gateway.errors import InternalError
from tests.fakes import FakeClock
from tests.pg_cluster import on_postgres_only


def connect_kwargs(url: str) -> dict[str, object]:
    engine = make_engine(url)  # lazy: nothing connects here, this shows what libpq would be given
    return dict(engine.dialect.create_connect_args(engine.url)[1])


def test_a_postgresql_url_gets_timeouts_and_keepalives() -> None:
    given = connect_kwargs("postgresql+psycopg://gw:secret@127.0.0.1:5432/gateway")
    for name, value in POSTGRES_BOUNDS.items():
        assert given[name] == value
    options = str(given["options"])
    for setting in ("lock_timeout", "statement_timeout", "idle_in_transaction_session_timeout"):
        assert f"-c {setting}=" in options


@pytest.mark.parametrize(
    ("query", "kept"),
    [
        ("options=-c%20statement_timeout%3D5000", {"options": "-c statement_timeout=5000"}),
        ("connect_timeout=3&keepalives_idle=5", {"connect_timeout": "3", "keepalives_idle": "5"}),
    ],
)
def test_what_the_url_sets_itself_wins(query: str, kept: dict[str, str]) -> None:
    given = connect_kwargs(f"postgresql+psycopg://gw@127.0.0.1/gateway?{query}")
    for name, value in kept.items():
        assert given[name] == value
    assert given["keepalives"] == "1"


def test_sqlite_urls_are_left_alone() -> None:
    given = connect_kwargs("sqlite:///:memory:")
    assert not set(POSTGRES_BOUNDS) & set(given)


# --- a pooled PostgreSQL connection cut under the gateway (ping_when_idle) ---------------------------


def _cut_the_pool(engine: Engine) -> None:
    """Terminate, from another connection, every server process serving `engine`'s database but that one."""
    killer = create_engine(engine.url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        with killer.connect() as connection:
            cut = connection.execute(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            ).scalar_one()
    finally:
        killer.dispose()
    assert cut >= 1, "the engine's pooled connection was not there to cut"


def _append(engine: Engine) -> None:
    AuditLog(engine, FakeClock()).append(EventDraft(EventType.USER_ADDED, user="alice"))


@on_postgres_only
def test_a_connection_cut_while_idle_is_replaced_before_use(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = make_engine(db_url)
    migrate(engine)
    try:
        _append(engine)  # one pooled connection, now idle
        _cut_the_pool(engine)
        monkeypatch.setattr(db, "IDLE_PING_S", 0.0)  # it has been idle "long enough": pinged, found dead, replaced
        _append(engine)
        assert AuditLog(engine, FakeClock()).verify().checked == 2
    finally:
        engine.dispose()


@on_postgres_only
def test_a_connection_used_a_moment_ago_is_not_pinged(db_url: str) -> None:
    """The price of no ping per transaction: a connection cut within IDLE_PING_S of its last use fails
    its next statement (the call fails closed); the pool is then replaced and the next one works."""
    engine = make_engine(db_url)
    migrate(engine)
    try:
        _append(engine)
        _cut_the_pool(engine)
        with pytest.raises(InternalError) as caught:
            _append(engine)
        assert caught.value.reason == "audit_unavailable"
        _append(engine)
        assert AuditLog(engine, FakeClock()).verify().checked == 2
    finally:
        engine.dispose()
