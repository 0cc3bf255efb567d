"""Every refusal path through the MCP server in process, with its exact code and the audit trail it leaves.

Each test serves `build_server` to the SDK's own client over memory streams
(tests/memory_session.py) and reads the audit log back: exactly one MCP_TOOL_CALL and one
terminal POLICY_BLOCKED carrying the same code. Every test runs on SQLite and on PostgreSQL
(`db_url`, tests/pg_cluster.py). The same refusals over real stdio, one per code, are
tests/e2e/test_refusals.py.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization

from gateway.auth import load_keyring
from tests.harness import GatewayHome
from tests.memory_session import MemorySession
from tests.pg_cluster import on_both_engines
from tests.refusals import RUN, assert_blocked_trail, b64, bad_tokens, claims, refusal

pytestmark = on_both_engines
SessionFactory = Callable[..., MemorySession]


# --- -32001 -------------------------------------------------------------------------------------


def test_every_bad_token_is_refused_with_32001(gateway: GatewayHome, open_memory: SessionFactory) -> None:
    session = open_memory(gateway)
    for label, (token, reason) in bad_tokens(gateway).items():
        run_id = refusal(session.call_tool(*RUN, token=token), -32001, reason)
        assert_blocked_trail(gateway, run_id, -32001, reason, label)
    assert not any((gateway.home / "artifacts").iterdir()), "nothing may run"


def test_revoked_token_is_refused_at_once(gateway: GatewayHome, open_memory: SessionFactory) -> None:
    session = open_memory(gateway)
    token = gateway.token("alice")
    assert "result" in session.call_tool("list_artifacts", {}, token)
    revoked = gateway.cli("token", "revoke", token)
    assert revoked.returncode == 0, revoked.stderr
    assert token not in revoked.stdout + revoked.stderr
    run_id = refusal(session.call_tool("list_artifacts", {}, token), -32001, "token_revoked")
    assert_blocked_trail(gateway, run_id, -32001, "token_revoked")


def test_disabled_user_is_refused_at_once(gateway: GatewayHome, open_memory: SessionFactory) -> None:
    session = open_memory(gateway)
    token = gateway.token("alice")
    assert "result" in session.call_tool("list_artifacts", {}, token)
    assert gateway.cli("user", "disable", "alice").returncode == 0
    run_id = refusal(session.call_tool("list_artifacts", {}, token), -32001, "user_disabled")
    assert_blocked_trail(gateway, run_id, -32001, "user_disabled")


def test_hs_rs_confusion_is_refused(make_gateway: Callable[..., GatewayHome], open_memory: SessionFactory) -> None:
    gateway = make_gateway({"auth": {"algorithms": ["RS256"]}})
    gateway.add_user("alice")
    session = open_memory(gateway)
    assert "result" in session.call_tool("list_artifacts", {}, gateway.token("alice")), "a real RS256 token works"
    public_pem = (
        load_keyring(gateway.home)
        .verification_key("RS256")
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    header = b64({"alg": "HS256", "typ": "JWT"})
    body = b64(claims())
    signature = hmac.new(public_pem, f"{header}.{body}".encode(), hashlib.sha256).digest()
    forged = f"{header}.{body}.{base64.urlsafe_b64encode(signature).rstrip(b'=').decode()}"
    run_id = refusal(session.call_tool("list_artifacts", {}, forged), -32001, "alg_not_allowed")
    assert_blocked_trail(gateway, run_id, -32001)


# --- -32003, -32004, -32602 ----------------------------------------------------------------------


def test_viewer_calling_run_pytest_gets_32003(gateway: GatewayHome, open_memory: SessionFactory) -> None:
    session = open_memory(gateway)
    run_id = refusal(session.call_tool(*RUN, token=gateway.token("vic")), -32003, "missing_permission")
    assert_blocked_trail(gateway, run_id, -32003, "missing_permission")


def test_demoted_user_loses_the_permission_at_once(gateway: GatewayHome, open_memory: SessionFactory) -> None:
    session = open_memory(gateway)
    token = gateway.token("alice")
    assert gateway.cli("user", "set-role", "alice", "VIEWER").returncode == 0
    refusal(session.call_tool(*RUN, token=token), -32003, "missing_permission")


@pytest.mark.parametrize(
    ("allowlist", "reason"),
    [(["list_artifacts", "get_evidence"], "tool_not_allowlisted"), ([], "allowlist_empty")],
)
def test_allowlist_blocks_with_32004(
    make_gateway: Callable[..., GatewayHome], open_memory: SessionFactory, allowlist: list[str], reason: str
) -> None:
    gateway = make_gateway({"tools": {"allowlist": allowlist}})
    gateway.add_user("alice")
    session = open_memory(gateway)
    run_id = refusal(session.call_tool(*RUN, token=gateway.token("alice")), -32004, reason)
    assert_blocked_trail(gateway, run_id, -32004, reason)


def test_paths_escaping_the_workspace_get_32004(
    gateway: GatewayHome, open_memory: SessionFactory, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "test_evil.py").write_text("def test_x():\n    pass\n")
    os.symlink(outside, gateway.workspace / "escape")
    session = open_memory(gateway)
    token = gateway.token("alice")
    cases = {
        "../": ("../outside", "path_outside_workspace"),
        "deep ../": ("tests/../../..", "path_outside_workspace"),
        "absolute": (str(outside), "path_outside_workspace"),
        "symlink": ("escape/test_evil.py", "path_outside_workspace"),
        "option": ("-p evil", "path_looks_like_option"),
    }
    for label, (path, reason) in cases.items():
        run_id = refusal(session.call_tool("run_pytest", {"test_path": path}, token), -32004, reason)
        assert_blocked_trail(gateway, run_id, -32004, reason, label)
    assert not any((gateway.home / "artifacts").iterdir()), "nothing may run"


def test_timeout_over_policy_and_foreign_workspace_get_32004(gateway: GatewayHome, open_memory: SessionFactory) -> None:
    session = open_memory(gateway)
    token = gateway.token("alice")
    refusal(
        session.call_tool("run_pytest", {"test_path": "tests", "timeout_s": 301}, token), -32004, "timeout_over_policy"
    )
    refusal(
        session.call_tool("run_pytest", {"test_path": "tests", "workspace": "other"}, token),
        -32004,
        "workspace_not_allowed",
    )


@pytest.mark.parametrize(
    ("name", "arguments", "reason"),
    [
        ("run_pytest", {}, "invalid_arguments"),
        ("run_pytest", {"test_path": 7}, "invalid_arguments"),
        ("run_pytest", {"test_path": "tests", "args": "--pdb"}, "invalid_arguments"),
        ("run_pytest", {"test_path": "tests", "max_failures": "1"}, "invalid_arguments"),
        ("run_pytest", {"test_path": "tests", "keyword": "-p evil"}, "invalid_arguments"),
        ("get_evidence", {"run_id": "../../signing.key"}, "invalid_arguments"),
        ("run_shell", {"cmd": "id"}, "unknown_tool"),
    ],
)
def test_bad_arguments_and_unknown_tools_get_32602(
    gateway: GatewayHome, open_memory: SessionFactory, name: str, arguments: dict[str, Any], reason: str
) -> None:
    session = open_memory(gateway)
    run_id = refusal(session.call_tool(name, arguments, gateway.token("alice")), -32602, reason)
    assert_blocked_trail(gateway, run_id, -32602, reason)


# --- -32005, -32006, -32008, -32603 ------------------------------------------------------------------


def test_budget_spent_gives_32005_with_retry_after(
    make_gateway: Callable[..., GatewayHome], open_memory: SessionFactory
) -> None:
    gateway = make_gateway({"budget": {"attempts_total": 2, "window_s": 600}, "consent": {"mode": "deny"}})
    gateway.add_user("alice")
    session = open_memory(gateway)
    token = gateway.token("alice")
    for _ in range(2):  # the policy allows no prompt: each attempt is denied, and counted
        refusal(session.call_tool(*RUN, token=token), -32008, "consent_mode_deny")
    response = session.call_tool(*RUN, token=token)
    run_id = refusal(response, -32005, "attempts_exhausted")
    assert 1 <= response["error"]["data"]["retry_after_s"] <= 600
    assert_blocked_trail(gateway, run_id, -32005, "attempts_exhausted")


def test_sandbox_disabled_gives_32006(make_gateway: Callable[..., GatewayHome], open_memory: SessionFactory) -> None:
    gateway = make_gateway({"sandbox": {"enabled": False}})
    gateway.add_user("alice")
    session = open_memory(gateway)
    run_id = refusal(session.call_tool(*RUN, token=gateway.token("alice")), -32006, "sandbox_disabled")
    assert_blocked_trail(gateway, run_id, -32006, "sandbox_disabled")
    assert not any((gateway.home / "artifacts").iterdir())


def test_client_without_elicitation_waits_for_an_approver_and_is_denied_at_the_timeout(
    make_gateway: Callable[..., GatewayHome], open_memory: SessionFactory
) -> None:
    gateway = make_gateway({"consent": {"timeout_s": 1}})
    gateway.add_user("alice")
    session = open_memory(gateway)
    started = time.monotonic()
    response = session.call_tool(*RUN, token=gateway.token("alice"))
    run_id = refusal(response, -32008, "consent_timeout")
    assert 1 <= time.monotonic() - started < 10
    events = gateway.events_of(run_id)
    assert [e["event_type"] for e in events] == ["MCP_TOOL_CALL", "mcp.permission.decision", "POLICY_BLOCKED"]
    assert events[1]["detail"]["origin"] == "timeout" and events[1]["detail"]["channel"] == "approver"
    assert "no person answered" in response["error"]["message"]


def test_unreachable_database_gives_32603_and_nothing_runs(gateway: GatewayHome, open_memory: SessionFactory) -> None:
    missing = gateway.root / "no-such-dir" / "gateway.db"
    session = open_memory(gateway, db_url=f"sqlite:///{missing}")
    for name, arguments in (RUN, ("list_artifacts", {})):
        response = session.call_tool(name, arguments, gateway.token("alice"))
        assert response["error"]["code"] == -32603, response
        assert response["error"]["data"]["reason"] in ("audit_unavailable", "database_unavailable")
    assert not any((gateway.home / "artifacts").iterdir())
    assert not missing.exists()
    follow_up = session.request("ping")
    assert "result" in follow_up, "the server keeps answering"
