"""Tables, engine set-up and migrations (docs/architecture.md, "Database"): the only module with DDL.

The same code runs on SQLite and PostgreSQL. Writers are serialised the portable way:
SQLite transactions start with BEGIN IMMEDIATE (one writer at a time, no upgrade
deadlocks), and on PostgreSQL the few read-then-write paths lock a row first
(`audit_head` for the hash chain, the user's row for the budget).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import (
    BigInteger,
    Boolean,
    Double,
    Engine,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    Text,
    create_engine,
    event,
    inspect,
    make_url,
    text,
)
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError, DisconnectionError, SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

if TYPE_CHECKING:
    from alembic.config import Config

from gateway.db.file_guard import guard_file
from gateway.errors import ConfigError

GENESIS_HASH = "0" * 64


class Base(DeclarativeBase):
    pass


class User(Base):
    __tablename__ = "users"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[str] = mapped_column(String(64))
    disabled: Mapped[bool] = mapped_column(Boolean, default=False)
    password_hash: Mapped[str | None] = mapped_column(String(255), nullable=True)
    created_at: Mapped[float] = mapped_column(Double)


class UserWorkspace(Base):
    __tablename__ = "user_workspaces"
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), primary_key=True)
    workspace: Mapped[str] = mapped_column(String(64), primary_key=True)


class Token(Base):
    """Issued tokens by `jti`; a revoked one has `revoked_at`. The token itself is never stored."""

    __tablename__ = "tokens"
    jti: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_name: Mapped[str | None] = mapped_column(String(64), nullable=True)
    issued_at: Mapped[float | None] = mapped_column(Double, nullable=True)
    expires_at: Mapped[float | None] = mapped_column(Double, nullable=True)
    revoked_at: Mapped[float | None] = mapped_column(Double, nullable=True)


class AuditEventRow(Base):
    __tablename__ = "audit_events"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    ts: Mapped[str] = mapped_column(String(32))
    event_type: Mapped[str] = mapped_column(String(64))
    run_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    user_name: Mapped[str | None] = mapped_column(String(64), nullable=True)
    workspace: Mapped[str | None] = mapped_column(String(64), nullable=True)
    tool_name: Mapped[str | None] = mapped_column(String(128), nullable=True)
    args_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    detail: Mapped[str] = mapped_column(Text)
    prev_hash: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64))
    __table_args__ = (Index("ix_audit_events_run_id", "run_id"), Index("ix_audit_events_ts", "ts"))


class AuditHead(Base):
    """One row: the last event's id and hash. Locked to append, compared to detect truncation."""

    __tablename__ = "audit_head"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    last_id: Mapped[int] = mapped_column(BigInteger)
    last_hash: Mapped[str] = mapped_column(String(64))


class BudgetCharge(Base):
    __tablename__ = "budget_charges"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    user_name: Mapped[str] = mapped_column(String(64))
    ts: Mapped[float] = mapped_column(Double)
    elapsed_ms: Mapped[int] = mapped_column(BigInteger, default=0)
    run_id: Mapped[str] = mapped_column(String(64))
    __table_args__ = (Index("ix_budget_charges_user_ts", "user_name", "ts"),)


class Run(Base):
    __tablename__ = "runs"
    run_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_name: Mapped[str] = mapped_column(String(64))
    workspace: Mapped[str] = mapped_column(String(64))
    tool_name: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[float] = mapped_column(Double)
    status: Mapped[str] = mapped_column(String(32))
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    deadline: Mapped[float | None] = mapped_column(Double, nullable=True)
    """When every process of the run is dead for sure (its time limit plus the watchdog's grace)."""
    session_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    """The gateway session running it (`gateway_sessions`); NULL for runs recorded before migration 0006."""
    __table_args__ = (
        Index("ix_runs_workspace", "workspace", "created_at"),
        Index("ix_runs_status_deadline", "status", "deadline"),
    )


class ConsentGrant(Base):
    """A stored decision (docs/consent.md): ALLOW or DENY for (user, workspace, server, tool[, args_hash]).

    `args_hash` NULL covers any arguments. A grant applies only to the tool `fingerprint` it was
    made for, until `expires_at` (NULL: no expiry) and unless `revoked_at`. `channel` is who made
    it (`approver`, `elicitation`, `cli`; NULL: unknown, read as in-band); `arguments` (canonical
    JSON) is what a Deny made for particular arguments covers (gateway/consent/grant_scope.py).
    """

    __tablename__ = "consent_grants"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    user_name: Mapped[str] = mapped_column(String(64))
    workspace: Mapped[str] = mapped_column(String(64))
    server_id: Mapped[str] = mapped_column(String(128))
    tool_name: Mapped[str] = mapped_column(String(128))
    args_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    decision: Mapped[str] = mapped_column(String(8))
    fingerprint: Mapped[str] = mapped_column(String(64))
    granted_at: Mapped[float] = mapped_column(Double)
    expires_at: Mapped[float | None] = mapped_column(Double, nullable=True)
    granted_by: Mapped[str] = mapped_column(String(128))
    revoked_at: Mapped[float | None] = mapped_column(Double, nullable=True)
    channel: Mapped[str | None] = mapped_column(String(16), nullable=True)
    arguments: Mapped[str | None] = mapped_column(Text, nullable=True)
    __table_args__ = (Index("ix_consent_grants_key", "user_name", "workspace", "server_id", "tool_name"),)


class ConsentRequestRow(Base):
    """A question waiting for `mcp-gateway approvals`; decided at most once (a conditional UPDATE)."""

    __tablename__ = "consent_requests"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[float] = mapped_column(Double)
    expires_at: Mapped[float] = mapped_column(Double)
    session_id: Mapped[str] = mapped_column(String(64))
    user_name: Mapped[str] = mapped_column(String(64))
    workspace: Mapped[str] = mapped_column(String(64))
    server_id: Mapped[str] = mapped_column(String(128))
    tool_name: Mapped[str] = mapped_column(String(128))
    args_hash: Mapped[str] = mapped_column(String(64))
    args_preview: Mapped[str] = mapped_column(Text)
    preview: Mapped[str | None] = mapped_column(Text, nullable=True)
    risk_tier: Mapped[str] = mapped_column(String(8))
    destructive: Mapped[bool] = mapped_column(Boolean)
    status: Mapped[str] = mapped_column(String(16))
    decision: Mapped[str | None] = mapped_column(String(16), nullable=True)
    decided_by: Mapped[str | None] = mapped_column(String(128), nullable=True)
    decided_at: Mapped[float | None] = mapped_column(Double, nullable=True)
    choices: Mapped[str | None] = mapped_column(String(128), nullable=True)
    """The decisions offered, comma-separated (the policy's consent.channels.approver); NULL: by `destructive`."""
    kind: Mapped[str] = mapped_column(String(16), server_default="call")
    """`call` (may the call run) or `change_review` (may its run's changes apply: decision 80)."""
    run_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    """A change review's run (its artifacts hold changes.patch and changes.json); NULL for a call's question."""
    __table_args__ = (Index("ix_consent_requests_status", "status", "created_at"),)


class GatewaySession(Base):
    """A serving gateway process (gateway/liveness.py): where it runs and the lease it renews while alive.

    `session_id` is the id its consent questions and runs carry. It is alive while `alive_until` is
    ahead and `closed_at` is NULL; on the same kernel and pid namespace, also only while its pid is
    the process that started (`pid_started`, the process's start time in clock ticks).
    """

    __tablename__ = "gateway_sessions"
    session_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    boot_id: Mapped[str] = mapped_column(String(64))
    pid_namespace: Mapped[str] = mapped_column(String(64))
    pid: Mapped[int] = mapped_column(Integer)
    pid_started: Mapped[str] = mapped_column(String(32))
    started_at: Mapped[float] = mapped_column(Double)
    alive_until: Mapped[float] = mapped_column(Double)
    closed_at: Mapped[float | None] = mapped_column(Double, nullable=True)


_OPEN_CARD = text("status IN ('pending', 'running', 'reviewing')")


class ToolCall(Base):
    """A tools/call as the web console shows it (gateway/calls.py): written with the call's audit events.

    `status` is pending, running, done, error or cancelled; `arguments` the redacted arguments (canonical
    JSON); `result` the result's content blocks (JSON); `code`, `reason` and `message` a refusal's.
    `last_event_id` is the id of the audit event written in the same transaction as the row's last
    change: it only grows (appends are serialised by `audit_head`), so it is the live view's cursor.
    """

    __tablename__ = "tool_calls"
    run_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[float] = mapped_column(Double)
    updated_at: Mapped[float] = mapped_column(Double)
    user_name: Mapped[str] = mapped_column(String(64))
    workspace: Mapped[str | None] = mapped_column(String(64), nullable=True)
    server_id: Mapped[str] = mapped_column(String(128))
    tool_name: Mapped[str] = mapped_column(String(128))
    arguments: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16))
    code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    reason: Mapped[str | None] = mapped_column(String(64), nullable=True)
    message: Mapped[str | None] = mapped_column(Text, nullable=True)
    result: Mapped[str | None] = mapped_column(Text, nullable=True)
    last_event_id: Mapped[int] = mapped_column(BigInteger)
    session_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    """The gateway session the call ran in (`gateway_sessions`; migration 0010, NULL before it): a card
    left open by a gateway that died is closed by the sweep (gateway/recovery.py)."""
    __table_args__ = (
        Index("ix_tool_calls_last_event", "last_event_id"),
        Index("ix_tool_calls_workspace_event", "workspace", "last_event_id"),
        Index("ix_tool_calls_open", "session_id", postgresql_where=_OPEN_CARD, sqlite_where=_OPEN_CARD),
    )


class CallEnd(Base):
    """What closed a call, once (decision 67): its decision and its terminal event, each at most once.

    `kind` is `decision` (an `mcp.permission.decision`) or `end` (its POLICY_BLOCKED or TOOL_FINISHED);
    `event_id` the audit event that recorded it. The audit append inserts here, under the chain's
    lock, with the events; an append that would record a second one for a call writes nothing
    (gateway/audit.py): a gateway that lost its lease, and whose question another gateway closed,
    cannot give the call a second outcome.
    """

    __tablename__ = "call_ends"
    run_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    event_id: Mapped[int] = mapped_column(BigInteger)


class ToolPin(Base):
    """An upstream tool's pinned definition (gateway/upstreams/pins.py, decision 85; migration 0012).

    `pinned` is the canonical JSON of the definition an ADMIN accepted, or the one first seen, and
    `pinned_sha256` its digest; both NULL only for a tool whose first definition was refused. `seen`
    and `seen_sha256` are the server's latest when it differs from the pinned one (`state` `changed`),
    or only its digest when it could not be pinned (`refused`, `reason` says why). `tool` is the
    server's own name, stored as it came (every display escapes it).
    """

    __tablename__ = "tool_pins"
    upstream: Mapped[str] = mapped_column(String(128), primary_key=True)
    tool: Mapped[str] = mapped_column(String(128), primary_key=True)
    state: Mapped[str] = mapped_column(String(16))
    pinned: Mapped[str | None] = mapped_column(Text, nullable=True)
    pinned_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    seen: Mapped[str | None] = mapped_column(Text, nullable=True)
    seen_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    first_seen_at: Mapped[float] = mapped_column(Double)
    pinned_at: Mapped[float | None] = mapped_column(Double, nullable=True)
    changed_at: Mapped[float | None] = mapped_column(Double, nullable=True)
    accepted_by: Mapped[str | None] = mapped_column(Text, nullable=True)


# The Core tables behind the models: the hot paths use Core statements, not the ORM.
users = cast(Table, User.__table__)
user_workspaces = cast(Table, UserWorkspace.__table__)
tokens = cast(Table, Token.__table__)
audit_events = cast(Table, AuditEventRow.__table__)
audit_head = cast(Table, AuditHead.__table__)
budget_charges = cast(Table, BudgetCharge.__table__)
runs = cast(Table, Run.__table__)
consent_grants = cast(Table, ConsentGrant.__table__)
consent_requests = cast(Table, ConsentRequestRow.__table__)
gateway_sessions = cast(Table, GatewaySession.__table__)
tool_calls = cast(Table, ToolCall.__table__)
call_ends = cast(Table, CallEnd.__table__)
tool_pins = cast(Table, ToolPin.__table__)


SQLITE_SYNC_MODES = ("normal", "full")


def make_engine(url: str) -> Engine:
    """An engine with the per-dialect settings the rest of the code relies on.

    A SQLite URL may end in `?synchronous=full` (default `normal`, see decision 9).
    """
    try:
        parsed = make_url(url)
        sync = "normal"
        if parsed.get_backend_name() == "sqlite":
            sync = str(parsed.query.get("synchronous", "normal")).lower()
            if sync not in SQLITE_SYNC_MODES:
                raise ConfigError("synchronous= in a SQLite URL must be normal or full")
            parsed = parsed.difference_update_query(["synchronous"])
        if parsed.get_backend_name() == "postgresql":
            parsed = with_postgres_bounds(parsed)
        engine = create_engine(parsed)
    except (SQLAlchemyError, ImportError, ValueError) as exc:
        raise ConfigError(f"cannot use database URL ({type(exc).__name__})") from exc
    if engine.dialect.name == "postgresql":
        ping_when_idle(engine)
    if engine.dialect.name == "sqlite":
        # First: the file on disk must stay the one written to, and writable, before any pragma
        # touches it (gateway/db/file_guard.py).
        guard_file(engine)
        event.listen(engine, "connect", partial(_sqlite_on_connect, sync.upper()))
        event.listen(engine, "begin", _sqlite_on_begin)
    return engine


POSTGRES_BOUNDS: Mapping[str, str] = MappingProxyType(
    {
        # libpq: give up connecting after 10 s; notice a dead server or network within about a minute.
        "connect_timeout": "10",
        "keepalives": "1",
        "keepalives_idle": "30",
        "keepalives_interval": "10",
        "keepalives_count": "3",
        # Server side: no wait for a lock, no statement, no idle open transaction lasts without end,
        # so one stuck gateway, migration or psql session cannot freeze every gateway (decision 49).
        "options": "-c lock_timeout=10000 -c statement_timeout=30000 -c idle_in_transaction_session_timeout=60000",
    }
)
"""Connection parameters a PostgreSQL URL gets unless it sets them itself (docs/operations.md)."""


IDLE_PING_S = 1.0
"""A pooled PostgreSQL connection idle this long is pinged before it is used again."""


def ping_when_idle(engine: Engine) -> None:
    """Check a pooled connection that sat idle before handing it out, as `pool_pre_ping` does, but
    not one used within IDLE_PING_S: a busy gateway takes a connection for every transaction, and a
    ping each time was a round trip more on every one of them (decision 62). A server restarted or a
    connection cut while the pool held it idle is found here and replaced; one cut within the last
    second fails its first statement instead (the call fails closed, -32603) and SQLAlchemy
    replaces the pool's connections."""

    def checked_in(_dbapi_connection: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    def checked_out(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        idle_since = record.info.get("idle_since")
        if idle_since is None or time.monotonic() - idle_since < IDLE_PING_S:
            return  # new (just connected), or used a moment ago
        try:
            engine.dialect.do_ping(dbapi_connection)
        except engine.dialect.loaded_dbapi.Error as exc:
            raise DisconnectionError("the pooled connection did not answer a ping") from exc  # the pool replaces it

    event.listen(engine.pool, "checkin", checked_in)
    event.listen(engine.pool, "checkout", checked_out)


def with_postgres_bounds(url: URL) -> URL:
    """`url` with every bound of POSTGRES_BOUNDS it does not set; an `options` it sets is kept whole."""
    missing = {name: value for name, value in POSTGRES_BOUNDS.items() if name not in url.query}
    return url.update_query_dict(missing)


def reader(engine: Engine) -> Engine:
    """The same engine for read-only work: on SQLite its transactions take no write lock."""
    return engine.execution_options(read_only=True)


@contextmanager
def autocommit_cursor(engine: Engine) -> Iterator[Any]:
    """PostgreSQL: a psycopg cursor (rows as named tuples) on one of the pool's connections, in
    autocommit, for the statements every call runs (its authentication, its audit appends): each is
    its own transaction and one round trip. SQLAlchemy's Connection around a pooled connection cost
    more client CPU than the statement itself (decision 62); the pool, its idle ping and the bounds
    of POSTGRES_BOUNDS are the same. A driver error, connecting included, comes out as SQLAlchemy's
    DBAPIError, as from any other statement (so `storage_errors` turns it into a refusal); a broken
    connection is dropped from the pool."""
    from psycopg.rows import namedtuple_row  # noqa: PLC0415  (PostgreSQL only: SQLite users never load it)

    dbapi_error = engine.dialect.loaded_dbapi.Error
    try:
        fairy = engine.raw_connection()
    except dbapi_error as exc:
        # The pool connects through the driver alone: a server that is down or refuses us comes out
        # as psycopg's own error, where `Connection` would have wrapped it (then `database_unavailable`).
        raise DBAPIError.instance(None, None, exc, dbapi_error, connection_invalidated=True) from exc
    raw = cast(Any, fairy.driver_connection)  # a psycopg.Connection: the dialect is postgresql+psycopg
    try:
        raw.autocommit = True
        with raw.cursor(row_factory=namedtuple_row) as cursor:
            yield cursor
    except dbapi_error as exc:
        broken = bool(raw.closed) or engine.dialect.is_disconnect(exc, fairy.dbapi_connection, None)
        if broken:
            fairy.invalidate(exc)
        raise DBAPIError.instance(None, None, exc, dbapi_error, connection_invalidated=broken) from exc
    finally:
        try:
            if not raw.closed:
                raw.autocommit = False  # refused by a connection left in a state no statement can use
        except dbapi_error as exc:
            fairy.invalidate(exc)
        finally:
            fairy.close()  # back to the pool, or closed when invalidated: never left checked out


def separate_engine(engine: Engine) -> Engine:
    """Another engine on `engine`'s database, with a pool of its own: for work that must not wait for a
    connection the calls hold (the lease, gateway/liveness.py). A SQLite URL's `synchronous=` is not
    carried over: the default (normal) applies."""
    return make_engine(engine.url.render_as_string(hide_password=False))


def on_postgres(engine: Engine) -> bool:
    return engine.dialect.name == "postgresql"


def single_reads(engine: Engine) -> Engine:
    """`reader` for work that reads with one statement at a time, each on its own snapshot (a
    call's authentication, a run's record). On PostgreSQL in autocommit: no BEGIN and no ROLLBACK,
    two of the three round trips of a one-statement read. Not for a server-side cursor (yield_per),
    which lives in a transaction."""
    if on_postgres(engine):
        return engine.execution_options(isolation_level="AUTOCOMMIT")
    return reader(engine)


def _sqlite_on_connect(synchronous: str, dbapi_connection: Any, _record: Any) -> None:
    # Let SQLAlchemy's "begin" event issue the BEGIN instead of pysqlite's own.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA busy_timeout = 10000")
    cursor.execute("PRAGMA journal_mode = WAL")
    cursor.execute(f"PRAGMA synchronous = {synchronous}")
    cursor.execute("PRAGMA foreign_keys = ON")
    cursor.close()


def _sqlite_on_begin(connection: Any) -> None:
    # Writers take the lock up front (no upgrade deadlock between two gateways); readers in
    # WAL mode read a snapshot and never block a writer (a long `audit export` included).
    read_only = connection.get_execution_options().get("read_only", False)
    connection.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


SCHEMA_HEAD = "0012"
"""The newest migration's revision; tests/gateway/test_migrations.py holds it to Alembic's head."""


def _alembic_config(engine: Engine) -> Config:
    # Alembic (and the Mako and Pygments it brings) loads only for `init` and the migrations
    # themselves: `serve` and every other command start without it (decision 48).
    from alembic.config import Config  # noqa: PLC0415

    config = Config()
    config.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    config.attributes["engine"] = engine
    return config


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest migration (idempotent)."""
    from alembic import command  # noqa: PLC0415

    command.upgrade(_alembic_config(engine), "head")


def schema_is_current(engine: Engine) -> bool:
    """Whether the database stands at SCHEMA_HEAD: Alembic's version table read with plain SQL."""
    with engine.connect() as connection:
        if not inspect(connection).has_table("alembic_version"):
            return False
        current = connection.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    return current == [SCHEMA_HEAD]
