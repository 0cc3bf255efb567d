"""The append-only, hash-chained audit log (docs/operations.md, "Audit log").

Each event stores `prev_hash` and `hash = sha256(prev_hash + canonical JSON of the event)`,
where the event is every exported field but the two hashes. Events are numbered 1, 2, 3...
and `audit_head` keeps the last id and hash, so an edited, deleted, reordered or truncated
log fails `verify_chain`. Appends lock `audit_head`, so several gateways can share a log: on
PostgreSQL the whole append is one statement, `gateway_audit_append` (migration 0008), so the lock
is held while the server works, never across a round trip to a gateway (decision 62).
A call has at most one decision and one terminal event: an append that would record a second one
writes nothing (`call_ends`, migration 0009), whichever gateway sends it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, cast

from sqlalchemy import Connection, Engine, bindparam, select, update
from sqlalchemy.exc import NoResultFound

from gateway import db
from gateway.canonical import canonical_json, sha256_hex
from gateway.clock import Clock, iso_utc
from gateway.db.errors import storage_errors
from gateway.errors import Reason

log = logging.getLogger("gateway.audit")


class EventType(StrEnum):
    MCP_TOOL_CALL = "MCP_TOOL_CALL"
    POLICY_BLOCKED = "POLICY_BLOCKED"
    TOOL_STARTED = "TOOL_STARTED"
    SANDBOX_EXEC = "SANDBOX_EXEC"
    TOOL_FINISHED = "TOOL_FINISHED"
    WORKSPACE_CHANGES = "WORKSPACE_CHANGES"
    """A writing run's change set (decision 80): after SANDBOX_EXEC, before the terminal event."""
    UPSTREAM_CALL = "UPSTREAM_CALL"
    """A call forwarded to an upstream MCP server (decision 84): in place of SANDBOX_EXEC, before the terminal
    event; upstream, tool, duration_ms, is_error, the result's sha256 (never its content)."""
    NET_CONNECT = "NET_CONNECT"
    """One connection through the egress proxy (decision 90): after TOOL_STARTED, before SANDBOX_EXEC or
    UPSTREAM_CALL; host, port, method, decision, rule, reason, address, bytes each way (gateway/proxy/server.py)."""
    PERMISSION_DECISION = "mcp.permission.decision"
    USER_ADDED = "USER_ADDED"
    USER_DISABLED = "USER_DISABLED"
    USER_ROLE_CHANGED = "USER_ROLE_CHANGED"
    USER_PASSWORD_SET = "USER_PASSWORD_SET"  # noqa: S105  (an event name, not a secret)
    TOKEN_ISSUED = "TOKEN_ISSUED"  # noqa: S105  (an event name, not a secret)
    TOKEN_REVOKED = "TOKEN_REVOKED"  # noqa: S105
    CONSENT_REVOKED = "CONSENT_REVOKED"
    CONSOLE_SIGN_IN = "CONSOLE_SIGN_IN"
    """A sign-in to the web console, accepted or refused (detail.ok, detail.reason)."""
    CONSOLE_DECISION = "CONSOLE_DECISION"
    """A consent decision given in the web console (detail.recorded: whether it was the one that counted)."""
    APPROVER_DECISION = "APPROVER_DECISION"
    """The same, given in the terminal approver, `mcp-gateway approvals` (gateway/consent/actions.py)."""
    TOOL_DEFINITION_CHANGED = "TOOL_DEFINITION_CHANGED"
    """An upstream tool's definition differs from its pin: the tool is withheld (gateway/upstreams/pins.py;
    detail: upstream, tool, pinned_sha256, seen_sha256, and `refused` when it cannot be pinned)."""
    TOOL_DEFINITION_ACCEPTED = "TOOL_DEFINITION_ACCEPTED"
    """An ADMIN accepted a changed definition as the new pin (detail: upstream, tool, previous_sha256,
    accepted_sha256, accepted_by, channel)."""


@dataclass(frozen=True, slots=True)
class EventDraft:
    """What a caller supplies; the log adds id, ts and the hashes."""

    event_type: EventType
    run_id: str | None = None
    user: str | None = None
    workspace: str | None = None
    tool_name: str | None = None
    args_hash: str | None = None
    code: int | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AuditEvent:
    id: int
    ts: str
    event_type: str
    run_id: str | None
    user: str | None
    workspace: str | None
    tool_name: str | None
    args_hash: str | None
    code: int | None
    detail: Mapping[str, Any]
    prev_hash: str
    hash: str

    def body(self) -> dict[str, Any]:
        """The hashed part: everything but the two hashes."""
        return {
            "id": self.id,
            "ts": self.ts,
            "event_type": self.event_type,
            "run_id": self.run_id,
            "user": self.user,
            "workspace": self.workspace,
            "tool_name": self.tool_name,
            "args_hash": self.args_hash,
            "code": self.code,
            "detail": dict(self.detail),
        }

    def to_json(self) -> dict[str, Any]:
        return {**self.body(), "prev_hash": self.prev_hash, "hash": self.hash}


def chain_hash(prev_hash: str, body: Mapping[str, Any]) -> str:
    return sha256_hex(prev_hash + canonical_json(body))


@dataclass(frozen=True, slots=True)
class ChainHead:
    last_id: int
    last_hash: str


@dataclass(frozen=True, slots=True)
class ChainReport:
    ok: bool
    checked: int
    first_bad_id: int | None = None
    problem: str | None = None


GENESIS = ChainHead(0, db.GENESIS_HASH)


def verify_chain(events: Iterable[AuditEvent], head: ChainHead, after: ChainHead = GENESIS) -> ChainReport:
    """Check ids run 1..n without gaps, each hash links to the previous, and the head matches.

    `after`: the events follow this already verified point (its id and hash) instead of the start;
    `checked` then counts from it too (the web console checks what was appended since it last looked).
    """
    prev_hash = after.last_hash
    expected_id = after.last_id + 1
    checked = after.last_id
    for event in events:
        if event.id != expected_id:
            bad = min(event.id, expected_id)
            return ChainReport(False, checked, bad, f"expected event {expected_id}, found {event.id}")
        if event.prev_hash != prev_hash:
            return ChainReport(False, checked, event.id, "prev_hash does not match the previous event")
        if chain_hash(prev_hash, event.body()) != event.hash:
            return ChainReport(False, checked, event.id, "hash does not match the event's content")
        prev_hash = event.hash
        expected_id += 1
        checked += 1
    # Name an event that exists where one does: the head is written with every append.
    if checked < head.last_id:
        return ChainReport(False, checked, checked + 1, "events after the last one found are missing")
    if checked > head.last_id:
        return ChainReport(False, checked, head.last_id + 1, "events beyond the recorded head")
    if head.last_hash != prev_hash:
        return ChainReport(False, checked, max(checked, 1), "the last event does not match the recorded head")
    return ChainReport(True, checked)


class Along(Protocol):
    """A write committed with audit events (a call's card, gateway/calls.py)."""

    def __call__(self, connection: Connection, event_id: int) -> None:
        """Write it in the append's transaction, with the last event's id."""

    def server_side(self) -> dict[str, Any]:
        """The same write as `gateway_audit_append` (PostgreSQL) takes it: JSON, its `op` first."""

    def on_sqlite(self, cursor: Any, event_id: int) -> None:
        """The same write on the sqlite3 cursor of the append's transaction (decision 100)."""


# Built once: the append runs on every call, and statement construction is a visible cost.
_LOCK_HEAD = select(db.audit_head.c.last_id, db.audit_head.c.last_hash).where(db.audit_head.c.id == 1).with_for_update()
_INSERT_EVENT = db.audit_events.insert()
_INSERT_END = db.call_ends.insert()
_MOVE_HEAD = (
    update(db.audit_head)
    .where(db.audit_head.c.id == 1)
    .values(last_id=bindparam("new_id"), last_hash=bindparam("new_hash"))
)
# SQLite's append runs on the driver's cursor of the transaction's own connection (decision 92): the same
# statements, in the same transaction, without SQLAlchemy's per-execute work (half the append's CPU).
_SQLITE_LOCK_HEAD = db.SqliteStatement.of(_LOCK_HEAD)
_SQLITE_INSERT_EVENT = db.SqliteStatement.of(_INSERT_EVENT)
_SQLITE_INSERT_END = db.SqliteStatement.of(_INSERT_END)
_SQLITE_MOVE_HEAD = db.SqliteStatement.of(_MOVE_HEAD)
_APPEND = (
    "SELECT o_id, o_prev_hash, o_hash FROM gateway_audit_append(%(ts)s, %(types)s::text[], %(run_ids)s::text[], "
    "%(users)s::text[], %(workspaces)s::text[], %(tool_names)s::text[], %(args_hashes)s::text[], "
    "%(codes)s::integer[], %(details)s::text[], %(heads)s::bytea[], %(tails)s::bytea[], %(cards)s::jsonb)"
)


class AuditLog:
    def __init__(self, engine: Engine, clock: Clock) -> None:
        self._engine = engine
        self._read = db.reader(engine)
        self._clock = clock
        self._on_server = db.on_postgres(engine)

    def append(self, *drafts: EventDraft, along: Sequence[Along] = ()) -> list[AuditEvent]:
        """Commit the drafts, in order, as consecutive events; StorageUnavailableError if they cannot be.

        `along`: writes that belong with these events (a call's card, gateway/calls.py), run in the same
        transaction with the last event's id, so they are committed with the events or not at all."""
        run_id = next((d.run_id for d in drafts if d.run_id is not None), None)
        with storage_errors(
            "the audit log could not be written (audit_unavailable)",
            log=log,
            run_id=run_id,
            reason=Reason.AUDIT_UNAVAILABLE,
            detail="the audit log could not be written",
        ):
            if self._on_server:  # stamped before the lock: the server alone works under it
                written = self._append_on_server(iso_utc(self._clock.now()), drafts, along)
            else:
                written = self._append_here(drafts, along)
        if drafts and not written:
            _log_second_end(drafts)
        return written

    def append_within(
        self, connection: Connection, *drafts: EventDraft, along: Sequence[Along] = ()
    ) -> list[AuditEvent]:
        """Append the drafts in the caller's open transaction, so they commit with its other writes or not at
        all (a person's decision and its event: gateway/consent/actions.py). The caller maps storage errors.

        `along` as for `append`. On PostgreSQL it goes into `gateway_audit_append`'s one statement, which the
        caller should make its transaction's last: the chain's lock is then held until COMMIT only, never
        across another statement's round trip (decision 62)."""
        if self._on_server:
            bodies, params = _server_params(iso_utc(self._clock.now()), drafts, along)
            return _sealed_by_server(bodies, connection.exec_driver_sql(_APPEND, params).fetchall())
        return self._append_on(connection, drafts, along)

    def _append_here(self, drafts: Sequence[EventDraft], along: Sequence[Along]) -> list[AuditEvent]:
        """SQLite: the append in one transaction, under the file's write lock, on the driver's cursor: the
        events, their ends, the head and `along` (decision 100). PostgreSQL without `gateway_audit_append`
        (before migration 0008): through SQLAlchemy, the head locked FOR UPDATE."""
        if self._engine.dialect.name != "sqlite":
            with self._engine.begin() as connection:
                return self._append_by_core(connection, drafts, along)
        with db.sqlite_write_cursor(self._engine) as cursor:
            return self._append_by_driver(cursor, drafts, along)

    def _append_on(
        self, connection: Connection, drafts: Sequence[EventDraft], along: Sequence[Along]
    ) -> list[AuditEvent]:
        if connection.dialect.name != "sqlite":
            return self._append_by_core(connection, drafts, along)
        cursor = cast(Any, connection.connection.driver_connection).cursor()
        try:
            with db.sqlite_driver_errors():
                return self._append_by_driver(cursor, drafts, along)
        finally:
            cursor.close()

    def _append_by_driver(self, cursor: Any, drafts: Sequence[EventDraft], along: Sequence[Along]) -> list[AuditEvent]:
        inserted = self._insert_by_driver(cursor, drafts)
        if inserted is None:
            return []
        written, last_id = inserted
        for write in along:
            write.on_sqlite(cursor, last_id)
        return written

    def _append_by_core(
        self, connection: Connection, drafts: Sequence[EventDraft], along: Sequence[Along]
    ) -> list[AuditEvent]:
        """PostgreSQL without `gateway_audit_append` (a schema before migration 0008, which only the migrations
        see): the same append through SQLAlchemy, the head locked FOR UPDATE."""
        ends = _ends_of(drafts)
        row = connection.execute(_LOCK_HEAD).one()
        if ends and any(
            connection.execute(_FIND_END_CORE, {"run_id": run_id, "kind": kind}).first() is not None
            for run_id, kind in ends
        ):
            return []
        last_id, prev_hash = int(row.last_id), str(row.last_hash)
        written: list[AuditEvent] = []
        ts = iso_utc(self._clock.now())
        for draft in drafts:
            last_id += 1
            event = _seal(last_id, ts, draft, prev_hash)
            written.append(event)
            prev_hash = event.hash
        connection.execute(_INSERT_EVENT, [_to_row(e) for e in written])
        if ends:
            connection.execute(_INSERT_END, _end_rows(written))
        connection.execute(_MOVE_HEAD, {"new_id": last_id, "new_hash": prev_hash})
        for write in along:
            write(connection, last_id)
        return written

    def _insert_by_driver(self, cursor: Any, drafts: Sequence[EventDraft]) -> tuple[list[AuditEvent], int] | None:
        """SQLite: the events sealed after the head and inserted, with their `call_ends` and the head moved,
        and the head's id then; None, and nothing written, when one would be a call's second decision or end."""
        row = cursor.execute(_SQLITE_LOCK_HEAD.sql, _SQLITE_LOCK_HEAD.constants).fetchone()
        if row is None:
            raise NoResultFound("the audit log has no head row")  # as `.one()` said it: audit_unavailable
        ends = _ends_of(drafts)
        if ends and _has_an_end(cursor, ends):
            return None
        last_id, prev_hash = int(row[0]), str(row[1])
        written: list[AuditEvent] = []
        ts = iso_utc(self._clock.now())
        for draft in drafts:
            last_id += 1
            event = _seal(last_id, ts, draft, prev_hash)
            written.append(event)
            prev_hash = event.hash
        cursor.executemany(_SQLITE_INSERT_EVENT.sql, [_to_row(e) for e in written])
        if ends:
            cursor.executemany(_SQLITE_INSERT_END.sql, _end_rows(written))
        cursor.execute(_SQLITE_MOVE_HEAD.sql, _SQLITE_MOVE_HEAD.bind({"new_id": last_id, "new_hash": prev_hash}))
        return written, last_id

    def _append_on_server(self, ts: str, drafts: Sequence[EventDraft], along: Sequence[Along]) -> list[AuditEvent]:
        """PostgreSQL: lock, seal, insert, move the head and write `along` in one statement, in autocommit
        (its own transaction: committed when the statement returns). The server hashes what `_cut` gives it."""
        bodies, params = _server_params(ts, drafts, along)
        with db.autocommit_cursor(self._engine) as cursor:
            rows = cursor.execute(_APPEND, params).fetchall()
        return _sealed_by_server(bodies, rows)

    def verify(self) -> ChainReport:
        """verify_chain over one consistent snapshot of the events and the head (safe while serving)."""
        return self.verify_after(GENESIS)[0]

    def verify_after(self, after: ChainHead) -> tuple[ChainReport, ChainHead]:
        """verify_chain of the events after `after` (a point verified before), in one snapshot; and the
        head read in it, which is the new verified point when the report is ok."""
        with self._read.connect() as connection:
            if connection.dialect.name == "postgresql":
                connection.execution_options(isolation_level="REPEATABLE READ")
            row = connection.execute(select(db.audit_head).where(db.audit_head.c.id == 1)).one()
            head = ChainHead(int(row.last_id), str(row.last_hash))
            query = select(db.audit_events).order_by(db.audit_events.c.id)
            if after != GENESIS:  # from the start: every row, whatever its id (an id of 0 or below is a break)
                query = query.where(db.audit_events.c.id > after.last_id)
            with connection.execute(query.execution_options(yield_per=1000)) as rows:  # closed on an early stop too
                return verify_chain((_from_row(r._mapping) for r in rows), head, after), head

    def head(self) -> ChainHead:
        with self._read.connect() as connection:
            row = connection.execute(select(db.audit_head).where(db.audit_head.c.id == 1)).one()
        return ChainHead(int(row.last_id), str(row.last_hash))

    def events(self, since_ts: str | None = None, run_id: str | None = None) -> Iterator[AuditEvent]:
        query = select(db.audit_events).order_by(db.audit_events.c.id)
        if since_ts is not None:
            query = query.where(db.audit_events.c.ts >= since_ts)
        if run_id is not None:
            query = query.where(db.audit_events.c.run_id == run_id)
        # The result is closed with the generator: a reader that stops early (`verify_chain` at the
        # first broken link) leaves no PostgreSQL server-side cursor open behind it.
        with self._read.connect() as connection, connection.execute(query.execution_options(yield_per=1000)) as rows:
            for row in rows:
                yield _from_row(row._mapping)


_END_KINDS: Mapping[str, str] = {
    EventType.PERMISSION_DECISION: "decision",
    EventType.POLICY_BLOCKED: "end",
    EventType.TOOL_FINISHED: "end",
}
"""The events a call has at most one of each kind of (`call_ends`, migration 0009)."""
CHANGE_REVIEW = "change_set"
"""`detail.about` of the decision on a run's change set (decision 80): a call's second decision, kind `review`."""


def _server_params(
    ts: str, drafts: Sequence[EventDraft], along: Sequence[Along]
) -> tuple[list[AuditEvent], dict[str, Any]]:
    """The events unsealed, and `gateway_audit_append`'s parameters for them."""
    bodies = [_unsealed(0, ts, draft) for draft in drafts]
    cuts = [_cut(body) for body in bodies]
    params = {
        "ts": ts,
        "types": _pg_array([b.event_type for b in bodies]),
        "run_ids": _pg_array([b.run_id for b in bodies]),
        "users": _pg_array([b.user for b in bodies]),
        "workspaces": _pg_array([b.workspace for b in bodies]),
        "tool_names": _pg_array([b.tool_name for b in bodies]),
        "args_hashes": _pg_array([b.args_hash for b in bodies]),
        "codes": _pg_array([b.code for b in bodies]),
        "details": _pg_array([canonical_json(b.detail) for b in bodies]),
        "heads": _pg_array([head for head, _ in cuts]),
        "tails": _pg_array([tail for _, tail in cuts]),
        "cards": json.dumps([write.server_side() for write in along], ensure_ascii=False),
    }
    return bodies, params


def _sealed_by_server(bodies: Sequence[AuditEvent], rows: Sequence[Any]) -> list[AuditEvent]:
    """The events as `gateway_audit_append` sealed them, checked against the gateway's own hash."""
    if not rows:
        return []  # a second decision or end for a call (migration 0009): nothing was written
    written = []
    for body, (event_id, prev_hash, hashed) in zip(bodies, rows, strict=True):
        event = AuditEvent(**{**_fields(body), "id": int(event_id), "prev_hash": prev_hash, "hash": hashed})
        if chain_hash(prev_hash, event.body()) != hashed:  # the server and `audit verify` must agree
            raise RuntimeError(f"event {event_id}: the database's hash differs from the gateway's")
        written.append(event)
    return written


def _end_kind(event_type: str, detail: Mapping[str, Any]) -> str | None:
    """The `call_ends` kind an event records (migration 0011 computes the same on PostgreSQL), None: no end."""
    kind = _END_KINDS.get(event_type)
    if kind == "decision" and detail.get("about") == CHANGE_REVIEW:
        return "review"
    return kind


def _ends_of(drafts: Sequence[EventDraft]) -> list[tuple[str, str]]:
    """(run_id, kind) of each draft that records a call's decision, its change review's, or its end."""
    kinds = ((d.run_id, _end_kind(d.event_type, d.detail)) for d in drafts)
    return [(run_id, kind) for run_id, kind in kinds if run_id is not None and kind is not None]


_FIND_END_CORE = select(db.call_ends.c.event_id).where(
    db.call_ends.c.run_id == bindparam("run_id"), db.call_ends.c.kind == bindparam("kind")
)
_FIND_END = db.SqliteStatement.of(_FIND_END_CORE)
"""Built once, one primary-key look-up per end: a tuple IN list was compiled anew at every append."""


def _has_an_end(cursor: Any, ends: Sequence[tuple[str, str]]) -> bool:
    """Whether one of `ends` is recorded already (read under the chain's lock: no append can race it)."""
    return any(
        cursor.execute(_FIND_END.sql, {"run_id": run_id, "kind": kind}).fetchone() is not None for run_id, kind in ends
    )


def _end_rows(written: Sequence[AuditEvent]) -> list[dict[str, Any]]:
    seen: set[tuple[str, str]] = set()
    rows = []
    for event in written:
        kind = _end_kind(event.event_type, event.detail)
        if kind is None or event.run_id is None or (event.run_id, kind) in seen:
            continue
        seen.add((event.run_id, kind))
        rows.append({"run_id": event.run_id, "kind": kind, "event_id": event.id})
    return rows


def _log_second_end(drafts: Sequence[EventDraft]) -> None:
    """One line for an append the store refused: the call it is about was already decided or ended."""
    run_id = next(d.run_id for d in drafts if d.run_id is not None)
    kinds = ", ".join(sorted({str(d.event_type) for d in drafts}))
    log.warning(
        "run %s: not recorded (%s): the call already has its decision or its end, recorded first "
        "(e.g. by another gateway's sweep, after this gateway's lease ran out)",
        run_id,
        kinds,
    )


def _unsealed(event_id: int, ts: str, draft: EventDraft, prev_hash: str = "") -> AuditEvent:
    return AuditEvent(
        id=event_id,
        ts=ts,
        event_type=str(draft.event_type),
        run_id=draft.run_id,
        user=draft.user,
        workspace=draft.workspace,
        tool_name=draft.tool_name,
        args_hash=draft.args_hash,
        code=draft.code,
        detail=dict(draft.detail),
        prev_hash=prev_hash,
        hash="",
    )


def _seal(event_id: int, ts: str, draft: EventDraft, prev_hash: str) -> AuditEvent:
    """The event, its hash taken over its body: built once, as `body()` would give it (decision 100)."""
    event_type, detail = str(draft.event_type), dict(draft.detail)
    body = {
        "id": event_id,
        "ts": ts,
        "event_type": event_type,
        "run_id": draft.run_id,
        "user": draft.user,
        "workspace": draft.workspace,
        "tool_name": draft.tool_name,
        "args_hash": draft.args_hash,
        "code": draft.code,
        "detail": detail,
    }
    hashed = chain_hash(prev_hash, body)
    return AuditEvent(
        event_id, ts, event_type, draft.run_id, draft.user, draft.workspace, draft.tool_name, draft.args_hash,
        draft.code, detail, prev_hash, hashed,
    )  # fmt: skip


_ID = "id"
_BEFORE_ID = ("args_hash", "code", "detail", "event_type")
"""The body's keys that sort before "id" (canonical JSON sorts them); the rest sort after it."""


def _cut(body: AuditEvent) -> tuple[bytes, bytes]:
    """The canonical JSON of the event's body, as UTF-8, cut around the id's digits: `head` ends with
    `"id":`, `tail` starts at the comma after it. head + str(id) + tail is canonical_json(body())."""
    fields = body.body()
    del fields[_ID]
    before = canonical_json({key: fields.pop(key) for key in _BEFORE_ID})
    after = canonical_json(fields)
    return f'{before[:-1]},"{_ID}":'.encode(), f",{after[1:]}".encode()


def _pg_array(values: Sequence[str | int | bytes | None]) -> str:
    """PostgreSQL's text form of an array, `{"a",NULL,"b"}`, for a parameter the statement casts
    (`::text[]`, `::integer[]`, `::bytea[]`). Given a list, psycopg looks at its elements to choose a
    dumper, at every call: about a tenth of a PostgreSQL gateway's time (decision 64), for the text it
    sends anyway. Every string is quoted, so a value spelled NULL, or holding braces, commas or
    spaces, stays itself; inside the quotes only a backslash and a double quote are escaped."""
    return "{" + ",".join(_pg_element(value) for value in values) + "}"


def _pg_element(value: str | int | bytes | None) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bytes):
        return '"\\\\x' + value.hex() + '"'  # bytea's hex input form, its backslash escaped: "\\x0a1b"
    if isinstance(value, int):
        return str(int(value))  # an IntEnum's digits, whatever its str()
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _fields(event: AuditEvent) -> dict[str, Any]:
    return {name: getattr(event, name) for name in AuditEvent.__slots__}


def _to_row(event: AuditEvent) -> dict[str, Any]:
    return {
        "id": event.id,
        "ts": event.ts,
        "event_type": event.event_type,
        "run_id": event.run_id,
        "user_name": event.user,
        "workspace": event.workspace,
        "tool_name": event.tool_name,
        "args_hash": event.args_hash,
        "code": event.code,
        "detail": canonical_json(event.detail),
        "prev_hash": event.prev_hash,
        "hash": event.hash,
    }


def _from_row(row: Any) -> AuditEvent:
    try:
        detail = json.loads(row["detail"])
    except (TypeError, ValueError):
        detail = {"unreadable_detail": str(row["detail"])}
    return AuditEvent(
        id=int(row["id"]),
        ts=row["ts"],
        event_type=row["event_type"],
        run_id=row["run_id"],
        user=row["user_name"],
        workspace=row["workspace"],
        tool_name=row["tool_name"],
        args_hash=row["args_hash"],
        code=row["code"],
        detail=detail,
        prev_hash=row["prev_hash"],
        hash=row["hash"],
    )
