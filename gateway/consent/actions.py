"""What a person does with consent, whichever front end they use (docs/consent.md, "One action, every front end").

Deciding a waiting question and revoking a stored decision are each written once, here: the row
and its audit event, with who acted and through which front end (`Actor`). A decision commits with
its event (`ConsentStore.decide`'s `record`): a gateway acts on a decision as soon as it reads it,
and by then the act is on record, before the run it allowed. The terminal approver,
the web console and `mcp-gateway consent revoke` call these, so every channel leaves the same
trail (decision 73).

A decision given to a question is the person's act, not the call's outcome: the gateway that
asked records the call's one `mcp.permission.decision` when it reads the answer, and the audit log
holds at most one such event per call (gateway/audit.py). The act is its own event, named by
the front end (`DECISION_EVENTS`), written whether or not it was the one that counted
(`detail.recorded`): of two approvers racing, both are on record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy import Connection

from gateway.audit import CHANGE_REVIEW, AuditLog, EventDraft, EventType
from gateway.clock import Clock
from gateway.consent.stage import Decision
from gateway.consent.store import Channel, ConsentStore, Grant, PendingRequest, QuestionKind


class ConsentStores(Protocol):
    """What a consent action writes to: the store and the audit log, at the clock's time
    (gateway/services.py `Stores` is one)."""

    @property
    def consent_store(self) -> ConsentStore: ...
    @property
    def audit(self) -> AuditLog: ...
    @property
    def clock(self) -> Clock: ...


@dataclass(frozen=True, slots=True)
class Actor:
    """Who acts, and through which front end."""

    name: str
    """As the question's `decided_by` and the events record it: `console:<user>`,
    `approvals:<user>@<host>` (gateway/approvals.py `approver_name`)."""
    channel: Channel


DECISION_EVENTS: Mapping[Channel, EventType] = {
    Channel.APPROVER: EventType.APPROVER_DECISION,
    Channel.CONSOLE: EventType.CONSOLE_DECISION,
}
"""The event a person's decision leaves, by the front end it was given through."""


def decide_question(stores: ConsentStores, question_id: str, decision: Decision, by: Actor) -> bool:
    """Record `by`'s decision on a `pending` question, and its event, in one transaction; False when it did not
    count (someone decided first, the question expired, or the gateway that asked is gone)."""
    event_type = DECISION_EVENTS.get(by.channel)
    if event_type is None:
        raise ValueError(f"{by.channel} is not a front end that decides questions")

    def act(recorded: bool, question: PendingRequest | None) -> EventDraft:
        review = question is not None and question.kind == QuestionKind.CHANGE_REVIEW and question.run_id is not None
        about = {"about": CHANGE_REVIEW, "question_id": question_id} if review else {}
        return EventDraft(
            event_type,
            # A call's question has its run's id; a change review names its run (decision 80).
            run_id=question.run_id if review and question is not None else question_id,
            user=question.user if question else None,
            workspace=question.workspace if question else None,
            tool_name=question.tool_name if question else None,
            args_hash=question.args_hash if question else None,
            detail={
                "decision": decision.value,
                "decided_by": by.name,
                "recorded": recorded,
                "channel": str(by.channel),
                **about,
            },
        )

    written: list[bool] = []

    def record(connection: Connection, recorded: bool, question: PendingRequest | None) -> None:
        stores.audit.append_within(connection, act(recorded, question))
        written.append(recorded)

    recorded = stores.consent_store.decide(question_id, decision.value, by.name, stores.clock.now(), record=record)
    if not written:  # an id no question can have: nothing was decided, and the attempt is on record
        stores.audit.append(act(False, None))
    return recorded


def revoke_grant(stores: ConsentStores, grant_id: int, by: Actor) -> Grant | None:
    """Revoke a stored decision and record `CONSENT_REVOKED`; None (and no event) when there is no such
    unrevoked decision."""
    revoked = stores.consent_store.revoke_grant(grant_id, stores.clock.now())
    if revoked is None:
        return None
    stores.audit.append(
        EventDraft(
            EventType.CONSENT_REVOKED,
            user=revoked.user,
            workspace=revoked.workspace,
            tool_name=revoked.tool_name,
            args_hash=revoked.args_hash,
            detail={
                "grant_id": revoked.id,
                "decision": revoked.decision,
                "revoked_by": by.name,
                "channel": str(by.channel),
            },
        )
    )
    return revoked
