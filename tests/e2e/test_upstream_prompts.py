"""What the terminal approver tells a person about an upstream MCP server's tool (docs/upstreams.md, "What a
person is told"): `mcp-gateway approvals`, a real process in a pty, answers a question a gateway in process
(tests/upstream_tools.py) left in the database for a `ToolSpec` with an origin."""

from __future__ import annotations

from collections.abc import Callable

from tests.gateway.test_upstream_prompts import ARGS, TOLD
from tests.harness import Approver, GatewayHome, shows_request
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
