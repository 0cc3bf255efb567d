"""WebFetch hosts and the file-tool family, judged end to end through `check_permission` over stdio
(decision 39): a sample of the tables in tests/gateway/test_url_hosts.py and
test_file_rules.py, asked as Claude Code asks, with `consent.mode: deny` so that an "ask" is
answered at once (deny, reason `consent_mode_deny`) and the three outcomes can be told apart.
The WebFetch hosts are asked in process: tests/gateway/test_server_permission_rules.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.e2e.test_claude_code import SessionFactory
from tests.harness import GatewayHome
from tests.permission_checks import check, events

RULES = {
    "enabled": True,
    "deny": ["WebFetch(domain:evil.example)", "WebFetch(domain:127.0.0.1)", "Read(secrets/**)", "Edit(secrets/**)"],
    "ask": [],
    "allow": ["WebFetch(domain:docs.example.com)", "Read(src/**)", "Edit(src/**)", "Grep", "Glob", "LS"],
}

FETCHES = [
    ("https://docs.example.com/a", "allow"),
    ("HTTPS://DOCS.example.com:8443/", "allow"),
    ("https://evil.example\\@docs.example.com/", "deny"),  # WHATWG reads evil.example
    ("https://evil.example./", "deny"),
    ("https://%65vil.example/", "deny"),
    ("https://\uff45\uff56\uff49\uff4c.example/", "deny"),
    ("https://evil。example/", "deny"),
    ("https://evil\u200b.example/", "deny"),
    ("https://docs.example.com@evil.example/", "deny"),
    ("http://0x7f.1/", "deny"),
    ("http://2130706433/", "deny"),
    ("http://[::ffff:127.0.0.1]/", "deny"),
    ("https://user:pw@docs.example.com/", "ask"),
    ("http:\\\\docs.example.com/", "ask"),
    ("https://docs.exa\tmple.com/", "ask"),
    ("//docs.example.com/x", "ask"),
    ("https://docs.example.com./", "ask"),
    ("file:///etc/passwd", "ask"),
    ("javascript:alert(1)", "ask"),
]

FILES: list[tuple[str, dict[str, Any], str]] = [
    ("Grep", {"pattern": "key", "path": "secrets"}, "deny"),
    ("Grep", {"pattern": "key", "path": ".", "glob": "secrets/*"}, "deny"),
    ("Grep", {"pattern": "key"}, "ask"),  # the workspace holds secrets/
    ("Grep", {"pattern": "key", "path": "{ws}/src"}, "allow"),
    ("Glob", {"pattern": "secrets/**"}, "deny"),
    ("Glob", {"pattern": "**/*.py"}, "ask"),
    ("Glob", {"pattern": "src/**/*.py"}, "allow"),
    ("LS", {"path": "{ws}/secrets"}, "deny"),
    ("LS", {"path": "/"}, "ask"),
    ("LS", {"path": "{ws}/src"}, "allow"),
    ("Write", {"file_path": "{ws}/secrets/new.pem", "content": "x"}, "deny"),
    ("NotebookEdit", {"notebook_path": "{ws}/secrets/n.ipynb", "new_source": "x"}, "deny"),
    ("MultiEdit", {"file_path": "{ws}/src/app.py", "edits": [{"old_string": "a", "new_string": "b"}]}, "allow"),
]


@pytest.fixture
def gw(make_gateway: Callable[..., GatewayHome]) -> GatewayHome:
    return rules_gateway(make_gateway)


def rules_gateway(make_gateway: Callable[..., GatewayHome]) -> GatewayHome:
    """RULES with consent.mode deny, alice a USER, a workspace holding secrets/ and src/."""
    gateway = make_gateway({"permission_prompt": RULES, "consent": {"mode": "deny"}})
    gateway.add_user("alice", "USER")
    (gateway.workspace / "secrets").mkdir()
    (gateway.workspace / "src").mkdir(exist_ok=True)
    return gateway


def outcome(gateway: GatewayHome, decided: dict[str, Any], run_id: str) -> str:
    """allow (by a rule), deny (by a rule) or ask (no rule allows: consent, which denies at once here)."""
    detail = events(gateway, run_id)["mcp.permission.decision"]["detail"]
    if decided["behavior"] == "allow":
        assert detail["origin"] == "policy" and detail["rule"], detail
        return "allow"
    return {"rule_denied": "deny", "consent_mode_deny": "ask"}[detail["reason"]]


def test_file_tools_over_stdio(gw: GatewayHome, open_session: SessionFactory) -> None:
    session = open_session(gw, env={"MCP_GATEWAY_TOKEN": gw.token("alice")})
    got, wanted = [], []
    for tool, tool_input, verdict in FILES:
        concrete = {k: v.replace("{ws}", str(gw.workspace)) if isinstance(v, str) else v for k, v in tool_input.items()}
        decided, run_id = check(session, tool, concrete)
        got.append((tool, tool_input, outcome(gw, decided, run_id)))
        wanted.append((tool, tool_input, verdict))
    assert got == wanted
