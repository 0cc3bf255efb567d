"""What the terminal approver tells a person about an upstream MCP server's tool (docs/upstreams.md, "What a
person is told"): `mcp-gateway approvals`, a real process in a pty, answers a question a gateway in process
(tests/upstream_tools.py) left in the database for a `ToolSpec` with an origin."""

from __future__ import annotations

from collections.abc import Callable

from tests.e2e.test_upstreams import allow, install_server, upstream_policy
from tests.gateway.test_upstream_prompts import ARGS, TOLD
from tests.harness import FORM_ELICITATION, Approver, GatewayHome, StdioSession, shows_request
from tests.upstream_tools import serving, upstream_tool


def test_the_approver_names_the_upstream_its_trust_every_hint_and_the_servers_unchecked_words(
    gateway: GatewayHome, approvals: Callable[[], Approver]
) -> None:
    approver = approvals()
    with serving(gateway, upstream_tool()) as session:  # no elicitation: the question goes out of band
        waiting = session.request_soon(
            "tools/call", {"name": "git__git_commit", "arguments": ARGS, "auth": {"token": gateway.token("alice")}}
        )
        shows_request(approver)
        screen = approver.before
        for line in TOLD:
            assert f"    {line}\r\n" in screen, (line, screen)
        assert "High risk" in screen and "(destructive)" in screen
        assert "Allow always" not in screen, "destructive by MCP's default"
        assert "\u202e" not in screen and "\\u202e" in screen, "the bidi override is shown escaped"
        approver.send("3")
        approver.expect("DENY_ONCE")
        answer = waiting.result(60)
    assert answer["error"]["code"] == -32008 and answer["error"]["data"]["reason"] == "consent_denied"


def test_a_real_upstream_over_stdio_is_told_by_its_policys_trust_and_its_servers_words(
    make_gateway: Callable[..., GatewayHome], open_session: Callable[..., StdioSession]
) -> None:
    """`serve` with a real upstream server (tests/upstreams/server.py, confined): its read-only, closed-world
    `echo` from an untrusted upstream is medium and asked; the form names what the gateway knows of it."""
    gateway = make_gateway()
    install_server(gateway)
    gateway.write_policy(upstream_policy())
    gateway.add_user("alice", "USER")
    asked: list[str] = []
    session = open_session(gateway, capabilities=FORM_ELICITATION, env={"UP_TEST_SECRET": "s"})
    session.responder = allow("deny_once", asked)
    denied = session.call_tool("up__echo", {"text": "x"}, gateway.token("alice"))
    assert denied["error"]["data"]["reason"] == "consent_denied"
    (message,) = asked
    assert [line.strip() for line in message.split("\n")][-5:] == [
        "Upstream server: up (untrusted)",
        "Annotations: readOnlyHint: true · destructiveHint: true (MCP default; it means nothing for a read-only tool)"
        " · idempotentHint: false (MCP default; it means nothing for a read-only tool)"
        " · openWorldHint: false",
        "The server describes this tool as (unchecked): Echo the text back",
        "Arguments:",
        'text: "x"',
    ], message
    assert "Medium risk" in message
    events = gateway.events_of(denied["error"]["data"]["run_id"])
    (decision,) = [e for e in events if e["event_type"] == "mcp.permission.decision"]
    assert decision["detail"]["risk_tier"] == "medium"
