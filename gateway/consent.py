"""Stage 8 of the pipeline (spec section 7): a person's decision before a write tool runs.

This is the stage's first form: it asks through the client's elicitation, when the
client declared it, and answers allow once / deny once. Stored decisions, the
out-of-band terminal approver and the 2026-07-28 input_required round trip extend it
(issue 4). Whatever cannot be asked is denied: there is never a silent allow.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal, Protocol

import anyio

from gateway.audit import AuditLog, EventDraft, EventType
from gateway.canonical import canonical_json
from gateway.errors import ConsentDeniedError
from gateway.policy import ConsentPolicy

RiskTier = Literal["low", "medium", "high"]


class Decision(StrEnum):
    ALLOW_ONCE = "ALLOW_ONCE"
    ALLOW_SESSION = "ALLOW_SESSION"
    ALLOW_ALWAYS = "ALLOW_ALWAYS"
    DENY_ONCE = "DENY_ONCE"
    DENY_ALWAYS = "DENY_ALWAYS"

    @property
    def allows(self) -> bool:
        return self.name.startswith("ALLOW")


class Origin(StrEnum):
    USER_PROMPT = "user_prompt"
    CACHE_HIT = "cache_hit"
    TIMEOUT = "timeout"
    POLICY = "policy"


def risk_tier(annotations: Mapping[str, Any] | None, trusted: bool) -> RiskTier:
    """Spec section 7, with the MCP defaults for missing hints (destructive, open world)."""
    if not annotations:
        return "high"
    read_only = annotations.get("readOnlyHint") is True
    if not read_only and annotations.get("destructiveHint", True) is not False:
        return "high"
    if annotations.get("openWorldHint", True) is not False and not read_only:
        return "high"
    if read_only:
        return "low" if trusted else "medium"
    return "medium"


_COPY: Mapping[str, Mapping[str, str]] = {
    "en-US": {
        "title": "Allow this tool to run?",
        "from": "From {server}",
        "low": "Low risk · read-only",
        "medium": "Medium risk",
        "high": "High risk · may modify data",
        "args": "Arguments",
        "user": "Requested by {user} in workspace {workspace}",
    },
    "pt-BR": {
        "title": "Permitir execução desta ferramenta?",
        "from": "Do servidor {server}",
        "low": "Risco baixo · somente leitura",
        "medium": "Risco médio",
        "high": "Risco alto · pode modificar dados",
        "args": "Argumentos",
        "user": "Pedido por {user} no espaço de trabalho {workspace}",
    },
}
PREVIEW_CHARS = 400


@dataclass(frozen=True, slots=True)
class ConsentRequest:
    run_id: str
    user: str
    workspace: str
    server_id: str
    tool_name: str
    args_hash: str
    arguments: Mapping[str, Any]
    risk: RiskTier


def prompt_text(request: ConsentRequest, locale: str) -> str:
    copy = _COPY.get(locale, _COPY["en-US"])
    preview = canonical_json(dict(request.arguments))
    if len(preview) > PREVIEW_CHARS:
        preview = preview[:PREVIEW_CHARS] + "…"
    return "\n".join(
        (
            f"{copy['title']} {request.tool_name}",
            copy["from"].format(server=request.server_id),
            copy[request.risk],
            copy["user"].format(user=request.user, workspace=request.workspace),
            f"{copy['args']}: {preview}",
        )
    )


class ConsentAsker(Protocol):
    """A channel to a person. Returns their decision, or None for decline/cancel."""

    async def ask(self, message: str, choices: tuple[Decision, ...]) -> Decision | None: ...


class ConsentStage:
    def __init__(self, policy: ConsentPolicy, audit: AuditLog) -> None:
        self._policy = policy
        self._audit = audit

    def choices(self, request: ConsentRequest) -> tuple[Decision, ...]:
        return (Decision.ALLOW_ONCE, Decision.DENY_ONCE)

    async def require(self, request: ConsentRequest, asker: ConsentAsker | None) -> Decision:
        """Return the allowing decision, or record the denial and raise ConsentDeniedError."""
        if self._policy.mode == "deny":
            self._record(request, Decision.DENY_ONCE, Origin.POLICY, "consent_mode_deny")
            raise ConsentDeniedError("consent_mode_deny", _REFUSED_BY_POLICY)
        if asker is None:
            self._record(request, Decision.DENY_ONCE, Origin.POLICY, "no_consent_channel")
            raise ConsentDeniedError("no_consent_channel", _NO_CHANNEL)
        decision: Decision | None = None
        with anyio.move_on_after(self._policy.timeout_s):
            decision = await asker.ask(prompt_text(request, self._policy.locale), self.choices(request))
            if decision is None:
                decision = Decision.DENY_ONCE
        if decision is None:
            self._record(request, Decision.DENY_ONCE, Origin.TIMEOUT, "consent_timeout")
            raise ConsentDeniedError("consent_timeout", _TIMED_OUT)
        self._record(request, decision, Origin.USER_PROMPT, None)
        if not decision.allows:
            raise ConsentDeniedError("consent_denied", _DENIED)
        return decision

    def _record(self, request: ConsentRequest, decision: Decision, origin: Origin, reason: str | None) -> None:
        detail: dict[str, Any] = {
            "decision": str(decision),
            "risk_tier": request.risk,
            "origin": str(origin),
            "server_id": request.server_id,
        }
        if reason:
            detail["reason"] = reason
        self._audit.append(
            EventDraft(
                EventType.PERMISSION_DECISION,
                run_id=request.run_id,
                user=request.user,
                workspace=request.workspace,
                tool_name=request.tool_name,
                args_hash=request.args_hash,
                detail=detail,
            )
        )


_DENIED = "a person denied this call; retrying will not help unless they change their mind"
_TIMED_OUT = "no person answered before the consent timeout; the call was denied"
_NO_CHANNEL = "this client cannot ask a person (no elicitation capability), so the call was denied"
_REFUSED_BY_POLICY = "the policy allows no consent prompts (consent.mode: deny)"
