"""`check_permission`: the gateway as Claude Code's `--permission-prompt-tool` (docs/claude-code.md).

Claude Code (`claude -p`) asks this tool before it runs one of its own tools (Bash, Edit,
Write, WebFetch, ...) that its settings do not decide. Each question, in order:

    1 audit MCP_TOOL_CALL   2 the question's shape   3 authenticate MCP_GATEWAY_TOKEN
    4 authorize (ORCHESTRATION_RUN) and the workspace   5 the policy's rules
    6 "ask": consent, out of band   7 audit the verdict, answer

The answer is always a successful result holding one text block, the JSON
`{"behavior":"allow","updatedInput":<the input, whole>}` or `{"behavior":"deny","message":...}`:
a refusal at any stage, a failure of the gateway itself included, is a deny. Claude Code
cannot send `params.auth`, so the session's token comes from the server's environment and is
verified at every question, as a per-call token is (a revoked token or a disabled user denies
from the next question on). A question that does carry `params.auth` (another client) is judged
by that token alone: a bad one is refused, never replaced by the environment's.

Questions are asked out of band only (`mcp-gateway approvals`): `-p` has no dialog, so
elicitation to Claude Code would reach nobody. Every answer leaves `mcp.permission.decision`
for the agent's tool (the rule, or the person's decision) and `TOOL_FINISHED` for the
question, with its behavior. The question's events and card are its `CallTrail`
(gateway/call_trail.py), as a tools/call's are.

The order is `STEPS`, walked by a question (each step's `run`) and by `policy explain --agent`
(each step's `dry`, which writes nothing), and it is in the types: authentication gives a
`Principal`, the check an `AgentUse` (whose agent, its pinned workspace, the tool use), which the
rules and consent take; `Steps.then` accepts only a step that takes what the one before gave, and
the last step (consent) always answers.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, TypeVar

import anyio

from gateway.audit import EventDraft, EventType
from gateway.auth import TOKEN_ENV, Principal
from gateway.call_trail import CallTrail, Recorder
from gateway.calls import KIND_QUESTION, CardStatus
from gateway.canonical import args_hash
from gateway.consent.grant_scope import absolute_spellings
from gateway.consent.stage import (
    OUT_OF_BAND,
    Answer,
    ConsentProfile,
    ConsentRequest,
    Decision,
    Origin,
    consent_profile,
    decision_event,
)
from gateway.consent.store import Channel
from gateway.db.threads import in_db_thread
from gateway.errors import ConsentDeniedError, GatewayError, InvalidParamsError, Reason
from gateway.pipeline import caller_of
from gateway.previews import preview
from gateway.progress import NO_PROGRESS, CallProgress
from gateway.rbac import Permission, require_permission
from gateway.rules.files import PATH_ARGUMENT
from gateway.rules.permissions import Judgement, RuleSet, bash_parts, bash_programs, judge
from gateway.scope import check_workspace_pinned, choose_workspace
from gateway.services import Services
from gateway.tools.base import ToolSpec
from gateway.tools.outcome import ToolOutcome
from gateway.visible import visible
from sandbox.pinned import Pinned

log = logging.getLogger("gateway.permission_prompt")
_READERS = 2
"""Threads judging tool uses at once (reading a long command is CPU work): the rest wait their turn."""
UNREADABLE_HINT = (
    "Split it into shorter commands, or write the commands to a script file and run that "
    "(a command past a bound of the gateway's reading is always denied)"
)
UNREADABLE_PATH_HINT = "Use a shorter path (a path past a bound of the gateway's judging is always denied)"
UNREADABLE_URL_HINT = "Use a shorter URL (a URL past a bound of the gateway's judging is always denied)"

TOOL_NAME = "check_permission"
AGENT_SERVER_ID = "claude-code"
"""The `server_id` of stored decisions about the agent's own tools (the gateway's are its own name)."""
AGENT_TOOL_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,127}$")
_TOOL_USE_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")

SPEC = ToolSpec(
    name=TOOL_NAME,
    title="Check a Claude Code tool use",
    description=(
        "Claude Code's --permission-prompt-tool: decides whether the agent may use one of its own tools, "
        "by the policy's permission_prompt rules and, where they say ask, a person at `mcp-gateway approvals`. "
        'Answers {"behavior":"allow","updatedInput":...} or {"behavior":"deny","message":...} as JSON text.'
    ),
    permission=Permission.ORCHESTRATION_RUN,
    input_schema=MappingProxyType(
        {
            "type": "object",
            "properties": {
                "tool_name": {"type": "string", "description": "The agent's tool, e.g. Bash or Edit"},
                "input": {"type": "object", "description": "The tool's input, as the agent would run it"},
                "tool_use_id": {"type": "string"},
            },
            "required": ["tool_name", "input"],
        }
    ),
    annotations=MappingProxyType(
        {"title": "Check a Claude Code tool use", "readOnlyHint": True, "openWorldHint": False}
    ),
)

# The agent's tools as MCP annotations, for the risk tier and "destructive" (no Allow always).
# A tool not named here (another MCP server's, Task, ...) has none: high risk, destructive.
_SHELL = MappingProxyType({"readOnlyHint": False, "destructiveHint": True, "openWorldHint": True})
_FILES = MappingProxyType({"readOnlyHint": False, "destructiveHint": True, "openWorldHint": False})
_READS = MappingProxyType({"readOnlyHint": True, "openWorldHint": False})
_WEB = MappingProxyType({"readOnlyHint": True, "openWorldHint": True})
AGENT_TOOLS: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        "Bash": _SHELL,
        "Edit": _FILES,
        "MultiEdit": _FILES,
        "Write": _FILES,
        "NotebookEdit": _FILES,
        "Read": _READS,
        "Glob": _READS,
        "Grep": _READS,
        "LS": _READS,
        "NotebookRead": _READS,
        "WebFetch": _WEB,
        "WebSearch": _WEB,
    }
)


@dataclass(frozen=True, slots=True)
class AgentTool:
    """One of the agent's own tools, described as an MCP tool is: no schema, no declared tier."""

    name: str
    annotations: Mapping[str, Any]
    input_schema: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    meta: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    origin: None = None
    """Claude Code's own, not an upstream's: its trust is decided by `agent_tool_consent`."""


def agent_tool_consent(tool: str) -> ConsentProfile:
    """The consent profile of an agent tool; open-world reads are not trusted."""
    annotations = AGENT_TOOLS.get(tool, MappingProxyType({}))
    return consent_profile(AgentTool(tool, annotations), trusted=annotations.get("openWorldHint") is False)


def agent_path_arguments(tool: str) -> tuple[str, ...]:
    """The argument naming the file or folder an agent tool works on (none for Bash, WebFetch, ...)."""
    name = PATH_ARGUMENT.get(tool)
    return () if name is None else (name,)


def agent_path_spellings(tool: str, tool_input: Mapping[str, Any], root: str) -> dict[str, frozenset[str]]:
    """The tool's path, absolute, as written and resolved (absent: the workspace): what a stored Deny meets."""
    spellings: dict[str, frozenset[str]] = {}
    for name in agent_path_arguments(tool):
        value = tool_input.get(name)
        spellings[name] = absolute_spellings(root, value) if isinstance(value, str) or value is None else frozenset()
    return spellings


# --- the answer ------------------------------------------------------------------------------------


def _json(document: Mapping[str, Any]) -> str:
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def allow_answer(tool_input: Mapping[str, Any]) -> str:
    """Allow, with the input whole: Claude Code runs `updatedInput`, and `{}` would wipe the arguments."""
    return _json({"behavior": "allow", "updatedInput": dict(tool_input)})


def deny_answer(message: str) -> str:
    return _json({"behavior": "deny", "message": message})


@dataclass(frozen=True, slots=True)
class ToolUse:
    tool: str
    tool_input: Mapping[str, Any]
    tool_use_id: str | None
    input_hash: str


def parse_use(arguments: Mapping[str, Any]) -> ToolUse:
    """The question, or InvalidParamsError: a tool name, an input object (JSON numbers, no NaN)."""
    tool, tool_input, use_id = arguments.get("tool_name"), arguments.get("input"), arguments.get("tool_use_id")
    if not isinstance(tool, str) or not AGENT_TOOL_NAME.fullmatch(tool):
        raise InvalidParamsError(Reason.INVALID_ARGUMENTS, "tool_name must be a tool's name")
    if not isinstance(tool_input, Mapping):
        raise InvalidParamsError(Reason.INVALID_ARGUMENTS, "input must be an object")
    if use_id is not None and (not isinstance(use_id, str) or not _TOOL_USE_ID.fullmatch(use_id)):
        raise InvalidParamsError(Reason.INVALID_ARGUMENTS, "tool_use_id must be an id")
    try:
        hashed = args_hash(dict(tool_input))
    except ValueError:
        raise InvalidParamsError(Reason.INVALID_ARGUMENTS, "input holds a number JSON cannot carry") from None
    return ToolUse(tool, tool_input, use_id, hashed)


# --- the questions ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CallToken:
    """What a question's `params.auth` held as its token, whatever its shape (None: no `token`, or
    `params.auth` not an object): a question that carries `params.auth` is judged by it alone."""

    value: object = field(repr=False)


@dataclass(frozen=True, slots=True)
class _Asker:
    """Whose agent asks (the session token's user), and in which workspace its paths are judged."""

    user: str
    workspace: str


@dataclass(frozen=True, slots=True)
class AgentUse:
    """A question that passed the check: whose agent asks, its workspace as pinned at load, the tool use."""

    asker: _Asker
    root: Pinned
    use: ToolUse


@dataclass(frozen=True, slots=True)
class _Question:
    """One question going through STEPS: what it brought, and its trail (its events and card)."""

    arguments: Mapping[str, Any]
    trail: CallTrail
    progress: CallProgress
    given: CallToken | None
    """The question's `params.auth` token, when it carried one; else MCP_GATEWAY_TOKEN is used."""


@dataclass(frozen=True, slots=True)
class _Dry:
    """A question's dry run (`policy explain --agent`): a user's name instead of a token, no trail."""

    arguments: Mapping[str, Any]
    user: str


class PermissionPrompt:
    def __init__(self, services: Services) -> None:
        self.s = services
        self._rules = RuleSet.parse(
            services.policy.permission_prompt.deny,
            services.policy.permission_prompt.ask,
            services.policy.permission_prompt.allow,
        )
        self._readers: anyio.CapacityLimiter | None = None
        self._recorder = Recorder(services.audit, services.clock, services.server_id, services.consent.session_id)

    async def check(
        self, arguments: Mapping[str, Any], progress: CallProgress = NO_PROGRESS, given: CallToken | None = None
    ) -> tuple[str, str]:
        """Answer one question: (run_id, the answer's JSON text). Never raises a GatewayError.
        While a person is asked, `progress` tells the caller where to answer and the time left.
        `given`: the question carried `params.auth` (its token is used, never MCP_GATEWAY_TOKEN)."""
        run_id = self.s.new_run_id()
        try:
            hashed = args_hash(dict(arguments))
        except ValueError:
            hashed = None
        entry = EventDraft(EventType.MCP_TOOL_CALL, run_id=run_id, tool_name=TOOL_NAME, args_hash=hashed)
        trail = CallTrail(self._recorder, entry, arguments, kind=KIND_QUESTION)
        try:
            return run_id, await STEPS.answer(self, _Question(arguments, trail, progress, given))
        except GatewayError as exc:
            # The audit log or the database failed (StorageUnavailableError): nothing can be vouched for.
            log.error("run %s: check_permission failed (%s); answered deny", run_id, type(exc).__name__)  # noqa: TRY400
            return run_id, deny_answer("mcp-write-gateway failed to decide; denied (see the gateway's log)")
        except Exception:
            log.exception("run %s: check_permission failed unexpectedly; answered deny", run_id)
            return run_id, deny_answer("mcp-write-gateway failed to decide; denied (see the gateway's log)")

    def explain(self, user: str, tool: str, tool_input: Mapping[str, Any]) -> list[tuple[str, str]]:
        """`policy explain --agent`: how a question about this tool use would be answered, step by step
        (STEPS, as a question walks them), for a user (no token is involved); writes nothing. Each
        line: (step, verdict and why); the last is the result."""
        return STEPS.explain(self, _Dry({"tool_name": tool, "input": tool_input}, user))

    # --- the steps: each a `run` for a question and a `dry` for explain ------------------------------

    async def _authenticate(self, question: _Question, _: None) -> Principal | str:
        try:
            token = question.given.value if question.given else self.s.environ.get(TOKEN_ENV, "").strip() or None
            question.trail.principal = await in_db_thread(self.s.authenticator.authenticate, token)
        except GatewayError as exc:
            return await self._blocked(question, exc)
        return question.trail.principal

    def _authenticate_dry(self, dry: _Dry, _: None) -> _Shown[Principal]:
        record = self.s.users.fetch(dry.user)
        if record is None or record.disabled:
            return [("authenticate", "deny  (user unknown or disabled)")], "deny"
        principal = Principal(record.name, record.role, record.workspaces, None, "explain")
        return [("authenticate", f"pass  (user {record.name}, role {record.role})")], principal

    def _admit(self, principal: Principal, arguments: Mapping[str, Any], trail: CallTrail | None = None) -> AgentUse:
        """The caller may orchestrate, in a workspace still pinned, and the question is well formed."""
        require_permission(self.s.policy.roles, principal.role, Permission.ORCHESTRATION_RUN)
        asker = _Asker(principal.name, choose_workspace(self.s.policy, None, caller_of(principal)))
        # Rules and previews are judged against the workspace root: it must be the folder pinned at load.
        root = self.s.policy.workspaces[asker.workspace]
        pinned = check_workspace_pinned(asker.workspace, root, self.s.policy.pins.get(root))
        if trail is not None:
            trail.filed_under = asker.workspace  # a question refused for its shape was asked in it
        return AgentUse(asker, pinned, parse_use(arguments))

    async def _check_question(self, question: _Question, principal: Principal) -> AgentUse | str:
        trail = question.trail
        try:
            admitted = self._admit(principal, question.arguments, trail)
        except GatewayError as exc:
            return await self._blocked(question, exc)
        # From here on the events name the workspace, and the card shows the agent's tool use.
        trail.workspace, trail.arguments = admitted.asker.workspace, _asked(admitted.use)
        return admitted

    def _check_question_dry(self, dry: _Dry, principal: Principal) -> _Shown[AgentUse]:
        try:
            admitted = self._admit(principal, dry.arguments)
        except GatewayError as exc:
            return [("check", f"deny  ({exc.code} {exc.reason}: {exc.public_message()})")], "deny"
        return [("workspace", f"pass  ({admitted.asker.workspace}: {admitted.root.path})")], admitted

    def _judge(self, admitted: AgentUse) -> Judgement:
        use = admitted.use
        return judge(self._rules, use.tool, use.tool_input, str(admitted.root.path), os.path.realpath)

    async def _apply_rules(self, question: _Question, admitted: AgentUse) -> AgentUse | str:
        # Off the event loop: reading a command is bounded (gateway/rules/shell/), but not free.
        if self._readers is None:
            self._readers = anyio.CapacityLimiter(_READERS)
        judged = await anyio.to_thread.run_sync(self._judge, admitted, limiter=self._readers)
        if judged.verdict == "ask":
            return admitted
        return await in_db_thread(self._by_rule, question.trail, admitted, judged)

    def _apply_rules_dry(self, dry: _Dry, admitted: AgentUse) -> _Shown[AgentUse]:
        use, judged = admitted.use, self._judge(admitted)
        shown: list[tuple[str, str]] = []
        if use.tool == "Bash":
            command = str(use.tool_input.get("command", ""))
            parts, eligible = bash_parts(command)
            note = "" if eligible else "; not plain commands of literal words: no allow rule applies"
            shown.append(("parts", " | ".join(visible(part) for part in parts) + note))  # escaped as the approver shows
            shown.append(("runs", " | ".join(visible(program) for program in bash_programs(command))))
        why = judged.rule or (f"not read: {judged.unreadable}" if judged.unreadable else "no rule matches")
        shown.append(("rules", f"{judged.verdict}  ({why})"))
        return shown, admitted if judged.verdict == "ask" else judged.verdict

    async def _consent(self, question: _Question, admitted: AgentUse) -> str:
        await in_db_thread(question.trail.log, CardStatus.PENDING)  # committed before the question waits
        return await self._ask(question.trail, admitted, question.progress)

    def _consent_dry(self, dry: _Dry, admitted: AgentUse) -> tuple[list[tuple[str, str]], str]:
        tier, destructive, _ = agent_tool_consent(admitted.use.tool)
        how = "a stored decision, else a person at `mcp-gateway approvals`"
        if self.s.policy.consent.mode == "deny":
            how = "a stored decision, else deny (consent.mode: deny)"
        kind = f"risk {tier}" + (", destructive: no Allow always" if destructive else "")
        return [("consent", f"ask  ({kind}; would use {how})")], "ask"

    async def _blocked(self, question: _Question, exc: GatewayError) -> str:
        """A question refused before its rules: audited, and answered deny with why."""
        trail = question.trail
        blocked = trail.terminal(EventType.POLICY_BLOCKED, exc.code, {"blocked_reason": exc.reason, "behavior": "deny"})
        from_env = question.given is None
        why = f"{TOKEN_ENV} is not set for the gateway" if exc.reason == Reason.TOKEN_MISSING and from_env else None
        why = why or exc.public_message()
        answer = deny_answer(f"mcp-write-gateway denied this tool use: {why}")
        # A question from nobody known belongs to no workspace: it gets no card (gateway/call_trail.py).
        await in_db_thread(trail.log, CardStatus.ERROR, blocked, error=exc, outcome=ToolOutcome(answer))
        return answer

    def _by_rule(self, trail: CallTrail, admitted: AgentUse, judged: Judgement) -> str:
        use = admitted.use
        allow = judged.verdict == "allow"
        request = _request(trail, admitted)
        answer = Answer(Decision.ALLOW_ONCE if allow else Decision.DENY_ONCE, Origin.POLICY, Channel.RULES)
        if allow:
            text = allow_answer(use.tool_input)
        elif judged.unreadable is not None:
            hint = {"Bash": UNREADABLE_HINT, "WebFetch": UNREADABLE_URL_HINT}.get(use.tool, UNREADABLE_PATH_HINT)
            text = deny_answer(f"mcp-write-gateway denied this {use.tool} use unread: {judged.unreadable}. {hint}")
        else:
            text = deny_answer(f'denied by the policy rule permission_prompt.deny "{judged.rule}"')
        reason = None if allow else "input_unreadable" if judged.unreadable else "rule_denied"
        extra = {"rule": judged.rule} if judged.unreadable is None else {"bound": judged.unreadable}
        trail.log(
            CardStatus.DONE,
            decision_event(request, answer, reason, extra),
            _finished(trail, use, "allow" if allow else "deny", rule=judged.rule, reason=reason),
            outcome=ToolOutcome(text),
        )
        return text

    async def _ask(self, trail: CallTrail, admitted: AgentUse, progress: CallProgress) -> str:
        """Ask consent; the preview reads the current file beneath the pinned workspace `root`."""
        use, root = admitted.use, admitted.root
        request = dataclasses.replace(
            _request(trail, admitted),
            preview=preview(use.tool, use.tool_input, root),
            path_spellings=agent_path_spellings(use.tool, use.tool_input, str(root.path)),
        )
        try:
            decision = await self.s.consent.require(request, OUT_OF_BAND, progress)
        except ConsentDeniedError as exc:
            denied = deny_answer(exc.public_message())
            finished = _finished(trail, use, "deny", reason=exc.reason)
            await in_db_thread(trail.log, CardStatus.DONE, finished, outcome=ToolOutcome(denied))
            return denied
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await in_db_thread(trail.log, CardStatus.CANCELLED, _finished(trail, use, None))
            raise
        allowed = allow_answer(use.tool_input)
        finished = _finished(trail, use, "allow", decision=str(decision))
        await in_db_thread(trail.log, CardStatus.DONE, finished, outcome=ToolOutcome(allowed))
        return allowed


def explain(services: Services, user: str, tool: str, tool_input: Mapping[str, Any]) -> list[tuple[str, str]]:
    """`policy explain --agent` (PermissionPrompt.explain)."""
    return PermissionPrompt(services).explain(user, tool, tool_input)


S = TypeVar("S")
T = TypeVar("T")
U = TypeVar("U")

_Shown = tuple[list[tuple[str, str]], "T | str"]
"""A dry step's lines, and what it gave the next step, or the verdict when the step decides the question."""


@dataclass(frozen=True, slots=True)
class Step(Generic[S, T]):
    """A step: from what the step before gave (S) to what it gives the next (T), or the question's answer
    (the JSON text) when it decides it. `run` for a question, `dry` for explain (its verdict instead)."""

    name: str
    run: Callable[[PermissionPrompt, _Question, S], Awaitable[T | str]]
    dry: Callable[[PermissionPrompt, _Dry, S], tuple[list[tuple[str, str]], T | str]]


@dataclass(frozen=True, slots=True)
class LastStep(Generic[S]):
    """The step that always decides: its answer (`run`), its verdict (`dry`)."""

    name: str
    run: Callable[[PermissionPrompt, _Question, S], Awaitable[str]]
    dry: Callable[[PermissionPrompt, _Dry, S], tuple[list[tuple[str, str]], str]]


@dataclass(frozen=True, slots=True)
class Steps(Generic[T]):
    """Steps in order, the last giving a T: `then` takes only a step of what the last one gave, and
    `last` ends them with a step that always decides, so a question always gets its answer."""

    steps: tuple[Step[Any, Any], ...]

    def then(self, step: Step[T, U]) -> Steps[U]:
        return Steps((*self.steps, step))

    def last(self, step: LastStep[T]) -> Order:
        return Order(self.steps, step)


@dataclass(frozen=True, slots=True)
class Order:
    """A question's steps, in order, for a question (`answer`) and its dry run (`explain`) alike."""

    steps: tuple[Step[Any, Any], ...]
    final: LastStep[Any]

    @property
    def names(self) -> tuple[str, ...]:
        return (*(step.name for step in self.steps), self.final.name)

    async def answer(self, prompt: PermissionPrompt, question: _Question) -> str:
        given: Any = None
        for step in self.steps:
            given = await step.run(prompt, question, given)
            if isinstance(given, str):  # what a step gives the next is never text: this is the answer
                return given
        return await self.final.run(prompt, question, given)

    def explain(self, prompt: PermissionPrompt, dry: _Dry) -> list[tuple[str, str]]:
        lines: list[tuple[str, str]] = []
        given: Any = None
        for step in self.steps:
            shown, given = step.dry(prompt, dry, given)
            lines.extend(shown)
            if isinstance(given, str):
                return [*lines, ("result", given)]
        shown, verdict = self.final.dry(prompt, dry, given)
        return [*lines, *shown, ("result", verdict)]


def first(step: Step[None, T]) -> Steps[T]:
    """The first step takes nothing: a question starts with no step before it."""
    return Steps((step,))


AUTHENTICATE: Step[None, Principal] = Step(
    "authenticate", PermissionPrompt._authenticate, PermissionPrompt._authenticate_dry
)
CHECK: Step[Principal, AgentUse] = Step("check", PermissionPrompt._check_question, PermissionPrompt._check_question_dry)
RULES: Step[AgentUse, AgentUse] = Step("rules", PermissionPrompt._apply_rules, PermissionPrompt._apply_rules_dry)
CONSENT: LastStep[AgentUse] = LastStep("consent", PermissionPrompt._consent, PermissionPrompt._consent_dry)
STEPS: Order = first(AUTHENTICATE).then(CHECK).then(RULES).last(CONSENT)
"""The order of a question's steps (this module's docstring, 3-6), for a question and its dry run alike."""


def _request(trail: CallTrail, admitted: AgentUse) -> ConsentRequest:
    """The question about the agent's tool use, for consent and its audit event."""
    asker, use = admitted.asker, admitted.use
    tier, destructive, fingerprint = agent_tool_consent(use.tool)
    return ConsentRequest(
        run_id=trail.run_id,
        user=asker.user,
        workspace=asker.workspace,
        server_id=AGENT_SERVER_ID,
        tool_name=use.tool,
        args_hash=use.input_hash,
        arguments=use.tool_input,
        risk=tier,
        fingerprint=fingerprint,
        destructive=destructive,
    )


def _asked(use: ToolUse) -> dict[str, Any]:
    """What the card shows of a question: the agent's tool and its input (redacted when stored)."""
    asked: dict[str, Any] = {"tool_name": use.tool, "input": dict(use.tool_input)}
    if use.tool_use_id:
        asked["tool_use_id"] = use.tool_use_id
    return asked


def _finished(trail: CallTrail, use: ToolUse, behavior: str | None, **why: Any) -> EventDraft:
    """The question's terminal event: its behavior (None: cancelled), the agent's tool, and why."""
    detail: dict[str, Any] = {"status": "ok" if behavior else "cancelled", "agent_tool": use.tool}
    if behavior:
        detail["behavior"] = behavior
    if use.tool_use_id:
        detail["tool_use_id"] = use.tool_use_id
    detail |= {k: v for k, v in why.items() if v is not None}
    return trail.terminal(EventType.TOOL_FINISHED, None, detail)
