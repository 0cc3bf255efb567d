"""Reading a hostile Bash command or path never holds the gateway (decision 71), and a question that
carries `params.auth` is judged by that token alone (docs/claude-code.md), through the MCP server in
process (tests/memory_session.py).

A hostile command within the frame's size is sent to `check_permission` with a `ping` right behind
it: the ping is answered at once (the reading runs off the event loop, and is bounded), and the
command is denied naming the bound. The mebibyte command (one JSON line under the 1 MiB frame),
and `params.auth` with the token kept out of `serve`'s stderr, stay over real stdio:
tests/e2e/test_claude_code_bounds.py and tests/e2e/test_claude_code_auth.py.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.e2e.test_claude_code_auth import RULES as AUTH_RULES
from tests.e2e.test_claude_code_auth import bad_auths
from tests.e2e.test_claude_code_bounds import PING_S, denied_at_once, ping_after
from tests.e2e.test_claude_code_bounds import RULES as BOUNDS_RULES
from tests.harness import GatewayHome
from tests.memory_session import MemorySession
from tests.permission_checks import answer, ask, events

SessionFactory = Callable[..., MemorySession]


@pytest.fixture
def session(make_gateway: Callable[..., GatewayHome], open_memory: SessionFactory) -> tuple[GatewayHome, MemorySession]:
    gw = make_gateway({"permission_prompt": BOUNDS_RULES, "consent": {"mode": "deny"}})
    gw.add_user("alice", "USER")
    return gw, open_memory(gw, environ={"MCP_GATEWAY_TOKEN": gw.token("alice")})


WRAPPERS = ["env -u a ", "nice -n 1 ", "timeout 1 ", "xargs ", "command ", "builtin ", "exec ", "sudo -u root ",
            "nohup ", "stdbuf -o0 ", "ionice -c 3 ", "chrt -f 1 ", "setsid ", "time ", "doas ", "flock f ", "busybox "]  # fmt: skip


@pytest.mark.parametrize(
    ("command", "bound"),
    [
        ("eval " * 4_000 + "rm x", "steps"),  # within the length bound, the costliest reading there is
        ("nice -n 1 " * 3_000 + "rm x", "words"),
    ],
    ids=["within-length", "nice-chain"],
)
def test_a_ping_behind_a_hostile_command_is_answered_at_once_and_the_command_denied(
    session: tuple[GatewayHome, MemorySession], command: str, bound: str
) -> None:
    denied_at_once(*session, command, bound)


LONG_CHAINS = ["nice -n 1 ", "xargs ", "stdbuf -o0 "]
"""At 3,000, one wrapper per bound that ends its reading: words, wrappers, steps. Every wrapper's chain at
3,000 is judged in tests/gateway/shell/test_bounds.py, by the same `judge` the server calls."""


def test_long_wrapper_chains_before_a_denied_program_are_denied(session: tuple[GatewayHome, MemorySession]) -> None:
    _, memory = session
    chains = [(wrapper, 5) for wrapper in WRAPPERS] + [(wrapper, 3_000) for wrapper in LONG_CHAINS]
    for wrapper, count in chains:
        took, request_id = ping_after(memory, wrapper * count + "rm x")
        decided, _ = answer(memory, request_id, timeout=120)
        assert decided["behavior"] == "deny", (wrapper, count, decided)
        assert took < PING_S, (wrapper, count)


def test_three_thousand_xargs_before_rm_is_denied_by_the_rm_rule_or_a_bound(
    session: tuple[GatewayHome, MemorySession],
) -> None:
    gw, memory = session
    decided, run_id = answer(memory, ask(memory, "Bash", {"command": "xargs " * 3000 + "rm x"}), timeout=120)
    assert decided["behavior"] == "deny", decided
    assert events(gw, run_id)["mcp.permission.decision"]["detail"]["reason"] in ("rule_denied", "input_unreadable")


@pytest.mark.parametrize(("tool", "key"), [("Edit", "file_path"), ("Read", "file_path"), ("Glob", "pattern")])
def test_a_ping_behind_a_hostile_path_is_answered_at_once_and_the_path_denied(
    session: tuple[GatewayHome, MemorySession], tool: str, key: str
) -> None:
    gw, memory = session
    took, request_id = ping_after(memory, "a/" * 400_000 + "x", tool, key)  # judging it took hours

    assert took < PING_S
    decided, run_id = answer(memory, request_id, timeout=120)
    assert decided["behavior"] == "deny" and "shorter path" in decided["message"], decided
    assert events(gw, run_id)["mcp.permission.decision"]["detail"]["reason"] == "input_unreadable"


# --- params.auth is judged alone ------------------------------------------------------------------------


def test_tools_call_and_tools_list_never_replace_a_bad_params_auth(
    make_gateway: Callable[..., GatewayHome], open_memory: SessionFactory
) -> None:
    gateway = make_gateway({"permission_prompt": AUTH_RULES, "auth": {"env_token": True}, "consent": {"mode": "deny"}})
    gateway.add_user("alice", "USER")
    gateway.add_user("vic", "VIEWER")
    memory = open_memory(gateway, environ={"MCP_GATEWAY_TOKEN": gateway.token("vic")})
    as_env = memory.request("tools/list")["result"]["tools"]
    assert "run_pytest" not in [t["name"] for t in as_env], "the environment's user is a VIEWER"
    for case, auth in bad_auths(gateway).items():
        if case == "viewer":
            continue  # vic's own token: the environment's user here
        called = memory.request("tools/call", {"name": "list_artifacts", "arguments": {}, "auth": auth})
        assert called["error"]["code"] == -32001, (case, called)  # vic, from the environment, may list
        listed = memory.request("tools/list", {"auth": auth})
        if "result" in listed:  # no token to judge: the public list, never the environment user's
            assert "run_pytest" in [t["name"] for t in listed["result"]["tools"]], case
        else:
            assert listed["error"]["code"] == -32001, (case, listed)
