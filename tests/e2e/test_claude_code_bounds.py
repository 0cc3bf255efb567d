"""Reading a Bash command never holds the gateway (decision 71), over real stdio.

A hostile command (a mebibyte of wrappers, or one within the length bound that takes the most
reading) is sent to `check_permission`, and a `ping` right behind it: the ping is answered at
once (the reading runs off the event loop, and is bounded), and the command is denied naming
the bound, never asked about or allowed. On the old code the first command held `serve` for
hours: the ping's wait is bounded, so the test fails instead of hanging.

Here, the mebibyte command (one JSON line just under the 1 MiB frame); the commands and paths within
the frame, and the wrapper chains, are tests/gateway/test_server_permission_bounds.py (in process).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.e2e.test_claude_code import SessionFactory
from tests.harness import GatewayHome, StdioSession
from tests.permission_checks import Asking, answer, ask, events

RULES = {"enabled": True, "deny": ["Bash(rm:*)", "Edit(secrets/**)"], "ask": [], "allow": ["Bash", "Read", "Glob"]}
MAX_COMMAND_CHARS = 65_536
"""gateway/rules/shell/invocations.py's bound, written here so that the test runs on the old code too."""
PING_S = 2.0
"""A ping's answer, generous for a busy machine: the loop is free, so it takes milliseconds."""


@pytest.fixture
def session(make_gateway: Callable[..., GatewayHome], open_session: SessionFactory) -> tuple[GatewayHome, StdioSession]:
    gw = make_gateway({"permission_prompt": RULES, "consent": {"mode": "deny"}})
    gw.add_user("alice", "USER")
    return gw, open_session(gw, env={"MCP_GATEWAY_TOKEN": gw.token("alice")})


def ping_after(session: Asking, command: str, tool: str = "Bash", key: str = "command") -> tuple[float, int]:
    """Send the command (or path) to check_permission and a ping right behind it: the ping's round trip,
    and the check's request id."""
    request_id = ask(session, tool, {key: command})
    started = time.monotonic()
    session.send({"jsonrpc": "2.0", "id": "ping-1", "method": "ping"})
    reply = session.wait_response("ping-1", timeout=PING_S)
    assert reply.get("result") == {}, reply
    return time.monotonic() - started, request_id


def denied_at_once(gw: GatewayHome, session: Asking, command: str, bound: str) -> None:
    """A ping sent behind `command` is answered at once, and the command is denied naming `bound`."""
    took, request_id = ping_after(session, command)

    assert took < PING_S
    decided, run_id = answer(session, request_id, timeout=120)
    assert decided["behavior"] == "deny"
    assert bound in decided["message"] and "script file" in decided["message"], decided["message"]
    decision = events(gw, run_id)["mcp.permission.decision"]["detail"]
    assert decision["reason"] == "input_unreadable" and bound in decision["bound"], decision
    assert events(gw, run_id)["TOOL_FINISHED"]["detail"]["behavior"] == "deny"


def test_a_ping_behind_a_mebibyte_command_is_answered_at_once_and_the_command_denied(
    session: tuple[GatewayHome, StdioSession],
) -> None:
    command = "env -u a " * 110_000 + "rm x"  # about 1 MB: one JSON line under the 1 MiB frame
    assert len(command) > MAX_COMMAND_CHARS
    denied_at_once(*session, command, "characters long")
