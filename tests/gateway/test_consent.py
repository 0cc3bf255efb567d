"""Consent's decisions, table by table, and the stage on a real SQLite database with an injected clock."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Any

import anyio
import pytest
from sqlalchemy import Engine, event

from gateway.audit import AuditLog, EventType
from gateway.consent.stage import (
    OUT_OF_BAND,
    RISK_META_KEY,
    Answer,
    ConsentChannel,
    ConsentRequest,
    ConsentStage,
    Decision,
    Dialog,
    Origin,
    RoundTrip,
    choices_for,
    consent_profile,
    decision_event,
    grant_decision,
    is_destructive,
    lasting_decision,
    parse_duration,
    pick_grant,
    risk_tier,
    tool_fingerprint,
)
from gateway.consent.store import Channel, ConsentStore, Grant, GrantDecision
from gateway.errors import ConsentDeniedError
from gateway.permission_prompt import AGENT_TOOLS, agent_tool_consent
from gateway.permission_prompt import SPEC as CHECK_PERMISSION_TOOL
from gateway.policy import CONSENT_CHANNELS, ConsentPolicy
from gateway.tools.base import Trust
from gateway.tools.registry import TOOLS
from tests.fakes import T0, FakeClock, SequentialRunIds
from tests.upstream_tools import upstream_tool

RUN_PYTEST = {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": True, "openWorldHint": False}


READ = {"readOnlyHint": True, "openWorldHint": False}


@pytest.mark.parametrize(
    ("annotations", "trusted", "declared", "tier"),
    [
        (READ, True, None, "low"),
        (READ, False, None, "medium"),
        ({**READ, "destructiveHint": False, "idempotentHint": True}, True, None, "low"),
        (RUN_PYTEST, True, None, "medium"),
        (RUN_PYTEST, False, None, "medium"),  # side effects: trust moves only a read-only tool
        ({**RUN_PYTEST, "destructiveHint": True}, True, None, "high"),
        ({**RUN_PYTEST, "openWorldHint": True}, True, None, "high"),
        ({**RUN_PYTEST, "openWorldHint": "no"}, True, None, "high"),  # not a boolean: the MCP default, open world
        ({**READ, "openWorldHint": True}, True, None, "high"),  # read-only and open world (decision 86)
        ({"readOnlyHint": True}, True, None, "high"),  # ... open world by MCP's default
        ({**READ, "destructiveHint": True}, True, None, "high"),  # read-only and destructive (decision 86)
        ({**RUN_PYTEST, "idempotentHint": False}, True, None, "high"),  # side effects the rule does not name
        ({**RUN_PYTEST, "idempotentHint": "yes"}, True, None, "high"),
        ({"readOnlyHint": False}, True, None, "high"),  # the MCP defaults: destructive, open world
        ({"title": "t"}, True, None, "high"),
        ({}, True, None, "high"),
        (None, True, None, "high"),
        (RUN_PYTEST, True, "low", "low"),  # the gateway's own tool's tier in _meta wins
        (RUN_PYTEST, True, "extreme", "medium"),  # ...when it is a tier
    ],
)
def test_risk_tier(annotations: dict[str, Any] | None, trusted: bool, declared: object, tier: str) -> None:
    assert risk_tier(annotations, trusted, declared) == tier


@pytest.mark.parametrize(
    ("annotations", "destructive"),
    [
        (RUN_PYTEST, False),
        ({"readOnlyHint": False}, True),
        ({"readOnlyHint": False, "destructiveHint": "no"}, True),  # not a boolean: the MCP default
        ({"readOnlyHint": True}, False),  # destructiveHint's default means nothing for a read-only tool
        ({"readOnlyHint": True, "destructiveHint": True}, True),  # ...but said, it counts (decision 86)
        ({}, True),
        (None, True),
    ],
)
def test_is_destructive(annotations: dict[str, Any] | None, destructive: bool) -> None:
    assert is_destructive(annotations) is destructive


GATEWAY_TIERS = {
    "run_pytest": ("medium", False),
    "list_artifacts": ("low", False),
    "get_evidence": ("low", False),
    "get_artifact_content": ("low", False),
}
"""Every built-in tool's tier, the same before and after decision 86 (the read tools say they are closed world)."""


def test_every_built_in_tool_keeps_its_tier() -> None:
    profiles = {name: consent_profile(spec) for name, spec in TOOLS.items()}
    assert {name: (p.risk, p.destructive) for name, p in profiles.items()} == GATEWAY_TIERS
    assert consent_profile(CHECK_PERMISSION_TOOL)[:2] == ("low", False)


def test_an_upstream_tool_is_trusted_as_the_policy_says_and_its_meta_never_counts() -> None:
    trusted = upstream_tool(trust=Trust.TRUSTED, annotations=READ)
    assert consent_profile(trusted).risk == "low"
    assert trusted.origin is not None
    untrusted = dataclasses.replace(trusted, origin=dataclasses.replace(trusted.origin, trust=Trust.UNTRUSTED))
    assert consent_profile(untrusted).risk == "medium"
    assert consent_profile(untrusted, trusted=True).risk == "medium", "the origin's trust, not the caller's"
    for claimed in ("low", "medium"):
        lowered = dataclasses.replace(untrusted, meta=MappingProxyType({RISK_META_KEY: claimed}))
        assert consent_profile(lowered).risk == "medium", "a server cannot lower its tier"
    raised = dataclasses.replace(untrusted, meta=MappingProxyType({RISK_META_KEY: "high"}))
    assert consent_profile(raised).risk == "medium", "nor set it: its _meta is not read at all"


def test_an_upstream_tools_fingerprint_covers_its_pinned_definition() -> None:
    spec = upstream_tool()
    assert spec.origin is not None
    profile = consent_profile(spec)
    assert profile.fingerprint == tool_fingerprint(spec.name, spec.input_schema, spec.annotations, "d" * 64)
    changed = dataclasses.replace(spec, origin=dataclasses.replace(spec.origin, definition_sha256="e" * 64))
    assert consent_profile(changed).fingerprint != profile.fingerprint, "a new description is a new definition"
    assert consent_profile(changed).risk == profile.risk


def test_allow_always_is_never_offered_for_a_destructive_tool() -> None:
    assert Decision.ALLOW_ALWAYS not in choices_for(destructive=True)
    assert choices_for(destructive=False) == tuple(Decision)
    assert Decision.ALLOW_ALWAYS not in choices_for(destructive=True, permitted=set(Decision))


def test_a_channel_is_offered_what_the_policy_lets_it_answer() -> None:
    in_band = ConsentPolicy().channels["elicitation"]
    assert choices_for(False, in_band) == (
        Decision.ALLOW_ONCE, Decision.ALLOW_SESSION, Decision.DENY_ONCE, Decision.DENY_ALWAYS,
    )  # fmt: skip
    assert choices_for(False, ConsentPolicy().channels["approver"]) == tuple(Decision)


def test_the_fingerprint_changes_with_the_schema_or_the_annotations() -> None:
    base = tool_fingerprint("run_pytest", {"type": "object"}, RUN_PYTEST)
    assert base == tool_fingerprint("run_pytest", {"type": "object"}, dict(reversed(list(RUN_PYTEST.items()))))
    assert base != tool_fingerprint("run_pytest", {"type": "object", "required": ["x"]}, RUN_PYTEST)
    assert base != tool_fingerprint("run_pytest", {"type": "object"}, {**RUN_PYTEST, "destructiveHint": True})


def test_consent_profile_of_a_gateway_tool_reads_its_annotations_and_declared_tier() -> None:
    spec = TOOLS["run_pytest"]
    profile = consent_profile(spec)
    assert profile == (
        risk_tier(spec.annotations, True, spec.meta.get(RISK_META_KEY)),
        is_destructive(spec.annotations),
        tool_fingerprint(spec.name, spec.input_schema, spec.annotations),
    )
    assert (profile.risk, profile.destructive) == ("medium", False)
    declared = dataclasses.replace(spec, meta=MappingProxyType({RISK_META_KEY: "high"}))
    assert consent_profile(declared).risk == "high"
    assert consent_profile(declared).fingerprint == profile.fingerprint, "the tier is not part of the definition"


@pytest.mark.parametrize(
    ("tool", "risk", "destructive"),
    [
        ("Bash", "high", True),
        ("Edit", "high", True),
        ("Read", "low", False),  # a closed-world read is trusted
        ("WebFetch", "high", False),  # an open-world read is high (decision 86)
        ("WebSearch", "high", False),
        ("Task", "high", True),  # not described: the MCP defaults
    ],
)
def test_consent_profile_of_an_agent_tool(tool: str, risk: str, destructive: bool) -> None:
    profile = agent_tool_consent(tool)
    assert (profile.risk, profile.destructive) == (risk, destructive)
    assert profile.fingerprint == tool_fingerprint(tool, {}, AGENT_TOOLS.get(tool, {}))


@pytest.mark.parametrize("decision", [Decision.ALLOW_ALWAYS, Decision.DENY_ALWAYS])
def test_a_lasting_decision_is_stored_as_allow_or_deny_and_read_back(decision: Decision) -> None:
    stored = grant_decision(decision)
    assert stored == ("ALLOW" if decision.allows else "DENY"), "the strings the table has always held"
    assert lasting_decision(stored) is decision
    assert lasting_decision(GrantDecision(str(stored))) is decision


DECISION_EVENTS = [
    pytest.param(
        Answer(Decision.ALLOW_ALWAYS, Origin.CACHE_HIT, Channel.STORED, "approvals:bob"),
        None,
        {"grant_id": 7, "grant_channel": "approver"},
        {"decision": "ALLOW_ALWAYS", "origin": "cache_hit", "channel": "stored", "grant_id": 7,
         "grant_channel": "approver", "decided_by": "approvals:bob"},
        id="a stored grant",
    ),
    pytest.param(
        Answer(Decision.DENY_ONCE, Origin.NO_ANSWER, Channel.ELICITATION, no_answer="client_gone"),
        "consent_no_answer",
        None,
        {"decision": "DENY_ONCE", "origin": "no_answer", "channel": "elicitation", "no_answer": "client_gone",
         "reason": "consent_no_answer"},
        id="nobody answered",
    ),
    pytest.param(
        Answer(Decision.ALLOW_ONCE, Origin.POLICY, Channel.RULES),
        None,
        {"rule": "Bash(pytest -q)"},
        {"decision": "ALLOW_ONCE", "origin": "policy", "channel": "rules", "rule": "Bash(pytest -q)"},
        id="an agent's rule",
    ),
    pytest.param(
        Answer(Decision.DENY_ALWAYS, Origin.POLICY, Channel.CLI, "cli:root"),
        None,
        {"grant_id": 3, "expires_at": None},
        {"decision": "DENY_ALWAYS", "origin": "policy", "channel": "cli", "grant_id": 3, "expires_at": None,
         "decided_by": "cli:root"},
        id="consent grant at the terminal",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("answer", "reason", "extra", "detail"), DECISION_EVENTS)
def test_decision_event(
    answer: Answer, reason: str | None, extra: dict[str, Any] | None, detail: dict[str, Any]
) -> None:
    drafted = decision_event(request("r9"), answer, reason, extra)
    assert drafted.event_type is EventType.PERMISSION_DECISION
    assert (drafted.run_id, drafted.user, drafted.workspace, drafted.tool_name, drafted.args_hash, drafted.code) == (
        "r9", "alice", "default", "run_pytest", "a" * 64, None,
    )  # fmt: skip
    assert drafted.detail == {"risk_tier": "medium", "server_id": "mcp-write-gateway", **detail}


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("90s", 90), ("15m", 900), ("8h", 28800), ("7d", 604800)])
def test_parse_duration(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "0s", "7w", "-1d", "1.5h", "d"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


def grant(decision: str = "ALLOW", **changes: Any) -> Grant:
    values: dict[str, Any] = {
        "id": 1,
        "user": "alice",
        "workspace": "default",
        "server_id": "mcp-write-gateway",
        "tool_name": "run_pytest",
        "args_hash": None,
        "decision": decision,
        "fingerprint": "f" * 64,
        "granted_at": T0,
        "expires_at": T0 + 100,
        "granted_by": "test",
        "channel": "approver",
    }
    values.update(changes)
    return Grant(**values)


APPROVER_AND_CLI = frozenset({"approver", "cli"})
"""The channels whose Allow always counts under the default consent.channels."""


def call_with(args_hash: str, arguments: dict[str, Any] | None = None, **spellings: frozenset[str]) -> ConsentRequest:
    return ConsentRequest(
        run_id="r",
        user="alice",
        workspace="default",
        server_id="mcp-write-gateway",
        tool_name="run_pytest",
        args_hash=args_hash,
        arguments=arguments or {"test_path": "tests"},
        risk="medium",
        fingerprint="f" * 64,
        path_spellings=spellings,
    )


@pytest.mark.parametrize(
    ("grants", "now", "args_hash", "expected"),
    [
        ([grant()], T0 + 99, "a", 1),
        ([grant()], T0 + 100, "a", None),  # expired at expires_at
        ([grant(expires_at=None)], T0 + 10**9, "a", 1),
        ([grant(fingerprint="0" * 64)], T0, "a", None),  # made for another tool definition
        ([grant(args_hash="b")], T0, "a", None),  # made for other arguments
        ([grant(args_hash="a")], T0, "a", 1),
        ([grant(id=1), grant("DENY", id=2, granted_at=T0 - 5)], T0, "a", 2),  # deny beats allow
        ([grant(id=1), grant(id=3, granted_at=T0 + 1)], T0 + 2, "a", 3),  # the newest of a kind
        ([grant(revoked_at=T0)], T0, "a", None),
        ([grant(channel="elicitation")], T0, "a", None),  # an in-band Allow always: not by default
        ([grant(channel=None)], T0, "a", None),  # made before channels were recorded: read as in band
        ([grant(channel="cli")], T0, "a", 1),  # `consent grant`
        ([grant("DENY", channel="elicitation")], T0, "a", 1),  # a Deny counts from any channel
        ([grant("DENY", channel=None)], T0, "a", 1),
    ],
    ids=[
        "live",
        "expired",
        "no-expiry",
        "other-fingerprint",
        "other-args",
        "same-args",
        "deny-wins",
        "newest",
        "revoked",
        "in-band-allow-ignored",
        "unknown-channel-allow-ignored",
        "cli-allow",
        "in-band-deny",
        "unknown-channel-deny",
    ],
)
def test_pick_grant(grants: list[Grant], now: float, args_hash: str, expected: int | None) -> None:
    picked = pick_grant(grants, now, call_with(args_hash), APPROVER_AND_CLI)
    assert (picked.id if picked else None) == expected


def test_an_in_band_allow_counts_when_the_policy_lets_elicitation_make_one() -> None:
    opted_in = APPROVER_AND_CLI | {"elicitation"}
    assert pick_grant([grant(channel="elicitation")], T0, call_with("a"), opted_in) is not None
    assert pick_grant([grant(channel=None)], T0, call_with("a"), opted_in) is not None


@pytest.mark.parametrize(
    ("granted", "arguments", "spellings", "denied"),
    [
        ({"test_path": "tests/integration"}, {"test_path": "tests/integration/"}, {"tests/integration"}, True),
        ({"test_path": "tests/integration"}, {"test_path": "tests/unit"}, {"tests/unit"}, False),
        ({"test_path": "tests/integration"}, {"test_path": "t", "keyword": "x"}, {"tests/integration/a.py"}, True),
        ({"test_path": "tests/integration"}, {"test_path": "tests/integration"}, set(), True),  # no spelling: deny
    ],
    ids=["a-spelling", "another-folder", "under-it-with-another-option", "uncomparable"],
)
def test_an_args_scoped_deny_is_matched_by_meaning(
    granted: dict[str, Any], arguments: dict[str, Any], spellings: set[str], denied: bool
) -> None:
    deny = grant("DENY", args_hash="h", arguments=granted)
    picked = pick_grant([deny], T0, call_with("other", arguments, test_path=frozenset(spellings)), APPROVER_AND_CLI)
    assert (picked is not None) is denied


def test_an_args_scoped_allow_stays_exact_and_a_deny_without_stored_arguments_too() -> None:
    allow = grant(args_hash="h", arguments=None)
    old_deny = grant("DENY", id=2, args_hash="h")  # made before arguments were stored
    spelled = frozenset({"tests"})
    assert pick_grant([allow], T0, call_with("h", test_path=spelled), APPROVER_AND_CLI) is allow
    assert pick_grant([allow], T0, call_with("other", test_path=spelled), APPROVER_AND_CLI) is None
    assert pick_grant([old_deny], T0, call_with("h", test_path=spelled), APPROVER_AND_CLI) is old_deny
    assert pick_grant([old_deny], T0, call_with("other", test_path=spelled), APPROVER_AND_CLI) is None


# --- the stage on a real database -----------------------------------------------------------------


class Asker:
    """The person behind the client, as a queue of answers; counts the times asked."""

    def __init__(self, *answers: Decision | None) -> None:
        self.answers = list(answers)
        self.asked: list[tuple[Decision, ...]] = []

    async def ask(self, message: str, choices: tuple[Decision, ...]) -> Decision | None:
        self.asked.append(choices)
        return self.answers.pop(0)


EVERY_ANSWER = frozenset(Decision)
IN_BAND_ALWAYS = MappingProxyType({"elicitation": EVERY_ANSWER, "approver": EVERY_ANSWER})
"""consent.channels with the opt-in: the client's own Allow always is stored too."""


@pytest.fixture
def stage(engine: Engine, clock: FakeClock) -> ConsentStage:
    """A stage whose in-band answers may be Allow always (the opt-in), for what is not about channels."""
    policy = ConsentPolicy(timeout_s=5, channels=IN_BAND_ALWAYS)
    return ConsentStage(policy, AuditLog(engine, clock), ConsentStore(engine), clock, SequentialRunIds())


@pytest.fixture
def default_stage(engine: Engine, clock: FakeClock) -> ConsentStage:
    """A stage with the default consent.channels: only the approver's Allow always is stored."""
    policy = ConsentPolicy(timeout_s=5)
    return ConsentStage(policy, AuditLog(engine, clock), ConsentStore(engine), clock, SequentialRunIds())


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def request(run_id: str = "r1", fingerprint: str = "f" * 64, destructive: bool = False) -> ConsentRequest:
    return ConsentRequest(
        run_id=run_id,
        user="alice",
        workspace="default",
        server_id="mcp-write-gateway",
        tool_name="run_pytest",
        args_hash="a" * 64,
        arguments={"test_path": "tests"},
        risk="medium",
        fingerprint=fingerprint,
        destructive=destructive,
    )


def require(stage: ConsentStage, req: ConsentRequest, asker: Asker) -> Decision:
    return anyio.run(stage.require, req, Dialog(asker))


def test_t7_allow_always_expires_after_the_tiers_days(stage: ConsentStage, clock: FakeClock) -> None:
    asker = Asker(Decision.ALLOW_ALWAYS, Decision.ALLOW_ONCE)
    assert require(stage, request("r1"), asker) is Decision.ALLOW_ALWAYS
    clock.advance(30 * 86400 - 1)
    assert require(stage, request("r2"), asker) is Decision.ALLOW_ALWAYS, "still within 30 days (medium)"
    clock.advance(1)
    assert require(stage, request("r3"), asker) is Decision.ALLOW_ONCE, "expired: asked again"
    assert len(asker.asked) == 2


def test_a_changed_tool_definition_is_asked_again(stage: ConsentStage) -> None:
    asker = Asker(Decision.ALLOW_ALWAYS, Decision.DENY_ONCE)
    require(stage, request("r1"), asker)
    with pytest.raises(ConsentDeniedError):
        require(stage, request("r2", fingerprint="e" * 64), asker)
    assert len(asker.asked) == 2


def test_a_destructive_tool_is_never_offered_allow_always(stage: ConsentStage) -> None:
    asker = Asker(Decision.ALLOW_ONCE)
    require(stage, request(destructive=True), asker)
    assert Decision.ALLOW_ALWAYS not in asker.asked[0]


def test_a_cache_hit_costs_one_query_of_the_grants(stage: ConsentStage, engine: Engine) -> None:
    require(stage, request("r1"), Asker(Decision.ALLOW_ALWAYS))
    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", seen)
    try:
        assert require(stage, request("r2"), Asker()) is Decision.ALLOW_ALWAYS
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    reads = [s for s in statements if s.lstrip().upper().startswith("SELECT") and "consent" in s]
    assert len(reads) == 1, reads
    assert "consent_grants" in reads[0]


def test_out_of_band_a_decision_made_before_the_question_closed_counts(
    stage: ConsentStage, engine: Engine, clock: FakeClock
) -> None:
    store = ConsentStore(engine)

    async def approve_soon() -> None:
        while store.fetch_request("r1") is None:
            await anyio.sleep(0.01)
        assert store.decide("r1", "ALLOW_ONCE", "approver-a", clock.now())
        assert not store.decide("r1", "DENY_ALWAYS", "approver-b", clock.now()), "decided once"

    async def main() -> Decision:
        async with anyio.create_task_group() as group:
            group.start_soon(approve_soon)
            with anyio.fail_after(10):
                decision = await stage.require(request("r1"), OUT_OF_BAND)
        return decision

    assert anyio.run(main) is Decision.ALLOW_ONCE
    decided = store.fetch_request("r1")
    assert decided is not None and decided.decided_by == "approver-a"


def test_out_of_band_allow_always_for_a_destructive_tool_is_a_deny(
    stage: ConsentStage, engine: Engine, clock: FakeClock
) -> None:
    store = ConsentStore(engine)

    async def answer() -> None:
        while store.fetch_request("r1") is None:
            await anyio.sleep(0.01)
        store.decide("r1", "ALLOW_ALWAYS", "approver", clock.now())  # not offered for this tool

    async def main() -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(answer)
            with anyio.fail_after(10), pytest.raises(ConsentDeniedError):
                await stage.require(request("r1", destructive=True), OUT_OF_BAND)

    anyio.run(main)
    assert store.list_grants() == [], "nothing stored"


# --- which channel may answer, and what it may store (consent.channels) -----------------------------


def test_by_default_the_client_is_not_offered_allow_always_and_an_answer_of_it_stores_nothing(
    default_stage: ConsentStage, engine: Engine
) -> None:
    asker = Asker(Decision.ALLOW_ALWAYS)
    with pytest.raises(ConsentDeniedError):
        require(default_stage, request("r1"), asker)  # not offered: a Deny once
    assert Decision.ALLOW_ALWAYS not in asker.asked[0]
    assert Decision.DENY_ALWAYS in asker.asked[0] and Decision.ALLOW_SESSION in asker.asked[0]
    assert ConsentStore(engine).list_grants() == []


def test_an_in_band_deny_always_is_stored_with_its_channel(default_stage: ConsentStage, engine: Engine) -> None:
    with pytest.raises(ConsentDeniedError):
        require(default_stage, request("r1"), Asker(Decision.DENY_ALWAYS))
    (stored,) = ConsentStore(engine).list_grants()
    assert (stored.decision, stored.channel, stored.arguments) == ("DENY", "elicitation", None)
    with pytest.raises(ConsentDeniedError):
        require(default_stage, request("r2"), Asker())  # answered by the stored Deny, nobody asked


def test_an_in_band_allow_always_made_under_the_opt_in_stops_counting_without_it(
    stage: ConsentStage, engine: Engine, clock: FakeClock
) -> None:
    assert require(stage, request("r1"), Asker(Decision.ALLOW_ALWAYS)) is Decision.ALLOW_ALWAYS
    (stored,) = ConsentStore(engine).list_grants()
    assert stored.channel == "elicitation"
    strict = ConsentStage(
        ConsentPolicy(timeout_s=5), AuditLog(engine, clock), ConsentStore(engine), clock, SequentialRunIds()
    )
    asker = Asker(Decision.ALLOW_ONCE)
    assert require(strict, request("r2"), asker) is Decision.ALLOW_ONCE
    assert len(asker.asked) == 1, "the in-band grant no longer answers: the person is asked"


def test_with_elicitation_switched_off_a_client_that_can_elicit_is_asked_out_of_band(
    engine: Engine, clock: FakeClock
) -> None:
    channels = MappingProxyType({"elicitation": frozenset(), "approver": EVERY_ANSWER})
    stage = ConsentStage(
        ConsentPolicy(timeout_s=5, channels=channels), AuditLog(engine, clock), ConsentStore(engine), clock,
        SequentialRunIds(),
    )  # fmt: skip
    store = ConsentStore(engine)

    async def approve() -> None:
        while store.fetch_request("r1") is None:
            await anyio.sleep(0.01)
        asked = store.fetch_request("r1")
        assert asked is not None and asked.choices == tuple(d.value for d in Decision)
        store.decide("r1", "ALLOW_ALWAYS", "approvals:alice@host", clock.now())

    async def main() -> Decision:
        async with anyio.create_task_group() as group:
            group.start_soon(approve)
            with anyio.fail_after(10):
                decision = await stage.require(request("r1"), Dialog(Asker()))  # the client could answer, but may not
        return decision

    assert anyio.run(main) is Decision.ALLOW_ALWAYS
    (stored,) = store.list_grants()
    assert stored.channel == "approver" and stored.granted_by == "approvals:alice@host"


def test_the_approver_is_offered_only_what_its_channel_may_answer(engine: Engine, clock: FakeClock) -> None:
    channels = MappingProxyType({"elicitation": EVERY_ANSWER, "approver": frozenset({"ALLOW_ONCE", "DENY_ONCE"})})
    stage = ConsentStage(
        ConsentPolicy(timeout_s=5, channels=channels), AuditLog(engine, clock), ConsentStore(engine), clock,
        SequentialRunIds(),
    )  # fmt: skip
    store = ConsentStore(engine)

    async def answer() -> None:
        while store.fetch_request("r1") is None:
            await anyio.sleep(0.01)
        asked = store.fetch_request("r1")
        assert asked is not None and asked.choices == ("ALLOW_ONCE", "DENY_ONCE")
        store.decide("r1", "ALLOW_ALWAYS", "approvals:alice@host", clock.now())  # not offered

    async def main() -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(answer)
            with anyio.fail_after(10), pytest.raises(ConsentDeniedError):
                await stage.require(request("r1"), OUT_OF_BAND)

    anyio.run(main)
    assert store.list_grants() == []


def test_each_way_of_asking_is_a_consent_channel_in_band_or_out() -> None:
    """`consent.channels` limits a channel's answers by its kind; only the round trip answers without waiting."""
    ways: list[ConsentChannel] = [Dialog(Asker()), RoundTrip(), OUT_OF_BAND]
    assert [(way.channel, way.waits) for way in ways] == [
        (Channel.ELICITATION, True), (Channel.ELICITATION, False), (Channel.APPROVER, True),
    ]  # fmt: skip


def test_the_policys_consent_channels_are_channels() -> None:
    """gateway/policy.py sits below the consent wing and spells `consent.channels`' keys itself."""
    assert {Channel(name) for name in CONSENT_CHANNELS} == {Channel.ELICITATION, Channel.APPROVER}


# --- the change review (decision 80) ---------------------------------------------------------------


def review(stage: ConsentStage, req: ConsentRequest, asker: Asker) -> Answer:
    return anyio.run(stage.review_changes, req, "Apply the changes of fix? modified a.py", Dialog(asker))


def test_a_change_review_is_asked_whatever_is_stored_and_stores_nothing(stage: ConsentStage, engine: Engine) -> None:
    asker = Asker(Decision.ALLOW_ALWAYS, Decision.ALLOW_ONCE)
    assert require(stage, request("r1"), asker) is Decision.ALLOW_ALWAYS  # a stored Allow always for the tool
    assert require(stage, request("r2"), asker) is Decision.ALLOW_ALWAYS  # answered from it
    store = ConsentStore(engine)
    grants = store.list_grants()

    answer = review(stage, request("r2"), asker)

    assert answer.decision is Decision.ALLOW_ONCE
    assert asker.asked[-1] == (Decision.DENY_ONCE, Decision.ALLOW_ONCE)  # only these, Deny once first
    assert store.list_grants() == grants  # nothing stored
    questions = [store.fetch_request(f"{n:032x}") for n in range(1, 6)]
    (question,) = [q for q in questions if q is not None and q.kind == "change_review"]
    assert (question.run_id, question.choices) == ("r2", ("ALLOW_ONCE", "DENY_ONCE"))
    assert question.preview is not None and "a.py" in question.preview


@pytest.mark.parametrize("given", [Decision.ALLOW_ALWAYS, Decision.ALLOW_SESSION, Decision.DENY_ALWAYS, None])
def test_a_change_review_answered_with_anything_but_allow_once_is_deny_once(
    stage: ConsentStage, engine: Engine, given: Decision | None
) -> None:
    answer = review(stage, request("r1"), Asker(given))
    assert answer.decision is Decision.DENY_ONCE
    assert ConsentStore(engine).list_grants() == []
    (decided,) = AuditLog(engine, FakeClock()).events(run_id="r1")
    assert decided.detail["about"] == "change_set"
    assert decided.detail["reason"] == "changes_denied"


def test_consent_mode_deny_denies_a_change_review_without_asking(engine: Engine, clock: FakeClock) -> None:
    policy = ConsentPolicy(mode="deny", timeout_s=5)
    stage = ConsentStage(policy, AuditLog(engine, clock), ConsentStore(engine), clock, SequentialRunIds())
    asker = Asker()
    answer = review(stage, request("r1"), asker)
    assert (answer.decision, answer.origin, answer.channel) == (Decision.DENY_ONCE, Origin.POLICY, Channel.POLICY)
    assert asker.asked == []


def test_a_change_review_over_the_cap_of_open_questions_is_recorded_as_the_reviews_decision(
    engine: Engine, clock: FakeClock
) -> None:
    audit = AuditLog(engine, clock)
    full = ConsentStage(ConsentPolicy(timeout_s=5), audit, ConsentStore(engine, max_open=1), clock, SequentialRunIds())
    asker = Asker(Decision.ALLOW_ONCE)
    assert require(full, request("r1"), asker) is Decision.ALLOW_ONCE  # the call's own decision: closed at once
    another = full._question(request("r2"), "q2", clock.now(), (Decision.ALLOW_ONCE,))
    ConsentStore(engine).insert_request(another)  # another call's question, still open: the cap is reached
    with pytest.raises(ConsentDeniedError) as caught:
        review(full, request("r1"), Asker(Decision.ALLOW_ONCE))
    assert caught.value.reason == "consent_questions_limit"
    details = [e.detail for e in audit.events(run_id="r1")]
    assert [d.get("about") for d in details] == [None, "change_set"]
    assert details[1]["reason"] == "consent_questions_limit"
