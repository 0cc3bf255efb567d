"""The out-of-band path (docs/consent.md, "The terminal approver"): a client that cannot elicit, and a person at
`mcp-gateway approvals`, driven through its real terminal (a pty, by pexpect)."""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from sqlalchemy import select

from gateway import db
from tests.harness import Approver, GatewayHome, StdioSession, shows_request, without_acts
from tests.pg_cluster import on_both_engines

SessionFactory = Callable[..., StdioSession]
RUN = ("run_pytest", {"test_path": "tests"})
ESC = "\x1b"
_ids = itertools.count(1000)


@pytest.fixture
def gateway(make_gateway: Callable[..., GatewayHome]) -> GatewayHome:
    # A prompt nobody answers would hold a failing test for the default 300 s.
    gw = make_gateway({"consent": {"timeout_s": 60}})
    gw.add_user("alice", "USER")
    return gw


def send_call(session: StdioSession, gateway: GatewayHome, arguments: Mapping[str, Any] | None = None) -> int:
    """Start a run_pytest call without waiting for its answer; returns its JSON-RPC id."""
    request_id = next(_ids)
    name, arguments = RUN[0], dict(arguments or RUN[1])
    session.send(
        {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": "tools/call",
            "params": {"name": name, "arguments": arguments, "auth": {"token": gateway.token("alice")}},
        }
    )
    return request_id


def decision_of(gateway: GatewayHome, run_id: str) -> dict[str, Any]:
    (event,) = [e for e in gateway.events_of(run_id) if e["event_type"] == "mcp.permission.decision"]
    return dict(event["detail"])


def request_rows(gateway: GatewayHome) -> list[dict[str, Any]]:
    with gateway.engine.connect() as connection:
        return [dict(row._mapping) for row in connection.execute(select(db.consent_requests))]


def test_the_approver_shows_the_request_and_allow_once_runs_the_call(
    gateway: GatewayHome, open_session: SessionFactory, approvals: Callable[[], Approver]
) -> None:
    approver = approvals()
    session = open_session(gateway)  # declares no elicitation: the question goes out of band
    call_id = send_call(session, gateway)
    approver.expect(r"consent request (\w+) ---")
    run_id = approver.match.group(1)
    approver.expect(r"\[q\] quit")
    screen = approver.before
    for shown in ("run_pytest", "mcp-write-gateway", "Medium risk", "alice", "default", 'test_path: "tests"'):
        assert shown in screen, (shown, screen)
    assert "[2] Allow always" in screen and "[Enter] Allow once" in screen and "[Esc] Deny once" in screen
    approver.send("1")
    approver.expect("ALLOW_ONCE")
    response = session.wait_response(call_id)
    assert response["result"]["structuredContent"]["passed"] > 0
    assert response["result"]["structuredContent"]["run_id"] == run_id
    detail = decision_of(gateway, run_id)
    assert detail["decision"] == "ALLOW_ONCE" and detail["origin"] == "user_prompt"
    assert detail["channel"] == "approver" and detail["decided_by"].startswith("approvals:")
    (act,) = [e for e in gateway.events_of(run_id) if e["event_type"] == "APPROVER_DECISION"]
    assert act["detail"] == {
        "decision": "ALLOW_ONCE", "decided_by": detail["decided_by"], "recorded": True, "channel": "approver",
    }  # fmt: skip
    assert (act["user"], act["workspace"], act["tool_name"]) == ("alice", "default", "run_pytest")


@pytest.mark.parametrize(("key", "reason"), [("3", "consent_denied"), (ESC, "consent_denied")], ids=["3", "Esc"])
def test_deny_once_and_esc_refuse_the_call(
    gateway: GatewayHome,
    open_session: SessionFactory,
    approvals: Callable[[], Approver],
    key: str,
    reason: str,
) -> None:
    approver = approvals()
    session = open_session(gateway)
    call_id = send_call(session, gateway)
    run_id = shows_request(approver)
    approver.send(key)
    approver.expect("DENY_ONCE")
    response = session.wait_response(call_id)
    assert response["error"]["code"] == -32008 and response["error"]["data"]["reason"] == reason
    events = gateway.events_of(run_id)
    kinds = [e["event_type"] for e in without_acts(events)]
    assert kinds == ["MCP_TOOL_CALL", "mcp.permission.decision", "POLICY_BLOCKED"], "nothing ran"
    (act,) = [e for e in events if e["event_type"] == "APPROVER_DECISION"]
    assert (act["detail"]["decision"], act["detail"]["recorded"]) == ("DENY_ONCE", True)


def test_enter_takes_the_default_and_deny_always_is_remembered(
    gateway: GatewayHome, open_session: SessionFactory, approvals: Callable[[], Approver]
) -> None:
    approver = approvals()
    session = open_session(gateway)
    first = send_call(session, gateway)
    shows_request(approver)
    approver.send("\r")
    approver.expect("ALLOW_ONCE")
    assert "result" in session.wait_response(first)
    second = send_call(session, gateway)
    shows_request(approver)
    approver.send("4")
    approver.expect("DENY_ALWAYS")
    assert session.wait_response(second)["error"]["data"]["reason"] == "consent_denied_always"
    third = session.wait_response(send_call(session, gateway))
    assert third["error"]["data"]["reason"] == "consent_denied_always", "refused at once"
    assert len(request_rows(gateway)) == 2, "no question was asked for the third call"


def test_allow_for_the_session_from_the_approver_covers_that_gateway_session_only(
    gateway: GatewayHome, open_session: SessionFactory, approvals: Callable[[], Approver]
) -> None:
    approver = approvals()
    session = open_session(gateway)
    first = send_call(session, gateway)
    shows_request(approver)
    approver.send("5")
    approver.expect("ALLOW_SESSION")
    assert "result" in session.wait_response(first)
    assert "result" in session.wait_response(send_call(session, gateway))
    assert len(request_rows(gateway)) == 1, "the session's allow answered the second call"


@on_both_engines
def test_two_gateways_one_approver_each_request_decided_exactly_once(
    gateway: GatewayHome, open_session: SessionFactory, approvals: Callable[[], Approver]
) -> None:
    approver = approvals()
    one, two = open_session(gateway), open_session(gateway)  # two serve processes, one database
    calls = {send_call(one, gateway): one, send_call(two, gateway): two}
    seen = []
    for _ in calls:
        seen.append(shows_request(approver))
        approver.send("1")
        approver.expect("ALLOW_ONCE")
    responses = [session.wait_response(call_id) for call_id, session in calls.items()]
    assert all("result" in r for r in responses)
    assert sorted(seen) == sorted(r["result"]["structuredContent"]["run_id"] for r in responses)
    rows = request_rows(gateway)
    assert len(rows) == 2 and all(r["status"] == "decided" and r["decision"] == "ALLOW_ONCE" for r in rows)
    assert len({r["session_id"] for r in rows}) == 2, "one question from each gateway"
    for run_id in seen:
        assert decision_of(gateway, run_id)["decision"] == "ALLOW_ONCE"  # exactly one decision event each


@on_both_engines
def test_two_approvers_racing_for_one_request_decide_it_once(
    gateway: GatewayHome, open_session: SessionFactory, approvals: Callable[[], Approver]
) -> None:
    first, second = approvals(), approvals()
    session = open_session(gateway)
    call_id = send_call(session, gateway)
    run_id = shows_request(first)
    assert shows_request(second) == run_id, "both see the same question"
    first.send("1")
    first.expect("ALLOW_ONCE")
    second.send("4")
    second.expect(["not recorded: another approver decided first", "no longer waiting"])
    assert "result" in session.wait_response(call_id)
    (row,) = request_rows(gateway)
    assert row["decision"] == "ALLOW_ONCE"
    assert decision_of(gateway, run_id)["decision"] == "ALLOW_ONCE"
    assert gateway.cli("consent", "list").stdout == "", "the loser's Deny always was never stored"


# --- what the person is shown (decision 40) ---------------------------------------------------------

SPACES = "\u2420\u00d7"  # a run of spaces as shown: the symbol for space, a multiplication sign, its length
# 400 zero-width spaces (each shown as a 6-character escape: past a line's 2000) hide what follows them.
KEYWORD = "\u200b" * 400 + " or evil_payload"
MARKERS = "smoke" + " " * 100 + "\u2800\u3164 or slow"
CUT = {"test_path": "tests", "keyword": KEYWORD, "markers": MARKERS}
# What the approver holds for it, written out by hand: one argument a line, escaped.
WHOLE = "\n".join(
    [
        'keyword: "' + "\\u200b" * 400 + ' or evil_payload"',
        f'markers: "smoke{SPACES}100\\u2800\\u3164 or slow"',
        'test_path: "tests"',
    ]
)


def test_a_cut_request_is_loud_enter_denies_it_and_allow_needs_the_whole_seen_first(
    gateway: GatewayHome, open_session: SessionFactory, approvals: Callable[[], Approver]
) -> None:
    approver = approvals()
    session = open_session(gateway)
    call_id = send_call(session, gateway, CUT)
    shows_request(approver)
    screen = approver.before
    digest = hashlib.sha256(WHOLE.encode()).hexdigest()[:16]
    notice = f"NOT SHOWN WHOLE: {len(WHOLE)} characters in 3 lines, sha256 {digest}"
    assert screen.count(notice) == 2, screen
    assert re.search(r"\[✂ CUT: \d+ more characters of this line's \d+\]", screen)
    assert "evil_payload" not in screen, "the cut hides it: hence the notice"
    assert f'markers: "smoke{SPACES}100\\u2800\\u3164 or slow"' in screen, "blanks and runs shown"
    assert 'test_path: "tests"' in screen, "a long argument does not push the others out"
    assert "[Enter] Deny once" in screen and "[v] see all" in screen
    approver.send("\r")
    approver.expect("DENY_ONCE")
    assert session.wait_response(call_id)["error"]["data"]["reason"] == "consent_denied"

    call_id = send_call(session, gateway, CUT)
    shows_request(approver)
    approver.send("1")
    approver.expect(r"press \[v\] to see the whole request before allowing it")
    approver.send("v")
    approver.expect(f"end of the whole request, sha256 {digest}")
    assert "\r\n    ".join(WHOLE.split("\n")) in approver.before, "the whole request, escaped"
    approver.expect(r"\[q\] quit")
    approver.send("1")
    approver.expect("ALLOW_ONCE")
    response = session.wait_response(call_id)
    assert "result" in response, "allowed after it was seen whole"
    assert decision_of(gateway, str(response["result"]["structuredContent"]["run_id"]))["decision"] == "ALLOW_ONCE"
