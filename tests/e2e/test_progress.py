"""Progress over stdio: a call that carries `_meta.progressToken` hears from the gateway while it
waits for consent (through the approver, and through the client's own dialog) and while its suite
runs, every notification before the result, with progress growing; a call without one hears nothing."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tests.harness import Approver, GatewayHome, StdioSession

SLOW_SUITE = "import time, pytest\n\n@pytest.mark.parametrize('i', range(6))\ndef test_slow(i):\n    time.sleep(0.4)\n"


def slow_suite(gateway: GatewayHome) -> dict[str, str]:
    path = gateway.workspace / "tests" / "test_slow.py"
    path.write_text(SLOW_SUITE)
    path.chmod(0o644)
    return {"test_path": "tests/test_slow.py"}


def send_with_progress(session: StdioSession, gateway: GatewayHome, arguments: dict[str, Any], token: object) -> int:
    request_id = 4242
    params = {"name": "run_pytest", "arguments": arguments, "auth": {"token": gateway.token("alice")}}
    if token is not None:
        params["_meta"] = {"progressToken": token}
    session.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params})
    return request_id


def progress_of(session: StdioSession, token: object) -> list[dict[str, Any]]:
    return [
        m["params"]
        for m in session.unsolicited
        if m.get("method") == "notifications/progress" and m["params"].get("progressToken") == token
    ]


def wait_for(session: StdioSession, found: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not found():
        assert time.monotonic() < deadline, session.unsolicited
        session.pump(0.2)


def assert_run_progress(notes: list[dict[str, Any]]) -> None:
    progress = [n["progress"] for n in notes]
    assert progress == sorted(set(progress)), "progress must grow with every notification"
    assert all("total" not in n for n in notes)
    run = [n["message"] for n in notes if n["message"].startswith("Running the tests")]
    # Movement: the suite's count was reported while it ran (6 tests of 0.4 s, at most one note a second).
    assert len(set(run)) >= 2, run
    counts = [int(m.split(": ")[1].split()[0]) for m in run if m.split(": ")[1][0].isdigit()]
    assert counts == sorted(counts) and all(0 < c <= 6 for c in counts), run


def test_progress_while_the_approver_decides_and_while_the_suite_runs(
    gateway: GatewayHome, open_session: Callable[..., StdioSession], approvals: Callable[[], Approver]
) -> None:
    approver = approvals()
    session = open_session(gateway)  # no elicitation: the question waits for the approver
    call_id = send_with_progress(session, gateway, slow_suite(gateway), "tok-approver")
    wait_for(session, lambda: bool(progress_of(session, "tok-approver")))
    first = progress_of(session, "tok-approver")[0]["message"]
    assert "Waiting for a person to allow run_pytest" in first and "`mcp-gateway approvals`" in first, first
    assert "s left, then it is denied" in first
    approver.expect(r"\[q\] quit")
    approver.send("1")
    response = session.wait_response(call_id)
    assert response["result"]["structuredContent"]["passed"] == 6, response
    notes = progress_of(session, "tok-approver")  # everything read before the response came
    assert_run_progress(notes)
    assert notes[0]["message"] == first

    # Without a progressToken: the same call, not one notification.
    before = len(session.unsolicited)
    approver.expect(r"ALLOW_ONCE")
    call_id = send_with_progress(session, gateway, {"test_path": "tests/test_slow.py"}, None)
    approver.expect(r"\[q\] quit")
    approver.send("1")
    assert "result" in session.wait_response(call_id)
    assert [m for m in session.unsolicited[before:] if m.get("method") == "notifications/progress"] == []


def test_progress_says_to_answer_in_the_clients_dialog_when_it_asks(
    gateway: GatewayHome, open_session: Callable[..., StdioSession]
) -> None:
    session = open_session(gateway, capabilities={"elicitation": {}})

    def answer(message: dict[str, Any]) -> dict[str, Any]:
        assert message["method"] == "elicitation/create"
        return {"action": "accept", "content": {"decision": "allow_once"}}

    session.responder = answer
    call_id = send_with_progress(session, gateway, slow_suite(gateway), 7)
    response = session.wait_response(call_id)
    assert response["result"]["structuredContent"]["passed"] == 6, response
    notes = progress_of(session, 7)
    waiting = [n["message"] for n in notes if n["message"].startswith("Waiting")]
    assert waiting and "in your client's dialog" in waiting[0], notes
    assert_run_progress(notes)
