"""Bash rules judged end to end through `check_permission` over stdio (decision 41): a table of
tests/bash_cases.py, asked as Claude Code asks, with `consent.mode: deny` so that an
"ask" is answered at once (deny, reason `consent_mode_deny`) and the three outcomes can be told
apart. The rules are the shipped ones with the old `Bash(pytest:*)` allow rule, plus a bare
`Bash` allow rule in the deny-side session (so that only the deny rule can stop a command).
The tables that must never be allowed, and the rewrites a deny rule must deny, are asked in
process: tests/gateway/test_server_permission_rules.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tests.bash_cases import STILL_ALLOWED
from tests.e2e.test_claude_code import SessionFactory
from tests.harness import GatewayHome
from tests.permission_checks import Asking, check, events

SHIPPED_DENY = ["Bash(rm:*)", "Bash(curl:*)", "Bash(wget:*)"]


def bash_gateway(make_gateway: Callable[..., GatewayHome], allow: list[str]) -> GatewayHome:
    """The shipped deny rules, `allow`, and consent.mode deny (an "ask" is answered at once)."""
    gw = make_gateway({"permission_prompt": {"enabled": True, "deny": SHIPPED_DENY, "ask": [], "allow": allow},
                       "consent": {"mode": "deny"}})  # fmt: skip
    gw.add_user("alice", "USER")
    return gw


def outcomes(gw: GatewayHome, session: Asking, commands: Sequence[Any]) -> dict[str, str]:
    """Each command's outcome: allow (by a rule), deny (by a rule, named in the message) or ask."""
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


def test_plain_commands_stay_allowed(make_gateway: Callable[..., GatewayHome], open_session: SessionFactory) -> None:
    gw = bash_gateway(make_gateway, ["Bash(pytest:*)"])
    got = outcomes(gw, open_session(gw, env={"MCP_GATEWAY_TOKEN": gw.token("alice")}), STILL_ALLOWED)

    assert got == {param.values[0]: "allow" for param in STILL_ALLOWED}
