"""A closed client is not a person (decision 46).

Before the fix, closing stdin during an `elicitation/create` wait (or answering it with an error)
was audited as `DENY_ONCE, origin user_prompt`: a denial nobody made. Now it is a deny with
`origin: no_answer` and `detail.no_answer` saying why; `user_prompt` stays for answers a client
returned (accept, decline, cancel: tests/e2e/test_consent.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.harness import GatewayHome, StdioSession

SessionFactory = Callable[..., StdioSession]
ELICITATION: dict[str, Any] = {"elicitation": {"form": {}}}
RUN = ("run_pytest", {"test_path": "tests"})


def _question(session: StdioSession) -> dict[str, Any]:
    """Read until the gateway asks its `elicitation/create` question."""
    while True:
        message = session.read_message(timeout=30)
        if message.get("method") == "elicitation/create":
            return message


def _decisions(gateway: GatewayHome) -> list[dict[str, Any]]:
    return [e for e in gateway.audit_events() if e["event_type"] == "mcp.permission.decision"]


def test_closing_stdin_during_the_question_is_audited_as_nobodys_answer(
    gateway: GatewayHome, open_session: SessionFactory
) -> None:
    session = open_session(gateway, capabilities=ELICITATION)
    session.send_call(*RUN, token=gateway.token("alice"))
    _question(session)
    assert session.process.stdin is not None
    session.process.stdin.close()  # the client goes away without answering
    session.process.wait(timeout=30)
    (event,) = _decisions(gateway)
    detail = event["detail"]
    assert (detail["decision"], detail["origin"], detail["channel"]) == ("DENY_ONCE", "no_answer", "elicitation")
    assert detail["no_answer"] == "client_gone" and detail["reason"] == "consent_no_answer"
    assert not any((gateway.home / "artifacts").iterdir()), "nothing ran"
    assert gateway.chain_ok()


def test_an_error_response_to_the_question_is_no_answer_either(
    gateway: GatewayHome, open_session: SessionFactory
) -> None:
    session = open_session(gateway, capabilities=ELICITATION)
    call_id = session.send_call(*RUN, token=gateway.token("alice"))
    question = _question(session)
    session.send({"jsonrpc": "2.0", "id": question["id"], "error": {"code": -32601, "message": "no forms here"}})
    response = session.wait_response(call_id)
    assert response["error"]["code"] == -32008 and response["error"]["data"]["reason"] == "consent_no_answer"
    assert "nobody answered" in response["error"]["message"]
    (event,) = _decisions(gateway)
    assert event["run_id"] == response["error"]["data"]["run_id"]
    detail = event["detail"]
    assert (detail["decision"], detail["origin"], detail["no_answer"]) == ("DENY_ONCE", "no_answer", "client_error")
    assert not any((gateway.home / "artifacts").iterdir()), "nothing ran"
    assert "result" in session.request("ping"), "the session goes on"
