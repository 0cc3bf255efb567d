"""A rug pull, end to end (decision 85): a real upstream server behind a real `serve` changes a tool's
definition mid-session; the tool is withheld, `mcp-gateway upstream list` shows it changed,
`mcp-gateway upstream accept` shows the difference and accepts it, and the same session is offered and
can call the tool again once the server lists the accepted definition. Both engines (`db_url`).

The server is tests/upstreams/server.py (its `change` tool rewrites `echo`'s description and says
tools/list_changed), installed as tests/e2e/test_upstreams.py installs it."""

from __future__ import annotations

import time
from typing import Any

from tests.deadlines import scaled
from tests.e2e.test_upstreams import (
    GatewayFactory,
    SessionFactory,
    install_server,
    refusal,
    session_on,
    upstream_policy,
)
from tests.harness import GatewayHome, StdioSession

ORIGINAL = "Echo the text back"
CHANGED = "Echo the text back, and also something else"


def listed(session: StdioSession, token: str) -> set[str]:
    return {t["name"] for t in session.request("tools/list", {"auth": {"token": token}})["result"]["tools"]}


def wait_listed(session: StdioSession, token: str, name: str, *, present: bool) -> None:
    """Until the gateway has taken in the server's tools/list_changed (a notification: nothing to await)."""
    deadline = time.monotonic() + scaled(60)
    while (name in listed(session, token)) != present:
        assert time.monotonic() < deadline, f"{name} {'never' if present else 'still'} listed"
        time.sleep(0.1)


def events_of_type(gateway: GatewayHome, kind: str) -> list[dict[str, Any]]:
    return [e for e in gateway.audit_events() if e["event_type"] == kind]


def test_a_changed_definition_is_withheld_then_accepted_and_offered_again(
    make_gateway: GatewayFactory, open_session: SessionFactory, db_url: str
) -> None:
    gateway = make_gateway()
    install_server(gateway)
    gateway.write_policy(upstream_policy())
    gateway.add_user("alice", "USER")
    session = session_on(gateway, open_session)
    token = gateway.token("alice")
    assert session.call_tool("up__echo", {"text": "before"}, token)["result"]["content"][0]["text"] == "before"

    assert session.call_tool("up__change", {}, token)["result"]["content"][0]["text"] == "changed"
    wait_listed(session, token, "up__echo", present=False)
    assert refusal(session.call_tool("up__echo", {"text": "after"}, token)) == (-32004, "tool_definition_changed")

    rows = [line.split("\t") for line in gateway.cli("upstream", "list").stdout.splitlines()]
    states = {row[1]: (row[2], row[3]) for row in rows if row[0] == "up"}
    assert states["echo"] == ("changed", "yes")
    assert states["change"] == ("pinned", "yes")
    (changed,) = events_of_type(gateway, "TOOL_DEFINITION_CHANGED")
    assert (changed["tool_name"], changed["detail"]["tool"]) == ("up__echo", "echo")
    assert ORIGINAL not in str(changed), "the event holds the digests, not the server's words"

    accepted = gateway.cli("upstream", "accept", "up", "echo")
    assert accepted.returncode == 0, accepted.stderr
    diff = accepted.stdout.split("\n")
    assert f'-  "description": "{ORIGINAL}",' in diff
    assert f'+  "description": "{CHANGED}",' in diff
    assert "accepted up / echo" in accepted.stderr
    (event,) = events_of_type(gateway, "TOOL_DEFINITION_ACCEPTED")
    assert event["detail"]["accepted_sha256"] == changed["detail"]["seen_sha256"]

    # The server lists the accepted definition at its next tools/list: offered again, and called.
    assert session.call_tool("up__change", {}, token)["result"]["content"][0]["text"] == "changed"
    wait_listed(session, token, "up__echo", present=True)
    assert session.call_tool("up__echo", {"text": "again"}, token)["result"]["content"][0]["text"] == "again"
    assert len(events_of_type(gateway, "TOOL_DEFINITION_CHANGED")) == 1
    assert gateway.chain_ok()
