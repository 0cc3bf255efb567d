"""Stage 8 of the pipeline (spec section 7): a person's decision before a write tool runs.

In order: a stored decision for (user, workspace, server, tool[, args]) that is unexpired and
made for this very tool definition (its fingerprint) answers at once, Deny before Allow; then
an "allow for the session" of this stdio session; then `consent.mode: deny` refuses; then a
person is asked: through the client's elicitation when it declared it (`ConsentAsker`), or
else out of band, the question waiting in the database for `mcp-gateway approvals` (several
gateways and approvers may share it; each question is decided once). No answer before
`consent.timeout_s` is a deny. Every decision, stored ones included, is audited as
`mcp.permission.decision`. There is never a silent allow.

The decisions themselves are pure functions of values and `now` (`risk_tier`, `choices_for`,
`pick_grant`, `grant_for`); the stage only does the I/O around them.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal, Protocol

import anyio

from gateway.audit import AuditLog, EventDraft, EventType
from gateway.canonical import canonical_json
from gateway.clock import Clock
from gateway.consent_store import ConsentStore, Grant, PendingRequest
from gateway.errors import ConsentDeniedError
from gateway.policy import ConsentPolicy

RiskTier = Literal["low", "medium", "high"]
RISK_META_KEY = "mcp-write-gateway/risk"
"""A tool's `_meta` key by which its server declares its risk tier, over the annotations."""
DAY_S = 86400
PREVIEW_CHARS = 400
_POLL_FIRST_S = 0.05
_POLL_MAX_S = 0.5
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASS|CREDENTIAL|AUTH|SESSION|COOKIE|PRIVATE|CERT", re.IGNORECASE)


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


# --- pure decisions -------------------------------------------------------------------------------


def risk_tier(annotations: Mapping[str, Any] | None, trusted: bool, declared: object = None) -> RiskTier:
    """Spec section 7, with the MCP defaults for missing hints (destructive, open world).

    `declared` is the server's own tier from the tool's `_meta`; it wins when it is a tier.
    """
    if declared in ("low", "medium", "high"):
        return declared
    if not annotations:
        return "high"
    read_only = annotations.get("readOnlyHint") is True
    if is_destructive(annotations):
        return "high"
    if annotations.get("openWorldHint", True) is not False and not read_only:
        return "high"
    if read_only:
        return "low" if trusted else "medium"
    return "medium"


def is_destructive(annotations: Mapping[str, Any] | None) -> bool:
    """MCP defaults: destructiveHint is true unless said otherwise, and means nothing for a read-only tool."""
    if not annotations:
        return True
    return annotations.get("readOnlyHint") is not True and annotations.get("destructiveHint", True) is not False


def tool_fingerprint(name: str, input_schema: Mapping[str, Any], annotations: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of the tool's name, inputSchema and annotations (spec section 7)."""
    document = {"name": name, "inputSchema": dict(input_schema), "annotations": dict(annotations)}
    return hashlib.sha256(canonical_json(document).encode()).hexdigest()


def choices_for(destructive: bool) -> tuple[Decision, ...]:
    """What a person may answer; Allow always is never offered for a destructive tool."""
    allow_always = () if destructive else (Decision.ALLOW_ALWAYS,)
    return (Decision.ALLOW_ONCE, Decision.ALLOW_SESSION, *allow_always, Decision.DENY_ONCE, Decision.DENY_ALWAYS)


def pick_grant(grants: Sequence[Grant], now: float, fingerprint: str, args_hash: str) -> Grant | None:
    """The stored decision that answers this call: unexpired, for this tool definition and these
    arguments (or any); a Deny beats an Allow, and the newest of a kind wins."""
    live = [
        g
        for g in grants
        if g.revoked_at is None
        and (g.expires_at is None or g.expires_at > now)
        and g.fingerprint == fingerprint
        and g.args_hash in (None, args_hash)
    ]
    for kind in ("DENY", "ALLOW"):
        matching = sorted((g for g in live if g.decision == kind), key=lambda g: (g.granted_at, g.id), reverse=True)
        if matching:
            return matching[0]
    return None


def grant_expiry(tier: RiskTier, policy: ConsentPolicy, now: float) -> float:
    return now + policy.expiry_days[tier] * DAY_S


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": DAY_S}


def parse_duration(text: str) -> float:
    """`90s`, `15m`, `8h`, `7d` (or bare seconds) as seconds; ValueError otherwise."""
    match = re.fullmatch(r"(\d+)([smhd]?)", text.strip())
    if match is None or int(match.group(1)) == 0:
        raise ValueError(f"not a duration: {text!r} (use e.g. 90s, 15m, 8h, 7d)")
    return int(match.group(1)) * _DURATION_UNITS[match.group(2) or "s"]


def redacted_preview(arguments: Mapping[str, Any], limit: int = PREVIEW_CHARS) -> str:
    """The arguments as canonical JSON, values under secret-looking names hidden, cut at `limit`."""

    def scrub(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {k: "[redacted]" if _SECRET_NAME.search(str(k)) else scrub(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [scrub(v) for v in value]
        return value

    preview = canonical_json(scrub(dict(arguments)))
    return preview if len(preview) <= limit else preview[:limit] + "…"


# --- the question -------------------------------------------------------------------------------

_COPY: Mapping[str, Mapping[str, str]] = {
    "en-US": {
        "title": "Allow this tool to run?",
        "from": "From {server}",
        "low": "Low risk · read-only",
        "medium": "Medium risk",
        "high": "High risk · may modify data",
        "args": "Arguments",
        "user": "Requested by {user} in workspace {workspace}",
        "ALLOW_ONCE": "Allow once",
        "ALLOW_ALWAYS": "Allow always",
        "DENY_ONCE": "Deny once",
        "DENY_ALWAYS": "Deny always",
        "ALLOW_SESSION": "Allow for this session",
    },
    "pt-BR": {
        "title": "Permitir execução desta ferramenta?",
        "from": "Do servidor {server}",
        "low": "Risco baixo · somente leitura",
        "medium": "Risco médio",
        "high": "Risco alto · pode modificar dados",
        "args": "Argumentos",
        "user": "Pedido por {user} no espaço de trabalho {workspace}",
        "ALLOW_ONCE": "Permitir uma vez",
        "ALLOW_ALWAYS": "Permitir sempre",
        "DENY_ONCE": "Negar uma vez",
        "DENY_ALWAYS": "Negar sempre",
        "ALLOW_SESSION": "Permitir nesta sessão",
    },
}


def copy_for(locale: str) -> Mapping[str, str]:
    return _COPY.get(locale, _COPY["en-US"])


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
    fingerprint: str = ""
    destructive: bool = False
    preview: str | None = None
    """What the call would do, in words a person reads (a command, a diff, a URL); None: the arguments say it."""


def prompt_text(request: ConsentRequest, locale: str) -> str:
    copy = copy_for(locale)
    return "\n".join(
        (
            f"{copy['title']} {request.tool_name}",
            copy["from"].format(server=request.server_id),
            copy[request.risk],
            copy["user"].format(user=request.user, workspace=request.workspace),
            f"{copy['args']}: {redacted_preview(request.arguments)}",
        )
    )


def decision_schema(choices: tuple[Decision, ...]) -> dict[str, Any]:
    """The form (spec section 7): one required string field `decision`, the choices as its enum."""
    return {
        "type": "object",
        "properties": {"decision": {"type": "string", "title": "Decision", "enum": [c.value.lower() for c in choices]}},
        "required": ["decision"],
    }


def decision_from_form(action: str, content: Mapping[str, Any] | None, choices: tuple[Decision, ...]) -> Decision:
    """The client's form answer: accept with an offered decision, or else (decline, cancel, anything) Deny once."""
    answer = str((content or {}).get("decision", "")).upper() if action == "accept" else ""
    return Decision(answer) if answer in {c.value for c in choices} else Decision.DENY_ONCE


class ConsentAsker(Protocol):
    """A channel to the person behind the client. Returns their decision, or None for decline/cancel."""

    async def ask(self, message: str, choices: tuple[Decision, ...]) -> Decision | None: ...


@dataclass(frozen=True, slots=True)
class RoundTrip:
    """A 2026-07-28 client that declared elicitation: no server-to-client requests exist, so the
    question goes back as an `input_required` result and the answer comes with the client's retry
    of the same call (`input_responses["consent"]`, the echoed `request_state`)."""

    action: str | None = None
    """The retry's answer: accept, decline or cancel; None on the first round."""
    content: Mapping[str, Any] | None = None
    state: str | None = None


class InputRequired(Exception):
    """Consent needs the client's answer: the call ends with `input_required`, to be retried."""

    def __init__(self, message: str, schema: Mapping[str, Any], state: str) -> None:
        super().__init__("input required")
        self.message = message
        self.schema = schema
        self.state = state


@dataclass(frozen=True, slots=True)
class Answer:
    decision: Decision
    origin: Origin
    channel: str
    decided_by: str | None = None


# --- the stage -----------------------------------------------------------------------------------


class ConsentStage:
    def __init__(
        self,
        policy: ConsentPolicy,
        audit: AuditLog,
        store: ConsentStore,
        clock: Clock,
        new_id: Callable[[], str],
    ) -> None:
        self._policy = policy
        self._audit = audit
        self._store = store
        self._clock = clock
        self._new_id = new_id
        self.session_id = new_id()
        """This process's stdio session: "allow for the session" lasts as long as it."""
        self._session_allows: set[tuple[str, str, str, str, str]] = set()

    async def require(self, request: ConsentRequest, asker: ConsentAsker | RoundTrip | None) -> Decision:
        """Return the allowing decision, or record the denial and raise ConsentDeniedError."""
        now = self._clock.now()
        grants = self._store.fetch_grants(request.user, request.workspace, request.server_id, request.tool_name)
        grant = pick_grant(grants, now, request.fingerprint, request.args_hash)
        if grant is not None:
            decision = Decision.ALLOW_ALWAYS if grant.decision == "ALLOW" else Decision.DENY_ALWAYS
            return self._conclude(request, Answer(decision, Origin.CACHE_HIT, "stored", grant.granted_by), grant)
        if self._session_key(request) in self._session_allows:
            return self._conclude(request, Answer(Decision.ALLOW_SESSION, Origin.CACHE_HIT, "session"), None)
        if self._policy.mode == "deny":
            self._record(request, Answer(Decision.DENY_ONCE, Origin.POLICY, "policy"), reason="consent_mode_deny")
            raise ConsentDeniedError("consent_mode_deny", _REFUSED_BY_POLICY)
        answer = await self._ask(request, asker)
        if answer is None:
            channel = "elicitation" if asker is not None else "approver"
            self._record(request, Answer(Decision.DENY_ONCE, Origin.TIMEOUT, channel), reason="consent_timeout")
            raise ConsentDeniedError("consent_timeout", _TIMED_OUT)
        return self._conclude(request, answer, None)

    async def _ask(self, request: ConsentRequest, asker: ConsentAsker | RoundTrip | None) -> Answer | None:
        """The person's answer; decline and cancel are Deny once; None when nobody answered in time."""
        choices = choices_for(request.destructive)
        if isinstance(asker, RoundTrip):
            return self._round_trip(request, asker, choices)
        if asker is not None:
            with anyio.move_on_after(self._policy.timeout_s):
                decision = await asker.ask(prompt_text(request, self._policy.locale), choices)
                return Answer(decision or Decision.DENY_ONCE, Origin.USER_PROMPT, "elicitation")
            return None
        return await self._ask_out_of_band(request, choices)

    def _round_trip(self, request: ConsentRequest, trip: RoundTrip, choices: tuple[Decision, ...]) -> Answer | None:
        """First round: store the question and ask for a retry. Retry: the question it answers must be
        this very call's (user, workspace, tool, arguments), still open, and is closed by this answer.

        `request_state` is only the question's id, 128 random bits: what it stands for is in the
        database, so a forged, replayed, stale or transplanted state finds nothing to answer.
        """
        now = self._clock.now()
        message = prompt_text(request, self._policy.locale)
        if trip.state is None or trip.action is None:
            state = self._new_id()
            self._store.insert_request(self._question(request, state, now), status="awaiting_client")
            raise InputRequired(message, decision_schema(choices), state)
        row = self._store.fetch_request(trip.state)
        same_call = row is not None and (row.user, row.workspace, row.tool_name, row.args_hash) == (
            request.user,
            request.workspace,
            request.tool_name,
            request.args_hash,
        )
        if row is None or not same_call:
            self._record(
                request, Answer(Decision.DENY_ONCE, Origin.POLICY, "elicitation"), reason="consent_state_invalid"
            )
            raise ConsentDeniedError("consent_state_invalid", _STATE_INVALID)
        decision = decision_from_form(trip.action, trip.content, choices)
        if not self._store.decide(trip.state, decision.value, f"client:{request.user}", now, waiting="awaiting_client"):
            if row.expires_at <= now:
                return None  # answered after consent.timeout_s: a timeout
            self._record(
                request, Answer(Decision.DENY_ONCE, Origin.POLICY, "elicitation"), reason="consent_state_invalid"
            )
            raise ConsentDeniedError("consent_state_invalid", _STATE_INVALID)  # answered already: a replay
        return Answer(decision, Origin.USER_PROMPT, "elicitation")

    def _question(self, request: ConsentRequest, question_id: str, now: float) -> PendingRequest:
        return PendingRequest(
            id=question_id,
            created_at=now,
            expires_at=now + self._policy.timeout_s,
            session_id=self.session_id,
            user=request.user,
            workspace=request.workspace,
            server_id=request.server_id,
            tool_name=request.tool_name,
            args_hash=request.args_hash,
            args_preview=redacted_preview(request.arguments),
            risk_tier=request.risk,
            destructive=request.destructive,
            preview=request.preview,
        )

    async def _ask_out_of_band(self, request: ConsentRequest, choices: tuple[Decision, ...]) -> Answer | None:
        self._store.insert_request(self._question(request, request.run_id, self._clock.now()))
        pause, answer = _POLL_FIRST_S, None
        try:
            with anyio.move_on_after(self._policy.timeout_s):
                while answer is None:
                    answer = self._answer_of(request.run_id, choices)
                    if answer is None:
                        await anyio.sleep(pause)
                        pause = min(pause * 2, _POLL_MAX_S)
        finally:
            if answer is None:  # past the timeout, or cancelled: close the question
                with anyio.CancelScope(shield=True):
                    closed = self._store.expire(request.run_id, self._clock.now())
        # A decision that got in before the question closed still counts.
        return answer if answer is not None or closed else self._answer_of(request.run_id, choices)

    def _answer_of(self, request_id: str, choices: tuple[Decision, ...]) -> Answer | None:
        row = self._store.fetch_request(request_id)
        if row is None or row.status != "decided" or row.decision is None:
            return None
        decision = Decision(row.decision) if row.decision in Decision.__members__ else Decision.DENY_ONCE
        if decision not in choices:
            decision = Decision.DENY_ONCE  # e.g. Allow always for a destructive tool: never granted
        return Answer(decision, Origin.USER_PROMPT, "approver", row.decided_by)

    def _conclude(self, request: ConsentRequest, answer: Answer, grant: Grant | None) -> Decision:
        """Store what lasts, audit the decision, and raise unless it allows."""
        now = self._clock.now()
        detail: dict[str, Any] = {}
        if grant is not None:
            detail["grant_id"] = grant.id
        elif answer.decision in (Decision.ALLOW_ALWAYS, Decision.DENY_ALWAYS):
            allow = answer.decision is Decision.ALLOW_ALWAYS
            expires_at = grant_expiry(request.risk, self._policy, now) if allow else None
            detail["grant_id"] = self._store.insert_grant(
                Grant(
                    id=0,
                    user=request.user,
                    workspace=request.workspace,
                    server_id=request.server_id,
                    tool_name=request.tool_name,
                    args_hash=None,
                    decision="ALLOW" if allow else "DENY",
                    fingerprint=request.fingerprint,
                    granted_at=now,
                    expires_at=expires_at,
                    granted_by=answer.decided_by or f"{answer.channel}:{request.user}",
                )
            )
            detail["expires_at"] = expires_at
        elif answer.decision is Decision.ALLOW_SESSION:
            self._session_allows.add(self._session_key(request))
        if answer.decided_by:
            detail["decided_by"] = answer.decided_by
        reason = None if answer.decision.allows else _DENY_REASONS[answer.decision]
        self._record(request, answer, reason=reason, extra=detail)
        if answer.decision.allows:
            return answer.decision
        message = _DENIED_ALWAYS if answer.decision is Decision.DENY_ALWAYS else _DENIED
        raise ConsentDeniedError(_DENY_REASONS[answer.decision], message)

    def _session_key(self, request: ConsentRequest) -> tuple[str, str, str, str, str]:
        return (request.user, request.workspace, request.server_id, request.tool_name, request.fingerprint)

    def _record(
        self, request: ConsentRequest, answer: Answer, *, reason: str | None, extra: Mapping[str, Any] | None = None
    ) -> None:
        detail: dict[str, Any] = {
            "decision": str(answer.decision),
            "risk_tier": request.risk,
            "origin": str(answer.origin),
            "server_id": request.server_id,
            "channel": answer.channel,
            **(extra or {}),
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


_DENY_REASONS = {Decision.DENY_ONCE: "consent_denied", Decision.DENY_ALWAYS: "consent_denied_always"}
_DENIED = "a person denied this call; retrying will not help unless they change their mind"
_DENIED_ALWAYS = (
    "a person denied this tool for good (deny always); retrying will not help until they revoke that decision"
)
_TIMED_OUT = "no person answered before the consent timeout; the call was denied"
_REFUSED_BY_POLICY = "the policy allows no consent prompts (consent.mode: deny)"
_STATE_INVALID = "the consent answer does not belong to an open question about this call; call again without it"
