"""The ordered stages of a tools/call (spec section 4): the only place that knows their order.

    1 audit MCP_TOOL_CALL   2 authenticate   3 authorize   4 policy   5 validate
    6 budget   7 sandbox precondition   8 consent   9 execute   10 audit + charge

The first stage that fails ends the call with its GatewayError, after the terminal audit
event (POLICY_BLOCKED before execution, TOOL_FINISHED after it) is committed, and after the
budget reservation taken at stage 6 is settled to what the call spent (`_settle`). The entry
event (1) is committed with that terminal event when the call is refused before any tool
runs, and on its own before a tool (read or write) does anything; no answer leaves before
its events are committed. If an audit event cannot be committed the call
fails closed with -32603 and nothing (more) runs.
`explain` walks the same stages as a dry run for `policy explain`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from sqlalchemy.exc import SQLAlchemyError

from gateway.audit import EventDraft, EventType
from gateway.auth import Principal
from gateway.budget import Usage, reservation_ms, spent_ms
from gateway.canonical import args_hash, is_text
from gateway.consent import (
    ConsentAsker,
    ConsentRequest,
    InputRequired,
    RoundTrip,
    consent_profile,
)
from gateway.db_threads import in_db_thread
from gateway.errors import (
    AuthRequiredError,
    GatewayError,
    InternalError,
    InvalidParamsError,
    SandboxViolationError,
)
from gateway.grant_scope import workspace_spellings
from gateway.logs import log_database_failure
from gateway.rbac import ADMIN_ROLE, require_permission
from gateway.runs import RunRecord
from gateway.scope import Caller, CallScope, check_arguments, check_call, check_pins_intact
from gateway.services import Services
from gateway.tools import artifacts, run_pytest
from gateway.tools.outcome import ToolOutcome
from gateway.tools.registry import TOOLS, ToolSpec
from sandbox import RUN_GRACE_S, layers
from sandbox.errors import SandboxStartError

log = logging.getLogger("gateway.pipeline")


@dataclass(frozen=True, slots=True)
class CallRequest:
    tool_name: str
    arguments: Mapping[str, Any]
    token: object
    """`params.auth.token` exactly as received (possibly missing or not a string)."""


@dataclass(frozen=True, slots=True)
class Admitted:
    """A call that passed stages 2-5."""

    principal: Principal
    spec: ToolSpec
    scope: CallScope


def check_sandbox_ready(enabled: bool, missing_layers: list[str]) -> None:
    """Stage 7: a write tool runs only in a sandbox that is on and has every layer the policy requires (fail closed)."""
    if not enabled:
        raise SandboxViolationError("sandbox_disabled", "write tools need sandbox.enabled: true")
    if missing_layers:
        raise SandboxViolationError("sandbox_layer_missing", f"this host cannot enforce: {', '.join(missing_layers)}")


def caller_of(principal: Principal) -> Caller:
    return Caller(principal.workspaces, principal.token_workspace, principal.role == ADMIN_ROLE)


STORED_NAME_MAX = 128
"""The audit log's tool_name column (String(128) in gateway/db.py)."""


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


def lookup_tool(name: str) -> ToolSpec:
    spec = TOOLS.get(name)
    if spec is None:
        # Named as the log names it: a caller's 1 MB name is not echoed back whole.
        raise InvalidParamsError("unknown_tool", f"unknown tool {stored_tool_name(name)!r}")
    return spec


class Pipeline:
    def __init__(self, services: Services) -> None:
        self.s = services

    def admit(self, principal: Principal, tool_name: str, arguments: Mapping[str, Any]) -> Admitted:
        """Stages 3-5 for an authenticated principal."""
        spec = lookup_tool(tool_name)
        require_permission(self.s.policy.roles, principal.role, spec.permission)
        scope = check_call(self.s.policy, spec, arguments, caller_of(principal))
        check_arguments(spec, arguments)
        return Admitted(principal, spec, scope)

    async def call(
        self, request: CallRequest, asker: ConsentAsker | RoundTrip | None = None
    ) -> tuple[str, ToolOutcome]:
        """Run a call through every stage; return (run_id, outcome) or raise GatewayError with data.run_id."""
        run_id = self.s.new_run_id()
        try:
            hashed: str | None = args_hash(dict(request.arguments))
        except (ValueError, TypeError):  # NaN or a lone surrogate (the transport refuses both first)
            hashed = None
        name = stored_tool_name(request.tool_name)
        trail = _Trail(EventDraft(EventType.MCP_TOOL_CALL, run_id=run_id, tool_name=name, args_hash=hashed))
        try:
            return run_id, await self._stages(trail, request, asker)
        except GatewayError as exc:
            exc.data.setdefault("run_id", run_id)
            raise

    async def _stages(self, trail: _Trail, request: CallRequest, asker: ConsentAsker | RoundTrip | None) -> ToolOutcome:
        """Stages 2-10; every way out leaves its terminal event (or fails closed with -32603)."""
        run_id, hashed = str(trail.entry.run_id), str(trail.entry.args_hash)
        try:
            if trail.entry.args_hash is None:
                raise InvalidParamsError(
                    "unhashable_arguments", "arguments must be JSON text (no NaN, no lone surrogates)"
                )
            trail.principal = await in_db_thread(self.s.authenticator.authenticate, request.token)
            admitted = self.admit(trail.principal, request.tool_name, request.arguments)
            trail.workspace = admitted.scope.workspace
            await in_db_thread(self._log, trail)  # spec section 8: the entry is committed before any tool runs
            if not admitted.spec.sandboxed:
                return await in_db_thread(self._read, admitted, trail, request.arguments)
            trail.charge_id = await in_db_thread(
                self.s.budget.reserve,
                trail.principal.name,
                run_id,
                self.s.policy.budget,
                reservation_ms(admitted.scope.timeout_s),
            )
            check_sandbox_ready(self.s.policy.sandbox.enabled, layers().missing(self.s.policy.sandbox.required))
            await self._consent(admitted, run_id, hashed, request.arguments, asker)
            check_pins_intact(admitted.scope)  # a folder swapped while consent waited: stage 4's refusal
            trail.executing, trail.started_at = True, self.s.clock.now()
            return await self._execute(admitted, trail, request.arguments)
        except InputRequired:
            # Nothing ran and the client will retry the call with its answer: that retry is the
            # attempt. This round gives its reservation back and ends without a code.
            await in_db_thread(self._give_back, trail)
            raise
        except GatewayError as exc:
            await in_db_thread(self._refused, trail, exc)
            raise
        except SQLAlchemyError as exc:
            await in_db_thread(self._settle_best_effort, trail)
            log_database_failure(log, "the gateway's database failed (database_unavailable)", exc, run_id)
            raise InternalError("database_unavailable", "the gateway's database failed; nothing more ran") from exc
        except Exception as exc:
            log.exception("run %s: unexpected failure", run_id)
            error = InternalError("internal_error", "the gateway failed")
            run_status = "failed" if trail.executing else None
            await in_db_thread(self._best_effort, trail, trail.refusal(error), run_status)
            raise error from exc
        except anyio.get_cancelled_exc_class():
            # The client cancelled or went away; a running tool was killed by the runner.
            with anyio.CancelScope(shield=True):
                run_status = "cancelled" if trail.executing else None
                await in_db_thread(self._best_effort, trail, trail.cancelled(), run_status)
            raise

    # The methods below are synchronous database work: `_stages` runs each on a database thread
    # (gateway/db_threads.py), never on the event loop.

    def _give_back(self, trail: _Trail) -> None:
        """An `input_required` round: its reservation is released and it ends without a code."""
        if trail.charge_id is not None:
            self.s.budget.release(trail.charge_id)
            trail.charge_id = None
        self._log(trail, trail.terminal(EventType.POLICY_BLOCKED, None, {"status": "input_required"}))

    def _refused(self, trail: _Trail, exc: GatewayError) -> None:
        self._settle_best_effort(trail)
        if not _is_audit_failure(exc) and not trail.closed_by_sweep:
            self._log(trail, trail.refusal(exc))

    def _log(self, trail: _Trail, *events: EventDraft) -> None:
        """Commit the entry event (once, naming the caller when known) with `events`, in one transaction.

        Until something happens that the log must precede (a read, a reservation, a run), the
        entry waits, so a call refused at stages 2-5 costs one commit; the answer still leaves
        only after both events are committed.
        """
        pending = () if trail.entry_logged else (trail.entry_for_log(),)
        if pending or events:
            self.s.audit.append(*pending, *events)
        trail.entry_logged = True

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
        except SQLAlchemyError:
            log.error("run %s: the budget reservation stays at the time limit (database error)", trail.entry.run_id)  # noqa: TRY400

    def _best_effort(self, trail: _Trail, event: EventDraft | None, run_status: str | None = None) -> None:
        """Leave what trail can still be left while failing; the caller's error is already decided."""
        self._settle_best_effort(trail)
        try:
            if run_status is not None:
                self.s.runs.finish(str(trail.entry.run_id), run_status, None)
            self._log(trail, *(() if event is None else (event,)))
        except (GatewayError, SQLAlchemyError):
            log.error("run %s: could not record the terminal event", trail.entry.run_id)  # noqa: TRY400

    # --- stages ---------------------------------------------------------------------------

    def _read(self, admitted: Admitted, trail: _Trail, arguments: Mapping[str, Any]) -> ToolOutcome:
        """A read tool, on a database thread: it reads the runs table and the artifacts, then logs its end."""
        outcome = self._read_tool(admitted, arguments)
        self._log(trail, trail.terminal(EventType.TOOL_FINISHED, None, {"status": "ok"}))
        return outcome

    def _read_tool(self, admitted: Admitted, arguments: Mapping[str, Any]) -> ToolOutcome:
        visible = admitted.scope.visible_workspaces
        name = admitted.spec.name
        if name == "list_artifacts":
            return artifacts.list_artifacts(self.s.runs, arguments, visible)
        if name == "get_evidence":
            return artifacts.get_evidence(self.s.runs, arguments, visible)
        if name == "get_artifact_content":
            return artifacts.get_artifact_content(self.s.runs, arguments, visible)
        raise InternalError("tool_not_implemented", name)

    async def _consent(
        self,
        admitted: Admitted,
        run_id: str,
        hashed: str,
        arguments: Mapping[str, Any],
        asker: ConsentAsker | RoundTrip | None,
    ) -> None:
        spec = admitted.spec
        risk, destructive, fingerprint = consent_profile(spec)
        request = ConsentRequest(
            run_id=run_id,
            user=admitted.principal.name,
            workspace=admitted.scope.workspace or "",
            server_id=self.s.server_id,
            tool_name=spec.name,
            args_hash=hashed,
            arguments=arguments,
            risk=risk,
            fingerprint=fingerprint,
            destructive=destructive,
            path_spellings=_path_spellings(spec.path_arguments, arguments, admitted.scope.root),
        )
        await self.s.consent.require(request, asker)

    async def _execute(self, admitted: Admitted, trail: _Trail, arguments: Mapping[str, Any]) -> ToolOutcome:
        run_id, hashed = str(trail.entry.run_id), str(trail.entry.args_hash)
        principal, scope = admitted.principal, admitted.scope
        if scope.pinned_root is None or scope.workspace is None:
            raise InternalError("workspace_missing", "a write tool needs a workspace")
        now = self.s.clock.now()
        deadline = now + scope.timeout_s + RUN_GRACE_S  # past it the sandbox's watchdog has ended the run
        record = RunRecord(run_id, principal.name, scope.workspace, admitted.spec.name, now, "running", None, deadline)
        common: dict[str, Any] = {"run_id": run_id, "user": principal.name, "workspace": scope.workspace}
        started = EventDraft(EventType.TOOL_STARTED, tool_name=admitted.spec.name, args_hash=hashed, **common)
        await in_db_thread(self._started, record, started)
        try:
            run = await run_pytest.run(
                run_id=run_id,
                root=scope.pinned_root,
                allowed_paths=scope.pinned_paths,
                arguments=arguments,
                policy=self.s.policy.sandbox,
                timeout_s=scope.timeout_s,
                run_dir=self.s.runs.folder(run_id),
                environ=self.s.environ,
            )
        except SandboxStartError as exc:
            trail.run_ms = 0  # nothing ran
            await in_db_thread(self.s.runs.finish, run_id, "failed_to_start", None)
            raise SandboxViolationError("sandbox_start_failed", "the sandbox could not apply its layers") from exc
        result = run.result
        trail.run_ms = result.duration_ms
        # How the run ended is recorded from the RunResult alone, before anything reads a file the
        # run produced (junit.xml, stdout.txt: untrusted data), so no content can hide it.
        executed = EventDraft(
            EventType.SANDBOX_EXEC, tool_name=admitted.spec.name, detail=run_pytest.sandbox_summary(result), **common
        )
        usage = await in_db_thread(self._ran, trail, executed, principal.name)
        governance = run_pytest.Governance(
            elapsed_ms_total=usage.elapsed_ms,
            attempts_total=usage.attempts,
            short_circuited=result.killed_by is not None,
            policy_timeout_s=self.s.policy.sandbox.timeout_s,
        )
        run_pytest.write_evidence(self.s.runs.folder(run_id), governance, run.limits, result)
        refusal = run_pytest.refusal(result, scope.timeout_s, self.s.policy.sandbox)
        status = refusal.reason if refusal else ("error" if run_pytest.is_tool_error(result) else "ok")
        if not await in_db_thread(self.s.runs.finish, run_id, status, result.exit_code):
            # Its end came so late that a sweep closed the run as abandoned, with its terminal event.
            log.warning("run %s: ended after a sweep had closed it as abandoned; its record stays so", run_id)
            trail.closed_by_sweep = True
        if refusal is not None:
            raise refusal
        # Reads the run's files (never raises on their content), off the event loop: a hostile 16 MiB
        # junit.xml costs seconds of parsing, which other calls of this session need not wait for.
        outcome = await anyio.to_thread.run_sync(lambda: run.outcome)
        structured = dict(outcome.structured or {})
        finished = EventDraft(
            EventType.TOOL_FINISHED,
            tool_name=admitted.spec.name,
            args_hash=hashed,
            detail={"status": status, **{k: structured[k] for k in _COUNTS if k in structured}},
            **common,
        )
        if not trail.closed_by_sweep:
            await in_db_thread(self.s.audit.append, finished)
        return outcome

    def _started(self, record: RunRecord, started: EventDraft) -> None:
        """The run's record (with its deadline) and TOOL_STARTED, before anything runs."""
        self.s.runs.insert(record)
        self.s.audit.append(started)

    def _ran(self, trail: _Trail, executed: EventDraft, user: str) -> Usage:
        """SANDBOX_EXEC, the reservation settled to the run's duration, and the user's usage after it."""
        self.s.audit.append(executed)
        self._settle(trail)
        return self.s.budget.usage(user, self.s.policy.budget)

    # --- dry run ---------------------------------------------------------------------------

    def explain(self, user: str, tool_name: str, arguments: Mapping[str, Any]) -> list[StageReport]:
        """Walk the stages for a user (no token) without writing anything."""
        reports: list[StageReport] = []

        def passed(stage: str, note: str = "") -> None:
            reports.append(StageReport(stage, None, None, note))

        record = self.s.users.fetch(user)
        if record is None or record.disabled:
            reason = "user_unknown" if record is None else "user_disabled"
            reports.append(StageReport("authenticate", AuthRequiredError.code, reason, ""))
            return reports
        principal = Principal(record.name, record.role, record.workspaces, None, "explain")
        passed("authenticate", f"user {record.name}, role {record.role}")
        steps: list[tuple[str, Any]] = [
            (
                "authorize",
                lambda: require_permission(self.s.policy.roles, record.role, lookup_tool(tool_name).permission),
            ),
            (
                "policy",
                lambda: check_call(self.s.policy, lookup_tool(tool_name), arguments, caller_of(principal)),
            ),
            ("validate", lambda: check_arguments(lookup_tool(tool_name), arguments)),
        ]
        for stage, step in steps:
            try:
                step()
            except GatewayError as exc:
                reports.append(StageReport(stage, exc.code, exc.reason, exc.public_message()))
                return reports
            passed(stage)
        spec = lookup_tool(tool_name)
        if not spec.sandboxed:
            passed("execute", "read tool, runs in process")
            return reports
        try:
            self.s.budget.check(record.name, self.s.policy.budget)
        except GatewayError as exc:
            reports.append(StageReport("budget", exc.code, exc.reason, exc.public_message()))
            return reports
        passed("budget")
        try:
            check_sandbox_ready(self.s.policy.sandbox.enabled, layers().missing(self.s.policy.sandbox.required))
        except SandboxViolationError as exc:
            reports.append(StageReport("sandbox", exc.code, exc.reason, exc.public_message()))
            return reports
        passed("sandbox")
        mode = self.s.policy.consent.mode
        note = (
            "would use a stored decision, else ask a person (elicitation or `mcp-gateway approvals`)"
            if mode == "prompt"
            else "would deny unless a stored decision allows (consent.mode: deny)"
        )
        reports.append(StageReport("consent", None if mode == "prompt" else -32008, None, note))
        return reports


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
    principal: Principal | None = None
    workspace: str | None = None
    executing: bool = False
    entry_logged: bool = False
    charge_id: int | None = None
    """The budget reservation still to settle (None: none taken, or settled)."""
    started_at: float = 0.0
    run_ms: int | None = None
    """The run's own duration once it ended (0 when the sandbox could not start it)."""
    closed_by_sweep: bool = False
    """A sweep closed the run as abandoned (with its terminal event) before the call recorded its end."""

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
    return isinstance(exc, InternalError) and exc.reason in ("audit_unavailable", "database_unavailable")


@dataclass(frozen=True, slots=True)
class StageReport:
    stage: str
    code: int | None
    reason: str | None
    note: str


_COUNTS = ("passed", "failed", "errors", "skipped", "exit_code", "duration_ms")
