"""Consent over real stdio (docs/consent.md) with a client that answers `elicitation/create`.

Every test runs a real `mcp-gateway serve` and a real sandboxed pytest run of the sample
suite when consent allows it; what is asserted is the prompt the client saw (or did not
see), the answer on the wire and the `mcp.permission.decision` events in the audit log.
The refusals that run nothing (decline, cancel, no answer, an answer not offered, the
2026-07-28 denials, arguments the schema refuses, the round trip's escaped message) are
tests/gateway/test_server_consent.py: the same server in process.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.consent.store import ConsentStore, Grant, GrantDecision
from tests.harness import GatewayHome, StdioSession, reachable_by_everyone

SessionFactory = Callable[..., StdioSession]
ELICITATION: dict[str, Any] = {"elicitation": {"form": {}}}
RUN = ("run_pytest", {"test_path": "tests"})
ALL_CHOICES = ["allow_once", "allow_session", "allow_always", "deny_once", "deny_always"]
IN_BAND_CHOICES = ["allow_once", "allow_session", "deny_once", "deny_always"]
"""The form by default: the client's own answer never leaves a lasting allow (consent.channels)."""
IN_BAND_ALWAYS = {"consent": {"channels": {"elicitation": ALL_CHOICES}}}
"""The opt-in: the client may answer Allow always, and it is stored (channel `elicitation`)."""
DAY_S = 86400


def answering(*decisions: str | None, action: str = "accept") -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A client that answers each prompt with the next decision (None: the given non-accept action)."""
    queue = list(decisions)

    def respond(message: dict[str, Any]) -> dict[str, Any]:
        assert message["method"] == "elicitation/create", message
        decision = queue.pop(0)
        if decision is None:
            return {"action": action}
        return {"action": "accept", "content": {"decision": decision}}

    return respond


def prompts(session: StdioSession) -> list[dict[str, Any]]:
    return [m for m in session.unsolicited if m.get("method") == "elicitation/create"]


def decision_events(gateway: GatewayHome, run_id: str) -> list[dict[str, Any]]:
    return [e for e in gateway.events_of(run_id) if e["event_type"] == "mcp.permission.decision"]


def call(session: StdioSession, gateway: GatewayHome, user: str = "alice", **token: Any) -> dict[str, Any]:
    return session.call_tool(*RUN, gateway.token(user, **token))


def run_id_of(response: dict[str, Any]) -> str:
    if "result" in response:
        return str(response["result"]["structuredContent"]["run_id"])
    return str(response["error"]["data"]["run_id"])


@pytest.fixture
def elicit(gateway: GatewayHome, open_session: SessionFactory) -> StdioSession:
    return open_session(gateway, capabilities=ELICITATION)


def test_t1_a_new_call_prompts_with_tool_server_risk_and_arguments(gateway: GatewayHome, elicit: StdioSession) -> None:
    elicit.responder = answering("allow_once")
    response = call(elicit, gateway)
    assert response["result"]["structuredContent"]["passed"] > 0
    (prompt,) = prompts(elicit)
    message = prompt["params"]["message"]
    for shown in ("run_pytest", "mcp-write-gateway", "Medium risk", "alice", "default", 'test_path: "tests"'):
        assert shown in message, (shown, message)
    schema = prompt["params"]["requestedSchema"]
    assert schema["required"] == ["decision"]
    assert schema["properties"]["decision"]["enum"] == IN_BAND_CHOICES
    (event,) = decision_events(gateway, run_id_of(response))
    assert event["detail"]["decision"] == "ALLOW_ONCE" and event["detail"]["origin"] == "user_prompt"


def test_t2_allow_once_then_the_next_call_prompts_again(gateway: GatewayHome, elicit: StdioSession) -> None:
    elicit.responder = answering("allow_once", "allow_once")
    first, second = call(elicit, gateway), call(elicit, gateway)
    assert "result" in first and "result" in second
    assert len(prompts(elicit)) == 2


def test_t3_allow_always_then_no_prompt_and_a_cache_hit_in_the_audit(
    make_gateway: Callable[..., GatewayHome], open_session: SessionFactory
) -> None:
    gateway = make_gateway(IN_BAND_ALWAYS)
    gateway.add_user("alice")
    elicit = open_session(gateway, capabilities=ELICITATION)
    elicit.responder = answering("allow_always")
    started = time.time()
    first = call(elicit, gateway)
    second = call(elicit, gateway)
    assert "result" in first and "result" in second
    assert len(prompts(elicit)) == 1, "the stored decision answered the second call"
    assert prompts(elicit)[0]["params"]["requestedSchema"]["properties"]["decision"]["enum"] == ALL_CHOICES
    (made,) = decision_events(gateway, run_id_of(first))
    (hit,) = decision_events(gateway, run_id_of(second))
    assert made["detail"]["decision"] == "ALLOW_ALWAYS" and made["detail"]["origin"] == "user_prompt"
    assert started + 30 * DAY_S - 60 <= made["detail"]["expires_at"] <= time.time() + 30 * DAY_S, "medium: 30 days"
    assert hit["detail"] == {**hit["detail"], "decision": "ALLOW_ALWAYS", "origin": "cache_hit"}
    assert hit["detail"]["grant_id"] == made["detail"]["grant_id"]
    listed = gateway.cli("consent", "list").stdout.split("\n")[0].split("\t")
    assert listed[1:5] == ["alice", "default", "run_pytest", "ALLOW"] and listed[7] == "active"
    assert listed[9] == "elicitation", "the channel that made it"


def test_t4_deny_once_refuses_with_32008_and_nothing_runs(gateway: GatewayHome, elicit: StdioSession) -> None:
    elicit.responder = answering("deny_once", "allow_once")
    response = call(elicit, gateway)
    assert response["error"]["code"] == -32008
    assert response["error"]["data"]["reason"] == "consent_denied"
    assert (
        "a person denied" in response["error"]["message"] and "retrying will not help" in response["error"]["message"]
    )
    run_id = run_id_of(response)
    kinds = [e["event_type"] for e in gateway.events_of(run_id)]
    assert kinds == ["MCP_TOOL_CALL", "mcp.permission.decision", "POLICY_BLOCKED"]
    assert not (gateway.home / "artifacts" / run_id).exists()
    assert "result" in call(elicit, gateway), "deny once is for this call only: the next one is asked"
    assert len(prompts(elicit)) == 2


def test_t5_deny_always_persists_across_sessions_until_revoked(
    gateway: GatewayHome, open_session: SessionFactory
) -> None:
    first = open_session(gateway, capabilities=ELICITATION)
    first.responder = answering("deny_always")
    denied = call(first, gateway)
    assert denied["error"]["data"]["reason"] == "consent_denied_always"
    assert "deny always" in denied["error"]["message"]
    first.close()

    later = open_session(gateway, capabilities=ELICITATION)
    later.responder = answering("allow_once")
    again = call(later, gateway)
    assert again["error"]["code"] == -32008 and again["error"]["data"]["reason"] == "consent_denied_always"
    assert prompts(later) == [], "refused at once, without asking"
    (hit,) = decision_events(gateway, run_id_of(again))
    assert hit["detail"]["decision"] == "DENY_ALWAYS" and hit["detail"]["origin"] == "cache_hit"

    grant_id = hit["detail"]["grant_id"]
    assert gateway.cli("consent", "revoke", str(grant_id)).returncode == 0
    assert "result" in call(later, gateway), "revoked: the person is asked again"
    assert len(prompts(later)) == 1
    assert any(e["event_type"] == "CONSENT_REVOKED" for e in gateway.audit_events())


def test_t6_a_stored_decision_answers_without_the_tool_catalogue(
    gateway: GatewayHome, open_session: SessionFactory
) -> None:
    assert gateway.cli("consent", "grant", "alice", "run_pytest", "--always").returncode == 0
    session = open_session(gateway, capabilities=ELICITATION)
    session.responder = answering()  # no prompt may come
    started = time.monotonic()
    response = call(session, gateway)  # straight after initialize: no tools/list was ever sent
    assert "result" in response and prompts(session) == []
    assert time.monotonic() - started < 30
    (hit,) = decision_events(gateway, run_id_of(response))
    assert hit["detail"]["origin"] == "cache_hit" and hit["detail"]["channel"] == "stored"


def test_t7_an_expired_allow_always_prompts_again(gateway: GatewayHome, elicit: StdioSession) -> None:
    granted = gateway.cli("consent", "grant", "alice", "run_pytest", "--always", "--expires-in", "3s")
    assert granted.returncode == 0, granted.stderr
    elicit.responder = answering("allow_once")
    granted_at = time.monotonic()
    assert "result" in call(elicit, gateway) and prompts(elicit) == []
    time.sleep(max(0.0, 3.2 - (time.monotonic() - granted_at)))
    assert "result" in call(elicit, gateway)
    assert len(prompts(elicit)) == 1, "expired: asked again"
    assert gateway.cli("consent", "list").stdout.split("\t")[7] == "expired"


def test_t8_another_user_or_workspace_is_asked_again(
    make_gateway: Callable[..., GatewayHome], open_session: SessionFactory, request: pytest.FixtureRequest
) -> None:
    # Outside pytest's 0700 temp folder: the run's uid must reach it, or preflight refuses before consent.
    second = Path(tempfile.mkdtemp(prefix="mcp-gw-second-"))
    request.addfinalizer(lambda: shutil.rmtree(second, ignore_errors=True))
    reachable_by_everyone(second)
    gateway = make_gateway({"workspaces": {"second": str(second)}, **IN_BAND_ALWAYS})
    gateway.add_user("alice", "USER", ("default", "second"))
    gateway.add_user("bob", "USER", ("default",))
    session = open_session(gateway, capabilities=ELICITATION)
    session.responder = answering("allow_always", "allow_once", "deny_once")
    assert "result" in call(session, gateway, "alice")
    assert "result" in call(session, gateway, "bob"), "bob is asked: alice's decision is hers"
    in_second = call(session, gateway, "alice", workspace="second")
    assert in_second["error"]["data"]["reason"] == "consent_denied", "another workspace is asked again"
    assert len(prompts(session)) == 3


def test_allow_for_the_session_lasts_as_long_as_the_session(gateway: GatewayHome, open_session: SessionFactory) -> None:
    session = open_session(gateway, capabilities=ELICITATION)
    session.responder = answering("allow_session")
    assert "result" in call(session, gateway) and "result" in call(session, gateway)
    assert len(prompts(session)) == 1
    session.close()
    fresh = open_session(gateway, capabilities=ELICITATION)
    fresh.responder = answering("deny_once")
    assert call(fresh, gateway)["error"]["data"]["reason"] == "consent_denied", "a new session is asked again"


# --- the 2026-07-28 era: no server-to-client requests, an input_required round trip ---------------

FORM: dict[str, Any] = {"elicitation": {"form": {}}}


def modern(
    session: StdioSession,
    gateway: GatewayHome,
    *,
    capabilities: dict[str, Any] | None = None,
    answer: dict[str, Any] | None = None,
    state: str | None = None,
    arguments: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One tools/call as a 2026-07-28 client sends it: the envelope in `_meta`, no `initialize`."""
    params: dict[str, Any] = {
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "e2e", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": FORM if capabilities is None else capabilities,
        },
        "name": RUN[0],
        "arguments": arguments or RUN[1],
        "auth": {"token": gateway.token("alice")},
    }
    if answer is not None:
        params["inputResponses"] = {"consent": answer}
        params["requestState"] = state
    return session.request("tools/call", params, timeout=120)


@pytest.fixture
def stateless(gateway: GatewayHome, open_session: SessionFactory) -> StdioSession:
    return open_session(gateway, initialize=False)


def accept(decision: str) -> dict[str, Any]:
    return {"action": "accept", "content": {"decision": decision}}


def test_2026_the_question_comes_back_as_input_required_and_the_retry_runs(
    gateway: GatewayHome, stateless: StdioSession
) -> None:
    first = modern(stateless, gateway)["result"]
    assert first["resultType"] == "input_required"
    question = first["inputRequests"]["consent"]
    assert question["method"] == "elicitation/create" and question["params"]["mode"] == "form"
    assert "run_pytest" in question["params"]["message"] and "Medium risk" in question["params"]["message"]
    assert question["params"]["requestedSchema"]["properties"]["decision"]["enum"] == IN_BAND_CHOICES
    retry = modern(stateless, gateway, answer=accept("allow_once"), state=first["requestState"])
    structured = retry["result"]["structuredContent"]
    assert structured["passed"] > 0
    rounds = [e for e in gateway.audit_events() if e["event_type"] == "POLICY_BLOCKED"]
    assert [e["detail"] for e in rounds] == [{"status": "input_required"}] and rounds[0]["code"] is None
    (decision,) = decision_events(gateway, structured["run_id"])
    assert decision["detail"]["decision"] == "ALLOW_ONCE" and decision["detail"]["channel"] == "elicitation"
    with gateway.engine.connect() as connection:
        attempts = connection.exec_driver_sql("SELECT count(*) FROM budget_charges").scalar()
    assert attempts == 1, "the input_required round gave its attempt back: one call, one attempt"


def test_2026_allow_always_then_no_round_trip(
    make_gateway: Callable[..., GatewayHome], open_session: SessionFactory
) -> None:
    gateway = make_gateway(IN_BAND_ALWAYS)
    gateway.add_user("alice")
    stateless = open_session(gateway, initialize=False)
    first = modern(stateless, gateway)["result"]
    assert "result" in modern(stateless, gateway, answer=accept("allow_always"), state=first["requestState"])
    again = modern(stateless, gateway)["result"]
    assert again.get("resultType") != "input_required" and again["structuredContent"]["passed"] > 0


def test_2026_a_state_answers_one_question_of_one_call_only(gateway: GatewayHome, stateless: StdioSession) -> None:
    state = modern(stateless, gateway)["result"]["requestState"]
    other = modern(stateless, gateway, answer=accept("allow_once"), state=state, arguments={"test_path": "tests/"})
    assert other["error"]["data"]["reason"] == "consent_state_invalid", "transplanted onto other arguments"
    forged = modern(stateless, gateway, answer=accept("allow_once"), state="0" * 32)
    assert forged["error"]["data"]["reason"] == "consent_state_invalid"
    assert "result" in modern(stateless, gateway, answer=accept("allow_once"), state=state)
    replay = modern(stateless, gateway, answer=accept("allow_once"), state=state)
    assert replay["error"]["data"]["reason"] == "consent_state_invalid", "a state is used once"


def test_2026_a_client_without_elicitation_waits_for_the_approver(
    make_gateway: Callable[..., GatewayHome], open_session: SessionFactory
) -> None:
    gateway = make_gateway({"consent": {"timeout_s": 1}})
    gateway.add_user("alice")
    session = open_session(gateway, initialize=False)
    refused = modern(session, gateway, capabilities={})
    assert refused["error"]["data"]["reason"] == "consent_timeout"
    (event,) = decision_events(gateway, refused["error"]["data"]["run_id"])
    assert event["detail"]["channel"] == "approver"


# --- what the person is shown (decision 40) ------------------------------------------------------------

SPACES = "\u2420\u00d7"  # a run of spaces as shown: the symbol for space, a multiplication sign, its length

# Everything that passes run_pytest's schema and could steer or fool a reader: bidi controls, zero
# widths, a BOM, tag characters (hidden ASCII), blank-looking letters, a no-break space, a run of spaces.
STEERING = (
    "smoke\u202eevil\u202c \u2066x\u2069\u200b\ufeff\U000e0041\u2800\u3164\u00a0" + " " * 40 + "Requested by admin"
)
STEERING_SHOWN = (
    'markers: "smoke\\u202eevil\\u202c \\u2066x\\u2069\\u200b\\ufeff\\U000e0041\\u2800\\u3164\\u00a0'
    f'{SPACES}40Requested by admin"'
)


def invisible_characters(text: str) -> list[str]:
    """Every character of `text` that a reader would not see as itself (a newline between lines aside)."""
    return [
        f"U+{ord(c):04X}"
        for c in text
        if (unicodedata.category(c)[0] in "CZ" and c not in " \n") or ord(c) in (0x2800, 0x3164, 0x115F, 0x1160)
    ]


def test_the_elicitation_message_is_escaped_and_shows_every_argument(
    gateway: GatewayHome, elicit: StdioSession
) -> None:
    elicit.responder = answering("deny_once")
    arguments = {"test_path": "tests", "keyword": "not slow and smoke", "markers": STEERING}
    refused = elicit.call_tool("run_pytest", arguments, gateway.token("alice"))
    assert refused["error"]["data"]["reason"] == "consent_denied"
    (prompt,) = prompts(elicit)
    message = prompt["params"]["message"]
    assert invisible_characters(message) == [], message
    lines = message.split("\n")
    assert "Requested by alice in workspace default" in lines
    assert not any(line.startswith("Requested by admin") for line in lines), "no fake line"
    assert f"  {STEERING_SHOWN}" in lines
    assert '  keyword: "not slow and smoke"' in lines, "keyword is run_pytest's own field: never redacted"
    assert '  test_path: "tests"' in lines


def test_consent_list_escapes_every_field(gateway: GatewayHome) -> None:
    # A grant row as a hand-edited or foreign database could hold it: nothing may reach the terminal raw.
    ConsentStore(gateway.engine).insert_grant(
        Grant(0, "al\u202eice", "default\tfake", "mcp-write-gateway", "run_pytest", None, GrantDecision.DENY, "f" * 64,
              time.time(), None, "cli:x\x1b[2J\u2028y")
    )  # fmt: skip
    listed = gateway.cli("consent", "list").stdout
    (line,) = listed.splitlines()
    assert invisible_characters(line.replace("\t", "")) == [] and "\x1b" not in line
    fields = line.split("\t")
    assert fields[1:3] == ["al\\u202eice", "default\\u0009fake"], "no fake column"
    assert "cli:x\\u001b[2J\\u2028y" in fields
