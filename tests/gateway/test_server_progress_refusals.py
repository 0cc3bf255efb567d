"""A refusal is the same refusal whether the call carried `_meta.progressToken` or not, through the MCP
server in process.

Claude Code sends a progressToken with every tools/call (and so do the SDKs that reset their
timeout on progress). Each row below is one refusal, made twice through `build_server` served to
the SDK's client over memory streams (tests/memory_session.py), once with a token and once
without, on both protocol eras: the 2025 era (`initialize`, then `elicitation/create` or the
approver) and the 2026-07-28 era (the envelope in `_meta`, and an `input_required` round trip).
What must be the same: the answer (code, message, data but its run_id), the audit trail and the
console's card; what must hold besides: the code and reason the row names, and no traceback in
what the gateway logged. The terminal approver in a pty, a sandbox that cannot start, a run past
its time limit and an answer that is not an elicitation result are tests/e2e/test_refusals_with_progress.py
(real stdio).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import pytest

from gateway.calls import CallStore
from gateway.consent.stage import Decision
from gateway.consent.store import ConsentStore
from tests.harness import LEGACY, MODERN, GatewayHome
from tests.memory_session import MemorySession
from tests.refusals import (
    DENIALS,
    PROGRESS,
    Seen,
    accept,
    answering,
    assert_decision,
    call,
    new_user,
    params_of,
    past_its_deadline,
    round_trip,
    same_with_and_without,
    trail_of,
)

SessionFactory = Callable[..., MemorySession]
Refuse = Callable[[str, str | None], dict[str, Any]]


@pytest.fixture
def logged(caplog: pytest.LogCaptureFixture) -> Callable[[], str]:
    """Everything the gateway logs in this test, as `serve` would write it to stderr."""
    caplog.set_level(logging.DEBUG)
    return lambda: caplog.text


def called(session: MemorySession, gateway: GatewayHome, era: str, how: dict[str, Any]) -> Refuse:
    """`refuse(user, progress)`: one call of `session`'s era (the SDK's session stamps the 2026-07-28 envelope)."""

    def refuse(user: str, progress: str | None) -> dict[str, Any]:
        return call(session, params_of(gateway, user, progress, era=era, envelope=False, **how))

    return refuse


def decide_when_asked(gateway: GatewayHome, user: str, decision: Decision) -> None:
    """Wait for `user`'s question to be open, then answer it as the console does (as `console:root`)."""
    store = ConsentStore(gateway.engine)
    deadline = time.monotonic() + 60
    while not (mine := [q for q in store.fetch_pending(time.time()) if q.user == user]):
        assert time.monotonic() < deadline, "the question never showed up"
        time.sleep(0.02)  # the question is a row another thread writes: nothing here to await
    assert store.decide(mine[0].id, decision, "console:root", time.time())


# --- while a person is asked: every denial channel, both eras -----------------------------------------


@pytest.mark.parametrize("denial", [d[1:] for d in DENIALS], ids=[d[0] for d in DENIALS])
def test_a_denial_in_the_clients_dialog_is_the_same_with_progress_on(
    gateway: GatewayHome, open_memory: SessionFactory, logged: Callable[[], str], denial: tuple[Any, str, str]
) -> None:
    reply, decision, reason = denial
    legacy = open_memory(gateway, elicitation=True)
    legacy.responder = answering(reply)
    found = same_with_and_without(gateway, called(legacy, gateway, LEGACY, {}), -32008, reason, logged)
    assert_decision(found, decision, "user_prompt", "elicitation")
    methods = [m["method"] for m in legacy.unsolicited]
    assert methods.count("elicitation/create") == 2, methods  # asked once per call
    assert "notifications/progress" in methods, "the call with a token reports progress while it waits"

    modern = open_memory(gateway, elicitation=True, version=MODERN)
    found = same_with_and_without(
        gateway,
        lambda user, p: round_trip(modern, params_of(gateway, user, p, era=MODERN, envelope=False), reply),
        -32008,
        reason,
        logged,
    )
    assert_decision(found, decision, "user_prompt", "elicitation")
    assert "elicitation/create" not in [m["method"] for m in modern.unsolicited], "2026-07-28: no server request"


def test_a_retry_with_a_state_of_no_question_is_the_same_with_progress_on(
    gateway: GatewayHome, open_memory: SessionFactory, logged: Callable[[], str]
) -> None:
    modern = open_memory(gateway, elicitation=True, version=MODERN)
    # A 2026-07-28 retry with a state that belongs to no question of this call: refused before anyone is asked.
    same_with_and_without(
        gateway,
        lambda user, p: round_trip(
            modern, params_of(gateway, user, p, era=MODERN, envelope=False), accept("allow_once"), "0" * 32
        ),
        -32008,
        "consent_state_invalid",
        logged,
    )


@pytest.mark.parametrize("era", [LEGACY, MODERN])
def test_the_consoles_deny_is_the_same_with_progress_on(
    gateway: GatewayHome, open_memory: SessionFactory, logged: Callable[[], str], era: str
) -> None:
    """The console's Deny goes through `ConsentStore.decide`, as this test calls it, while the call waits."""
    session = open_memory(gateway, version=era)  # no elicitation declared: the question waits for an approver

    def decided_out_of_band(decision: Decision, user: str, progress: str | None) -> dict[str, Any]:
        answer = session.request_soon("tools/call", params_of(gateway, user, progress, era=era, envelope=False), 120)
        decide_when_asked(gateway, user, decision)
        return answer.result()

    for decision, reason in ((Decision.DENY_ONCE, "consent_denied"), (Decision.DENY_ALWAYS, "consent_denied_always")):
        found = same_with_and_without(gateway, functools.partial(decided_out_of_band, decision), -32008, reason, logged)
        assert_decision(found, decision, "user_prompt", "approver")
        assert found.trail[1]["detail"]["decided_by"] == "console:root"


@pytest.mark.parametrize("where", ["dialog", "approver-legacy", "approver-modern", "late-retry"])
def test_a_consent_timeout_is_the_same_with_progress_on(
    make_gateway: Callable[..., GatewayHome], open_memory: SessionFactory, logged: Callable[[], str], where: str
) -> None:
    """Each row waits out the timeout twice (with and without progress), the two calls side by side (`at_once`):
    one test each, so the rows run side by side too."""
    gateway = make_gateway({"consent": {"timeout_s": 1}})
    if where == "dialog":
        silent = open_memory(gateway, elicitation=True)  # declares elicitation, never answers it (no responder)
        refuse = called(silent, gateway, LEGACY, {})
        found = same_with_and_without(gateway, refuse, -32008, "consent_timeout", logged, at_once=True)
        assert_decision(found, "DENY_ONCE", "timeout", "elicitation")
    elif where.startswith("approver"):  # nobody at the approver
        era = LEGACY if where == "approver-legacy" else MODERN
        session = open_memory(gateway, version=era)
        refuse = called(session, gateway, era, {})
        found = same_with_and_without(gateway, refuse, -32008, "consent_timeout", logged, at_once=True)
        assert_decision(found, "DENY_ONCE", "timeout", "approver")
    else:  # A 2026-07-28 retry that brings its answer after the timeout.
        modern = open_memory(gateway, elicitation=True, version=MODERN)

        def late(user: str, progress: str | None) -> dict[str, Any]:
            params = params_of(gateway, user, progress, era=MODERN, envelope=False)
            first = call(modern, params)
            past_its_deadline(gateway, first["result"]["requestState"])  # past consent.timeout_s: the point of the row
            retry = dict(
                params, inputResponses={"consent": accept("allow_once")}, requestState=first["result"]["requestState"]
            )
            return call(modern, retry)

        found = same_with_and_without(gateway, late, -32008, "consent_timeout", logged, at_once=True)
        assert_decision(found, "DENY_ONCE", "timeout", "elicitation")


# --- refused before any wait: every other code, both eras --------------------------------------------


@pytest.mark.parametrize("era", [LEGACY, MODERN])
def test_every_refusal_before_a_wait_is_the_same_with_progress_on(
    make_gateway: Callable[..., GatewayHome], open_memory: SessionFactory, logged: Callable[[], str], era: str
) -> None:
    gateway = make_gateway({"budget": {"attempts_total": 1, "window_s": 600}, "consent": {"mode": "deny"}})
    expired = gateway.token("nobody", ttl_s=60, now=time.time() - 3600)
    rows: list[tuple[int, str, dict[str, Any]]] = [
        (-32001, "token_expired", {"token": expired}),
        (-32004, "path_outside_workspace", {"arguments": {"test_path": "../x"}}),
        (-32602, "invalid_arguments", {"arguments": {}}),
        (-32602, "unknown_tool", {"name": "run_shell"}),
        (-32008, "consent_mode_deny", {}),
    ]
    session = open_memory(gateway, elicitation=era == MODERN, version=era)  # as a 2025 client without the capability
    for code, reason, how in rows:
        same_with_and_without(gateway, called(session, gateway, era, how), code, reason, logged)

    def as_a_viewer(user: str, progress: str | None) -> dict[str, Any]:
        gateway.users.set_role(user, "VIEWER")
        return called(session, gateway, era, {})(user, progress)

    def twice(user: str, progress: str | None) -> dict[str, Any]:
        called(session, gateway, era, {})(user, progress)  # consent_mode_deny: it takes the one attempt
        return called(session, gateway, era, {})(user, progress)

    same_with_and_without(gateway, as_a_viewer, -32003, "missing_permission", logged)
    same_with_and_without(gateway, twice, -32005, "attempts_exhausted", logged)


@pytest.mark.parametrize("era", [LEGACY, MODERN])
def test_a_database_that_fails_is_the_same_with_progress_on(
    gateway: GatewayHome, open_memory: SessionFactory, logged: Callable[[], str], era: str
) -> None:
    """-32603 from storage: no trail, no card (the database is what failed), the same answer."""
    missing = gateway.root / "no-such-dir" / "gateway.db"
    session = open_memory(gateway, elicitation=era == MODERN, version=era, db_url=f"sqlite:///{missing}")
    answers = []
    for progress in (None, PROGRESS):
        error = call(session, params_of(gateway, "alice", progress, era=era, envelope=False))["error"]
        answers.append((error["code"], error["message"], error["data"]["reason"]))
    assert answers[0] == answers[1] and answers[0][0] == -32603, answers
    assert answers[0][2] in ("audit_unavailable", "database_unavailable")
    assert "Traceback" not in logged()


# --- Claude Code's permission prompt tool: its "deny" is an answer, the same with progress on ----------

PROMPT_RULES = {"enabled": True, "deny": [], "ask": ["Bash(git push:*)"], "allow": []}


def _asked(
    gateway: GatewayHome, open_memory: SessionFactory, progress: str | None
) -> tuple[str, Future[dict[str, Any]]]:
    """check_permission as Claude Code sends it (the token in MCP_GATEWAY_TOKEN, none in params), asked of a
    person: its user (a new one) and the call, in flight."""
    user = new_user(gateway)
    session = open_memory(gateway, environ={"MCP_GATEWAY_TOKEN": gateway.token(user)})
    params: dict[str, Any] = {
        "name": "check_permission",
        "arguments": {"tool_name": "Bash", "input": {"command": "git push origin main"}, "tool_use_id": "toolu_1"},
    }
    if progress is not None:
        params["_meta"] = {"progressToken": progress}
    return user, session.request_soon("tools/call", params, 120)


def _denied(gateway: GatewayHome, logged: Callable[[], str], user: str, answer: Future[dict[str, Any]]) -> Seen:
    """The call's answer, trail and card, once it is answered."""
    response = answer.result()
    assert "Traceback" not in logged(), logged()
    result = response["result"]
    run_id = result["_meta"]["mcp-write-gateway/run_id"]
    trail = trail_of(gateway, run_id, user)
    card = CallStore(gateway.engine).fetch(run_id)
    assert card is not None
    return Seen({"content": result["content"]}, trail, (card.kind, card.status, card.result))


@pytest.mark.parametrize("decide", [True, False], ids=["console deny", "consent timeout"])
def test_a_permission_prompt_denied_is_the_same_with_progress_on(
    make_gateway: Callable[..., GatewayHome], open_memory: SessionFactory, logged: Callable[[], str], decide: bool
) -> None:
    """Asked of a person, answered Deny once through the console's path (`decide`, one call at a time), else left
    to the consent timeout (both calls in flight at once: the same two calls, in the time of one)."""
    gateway = make_gateway({"permission_prompt": PROMPT_RULES, "consent": {"timeout_s": 60 if decide else 1}})
    found: list[Seen] = []
    if decide:
        for progress in (None, PROGRESS):
            user, answer = _asked(gateway, open_memory, progress)
            decide_when_asked(gateway, user, Decision.DENY_ONCE)
            found.append(_denied(gateway, logged, user, answer))
    else:
        asked = [_asked(gateway, open_memory, progress) for progress in (None, PROGRESS)]
        found = [_denied(gateway, logged, user, answer) for user, answer in asked]
    without, with_token = found
    assert with_token == without
    text = without.answer["content"][0]["text"]
    assert '"behavior":"deny"' in text and ("a person denied" in text if decide else "no person answered" in text)
    kinds = [e["event_type"] for e in without.trail]
    assert kinds == ["MCP_TOOL_CALL", "mcp.permission.decision", "TOOL_FINISHED"], kinds
    assert without.trail[-1]["detail"]["reason"] == ("consent_denied" if decide else "consent_timeout")
