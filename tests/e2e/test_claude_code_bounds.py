"""Reading a Bash command never holds the gateway (decision 71), over real stdio.

A hostile command (a mebibyte of wrappers, or one within the length bound that takes the most
reading) is sent to `check_permission`, and a `ping` right behind it: the ping is answered at
once (the reading runs off the event loop, and is bounded), and the command is denied naming
the bound, never asked about or allowed. On the old code the first command held `serve` for
hours: the ping's wait is bounded, so the test fails instead of hanging.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.e2e.test_claude_code import SessionFactory
from tests.harness import GatewayHome, StdioSession
from tests.permission_checks import answer, ask, events

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


def ping_after(session: StdioSession, command: str, tool: str = "Bash", key: str = "command") -> tuple[float, int]:
    """Send the command (or path) to check_permission and a ping right behind it: the ping's round trip,
    and the check's request id."""
    request_id = ask(session, tool, {key: command})
    started = time.monotonic()
    session.send({"jsonrpc": "2.0", "id": "ping-1", "method": "ping"})
    reply = session.wait_response("ping-1", timeout=PING_S)
    assert reply.get("result") == {}, reply
    return time.monotonic() - started, request_id


@pytest.mark.parametrize(
    ("command", "bound"),
    [
        ("env -u a " * 110_000 + "rm x", "characters long"),  # about 1 MB: one JSON line under the 1 MiB frame
        ("eval " * 4_000 + "rm x", "steps"),  # within the length bound, the costliest reading there is
        ("nice -n 1 " * 3_000 + "rm x", "words"),
    ],
    ids=["mebibyte", "within-length", "nice-chain"],
)
def test_a_ping_behind_a_hostile_command_is_answered_at_once_and_the_command_denied(
    session: tuple[GatewayHome, StdioSession], command: str, bound: str
) -> None:
    gw, stdio = session
    took, request_id = ping_after(stdio, command)

    assert took < PING_S
    decided, run_id = answer(stdio, request_id, timeout=120)
    assert decided["behavior"] == "deny"
    assert bound in decided["message"] and "script file" in decided["message"], decided["message"]
    decision = events(gw, run_id)["mcp.permission.decision"]["detail"]
    assert decision["reason"] == "input_unreadable" and bound in decision["bound"], decision
    assert events(gw, run_id)["TOOL_FINISHED"]["detail"]["behavior"] == "deny"
    assert len(command) > MAX_COMMAND_CHARS or bound != "characters long"


WRAPPERS = ["env -u a ", "nice -n 1 ", "timeout 1 ", "xargs ", "command ", "builtin ", "exec ", "sudo -u root ",
            "nohup ", "stdbuf -o0 ", "ionice -c 3 ", "chrt -f 1 ", "setsid ", "time ", "doas ", "flock f ", "busybox "]  # fmt: skip


def test_long_wrapper_chains_before_a_denied_program_are_denied(session: tuple[GatewayHome, StdioSession]) -> None:
    _, stdio = session
    for wrapper in WRAPPERS:
        for count in (5, 3_000):
            took, request_id = ping_after(stdio, wrapper * count + "rm x")
            decided, _ = answer(stdio, request_id, timeout=120)
            assert decided["behavior"] == "deny", (wrapper, count, decided)
            assert took < PING_S, (wrapper, count)


def test_three_thousand_xargs_before_rm_is_denied_by_the_rm_rule_or_a_bound(
    session: tuple[GatewayHome, StdioSession],
) -> None:
    gw, stdio = session
    decided, run_id = answer(stdio, ask(stdio, "Bash", {"command": "xargs " * 3000 + "rm x"}), timeout=120)
    assert decided["behavior"] == "deny", decided
    assert events(gw, run_id)["mcp.permission.decision"]["detail"]["reason"] in ("rule_denied", "input_unreadable")


@pytest.mark.parametrize(("tool", "key"), [("Edit", "file_path"), ("Read", "file_path"), ("Glob", "pattern")])
def test_a_ping_behind_a_hostile_path_is_answered_at_once_and_the_path_denied(
    session: tuple[GatewayHome, StdioSession], tool: str, key: str
) -> None:
    gw, stdio = session
    took, request_id = ping_after(stdio, "a/" * 400_000 + "x", tool, key)  # judging it took hours

    assert took < PING_S
    decided, run_id = answer(stdio, request_id, timeout=120)
    assert decided["behavior"] == "deny" and "shorter path" in decided["message"], decided
    assert events(gw, run_id)["mcp.permission.decision"]["detail"]["reason"] == "input_unreadable"
