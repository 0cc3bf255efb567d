"""Bash rules judged end to end through `check_permission` over stdio (decision 41): the
tables of tests/bash_cases.py, asked as Claude Code asks, with `consent.mode: deny` so that an
"ask" is answered at once (deny, reason `consent_mode_deny`) and the three outcomes can be told
apart. The rules are the shipped ones with the old `Bash(pytest:*)` allow rule, plus a bare
`Bash` allow rule in the deny-side session (so that only the deny rule can stop a command).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tests.bash_cases import DENIED, NEVER_ALLOWED, NOT_DENIED, STILL_ALLOWED
from tests.e2e.test_claude_code import SessionFactory
from tests.harness import GatewayHome
from tests.permission_checks import check, events

SHIPPED_DENY = ["Bash(rm:*)", "Bash(curl:*)", "Bash(wget:*)"]


def outcomes(
    make_gateway: Callable[..., GatewayHome], open_session: SessionFactory, allow: list[str], commands: Sequence[Any]
) -> dict[str, str]:
    """Each command's outcome: allow (by a rule), deny (by a rule, named in the message) or ask."""
    gw = make_gateway({"permission_prompt": {"enabled": True, "deny": SHIPPED_DENY, "ask": [], "allow": allow},
                       "consent": {"mode": "deny"}})  # fmt: skip
    gw.add_user("alice", "USER")
    session = open_session(gw, env={"MCP_GATEWAY_TOKEN": gw.token("alice")})
    got = {}
    for param in commands:
        (command,) = param.values
        decided, run_id = check(session, "Bash", {"command": command, "description": "agent-written"})
        detail = events(gw, run_id)["mcp.permission.decision"]["detail"]
        if decided["behavior"] == "allow":
            assert detail["origin"] == "policy" and detail["rule"], detail
            got[command] = "allow"
        elif detail["reason"] == "rule_denied":
            assert detail["rule"] in decided["message"]
            got[command] = f"deny {detail['rule']}"
        else:
            assert detail["reason"] == "consent_mode_deny", detail
            got[command] = "ask"
    assert gw.chain_ok()
    return got


def test_no_allow_rule_allows_a_command_that_is_not_plain_literal_words(
    make_gateway: Callable[..., GatewayHome], open_session: SessionFactory
) -> None:
    got = outcomes(make_gateway, open_session, ["Bash(pytest:*)", "Bash"], NEVER_ALLOWED)

    assert {c: v for c, v in got.items() if v == "allow"} == {}
    assert got["pytest () ( rm -rf ~ ) && pytest -q"] == "deny Bash(rm:*)"  # the function's body is read too


def test_plain_commands_stay_allowed(make_gateway: Callable[..., GatewayHome], open_session: SessionFactory) -> None:
    got = outcomes(make_gateway, open_session, ["Bash(pytest:*)"], STILL_ALLOWED)

    assert got == {param.values[0]: "allow" for param in STILL_ALLOWED}


def test_a_deny_rule_denies_every_rewrite(
    make_gateway: Callable[..., GatewayHome], open_session: SessionFactory
) -> None:
    got = outcomes(make_gateway, open_session, ["Bash"], DENIED + NOT_DENIED)

    assert {param.values[0]: got[str(param.values[0])] for param in DENIED} == {
        param.values[0]: "deny Bash(rm:*)" for param in DENIED
    }
    assert [param.values[0] for param in NOT_DENIED if got[str(param.values[0])].startswith("deny")] == []
