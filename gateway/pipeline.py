"""The ordered stages of a tools/call (docs/architecture.md, the call pipeline): the only place that knows their order.

    1 audit MCP_TOOL_CALL   2 authenticate   3 authorize   4 policy   5 validate
    5b preflight (the run's paths reachable by its uid)   6 budget   7 sandbox precondition
    8 consent   9 execute   10 audit + charge   10b a writing run's change set (`_changes`)

The order is the tuple `STAGES`, walked by `Pipeline.call` (each stage's `step` or `run`) and by
`Pipeline.explain`, the dry run of `policy explain` (each stage's `dry`, which writes nothing):
the two cannot disagree on the order, and a stage's refusal is the same error in both. The order
is also in the types: stages 2-5 (`ADMISSION`) go from nothing to a `Principal`, an `Authorized`
and an `Admitted`, and `Admission.then` accepts only a stage that takes what the one before it
decided; every later stage takes the `Admitted`. A stage that writes takes the call (`_Call`, with
its trail); a dry run has none (`_Dry`), so it cannot reach a write. The preflight, budget, sandbox
and consent stages apply to write tools and upstream tools only (`is_gated`: the gateway's own
in-process read tools are never asked, decision 86). A tool's own behaviour comes from its registry entry
(gateway/tools/base.py): this module never names a tool.

The first stage that fails ends the call with its GatewayError, after the terminal audit
event (POLICY_BLOCKED before execution, TOOL_FINISHED after it) is committed, and after the
budget reservation taken at stage 6 is settled to what the call spent (`_settle`). The entry
event (1) is committed with that terminal event when the call is refused before any tool
runs, and on its own before a tool (read or write) does anything; no answer leaves before
its events are committed. If an audit event cannot be committed the call
fails closed with -32603 and nothing (more) runs. Database work runs on worker threads
(gateway/db/threads.py): consecutive steps (every stage that does not wait for a person or a
run) in one hop, with the refusal's events when one of them refuses (`ROUTES`, decision 63). An
upstream server's tool takes one hop more, first: stages 2-4 as far as the policy alone decides them,
the budget's room and stage 7 (`_before_server`), so that a call they refuse starts no server and
waits for none. The
call's events and card are its `CallTrail` (gateway/call_trail.py). A declared `write` or `review`
tool's run leaves a change set: after SANDBOX_EXEC it is refused (over a cap), applied (`write`),
or put to a person first (`review`), and recorded as WORKSPACE_CHANGES before the terminal event
(decision 80).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

import anyio
from sqlalchemy import Connection, Engine

from gateway.audit import EventDraft, EventType
from gateway.auth import Principal
from gateway.budget import Usage, reservation_ms, settle_on, spent_ms
from gateway.call_trail import CallTrail, Recorder, flush_connections, forget_open, stored_tool_name
from gateway.calls import CardStatus
from gateway.canonical import args_hash
from gateway.consent.changes_view import changes_prompt
from gateway.consent.grant_scope import workspace_spellings
from gateway.consent.network import HostQuestions
from gateway.consent.stage import (
    OUT_OF_BAND,
    Answer,
    ConsentChannel,
    ConsentRequest,
    InputRequired,
    Origin,
    RoundTrip,
    consent_profile,
)
from gateway.consent.text import upstream_preview
from gateway.db.threads import in_db_thread
from gateway.egress_policy import Network, describe_network
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
from gateway.programs import check_program_unchanged
from gateway.progress import NO_PROGRESS, CallProgress
from gateway.proxy import ConnectionLog
from gateway.rbac import ADMIN_ROLE, require_permission
from gateway.runs import RunRecord, RunStatus, artifact_errors, finish_on
from gateway.scope import (
    Caller,
    CallScope,
    check_arguments,
    check_call,
    check_pins_intact,
    check_upstream_admissible,
)
from gateway.services import Services
from gateway.start_failures import describe_start_failure, describe_view_failure, start_step
from gateway.tools.base import Execute, ExecutionRequest, Governance, Relay, ToolRun, ToolSpec, Written
from gateway.tools.changes import (
    REVIEW_PROMPT_CHARS,
    apply_beneath,
    changes_detail,
    check_applied,
    check_writable,
    with_changes,
    write_artifacts,
)
from gateway.tools.outcome import ToolOutcome
from gateway.tools.registry import TOOLS
from gateway.upstream_policy import Upstream
from gateway.upstreams.servers import Catalogue, not_offered
from sandbox import RUN_GRACE_S
from sandbox.change_set import ChangeSet
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
    relay: Relay | None = None
    """The caller's client, for what an upstream server asks while the call is on (tools/base.py `Relay`)."""


@dataclass(frozen=True, slots=True)
class Authorized:
    """A call that passed stages 2-3: its caller may use this tool."""

    principal: Principal
    spec: ToolSpec


@dataclass(frozen=True, slots=True)
class Admitted:
    """A call that passed stages 2-5: who calls, which tool, and stage 4's decision (the workspace, its
    pinned paths, the time limit). Every stage after admission takes it."""

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


def lookup_tool(name: str, tools: Mapping[str, ToolSpec] = TOOLS) -> ToolSpec:
    spec = tools.get(name)
    if spec is None:
        refusal = not_offered(tools, name)  # an upstream's tool withheld, or its server unavailable
        if refusal is not None:
            raise refusal
        # Named as the log names it: a caller's 1 MB name is not echoed back whole.
        raise InvalidParamsError(Reason.UNKNOWN_TOOL, f"unknown tool {stored_tool_name(name)!r}")
    return spec


@dataclass(frozen=True, slots=True)
class _Call:
    """A call going through the stages: what it brought, and its trail (its events and card)."""

    tool_name: str
    arguments: Mapping[str, Any]
    trail: CallTrail
    token: object
    """`params.auth.token` exactly as received."""
    asker: ConsentChannel
    progress: CallProgress
    relay: Relay | None = None


@dataclass(frozen=True, slots=True)
class _Dry:
    """A dry run (`policy explain`): a user's name instead of a token, no trail; it writes nothing."""

    tool_name: str
    arguments: Mapping[str, Any]
    user: str | None
    given: Principal | None
    """A role and workspace given on the command line: no user, no database read."""


S = TypeVar("S")
T = TypeVar("T")
U = TypeVar("U")


@dataclass(frozen=True, slots=True)
class Check(Generic[S, T]):
    """A stage of admission (2-5): from what the stages before it decided (S) to what it decides (T),
    or the refusal raised. `step` in a call (on a database thread), `dry` in explain (with its note):
    both raise the same GatewayError for the same inputs."""

    name: str
    step: Callable[[Pipeline, _Call, S], T]
    dry: Callable[[Pipeline, _Dry, S], tuple[T, str]]


@dataclass(frozen=True, slots=True)
class Admission(Generic[S, T]):
    """Checks in order, from an S to a T: `then` takes only a check of what the last one decided,
    so stages in the wrong order do not type-check."""

    checks: tuple[Check[Any, Any], ...]

    def then(self, check: Check[T, U]) -> Admission[S, U]:
        return Admission((*self.checks, check))

    def then_all(self, rest: Admission[T, U]) -> Admission[S, U]:
        return Admission((*self.checks, *rest.checks))

    def step(self, pipeline: Pipeline, call: _Call, start: S) -> T:
        decided: Any = start
        for check in self.checks:
            call.trail.stage = check.name
            decided = check.step(pipeline, call, decided)
        return cast("T", decided)  # each check takes what the one before it returns (`then`)

    def dry(self, pipeline: Pipeline, dry: _Dry, start: S, reports: list[StageReport]) -> T:
        """Each check's note added to `reports`; a refusal raised with its stage (`GatewayError.stage`)."""
        decided: Any = start
        for check in self.checks:
            try:
                decided, note = check.dry(pipeline, dry, decided)
            except GatewayError as exc:
                exc.stage = check.name
                raise
            reports.append(StageReport(check.name, None, None, note))
        return cast("T", decided)  # as in `step`


def checks(first: Check[S, T]) -> Admission[S, T]:
    return Admission((first,))


def _decision(name: str, decide: Callable[[Pipeline, _Call | _Dry, S], T]) -> Check[S, T]:
    """A check without I/O: the call and the dry run run the same decision."""

    def dry(pipeline: Pipeline, walk: _Dry, decided: S) -> tuple[T, str]:
        return decide(pipeline, walk, decided), ""

    return Check(name, decide, dry)


def _gate(name: str, decide: Callable[[Pipeline, Admitted], None]) -> Step[None]:
    """A write tool's stage that decides without I/O: the call and the dry run run the same check."""

    def step(pipeline: Pipeline, _: _Call, admitted: Admitted) -> None:
        decide(pipeline, admitted)

    def dry(pipeline: Pipeline, _: _Dry, admitted: Admitted) -> str:
        decide(pipeline, admitted)
        return ""

    return Step(name, dry, step, writes_only=True)


_Note = Callable[["Pipeline", _Dry, Admitted], "str | None"]


@dataclass(frozen=True, slots=True)
class Step(Generic[T]):
    """A stage of an admitted call that does not wait (a decision, database reads and writes): on a
    database thread, together with the steps next to it, so a call takes one thread hop for all of them.
    `dry` in explain: a note (None: left out of the report), or the refusal raised."""

    name: str
    dry: _Note
    step: Callable[[Pipeline, _Call, Admitted], T]
    writes_only: bool = False
    """Only gated tools (`is_gated`: write tools and upstream tools) go through it."""
    reads_only: bool = False
    """Only read tools go through it."""


@dataclass(frozen=True, slots=True)
class Wait(Generic[T]):
    """A stage of an admitted call that waits on the event loop (a person's answer, a run)."""

    name: str
    dry: _Note
    run: Callable[[Pipeline, _Call, Admitted], Awaitable[T]]
    writes_only: bool = False
    reads_only: bool = False


_Gate = Step[None] | Wait[None]
"""A stage of an admitted call before its execution."""
_Execution = Step[ToolOutcome] | Wait[ToolOutcome]


@dataclass(frozen=True, slots=True)
class Route:
    """What an admitted call of one kind (a read or a write tool) goes through, grouped by thread
    hop (decision 63): `steps` on the database thread admission ran on, then each of `waits`, then
    `execute` (a step: in that same hop when nothing waits before it)."""

    steps: tuple[Step[None], ...]
    waits: tuple[Wait[None], ...]
    execute: _Execution

    @property
    def stages(self) -> tuple[_Gate | _Execution, ...]:
        return (*self.steps, *self.waits, self.execute)


def is_gated(spec: ToolSpec) -> bool:
    """Whether a call of `spec` passes the gates before it runs (preflight, budget, sandbox precondition,
    consent): every write tool, and every upstream MCP server's tool (`origin`), read-only or not, since
    its reads reach the workspace and beyond; a person is asked by its tier. Only the gateway's own
    in-process read tools (`read`, no origin: list_artifacts, get_evidence, get_artifact_content) skip
    them: they read nothing but the caller's own run records (decision 86). A gated tool runs by its
    `execute`; one without it is refused as not implemented, never run as a read."""
    return spec.sandboxed or spec.origin is not None


def _applies(stage: _Gate | _Execution, sandboxed: bool) -> bool:
    return not (stage.writes_only and not sandboxed) and not (stage.reads_only and sandboxed)


def route(gates: tuple[_Gate, ...], executions: tuple[_Execution, ...], sandboxed: bool) -> Route:
    """The stages after admission that a read (`sandboxed` False) or write tool goes through, in
    order: the steps before the first stage that waits, the waiting stages, then its one execution."""
    mine = [gate for gate in gates if _applies(gate, sandboxed)]
    steps = tuple(gate for gate in mine if isinstance(gate, Step))
    waits = tuple(gate for gate in mine if isinstance(gate, Wait))
    if mine != [*steps, *waits]:
        raise ValueError("a step after a stage that waits would need a thread hop of its own: not supported")
    execute = [execution for execution in executions if _applies(execution, sandboxed)]
    if len(execute) != 1:
        raise ValueError(f"a {'write' if sandboxed else 'read'} tool needs exactly one execution stage")
    return Route(steps, waits, execute[0])


class Pipeline:
    def __init__(self, services: Services) -> None:
        self.s = services
        self._recorder = Recorder(services.audit, services.clock, services.server_id, services.consent.session_id)

    def admit(self, principal: Principal, tool_name: str, arguments: Mapping[str, Any]) -> Admitted:
        """Stages 3-5 for an authenticated principal (the decisions alone, no audit)."""
        return DECISIONS.dry(self, _Dry(tool_name, arguments, None, principal), principal, [])

    async def call(self, request: CallRequest, asker: ConsentChannel = OUT_OF_BAND) -> tuple[str, ToolOutcome]:
        """Run a call through every stage; return (run_id, outcome) or raise GatewayError with data.run_id."""
        run_id = self.s.new_run_id()
        try:
            hashed: str | None = args_hash(dict(request.arguments))
        except (ValueError, TypeError):  # NaN or a lone surrogate (the transport refuses both first)
            hashed = None
        name = stored_tool_name(request.tool_name)
        entry = EventDraft(EventType.MCP_TOOL_CALL, run_id=run_id, tool_name=name, args_hash=hashed)
        trail = CallTrail(self._recorder, entry, request.arguments)
        # A 2026-07-28 retry that brings a consent answer continues its first round's card, once consent
        # has found the answer to be that round's: until then it writes none (`CallTrail.card`).
        trail.card_waits = isinstance(asker, RoundTrip) and asker.action is not None and asker.state is not None
        walk = _Call(request.tool_name, request.arguments, trail, request.token, asker, request.progress, request.relay)
        try:
            return run_id, await self._stages(walk)
        except GatewayError as exc:
            exc.data.setdefault("run_id", run_id)
            raise

    async def _stages(self, call: _Call) -> ToolOutcome:
        """Stages 2-10; every way out leaves its terminal event (or fails closed with -32603)."""
        trail = call.trail
        try:
            if trail.entry.args_hash is None:
                raise InvalidParamsError(
                    Reason.UNHASHABLE_ARGUMENTS, "arguments must be JSON text (no NaN, no lone surrogates)"
                )
            # An upstream's tool: its server started and listed first, for a caller the policy admits.
            tools = self.s.tools
            upstream = tools.servers.upstream_of(call.tool_name) if isinstance(tools, Catalogue) else None
            if isinstance(tools, Catalogue) and upstream is not None:
                await in_db_thread(self._before_server, call, upstream)
                await tools.servers.prepare(call.tool_name)
            decided = await in_db_thread(self._admitted, call)
            if isinstance(decided, ToolOutcome):
                return decided  # a read tool: its whole call was that hop
            stages = ROUTES[is_gated(decided.spec)]
            for stage in stages.waits:
                trail.stage = stage.name
                await stage.run(self, call, decided)
            trail.stage = stages.execute.name
            if isinstance(stages.execute, Wait):
                return await stages.execute.run(self, call, decided)
            return await in_db_thread(self._step_alone, call, decided, stages.execute)
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
            log.exception("run %s: unexpected failure", trail.run_id)
            error = InternalError(Reason.INTERNAL_ERROR, "the gateway failed")
            run_status = RunStatus.FAILED if trail.executing else None
            events = (*trail.connected(), trail.refusal(error))
            await in_db_thread(self._best_effort, trail, events, run_status, CardStatus.ERROR, error)
            raise error from exc
        except anyio.get_cancelled_exc_class():
            # The client cancelled or went away; a running tool was killed by the runner.
            with anyio.CancelScope(shield=True), contextlib.suppress(StorageUnavailableError):
                run_status = RunStatus.CANCELLED if trail.executing else None
                events = (*trail.connected(), trail.cancelled())
                await in_db_thread(self._best_effort, trail, events, run_status, CardStatus.CANCELLED, None)
            raise  # the cancellation, even when the database could not take its trail (logged)

    # --- the stages: each a `step` or a `run` for a call and a `dry` for explain ---------------

    def _admitted(self, call: _Call) -> Admitted | ToolOutcome:
        """On a database thread: admission, then the admitted call's steps up to its first stage that
        waits on the event loop (a read tool's execution included: then its outcome). A refusal among
        them is logged here too: a call refused before consent, or a read tool's whole call, takes
        one thread hop."""
        with self._refusal_logged(call.trail):
            admitted = ADMISSION.step(self, call, None)
            stages = ROUTES[is_gated(admitted.spec)]
            for stage in stages.steps:
                self._step(call, admitted, stage)
            if isinstance(stages.execute, Step) and not stages.waits:
                return self._step(call, admitted, stages.execute)
        return admitted

    def _step(self, call: _Call, admitted: Admitted, stage: Step[T]) -> T:
        call.trail.stage = stage.name
        return stage.step(self, call, admitted)

    def _step_alone(self, call: _Call, admitted: Admitted, stage: Step[T]) -> T:
        """On a database thread: a step after a stage that waited, in a hop of its own."""
        with self._refusal_logged(call.trail):
            return self._step(call, admitted, stage)

    @contextlib.contextmanager
    def _refusal_logged(self, trail: CallTrail) -> Iterator[None]:
        """A refusal on a database thread is logged on it, in the same hop."""
        try:
            yield
        except GatewayError as exc:
            exc.stage = trail.stage
            self._refused(trail, exc)
            trail.refusal_logged = True
            raise

    def _before_server(self, call: _Call, upstream: Upstream) -> None:
        """On a database thread, for an upstream's tool before its server is started or waited for: stages 2-4 as
        far as the policy alone decides them (the token, the upstream's permission, the allowlist, the served
        workspace, its program still the one pinned), the budget's room (read, not taken) and stage 7 (the
        sandbox on, and able to keep what the policy requires). A call they refuse is refused as the whole
        stages would refuse it, nothing charged, and starts no server nor waits for one; a call they pass
        goes through every stage once the server is up (a token revoked meanwhile is refused then)."""
        with self._refusal_logged(call.trail):
            call.trail.stage = AUTHENTICATE.name
            principal = self._authenticate(call, None)
            call.trail.stage = "authorize"
            require_permission(self.s.policy.roles, principal.role, upstream.permission)
            call.trail.stage = "policy"
            check_upstream_admissible(self.s.policy, call.tool_name, caller_of(principal))
            check_program_unchanged(upstream.program, f"upstreams.{upstream.name}")
            call.trail.stage = "budget"  # read only: the attempt is taken at stage 6, once the server is up
            self.s.budget.check(principal.name, self.s.policy.budget)
            call.trail.stage = "sandbox"  # the server runs confined or not at all: never started without it
            self._sandbox_ready(None)

    def _authenticate(self, call: _Call, _: None) -> Principal:
        call.trail.principal = self.s.authenticator.authenticate(call.token)
        return call.trail.principal

    def _authenticate_dry(self, dry: _Dry, _: None) -> tuple[Principal, str]:
        """The dry run has a user, not a token: the same user checks, from the database."""
        if dry.given is not None:
            given = dry.given
            return given, f"role {given.role} on workspace {', '.join(given.workspaces)} (given; no user read)"
        record = self.s.users.fetch(str(dry.user))
        if record is None:
            raise AuthRequiredError(Reason.USER_UNKNOWN, f"no user {dry.user!r} in the gateway's database")
        if record.disabled:
            raise AuthRequiredError(Reason.USER_DISABLED, f"user {record.name!r} is disabled")
        principal = Principal(record.name, record.role, record.workspaces, None, "explain")
        return principal, f"user {record.name}, role {record.role}"

    def _authorize(self, walk: _Call | _Dry, principal: Principal) -> Authorized:
        spec = lookup_tool(walk.tool_name, self.s.tools)
        require_permission(self.s.policy.roles, principal.role, spec.permission)
        return Authorized(principal, spec)

    def _policy(self, walk: _Call | _Dry, authorized: Authorized) -> Admitted:
        scope = check_call(self.s.policy, authorized.spec, walk.arguments, caller_of(authorized.principal))
        return Admitted(authorized.principal, authorized.spec, scope)

    def _policy_step(self, call: _Call, authorized: Authorized) -> Admitted:
        admitted = self._policy(call, authorized)
        call.trail.workspace = admitted.scope.workspace
        return admitted

    def _policy_dry(self, dry: _Dry, authorized: Authorized) -> tuple[Admitted, str]:
        return self._policy(dry, authorized), ""

    def _validate(self, walk: _Call | _Dry, admitted: Admitted) -> Admitted:
        check_arguments(admitted.spec, walk.arguments)
        return admitted

    def _preflight(self, admitted: Admitted) -> None:
        """Before the budget and consent: every path the run needs is reachable by its uid (gateway/preflight.py)."""
        scope = admitted.scope
        if not self.s.policy.sandbox.enabled or scope.pinned_root is None or scope.workspace is None:
            return  # stage 7 refuses (sandbox off), or a tool without a workspace: nothing to reach
        who = run_access(self.s.host.uid_drop)
        pinned = tuple(p.path for p in scope.pinned_paths)
        check_run_paths((scope.workspace, scope.pinned_root.path), pinned, who, admitted.spec.programs)

    def _reserve(self, call: _Call, admitted: Admitted) -> None:
        call.trail.charge_id = self._logged_reservation(call.trail, admitted)

    def _budget_dry(self, dry: _Dry, admitted: Admitted) -> str:
        if dry.given is not None:
            return "not checked: no user's usage without a database (--role)"
        self.s.budget.check(admitted.principal.name, self.s.policy.budget)
        return ""

    def _sandbox_ready(self, _: Admitted | None) -> None:
        sandbox = self.s.policy.sandbox
        missing = self.s.host.missing(sandbox.backend, sandbox.required)
        check_sandbox_ready(sandbox.enabled, missing, self.s.host, sandbox.backend)

    async def _consent(self, call: _Call, admitted: Admitted) -> None:
        trail, asker = call.trail, call.asker
        if isinstance(asker, RoundTrip) and trail.card_waits:
            asker = dataclasses.replace(asker, on_question=trail.continue_card)
        try:
            await self.s.consent.require(self._consent_request(admitted, trail, call.arguments), asker, call.progress)
        finally:
            trail.card_waits = False  # the first round's card is this call's now, or it gets one of its own
        check_pins_intact(admitted.scope)  # a folder swapped while consent waited: stage 4's refusal
        if admitted.spec.check_ready is not None:
            admitted.spec.check_ready()  # likewise a declared tool's program

    def _consent_dry(self, dry: _Dry, admitted: Admitted) -> str:
        if self.s.policy.consent.mode == "deny":
            raise ConsentDeniedError(
                Reason.CONSENT_MODE_DENY, "would deny unless a stored decision allows (consent.mode: deny)"
            )
        return "would use a stored decision, else ask a person (elicitation or `mcp-gateway approvals`)"

    async def _execute(self, call: _Call, admitted: Admitted) -> ToolOutcome:
        if admitted.spec.execute is None:
            raise InternalError(Reason.TOOL_NOT_IMPLEMENTED, admitted.spec.name)
        call.trail.executing, call.trail.started_at = True, self.s.clock.now()
        return await self._run(admitted, call.trail, call.arguments, call.progress, asker=call.asker, relay=call.relay)

    def _execute_read(self, call: _Call, admitted: Admitted) -> ToolOutcome:
        return self._read(admitted, call.trail, call.arguments)

    def _execute_dry(self, dry: _Dry, admitted: Admitted) -> str | None:
        spec, root = admitted.spec, admitted.scope.root
        note = spec.preview(dry.arguments, root) if spec.preview is not None and root is not None else None
        egress = self.s.policy.sandbox.egress
        if spec.sandboxed and spec.origin is None and egress is not None:  # an upstream's preview says its own
            reach = f"network: {describe_network(Network(rules=egress))}"
            note = reach if note is None else f"{note}; {reach}"
        if note is not None:
            return note
        return None if spec.sandboxed else "read tool, runs in process"

    # --- the dry run ---------------------------------------------------------------------------

    def explain(
        self, user: str | None, tool_name: str, arguments: Mapping[str, Any], *, given: Principal | None = None
    ) -> list[StageReport]:
        """Walk STAGES as a dry run for a user (no token): each stage's note, up to the first refusal.
        With `given` (a role and workspace, no user), nothing is read from the database. Writes nothing."""
        dry = _Dry(tool_name, arguments, user, given)
        reports: list[StageReport] = []
        try:
            admitted = ADMISSION.dry(self, dry, None, reports)
            for stage in ROUTES[is_gated(admitted.spec)].stages:
                try:
                    note = stage.dry(self, dry, admitted)
                except GatewayError as exc:
                    exc.stage = stage.name
                    raise
                if note is not None:
                    reports.append(StageReport(stage.name, None, None, note))
        except GatewayError as exc:
            reports.append(StageReport(str(exc.stage), exc.code, exc.reason, exc.public_message()))
        return reports

    # --- synchronous database work: on a database thread (gateway/db/threads.py), never on the event loop

    def _logged_reservation(self, trail: CallTrail, admitted: Admitted) -> int:
        """The entry committed (docs/architecture.md: before anything is taken or runs), then the reservation."""
        trail.log(CardStatus.PENDING)
        return self.s.budget.reserve(
            admitted.principal.name,
            str(trail.entry.run_id),
            self.s.policy.budget,
            reservation_ms(admitted.scope.timeout_s),
        )

    def _give_back(self, trail: CallTrail) -> None:
        """An `input_required` round: its reservation is released and it ends without a code."""
        if trail.charge_id is not None:
            self.s.budget.release(trail.charge_id)
            trail.charge_id = None
        # The client answers in its retry of the call, which continues this card (`RoundTrip.state`):
        # until then it reads Cancelled, and stays so if the client never calls again.
        trail.log(
            CardStatus.CANCELLED,
            trail.terminal(EventType.POLICY_BLOCKED, None, {"status": "input_required"}),
        )

    def _refused(self, trail: CallTrail, exc: GatewayError) -> None:
        self._settle_best_effort(trail)
        if not _is_audit_failure(exc) and not trail.closed_by_sweep:
            trail.log(CardStatus.ERROR, *trail.connected(), trail.refusal(exc), error=exc)

    def _settle(self, trail: CallTrail) -> None:
        """Set the call's budget reservation (its whole time limit) to what it spent, once.

        A finished run: its duration. A run stopped from outside (cancelled, the gateway failed):
        the time since it started, so cancelling is no way around the budget. Nothing ran: 0.
        """
        if trail.charge_id is None:
            return
        started_at = trail.started_at if trail.executing else None
        self.s.budget.settle(trail.charge_id, spent_ms(trail.run_ms, started_at, self.s.clock.now()))
        trail.charge_id = None

    def _settle_best_effort(self, trail: CallTrail) -> None:
        """`_settle` while failing: if the database refuses, the reservation stays at the worst case (the safe side)."""
        try:
            self._settle(trail)
        except StorageUnavailableError:
            log.error("run %s: the budget reservation stays at the time limit (database error)", trail.entry.run_id)  # noqa: TRY400

    def _best_effort(
        self,
        trail: CallTrail,
        events: tuple[EventDraft, ...],
        run_status: RunStatus | None,
        card_status: CardStatus,
        error: GatewayError | None,
    ) -> None:
        """Leave what trail can still be left while failing; the caller's error is already decided."""
        self._settle_best_effort(trail)
        try:
            if run_status is not None:
                self.s.runs.finish(str(trail.entry.run_id), run_status, None)
            trail.log(card_status, *events, error=error)
        except GatewayError:
            log.error("run %s: could not record the terminal event", trail.entry.run_id)  # noqa: TRY400

    def _read(self, admitted: Admitted, trail: CallTrail, arguments: Mapping[str, Any]) -> ToolOutcome:
        """A read tool, on a database thread (one hop for the whole of it): its entry committed first
        (docs/architecture.md: before any tool runs), then it reads the runs table and the artifacts, then
        logs its end."""
        read = admitted.spec.read
        if read is None:
            raise InternalError(Reason.TOOL_NOT_IMPLEMENTED, admitted.spec.name)
        trail.log(CardStatus.RUNNING)
        outcome = read(self.s.runs, arguments, admitted.scope.visible_workspaces)
        trail.log(CardStatus.DONE, trail.terminal(EventType.TOOL_FINISHED, None, {"status": "ok"}), outcome=outcome)
        return outcome

    def _started(self, trail: CallTrail, record: RunRecord, started: EventDraft) -> None:
        """The run's record (with its deadline), TOOL_STARTED and the card's move to running, in one transaction
        (decision 93), before anything runs."""
        trail.log_with(
            self.s.engine, CardStatus.RUNNING, lambda connection: self.s.runs.insert_on(connection, record), started
        )

    def _finished(self, trail: CallTrail, finished: EventDraft, outcome: ToolOutcome) -> None:
        self.s.audit.append(finished, along=trail.card(CardStatus.DONE, outcome=outcome))

    def _ran(
        self,
        trail: CallTrail,
        executed: EventDraft,
        user: str,
        *,
        status: str,
        exit_code: int | None,
        reviewing: bool = False,
        connected: tuple[EventDraft, ...] = (),
    ) -> Usage:
        """NET_CONNECT for each connection through the egress proxy, then SANDBOX_EXEC (the card `reviewing` when
        a person is to decide on the run's changes next), the reservation settled to the run's duration and the
        run's record closed with how it ended (`status`), and the user's usage after it read, in one transaction
        (decision 93). A record a sweep had closed as abandoned stays so (`closed_by_sweep`). The rows of the
        connections the card showed open go in the same transaction, the card moved with them (decision 102)."""
        charge, spent = trail.charge_id, spent_ms(trail.run_ms, trail.started_at, self.s.clock.now())
        ended: list[bool] = []
        usage: list[Usage] = []

        forget = forget_open(trail)

        def writes(connection: Connection) -> None:
            if forget is not None:
                forget(connection)
            if charge is not None:
                settle_on(connection, charge, spent)
            ended.append(finish_on(connection, trail.run_id, status, exit_code))
            usage.append(self.s.budget.usage_on(connection, user, self.s.policy.budget))  # no read connection more

        status_now = CardStatus.REVIEWING if reviewing else (CardStatus.RUNNING if forget is not None else None)
        trail.log_with(self.s.engine, status_now, writes, *connected, executed)
        trail.charge_id = None  # settled: committed with the event
        trail.closed_by_sweep = not ended[0]
        return usage[0]

    # --- a write tool's run --------------------------------------------------------------------

    def _consent_request(self, admitted: Admitted, trail: CallTrail, arguments: Mapping[str, Any]) -> ConsentRequest:
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
            preview=None
            if spec.origin is None
            else upstream_preview(spec.origin, spec.annotations, arguments, self.s.policy.consent.locale),
            path_spellings=_path_spellings(spec.path_arguments, arguments, admitted.scope.root),
        )

    def _host_questions(
        self, admitted: Admitted, trail: CallTrail, asker: ConsentChannel, progress: CallProgress
    ) -> HostQuestions | None:
        """Who the run's proxy asks about a host an `ask` rule names (decisions 90, 97): a person, through the
        call's channel; for an upstream's tool, its server's proxy asks it while this call is the one in flight."""
        origin = admitted.spec.origin
        upstream = None if origin is None else self.s.policy.upstreams.get(origin.upstream)
        egress = self.s.policy.sandbox.egress if origin is None else None if upstream is None else upstream.egress
        if egress is None or not egress.ask:
            return None
        return HostQuestions(
            stage=self.s.consent,
            channel=asker,
            run_id=trail.run_id,
            user=admitted.principal.name,
            workspace=admitted.scope.workspace or "",
            server_id=self.s.server_id,
            tool_name=admitted.spec.name,
            key="sandbox.network" if origin is None else f"upstreams.{origin.upstream}.network",
            new_id=self.s.new_run_id,
            progress=progress,
        )

    async def _run(
        self,
        admitted: Admitted,
        trail: CallTrail,
        arguments: Mapping[str, Any],
        progress: CallProgress,
        *,
        asker: ConsentChannel = OUT_OF_BAND,
        relay: Relay | None = None,
    ) -> ToolOutcome:
        """Stages 9-10 for a write tool: its `execute`, then what the pipeline records of any run."""
        run_id, hashed = str(trail.entry.run_id), str(trail.entry.args_hash)
        principal, scope, spec = admitted.principal, admitted.scope, admitted.spec
        if scope.pinned_root is None or scope.workspace is None or spec.execute is None:
            raise InternalError(Reason.WORKSPACE_MISSING, "a write tool needs a workspace")
        now = self.s.clock.now()
        deadline = now + scope.timeout_s + RUN_GRACE_S  # past it the sandbox's watchdog has ended the run
        record = RunRecord(run_id, principal.name, scope.workspace, spec.name, now, RunStatus.RUNNING, None, deadline)
        common: dict[str, Any] = {"run_id": run_id, "user": principal.name, "workspace": scope.workspace}
        started = EventDraft(EventType.TOOL_STARTED, tool_name=spec.name, args_hash=hashed, **common)
        await in_db_thread(self._started, trail, record, started)
        trail.connections = ConnectionLog()
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
            relay=relay,
            connections=trail.connections,
            ask_host=self._host_questions(admitted, trail, asker, progress),
        )
        try:
            with artifact_errors(run_id):
                run = await self._executed(spec.execute, request, trail, self.s.engine)
        except GatewayError:  # -32603, or a tool's own refusal before it spawned anything: nothing ran
            await in_db_thread(self.s.runs.finish, run_id, RunStatus.FAILED, None)
            raise
        except SandboxStartError as exc:
            trail.run_ms = 0  # nothing ran
            await in_db_thread(self.s.runs.finish, run_id, RunStatus.FAILED_TO_START, None)
            raise start_refusal(run_id, exc) from exc
        trail.run_ms = run.duration_ms
        # How the run ended is recorded from the sandbox alone, before anything reads a file the
        # run produced (junit.xml, stdout.txt: untrusted data), so no content can hide it.
        executed = EventDraft(spec.execution_event, tool_name=spec.name, detail=run.sandbox_detail(), **common)
        written = run.written()
        refusal = run.refusal()
        status = refusal.reason if refusal else run.status()
        reviewing = written is not None and written.review and refusal is None
        usage = await in_db_thread(
            self._ran,
            trail,
            executed,
            principal.name,
            status=status,
            exit_code=run.exit_code,
            reviewing=reviewing,
            connected=trail.connected(),
        )
        if trail.closed_by_sweep:
            # Its end came so late that a sweep closed the run as abandoned, with its terminal event.
            log.warning("run %s: ended after a sweep had closed it as abandoned; its record stays so", run_id)
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
            await in_db_thread(self.s.runs.finish, run_id, RunStatus.FAILED, run.exit_code)
            raise
        if refusal is not None:
            raise refusal
        settled = (
            None
            if written is None
            else await self._changes(admitted, trail, written, request, asker=asker, progress=progress)
        )
        # Reads the run's files (never raises on their content), off the event loop: a hostile 16 MiB
        # junit.xml costs seconds of parsing, which other calls of this session need not wait for. An
        # answer already in memory (an upstream's, under its cap) is shaped here, without the hop.
        outcome = run.read_outcome() if run.outcome_in_memory else await anyio.to_thread.run_sync(run.read_outcome)
        if settled is not None:
            outcome = with_changes(outcome, settled[0], settled[1], run_id)
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

    @staticmethod
    async def _executed(execute: Execute, request: ExecutionRequest, trail: CallTrail, engine: Engine) -> ToolRun:
        """`execute(request)`, the run's connections written as they end beside it (decision 98). A write that
        fails ends the run (cancelled: the runner kills it) and is raised, as any other write of the trail; the
        writer ends with the run, its last write (shielded) committed first."""
        ran: list[ToolRun] = []
        raised: list[Exception] = []
        writer = anyio.CancelScope()
        async with anyio.create_task_group() as group:

            async def flushing() -> None:
                with writer:
                    try:
                        await flush_connections(trail, engine)
                    except Exception as exc:
                        raised.append(exc)
                        group.cancel_scope.cancel()  # the run too

            group.start_soon(flushing)
            try:
                ran.append(await execute(request))
            except Exception as exc:  # raised after the group, as itself: never wrapped in a group
                raised.append(exc)
            finally:
                writer.cancel()  # the writer alone: the run's end is not cancelled with it
        if raised:
            raise raised[0]
        return ran[0]

    async def _changes(
        self,
        admitted: Admitted,
        trail: CallTrail,
        written: Written,
        request: ExecutionRequest,
        *,
        asker: ConsentChannel,
        progress: CallProgress,
    ) -> tuple[ChangeSet, bool]:
        """After SANDBOX_EXEC, a writing run's change set (decision 80): refused whole when it cannot be
        acted on, before anyone is asked; else its artifacts written, then applied at once (`write`) or
        after a person's Allow once (`review`), beneath the pinned workspace; WORKSPACE_CHANGES recorded
        either way. Returns the set and whether it was applied, or raises the refusal."""
        trail.stage = "changes"
        sandbox, root = self.s.policy.sandbox, request.root

        async def logged(changes: ChangeSet, decided_by: str, reason: str | None, *, applied: bool = False) -> None:
            await in_db_thread(
                self._changes_logged, trail, admitted, changes, applied=applied, decided_by=decided_by, reason=reason
            )

        if written.changes is not None:  # a set over a cap too: its patch says so and lists it so far
            with artifact_errors(request.run_id):  # a full disk: -32603, nothing asked or applied
                await anyio.to_thread.run_sync(write_artifacts, written.changes, request.run_dir)
        try:
            changes = check_writable(written, sandbox)
        except SandboxViolationError as exc:
            await logged(written.changes or ChangeSet((), ()), "policy", exc.reason)
            raise
        if not changes.changes:
            await logged(changes, "policy", None)
            return changes, False
        decided_by = "policy"
        if written.review:
            consent = self._consent_request(admitted, trail, request.arguments)
            prompt = await anyio.to_thread.run_sync(
                changes_prompt, request.run_dir, admitted.spec.name, REVIEW_PROMPT_CHARS
            )
            try:
                answer = await self.s.consent.review_changes(consent, prompt, asker, progress)
            except ConsentDeniedError as exc:  # consent_questions_limit: nobody could be asked
                await logged(changes, "policy", exc.reason)
                raise
            except anyio.get_cancelled_exc_class():  # the set is recorded, not applied; then the call ends
                with anyio.CancelScope(shield=True), contextlib.suppress(StorageUnavailableError):
                    await logged(changes, "nobody", "cancelled")
                raise
            decided_by = who_decided(answer, consent.user)
            if not answer.decision.allows:
                await logged(changes, decided_by, Reason.CHANGES_DENIED)
                raise ConsentDeniedError(
                    Reason.CHANGES_DENIED,
                    "a person did not allow the run's changes (denied, or no answer in time); nothing was applied."
                    " The patch stays in the run's artifacts as changes.patch",
                )
        # Once applying starts, what it did is recorded whatever happens to the call: a cancellation
        # waits for WORKSPACE_CHANGES, so no change reaches the workspace without its event.
        with anyio.CancelScope(shield=True):
            result = await anyio.to_thread.run_sync(apply_beneath, root, changes, sandbox.protected_paths)
            await logged(changes, decided_by, None if result.applied else result.reason, applied=result.applied)
        check_applied(result)
        return changes, True

    def _changes_logged(
        self,
        trail: CallTrail,
        admitted: Admitted,
        changes: ChangeSet,
        *,
        applied: bool,
        decided_by: str,
        reason: str | None = None,
    ) -> None:
        detail = {"run_id": str(trail.entry.run_id), **changes_detail(changes, applied, decided_by, reason)}
        self.s.audit.append(
            EventDraft(
                EventType.WORKSPACE_CHANGES,
                run_id=str(trail.entry.run_id),
                user=admitted.principal.name,
                workspace=admitted.scope.workspace,
                tool_name=admitted.spec.name,
                detail=detail,
            )
        )


AUTHENTICATE: Check[None, Principal] = Check("authenticate", Pipeline._authenticate, Pipeline._authenticate_dry)
DECISIONS: Admission[Principal, Admitted] = (
    checks(_decision("authorize", Pipeline._authorize))
    .then(Check("policy", Pipeline._policy_step, Pipeline._policy_dry))
    .then(_decision("validate", Pipeline._validate))
)
"""Stages 3-5: decisions on an authenticated caller (`Pipeline.admit`)."""
ADMISSION: Admission[None, Admitted] = checks(AUTHENTICATE).then_all(DECISIONS)
"""Stages 2-5: from a token to an `Admitted` call."""

GATES: tuple[_Gate, ...] = (
    _gate("preflight", Pipeline._preflight),
    Step("budget", Pipeline._budget_dry, Pipeline._reserve, writes_only=True),
    _gate("sandbox", Pipeline._sandbox_ready),
    Wait("consent", Pipeline._consent_dry, Pipeline._consent, writes_only=True),
)
"""Stages 5b-8: what an admitted write tool passes before it runs."""
EXECUTIONS: tuple[_Execution, ...] = (
    Step("execute", Pipeline._execute_dry, Pipeline._execute_read, reads_only=True),
    Wait("execute", Pipeline._execute_dry, Pipeline._execute, writes_only=True),
)
STAGES: tuple[Check[Any, Any] | _Gate | _Execution, ...] = (*ADMISSION.checks, *GATES, *EXECUTIONS)
"""The order of a tools/call's stages, for the call and its dry run alike (docs/architecture.md). A read
tool's execution is a step (its database reads, on the thread its admission ran on); a write
tool's waits for its run."""

ROUTES: Mapping[bool, Route] = {sandboxed: route(GATES, EXECUTIONS, sandboxed) for sandboxed in (False, True)}
"""The hop batching (decision 63), built once: for an in-process read tool (False) and a gated tool (True:
a write or upstream tool, `is_gated`), the stages after admission grouped as they run: the steps on
admission's database thread (a read tool's execution among them), then each stage that waits on the
event loop."""


def who_decided(answer: Answer, user: str) -> str:
    """WORKSPACE_CHANGES's `decided_by` for a review: the channel and who (the approver's name, or the
    client's user), or why nobody did (`timeout`, `no_answer`, `policy`)."""
    if answer.decided_by:
        return f"{answer.channel}:{answer.decided_by}"
    if answer.origin is Origin.USER_PROMPT:
        return f"{answer.channel}:{user}"
    return f"{answer.channel}:{answer.origin}"


def start_refusal(run_id: str, exc: SandboxStartError) -> SandboxViolationError:
    """-32006 for a run that could not start, logged: a writing run's copy that could not be made under its own
    reason (decision 80), any other step as `sandbox_start_failed` with `data.step`."""
    view = describe_view_failure(exc.reason)
    if view is not None:
        log.error("run %s: no writable copy of the workspace: %s", run_id, view)
        return SandboxViolationError(Reason(start_step(exc.reason)), view)
    message = describe_start_failure(exc.reason)
    log.error("run %s: the sandbox could not start: %s", run_id, message)
    return SandboxViolationError(Reason.SANDBOX_START_FAILED, message, step=start_step(exc.reason))


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


def _is_audit_failure(exc: GatewayError) -> bool:
    """The log itself failed: no further event can be written; the caller gets -32603."""
    return isinstance(exc, StorageUnavailableError)
