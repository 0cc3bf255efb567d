"""One refusal of each code over real stdio, with its exact code and the audit trail it leaves.

Each test starts `mcp-gateway serve` as a subprocess, sends JSON-RPC as a client would, and
reads the audit log back: exactly one MCP_TOOL_CALL and one terminal POLICY_BLOCKED carrying the
same code. This proves the wire end to end; every refusal path, on SQLite and on PostgreSQL, is
tests/gateway/test_server_refusals.py (the same server in process).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from tests.harness import GatewayHome, StdioSession
from tests.refusals import RUN, assert_blocked_trail, bad_tokens, refusal

SessionFactory = Callable[..., StdioSession]


def test_every_bad_token_is_refused_with_32001(gateway: GatewayHome, open_session: SessionFactory) -> None:
    session = open_session(gateway)
    for label, (token, reason) in bad_tokens(gateway).items():
        run_id = refusal(session.call_tool(*RUN, token=token), -32001, reason)
        assert_blocked_trail(gateway, run_id, -32001, reason, label)
    assert not any((gateway.home / "artifacts").iterdir()), "nothing may run"


def test_viewer_calling_run_pytest_gets_32003(gateway: GatewayHome, open_session: SessionFactory) -> None:
    session = open_session(gateway)
    run_id = refusal(session.call_tool(*RUN, token=gateway.token("vic")), -32003, "missing_permission")
    assert_blocked_trail(gateway, run_id, -32003, "missing_permission")


def test_paths_escaping_the_workspace_get_32004(
    gateway: GatewayHome, open_session: SessionFactory, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "test_evil.py").write_text("def test_x():\n    pass\n")
    os.symlink(outside, gateway.workspace / "escape")
    session = open_session(gateway)
    token = gateway.token("alice")
    cases = {
        "../": ("../outside", "path_outside_workspace"),
        "symlink": ("escape/test_evil.py", "path_outside_workspace"),
        "option": ("-p evil", "path_looks_like_option"),
    }
    for label, (path, reason) in cases.items():
        run_id = refusal(session.call_tool("run_pytest", {"test_path": path}, token), -32004, reason)
        assert_blocked_trail(gateway, run_id, -32004, reason, label)
    assert not any((gateway.home / "artifacts").iterdir()), "nothing may run"


def test_bad_arguments_and_unknown_tools_get_32602(gateway: GatewayHome, open_session: SessionFactory) -> None:
    session = open_session(gateway)
    for name, arguments, reason in (
        ("run_pytest", {"test_path": "tests", "args": "--pdb"}, "invalid_arguments"),
        ("run_shell", {"cmd": "id"}, "unknown_tool"),
    ):
        run_id = refusal(session.call_tool(name, arguments, gateway.token("alice")), -32602, reason)
        assert_blocked_trail(gateway, run_id, -32602, reason, name)


def test_budget_spent_gives_32005_with_retry_after(
    make_gateway: Callable[..., GatewayHome], open_session: SessionFactory
) -> None:
    gateway = make_gateway({"budget": {"attempts_total": 2, "window_s": 600}, "consent": {"mode": "deny"}})
    gateway.add_user("alice")
    session = open_session(gateway)
    token = gateway.token("alice")
    for _ in range(2):  # the policy allows no prompt: each attempt is denied (-32008), and counted
        refusal(session.call_tool(*RUN, token=token), -32008, "consent_mode_deny")
    response = session.call_tool(*RUN, token=token)
    run_id = refusal(response, -32005, "attempts_exhausted")
    assert 1 <= response["error"]["data"]["retry_after_s"] <= 600
    assert_blocked_trail(gateway, run_id, -32005, "attempts_exhausted")


def test_sandbox_disabled_gives_32006(make_gateway: Callable[..., GatewayHome], open_session: SessionFactory) -> None:
    gateway = make_gateway({"sandbox": {"enabled": False}})
    gateway.add_user("alice")
    session = open_session(gateway)
    run_id = refusal(session.call_tool(*RUN, token=gateway.token("alice")), -32006, "sandbox_disabled")
    assert_blocked_trail(gateway, run_id, -32006, "sandbox_disabled")
    assert not any((gateway.home / "artifacts").iterdir())


def test_unreachable_database_gives_32603_and_nothing_runs(gateway: GatewayHome, open_session: SessionFactory) -> None:
    missing = gateway.root / "no-such-dir" / "gateway.db"
    session = open_session(gateway, db_url=f"sqlite:///{missing}")
    for name, arguments in (RUN, ("list_artifacts", {})):
        response = session.call_tool(name, arguments, gateway.token("alice"))
        assert response["error"]["code"] == -32603, response
        assert response["error"]["data"]["reason"] in ("audit_unavailable", "database_unavailable")
    assert not any((gateway.home / "artifacts").iterdir())
    assert not missing.exists()
    follow_up = session.request("ping")
    assert "result" in follow_up, "the server keeps answering"
