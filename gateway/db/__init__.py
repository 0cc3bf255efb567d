"""Tables, engine set-up and migrations (docs/architecture.md, "Database"): the only module with DDL.

The same code runs on SQLite and PostgreSQL. Writers are serialised the portable way:
SQLite transactions start with BEGIN IMMEDIATE (one writer at a time, no upgrade
deadlocks), and on PostgreSQL the few read-then-write paths lock a row first
(`audit_head` for the hash chain, the user's row for the budget).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Double,
    Engine,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    event,
    inspect,
    make_url,
    text,
)
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError, DisconnectionError, SQLAlchemyError

if TYPE_CHECKING:
    from alembic.config import Config

from gateway.db.file_guard import guard_file, guard_of
from gateway.errors import ConfigError

GENESIS_HASH = "0" * 64


metadata = MetaData()
"""Every table the gateway uses; the migrations build exactly these (tests/gateway/test_migrations.py)."""


users = Table(
    "users",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(64), unique=True, nullable=False),
    Column("role", String(64), nullable=False),
    Column("disabled", Boolean, default=False, nullable=False),
    Column("password_hash", String(255)),
    Column("created_at", Double, nullable=False),
)


user_workspaces = Table(
    "user_workspaces",
    metadata,
    Column("user_id", Integer, ForeignKey("users.id", ondelete="CASCADE"), primary_key=True),
    Column("workspace", String(64), primary_key=True),
)


# Issued tokens by `jti`; a revoked one has `revoked_at`. The token itself is never stored.
tokens = Table(
    "tokens",
    metadata,
    Column("jti", String(64), primary_key=True),
    Column("user_name", String(64)),
    Column("issued_at", Double),
    Column("expires_at", Double),
    Column("revoked_at", Double),
)


audit_events = Table(
    "audit_events",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=False),
    Column("ts", String(32), nullable=False),
    Column("event_type", String(64), nullable=False),
    Column("run_id", String(64)),
    Column("user_name", String(64)),
    Column("workspace", String(64)),
    Column("tool_name", String(128)),
    Column("args_hash", String(64)),
    Column("code", Integer),
    Column("detail", Text, nullable=False),
    Column("prev_hash", String(64), nullable=False),
    Column("hash", String(64), nullable=False),
    Index("ix_audit_events_run_id", "run_id"),
    Index("ix_audit_events_ts", "ts"),
)


# One row: the last event's id and hash. Locked to append, compared to detect truncation.
audit_head = Table(
    "audit_head",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("last_id", BigInteger, nullable=False),
    Column("last_hash", String(64), nullable=False),
)


budget_charges = Table(
    "budget_charges",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("user_name", String(64), nullable=False),
    Column("ts", Double, nullable=False),
    Column("elapsed_ms", BigInteger, default=0, nullable=False),
    Column("run_id", String(64), nullable=False),
    Index("ix_budget_charges_user_ts", "user_name", "ts"),
)


runs = Table(
    "runs",
    metadata,
    Column("run_id", String(64), primary_key=True),
    Column("user_name", String(64), nullable=False),
    Column("workspace", String(64), nullable=False),
    Column("tool_name", String(128), nullable=False),
    Column("created_at", Double, nullable=False),
    Column("status", String(32), nullable=False),
    Column("exit_code", Integer),
    # When every process of the run is dead for sure (its time limit plus the watchdog's grace).
    Column("deadline", Double),
    # The gateway session running it (`gateway_sessions`); NULL for runs recorded before migration 0006.
    Column("session_id", String(64)),
    Index("ix_runs_workspace", "workspace", "created_at"),
    Index("ix_runs_status_deadline", "status", "deadline"),
)


# A stored decision (docs/consent.md): ALLOW or DENY for (user, workspace, server, tool[, args_hash]).
#
# `args_hash` NULL covers any arguments. A grant applies only to the tool `fingerprint` it was
# made for, until `expires_at` (NULL: no expiry) and unless `revoked_at`. `channel` is who made
# it (`approver`, `elicitation`, `cli`; NULL: unknown, read as in-band); `arguments` (canonical
# JSON) is what a Deny made for particular arguments covers (gateway/consent/grant_scope.py).
consent_grants = Table(
    "consent_grants",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("user_name", String(64), nullable=False),
    Column("workspace", String(64), nullable=False),
    Column("server_id", String(128), nullable=False),
    Column("tool_name", String(128), nullable=False),
    Column("args_hash", String(64)),
    Column("decision", String(8), nullable=False),
    Column("fingerprint", String(64), nullable=False),
    Column("granted_at", Double, nullable=False),
    Column("expires_at", Double),
    Column("granted_by", String(128), nullable=False),
    Column("revoked_at", Double),
    Column("channel", String(16)),
    Column("arguments", Text),
    Index("ix_consent_grants_key", "user_name", "workspace", "server_id", "tool_name"),
)


# A question waiting for `mcp-gateway approvals`; decided at most once (a conditional UPDATE).
consent_requests = Table(
    "consent_requests",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("created_at", Double, nullable=False),
    Column("expires_at", Double, nullable=False),
    Column("session_id", String(64), nullable=False),
    Column("user_name", String(64), nullable=False),
    Column("workspace", String(64), nullable=False),
    Column("server_id", String(128), nullable=False),
    Column("tool_name", String(128), nullable=False),
    Column("args_hash", String(64), nullable=False),
    Column("args_preview", Text, nullable=False),
    Column("preview", Text),
    Column("risk_tier", String(8), nullable=False),
    Column("destructive", Boolean, nullable=False),
    Column("status", String(16), nullable=False),
    Column("decision", String(16)),
    Column("decided_by", String(128)),
    Column("decided_at", Double),
    # The decisions offered, comma-separated (the policy's consent.channels.approver); NULL: by `destructive`.
    Column("choices", String(128)),
    # `call` (may the call run) or `change_review` (may its run's changes apply: decision 80).
    Column("kind", String(16), server_default="call", nullable=False),
    # A change review's run (its artifacts hold changes.patch and changes.json); NULL for a call's question.
    Column("run_id", String(64)),
    Index("ix_consent_requests_status", "status", "created_at"),
)


# A serving gateway process (gateway/liveness.py): where it runs and the lease it renews while alive.
#
# `session_id` is the id its consent questions and runs carry. It is alive while `alive_until` is
# ahead and `closed_at` is NULL; on the same kernel and pid namespace, also only while its pid is
# the process that started (`pid_started`, the process's start time in clock ticks).
gateway_sessions = Table(
    "gateway_sessions",
    metadata,
    Column("session_id", String(64), primary_key=True),
    Column("host", String(255), nullable=False),
    Column("boot_id", String(64), nullable=False),
    Column("pid_namespace", String(64), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("pid_started", String(32), nullable=False),
    Column("started_at", Double, nullable=False),
    Column("alive_until", Double, nullable=False),
    Column("closed_at", Double),
)


_OPEN_CARD = text("status IN ('pending', 'running', 'reviewing')")


# A tools/call as the web console shows it (gateway/calls.py): written with the call's audit events.
#
# `status` is pending, running, done, error or cancelled; `arguments` the redacted arguments (canonical
# JSON); `result` the result's content blocks (JSON); `code`, `reason` and `message` a refusal's.
# `last_event_id` is the id of the audit event written in the same transaction as the row's last
# change: it only grows (appends are serialised by `audit_head`), so it is the live view's cursor.
tool_calls = Table(
    "tool_calls",
    metadata,
    Column("run_id", String(64), primary_key=True),
    Column("kind", String(16), nullable=False),
    Column("created_at", Double, nullable=False),
    Column("updated_at", Double, nullable=False),
    Column("user_name", String(64), nullable=False),
    Column("workspace", String(64)),
    Column("server_id", String(128), nullable=False),
    Column("tool_name", String(128), nullable=False),
    Column("arguments", Text, nullable=False),
    Column("status", String(16), nullable=False),
    Column("code", Integer),
    Column("reason", String(64)),
    Column("message", Text),
    Column("result", Text),
    Column("last_event_id", BigInteger, nullable=False),
    # The gateway session the call ran in (`gateway_sessions`; migration 0010, NULL before it): a card
    # left open by a gateway that died is closed by the sweep (gateway/recovery.py).
    Column("session_id", String(64)),
    Index("ix_tool_calls_last_event", "last_event_id"),
    Index("ix_tool_calls_workspace_event", "workspace", "last_event_id"),
    Index("ix_tool_calls_open", "session_id", postgresql_where=_OPEN_CARD, sqlite_where=_OPEN_CARD),
)


# What closed a call, once (decision 67): its decision and its terminal event, each at most once.
#
# `kind` is `decision` (an `mcp.permission.decision`) or `end` (its POLICY_BLOCKED or TOOL_FINISHED);
# `event_id` the audit event that recorded it. The audit append inserts here, under the chain's
# lock, with the events; an append that would record a second one for a call writes nothing
# (gateway/audit.py): a gateway that lost its lease, and whose question another gateway closed,
# cannot give the call a second outcome.
call_ends = Table(
    "call_ends",
    metadata,
    Column("run_id", String(64), primary_key=True),
    Column("kind", String(16), primary_key=True),
    Column("event_id", BigInteger, nullable=False),
)


# An upstream tool's pinned definition (gateway/upstreams/pins.py, decision 85; migration 0012).
#
# `pinned` is the canonical JSON of the definition an ADMIN accepted, or the one first seen, and
# `pinned_sha256` its digest; both NULL only for a tool whose first definition was refused. `seen`
# and `seen_sha256` are the server's latest when it differs from the pinned one (`state` `changed`),
# or only its digest when it could not be pinned (`refused`, `reason` says why). `tool` is the
# server's own name, stored as it came (every display escapes it).
tool_pins = Table(
    "tool_pins",
    metadata,
    Column("upstream", String(128), primary_key=True),
    Column("tool", String(128), primary_key=True),
    Column("state", String(16), nullable=False),
    Column("pinned", Text),
    Column("pinned_sha256", String(64)),
    Column("seen", Text),
    Column("seen_sha256", String(64)),
    Column("reason", Text),
    Column("first_seen_at", Double, nullable=False),
    Column("pinned_at", Double),
    Column("changed_at", Double),
    Column("accepted_by", Text),
)


# A live run's connections still open through the egress proxy, with their bytes so far (gateway/calls.py,
# decision 102; migration 0013). Keyed by the card they show on and the connection's number in its run; the
# NET_CONNECT's transaction deletes the row. Outside the audit log: the chain holds one event per connection.
open_connections = Table(
    "open_connections",
    metadata,
    Column("card_id", String(64), primary_key=True),
    Column("number", Integer, primary_key=True),
    Column("run_id", String(64), nullable=False),
    Column("host", Text),
    Column("port", Integer),
    Column("method", String(16)),
    Column("address", Text),
    Column("rule", Text),
    Column("bytes_up", BigInteger, nullable=False),
    Column("bytes_down", BigInteger, nullable=False),
    Column("opened_at", Double, nullable=False),
    Column("updated_at", Double, nullable=False),
)


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
    """PostgreSQL: a psycopg cursor on one of the pool's connections, in autocommit, for the statements
    every call runs (its authentication, its audit appends): each is its own transaction and one round
    trip. Its rows are plain tuples: psycopg's named tuples were a tenth of a refused call's database
    thread (decision 92). SQLAlchemy's Connection around a pooled connection cost
    more client CPU than the statement itself (decision 62); the pool, its idle ping and the bounds
    of POSTGRES_BOUNDS are the same. A driver error, connecting included, comes out as SQLAlchemy's
    DBAPIError, as from any other statement (so `storage_errors` turns it into a refusal); a broken
    connection is dropped from the pool."""
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
        with raw.cursor() as cursor:
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


@contextmanager
def sqlite_driver_errors() -> Iterator[None]:
    """sqlite3's own error, raised by a statement run on the driver's connection, as SQLAlchemy's DBAPIError
    (an OperationalError for "database is locked"), as the same statement through SQLAlchemy raises it."""
    try:
        yield
    except sqlite3.Error as exc:
        raise DBAPIError.instance(None, None, exc, sqlite3.Error) from exc


@contextmanager
def sqlite_read_cursor(engine: Engine) -> Iterator[Any]:
    """SQLite: a sqlite3 cursor on one of the pool's connections, for one read statement that every call
    runs (its authentication): no BEGIN, no COMMIT (one statement reads one snapshot by itself) and none
    of SQLAlchemy's per-statement work, which cost 0.15 ms where sqlite3 takes 0.03 (decision 92). The
    file guard checks the file first, as before any transaction (decision 45), and the connection goes
    back to the pool afterwards, as from any `connect()`; a driver error comes out as SQLAlchemy's
    DBAPIError (`sqlite_driver_errors`)."""
    with _guarded_driver(engine) as driver:
        cursor = driver.cursor()
        try:
            yield cursor
        finally:
            cursor.close()


@contextmanager
def sqlite_write_cursor(engine: Engine) -> Iterator[Any]:
    """SQLite: a sqlite3 cursor in a write transaction of its own on one of the pool's connections, committed
    when the block ends and rolled back when it raises: the file guard's checks first (decision 45), then
    BEGIN IMMEDIATE, as `engine.begin()` makes them, without SQLAlchemy's transaction and per-statement work
    (a refused call's whole append and card, decision 100). A driver error comes out as SQLAlchemy's DBAPIError
    (`sqlite_driver_errors`); the connection goes back to the pool afterwards."""
    with _guarded_driver(engine) as driver:
        driver.execute("BEGIN IMMEDIATE")
        committed = False
        cursor = driver.cursor()
        try:
            yield cursor
            driver.commit()
            committed = True
        finally:
            cursor.close()
            if not committed:  # the block raised (or the commit did): nothing of it stays
                driver.rollback()


@contextmanager
def _guarded_driver(engine: Engine) -> Iterator[Any]:
    """The sqlite3 connection of one of the pool's, once the file guard passed it, its errors SQLAlchemy's."""
    with sqlite_driver_errors():
        fairy = engine.raw_connection()
        try:
            guard = guard_of(engine)
            if guard is not None:
                guard.on_begin(fairy)
            yield fairy.driver_connection
        finally:
            fairy.close()


@dataclass(frozen=True, slots=True)
class SqliteStatement:
    """A Core statement compiled once for sqlite3 (named parameters), with its constant binds (`id = 1`): a
    statement run at every call on the driver's cursor (decision 92)."""

    sql: str
    constants: Mapping[str, Any]

    @classmethod
    def of(cls, statement: Any) -> SqliteStatement:
        compiled = statement.compile(dialect=_SQLITE_NAMED)
        return cls(str(compiled), {k: v for k, v in compiled.params.items() if v is not None})

    def bind(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return {**self.constants, **params}


_SQLITE_NAMED = sqlite_dialect.dialect(paramstyle="named")


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
    # On the driver's connection itself: through `exec_driver_sql` this statement cost a quarter of an
    # empty transaction's CPU (decision 92).
    with sqlite_driver_errors():
        connection.connection.driver_connection.execute("BEGIN" if read_only else "BEGIN IMMEDIATE")


SCHEMA_HEAD = "0013"
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


_POSTGRES_HAS_VERSION_TABLE = text(
    "SELECT EXISTS (SELECT FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
    " WHERE c.relname = 'alembic_version' AND c.relkind IN ('r', 'p', 'f', 'v', 'm')"
    " AND pg_catalog.pg_table_is_visible(c.oid) AND n.nspname <> 'pg_catalog')"
)
"""SQLAlchemy's `has_table("alembic_version")` on PostgreSQL, its query written out: through the Inspector, which
builds that query again for each new engine, `schema_is_current` cost 2.5-2.8 ms of the gateway's CPU at every
`serve`'s start, with this 0.7-1.2 ms. SQLite's `has_table` is one pragma and stays."""


def schema_is_current(engine: Engine) -> bool:
    """Whether the database stands at SCHEMA_HEAD: Alembic's version table read with plain SQL."""
    with engine.connect() as connection:
        if engine.dialect.name == "postgresql":
            has_version_table = bool(connection.execute(_POSTGRES_HAS_VERSION_TABLE).scalar())
        else:
            has_version_table = inspect(connection).has_table("alembic_version")
        if not has_version_table:
            return False
        current = connection.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    return current == [SCHEMA_HEAD]
