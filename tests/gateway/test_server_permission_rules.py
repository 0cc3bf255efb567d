"""Bash rules (decision 41) and WebFetch hosts (decision 39) judged through `check_permission` in
process (tests/memory_session.py), asked as Claude Code asks, with `consent.mode: deny` so that an
"ask" is answered at once (deny, reason `consent_mode_deny`) and the three outcomes can be told
apart. Over real stdio: the commands that stay allowed (tests/e2e/test_claude_code_bash.py) and the
file-tool family (tests/e2e/test_claude_code_hosts_and_files.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tests.bash_cases import DENIED, NEVER_ALLOWED, NOT_DENIED
from tests.e2e.test_claude_code_bash import bash_gateway, outcomes
from tests.e2e.test_claude_code_hosts_and_files import FETCHES, outcome, rules_gateway
from tests.harness import GatewayHome
from tests.memory_session import MemorySession
from tests.permission_checks import check

SessionFactory = Callable[..., MemorySession]


def bash_outcomes(
    make_gateway: Callable[..., GatewayHome], open_memory: SessionFactory, allow: list[str], commands: Sequence[Any]
) -> dict[str, str]:
    gw = bash_gateway(make_gateway, allow)
    return outcomes(gw, open_memory(gw, environ={"MCP_GATEWAY_TOKEN": gw.token("alice")}), commands)


def test_no_allow_rule_allows_a_command_that_is_not_plain_literal_words(
    make_gateway: Callable[..., GatewayHome], open_memory: SessionFactory
) -> None:
    got = bash_outcomes(make_gateway, open_memory, ["Bash(pytest:*)", "Bash"], NEVER_ALLOWED)

    assert {c: v for c, v in got.items() if v == "allow"} == {}
    assert got["pytest () ( rm -rf ~ ) && pytest -q"] == "deny Bash(rm:*)"  # the function's body is read too


def test_a_deny_rule_denies_every_rewrite(
    make_gateway: Callable[..., GatewayHome], open_memory: SessionFactory
) -> None:
    got = bash_outcomes(make_gateway, open_memory, ["Bash"], DENIED + NOT_DENIED)

    assert {param.values[0]: got[str(param.values[0])] for param in DENIED} == {
        param.values[0]: "deny Bash(rm:*)" for param in DENIED
    }
    assert [param.values[0] for param in NOT_DENIED if got[str(param.values[0])].startswith("deny")] == []


def test_webfetch_hosts(make_gateway: Callable[..., GatewayHome], open_memory: SessionFactory) -> None:
    gw = rules_gateway(make_gateway)
    session = open_memory(gw, environ={"MCP_GATEWAY_TOKEN": gw.token("alice")})
    got = {}
    for url, _ in FETCHES:
        decided, run_id = check(session, "WebFetch", {"url": url, "prompt": "summarise"})
        got[url] = outcome(gw, decided, run_id)
    assert got == dict(FETCHES)
