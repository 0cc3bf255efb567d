"""The ordered stages of a tools/call (spec section 4): the only place that knows their order.

    1 audit MCP_TOOL_CALL   2 authenticate   3 authorize   4 policy   5 validate
    5b preflight (the run's paths reachable, issue 14)   6 budget   7 sandbox precondition
    8 consent   9 execute   10 audit + charge

The order is the tuple `STAGES`, walked by `Pipeline.call` (each stage's `step` or `run`) and by
`Pipeline.explain`, the dry run of `policy explain` (each stage's `dry`, which writes nothing):
the two cannot disagree on the order, and a stage's refusal is the same error in both. The
preflight, budget, sandbox and consent stages apply to write tools only. A tool's own behaviour comes from
its registry entry (gateway/tools/base.py): this module never names a tool.

The first stage that fails ends the call with its GatewayError, after the terminal audit
event (POLICY_BLOCKED before execution, TOOL_FINISHED after it) is committed, and after the
budget reservation taken at stage 6 is settled to what the call spent (`_settle`). The entry
event (1) is committed with that terminal event when the call is refused before any tool
runs, and on its own before a tool (read or write) does anything; no answer leaves before
its events are committed. If an audit event cannot be committed the call
fails closed with -32603 and nothing (more) runs. Database work runs on worker threads
(gateway/db/threads.py): consecutive steps (every stage that does not wait for a person or a
run) in one hop, with the refusal's events when one of them refuses.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from gateway.audit import Along, EventDraft, EventType
from gateway.auth import Principal
from gateway.budget import Usage, reservation_ms, spent_ms
from gateway.calls import Moved, Opened, outcome_content
from gateway.canonical import args_hash, is_text
from gateway.consent.grant_scope import workspace_spellings
from gateway.consent.stage import (
    OUT_OF_BAND,
    ConsentChannel,
    ConsentRequest,
    InputRequired,
    RoundTrip,
    consent_profile,
)
from gateway.db.threads import in_db_thread
from gateway.errors import (
    AuthRequiredError,
    ConsentDeniedError,
    GatewayError,
    InternalError,
    InvalidParamsError,
    Reason,
    SandboxViolationError,
    StorageUnavailableError,
)
from gateway.preflight import check_run_paths
from gateway.progress import NO_PROGRESS, CallProgress
from gateway.rbac import ADMIN_ROLE, require_permission
from gateway.runs import RunRecord, artifact_errors
from gateway.scope import Caller, CallScope, check_arguments, check_call, check_pins_intact
from gateway.services import Services
from gateway.start_failures import describe_start_failure, start_step
from gateway.tools.base import ExecutionRequest, Governance, ToolSpec
from gateway.tools.outcome import ToolOutcome
from gateway.tools.registry import TOOLS
from sandbox import RUN_GRACE_S
from sandbox.confine import LayerReport
from sandbox.diagnose import why_missing
from sandbox.errors import SandboxStartError
from sandbox.guarantees import Guarantee
from sandbox.limits import Backend
from sandbox.reachable import run_access

log = logging.getLogger("gateway.pipeline")


@dataclass(frozen=True, slots=True)
class CallRequest:
    tool_name: str
    arguments: Mapping[str, Any]
    token: object
    """`params.auth.token` exactly as received (possibly missing or not a string)."""
    progress: CallProgress = NO_PROGRESS
    """The caller's progress notifications, while the call waits for consent or its run."""


@dataclass(frozen=True, slots=True)
class Admitted:
    """A call that passed stages 2-5."""

    principal: Principal
    spec: ToolSpec
    scope: CallScope


@dataclass(frozen=True, slots=True)
class StageReport:
    """One stage of a dry run: passed (code None, with a note) or the refusal it would answer."""

    stage: str
    code: int | None
    reason: str | None
    note: str


def check_sandbox_ready(
    enabled: bool, missing: list[Guarantee], host: LayerReport | None = None, backend: Backend = "native"
) -> None:
    """Stage 7: a write tool runs only in a sandbox that is on and keeps every guarantee the policy requires (fail closed)."""
    if not enabled:
        raise SandboxViolationError(Reason.SANDBOX_DISABLED, "write tools need sandbox.enabled: true")
    if missing:
        causes = "; ".join(why_missing(g, host, backend) for g in missing) if host is not None else ""
        raise SandboxViolationError(
            Reason.SANDBOX_LAYER_MISSING,
            f"this host cannot keep the guarantees sandbox.require asks for: {', '.join(missing)}"
            + (f" ({causes})" if causes else "")
            + "; run `mcp-gateway doctor` for the fix of each, or leave them out of sandbox.require",
        )


def caller_of(principal: Principal) -> Caller:
    return Caller(principal.workspaces, principal.token_workspace, principal.role == ADMIN_ROLE)


STORED_NAME_MAX = 128
"""The audit log's tool_name column (String(128) in gateway/db/__init__.py)."""


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


def lookup_tool(name: str, tools: Mapping[str, ToolSpec] = TOOLS) -> ToolSpec:
    spec = tools.get(name)
    if spec is None:
        # Named as the log names it: a caller's 1 MB name is not echoed back whole.
        raise InvalidParamsError(Reason.UNKNOWN_TOOL, f"unknown tool {stored_tool_name(name)!r}")
    return spec


@dataclass(slots=True)
class _Walk:
    """One call going through the stages, or its dry run: what the stages learn and hand on."""

    tool_name: str
    arguments: Mapping[str, Any]
    trail: _Trail | None = None
    """The call's audit trail; None in a dry run."""
    token: object = None
    asker: ConsentChannel = OUT_OF_BAND
    progress: CallProgress = NO_PROGRESS
    user: str | None = None
    """A dry run's user (no token is involved)."""
    principal: Principal | None = None
    given: bool = False
    """A dry run for a role and workspace given on the command line: no user, no database read."""
    spec: ToolSpec | None = None
    scope: CallScope | None = None
    outcome: ToolOutcome | None = None

    @property
    def admitted(self) -> Admitted:
        if self.principal is None or self.spec is None or self.scope is None:
            raise InternalError(Reason.STAGE_ORDER, "a stage ran before the admission stages")
        return Admitted(self.principal, self.spec, self.scope)


_Step = Callable[["Pipeline", _Walk], None]
_Run = Callable[["Pipeline", _Walk], Awaitable[None]]
_Dry = Callable[["Pipeline", _Walk], "str | None"]


@dataclass(frozen=True, slots=True)
class Stage:
    """A stage: in a call its `step` or its `run`, in `explain` its `dry` (a note, None to leave the
    stage out, or the refusal raised). All raise the same GatewayError for the same inputs."""

    name: str
    dry: _Dry
    step: _Step | None = None
    """Synchronous work (a decision, database reads and writes): on a database thread, together
    with the synchronous stages next to it, so a call takes one thread hop for all of them."""
    run: _Run | None = None
    """Work that waits on the event loop (a person's answer, a run)."""
    writes_only: bool = False
    """Only write tools (`sandboxed`) go through it."""
    reads_only: bool = False
    """Only read tools go through it."""

    def __post_init__(self) -> None:
        if (self.step is None) == (self.run is None):
            raise ValueError(f"stage {self.name!r} needs exactly one of step and run")

    def applies(self, walk: _Walk) -> bool:
        if walk.spec is None:
            return True
        return not (self.writes_only and not walk.spec.sandboxed) and not (self.reads_only and walk.spec.sandboxed)


def _decision(name: str, check: _Step, writes_only: bool = False) -> Stage:
    """A stage that decides without I/O: the call and the dry run run the same check."""

    def dry(pipeline: Pipeline, walk: _Walk) -> str:
        check(pipeline, walk)
        return ""

    return Stage(name, dry, step=check, writes_only=writes_only)


class Pipeline:
    def __init__(self, services: Services) -> None:
        self.s = services

    def admit(self, principal: Principal, tool_name: str, arguments: Mapping[str, Any]) -> Admitted:
        """Stages 3-5 for an authenticated principal (the decisions alone, no audit)."""
        walk = _Walk(tool_name, arguments, principal=principal)
        for stage in ADMISSION:
            stage.dry(self, walk)
        return walk.admitted

    async def call(self, request: CallRequest, asker: ConsentChannel = OUT_OF_BAND) -> tuple[str, ToolOutcome]:
        """Run a call through every stage; return (run_id, outcome) or raise GatewayError with data.run_id."""
        run_id = self.s.new_run_id()
        try:
            hashed: str | None = args_hash(dict(request.arguments))
        except (ValueError, TypeError):  # NaN or a lone surrogate (the transport refuses both first)
            hashed = None
        name = stored_tool_name(request.tool_name)
        trail = _Trail(
            EventDraft(EventType.MCP_TOOL_CALL, run_id=run_id, tool_name=name, args_hash=hashed), request.arguments
        )
        # A 2026-07-28 retry that brings a consent answer continues its first round's card, once consent
        # has found the answer to be that round's: until then it writes none (`_card`).
        trail.card_waits = isinstance(asker, RoundTrip) and asker.action is not None and asker.state is not None
        walk = _Walk(request.tool_name, request.arguments, trail, request.token, asker, request.progress)
        try:
            return run_id, await self._stages(walk, trail)
        except GatewayError as exc:
            exc.data.setdefault("run_id", run_id)
            raise

    async def _stages(self, walk: _Walk, trail: _Trail) -> ToolOutcome:
        """Stages 2-10; every way out leaves its terminal event (or fails closed with -32603)."""
        run_id = str(trail.entry.run_id)
        try:
            if trail.entry.args_hash is None:
                raise InvalidParamsError(
                    Reason.UNHASHABLE_ARGUMENTS, "arguments must be JSON text (no NaN, no lone surrogates)"
                )
            position = 0
            while position < len(STAGES):
                stage = STAGES[position]
                if not stage.applies(walk):
                    position += 1
                elif stage.run is None:
                    position = await in_db_thread(self._steps, walk, trail, position)
                else:
                    trail.stage = stage.name
                    await stage.run(self, walk)
                    position += 1
            if walk.outcome is None:
                raise InternalError(Reason.STAGE_ORDER, "the stages ended without an outcome")
            return walk.outcome
        except InputRequired:
            # Nothing ran and the client will retry the call with its answer: that retry is the
            # attempt. This round gives its reservation back and ends without a code.
            await in_db_thread(self._give_back, trail)
            raise
        except GatewayError as exc:  # StorageUnavailableError included: `_refused` writes no event then
            if not trail.refusal_logged:
                exc.stage = trail.stage
                if trail.charge_id is not None or not _is_audit_failure(exc):  # else it has nothing to do:
                    await in_db_thread(self._refused, trail, exc)  # no second wait for a busy database
            raise
        except Exception as exc:
            log.exception("run %s: unexpected failure", run_id)
            error = InternalError(Reason.INTERNAL_ERROR, "the gateway failed")
            run_status = "failed" if trail.executing else None
            await in_db_thread(self._best_effort, trail, trail.refusal(error), run_status, "error", error)
            raise error from exc
        except anyio.get_cancelled_exc_class():
            # The client cancelled or went away; a running tool was killed by the runner.
            with anyio.CancelScope(shield=True), contextlib.suppress(StorageUnavailableError):
                run_status = "cancelled" if trail.executing else None
                await in_db_thread(self._best_effort, trail, trail.cancelled(), run_status, "cancelled", None)
            raise  # the cancellation, even when the database could not take its trail (logged)

    # --- the stages: each a `step` or a `run` for a call and a `dry` for explain ---------------

    def _steps(self, walk: _Walk, trail: _Trail, position: int) -> int:
        """On a database thread: the synchronous stages from `position` on, up to the next one of
        this call's that waits on the event loop (its position, returned; past the end when none is
        left). A refusal among them is logged here too: a call refused before consent, or a read
        tool's whole call, takes one thread hop."""
        try:
            for stage in STAGES[position:]:
                if stage.applies(walk):
                    if stage.step is None:
                        break
                    trail.stage = stage.name
                    stage.step(self, walk)
                position += 1
        except GatewayError as exc:
            exc.stage = trail.stage
            self._refused(trail, exc)
            trail.refusal_logged = True
            raise
        return position

    def _authenticate(self, walk: _Walk) -> None:
        walk.principal = self.s.authenticator.authenticate(walk.token)
        if walk.trail is not None:
            walk.trail.principal = walk.principal

    def _authenticate_dry(self, walk: _Walk) -> str:
        """The dry run has a user, not a token: the same user checks, from the database."""
        if walk.given:
            principal = _principal(walk)
            return f"role {principal.role} on workspace {', '.join(principal.workspaces)} (given; no user read)"
        record = self.s.users.fetch(str(walk.user))
        if record is None:
            raise AuthRequiredError(Reason.USER_UNKNOWN, f"no user {walk.user!r} in the gateway's database")
        if record.disabled:
            raise AuthRequiredError(Reason.USER_DISABLED, f"user {record.name!r} is disabled")
        walk.principal = Principal(record.name, record.role, record.workspaces, None, "explain")
        return f"user {record.name}, role {record.role}"

    def _authorize(self, walk: _Walk) -> None:
        walk.spec = lookup_tool(walk.tool_name, self.s.tools)
        require_permission(self.s.policy.roles, _principal(walk).role, walk.spec.permission)

    def _policy(self, walk: _Walk) -> None:
        walk.scope = check_call(self.s.policy, _spec(walk), walk.arguments, caller_of(_principal(walk)))
        if walk.trail is not None:
            walk.trail.workspace = walk.scope.workspace

    def _validate(self, walk: _Walk) -> None:
        check_arguments(_spec(walk), walk.arguments)

    def _preflight(self, walk: _Walk) -> None:
        """Before the budget and consent: every path the run needs is reachable by its uid (gateway/preflight.py)."""
        scope = walk.admitted.scope
        if not self.s.policy.sandbox.enabled or scope.pinned_root is None or scope.workspace is None:
            return  # stage 7 refuses (sandbox off), or a tool without a workspace: nothing to reach
        who = run_access(self.s.host.uid_drop)
        check_run_paths((scope.workspace, scope.pinned_root.path), tuple(p.path for p in scope.pinned_paths), who)

    def _reserve(self, walk: _Walk) -> None:
        trail = _trail(walk)
        trail.charge_id = self._logged_reservation(trail, walk.admitted)

    def _budget_dry(self, walk: _Walk) -> str:
        if walk.given:
            return "not checked: no user's usage without a database (--role)"
        self.s.budget.check(_principal(walk).name, self.s.policy.budget)
        return ""

    def _sandbox_ready(self, walk: _Walk) -> None:
        sandbox = self.s.policy.sandbox
        missing = self.s.host.missing(sandbox.backend, sandbox.required)
        check_sandbox_ready(sandbox.enabled, missing, self.s.host, sandbox.backend)

    async def _consent(self, walk: _Walk) -> None:
        admitted = walk.admitted
        trail = _trail(walk)
        asker = walk.asker
        if isinstance(asker, RoundTrip) and trail.card_waits:
            asker = dataclasses.replace(asker, on_question=trail.continue_card)
        try:
            await self.s.consent.require(self._consent_request(admitted, trail, walk.arguments), asker, walk.progress)
        finally:
            trail.card_waits = False  # the first round's card is this call's now, or it gets one of its own
        check_pins_intact(admitted.scope)  # a folder swapped while consent waited: stage 4's refusal

    def _consent_dry(self, walk: _Walk) -> str:
        if self.s.policy.consent.mode == "deny":
            raise ConsentDeniedError(
                Reason.CONSENT_MODE_DENY, "would deny unless a stored decision allows (consent.mode: deny)"
            )
        return "would use a stored decision, else ask a person (elicitation or `mcp-gateway approvals`)"

    async def _execute(self, walk: _Walk) -> None:
        admitted, trail = walk.admitted, _trail(walk)
        if admitted.spec.execute is None:
            raise InternalError(Reason.TOOL_NOT_IMPLEMENTED, admitted.spec.name)
        trail.executing, trail.started_at = True, self.s.clock.now()
        walk.outcome = await self._run(admitted, trail, walk.arguments, walk.progress)

    def _execute_read(self, walk: _Walk) -> None:
        walk.outcome = self._read(walk.admitted, _trail(walk), walk.arguments)

    def _execute_dry(self, walk: _Walk) -> str | None:
        return None if _spec(walk).sandboxed else "read tool, runs in process"

    # --- the dry run ---------------------------------------------------------------------------

    def explain(
        self, user: str | None, tool_name: str, arguments: Mapping[str, Any], *, given: Principal | None = None
    ) -> list[StageReport]:
        """Walk STAGES as a dry run for a user (no token): each stage's note, up to the first refusal.
        With `given` (a role and workspace, no user), nothing is read from the database. Writes nothing."""
        walk = _Walk(tool_name, arguments, user=user, principal=given, given=given is not None)
        reports: list[StageReport] = []
        for stage in STAGES:
            if not stage.applies(walk):
                continue
            try:
                note = stage.dry(self, walk)
            except GatewayError as exc:
                reports.append(StageReport(stage.name, exc.code, exc.reason, exc.public_message()))
                return reports
            if note is not None:
                reports.append(StageReport(stage.name, None, None, note))
        return reports

    # --- synchronous database work: `_stages` runs each on a database thread (gateway/db/threads.py),
    # never on the event loop ---------------------------------------------------------------------

    def _log(
        self,
        trail: _Trail,
        status: str | None,
        *events: EventDraft,
        error: GatewayError | None = None,
        outcome: ToolOutcome | None = None,
    ) -> None:
        """Commit the entry event (once, naming the caller when known) with `events`, in one transaction,
        and with them the call's card in `status` (gateway/calls.py; None: unchanged).

        Until something happens that the log must precede (a read, a reservation, a run), the
        entry waits, so a call refused at stages 2-5 costs one commit; the answer still leaves
        only after both events are committed.
        """
        pending = () if trail.entry_logged else (trail.entry_for_log(),)
        if pending or events:
            along = self._card(trail, status, error, outcome)
            self.s.audit.append(*pending, *events, along=along)
            trail.carded = trail.carded or bool(along)
        trail.entry_logged = True

    def _card(
        self, trail: _Trail, status: str | None, error: GatewayError | None = None, outcome: ToolOutcome | None = None
    ) -> tuple[Along, ...]:
        """The card's write for this step: its first row, or its move to `status`; none before a caller is known,
        nor while a retry's card waits for consent (`_Trail.card_waits`; a refusal before it opens one)."""
        if trail.principal is None or (status is None and trail.carded):
            return ()
        if trail.card_waits:
            if error is None:
                return ()
            trail.card_waits = False
        card = trail.card_id or str(trail.entry.run_id)
        now = self.s.clock.now()
        code = None if error is None else error.code
        reason = None if error is None else error.reason
        message = None if error is None else error.public_message()
        result = None if outcome is None else outcome_content(outcome)
        if outcome is not None and outcome.is_error:
            status = "error"
        if not trail.carded:
            return (
                Opened(
                    run_id=card,
                    user=trail.principal.name,
                    workspace=trail.workspace,
                    server_id=self.s.server_id,
                    tool_name=str(trail.entry.tool_name),
                    arguments=trail.arguments,
                    status=status or "pending",
                    now=now,
                    code=code,
                    reason=reason,
                    message=message,
                    result=result,
                    session_id=self.s.consent.session_id,
                ),
            )
        return (Moved(card, str(status), now, trail.workspace, code, reason, message, result),)

    def _logged_reservation(self, trail: _Trail, admitted: Admitted) -> int:
        """The entry committed (spec section 8: before anything is taken or runs), then the reservation."""
        self._log(trail, "pending")
        return self.s.budget.reserve(
            admitted.principal.name,
            str(trail.entry.run_id),
            self.s.policy.budget,
            reservation_ms(admitted.scope.timeout_s),
        )

    def _give_back(self, trail: _Trail) -> None:
        """An `input_required` round: its reservation is released and it ends without a code."""
        if trail.charge_id is not None:
            self.s.budget.release(trail.charge_id)
            trail.charge_id = None
        # The client answers in its retry of the call, which continues this card (`RoundTrip.state`):
        # until then it reads Cancelled, and stays so if the client never calls again.
        self._log(
            trail,
            "cancelled",
            trail.terminal(EventType.POLICY_BLOCKED, None, {"status": "input_required"}),
        )

    def _refused(self, trail: _Trail, exc: GatewayError) -> None:
        self._settle_best_effort(trail)
        if not _is_audit_failure(exc) and not trail.closed_by_sweep:
            self._log(trail, "error", trail.refusal(exc), error=exc)

    def _settle(self, trail: _Trail) -> None:
        """Set the call's budget reservation (its whole time limit) to what it spent, once.

        A finished run: its duration. A run stopped from outside (cancelled, the gateway failed):
        the time since it started, so cancelling is no way around the budget. Nothing ran: 0.
        """
        if trail.charge_id is None:
            return
        started_at = trail.started_at if trail.executing else None
        self.s.budget.settle(trail.charge_id, spent_ms(trail.run_ms, started_at, self.s.clock.now()))
        trail.charge_id = None

    def _settle_best_effort(self, trail: _Trail) -> None:
        """`_settle` while failing: if the database refuses, the reservation stays at the worst case (the safe side)."""
        try:
            self._settle(trail)
        except StorageUnavailableError:
            log.error("run %s: the budget reservation stays at the time limit (database error)", trail.entry.run_id)  # noqa: TRY400

    def _best_effort(
        self,
        trail: _Trail,
        event: EventDraft | None,
        run_status: str | None,
        card_status: str,
        error: GatewayError | None,
    ) -> None:
        """Leave what trail can still be left while failing; the caller's error is already decided."""
        self._settle_best_effort(trail)
        try:
            if run_status is not None:
                self.s.runs.finish(str(trail.entry.run_id), run_status, None)
            self._log(trail, card_status, *(() if event is None else (event,)), error=error)
        except GatewayError:
            log.error("run %s: could not record the terminal event", trail.entry.run_id)  # noqa: TRY400

    def _read(self, admitted: Admitted, trail: _Trail, arguments: Mapping[str, Any]) -> ToolOutcome:
        """A read tool, on a database thread (one hop for the whole of it): its entry committed first (spec
        section 8: before any tool runs), then it reads the runs table and the artifacts, then logs its end."""
        read = admitted.spec.read
        if read is None:
            raise InternalError(Reason.TOOL_NOT_IMPLEMENTED, admitted.spec.name)
        self._log(trail, "running")
        outcome = read(self.s.runs, arguments, admitted.scope.visible_workspaces)
        self._log(trail, "done", trail.terminal(EventType.TOOL_FINISHED, None, {"status": "ok"}), outcome=outcome)
        return outcome

    def _started(self, trail: _Trail, record: RunRecord, started: EventDraft) -> None:
        """The run's record (with its deadline) and TOOL_STARTED (the card: running), before anything runs."""
        self.s.runs.insert(record)
        self.s.audit.append(started, along=self._card(trail, "running"))

    def _finished(self, trail: _Trail, finished: EventDraft, outcome: ToolOutcome) -> None:
        self.s.audit.append(finished, along=self._card(trail, "done", outcome=outcome))

    def _ran(self, trail: _Trail, executed: EventDraft, user: str) -> Usage:
        """SANDBOX_EXEC, the reservation settled to the run's duration, and the user's usage after it."""
        self.s.audit.append(executed)
        self._settle(trail)
        return self.s.budget.usage(user, self.s.policy.budget)

    # --- a write tool's run --------------------------------------------------------------------

    def _consent_request(self, admitted: Admitted, trail: _Trail, arguments: Mapping[str, Any]) -> ConsentRequest:
        spec = admitted.spec
        risk, destructive, fingerprint = consent_profile(spec)
        return ConsentRequest(
            run_id=str(trail.entry.run_id),
            user=admitted.principal.name,
            workspace=admitted.scope.workspace or "",
            server_id=self.s.server_id,
            tool_name=spec.name,
            args_hash=str(trail.entry.args_hash),
            arguments=arguments,
            risk=risk,
            fingerprint=fingerprint,
            destructive=destructive,
            path_spellings=_path_spellings(spec.path_arguments, arguments, admitted.scope.root),
        )

    async def _run(
        self, admitted: Admitted, trail: _Trail, arguments: Mapping[str, Any], progress: CallProgress
    ) -> ToolOutcome:
        """Stages 9-10 for a write tool: its `execute`, then what the pipeline records of any run."""
        run_id, hashed = str(trail.entry.run_id), str(trail.entry.args_hash)
        principal, scope, spec = admitted.principal, admitted.scope, admitted.spec
        if scope.pinned_root is None or scope.workspace is None or spec.execute is None:
            raise InternalError(Reason.WORKSPACE_MISSING, "a write tool needs a workspace")
        now = self.s.clock.now()
        deadline = now + scope.timeout_s + RUN_GRACE_S  # past it the sandbox's watchdog has ended the run
        record = RunRecord(run_id, principal.name, scope.workspace, spec.name, now, "running", None, deadline)
        common: dict[str, Any] = {"run_id": run_id, "user": principal.name, "workspace": scope.workspace}
        started = EventDraft(EventType.TOOL_STARTED, tool_name=spec.name, args_hash=hashed, **common)
        await in_db_thread(self._started, trail, record, started)
        request = ExecutionRequest(
            run_id=run_id,
            root=scope.pinned_root,
            allowed_paths=scope.pinned_paths,
            arguments=arguments,
            policy=self.s.policy.sandbox,
            timeout_s=scope.timeout_s,
            run_dir=self.s.runs.folder(run_id),
            environ=self.s.environ,
            host=self.s.host,
            hidden=(self.s.settings.home,),
            progress=progress,
        )
        try:
            with artifact_errors(run_id):
                run = await spec.execute(request)
        except InternalError:
            await in_db_thread(self.s.runs.finish, run_id, "failed", None)
            raise
        except SandboxStartError as exc:
            trail.run_ms = 0  # nothing ran
            await in_db_thread(self.s.runs.finish, run_id, "failed_to_start", None)
            message = describe_start_failure(exc.reason)
            log.error("run %s: the sandbox could not start: %s", run_id, message)  # noqa: TRY400
            raise SandboxViolationError(Reason.SANDBOX_START_FAILED, message, step=start_step(exc.reason)) from exc
        trail.run_ms = run.duration_ms
        # How the run ended is recorded from the sandbox alone, before anything reads a file the
        # run produced (junit.xml, stdout.txt: untrusted data), so no content can hide it.
        executed = EventDraft(EventType.SANDBOX_EXEC, tool_name=spec.name, detail=run.sandbox_detail(), **common)
        usage = await in_db_thread(self._ran, trail, executed, principal.name)
        try:
            with artifact_errors(run_id):
                run.write_evidence(
                    Governance(
                        elapsed_ms_total=usage.elapsed_ms,
                        attempts_total=usage.attempts,
                        short_circuited=run.stopped,
                        policy_timeout_s=self.s.policy.sandbox.timeout_s,
                    )
                )
        except InternalError:
            await in_db_thread(self.s.runs.finish, run_id, "failed", run.exit_code)
            raise
        refusal = run.refusal()
        status = refusal.reason if refusal else run.status()
        if not await in_db_thread(self.s.runs.finish, run_id, status, run.exit_code):
            # Its end came so late that a sweep closed the run as abandoned, with its terminal event.
            log.warning("run %s: ended after a sweep had closed it as abandoned; its record stays so", run_id)
            trail.closed_by_sweep = True
        if refusal is not None:
            raise refusal
        # Reads the run's files (never raises on their content), off the event loop: a hostile 16 MiB
        # junit.xml costs seconds of parsing, which other calls of this session need not wait for.
        outcome = await anyio.to_thread.run_sync(run.read_outcome)
        finished = EventDraft(
            EventType.TOOL_FINISHED,
            tool_name=spec.name,
            args_hash=hashed,
            detail={"status": status, **run.finished_detail(outcome)},
            **common,
        )
        if not trail.closed_by_sweep:
            await in_db_thread(self._finished, trail, finished, outcome)
        return outcome


def _principal(walk: _Walk) -> Principal:
    if walk.principal is None:
        raise InternalError(Reason.STAGE_ORDER, "a stage needs the caller before authentication ran")
    return walk.principal


def _spec(walk: _Walk) -> ToolSpec:
    if walk.spec is None:
        raise InternalError(Reason.STAGE_ORDER, "a stage needs the tool before authorization ran")
    return walk.spec


def _trail(walk: _Walk) -> _Trail:
    if walk.trail is None:
        raise InternalError(Reason.STAGE_ORDER, "a stage that writes ran in a dry run")
    return walk.trail


ADMISSION: tuple[Stage, ...] = (
    _decision("authorize", Pipeline._authorize),
    _decision("policy", Pipeline._policy),
    _decision("validate", Pipeline._validate),
)
"""Stages 3-5: pure decisions on an authenticated caller (`Pipeline.admit`)."""

STAGES: tuple[Stage, ...] = (
    Stage("authenticate", Pipeline._authenticate_dry, step=Pipeline._authenticate),
    *ADMISSION,
    _decision("preflight", Pipeline._preflight, writes_only=True),
    Stage("budget", Pipeline._budget_dry, step=Pipeline._reserve, writes_only=True),
    _decision("sandbox", Pipeline._sandbox_ready, writes_only=True),
    Stage("consent", Pipeline._consent_dry, run=Pipeline._consent, writes_only=True),
    Stage("execute", Pipeline._execute_dry, step=Pipeline._execute_read, reads_only=True),
    Stage("execute", Pipeline._execute_dry, run=Pipeline._execute, writes_only=True),
)
"""The order of a tools/call's stages, for the call and its dry run alike (spec section 4). A read
tool's execution is a step (its database reads, on the thread its admission ran on); a write
tool's waits for its run."""


def _path_spellings(
    names: tuple[str, ...], arguments: Mapping[str, Any], root: Path | None
) -> dict[str, frozenset[str]]:
    """Each path argument as written and as it resolves in the workspace: what a stored Deny is compared with."""
    spellings: dict[str, frozenset[str]] = {}
    for name in names:
        value = arguments.get(name)
        written = root is not None and isinstance(value, str)
        spellings[name] = workspace_spellings(str(root), str(value)) if written else frozenset()
    return spellings


@dataclass(slots=True)
class _Trail:
    """What the call has learnt so far, for the terminal audit event."""

    entry: EventDraft
    arguments: Mapping[str, Any]
    principal: Principal | None = None
    workspace: str | None = None
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
    """The stage the call is in (STAGES' names)."""
    refusal_logged: bool = False
    """The refusal's terminal event is written (by `Pipeline._steps`, on the thread that refused)."""

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

    def refusal(self, exc: GatewayError) -> EventDraft:
        """POLICY_BLOCKED before the tool ran, TOOL_FINISHED with the code after."""
        if self.executing:
            return self.terminal(EventType.TOOL_FINISHED, exc.code, {"status": "error", "reason": exc.reason})
        return self.terminal(EventType.POLICY_BLOCKED, exc.code, {"blocked_reason": exc.reason})

    def cancelled(self) -> EventDraft:
        kind = EventType.TOOL_FINISHED if self.executing else EventType.POLICY_BLOCKED
        return self.terminal(kind, None, {"status": "cancelled"})


def _is_audit_failure(exc: GatewayError) -> bool:
    """The log itself failed: no further event can be written; the caller gets -32603."""
    return isinstance(exc, StorageUnavailableError)
