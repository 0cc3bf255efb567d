"""Each tools/call as the web console shows it: the `tool_calls` table, written with the call's audit events.

The gateways are other processes than the console, so the database is where the console learns
of a call. A card is inserted when the call's entry event is committed (a call refused before
authentication named anyone gets none: it belongs to no workspace; the audit log keeps it) and
moved with each later event of the call, in the same transaction (`AuditLog.append(along=...)`):
no extra commit on any path, the refusal path included. Its status follows the call:

    pending (waiting: budget, sandbox, consent) -> running (the tool runs) -> done | error | cancelled

(`CardStatus`; a question of Claude Code's, kind `check_permission`, goes from pending, or from
nothing, to done, error or cancelled.)

A call refused before anything ran goes from pending to error; `running` is never skipped on the
way to `done`. A 2026-07-28 call that asks its person is two requests (the `input_required` round,
then the retry with the answer) and one card, the first round's: the retry moves it once consent
has found the answer to be that round's (gateway/call_trail.py `CallTrail.card`; decision 61). The
arguments are stored redacted as everywhere (gateway/consent/text.py `redacted`), the result as
MCP content blocks; either, past `STORED_CHARS`, is cut loudly (length and sha256 kept).
`last_event_id`, the id of the audit event of the row's last change, only grows: it is the cursor
the console's live view polls.

A card read for the console carries its run's connections through the egress proxy: the NET_CONNECT
events of the call (the run of its last event: a continued card's retry), the newest `CONNECTIONS_SHOWN`
of them and how many there are. A live run writes them as they end, at most once a second, each with
the card's move (gateway/call_trail.py `flush_connections`; decision 98), so they reach the console's
stream while the run is on. A running card also carries the connections its run has open now, with
their bytes so far (`open: true`), from `open_connections` (decision 102): the live writer replaces a
card's rows at most about once a second while bytes move (`replace_open_connections`), the transaction
of a connection's NET_CONNECT deletes its row, and the console's stream sends a card again when its open
rows change (`CallStore.fetch_open_marks`), outside the audit log's cursor.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import Connection, Engine, and_, bindparam, func, or_, select, update

from gateway import db
from gateway.audit import EventType
from gateway.canonical import canonical_json, sha256_hex
from gateway.consent.text import redacted
from gateway.tools.outcome import ToolOutcome
from gateway.visible import storable

CONNECTIONS_SHOWN = 50
"""At most this many of a card's connections (the newest) are read for the console; `connections_total` counts all."""
CONNECTION_FIELDS = ("host", "port", "method", "decision", "reason", "bytes_up", "bytes_down", "duration_ms", "count")
"""What a card shows of a NET_CONNECT's detail (docs/audit.md); each also says whether it is `open`."""
STORED_CHARS = 262_144
"""At most this much of a card's arguments or of its result text is stored; the rest is named, not kept."""
KIND_TOOL = "tool"
KIND_QUESTION = "check_permission"


class CardStatus(StrEnum):
    """A card's `status` column, as stored and as the console's page reads it (gateway/console/static/console.js)."""

    PENDING = "pending"
    """Waiting: for the budget, the sandbox, consent; or its entry is logged and nothing has run yet."""
    RUNNING = "running"
    REVIEWING = "reviewing"
    """The run is over and a person is asked whether its changes apply (`workspace: review`, decision 80)."""
    DONE = "done"
    ERROR = "error"
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class Card:
    run_id: str
    kind: str
    created_at: float
    updated_at: float
    user: str
    workspace: str | None
    server_id: str
    tool_name: str
    arguments: Any
    status: CardStatus
    code: int | None
    reason: str | None
    message: str | None
    result: list[dict[str, Any]] | None
    last_event_id: int
    connections: tuple[dict[str, Any], ...] = ()
    """The run's connections through the egress proxy so far, oldest first (the newest CONNECTIONS_SHOWN of them)."""
    connections_total: int = 0
    """The run's connections: the ended ones (all of them) and those open now."""

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in Card.__slots__}


def stored_arguments(arguments: Mapping[str, Any]) -> str:
    """The arguments as the card keeps them: redacted canonical JSON, or a loud note of what was too long."""
    try:
        text = canonical_json(redacted(dict(arguments)))
    except (TypeError, ValueError):
        return canonical_json({"(not JSON text)": True})
    if len(text) > STORED_CHARS:
        return canonical_json({"(not stored)": f"{len(text)} characters, sha256 {sha256_hex(text)}"})
    return storable(text)


def outcome_content(outcome: ToolOutcome) -> list[dict[str, Any]]:
    """The result's content blocks as the client got them: the text, then a resource link per artifact."""
    text = outcome.text
    if len(text) > STORED_CHARS:
        note = f"\n[not stored: {len(text) - STORED_CHARS} more characters of {len(text)}, sha256 {sha256_hex(text)}]"
        text = text[:STORED_CHARS] + note
    blocks: list[dict[str, Any]] = [{"type": "text", "text": storable(text)}]
    for link in outcome.links:
        block = {"type": "resource_link", "uri": link.uri, "name": link.name}
        if link.mime_type:
            block["mimeType"] = link.mime_type
        if link.description:
            block["description"] = link.description
        blocks.append(block)
    return blocks


# Built once: a card is written on every call, the refusal path included, and building a statement
# costs more than running it (gateway/audit.py does the same).
_INSERT = db.tool_calls.insert()
_t = db.tool_calls
_MOVE = (
    update(_t)
    .where(_t.c.run_id == bindparam("card"))
    .values(
        status=bindparam("new_status"),
        updated_at=bindparam("now"),
        last_event_id=bindparam("event_id"),
        workspace=func.coalesce(bindparam("new_workspace", type_=_t.c.workspace.type), _t.c.workspace),
        code=func.coalesce(bindparam("new_code", type_=_t.c.code.type), _t.c.code),
        reason=func.coalesce(bindparam("new_reason", type_=_t.c.reason.type), _t.c.reason),
        message=func.coalesce(bindparam("new_message", type_=_t.c.message.type), _t.c.message),
        result=func.coalesce(bindparam("new_result", type_=_t.c.result.type), _t.c.result),
    )
)

# The same two on the sqlite3 cursor of the append's transaction (decision 100): SQLAlchemy's execute of the
# card's insert cost more than the two events' statements together.
_SQLITE_INSERT = db.SqliteStatement.of(_INSERT)
_SQLITE_MOVE = db.SqliteStatement.of(_MOVE)


@dataclass(frozen=True, slots=True)
class Opened:
    """The card's first row, written with the call's entry event."""

    run_id: str
    user: str
    workspace: str | None
    server_id: str
    tool_name: str
    arguments: Mapping[str, Any]
    status: CardStatus
    now: float
    kind: str = KIND_TOOL
    code: int | None = None
    reason: str | None = None
    message: str | None = None
    result: list[dict[str, Any]] | None = None
    session_id: str | None = None
    """The gateway session the call runs in (gateway/open_calls.py finds the cards a dead one left)."""

    def __call__(self, connection: Connection, event_id: int) -> None:
        connection.execute(_INSERT, {**self._row(), "last_event_id": event_id})

    def on_sqlite(self, cursor: Any, event_id: int) -> None:
        cursor.execute(_SQLITE_INSERT.sql, {**self._row(), "last_event_id": event_id})

    def server_side(self) -> dict[str, Any]:
        """The same write for PostgreSQL's `gateway_audit_append` (migration 0008)."""
        return {"op": "open", **self._row()}

    def _row(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "kind": self.kind,
            "created_at": self.now,
            "updated_at": self.now,
            "user_name": self.user,
            "workspace": self.workspace,
            "server_id": self.server_id,
            "tool_name": self.tool_name,
            "arguments": stored_arguments(self.arguments),
            "status": self.status,
            "code": self.code,
            "reason": self.reason,
            "message": None if self.message is None else storable(self.message),
            "result": None if self.result is None else json.dumps(self.result, ensure_ascii=False),
            "session_id": self.session_id,
        }


@dataclass(frozen=True, slots=True)
class Moved:
    """A later state of the card, written with the call's event that caused it."""

    run_id: str
    status: CardStatus
    now: float
    workspace: str | None = None
    code: int | None = None
    reason: str | None = None
    message: str | None = None
    result: list[dict[str, Any]] | None = None

    def __call__(self, connection: Connection, event_id: int) -> None:
        """A field left None keeps what the card holds."""
        connection.execute(_MOVE, self._params(event_id))

    def on_sqlite(self, cursor: Any, event_id: int) -> None:
        cursor.execute(_SQLITE_MOVE.sql, self._params(event_id))

    def _params(self, event_id: int) -> dict[str, Any]:
        return {
            "card": self.run_id,
            "new_status": str(self.status),
            "now": self.now,
            "event_id": event_id,
            **{f"new_{name}": value for name, value in self._changes().items()},
        }

    def server_side(self) -> dict[str, Any]:
        """The same write for PostgreSQL's `gateway_audit_append` (migration 0008)."""
        return {"op": "move", "run_id": self.run_id, "status": self.status, "now": self.now, **self._changes()}

    def _changes(self) -> dict[str, Any]:
        return {
            "workspace": self.workspace,
            "code": self.code,
            "reason": self.reason,
            "message": None if self.message is None else storable(self.message),
            "result": None if self.result is None else json.dumps(self.result, ensure_ascii=False),
        }


@dataclass(frozen=True, slots=True)
class OpenRow:
    """A connection a live run has open now, as its card shows it (decision 102)."""

    number: int
    host: str | None
    port: int | None
    method: str | None
    address: str | None
    rule: str | None
    bytes_up: int
    bytes_down: int
    opened_at: float


_o = db.open_connections
_DELETE_OPEN = _o.delete().where(_o.c.card_id == bindparam("card"))
_INSERT_OPEN = _o.insert()


def replace_open_connections(
    connection: Connection, card_id: str, run_id: str, rows: Collection[OpenRow], now: float
) -> None:
    """The card's open connections set to `rows` in the caller's transaction: those that ended since (their
    NET_CONNECT in the same transaction, or none: refused before dialling) are deleted, the others written with
    their bytes so far."""
    connection.execute(_DELETE_OPEN, {"card": card_id})
    if rows:
        connection.execute(
            _INSERT_OPEN,
            [
                {"card_id": card_id, "run_id": run_id, "updated_at": now, **dataclasses.asdict(row)}
                for row in sorted(rows, key=lambda r: r.number)
            ],
        )


def take_open_rows(connection: Connection, run_id: str) -> list[tuple[OpenRow, float]]:
    """The run's open connections as last written (each with when it was), by number, deleted in the caller's
    transaction: the sweep that closes a dead gateway's run writes them as NET_CONNECT in it (gateway/recovery.py;
    decision 102)."""
    o = db.open_connections
    columns = (*(o.c[name] for name in _OPEN_COLUMNS), o.c.updated_at)
    query = select(*columns).where(o.c.run_id == run_id).order_by(o.c.number)
    rows = [(OpenRow(*row[:-1]), float(row[-1])) for row in connection.execute(query)]
    if rows:
        connection.execute(o.delete().where(o.c.run_id == run_id))
    return rows


def delete_stale_open_rows(engine: Engine) -> int:
    """Rows of cards no longer running (a run whose call failed before its end could delete them): never shown,
    deleted by the sweep. How many. Looked for first on a reader: the usual answer, none, takes no write lock."""
    o, t = db.open_connections, db.tool_calls
    stale = o.c.card_id.not_in(select(t.c.run_id).where(t.c.status == CardStatus.RUNNING))
    with db.reader(engine).connect() as connection:
        if connection.execute(select(o.c.card_id).where(stale).limit(1)).first() is None:
            return 0
    with engine.begin() as connection:
        return int(connection.execute(o.delete().where(stale)).rowcount or 0)


_OPEN_COLUMNS = tuple(field.name for field in dataclasses.fields(OpenRow))


PAGE_MAX = 200
"""At most this many cards in one page of the console's list (`CallQuery.limit`)."""
UPSTREAM_SEPARATOR = "__"
"""An upstream server's tool is offered as `<upstream>__<tool>` (docs/upstreams.md)."""


@dataclass(frozen=True, slots=True)
class CallQuery:
    """Which cards a page of the console's list shows (docs/console.md, "Invocations: the cards"): those
    of a tool, of an upstream's tools (the `<upstream>__` prefix of their name), of a user, with an
    outcome (their status); newest change first, `limit` of them, from before the cursor `before`
    (keyset paging on `last_event_id`, never OFFSET). The console checks the values it is given."""

    tool: str | None = None
    upstream: str | None = None
    user: str | None = None
    status: CardStatus | None = None
    before: int | None = None
    limit: int = 50

    def matches(self, card: Card) -> bool:
        """Whether the card passes the filters (the live view's test; the cursor and the page size aside)."""
        return (
            (self.tool is None or card.tool_name == self.tool)
            and (self.upstream is None or card.tool_name.startswith(self.upstream + UPSTREAM_SEPARATOR))
            and (self.user is None or card.user == self.user)
            and (self.status is None or card.status == self.status)
        )


class CallStore:
    """The console's reads of `tool_calls`: cards changed after a cursor, a page of them, and one card."""

    def __init__(self, engine: Engine) -> None:
        self._read = db.reader(engine)

    def fetch_changed(self, after: int, workspaces: Collection[str] | None, limit: int = 200) -> list[Card]:
        """Cards whose last change came after event `after`, oldest change first; `workspaces` None: all."""
        t = db.tool_calls
        query = select(t).where(t.c.last_event_id > after).order_by(t.c.last_event_id).limit(limit)
        if workspaces is not None:
            query = query.where(t.c.workspace.in_(list(workspaces)))
        with self._read.connect() as connection:
            return _with_connections(connection, [_card(row._mapping) for row in connection.execute(query)])

    def fetch_head(self) -> int:
        """The newest change's cursor (0 when there is no card): where a live view starts."""
        t = db.tool_calls
        with self._read.connect() as connection:
            return int(connection.execute(select(func.max(t.c.last_event_id))).scalar() or 0)

    def fetch_latest(self, workspaces: Collection[str] | None, limit: int = 50) -> list[Card]:
        """The most recently changed cards, newest first."""
        t = db.tool_calls
        query = select(t).order_by(t.c.last_event_id.desc()).limit(limit)
        if workspaces is not None:
            query = query.where(t.c.workspace.in_(list(workspaces)))
        with self._read.connect() as connection:
            return _with_connections(connection, [_card(row._mapping) for row in connection.execute(query)])

    def fetch_page(self, query: CallQuery, workspaces: Collection[str] | None) -> tuple[list[Card], int | None]:
        """One page of the cards `query` asks for, newest change first, and the cursor of the page after it
        (None: there is none). `workspaces` None: all."""
        t = db.tool_calls
        conditions = []
        if query.tool is not None:
            conditions.append(t.c.tool_name == query.tool)
        if query.upstream is not None:
            conditions.append(t.c.tool_name.startswith(query.upstream + UPSTREAM_SEPARATOR, autoescape=True))
        if query.user is not None:
            conditions.append(t.c.user_name == query.user)
        if query.status is not None:
            conditions.append(t.c.status == query.status)
        if query.before is not None:
            conditions.append(t.c.last_event_id < query.before)
        if workspaces is not None:
            conditions.append(t.c.workspace.in_(list(workspaces)))
        limit = max(1, min(query.limit, PAGE_MAX))
        select_page = select(t).where(*conditions).order_by(t.c.last_event_id.desc()).limit(limit + 1)
        with self._read.connect() as connection:
            cards = [_card(row._mapping) for row in connection.execute(select_page)]
            more = len(cards) > limit
            cards = _with_connections(connection, cards[:limit])
        return cards, cards[limit - 1].last_event_id if more else None

    def fetch(self, run_id: str) -> Card | None:
        t = db.tool_calls
        with self._read.connect() as connection:
            row = connection.execute(select(t).where(t.c.run_id == run_id)).first()
            return None if row is None else _with_connections(connection, [_card(row._mapping)])[0]

    def fetch_many(self, run_ids: Collection[str], workspaces: Collection[str] | None) -> list[Card]:
        """The cards of `run_ids` that `workspaces` may see (None: all), oldest change first."""
        if not run_ids:
            return []
        t = db.tool_calls
        query = select(t).where(t.c.run_id.in_(sorted(run_ids))).order_by(t.c.last_event_id)
        if workspaces is not None:
            query = query.where(t.c.workspace.in_(list(workspaces)))
        with self._read.connect() as connection:
            return _with_connections(connection, [_card(row._mapping) for row in connection.execute(query)])

    def fetch_open_marks(self, workspaces: Collection[str] | None) -> dict[str, tuple[tuple[int, int, int], ...]]:
        """Per running card with open connections, what they are now ((number, bytes up, bytes down) each): the
        live stream sends a card again when its marks change or go (decision 102). One read of a table that
        holds at most the open cap's rows per live run."""
        o, t = db.open_connections, db.tool_calls
        query = (
            select(o.c.card_id, o.c.number, o.c.bytes_up, o.c.bytes_down)
            .select_from(o.join(t, t.c.run_id == o.c.card_id))
            .where(t.c.status == CardStatus.RUNNING)
            .order_by(o.c.card_id, o.c.number)
        )
        if workspaces is not None:
            query = query.where(t.c.workspace.in_(list(workspaces)))
        marks: dict[str, list[tuple[int, int, int]]] = {}
        with self._read.connect() as connection:
            for card_id, number, up, down in connection.execute(query):
                marks.setdefault(card_id, []).append((int(number), int(up), int(down)))
        return {card_id: tuple(rows) for card_id, rows in marks.items()}


def _with_connections(connection: Connection, cards: list[Card]) -> list[Card]:
    """`cards` with their runs' connections (NET_CONNECT events), in two reads whatever their number: the run id
    of each card's last event (a continued card's events are its retry's), then the newest CONNECTIONS_SHOWN
    connections of each of those runs and their count, up to the card's last event: a connection committed after
    the card's row was read waits for the card's next move, so a card never shows more than its cursor says
    (the live stream sends the card again when `last_event_id` moves)."""
    tools = [card for card in cards if card.kind == KIND_TOOL]
    if not tools:
        return cards
    cards = _with_open(connection, cards)
    a = db.audit_events
    last_ids = [card.last_event_id for card in tools]
    run_of = dict(connection.execute(select(a.c.id, a.c.run_id).where(a.c.id.in_(last_ids))).all())
    bounds: dict[str, int] = {}
    for event_id, run in run_of.items():
        if run is not None:
            bounds[run] = max(bounds.get(run, 0), int(event_id))
    if not bounds:
        return cards
    numbered = (
        select(
            a.c.run_id,
            a.c.id,
            a.c.detail,
            func.row_number().over(partition_by=a.c.run_id, order_by=a.c.id.desc()).label("n"),
            func.count().over(partition_by=a.c.run_id).label("total"),
        )
        .where(
            a.c.event_type == EventType.NET_CONNECT,
            or_(*(and_(a.c.run_id == run, a.c.id <= bound) for run, bound in sorted(bounds.items()))),
        )
        .subquery()
    )
    shown: dict[str, list[dict[str, Any]]] = {}
    totals: dict[str, int] = {}
    rows = connection.execute(
        select(numbered.c.run_id, numbered.c.detail, numbered.c.total)
        .where(numbered.c.n <= CONNECTIONS_SHOWN)
        .order_by(numbered.c.id)
    )
    for run, detail, total in rows:
        shown.setdefault(run, []).append(_connection(detail))
        totals[run] = int(total)
    return [
        dataclasses.replace(
            card,
            connections=(*shown[run], *card.connections),
            connections_total=totals[run] + card.connections_total,
        )
        if card.kind == KIND_TOOL and (run := run_of.get(card.last_event_id)) in shown
        else card
        for card in cards
    ]


def _with_open(connection: Connection, cards: list[Card]) -> list[Card]:
    """The running cards with the connections their runs have open now (decision 102), as `connections` for
    `_with_connections` to put after the ended ones. A card that is not running shows none: a row its run's
    end did not delete (a run that failed, or a dead gateway's before the sweep) is not shown as open."""
    running = [card.run_id for card in cards if card.kind == KIND_TOOL and card.status == CardStatus.RUNNING]
    if not running:
        return cards
    o = db.open_connections
    query = (
        select(o.c.card_id, *(o.c[name] for name in _OPEN_COLUMNS))
        .where(o.c.card_id.in_(running))
        .order_by(o.c.card_id, o.c.number)
    )
    opened: dict[str, list[dict[str, Any]]] = {}
    for card_id, *values in connection.execute(query):
        opened.setdefault(card_id, []).append(_open_connection(OpenRow(*values)))
    if not opened:
        return cards
    return [
        dataclasses.replace(card, connections=tuple(shown), connections_total=len(shown))
        if (shown := opened.get(card.run_id)) is not None
        else card
        for card in cards
    ]


def _open_connection(row: OpenRow) -> dict[str, Any]:
    """What a card shows of a connection still open: the fields of an ended one, `open` set, no decision's end."""
    return {
        "host": row.host,
        "port": row.port,
        "method": row.method,
        "decision": "allowed",
        "reason": None,
        "bytes_up": row.bytes_up,
        "bytes_down": row.bytes_down,
        "duration_ms": None,
        "count": 1,
        "open": True,
    }


def _connection(detail: str) -> dict[str, Any]:
    """What a card shows of one NET_CONNECT: its CONNECTION_FIELDS, nothing else of the detail."""
    try:
        read = json.loads(detail)
    except ValueError:
        read = None
    if not isinstance(read, dict):
        return {"host": "(unreadable)", "open": False}
    return {**{name: read.get(name) for name in CONNECTION_FIELDS}, "open": False}


def _card(m: Any) -> Card:
    try:
        arguments = json.loads(m["arguments"])
    except ValueError:
        arguments = {"(unreadable)": True}
    result = None
    if m["result"] is not None:
        try:
            result = json.loads(m["result"])
        except ValueError:
            result = [{"type": "text", "text": "(unreadable result)"}]
    return Card(
        run_id=m["run_id"],
        kind=m["kind"],
        created_at=float(m["created_at"]),
        updated_at=float(m["updated_at"]),
        user=m["user_name"],
        workspace=m["workspace"],
        server_id=m["server_id"],
        tool_name=m["tool_name"],
        arguments=arguments,
        status=CardStatus(m["status"]),
        code=m["code"],
        reason=m["reason"],
        message=m["message"],
        result=result,
        last_event_id=int(m["last_event_id"]),
    )
