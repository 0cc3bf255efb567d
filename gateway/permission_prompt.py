"""`check_permission`: the gateway as Claude Code's `--permission-prompt-tool` (spec section 9).

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
from the next question on).

Questions are asked out of band only (`mcp-gateway approvals`): `-p` has no dialog, so
elicitation to Claude Code would reach nobody. Every answer leaves `mcp.permission.decision`
for the agent's tool (the rule, or the person's decision) and `TOOL_FINISHED` for the
question, with its behavior.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import anyio
from sqlalchemy.exc import SQLAlchemyError

from gateway.audit import EventDraft, EventType
from gateway.auth import Principal
from gateway.canonical import args_hash
from gateway.consent import (
    Answer,
    ConsentProfile,
    ConsentRequest,
    Decision,
    Origin,
    consent_profile,
    decision_event,
)
from gateway.db_threads import in_db_thread
from gateway.errors import ConsentDeniedError, GatewayError, InvalidParamsError
from gateway.file_rules import PATH_ARGUMENT
from gateway.grant_scope import absolute_spellings
from gateway.permission_rules import Judgement, RuleSet, bash_parts, bash_programs, judge
from gateway.pipeline import caller_of
from gateway.previews import preview
from gateway.rbac import Permission, require_permission
from gateway.scope import check_workspace_pinned, choose_workspace
from gateway.services import Services
from gateway.tools.registry import ToolSpec
from gateway.visible import visible
from sandbox.pinned import Pinned

log = logging.getLogger("gateway.permission_prompt")

TOOL_NAME = "check_permission"
TOKEN_ENV = "MCP_GATEWAY_TOKEN"  # noqa: S105  (the variable's name, not a secret)
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
    sandboxed=False,
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
        raise InvalidParamsError("invalid_arguments", "tool_name must be a tool's name")
    if not isinstance(tool_input, Mapping):
        raise InvalidParamsError("invalid_arguments", "input must be an object")
    if use_id is not None and (not isinstance(use_id, str) or not _TOOL_USE_ID.fullmatch(use_id)):
        raise InvalidParamsError("invalid_arguments", "tool_use_id must be an id")
    try:
        hashed = args_hash(dict(tool_input))
    except ValueError:
        raise InvalidParamsError("invalid_arguments", "input holds a number JSON cannot carry") from None
    return ToolUse(tool, tool_input, use_id, hashed)


# --- the questions ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Asker:
    """Whose agent asks (the session token's user), and in which workspace its paths are judged."""

    user: str
    workspace: str


class PermissionPrompt:
    def __init__(self, services: Services) -> None:
        self.s = services
        self._rules = RuleSet.parse(
            services.policy.permission_prompt.deny,
            services.policy.permission_prompt.ask,
            services.policy.permission_prompt.allow,
        )

    async def check(self, arguments: Mapping[str, Any]) -> tuple[str, str]:
        """Answer one question: (run_id, the answer's JSON text). Never raises a GatewayError."""
        run_id = self.s.new_run_id()
        try:
            hashed = args_hash(dict(arguments))
        except ValueError:
            hashed = None
        entry = EventDraft(EventType.MCP_TOOL_CALL, run_id=run_id, tool_name=TOOL_NAME, args_hash=hashed)
        try:
            return run_id, await self._check(entry, arguments)
        except (GatewayError, SQLAlchemyError) as exc:
            # The audit log or the database failed: nothing can be vouched for.
            log.error("run %s: check_permission failed (%s); answered deny", run_id, type(exc).__name__)  # noqa: TRY400
            return run_id, deny_answer("mcp-write-gateway failed to decide; denied (see the gateway's log)")
        except Exception:
            log.exception("run %s: check_permission failed unexpectedly; answered deny", run_id)
            return run_id, deny_answer("mcp-write-gateway failed to decide; denied (see the gateway's log)")

    async def _check(self, entry: EventDraft, arguments: Mapping[str, Any]) -> str:
        principal: Principal | None = None
        try:
            token = self.s.environ.get(TOKEN_ENV, "").strip() or None
            principal = await in_db_thread(self.s.authenticator.authenticate, token)
            require_permission(self.s.policy.roles, principal.role, Permission.ORCHESTRATION_RUN)
            asker = _Asker(principal.name, choose_workspace(self.s.policy, None, caller_of(principal)))
            # Rules and previews are judged against the workspace root: it must be the folder pinned at load.
            root = self.s.policy.workspaces[asker.workspace]
            pinned = check_workspace_pinned(asker.workspace, root, self.s.policy.pins.get(root))
            use = parse_use(arguments)
        except GatewayError as exc:
            named = entry if principal is None else dataclasses.replace(entry, user=principal.name)
            blocked = dataclasses.replace(
                named, event_type=EventType.POLICY_BLOCKED, code=exc.code,
                detail={"blocked_reason": exc.reason, "behavior": "deny"},
            )  # fmt: skip
            await in_db_thread(self.s.audit.append, named, blocked)
            why = f"{TOKEN_ENV} is not set for the gateway" if exc.reason == "token_missing" else exc.public_message()
            return deny_answer(f"mcp-write-gateway denied this tool use: {why}")
        judged = judge(self._rules, use.tool, use.tool_input, str(root), os.path.realpath)
        if judged.verdict != "ask":
            return await in_db_thread(self._by_rule, entry, asker, use, judged)
        await in_db_thread(self.s.audit.append, _named(entry, asker))  # committed before the question waits
        return await self._ask(entry, asker, use, pinned)

    def _by_rule(self, entry: EventDraft, asker: _Asker, use: ToolUse, judged: Judgement) -> str:
        allow = judged.verdict == "allow"
        request = _request(entry, asker, use)
        answer = Answer(Decision.ALLOW_ONCE if allow else Decision.DENY_ONCE, Origin.POLICY, "rules")
        self.s.audit.append(
            _named(entry, asker),
            decision_event(request, answer, None if allow else "rule_denied", {"rule": judged.rule}),
            self._finished(entry, asker, use, "allow" if allow else "deny", rule=judged.rule),
        )
        if allow:
            return allow_answer(use.tool_input)
        return deny_answer(f'denied by the policy rule permission_prompt.deny "{judged.rule}"')

    async def _ask(self, entry: EventDraft, asker: _Asker, use: ToolUse, root: Pinned) -> str:
        """Ask consent; the preview reads the current file beneath the pinned workspace `root`."""
        request = dataclasses.replace(
            _request(entry, asker, use),
            preview=preview(use.tool, use.tool_input, root),
            path_spellings=agent_path_spellings(use.tool, use.tool_input, str(root.path)),
        )
        try:
            decision = await self.s.consent.require(request, None)
        except ConsentDeniedError as exc:
            await in_db_thread(self.s.audit.append, self._finished(entry, asker, use, "deny", reason=exc.reason))
            return deny_answer(exc.public_message())
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await in_db_thread(self.s.audit.append, self._finished(entry, asker, use, None))
            raise
        finished = self._finished(entry, asker, use, "allow", decision=str(decision))
        await in_db_thread(self.s.audit.append, finished)
        return allow_answer(use.tool_input)

    def _event(
        self,
        kind: EventType,
        entry: EventDraft,
        asker: _Asker,
        *,
        tool: str,
        hashed: str | None,
        detail: Mapping[str, Any],
    ) -> EventDraft:
        return EventDraft(
            kind,
            run_id=entry.run_id,
            user=asker.user,
            workspace=asker.workspace,
            tool_name=tool,
            args_hash=hashed,
            detail=dict(detail),
        )

    def _finished(self, entry: EventDraft, asker: _Asker, use: ToolUse, behavior: str | None, **why: Any) -> EventDraft:
        """The question's terminal event: its behavior (None: cancelled), the agent's tool, and why."""
        detail: dict[str, Any] = {"status": "ok" if behavior else "cancelled", "agent_tool": use.tool}
        if behavior:
            detail["behavior"] = behavior
        if use.tool_use_id:
            detail["tool_use_id"] = use.tool_use_id
        detail |= {k: v for k, v in why.items() if v is not None}
        return self._event(EventType.TOOL_FINISHED, entry, asker, tool=TOOL_NAME, hashed=entry.args_hash, detail=detail)


def explain(services: Services, user: str, tool: str, tool_input: Mapping[str, Any]) -> list[tuple[str, str]]:
    """`policy explain --agent`: how a question about this tool use would be answered, step by step,
    for a user (no token is involved); writes nothing. Each line: (step, verdict and why)."""
    lines: list[tuple[str, str]] = []
    record = services.users.fetch(user)
    if record is None or record.disabled:
        return [("authenticate", "deny  (user unknown or disabled)"), ("result", "deny")]
    lines.append(("authenticate", f"pass  (user {record.name}, role {record.role})"))
    principal = Principal(record.name, record.role, record.workspaces, None, "explain")
    try:
        require_permission(services.policy.roles, record.role, Permission.ORCHESTRATION_RUN)
        workspace = choose_workspace(services.policy, None, caller_of(principal))
        root = services.policy.workspaces[workspace]
        check_workspace_pinned(workspace, root, services.policy.pins.get(root))
        use = parse_use({"tool_name": tool, "input": tool_input})
    except GatewayError as exc:
        return [*lines, ("check", f"deny  ({exc.code} {exc.reason}: {exc.public_message()})"), ("result", "deny")]
    lines.append(("workspace", f"pass  ({workspace}: {root})"))
    if use.tool == "Bash":
        command = str(use.tool_input.get("command", ""))
        parts, eligible = bash_parts(command)
        note = "" if eligible else "; not plain commands of literal words: no allow rule applies"
        lines.append(("parts", " | ".join(visible(part) for part in parts) + note))  # escaped as the approver shows
        lines.append(("runs", " | ".join(visible(program) for program in bash_programs(command))))
    p = services.policy.permission_prompt
    judged = judge(RuleSet.parse(p.deny, p.ask, p.allow), use.tool, use.tool_input, str(root), os.path.realpath)
    lines.append(("rules", f"{judged.verdict}  ({judged.rule or 'no rule matches'})"))
    if judged.verdict != "ask":
        return [*lines, ("result", judged.verdict)]
    tier, destructive, _ = agent_tool_consent(use.tool)
    how = "a stored decision, else a person at `mcp-gateway approvals`"
    if services.policy.consent.mode == "deny":
        how = "a stored decision, else deny (consent.mode: deny)"
    kind = f"risk {tier}" + (", destructive: no Allow always" if destructive else "")
    return [*lines, ("consent", f"ask  ({kind}; would use {how})"), ("result", "ask")]


def _request(entry: EventDraft, asker: _Asker, use: ToolUse) -> ConsentRequest:
    """The question about the agent's tool use, for consent and its audit event."""
    tier, destructive, fingerprint = agent_tool_consent(use.tool)
    return ConsentRequest(
        run_id=str(entry.run_id),
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


def _named(entry: EventDraft, asker: _Asker) -> EventDraft:
    """The entry event, naming the caller and the workspace."""
    return dataclasses.replace(entry, user=asker.user, workspace=asker.workspace)
