"""A call's trail: its entry event, its terminal events and its card, written together (docs/architecture.md).

Both ways a call comes in leave the same trail: a tools/call through the stages
(gateway/pipeline.py) and a question of Claude Code's (gateway/permission_prompt.py). The entry
event, `MCP_TOOL_CALL`, names the caller once authentication has named one, and waits until
something must follow it in the log (a refusal, a reservation, a run, a person asked), so that a
call refused early costs one commit. Every write of the trail goes with the call's card
(gateway/calls.py) in the same transaction: the card's first row with the entry event, its move
with each later event. A call from nobody known gets no card: it belongs to no workspace (the
audit log keeps it). While a run is on, its connections through the egress proxy are written as they
end, at most once a second, with the card's move (`flush_connections`; decision 98), and those it holds
open are shown on its card with their bytes so far, outside the audit log (decision 102).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
from sqlalchemy import Connection, Engine

from gateway.audit import Along, AuditLog, EventDraft, EventType
from gateway.auth import Principal
from gateway.calls import KIND_TOOL, CardStatus, Moved, Opened, OpenRow, outcome_content, replace_open_connections
from gateway.canonical import is_text
from gateway.clock import Clock
from gateway.db.errors import storage_errors
from gateway.db.threads import in_db_thread
from gateway.errors import GatewayError, Reason
from gateway.proxy import ConnectionLog, NetConnect, OpenConnection
from gateway.tools.outcome import ToolOutcome

log = logging.getLogger("gateway.call_trail")

FLUSH_S = 1.0
"""A live run's ended connections are written at most this often (decision 98)."""
STORED_NAME_MAX = 128
"""The audit log's tool_name column (String(128) in gateway/db/__init__.py)."""


def _audit_errors(run_id: str) -> contextlib.AbstractContextManager[None]:
    """A trail's write failing is the audit log failing: StorageUnavailableError, audit_unavailable."""
    return storage_errors(
        "the audit log could not be written (audit_unavailable)",
        log=log,
        run_id=run_id,
        reason=Reason.AUDIT_UNAVAILABLE,
        detail="the audit log could not be written",
    )


def stored_tool_name(name: object) -> str:
    """The tool name as the audit log keeps it, before anyone is authenticated: never the raw input.

    A name that is text, has no NUL or control character and fits the column is kept as is.
    Any other (too long, a lone surrogate, a NUL, not a string) is stored as a readable prefix
    of at most 40 characters and the sha256 of its UTF-8 bytes (surrogates escaped), so an
    unauthenticated caller decides neither how much is stored nor what bytes the database sees.
    """
    text = name if isinstance(name, str) else repr(name)
    clean = len(text) <= STORED_NAME_MAX and text.isprintable() and is_text(text)
    if isinstance(name, str) and clean:
        return name
    digest = hashlib.sha256(text.encode("utf-8", "backslashreplace")).hexdigest()
    prefix = "".join(c if c.isprintable() and is_text(c) else "?" for c in text[:40])
    return f"{prefix}...sha256:{digest}"


@dataclass(frozen=True, slots=True)
class Recorder:
    """Where a gateway's trails are written: its audit log (cards along), its clock, and what its cards name."""

    audit: AuditLog
    clock: Clock
    server_id: str
    session_id: str | None
    """The gateway session (gateway/open_calls.py finds the cards a dead one left open)."""


@dataclass(slots=True)
class CallTrail:
    """What the call has learnt so far, for its events and its card; `log` writes them."""

    recorder: Recorder
    entry: EventDraft
    arguments: Mapping[str, Any]
    """What the card shows of the call (stored redacted)."""
    kind: str = KIND_TOOL
    principal: Principal | None = None
    workspace: str | None = None
    """The workspace the events name (stage 4's, or the question's once it is admitted)."""
    filed_under: str | None = None
    """The card's workspace while the events name none yet: a question refused for its shape after its
    workspace was chosen is filed under it, as it was asked in it."""
    executing: bool = False
    entry_logged: bool = False
    carded: bool = False
    """The call's card is written (gateway/calls.py)."""
    card_waits: bool = False
    """A 2026-07-28 retry with a consent answer, before consent: which card is its own is not known yet."""
    card_id: str | None = None
    """The card this call moves when it is not its own run_id's: its first round's (`continue_card`)."""
    charge_id: int | None = None
    """The budget reservation still to settle (None: none taken, or settled)."""
    started_at: float = 0.0
    run_ms: int | None = None
    """The run's own duration once it ended (0 when the sandbox could not start it)."""
    closed_by_sweep: bool = False
    """A sweep closed the run as abandoned (with its terminal event) before the call recorded its end."""
    stage: str | None = None
    """The stage the call is in (gateway/pipeline.py STAGES' names)."""
    refusal_logged: bool = False
    """The refusal's terminal event is written (on the database thread that refused)."""
    connections: ConnectionLog | None = None
    """The run's connections through the egress proxy, not yet written (decision 90)."""
    open_shown: bool = False
    """Rows of the run's open connections are in `open_connections` (decision 102): the run's end deletes them."""

    @property
    def card_of_run(self) -> str:
        """The card this call's writes move: its own, or its first round's (`continue_card`)."""
        return self.card_id or self.run_id

    @property
    def run_id(self) -> str:
        return str(self.entry.run_id)

    def continue_card(self, first_round: str) -> None:
        """Consent found this retry's answer to be its first round's: that round's card is this call's."""
        self.card_id = first_round
        self.carded = True

    def entry_for_log(self) -> EventDraft:
        """MCP_TOOL_CALL with the caller, once authentication has named one."""
        if self.principal is None:
            return self.entry
        return dataclasses.replace(self.entry, user=self.principal.name, workspace=self.workspace)

    def terminal(self, kind: EventType, code: int | None, detail: Mapping[str, Any]) -> EventDraft:
        return EventDraft(
            kind,
            run_id=self.entry.run_id,
            user=self.principal.name if self.principal else None,
            workspace=self.workspace,
            tool_name=self.entry.tool_name,
            args_hash=self.entry.args_hash,
            code=code,
            detail=dict(detail),
        )

    def connected(self) -> tuple[EventDraft, ...]:
        """NET_CONNECT for each connection through the run's proxy not yet written, taken: written once, while the
        run is on (`flush_connections`) or with the run's execution event or, when the call fails or is cancelled,
        its terminal event."""
        return self.net_connects(self.connections.drain() if self.connections is not None else ())

    def net_connects(self, records: tuple[NetConnect, ...]) -> tuple[EventDraft, ...]:
        return tuple(self.terminal(EventType.NET_CONNECT, None, r.detail()) for r in records)

    def refusal(self, exc: GatewayError) -> EventDraft:
        """POLICY_BLOCKED before the tool ran, TOOL_FINISHED with the code after."""
        if self.executing:
            return self.terminal(EventType.TOOL_FINISHED, exc.code, {"status": "error", "reason": exc.reason})
        return self.terminal(EventType.POLICY_BLOCKED, exc.code, {"blocked_reason": exc.reason})

    def cancelled(self) -> EventDraft:
        kind = EventType.TOOL_FINISHED if self.executing else EventType.POLICY_BLOCKED
        return self.terminal(kind, None, {"status": "cancelled"})

    def log(
        self,
        status: CardStatus | None,
        *events: EventDraft,
        error: GatewayError | None = None,
        outcome: ToolOutcome | None = None,
    ) -> None:
        """Commit the entry event (once, naming the caller when known) with `events`, in one transaction,
        and with them the call's card in `status` (None: unchanged). Synchronous database work: on a
        database thread (gateway/db/threads.py), never on the event loop.

        Until something happens that the log must precede (a read, a reservation, a run), the
        entry waits, so a call refused at stages 2-5 costs one commit; the answer still leaves
        only after both events are committed.
        """
        pending = () if self.entry_logged else (self.entry_for_log(),)
        if pending or events:
            along = self.card(status, error, outcome)
            self.recorder.audit.append(*pending, *events, along=along)
            self.carded = self.carded or bool(along)
        self.entry_logged = True

    def log_with(
        self, engine: Engine, status: CardStatus | None, writes: Callable[[Connection], None], *events: EventDraft
    ) -> None:
        """`log`, with `writes` (the run's record, its reservation's settlement) first in the same transaction: the
        events, the card's move and those rows are committed together or not at all, in one commit where there
        were two or three (decision 93); the card is left as it is when `status` is None. Synchronous database
        work, as `log`."""
        drafts = () if self.entry_logged else (self.entry_for_log(),)
        with _audit_errors(self.run_id), engine.begin() as connection:
            writes(connection)
            # The card goes in the append itself, the transaction's last statement: on PostgreSQL the chain's
            # lock is held until COMMIT only, as for `log` (decision 62).
            along = self.card(status) if status is not None else ()
            self.recorder.audit.append_within(connection, *drafts, *events, along=along)
        self.carded = self.carded or bool(along)
        self.entry_logged = True

    def card(
        self, status: CardStatus | None, error: GatewayError | None = None, outcome: ToolOutcome | None = None
    ) -> tuple[Along, ...]:
        """The card's write for this step: its first row, or its move to `status`; none before a caller is known,
        nor while a retry's card waits for consent (`card_waits`; a refusal before it opens one)."""
        if self.principal is None or (status is None and self.carded):
            return ()
        if self.card_waits:
            if error is None:
                return ()
            self.card_waits = False
        card = self.card_id or self.run_id
        now = self.recorder.clock.now()
        code = None if error is None else error.code
        reason = None if error is None else error.reason
        message = None if error is None else error.public_message()
        result = None if outcome is None else outcome_content(outcome)
        if outcome is not None and outcome.is_error:
            status = CardStatus.ERROR
        if not self.carded:
            return (
                Opened(
                    run_id=card,
                    user=self.principal.name,
                    workspace=self.filed_under if self.workspace is None else self.workspace,
                    server_id=self.recorder.server_id,
                    tool_name=str(self.entry.tool_name),
                    arguments=self.arguments,
                    status=status or CardStatus.PENDING,
                    now=now,
                    kind=self.kind,
                    code=code,
                    reason=reason,
                    message=message,
                    result=result,
                    session_id=self.recorder.session_id,
                ),
            )
        if status is None:  # a card already written, left as it is (returned above; for the type checker)
            return ()
        return (Moved(card, status, now, self.workspace, code, reason, message, result),)


def open_rows(connections: ConnectionLog, now: float) -> list[OpenRow]:
    """The run's connections open now, as its card shows them (their bytes so far read off the proxy's counts)."""
    return [_open_row(number, conn, now) for number, conn in sorted(connections.open.items())]


def _open_row(number: int, conn: OpenConnection, now: float) -> OpenRow:
    up, down = conn.so_far()
    opened_at = now - max(0.0, time.monotonic() - conn.started)
    return OpenRow(number, conn.host, conn.port, conn.method, conn.address, conn.rule, up, down, opened_at)


async def flush_connections(trail: CallTrail, engine: Engine, every_s: float = FLUSH_S) -> None:
    """While the run is on, until cancelled: NET_CONNECT for each of its connections that ended since the last write,
    with the card's move (still running, its `last_event_id` the console's cursor), in one transaction, at most
    once every `every_s`; nothing is written while nothing ends (decision 98). The write is shielded (a database
    thread's), so cancelling this never leaves a write behind that could land after the run's end. A write that
    fails raises (StorageUnavailableError, audit_unavailable) with its records put back: the call's end writes
    them, and the caller ends the run.

    The connections the run holds open are shown on its card (decision 102): once one has been open `every_s`
    (a shorter one never gets a row), their rows are replaced with their bytes so far at each write, and
    between writes every `every_s` while any is open, when and only when a byte moved or one opened or ended
    (a transaction of its own, no audit event, no card move: the console's stream watches the rows). A
    connection's row is deleted in the transaction of its NET_CONNECT; the run's end deletes what is left."""
    connections = trail.connections
    if connections is None:
        return
    shown: dict[int, tuple[int, int]] = {}
    while True:
        await connections.busy()
        if not connections.records and not shown:
            with anyio.move_on_after(every_s):  # a short connection ends first and never gets a row
                await connections.arrived()
        taken = connections.drain()
        rows = open_rows(connections, trail.recorder.clock.now())
        marks = {row.number: (row.bytes_up, row.bytes_down) for row in rows}
        moved = marks != shown
        try:
            if taken:
                await in_db_thread(_write_ended, trail, engine, rows if moved or shown else None, taken)
            elif moved:
                await in_db_thread(_write_open, trail, engine, rows)
        except Exception:
            connections.put_back(taken)
            log.error("run %s: %d connection(s) through the proxy could not be written", trail.run_id, len(taken))  # noqa: TRY400  (the cause is raised on)
            raise
        shown = marks
        trail.open_shown = trail.open_shown or bool(marks)
        await anyio.sleep(every_s)


def _write_ended(trail: CallTrail, engine: Engine, rows: list[OpenRow] | None, taken: tuple[NetConnect, ...]) -> None:
    """NET_CONNECT of the connections that ended, the card's move and (`rows` not None) its open connections, in one
    transaction: an ended connection's row goes with its event."""
    if rows is None:
        trail.log(CardStatus.RUNNING, *trail.net_connects(taken))
        return
    trail.open_shown = trail.open_shown or bool(rows)  # before the write: the run's end deletes what it left
    now = trail.recorder.clock.now()
    trail.log_with(
        engine,
        CardStatus.RUNNING,
        lambda connection: replace_open_connections(connection, trail.card_of_run, trail.run_id, rows, now),
        *trail.net_connects(taken),
    )


def _write_open(trail: CallTrail, engine: Engine, rows: list[OpenRow]) -> None:
    """The card's open connections alone (nothing ended since the last write): no audit event, no card move."""
    trail.open_shown = trail.open_shown or bool(rows)
    with _audit_errors(trail.run_id), engine.begin() as connection:
        replace_open_connections(connection, trail.card_of_run, trail.run_id, rows, trail.recorder.clock.now())


def forget_open(trail: CallTrail) -> Callable[[Connection], None] | None:
    """The write that deletes the run's remaining open-connection rows (its end), or None when it never had any."""
    if not trail.open_shown:
        return None
    card, run = trail.card_of_run, trail.run_id

    def forget(connection: Connection) -> None:
        replace_open_connections(connection, card, run, (), 0.0)
        trail.open_shown = False

    return forget
