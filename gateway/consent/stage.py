"""Stage 8 of the pipeline (docs/consent.md): a person's decision before a write tool runs.

In order: a stored decision for (user, workspace, server, tool[, args]) that is unexpired and
made for this very tool definition (its fingerprint) answers at once, Deny before Allow; then
an "allow for the session" of this stdio session; then `consent.mode: deny` refuses; then a
person is asked through a `ConsentChannel`: the client's elicitation when it declared it, or
else out of band, the question waiting in the database for `mcp-gateway approvals` (several
gateways and approvers may share it; each question is decided once). No answer before
`consent.timeout_s` is a deny. Every decision, stored ones included, is audited as
`mcp.permission.decision`. There is never a silent allow.

`consent.channels` says which channel may answer and with what. By default the client's own
elicitation may allow once or for the session and may deny, but only the approver's Allow always
is stored: a client that answers its own form must not leave a lasting allow behind that other
sessions use (decision 43). A stored Allow counts only when its channel may still make one;
a stored Deny always counts. A Deny made for particular arguments covers them by meaning
(gateway/consent/grant_scope.py); an Allow, only those very arguments.

The decisions themselves are pure functions of values and `now` (`consent_profile`, `choices_for`,
`pick_grant`, `decision_event`); the stage only does the I/O around them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Literal, NamedTuple, Protocol

import anyio

from gateway.audit import CHANGE_REVIEW, AuditLog, EventDraft, EventType
from gateway.canonical import canonical_json
from gateway.clock import Clock
from gateway.consent.grant_scope import deny_covers
from gateway.consent.hints import hint
from gateway.consent.store import (
    Channel,
    ConsentStore,
    Grant,
    GrantDecision,
    PendingRequest,
    QuestionKind,
    QuestionStatus,
)
from gateway.consent.text import prompt_for, redacted_preview
from gateway.db.threads import in_db_thread
from gateway.errors import ConsentDeniedError, Reason
from gateway.policy import ConsentPolicy
from gateway.progress import NO_PROGRESS, CallProgress, seconds_left
from gateway.visible import visible

RiskTier = Literal["low", "medium", "high"]
RISK_META_KEY = "mcp-write-gateway/risk"
"""A tool's `_meta` key by which its server declares its risk tier, over the annotations."""
DECLARATION_META_KEY = "mcp-write-gateway/declaration"
"""`_meta` of a tool declared in policy.yaml: sha256 of its whole declaration (argv template, arguments,
program identity, workspace mode, limits), which its fingerprint covers (docs/declared-tools.md)."""
QUESTION_ABOUT = "network_host"
"""`detail.about` of a decision on a host a run's proxy asked about (decision 90), filed under its question's id."""
DAY_S = 86400
_POLL_FIRST_S = 0.05
_POLL_MAX_S = 0.5


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
    NO_ANSWER = "no_answer"
    """Nobody decided: the client went away or failed the question (`detail.no_answer` says which).
    `user_prompt` is kept for an answer a client returned: accept, decline or cancel."""


# --- pure decisions -------------------------------------------------------------------------------


TIERS: tuple[RiskTier, ...] = ("low", "medium", "high")


def risk_tier(annotations: Mapping[str, Any] | None, trusted: bool, declared: object = None) -> RiskTier:
    """The tier (docs/consent.md, "Risk tiers and expiry"; decision 86), each missing hint read as its MCP
    default (`hint`):

    high: no annotations, destructive (`is_destructive`: `destructiveHint` true, said or by default for a
    tool that is not read-only), or open world (`openWorldHint` true, said or by default), read-only or not;
    low: read-only, closed world, not said destructive, from a trusted server; medium: the same from an
    untrusted server, or side effects that are idempotent, not destructive and closed world. Anything the
    rule does not name (side effects neither destructive nor idempotent) is high: the worst case.

    `declared` is the tool's own tier from its `_meta` (`RISK_META_KEY`); it wins when it is a tier. Only
    the gateway's own tools get one: `consent_profile` never passes an upstream server's.
    """
    if declared in TIERS:
        return declared
    if not annotations or is_destructive(annotations) or hint(annotations, "openWorldHint"):
        return "high"
    if hint(annotations, "readOnlyHint"):
        return "low" if trusted else "medium"
    return "medium" if hint(annotations, "idempotentHint") else "high"


def is_destructive(annotations: Mapping[str, Any] | None) -> bool:
    """No annotations, `destructiveHint` true, or a tool that is not read-only and does not say
    `destructiveHint: false` (MCP's default for it is true). A read-only tool that says it is destructive
    is taken at its word: its hints contradict each other, and the worse one counts (decision 86)."""
    if not annotations:
        return True
    if annotations.get("destructiveHint") is True:
        return True
    return not hint(annotations, "readOnlyHint") and hint(annotations, "destructiveHint")


def tool_fingerprint(
    name: str, input_schema: Mapping[str, Any], annotations: Mapping[str, Any], declaration: str | None = None
) -> str:
    """sha256 of the canonical JSON of the tool's name, inputSchema and annotations (docs/consent.md, "The flow"),
    and for a declared tool the digest of its declaration (a built-in tool's fingerprint is unchanged by it)."""
    document: dict[str, Any] = {"name": name, "inputSchema": dict(input_schema), "annotations": dict(annotations)}
    if declaration is not None:
        document["declaration"] = declaration
    return hashlib.sha256(canonical_json(document).encode()).hexdigest()


class ToolOrigin(Protocol):
    """Where a tool comes from when the gateway did not write it (gateway/tools/base.py `Origin`)."""

    @property
    def upstream(self) -> str: ...
    @property
    def trust(self) -> str:
        """`trusted` or `untrusted`, as the policy says of the upstream."""
        ...

    @property
    def description(self) -> str: ...
    @property
    def definition_sha256(self) -> str: ...


class DescribedTool(Protocol):
    """A tool as its server describes it (gateway/tools/registry.py `ToolSpec` is one)."""

    @property
    def name(self) -> str: ...
    @property
    def input_schema(self) -> Mapping[str, Any]: ...
    @property
    def annotations(self) -> Mapping[str, Any]: ...
    @property
    def meta(self) -> Mapping[str, Any]: ...
    @property
    def origin(self) -> ToolOrigin | None:
        """The upstream MCP server the tool comes from; None: the gateway's own."""
        ...


class ConsentProfile(NamedTuple):
    """What consent needs to know of a tool, whoever asks about it."""

    risk: RiskTier
    destructive: bool
    """No Allow always (`choices_for`)."""
    fingerprint: str
    """A stored decision counts only for this very definition (`pick_grant`)."""


def consent_profile(tool: DescribedTool, *, trusted: bool = True) -> ConsentProfile:
    """The tool's risk tier, whether it is destructive, and its fingerprint.

    The gateway's own tool: trusted unless said otherwise, its declared `_meta` tier first. An upstream's
    tool (`origin`): trusted only as the policy's `trust` says, and its server's `_meta` never counts,
    whatever it declares (decision 86); its fingerprint covers the digest of its pinned definition
    (`definition_sha256`: the description too), so a grant holds only for the definition it was given for.
    """
    origin = tool.origin
    if origin is None:
        declared, declaration = tool.meta.get(RISK_META_KEY), tool.meta.get(DECLARATION_META_KEY)
    else:
        declared, declaration, trusted = None, origin.definition_sha256, origin.trust == "trusted"
    return ConsentProfile(
        risk_tier(tool.annotations, trusted, declared=declared),
        is_destructive(tool.annotations),
        tool_fingerprint(tool.name, tool.input_schema, tool.annotations, declaration),
    )


def choices_for(destructive: bool, permitted: Collection[str] | None = None) -> tuple[Decision, ...]:
    """What a person may answer on a channel: what the policy lets it answer (`consent.channels`; None:
    everything), in the spec's order; Allow always is never offered for a destructive tool."""
    allow_always = () if destructive else (Decision.ALLOW_ALWAYS,)
    every = (Decision.ALLOW_ONCE, Decision.ALLOW_SESSION, *allow_always, Decision.DENY_ONCE, Decision.DENY_ALWAYS)
    return every if permitted is None else tuple(d for d in every if d in permitted)


UNKNOWN_CHANNEL = Channel.ELICITATION
"""How a grant whose channel was never recorded is read: as made in band, the least trusted channel."""


def lasting_allow_channels(channels: Mapping[str, Collection[str]]) -> frozenset[str]:
    """The channels whose stored Allow always counts: those the policy lets answer Allow always, and the CLI."""
    return frozenset({Channel.CLI, *(name for name, answers in channels.items() if Decision.ALLOW_ALWAYS in answers)})


def pick_grant(
    grants: Sequence[Grant], now: float, request: ConsentRequest, allow_from: Collection[str] = (Channel.CLI,)
) -> Grant | None:
    """The stored decision that answers this call: unrevoked, unexpired, made for this tool definition,
    and covering the call. A Deny covers any arguments, or those it was made for by meaning (every
    spelling of its paths, what is under them, whatever else comes along: `grant_scope.deny_covers`);
    an Allow covers any arguments or these very ones (their hash), and counts only when made through a
    channel in `allow_from`. A Deny beats an Allow; the newest of a kind wins."""
    live = [
        g
        for g in grants
        if g.revoked_at is None
        and (g.expires_at is None or g.expires_at > now)
        and g.fingerprint == request.fingerprint
    ]
    denies = [g for g in live if g.decision == GrantDecision.DENY and _deny_applies(g, request)]
    allows = [
        g
        for g in live
        if g.decision == GrantDecision.ALLOW
        and g.args_hash in (None, request.args_hash)
        and (g.channel or UNKNOWN_CHANNEL) in allow_from
    ]
    for matching in (denies, allows):
        if matching:
            return max(matching, key=lambda g: (g.granted_at, g.id))
    return None


def _deny_applies(grant: Grant, request: ConsentRequest) -> bool:
    if grant.arguments is not None:
        return deny_covers(grant.arguments, request.arguments, request.path_spellings)
    return grant.args_hash in (None, request.args_hash)


def grant_decision(decision: Decision) -> GrantDecision:
    """How a lasting decision (Allow always, Deny always) is stored."""
    return GrantDecision.ALLOW if decision.allows else GrantDecision.DENY


def lasting_decision(stored: GrantDecision) -> Decision:
    """What a stored decision answers: Allow always or Deny always."""
    return Decision.ALLOW_ALWAYS if stored == GrantDecision.ALLOW else Decision.DENY_ALWAYS


def grant_expiry(tier: RiskTier, policy: ConsentPolicy, now: float) -> float:
    return now + policy.expiry_days[tier] * DAY_S


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": DAY_S}


def parse_duration(text: str) -> float:
    """`90s`, `15m`, `8h`, `7d` (or bare seconds) as seconds; ValueError otherwise."""
    match = re.fullmatch(r"(\d+)([smhd]?)", text.strip())
    if match is None or int(match.group(1)) == 0:
        raise ValueError(f"not a duration: {text!r} (use e.g. 90s, 15m, 8h, 7d)")
    return int(match.group(1)) * _DURATION_UNITS[match.group(2) or "s"]


# --- the question (its words: gateway/consent/text.py) ---------------------------------------------


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
    path_spellings: Mapping[str, frozenset[str]] = field(default_factory=lambda: MappingProxyType({}))
    """For each path argument of the tool, the call's spellings of it (gateway/consent/grant_scope.py): what a
    Deny made for a path is compared with."""
    question_id: str | None = None
    """The question's id when it is not the call's own (a host its run's proxy asks about: gateway/consent/network.py);
    None: the run id."""


def decision_schema(choices: tuple[Decision, ...]) -> dict[str, Any]:
    """The form (docs/consent.md, "The prompt (elicitation)"): one required string field `decision`, the
    choices as its enum; when they start with a deny (`deny_first`), that is the field's default."""
    field: dict[str, Any] = {"type": "string", "title": "Decision", "enum": [c.value.lower() for c in choices]}
    if choices and not choices[0].allows:
        field["default"] = choices[0].value.lower()
    return {"type": "object", "properties": {"decision": field}, "required": ["decision"]}


def deny_first(choices: tuple[Decision, ...]) -> tuple[Decision, ...]:
    """The choices for a question whose message was cut: Deny once first, so it, not an allow, is the default."""
    return (Decision.DENY_ONCE, *(c for c in choices if c is not Decision.DENY_ONCE))


def decision_from_form(action: str, content: Mapping[str, Any] | None, choices: tuple[Decision, ...]) -> Decision:
    """The client's form answer: accept with an offered decision, or else (decline, cancel, anything) Deny once."""
    answer = str((content or {}).get("decision", "")).upper() if action == "accept" else ""
    return Decision(answer) if answer in {c.value for c in choices} else Decision.DENY_ONCE


@dataclass(frozen=True, slots=True)
class NoAnswer:
    """The question got no answer from anyone: a deny that no person made."""

    why: Literal["client_gone", "client_error", "invalid_answer"]
    """client_gone: the connection closed; client_error: an error response to the question;
    invalid_answer: a response that is not an elicitation result."""


class ConsentChannel(Protocol):
    """A way of asking a person about a call (docs/consent.md, "The flow"), one of three: `Dialog` (the
    client's own form, `elicitation/create`), `RoundTrip` (a 2026-07-28 client: the question goes back
    with the result, the answer comes with the retry) and `OUT_OF_BAND` (a question in the database for
    the terminal approver or the console). The stage picks the choices and the fallback; the channel asks."""

    @property
    def channel(self) -> Channel:
        """Whose answers `consent.channels` limits, and the channel a timeout is recorded under: in band
        (`elicitation`) or out of band (`approver`). An in-band channel the policy lets answer nothing
        falls back to `OUT_OF_BAND`."""
        ...

    @property
    def waits(self) -> bool:
        """Whether the stage waits here for the answer (and tells the client so: gateway/progress.py)."""
        ...

    async def ask(self, stage: ConsentStage, request: ConsentRequest, choices: tuple[Decision, ...]) -> Answer | None:
        """The person's answer among `choices`; None when nobody answered in time."""
        ...


class ConsentAsker(Protocol):
    """The person behind the client, asked through its form (gateway/server.py `ElicitationAsker`). Returns
    their decision, None for decline/cancel, or NoAnswer when nobody answered (the client went away or
    failed the question)."""

    async def ask(self, message: str, choices: tuple[Decision, ...]) -> Decision | NoAnswer | None: ...


@dataclass(frozen=True, slots=True)
class Dialog:
    """A 2025-era client that declared form elicitation: the stage asks it with `elicitation/create` and
    waits for its answer, the question stored `in_dialog` meanwhile."""

    client: ConsentAsker

    @property
    def channel(self) -> Channel:
        return Channel.ELICITATION

    @property
    def waits(self) -> bool:
        return True

    async def ask(self, stage: ConsentStage, request: ConsentRequest, choices: tuple[Decision, ...]) -> Answer | None:
        return await stage.ask_in_dialog(request, self.client, choices)


@dataclass(frozen=True, slots=True)
class OutOfBand:
    """A client that cannot elicit (or may not answer): the question waits in the database for the
    terminal approver or the console, each question decided once (gateway/consent/actions.py)."""

    @property
    def channel(self) -> Channel:
        return Channel.APPROVER

    @property
    def waits(self) -> bool:
        return True

    async def ask(self, stage: ConsentStage, request: ConsentRequest, choices: tuple[Decision, ...]) -> Answer | None:
        return await stage.ask_out_of_band(request, choices)


OUT_OF_BAND = OutOfBand()


@dataclass(frozen=True, slots=True)
class RoundTrip:
    """A 2026-07-28 client that declared elicitation: no server-to-client requests exist, so the
    question goes back as an `input_required` result and the answer comes with the client's retry
    of the same call (`input_responses["consent"]`, the echoed `request_state`). Nothing waits here."""

    action: str | None = None
    """The retry's answer: accept, decline or cancel; None on the first round."""
    content: Mapping[str, Any] | None = None
    state: str | None = None
    """The question's id, which is the first round's run_id (its card is the call's: gateway/calls.py)."""
    on_question: Callable[[str], None] | None = None
    """Told the question's id once the retry's answer is found to be its own (this very call's, and the
    first to answer it): from then on the retry moves the first round's card, and opens none."""

    @property
    def channel(self) -> Channel:
        return Channel.ELICITATION

    @property
    def waits(self) -> bool:
        return False

    async def ask(self, stage: ConsentStage, request: ConsentRequest, choices: tuple[Decision, ...]) -> Answer | None:
        return await in_db_thread(stage.ask_round_trip, request, self, choices)


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
    channel: Channel
    decided_by: str | None = None
    no_answer: str | None = None
    """With Origin.NO_ANSWER: why nobody answered (NoAnswer.why)."""


def decision_event(
    request: ConsentRequest, answer: Answer, reason: str | None = None, extra: Mapping[str, Any] | None = None
) -> EventDraft:
    """`mcp.permission.decision`: what was decided about the call, how, through which channel, by whom
    (or why nobody), and for a deny why (`reason`); `extra` adds what the decision left (a grant's id,
    its expiry, the rule that decided)."""
    detail: dict[str, Any] = {
        "decision": str(answer.decision),
        "risk_tier": request.risk,
        "origin": str(answer.origin),
        "server_id": request.server_id,
        "channel": str(answer.channel),
        **(extra or {}),
    }
    if answer.decided_by:
        detail["decided_by"] = answer.decided_by
    if answer.no_answer:
        detail["no_answer"] = answer.no_answer
    if reason:
        detail["reason"] = reason
    run_id = request.run_id
    if request.question_id is not None:
        # A question of its own about the run (a host: gateway/consent/network.py) is its own decision: a call
        # has at most one (gateway/audit.py `call_ends`), so it is filed under the question, naming the run.
        run_id, detail["for_run"], detail["about"] = request.question_id, request.run_id, QUESTION_ABOUT
    return EventDraft(
        EventType.PERMISSION_DECISION,
        run_id=run_id,
        user=request.user,
        workspace=request.workspace,
        tool_name=request.tool_name,
        args_hash=request.args_hash,
        detail=detail,
    )


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
        self._allow_from = lasting_allow_channels(policy.channels)

    async def require(
        self, request: ConsentRequest, channel: ConsentChannel, progress: CallProgress = NO_PROGRESS
    ) -> Decision:
        """Return the allowing decision, or record the denial and raise ConsentDeniedError.

        While a person is being asked, `progress` tells the caller where to answer and the time left."""
        stored = await in_db_thread(self._stored, request)
        if stored is not None:
            return stored
        if not channel.waits:  # the round trip: the client asks and calls again
            return await self._asked(request, channel)
        deadline = time.monotonic() + self._policy.timeout_s
        where = "in your client's dialog" if self._in_band(channel) else "with `mcp-gateway approvals` or the console"

        def describe() -> str:
            return (
                f"Waiting for a person to allow {request.tool_name} (answer {where}):"
                f" {seconds_left(deadline)} s left, then it is denied"
            )

        async with progress.waiting(describe):
            return await self._asked(request, channel)

    async def review_changes(
        self, request: ConsentRequest, prompt: str, channel: ConsentChannel, progress: CallProgress = NO_PROGRESS
    ) -> Answer:
        """A `workspace: review` run's change set put to a person (decision 80): the answer, recorded.

        Only Allow once and Deny once are offered, by the client's form when the policy lets it allow
        once, else out of band (a 2026-07-28 round trip too: its run is over and cannot wait for a
        retry). No stored grant, session allow or `consent.mode` ever allows it, and nothing of it is
        stored as a grant. No answer before `consent.timeout_s`, a failed dialog, or `consent.mode: deny`
        is a deny. The decision is `mcp.permission.decision` with `detail.about: change_set`."""
        in_band = isinstance(channel, Dialog) and self._may_answer(Channel.ELICITATION, Decision.ALLOW_ONCE)
        asked_on: Channel = Channel.ELICITATION if in_band else Channel.APPROVER
        choices = tuple(d for d in _REVIEW_CHOICES if self._may_answer(asked_on, d)) or (Decision.DENY_ONCE,)
        question = dataclasses.replace(
            self._question(request, self._new_id(), self._clock.now(), choices),
            kind=QuestionKind.CHANGE_REVIEW,
            run_id=request.run_id,
            preview=visible(prompt, lines=True),
        )
        extra = {"about": CHANGE_REVIEW, "question_id": question.id}
        answer: Answer | None
        if self._policy.mode == "deny":
            answer = Answer(Decision.DENY_ONCE, Origin.POLICY, Channel.POLICY)
        else:
            where = "in your client's dialog" if in_band else "with `mcp-gateway approvals` or the console"
            deadline = time.monotonic() + self._policy.timeout_s

            def describe() -> str:
                return (
                    f"Waiting for a person to apply {request.tool_name}'s changes (answer {where}):"
                    f" {seconds_left(deadline)} s left, then they are not applied"
                )

            async with progress.waiting(describe):
                if in_band and isinstance(channel, Dialog):
                    answer = await self._dialog(request, channel.client, question, prompt, deny_first(choices))
                else:
                    answer = await self.ask_out_of_band(request, choices, question)
            if answer is None:
                answer = Answer(Decision.DENY_ONCE, Origin.TIMEOUT, asked_on)
        if answer.decision is not Decision.ALLOW_ONCE:
            answer = dataclasses.replace(answer, decision=Decision.DENY_ONCE)
        reason = None if answer.decision.allows else Reason.CHANGES_DENIED
        await in_db_thread(self._record, request, answer, reason=reason, extra=extra)
        return answer

    def _may_answer(self, channel: Channel, decision: Decision) -> bool:
        permitted = self._policy.channels.get(channel)
        return permitted is None or decision in permitted

    def _stored(self, request: ConsentRequest) -> Decision | None:
        """A stored grant or this session's allow decides (raising if it denies); None: a person must."""
        grants = self._store.fetch_grants(request.user, request.workspace, request.server_id, request.tool_name)
        grant = pick_grant(grants, self._clock.now(), request, self._allow_from)
        if grant is not None:
            answer = Answer(lasting_decision(grant.decision), Origin.CACHE_HIT, Channel.STORED, grant.granted_by)
            return self._conclude(request, answer, grant)
        if self._session_key(request) in self._session_allows:
            return self._conclude(request, Answer(Decision.ALLOW_SESSION, Origin.CACHE_HIT, Channel.SESSION), None)
        if self._policy.mode == "deny":
            self._record(
                request, Answer(Decision.DENY_ONCE, Origin.POLICY, Channel.POLICY), reason=Reason.CONSENT_MODE_DENY
            )
            raise ConsentDeniedError(Reason.CONSENT_MODE_DENY, _REFUSED_BY_POLICY)
        return None

    async def _asked(self, request: ConsentRequest, channel: ConsentChannel) -> Decision:
        """The person's answer, through `channel` if the policy lets it answer, else out of band;
        then what it decides (`_concluded`)."""
        if not self._in_band(channel):
            channel = OUT_OF_BAND
        answer = await channel.ask(
            self, request, choices_for(request.destructive, self._policy.channels.get(channel.channel))
        )
        return await in_db_thread(self._concluded, request, answer, channel.channel)

    def _concluded(self, request: ConsentRequest, answer: Answer | None, asked_on: Channel) -> Decision:
        """What a person's answer (or its absence) decides, recorded; a timeout under the channel asked on."""
        if answer is not None and answer.origin is Origin.NO_ANSWER:
            self._record(request, answer, reason=Reason.CONSENT_NO_ANSWER)
            raise ConsentDeniedError(Reason.CONSENT_NO_ANSWER, _NO_ANSWER)
        if answer is None:
            self._record(request, Answer(Decision.DENY_ONCE, Origin.TIMEOUT, asked_on), reason=Reason.CONSENT_TIMEOUT)
            raise ConsentDeniedError(Reason.CONSENT_TIMEOUT, _TIMED_OUT)
        return self._conclude(request, answer, None)

    async def ask_in_dialog(
        self, request: ConsentRequest, client: ConsentAsker, choices: tuple[Decision, ...]
    ) -> Answer | None:
        """`Dialog`: the client's answer; decline and cancel are Deny once; Origin.NO_ANSWER when the client
        went away or failed the question; None when nobody answered in time."""
        prompt = prompt_for(request, self._policy.locale)
        question = self._question(request, request.question_id or request.run_id, self._clock.now(), choices)
        return await self._dialog(
            request, client, question, prompt.text, deny_first(choices) if prompt.cut else choices
        )

    async def _dialog(
        self,
        request: ConsentRequest,
        client: ConsentAsker,
        question: PendingRequest,
        message: str,
        offered: tuple[Decision, ...],
    ) -> Answer | None:
        """Ask `question` in the client's form (`offered`, in that order), stored `in_dialog` meanwhile."""
        choices = tuple(Decision(c) for c in question.choices or ())
        # Stored while the dialog is open, so it counts in the cap of open questions (decision 70).
        await in_db_thread(self._open, request, question, Channel.ELICITATION, QuestionStatus.IN_DIALOG)
        try:
            with anyio.move_on_after(self._policy.timeout_s):
                decision = await client.ask(message, offered)
                if isinstance(decision, NoAnswer):
                    return Answer(Decision.DENY_ONCE, Origin.NO_ANSWER, Channel.ELICITATION, no_answer=decision.why)
                given = decision if decision in choices else Decision.DENY_ONCE  # decline, cancel, or not offered
                return Answer(given, Origin.USER_PROMPT, Channel.ELICITATION)
            return None
        finally:
            with anyio.CancelScope(shield=True):
                await in_db_thread(self._store.expire, question.id, self._clock.now(), QuestionStatus.IN_DIALOG)

    def _in_band(self, channel: ConsentChannel) -> bool:
        """Whether the client answers: it declared elicitation, and the policy lets elicitation answer."""
        return channel.channel is Channel.ELICITATION and bool(self._policy.channels.get(Channel.ELICITATION))

    def ask_round_trip(self, request: ConsentRequest, trip: RoundTrip, choices: tuple[Decision, ...]) -> Answer | None:
        """`RoundTrip`, in a database thread. First round: store the question and ask for a retry. Retry: the
        question it answers must be this very call's (user, workspace, tool, arguments), still open, and is
        closed by this answer.

        `request_state` is only the question's id, 128 random bits: what it stands for is in the
        database, so a forged, replayed, stale or transplanted state finds nothing to answer.
        """
        now = self._clock.now()
        prompt = prompt_for(request, self._policy.locale)
        if trip.state is None or trip.action is None:
            # The question's id is this round's run_id, as an approver's question's is its call's: the
            # retry that answers it continues this round's card. Like any run_id, 128 random bits.
            state = request.run_id
            self._open(
                request,
                self._question(request, state, now, choices),
                Channel.ELICITATION,
                QuestionStatus.AWAITING_CLIENT,
            )
            raise InputRequired(prompt.text, decision_schema(deny_first(choices) if prompt.cut else choices), state)
        row = self._store.fetch_request(trip.state)
        same_call = row is not None and (row.user, row.workspace, row.tool_name, row.args_hash) == (
            request.user,
            request.workspace,
            request.tool_name,
            request.args_hash,
        )
        if row is None or not same_call:
            self._record(
                request,
                Answer(Decision.DENY_ONCE, Origin.POLICY, Channel.ELICITATION),
                reason=Reason.CONSENT_STATE_INVALID,
            )
            raise ConsentDeniedError(Reason.CONSENT_STATE_INVALID, _STATE_INVALID)
        decision = decision_from_form(trip.action, trip.content, choices)
        if not self._store.decide(
            trip.state, decision.value, f"client:{request.user}", now, waiting=QuestionStatus.AWAITING_CLIENT
        ):
            if row.expires_at <= now:
                if row.status == QuestionStatus.AWAITING_CLIENT:  # a round's question nobody answered in time: its card
                    _answers(trip)
                return None  # answered after consent.timeout_s: a timeout
            self._record(
                request,
                Answer(Decision.DENY_ONCE, Origin.POLICY, Channel.ELICITATION),
                reason=Reason.CONSENT_STATE_INVALID,
            )
            raise ConsentDeniedError(Reason.CONSENT_STATE_INVALID, _STATE_INVALID)  # answered already: a replay
        _answers(trip)
        return Answer(decision, Origin.USER_PROMPT, Channel.ELICITATION)

    def _question(
        self, request: ConsentRequest, question_id: str, now: float, choices: tuple[Decision, ...]
    ) -> PendingRequest:
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
            preview=None if request.preview is None else visible(request.preview, lines=True),
            choices=tuple(c.value for c in choices),
            run_id=None if request.question_id is None else request.run_id,
        )

    async def ask_out_of_band(
        self, request: ConsentRequest, choices: tuple[Decision, ...], question: PendingRequest | None = None
    ) -> Answer | None:
        """`OUT_OF_BAND`: the decision an approver or the console stores for the question (by default the
        call's own, its id the run's); None when none came before `consent.timeout_s`."""
        if question is None:
            question = self._question(request, request.question_id or request.run_id, self._clock.now(), choices)
        await in_db_thread(self._open, request, question, Channel.APPROVER, QuestionStatus.PENDING)
        pause, answer = _POLL_FIRST_S, None
        try:
            with anyio.move_on_after(self._policy.timeout_s):
                while answer is None:
                    answer = await in_db_thread(self._answer_of, question.id, choices)
                    if answer is None:
                        await anyio.sleep(pause)
                        pause = min(pause * 2, _POLL_MAX_S)
        finally:
            if answer is None:  # past the timeout, or cancelled: close the question
                with anyio.CancelScope(shield=True):
                    closed = await in_db_thread(self._store.expire, question.id, self._clock.now())
        # A decision that got in before the question closed still counts.
        if answer is not None or closed:
            return answer
        return await in_db_thread(self._answer_of, question.id, choices)

    def _open(
        self, request: ConsentRequest, question: PendingRequest, channel: Channel, status: QuestionStatus
    ) -> None:
        """Store the question, or record and raise the refusal when its user has too many open already."""
        try:
            self._store.insert_request(question, status=status)
        except ConsentDeniedError as exc:  # consent_questions_limit: nobody is asked
            review = question.kind == QuestionKind.CHANGE_REVIEW
            extra = {"about": CHANGE_REVIEW, "question_id": question.id} if review else None
            self._record(request, Answer(Decision.DENY_ONCE, Origin.POLICY, channel), reason=exc.reason, extra=extra)
            raise

    def _answer_of(self, request_id: str, choices: tuple[Decision, ...]) -> Answer | None:
        row = self._store.fetch_request(request_id)
        if row is None or row.status != QuestionStatus.DECIDED or row.decision is None:
            return None
        decision = Decision(row.decision) if row.decision in Decision.__members__ else Decision.DENY_ONCE
        if decision not in choices:
            decision = Decision.DENY_ONCE  # e.g. Allow always for a destructive tool: never granted
        return Answer(decision, Origin.USER_PROMPT, Channel.APPROVER, row.decided_by)

    def _conclude(self, request: ConsentRequest, answer: Answer, grant: Grant | None) -> Decision:
        """Store what lasts, audit the decision, and raise unless it allows."""
        now = self._clock.now()
        detail: dict[str, Any] = {}
        if grant is not None:
            detail["grant_id"] = grant.id
            detail["grant_channel"] = grant.channel or "unknown"
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
                    decision=grant_decision(answer.decision),
                    fingerprint=request.fingerprint,
                    granted_at=now,
                    expires_at=expires_at,
                    granted_by=answer.decided_by or f"{answer.channel}:{request.user}",
                    channel=answer.channel,
                )
            )
            detail["expires_at"] = expires_at
        elif answer.decision is Decision.ALLOW_SESSION:
            self._session_allows.add(self._session_key(request))
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
        self._audit.append(decision_event(request, answer, reason, extra))


def _answers(trip: RoundTrip) -> None:
    """The retry is found to answer its question (`RoundTrip.on_question`)."""
    if trip.on_question is not None and trip.state is not None:
        trip.on_question(trip.state)


_REVIEW_CHOICES = (Decision.ALLOW_ONCE, Decision.DENY_ONCE)
"""A change review's only answers (decision 80): nothing about it lasts beyond the one run."""
_DENY_REASONS = {Decision.DENY_ONCE: Reason.CONSENT_DENIED, Decision.DENY_ALWAYS: Reason.CONSENT_DENIED_ALWAYS}
_DENIED = "a person denied this call; retrying will not help unless they change their mind"
_DENIED_ALWAYS = (
    "a person denied this tool for good (deny always); retrying will not help until they revoke that decision"
)
_TIMED_OUT = "no person answered before the consent timeout; the call was denied"
_NO_ANSWER = "the client failed or closed the consent question and nobody answered it; the call was denied"
_REFUSED_BY_POLICY = "the policy allows no consent prompts (consent.mode: deny)"
_STATE_INVALID = "the consent answer does not belong to an open question about this call; call again without it"
