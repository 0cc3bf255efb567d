"""The calls a gateway left open when it died (decision 69): their cards, found and claimed for the sweep.

Every `MCP_TOOL_CALL` the log keeps without a terminal event has a card still `pending`,
`running` or `reviewing` (gateway/calls.py: the entry event and the card's first row are one commit), and the
card names the gateway session it ran in (migration 0010). gateway/recovery.py closes such a
card when its gateway is dead. Two kinds are left to the closures that know more, so that no call
gets two terminal events: a card whose run is still `running` or closed as `abandoned` (the run's
closure moves it, or has) and
a card whose out-of-band question is still `pending` or already `abandoned` (the question's
closure moves it).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine, and_, exists, select, update

from gateway import db
from gateway.calls import CardStatus
from gateway.db.errors import storage_errors
from gateway.runs import RunStatus

OPEN = (CardStatus.PENDING, CardStatus.RUNNING, CardStatus.REVIEWING)
CLAIMED = CardStatus.ERROR


@dataclass(frozen=True, slots=True)
class OpenCall:
    run_id: str
    status: CardStatus
    session_id: str
    user: str
    workspace: str | None
    tool_name: str
    has_run: bool
    """A `runs` row exists (not running): the tool ran, and its budget was settled when it ended."""


class OpenCalls:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._read = db.reader(engine)

    def fetch(self) -> list[OpenCall]:
        """Open cards with a session that no run closure or question closure will move."""
        t, r, q = db.tool_calls, db.runs, db.consent_requests
        asked = exists().where(q.c.id == t.c.run_id, q.c.status.in_(("pending", "abandoned")))
        query = (
            select(t.c.run_id, t.c.status, t.c.session_id, t.c.user_name, t.c.workspace, t.c.tool_name, r.c.run_id)
            .select_from(t.outerjoin(r, r.c.run_id == t.c.run_id))
            .where(t.c.status.in_(OPEN), t.c.session_id.is_not(None), ~asked)
            .where(r.c.status.is_(None) | r.c.status.not_in((RunStatus.RUNNING, RunStatus.ABANDONED)))
        )
        with storage_errors("open calls could not be read", log=None), self._read.connect() as connection:
            rows = connection.execute(query).all()
        return [
            OpenCall(row[0], CardStatus(row[1]), row[2], row[3], row[4], row[5], row[6] is not None) for row in rows
        ]

    def claim(self, call: OpenCall) -> bool:
        """Mark the card closed, if it still is as found; False when its gateway or another sweep moved it first."""
        t = db.tool_calls
        with storage_errors("an open call could not be closed", log=None), self._engine.begin() as connection:
            changed = connection.execute(
                update(t).where(and_(t.c.run_id == call.run_id, t.c.status == call.status)).values(status=CLAIMED)
            ).rowcount
        return bool(changed)

    def reopen(self, call: OpenCall) -> None:
        """Undo `claim` when the closure's events could not be written: a later sweep closes it again."""
        t = db.tool_calls
        with storage_errors("an open call could not be reopened", log=None), self._engine.begin() as connection:
            connection.execute(
                update(t).where(t.c.run_id == call.run_id, t.c.status == CLAIMED).values(status=call.status)
            )
