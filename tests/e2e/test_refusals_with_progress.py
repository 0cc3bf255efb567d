"""A refusal is the same refusal whether the call carried `_meta.progressToken` or not.

Claude Code sends a progressToken with every tools/call (and so do the SDKs that reset their
timeout on progress). Each row of the tables below is one refusal, made twice through a real
`mcp-gateway serve` over stdio, once with a token and once without, on both protocol eras: the
2025 era (`initialize`, then `elicitation/create` or the approver) and the 2026-07-28 era (the
envelope in `_meta`, and an `input_required` round trip). What must be the same: the answer
(code, message, data but its run_id), the audit trail (each event's type, code and detail, in
order; ids, times and names of the per-row user aside) and the console's card (status, code,
reason, message). What must hold besides: the code and reason the row names, and no traceback.

The refusals that happen while the call waits (for a person: every denial channel and the
consent timeout; for its run: a sandbox that cannot start) are those the old code answered
-32603 `internal_error` when a token was sent. The rest (refused before any wait) pin the promise
for every code.
"""

from __future__ import annotations

import functools
import itertools
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gateway.calls import CallStore
from gateway.consent.stage import Decision
from gateway.consent.store import ConsentStore
from tests.harness import (
    FORM_ELICITATION,
    MODERN,
    Approver,
    GatewayHome,
    StdioSession,
    modern_meta,
    shows_request,
    venv_beside,
    without_acts,
)

SessionFactory = Callable[..., StdioSession]
ELICITATION = FORM_ELICITATION
RUN: dict[str, Any] = {"test_path": "tests"}
PROGRESS = "progress-token-1"
VOLATILE = {"id", "ts", "run_id", "prev_hash", "hash", "user", "grant_id", "expires_at"}
"""Fields that differ from one call to the next whatever the call: ids, times, the per-row user."""
MEASURED = {"duration_ms", "peak_memory_kb", "stdout_bytes", "stderr_bytes", "survivors_killed"}
"""What a run measured: its own numbers, not the refusal's."""
_users = itertools.count()


@dataclass(frozen=True)
class Seen:
    """What a refused call left, its run_id and the per-row user's name taken out."""

    answer: dict[str, Any]
    trail: list[dict[str, Any]]
    card: tuple[Any, ...] | None


@dataclass(frozen=True)
class Client:
    """A session of one era against a gateway."""

    gateway: GatewayHome
    session: StdioSession
    era: str


def new_user(gateway: GatewayHome, role: str = "USER") -> str:
    """A user of the row's own: what one refusal leaves (a grant, a budget) never reaches another."""
    name = f"u{next(_users)}"
    gateway.add_user(name, role)
    return name


def params_of(
    gateway: GatewayHome,
    user: str,
    progress: str | None,
    *,
    era: str,
    arguments: dict[str, Any] | None = None,
    name: str = "run_pytest",
    token: str | None = None,
    capabilities: dict[str, Any] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    if era == MODERN:
        meta = modern_meta(ELICITATION if capabilities is None else capabilities)
    if progress is not None:
        meta["progressToken"] = progress
    params: dict[str, Any] = {
        "name": name,
        "arguments": RUN if arguments is None else arguments,
        "auth": {"token": gateway.token(user) if token is None else token},
    }
    if meta:
        params["_meta"] = meta
    return params


def call(session: StdioSession, params: dict[str, Any]) -> dict[str, Any]:
    return session.request("tools/call", params, timeout=120)


def round_trip(
    session: StdioSession, params: dict[str, Any], answer: dict[str, Any], state: str | None = None
) -> dict[str, Any]:
    """A 2026-07-28 call whose first round asks (input_required), then its retry with `answer`."""
    first = call(session, params)
    assert first.get("result", {}).get("resultType") == "input_required", first
    retry = dict(params, inputResponses={"consent": answer}, requestState=state or first["result"]["requestState"])
    return call(session, retry)


def trail_of(gateway: GatewayHome, run_id: str, user: str) -> list[dict[str, Any]]:
    """The call's audit events in order, each without its ids, times and measurements, the user unnamed (an
    approver's or the console's act apart: its own order, `without_acts`; tests/e2e/test_approvals.py checks it)."""
    trail = []
    for event in without_acts(gateway.events_of(run_id)):
        kept = {k: v for k, v in event.items() if k not in VOLATILE}
        detail = {k: v for k, v in event["detail"].items() if k not in VOLATILE | MEASURED}
        if "decided_by" in detail:
            detail["decided_by"] = detail["decided_by"].replace(user, "<user>")
        trail.append(kept | {"detail": detail})
    return trail


def seen(gateway: GatewayHome, response: dict[str, Any], user: str) -> Seen:
    assert "error" in response, response
    error = response["error"]
    run_id = error["data"]["run_id"]
    answer = {"code": error["code"], "message": error["message"]}
    answer["data"] = {k: v for k, v in error["data"].items() if k != "run_id"}
    trail = trail_of(gateway, run_id, user)
    card = CallStore(gateway.engine).fetch(run_id)
    if card is None and trail:  # a 2026-07-28 retry moves its first round's card
        card = next((c for c in CallStore(gateway.engine).fetch_latest(None, 500) if c.user == user), None)
    shown = None if card is None else (card.status, card.code, card.reason, card.message, card.user == user)
    return Seen(answer, trail, shown)


def same_with_and_without(
    gateway: GatewayHome,
    refuse: Callable[[str, str | None], dict[str, Any]],
    code: int,
    reason: str,
    *sessions: StdioSession,
) -> Seen:
    """`refuse(user, progress)` twice, a user of its own each time: the same refusal, `code` and `reason`."""
    outcomes = {}
    for progress in (None, PROGRESS):
        user = new_user(gateway)
        outcomes[progress] = seen(gateway, refuse(user, progress), user)
    without, with_token = outcomes[None], outcomes[PROGRESS]
    assert (without.answer["code"], without.answer["data"]["reason"]) == (code, reason), without
    assert with_token.answer == without.answer, "the answer changed with a progressToken"
    assert with_token.trail == without.trail, "the audit trail changed with a progressToken"
    assert with_token.card == without.card, "the card changed with a progressToken"
    for session in sessions:
        assert "Traceback" not in session.stderr_text(), session.stderr_text()
    return without


def assert_decision(found: Seen, decision: str, origin: str, channel: str) -> None:
    kinds = [e["event_type"] for e in found.trail]
    assert kinds == ["MCP_TOOL_CALL", "mcp.permission.decision", "POLICY_BLOCKED"], kinds
    detail = found.trail[1]["detail"]
    assert (detail["decision"], detail["origin"], detail["channel"]) == (decision, origin, channel), detail
    assert found.card is not None and found.card[:3] == ("error", found.answer["code"], found.answer["data"]["reason"])


def answering(reply: dict[str, Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def respond(message: dict[str, Any]) -> dict[str, Any]:
        assert message["method"] == "elicitation/create", message
        return reply

    return respond


def accept(decision: str) -> dict[str, Any]:
    return {"action": "accept", "content": {"decision": decision}}


def decided_out_of_band(client: Client, decision: Decision, user: str, progress: str | None) -> dict[str, Any]:
    """Send the call (no elicitation declared), then answer its question as the console does
    (`ConsentStore.decide`, as `console:root`)."""
    gateway, session = client.gateway, client.session
    params = params_of(gateway, user, progress, era=client.era, capabilities={})
    session.send({"jsonrpc": "2.0", "id": f"oob-{user}", "method": "tools/call", "params": params})
    decide_when_asked(gateway, session, user, decision)
    return session.wait_response(f"oob-{user}", timeout=120)


def decide_when_asked(gateway: GatewayHome, session: StdioSession, user: str, decision: Decision) -> None:
    """Wait for `user`'s question to be open, then answer it as the console does (as `console:root`)."""
    store = ConsentStore(gateway.engine)
    deadline = time.monotonic() + 60
    while not (mine := [q for q in store.fetch_pending(time.time()) if q.user == user]):
        assert time.monotonic() < deadline, "the question never showed up"
        session.pump(0.1)
    assert store.decide(mine[0].id, decision, "console:root", time.time())


# --- while a person is asked: every denial channel, both eras -----------------------------------------


DENIALS = [
    # (name, the client's reply to elicitation/create, decision, reason)
    ("deny once", accept("deny_once"), "DENY_ONCE", "consent_denied"),
    ("deny always", accept("deny_always"), "DENY_ALWAYS", "consent_denied_always"),
    ("decline", {"action": "decline"}, "DENY_ONCE", "consent_denied"),
    ("cancel", {"action": "cancel"}, "DENY_ONCE", "consent_denied"),
]


@pytest.mark.parametrize(("reply", "decision", "reason"), [d[1:] for d in DENIALS], ids=[d[0] for d in DENIALS])
def test_a_denial_in_the_clients_dialog_is_the_same_with_progress_on(
    gateway: GatewayHome,
    open_session: SessionFactory,
    reply: dict[str, Any],
    decision: str,
    reason: str,
) -> None:
    legacy = open_session(gateway, capabilities=ELICITATION)
    legacy.responder = answering(reply)
    found = same_with_and_without(
        gateway, lambda user, p: call(legacy, params_of(gateway, user, p, era="")), -32008, reason, legacy
    )
    assert_decision(found, decision, "user_prompt", "elicitation")

    modern = open_session(gateway, initialize=False)
    found = same_with_and_without(
        gateway,
        lambda user, p: round_trip(modern, params_of(gateway, user, p, era=MODERN), reply),
        -32008,
        reason,
        modern,
    )
    assert_decision(found, decision, "user_prompt", "elicitation")


def test_an_answer_that_is_no_answer_is_the_same_with_progress_on(
    gateway: GatewayHome, open_session: SessionFactory
) -> None:
    legacy = open_session(gateway, capabilities=ELICITATION)
    legacy.responder = answering({"action": 7})  # not an elicitation result: nobody's answer
    found = same_with_and_without(
        gateway, lambda user, p: call(legacy, params_of(gateway, user, p, era="")), -32008, "consent_no_answer", legacy
    )
    assert_decision(found, "DENY_ONCE", "no_answer", "elicitation")
    modern = open_session(gateway, initialize=False)
    # A 2026-07-28 retry with a state that belongs to no question of this call: refused before anyone is asked.
    same_with_and_without(
        gateway,
        lambda user, p: round_trip(modern, params_of(gateway, user, p, era=MODERN), accept("allow_once"), "0" * 32),
        -32008,
        "consent_state_invalid",
        modern,
    )


def test_the_approvers_deny_is_the_same_with_progress_on(
    gateway: GatewayHome, open_session: SessionFactory, approvals: Callable[[], Approver]
) -> None:
    """The terminal approver (`mcp-gateway approvals`, in a pty): Deny once is key 3, Deny always key 4."""
    approver = approvals()
    for era in ("", MODERN):
        session = open_session(gateway, initialize=era != MODERN)
        for key, decision, reason in (
            ("3", "DENY_ONCE", "consent_denied"),
            ("4", "DENY_ALWAYS", "consent_denied_always"),
        ):
            refuse = functools.partial(_denied_at_the_approver, Client(gateway, session, era), approver, key)
            found = same_with_and_without(gateway, refuse, -32008, reason, session)
            assert_decision(found, decision, "user_prompt", "approver")


def _denied_at_the_approver(
    client: Client, approver: Approver, key: str, user: str, progress: str | None
) -> dict[str, Any]:
    session = client.session
    params = params_of(client.gateway, user, progress, era=client.era, capabilities={})
    session.send({"jsonrpc": "2.0", "id": f"pty-{user}", "method": "tools/call", "params": params})
    shows_request(approver)
    approver.send(key)
    return session.wait_response(f"pty-{user}", timeout=120)


def test_the_consoles_deny_is_the_same_with_progress_on(gateway: GatewayHome, open_session: SessionFactory) -> None:
    """The console's Deny is `ConsentStore.decide` (through gateway/consent/actions.py), as this test calls it."""
    for era in ("", MODERN):
        session = open_session(gateway, initialize=era != MODERN)
        for decision, reason in (
            (Decision.DENY_ONCE, "consent_denied"),
            (Decision.DENY_ALWAYS, "consent_denied_always"),
        ):
            refuse = functools.partial(decided_out_of_band, Client(gateway, session, era), decision)
            found = same_with_and_without(gateway, refuse, -32008, reason, session)
            assert_decision(found, decision, "user_prompt", "approver")
            assert found.trail[1]["detail"]["decided_by"] == "console:root"


def test_a_consent_timeout_is_the_same_with_progress_on(
    make_gateway: Callable[..., GatewayHome], open_session: SessionFactory
) -> None:
    gateway = make_gateway({"consent": {"timeout_s": 2}})
    silent = open_session(gateway, capabilities=ELICITATION)  # declares elicitation, never answers it
    found = same_with_and_without(
        gateway, lambda user, p: call(silent, params_of(gateway, user, p, era="")), -32008, "consent_timeout", silent
    )
    assert_decision(found, "DENY_ONCE", "timeout", "elicitation")
    for era in ("", MODERN):  # nobody at the approver
        session = open_session(gateway, initialize=era != MODERN)
        refuse = functools.partial(_called, Client(gateway, session, era), {"capabilities": {}})
        found = same_with_and_without(gateway, refuse, -32008, "consent_timeout", session)
        assert_decision(found, "DENY_ONCE", "timeout", "approver")
    # A 2026-07-28 retry that brings its answer after the timeout.
    modern = open_session(gateway, initialize=False)

    def late(user: str, progress: str | None) -> dict[str, Any]:
        params = params_of(gateway, user, progress, era=MODERN)
        first = call(modern, params)
        time.sleep(2.5)
        retry = dict(
            params, inputResponses={"consent": accept("allow_once")}, requestState=first["result"]["requestState"]
        )
        return call(modern, retry)

    found = same_with_and_without(gateway, late, -32008, "consent_timeout", modern)
    assert_decision(found, "DENY_ONCE", "timeout", "elicitation")


# --- while the run is on: a sandbox that cannot start, and a run past its time limit ------------------


def test_a_sandbox_that_cannot_start_is_the_same_with_progress_on(
    gateway: GatewayHome, open_session: SessionFactory, tmp_path: Path
) -> None:
    folder = Path(tempfile.mkdtemp(prefix="mcp-gw-venv-"))
    try:
        folder.chmod(0o755)
        python = str(venv_beside(folder))
        legacy = open_session(gateway, capabilities=ELICITATION, python=python)
        modern = open_session(gateway, initialize=False, python=python)
        # Answered: `serve` has checked (and keeps) its interpreter's paths before they turn unreachable.
        assert "result" in call(
            modern, params_of(gateway, "alice", None, era=MODERN, name="list_artifacts", arguments={})
        )
        folder.chmod(0o700)  # after `serve` started on it: the run's uid cannot exec it
        legacy.responder = answering(accept("allow_once"))
        found = same_with_and_without(
            gateway,
            lambda user, p: call(legacy, params_of(gateway, user, p, era="")),
            -32006,
            "sandbox_start_failed",
            legacy,
        )
        kinds = [e["event_type"] for e in found.trail]
        assert kinds[-2:] == ["TOOL_STARTED", "TOOL_FINISHED"] and found.card is not None, found
        assert found.card[:3] == ("error", -32006, "sandbox_start_failed")
        found = same_with_and_without(
            gateway,
            lambda user, p: round_trip(modern, params_of(gateway, user, p, era=MODERN), accept("allow_once")),
            -32006,
            "sandbox_start_failed",
            modern,
        )
        assert found.card is not None and found.card[:3] == ("error", -32006, "sandbox_start_failed")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_run_past_its_time_limit_is_the_same_with_progress_on(
    gateway: GatewayHome, open_session: SessionFactory
) -> None:
    slow = gateway.workspace / "tests" / "test_sleeps.py"
    slow.write_text("import time\n\ndef test_sleeps():\n    time.sleep(60)\n")
    slow.chmod(0o644)
    arguments = {"test_path": "tests/test_sleeps.py", "timeout_s": 2}
    legacy = open_session(gateway, capabilities=ELICITATION)
    legacy.responder = answering(accept("allow_once"))
    modern = open_session(gateway, initialize=False)
    for refuse in (
        functools.partial(_called, Client(gateway, legacy, ""), {"arguments": arguments}),
        functools.partial(_allowed_in_a_round_trip, Client(gateway, modern, MODERN), {"arguments": arguments}),
    ):
        found = same_with_and_without(gateway, refuse, -32007, "timeout", legacy, modern)
        assert found.card is not None and found.card[:3] == ("error", -32007, "timeout")


# --- refused before any wait: every other code, both eras --------------------------------------------


def test_every_refusal_before_a_wait_is_the_same_with_progress_on(
    make_gateway: Callable[..., GatewayHome], open_session: SessionFactory
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
    for era in ("", MODERN):
        session = open_session(gateway, initialize=era != MODERN)
        for code, reason, how in rows:
            same_with_and_without(
                gateway, functools.partial(_called, Client(gateway, session, era), how), code, reason, session
            )
        viewer = functools.partial(_called_as_a_viewer, Client(gateway, session, era))
        same_with_and_without(gateway, viewer, -32003, "missing_permission", session)
        spent = functools.partial(_called_twice, Client(gateway, session, era))
        same_with_and_without(gateway, spent, -32005, "attempts_exhausted", session)


def _called(client: Client, how: dict[str, Any], user: str, progress: str | None) -> dict[str, Any]:
    return call(client.session, params_of(client.gateway, user, progress, era=client.era, **how))


def _allowed_in_a_round_trip(client: Client, how: dict[str, Any], user: str, progress: str | None) -> dict[str, Any]:
    params = params_of(client.gateway, user, progress, era=MODERN, **how)
    return round_trip(client.session, params, accept("allow_once"))


def _called_as_a_viewer(client: Client, user: str, progress: str | None) -> dict[str, Any]:
    client.gateway.users.set_role(user, "VIEWER")
    return _called(client, {}, user, progress)


def _called_twice(client: Client, user: str, progress: str | None) -> dict[str, Any]:
    _called(client, {}, user, progress)  # consent_mode_deny: it takes the one attempt
    return _called(client, {}, user, progress)


def test_a_database_that_fails_is_the_same_with_progress_on(gateway: GatewayHome, open_session: SessionFactory) -> None:
    """-32603 from storage: no trail, no card (the database is what failed), the same answer."""
    missing = gateway.root / "no-such-dir" / "gateway.db"
    for era in ("", MODERN):
        session = open_session(gateway, initialize=era != MODERN, db_url=f"sqlite:///{missing}")
        answers = []
        for progress in (None, PROGRESS):
            error = call(session, params_of(gateway, "alice", progress, era=era))["error"]
            answers.append((error["code"], error["message"], error["data"]["reason"]))
        assert answers[0] == answers[1] and answers[0][0] == -32603, answers
        assert answers[0][2] in ("audit_unavailable", "database_unavailable")
        assert "Traceback" not in session.stderr_text()


# --- Claude Code's permission prompt tool: its "deny" is an answer, the same with progress on ----------

PROMPT_RULES = {"enabled": True, "deny": [], "ask": ["Bash(git push:*)"], "allow": []}


def _asked_and_denied(gateway: GatewayHome, open_session: SessionFactory, decide: bool, progress: str | None) -> Seen:
    """check_permission as Claude Code sends it (the token in MCP_GATEWAY_TOKEN, none in params), asked of a
    person: answered Deny once through the console's path (`decide`), else left to the consent timeout."""
    user = new_user(gateway)
    session = open_session(gateway, env={"MCP_GATEWAY_TOKEN": gateway.token(user)})
    params: dict[str, Any] = {
        "name": "check_permission",
        "arguments": {"tool_name": "Bash", "input": {"command": "git push origin main"}, "tool_use_id": "toolu_1"},
    }
    if progress is not None:
        params["_meta"] = {"progressToken": progress}
    session.send({"jsonrpc": "2.0", "id": "question", "method": "tools/call", "params": params})
    if decide:
        decide_when_asked(gateway, session, user, Decision.DENY_ONCE)
    response = session.wait_response("question", timeout=120)
    assert "Traceback" not in session.stderr_text(), session.stderr_text()
    result = response["result"]
    run_id = result["_meta"]["mcp-write-gateway/run_id"]
    trail = trail_of(gateway, run_id, user)
    card = CallStore(gateway.engine).fetch(run_id)
    assert card is not None
    return Seen({"content": result["content"]}, trail, (card.kind, card.status, card.result))


@pytest.mark.parametrize("decide", [True, False], ids=["console deny", "consent timeout"])
def test_a_permission_prompt_denied_is_the_same_with_progress_on(
    make_gateway: Callable[..., GatewayHome], open_session: SessionFactory, decide: bool
) -> None:
    gateway = make_gateway({"permission_prompt": PROMPT_RULES, "consent": {"timeout_s": 60 if decide else 2}})
    without = _asked_and_denied(gateway, open_session, decide, None)
    with_token = _asked_and_denied(gateway, open_session, decide, PROGRESS)
    assert with_token == without
    text = without.answer["content"][0]["text"]
    assert '"behavior":"deny"' in text and ("a person denied" in text if decide else "no person answered" in text)
    kinds = [e["event_type"] for e in without.trail]
    assert kinds == ["MCP_TOOL_CALL", "mcp.permission.decision", "TOOL_FINISHED"], kinds
    assert without.trail[-1]["detail"]["reason"] == ("consent_denied" if decide else "consent_timeout")
