"""What a gateway closes for gateways that died or could not record an end (docs/operations.md; decisions 38, 50, 69).

At start, before serving (`close_abandoned_runs`), and every sweep period while serving
(`keep_sweeping`, its database work on a worker thread, never on the event loop), a gateway:

- renews its own lease in `gateway_sessions` (gateway/liveness.py `LeaseKeeper`, on a thread and a
  connection of its own: calls queued for the database never delay it);
- closes each run still `running` past its deadline (when every process of the run is dead: the
  sandbox's watchdog) as `abandoned`, with TOOL_FINISHED `{status: abandoned, reason}`: at once
  when its gateway is gone (`gateway_lost`); when its gateway is alive, or unknown, only once the
  finish grace has passed too, time enough for a live gateway to write the end itself
  (`end_not_recorded`: a database or disk failure lost it). Its budget charge stays what its
  gateway last recorded: the reservation, its whole time limit, unless the gateway settled it;
- closes each `pending` consent question whose gateway is gone (or, for a question with no session
  row, once its expiry and the grace have passed) as `abandoned`, with `mcp.permission.decision`
  (DENY_ONCE, `origin: no_answer`, `no_answer: gateway_lost`) and the call's POLICY_BLOCKED
  `{status: abandoned, reason: gateway_lost}`;
- closes each run whose gateway is known dead on this machine (pid identity) at once, whatever its
  deadline (its processes died with the gateway), charged what ran until the death was seen;
- closes each call a dead gateway left open (gateway/open_calls.py: in-band consent, the budget,
  the sandbox's start) with POLICY_BLOCKED (TOOL_FINISHED if its tool ran) `{status: abandoned,
  reason: gateway_lost}`, its card closed, nothing charged when nothing ran;
- removes the scratch folders of dead runs (sandbox/leftovers.py);
- while serving, also forgets sessions gone for a week and questions closed a day ago.

Each closure is a conditional UPDATE, so of several gateways sweeping at once exactly one closes
it and writes its events; if the events cannot be written the closure is undone for a later
sweep. Each is logged once on stderr. A sweep that fails never ends the gateway: the failure is
logged once (gateway/tick_failures.py) and the next period retries.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType
from typing import cast

import anyio
import anyio.to_thread
from sqlalchemy.exc import SQLAlchemyError

from gateway import db
from gateway.audit import CHANGE_REVIEW, EventDraft, EventType
from gateway.calls import CardStatus, Moved, OpenRow, delete_stale_open_rows, take_open_rows
from gateway.consent.stage import Answer, ConsentRequest, Decision, Origin, RiskTier, decision_event
from gateway.consent.store import Channel, ConsentStore, PendingRequest, QuestionKind, QuestionStatus
from gateway.db.errors import cause_name, storage_errors
from gateway.db.threads import in_db_thread
from gateway.errors import ConsentDeniedError, Reason, StorageUnavailableError
from gateway.liveness import (
    LeaseKeeper,
    ProcessIdentity,
    SessionRecord,
    SessionStore,
    StartTimeProbe,
    is_alive_here,
    is_dead_here,
    is_gone,
    start_time_of,
    this_process,
)
from gateway.open_calls import OpenCall, OpenCalls
from gateway.proxy import NetConnect, Outcome, RefusedFor
from gateway.runs import RunRecord, RunStatus
from gateway.services import Services, Stores
from gateway.tick_failures import FailureStreak
from sandbox.leftovers import kill_unheld_uids, sweep_scratch

log = logging.getLogger("gateway.recovery")

SWEEP_ENV = "MCP_GATEWAY_SWEEP_S"
"""Seconds between sweeps (and lease renewals) of a serving gateway; default DEFAULT_SWEEP_S."""
DEFAULT_SWEEP_S = 30.0
SESSION_KEEP_S = 7 * 86400.0
"""How long the row of a gateway gone is kept (what it left is closed long before)."""

GATEWAY_LOST = "gateway_lost"
END_NOT_RECORDED = "end_not_recorded"


@dataclass(frozen=True, slots=True)
class Pace:
    """The sweep period, and what follows from it."""

    period_s: float = DEFAULT_SWEEP_S

    @property
    def lease_s(self) -> float:
        """A gateway is gone once it has not renewed for this long: two missed sweeps, and a slow third."""
        return 3 * self.period_s

    @property
    def finish_grace_s(self) -> float:
        """How long after a run's deadline its live gateway still may write the end itself."""
        return 4 * self.period_s


def pace_from(environ: Mapping[str, str]) -> Pace:
    text = environ.get(SWEEP_ENV, "").strip()
    if not text:
        return Pace()
    try:
        period = float(text)
    except ValueError:
        period = 0.0
    if not 0 < period <= 3600:
        log.warning("%s must be seconds between 0 and 3600; using %s", SWEEP_ENV, DEFAULT_SWEEP_S)
        return Pace()
    return Pace(period)


def run_end_reason(
    run: RunRecord,
    owner: SessionRecord | None,
    now: float,
    pace: Pace,
    *,
    here: ProcessIdentity,
    probe: StartTimeProbe = start_time_of,
) -> str | None:
    """Why `run`'s record is to be closed now, or None while nobody may close it yet.

    At once when its gateway is known dead on this machine (pid identity): the run's processes
    died with it (the parent-death signals of sandbox/backends/pidns.py). Otherwise only past the
    deadline, when the sandbox's watchdog has ended every process of the run for sure.
    """
    if run.deadline is None:
        return None
    if owner is not None and is_dead_here(owner, here, probe):
        return GATEWAY_LOST
    if now <= run.deadline:
        return None
    if run.session_id is None or (owner is not None and is_gone(owner, now, here, probe)):
        return GATEWAY_LOST  # recorded before gateways had sessions, or its gateway is gone
    if now > run.deadline + pace.finish_grace_s:
        return END_NOT_RECORDED  # its gateway is alive (or unknown) and did not record the end in time
    return None


def is_orphaned(
    question: PendingRequest,
    owner: SessionRecord | None,
    now: float,
    pace: Pace,
    *,
    here: ProcessIdentity,
    probe: StartTimeProbe = start_time_of,
) -> bool:
    """Whether no gateway will act on `question`: its gateway is gone, or (no session known) it expired
    long enough ago that its gateway would have closed it."""
    if owner is not None:
        return is_gone(owner, now, here, probe)
    return question.expires_at + pace.finish_grace_s < now


@dataclass(frozen=True, slots=True)
class Swept:
    runs: list[str] = field(default_factory=list)
    questions: list[str] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)


def sweep_once(
    services: Stores,
    pace: Pace,
    here: ProcessIdentity | None = None,
    probe: StartTimeProbe = start_time_of,
) -> Swept:
    """Close what nobody will close: runs, questions and calls dead gateways left (synchronous database work).

    One closure that fails (a row no closure expected) does not keep the others from closing: the
    first failure is raised once all were tried, for the tick to log (gateway/tick_failures.py).
    """
    here = here or this_process()
    failed: list[Exception] = []

    def each(close: Callable[[], bool]) -> bool:
        try:
            return close()
        except Exception as exc:  # raised below, after the others
            failed.append(exc)
            return False

    now = services.clock.now()
    questions = services.consent_store
    running = services.runs.fetch_running()
    unanswered = questions.fetch_unanswered()
    owners = services.sessions.fetch(
        [r.session_id for r in running if r.session_id] + [q.session_id for q in unanswered]
    )
    swept = Swept()
    for run in running:
        owner = owners.get(run.session_id or "")
        reason = run_end_reason(run, owner, now, pace, here=here, probe=probe)
        died = owner is not None and is_dead_here(owner, here, probe)
        if reason is not None and each(partial(_close_run, services, run, reason, died=died)):
            swept.runs.append(run.run_id)
    for question in unanswered:
        owner = owners.get(question.session_id)
        if is_orphaned(question, owner, now, pace, here=here, probe=probe) and each(
            partial(_close_question, services, questions, question, owner, now)
        ):
            swept.questions.append(question.id)
    calls = OpenCalls(services.engine)
    left = calls.fetch()
    callers = services.sessions.fetch({c.session_id for c in left})
    for call in left:
        caller = callers.get(call.session_id)
        if (
            caller is not None
            and _is_dead(caller, now, here, probe)
            and each(partial(_close_call, services, calls, call))
        ):
            swept.calls.append(call.run_id)
    each(partial(_delete_stale_open_rows, services))
    if failed:
        raise failed[0]
    return swept


def _delete_stale_open_rows(services: Stores) -> bool:
    """Open-connection rows of cards that are no longer running (never shown; decision 102)."""
    with storage_errors("stale open connections could not be deleted", log=None):
        return bool(delete_stale_open_rows(services.engine))


def _is_dead(session: SessionRecord, now: float, here: ProcessIdentity, probe: StartTimeProbe) -> bool:
    """Whether `session`'s gateway will never end its calls: known dead here, or gone where pids cannot tell."""
    if is_alive_here(session, here, probe):
        return False  # its lease may have run out, but it is there and may still end them
    return is_gone(session, now, here, probe)


def remove_dead_scratch() -> None:
    """End what runs of dead gateways left on this host (sandbox/leftovers.py): the processes of run
    uids no gateway holds, then the scratch folders no gateway holds. No database work."""
    for uid, pids in kill_unheld_uids().items():
        log.warning("killed %d processes of run uid %d, which no gateway holds: its gateway died", len(pids), uid)
    for folder in sweep_scratch():
        log.warning("removed %s, the scratch folder of a run whose gateway died", folder)


def close_abandoned_runs(services: Services) -> list[str]:
    """The sweep at start, before serving; the ids of the runs it closed.

    The database's failures are the caller's to judge (gateway/cli/commands.py); anything else
    the sweep meets is logged and left to the sweeps while serving: it never keeps serve from starting.
    """
    pace = pace_from(services.environ)
    try:
        remove_dead_scratch()
    except Exception as exc:  # logged by the streak; a later sweep retries
        FailureStreak("the scratch folder sweep at start-up", pace.period_s).failed(exc)
    try:
        return sweep_once(services, pace).runs
    except (StorageUnavailableError, SQLAlchemyError):
        raise
    except Exception as exc:
        FailureStreak("the sweep at start-up", pace.period_s).failed(exc)
        return []


def _close_run(services: Stores, run: RunRecord, reason: str, *, died: bool) -> bool:
    if not services.runs.close(run.run_id):
        return False  # its gateway finished it, or another gateway closed it, first
    now = services.clock.now()
    finished = EventDraft(
        EventType.TOOL_FINISHED,
        run_id=run.run_id,
        user=run.user,
        workspace=run.workspace,
        tool_name=run.tool_name,
        detail={"status": RunStatus.ABANDONED, "reason": reason},
    )
    moved = Moved(run.run_id, CardStatus.ERROR, now, reason=reason, message=_RUN_ABANDONED)
    try:
        # The connections its card showed open when the gateway died: one NET_CONNECT each, before the run's
        # end, their rows deleted, in the end's transaction (decision 102).
        with (
            storage_errors("an abandoned run could not be closed", log=None, reason=Reason.AUDIT_UNAVAILABLE),
            services.engine.begin() as connection,
        ):
            lost = [_lost_connection(run, row, seen) for row, seen in take_open_rows(connection, run.run_id)]
            services.audit.append_within(connection, *lost, finished, along=[moved])
    except StorageUnavailableError:
        services.runs.reopen(run.run_id)
        log.error("run %s: could not record its closure (audit log unavailable); a later sweep retries", run.run_id)  # noqa: TRY400
        return False
    if died:
        # It ran until its gateway died, seen by now at the latest (a sweep period after): that is
        # charged, not the whole time limit. If the ledger fails (it logs why), the reservation stays.
        ran_until = min(services.clock.now(), run.deadline or run.created_at)
        with contextlib.suppress(StorageUnavailableError):
            services.budget.settle_lost(run.run_id, round((ran_until - run.created_at) * 1000))
    why = (
        "its gateway is gone"
        if reason == GATEWAY_LOST
        else "its gateway did not record the end (a database or disk failure)"
    )
    log.warning(
        "run %s (user %s, workspace %s) was still running past its deadline and %s: closed as abandoned",
        run.run_id,
        run.user,
        run.workspace,
        why,
    )
    return True


def _lost_connection(run: RunRecord, row: OpenRow, seen: float) -> EventDraft:
    """NET_CONNECT for a connection a dead gateway's run held open: what its card last showed of it (`seen`)."""
    record = NetConnect(
        host=row.host,
        port=row.port,
        method=row.method,
        decision=Outcome.ALLOWED,
        rule=row.rule,
        reason=RefusedFor.RUN_ABANDONED,
        address=row.address,
        bytes_up=row.bytes_up,
        bytes_down=row.bytes_down,
        duration_ms=max(0, round((seen - row.opened_at) * 1000)),
    )
    return EventDraft(
        EventType.NET_CONNECT,
        run_id=run.run_id,
        user=run.user,
        workspace=run.workspace,
        tool_name=run.tool_name,
        detail=record.detail(),
    )


def _close_question(
    services: Stores,
    questions: ConsentStore,
    question: PendingRequest,
    owner: SessionRecord | None,
    now: float,
) -> bool:
    if not questions.abandon(question.id, now):
        return False  # decided or closed first
    nobody = Answer(Decision.DENY_ONCE, Origin.NO_ANSWER, Channel.APPROVER, no_answer=GATEWAY_LOST)
    if question.kind == QuestionKind.CHANGE_REVIEW:
        return _close_review(services, questions, question, nobody)
    decided = decision_event(_asked(question), nobody, Reason.CONSENT_NO_ANSWER)
    blocked = {"status": "abandoned", "reason": GATEWAY_LOST}
    try:
        card = Moved(
            question.id,
            CardStatus.ERROR,
            now,
            code=ConsentDeniedError.code,
            reason=Reason.CONSENT_NO_ANSWER,
            message=_ASKER_GONE,
        )
        services.audit.append(
            decided, dataclasses.replace(decided, event_type=EventType.POLICY_BLOCKED, detail=blocked), along=[card]
        )
    except StorageUnavailableError:
        questions.reopen(question.id)
        log.error("consent question %s: could not record its closure (audit log unavailable)", question.id)  # noqa: TRY400
        return False
    # It waited for consent: nothing of it ran. If the ledger fails (it logs why), the reservation
    # stays at the worst case, the safe side.
    with contextlib.suppress(StorageUnavailableError):
        services.budget.settle_unrun(question.id)
    where = "unknown" if owner is None else f"{owner.identity.host} pid {owner.identity.pid}"
    log.warning(
        "consent question %s (user %s, tool %s) was asked by gateway session %s (%s), which is gone: closed as "
        "abandoned; nobody can answer it now",
        question.id,
        question.user,
        question.tool_name,
        question.session_id,
        where,
    )
    return True


def _close_review(services: Stores, questions: ConsentStore, question: PendingRequest, nobody: Answer) -> bool:
    """A change review (decision 80) whose gateway is gone: its decision, a deny nobody made, in its run's
    trail. Nothing was applied; the call's card and terminal event are the open call's closure (`_close_call`),
    and its budget was settled when the run ended."""
    if question.run_id is None:
        return True  # a review always names its run; one that does not has no trail to write in
    asked = dataclasses.replace(_asked(question), run_id=question.run_id)
    extra = {"about": CHANGE_REVIEW, "question_id": question.id}
    try:
        services.audit.append(decision_event(asked, nobody, Reason.CHANGES_DENIED, extra))
    except StorageUnavailableError:
        questions.reopen(question.id)
        log.error("change review %s: could not record its closure (audit log unavailable)", question.id)  # noqa: TRY400
        return False
    log.warning(
        "change review %s of run %s was asked by gateway session %s, which is gone: closed, nothing applied",
        question.id,
        question.run_id,
        question.session_id,
    )
    return True


_RUN_ABANDONED = "closed as abandoned: the gateway running it is gone, or could not record its end"
_CALL_ABANDONED = "closed as abandoned: the gateway handling this call died before it ended"
_ASKER_GONE = "closed as abandoned: the gateway that asked is gone; nobody can answer it now"
"""What a card closed by a sweep says (gateway/calls.py)."""


def _close_call(services: Stores, calls: OpenCalls, call: OpenCall) -> bool:
    """A call its dead gateway left open (waiting for consent in-band, the budget or the sandbox; or
    ended without its terminal event): its terminal event, its card closed, nothing charged if nothing ran."""
    if not calls.claim(call):
        return False
    executing = call.status in (CardStatus.RUNNING, CardStatus.REVIEWING)
    try:
        services.audit.append(
            EventDraft(
                EventType.TOOL_FINISHED if executing else EventType.POLICY_BLOCKED,
                run_id=call.run_id,
                user=call.user,
                workspace=call.workspace,
                tool_name=call.tool_name,
                detail={"status": "abandoned", "reason": GATEWAY_LOST},
            ),
            along=[
                Moved(call.run_id, CardStatus.ERROR, services.clock.now(), reason=GATEWAY_LOST, message=_CALL_ABANDONED)
            ],
        )
    except StorageUnavailableError:
        calls.reopen(call)
        log.error("call %s: could not record its closure (audit log unavailable); a later sweep retries", call.run_id)  # noqa: TRY400
        return False
    if not call.has_run:  # nothing ran; a run that ended had its charge settled then
        with contextlib.suppress(StorageUnavailableError):
            services.budget.settle_unrun(call.run_id)
    # A dialog its dead gateway had open in the client is over: its place under the user's cap of
    # open questions is given back now, not when the question would have expired.
    with contextlib.suppress(StorageUnavailableError):
        services.consent_store.expire(call.run_id, services.clock.now(), QuestionStatus.IN_DIALOG)
    log.warning(
        "call %s (user %s, tool %s) was left %s by gateway session %s, which died: closed as abandoned",
        call.run_id,
        call.user,
        call.tool_name,
        call.status,
        call.session_id,
    )
    return True


def _asked(question: PendingRequest) -> ConsentRequest:
    """The call an out-of-band question is about, as far as the question recorded it."""
    return ConsentRequest(
        run_id=question.id,  # an out-of-band question's id is its call's run_id
        user=question.user,
        workspace=question.workspace,
        server_id=question.server_id,
        tool_name=question.tool_name,
        args_hash=question.args_hash,
        arguments=MappingProxyType({}),  # not stored, and not needed to record the decision
        risk=cast(RiskTier, question.risk_tier),  # written from a RiskTier by ConsentStage
    )


async def keep_sweeping(services: Services, pace: Pace | None = None) -> None:
    """While serving: renew this gateway's lease and sweep, every period, until cancelled; then close
    the session (a clean stop). Database work runs on a worker thread: a call may block for seconds."""
    pace = pace or pace_from(services.environ)
    here = this_process()
    session = services.consent.session_id
    services.runs.owner = session
    sessions = services.sessions
    # The lease on a thread and a connection of its own, not in the database threads' queue (decision 67).
    keeper = LeaseKeeper(
        db.separate_engine(services.engine), session, here, services.clock, period_s=pace.period_s, lease_s=pace.lease_s
    )
    keeper.start()
    # No tick's failure ends the gateway (decision 68): each is logged once and retried.
    database = FailureStreak("the sweep", pace.period_s)
    scratch = FailureStreak("the scratch folder sweep", pace.period_s)
    try:
        while True:
            try:
                await in_db_thread(_tick, services, sessions, here, pace)
            except Exception as exc:  # cancellation is a BaseException: it passes
                database.failed(exc)
            else:
                database.worked()
            try:
                await anyio.to_thread.run_sync(remove_dead_scratch)
            except Exception as exc:
                scratch.failed(exc)
            else:
                scratch.worked()
            await anyio.sleep(pace.period_s)
    finally:
        keeper.stop()
        with anyio.CancelScope(shield=True):
            try:
                await in_db_thread(sessions.close, session, services.clock.now())
            except StorageUnavailableError as exc:
                log.warning("could not record this gateway's stop (%s); its lease runs out instead", cause_name(exc))
            except Exception:
                log.exception("could not record this gateway's stop; its lease runs out instead")


def _tick(services: Services, sessions: SessionStore, here: ProcessIdentity, pace: Pace) -> None:
    now = services.clock.now()
    sweep_once(services, pace, here)
    sessions.purge(now - SESSION_KEEP_S)
    services.consent_store.purge_expired(now)  # questions closed long ago (docs/operations.md)
