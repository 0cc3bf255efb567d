"""Stored consent decisions and the questions waiting for a person (spec section 7): the database side.

Grants are looked up with one indexed query per call (user, workspace, server, tool) and
chosen in `consent.pick_grant`, a pure function. A pending request is decided at most once:
the decision is a conditional UPDATE (`status = 'pending'` and not expired), so of several
approvers, and of an approver racing the gateway's own timeout, exactly one wins.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import Engine, and_, select, update

from gateway import db
from gateway.canonical import canonical_json

GrantDecision = Literal["ALLOW", "DENY"]


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
    """Who made it: `approver`, `elicitation` (the client, in band), `cli`; None: unknown (made before
    the gateway recorded it), read as in band."""
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
    status: str = "pending"
    preview: str | None = None
    """What the tool use would do, for the approver (a command, a diff, a URL); None: the arguments say it."""
    decision: str | None = None
    decided_by: str | None = None
    choices: tuple[str, ...] | None = None
    """The decisions the approver may give (consent.Decision values); None: those `destructive` allows."""


class ConsentStore:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._read = db.reader(engine)

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
        with self._read.connect() as connection:
            return [_grant(row) for row in connection.execute(query)]

    def insert_grant(self, grant: Grant) -> int:
        with self._engine.begin() as connection:
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
        with self._read.connect() as connection:
            return [_grant(row) for row in connection.execute(query)]

    def revoke_grant(self, grant_id: int, now: float) -> Grant | None:
        """Revoke one grant; None when there is no such unrevoked grant."""
        g = db.consent_grants
        with self._engine.begin() as connection:
            row = connection.execute(select(g).where(g.c.id == grant_id, g.c.revoked_at.is_(None))).first()
            if row is None:
                return None
            connection.execute(update(g).where(g.c.id == grant_id).values(revoked_at=now))
        return _grant(row)

    # --- pending requests -----------------------------------------------------------------------

    def insert_request(self, request: PendingRequest, status: str = "pending") -> None:
        """A question: `pending` waits for the approver; `awaiting_client` for a 2026-07-28 client's retry."""
        with self._engine.begin() as connection:
            connection.execute(
                db.consent_requests.insert().values(
                    id=request.id,
                    created_at=request.created_at,
                    expires_at=request.expires_at,
                    session_id=request.session_id,
                    user_name=request.user,
                    workspace=request.workspace,
                    server_id=request.server_id,
                    tool_name=request.tool_name,
                    args_hash=request.args_hash,
                    args_preview=request.args_preview,
                    preview=request.preview,
                    risk_tier=request.risk_tier,
                    destructive=request.destructive,
                    status=status,
                    choices=None if request.choices is None else ",".join(request.choices),
                )
            )

    def fetch_request(self, request_id: str) -> PendingRequest | None:
        r = db.consent_requests
        with self._read.connect() as connection:
            row = connection.execute(select(r).where(r.c.id == request_id)).first()
        return None if row is None else _request(row)

    def fetch_pending(self, now: float) -> list[PendingRequest]:
        """Open questions, oldest first."""
        r = db.consent_requests
        query = select(r).where(r.c.status == "pending", r.c.expires_at > now).order_by(r.c.created_at, r.c.id)
        with self._read.connect() as connection:
            return [_request(row) for row in connection.execute(query)]

    def decide(self, request_id: str, decision: str, decided_by: str, now: float, waiting: str = "pending") -> bool:
        """Record a person's decision; False when someone else decided first or the question expired."""
        r = db.consent_requests
        with self._engine.begin() as connection:
            result = connection.execute(
                update(r)
                .where(r.c.id == request_id, r.c.status == waiting, r.c.expires_at > now)
                .values(status="decided", decision=decision, decided_by=decided_by, decided_at=now)
            )
        return result.rowcount == 1

    def expire(self, request_id: str, now: float) -> bool:
        """Close an unanswered question; False when a decision got in first."""
        r = db.consent_requests
        with self._engine.begin() as connection:
            result = connection.execute(
                update(r).where(r.c.id == request_id, r.c.status == "pending").values(status="expired", decided_at=now)
            )
        return result.rowcount == 1


def _grant(row: object) -> Grant:
    m = row._mapping  # type: ignore[attr-defined]
    decision: GrantDecision = "DENY" if m["decision"] == "DENY" else "ALLOW"
    return Grant(
        id=m["id"],
        user=m["user_name"],
        workspace=m["workspace"],
        server_id=m["server_id"],
        tool_name=m["tool_name"],
        args_hash=m["args_hash"],
        decision=decision,
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
    )


def newest_first(grants: Sequence[Grant]) -> list[Grant]:
    return sorted(grants, key=lambda g: (g.granted_at, g.id), reverse=True)
