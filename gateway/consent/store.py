"""Stored consent decisions and the questions waiting for a person (docs/consent.md): the database side.

Grants are looked up with one indexed query per call (user, workspace, server, tool) and
chosen in `consent.pick_grant`, a pure function. A pending request is decided at most once:
the decision is a conditional UPDATE (`status = 'pending'` and not expired), so of several
approvers, and of an approver racing the gateway's own timeout, exactly one wins. An approver's
decision also needs the asking gateway alive (its lease in `gateway_sessions`, gateway/liveness.py).

Questions are bounded: a user has at most `MAX_OPEN_QUESTIONS` open at once (`pending` for the
approver, `awaiting_client` for a 2026-07-28 client's retry, `in_dialog` while a client's own
elicitation dialog asks it, until they expire), checked in the
transaction that inserts one, under the user's row lock; past it the call is refused (-32008
`consent_questions_limit`). `purge_expired` deletes questions closed or expired long ago; their
audit events stay. Every text stored is `storable` (no NUL, no lone surrogate: PostgreSQL and
UTF-8 cannot hold them), and an id no question can have is looked up nowhere.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from sqlalchemy import ColumnElement, Connection, Engine, and_, delete, func, or_, select, true, update

from gateway import db
from gateway.canonical import canonical_json
from gateway.db.errors import storage_errors
from gateway.errors import ConsentDeniedError, Reason
from gateway.visible import storable

log = logging.getLogger("gateway.consent.store")


class GrantDecision(StrEnum):
    """A stored decision as `consent_grants.decision` holds it: what an Allow always or a Deny always
    leaves (consent.lasting_decision reads it back). `consent_requests.decision` holds consent.Decision."""

    ALLOW = "ALLOW"
    DENY = "DENY"


class QuestionStatus(StrEnum):
    """A question's `consent_requests.status`: open while it waits, then closed once."""

    PENDING = "pending"
    """Waits for a person out of band: the terminal approver or the console."""
    AWAITING_CLIENT = "awaiting_client"
    """Waits for a 2026-07-28 client's retry of the call (the round trip)."""
    IN_DIALOG = "in_dialog"
    """A question the client's own elicitation dialog asks (2025-era, in band): no approver may decide
    it, but it counts in the cap like any other, on every gateway sharing the database."""
    DECIDED = "decided"
    EXPIRED = "expired"
    """Nobody answered before `consent.timeout_s`, or the dialog that asked it is over."""
    ABANDONED = "abandoned"
    """Closed because the gateway that asked it is gone (gateway/recovery.py)."""


class QuestionKind(StrEnum):
    """What a question asks (`consent_requests.kind`): may this call run, or may its run's changes apply."""

    CALL = "call"
    CHANGE_REVIEW = "change_review"
    """A `workspace: review` run's change set (decision 80): only Allow once or Deny once, never stored as a
    grant; `run_id` names the run whose artifacts hold changes.patch and changes.json."""


OPEN_STATUSES = (QuestionStatus.PENDING, QuestionStatus.AWAITING_CLIENT, QuestionStatus.IN_DIALOG)


class Channel(StrEnum):
    """Who or what gave a consent decision, or through which front end a person acted: a grant's
    `consent_grants.channel`, `detail.channel` of the audit events (docs/consent.md)."""

    APPROVER = "approver"
    """Out of band: a question in the database, answered by `mcp-gateway approvals` or the console."""
    ELICITATION = "elicitation"
    """In band: the client's own form (`elicitation/create`, or the 2026-07-28 round trip)."""
    CLI = "cli"
    """`mcp-gateway consent grant|revoke`: whoever runs it holds the state folder and the database."""
    CONSOLE = "console"
    """The web console (docs/console.md): its decisions and revocations."""
    STORED = "stored"
    """A stored grant answered the call (`mcp.permission.decision` only)."""
    SESSION = "session"
    """This stdio session's Allow for the session answered the call (`mcp.permission.decision` only)."""
    POLICY = "policy"
    """The policy answered: `consent.mode: deny` (`mcp.permission.decision` only)."""
    RULES = "rules"
    """Claude Code's permission rules answered (gateway/permission_prompt.py; `mcp.permission.decision` only)."""


MAX_OPEN_QUESTIONS = 16
"""Open questions (`pending` + `awaiting_client`, unexpired) a user may have at once: a person
answers a handful at a time, and one agent session asks one at a time (docs/operations.md)."""
PURGE_KEEP_S = 86400
"""How long a closed or expired question stays for `approvals` and operators, by default, before
`purge_expired` deletes it (its audit events stay)."""
_ID_CHARS = 64
"""consent_requests.id: a question's id is one of ours (`new_id`, a run id), never longer."""


@dataclass(frozen=True, slots=True)
class Grant:
    id: int
    user: str
    workspace: str
    server_id: str
    tool_name: str
    args_hash: str | None
    """None: any arguments."""
    decision: GrantDecision
    fingerprint: str
    granted_at: float
    expires_at: float | None
    granted_by: str
    revoked_at: float | None = None
    channel: str | None = None
    """Who made it, a `Channel`: `approver`, `elicitation` (the client, in band), `cli`; None: unknown
    (made before the gateway recorded it), read as in band."""
    arguments: Mapping[str, Any] | None = None
    """For a Deny made for particular arguments: what it covers, by meaning (gateway/grant_scope.py);
    None: `args_hash` alone decides (an Allow, or a Deny made before arguments were stored)."""


@dataclass(frozen=True, slots=True)
class PendingRequest:
    id: str
    created_at: float
    expires_at: float
    session_id: str
    user: str
    workspace: str
    server_id: str
    tool_name: str
    args_hash: str
    args_preview: str
    risk_tier: str
    destructive: bool
    status: str = QuestionStatus.PENDING
    """A `QuestionStatus`."""
    preview: str | None = None
    """What the tool use would do, for the approver (a command, a diff, a URL); None: the arguments say it."""
    decision: str | None = None
    decided_by: str | None = None
    choices: tuple[str, ...] | None = None
    """The decisions the approver may give (consent.Decision values); None: those `destructive` allows."""
    kind: str = QuestionKind.CALL
    """A `QuestionKind`."""
    run_id: str | None = None
    """For a change review, the run whose change set it asks about (its artifacts folder); None for a call's."""


class RecordDecision(Protocol):
    """Writes what goes with a person's decision, in its transaction (`ConsentStore.decide`)."""

    def __call__(self, connection: Connection, recorded: bool, question: PendingRequest | None, /) -> None: ...


class ConsentStore:
    def __init__(self, engine: Engine, max_open: int = MAX_OPEN_QUESTIONS) -> None:
        self._engine = engine
        self._read = db.reader(engine)
        self._max_open = max_open

    # --- grants --------------------------------------------------------------------------------

    def fetch_grants(self, user: str, workspace: str, server_id: str, tool_name: str) -> list[Grant]:
        """Every unrevoked grant for the key, expired ones included (the caller has the clock)."""
        g = db.consent_grants
        query = select(g).where(
            and_(
                g.c.user_name == user,
                g.c.workspace == workspace,
                g.c.server_id == server_id,
                g.c.tool_name == tool_name,
                g.c.revoked_at.is_(None),
            )
        )
        with storage_errors("stored consent decisions could not be read", log=log), self._read.connect() as connection:
            return [_grant(row) for row in connection.execute(query)]

    def insert_grant(self, grant: Grant) -> int:
        with storage_errors("a consent decision could not be stored", log=log), self._engine.begin() as connection:
            result = connection.execute(
                db.consent_grants.insert().values(
                    user_name=grant.user,
                    workspace=grant.workspace,
                    server_id=grant.server_id,
                    tool_name=grant.tool_name,
                    args_hash=grant.args_hash,
                    decision=grant.decision,
                    fingerprint=grant.fingerprint,
                    granted_at=grant.granted_at,
                    expires_at=grant.expires_at,
                    granted_by=grant.granted_by,
                    channel=grant.channel,
                    arguments=None if grant.arguments is None else canonical_json(dict(grant.arguments)),
                )
            )
            key = result.inserted_primary_key
            return int(key[0]) if key else 0

    def list_grants(self, user: str | None = None, include_revoked: bool = False) -> list[Grant]:
        g = db.consent_grants
        query = select(g).order_by(g.c.id)
        if user is not None:
            query = query.where(g.c.user_name == user)
        if not include_revoked:
            query = query.where(g.c.revoked_at.is_(None))
        with storage_errors("stored consent decisions could not be read", log=None), self._read.connect() as connection:
            return [_grant(row) for row in connection.execute(query)]

    def fetch_grant(self, grant_id: int) -> Grant | None:
        """One stored decision by its id, revoked or not; None when there is none."""
        g = db.consent_grants
        with storage_errors("stored consent decisions could not be read", log=None), self._read.connect() as connection:
            row = connection.execute(select(g).where(g.c.id == grant_id)).first()
        return None if row is None else _grant(row)

    def revoke_grant(self, grant_id: int, now: float) -> Grant | None:
        """Revoke one grant; None when there is no such unrevoked grant."""
        g = db.consent_grants
        with storage_errors("a consent decision could not be revoked", log=None), self._engine.begin() as connection:
            row = connection.execute(select(g).where(g.c.id == grant_id, g.c.revoked_at.is_(None))).first()
            if row is None:
                return None
            connection.execute(update(g).where(g.c.id == grant_id).values(revoked_at=now))
        return _grant(row)

    # --- pending requests -----------------------------------------------------------------------

    def insert_request(self, request: PendingRequest, status: QuestionStatus = QuestionStatus.PENDING) -> None:
        """A question: `pending` waits for the approver; `awaiting_client` for a 2026-07-28 client's retry.

        Raises ConsentDeniedError (`consent_questions_limit`) when the user has `max_open` open already.
        """
        r = db.consent_requests
        with storage_errors("a consent question could not be stored", log=log), self._engine.begin() as connection:
            # The user's row lock serialises the count and the insert across gateways (PostgreSQL);
            # SQLite's BEGIN IMMEDIATE already serialises every writer.
            connection.execute(select(db.users.c.id).where(db.users.c.name == request.user).with_for_update())
            open_count, first_expiry = connection.execute(
                select(func.count(), func.min(r.c.expires_at)).where(
                    r.c.user_name == storable(request.user),
                    r.c.status.in_(OPEN_STATUSES),
                    r.c.expires_at > request.created_at,
                )
            ).one()
            check_open_questions(
                int(open_count),
                self._max_open,
                first_expiry,
                request.created_at,
                request.expires_at - request.created_at,
            )
            connection.execute(
                r.insert().values(
                    id=storable(request.id),
                    created_at=request.created_at,
                    expires_at=request.expires_at,
                    session_id=storable(request.session_id),
                    user_name=storable(request.user),
                    workspace=storable(request.workspace),
                    server_id=storable(request.server_id),
                    tool_name=storable(request.tool_name),
                    args_hash=storable(request.args_hash),
                    args_preview=storable(request.args_preview),
                    preview=None if request.preview is None else storable(request.preview),
                    risk_tier=request.risk_tier,
                    destructive=request.destructive,
                    status=status,
                    choices=None if request.choices is None else ",".join(request.choices),
                    kind=request.kind,
                    run_id=request.run_id,
                )
            )

    def fetch_request(self, request_id: str) -> PendingRequest | None:
        """The question, or None; an id no question can have (a client's forged state) is looked up nowhere."""
        if not is_question_id(request_id):
            return None
        r = db.consent_requests
        with storage_errors("consent questions could not be read", log=log), self._read.connect() as connection:
            row = connection.execute(select(r).where(r.c.id == request_id)).first()
        return None if row is None else _request(row)

    def fetch_pending(self, now: float) -> list[PendingRequest]:
        """Open questions, oldest first; not those whose gateway is known to be gone (nobody would act on them)."""
        r = db.consent_requests
        query = (
            select(r)
            .where(r.c.status == QuestionStatus.PENDING, r.c.expires_at > now, _asker_not_gone(now))
            .order_by(r.c.created_at, r.c.id)
        )
        with storage_errors("consent questions could not be read", log=None), self._read.connect() as connection:
            return [_request(row) for row in connection.execute(query)]

    def decide(
        self,
        request_id: str,
        decision: str,
        decided_by: str,
        now: float,
        waiting: QuestionStatus = QuestionStatus.PENDING,
        *,
        record: RecordDecision | None = None,
    ) -> bool:
        """Record a person's decision; False when someone else decided first, the question expired, or (for
        the approver's `pending` questions) the gateway that asked is gone: no gateway would act on it.

        `record` runs in the same transaction, after the update, with whether it counted and the question:
        what it writes (the act's audit event) commits with the decision, so no gateway can act on a
        decision whose event is not yet on record. It is not called for an id no question can have."""
        if not is_question_id(request_id):
            return False
        r = db.consent_requests
        live = _asker_not_gone(now) if waiting == QuestionStatus.PENDING else true()
        with storage_errors("a consent decision could not be recorded", log=log), self._engine.begin() as connection:
            result = connection.execute(
                update(r)
                .where(r.c.id == request_id, r.c.status == waiting, r.c.expires_at > now, live)
                .values(
                    status=QuestionStatus.DECIDED, decision=decision, decided_by=storable(decided_by), decided_at=now
                )
            )
            recorded = result.rowcount == 1
            if record is not None:
                row = connection.execute(select(r).where(r.c.id == request_id)).first()
                record(connection, recorded, None if row is None else _request(row))
        return recorded

    def expire(self, request_id: str, now: float, waiting: QuestionStatus = QuestionStatus.PENDING) -> bool:
        """Close an unanswered question (`waiting`: its open status); False when a decision got in first.

        An `in_dialog` question is closed so whatever its client answered: the answer is its audit event."""
        if not is_question_id(request_id):
            return False
        r = db.consent_requests
        with storage_errors("a consent question could not be closed", log=log), self._engine.begin() as connection:
            result = connection.execute(
                update(r)
                .where(r.c.id == request_id, r.c.status == waiting)
                .values(status=QuestionStatus.EXPIRED, decided_at=now)
            )
        return result.rowcount == 1

    def fetch_unanswered(self) -> list[PendingRequest]:
        """Every `pending` question, expired ones included, for gateway/recovery.py to judge."""
        r = db.consent_requests
        with storage_errors("consent questions could not be read", log=None), self._read.connect() as connection:
            return [_request(row) for row in connection.execute(select(r).where(r.c.status == QuestionStatus.PENDING))]

    def abandon(self, request_id: str, now: float) -> bool:
        """Close a `pending` question whose gateway is gone as `abandoned`; False when it was decided or
        closed first (conditional, so of several sweeping gateways exactly one closes it)."""
        r = db.consent_requests
        with storage_errors("a consent question could not be closed", log=None), self._engine.begin() as connection:
            result = connection.execute(
                update(r)
                .where(r.c.id == request_id, r.c.status == QuestionStatus.PENDING)
                .values(status=QuestionStatus.ABANDONED, decided_at=now)
            )
        return result.rowcount == 1

    def reopen(self, request_id: str) -> None:
        """Undo `abandon` when its audit events could not be written, so that a later sweep closes it again."""
        r = db.consent_requests
        with storage_errors("a consent question could not be reopened", log=None), self._engine.begin() as connection:
            connection.execute(
                update(r)
                .where(r.c.id == request_id, r.c.status == QuestionStatus.ABANDONED)
                .values(status=QuestionStatus.PENDING, decided_at=None)
            )

    def purge_expired(self, now: float, keep_s: float = PURGE_KEEP_S) -> int:
        """Delete the questions that expired, or were decided or closed, more than `keep_s` ago; the count.

        Open questions stay, and so does the audit log (each decision is its own event there).
        """
        if not keep_s >= 0:
            raise ValueError("keep_s must be a number of seconds, at least 0")
        r = db.consent_requests
        before = now - keep_s
        with storage_errors("old consent questions could not be deleted", log=None), self._engine.begin() as connection:
            result = connection.execute(
                delete(r).where(
                    or_(r.c.expires_at <= before, and_(r.c.decided_at.is_not(None), r.c.decided_at <= before))
                )
            )
        return int(result.rowcount)


def _asker_not_gone(now: float) -> ColumnElement[bool]:
    """The question's gateway is not known to be gone: no session row (a gateway from before migration 0006,
    judged by the question's expiry alone), or one that is open with its lease ahead (gateway/liveness.py)."""
    r, s = db.consent_requests, db.gateway_sessions
    gone = select(s.c.session_id).where(
        s.c.session_id == r.c.session_id, or_(s.c.closed_at.is_not(None), s.c.alive_until <= now)
    )
    return ~gone.exists()


def is_question_id(text: str) -> bool:
    """Whether `text` can be a question's id: what the column holds, as it was stored."""
    return 0 < len(text) <= _ID_CHARS and storable(text) == text


def check_open_questions(
    open_count: int, max_open: int, first_expiry: float | None, now: float, lifetime_s: float | None = None
) -> None:
    """Raise ConsentDeniedError when a user with `open_count` open questions may not ask another.

    `retry_after_s` is when the first of them expires, at most `lifetime_s` (consent.timeout_s): a
    question another call stored while this one waited for the lock is younger than `now` says.
    """
    if open_count < max_open:
        return
    wait = (first_expiry if first_expiry is not None else now) - now
    if lifetime_s is not None:
        wait = min(wait, lifetime_s)
    retry = max(1, math.ceil(wait))
    raise ConsentDeniedError(
        Reason.CONSENT_QUESTIONS_LIMIT,
        f"{open_count} consent questions of this user already wait for an answer (at most {max_open}); "
        f"answer them or let them expire (the oldest in {retry} s), then call again",
        retry_after_s=retry,
    )


def _grant(row: object) -> Grant:
    m = row._mapping  # type: ignore[attr-defined]
    return Grant(
        id=m["id"],
        user=m["user_name"],
        workspace=m["workspace"],
        server_id=m["server_id"],
        tool_name=m["tool_name"],
        args_hash=m["args_hash"],
        decision=GrantDecision(m["decision"]),
        fingerprint=m["fingerprint"],
        granted_at=m["granted_at"],
        expires_at=m["expires_at"],
        granted_by=m["granted_by"],
        revoked_at=m["revoked_at"],
        channel=m["channel"],
        arguments=None if m["arguments"] is None else json.loads(m["arguments"]),
    )


def _request(row: object) -> PendingRequest:
    m = row._mapping  # type: ignore[attr-defined]
    return PendingRequest(
        id=m["id"],
        created_at=m["created_at"],
        expires_at=m["expires_at"],
        session_id=m["session_id"],
        user=m["user_name"],
        workspace=m["workspace"],
        server_id=m["server_id"],
        tool_name=m["tool_name"],
        args_hash=m["args_hash"],
        args_preview=m["args_preview"],
        risk_tier=m["risk_tier"],
        destructive=bool(m["destructive"]),
        status=m["status"],
        decision=m["decision"],
        decided_by=m["decided_by"],
        preview=m["preview"],
        choices=None if m["choices"] is None else tuple(c for c in m["choices"].split(",") if c),
        kind=m["kind"],
        run_id=m["run_id"],
    )
