"""`consent grant` in process: the stored decision and its `mcp.permission.decision`, field by field."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from gateway.approvals import approver_name
from gateway.audit import AuditLog
from gateway.canonical import args_hash
from gateway.cli.consent import cmd_consent_grant
from gateway.clock import SystemClock
from gateway.consent.store import ConsentStore, GrantDecision
from gateway.permission_prompt import AGENT_SERVER_ID
from tests.harness import GatewayHome


@pytest.fixture
def home(tmp_path: Path) -> GatewayHome:
    gateway = GatewayHome(tmp_path)
    gateway.add_user("alice")
    return gateway


def grant(home: GatewayHome, tool: str, **options: Any) -> None:
    values: dict[str, Any] = {"user": "alice", "tool": tool, "always": False, "deny": False, "workspace": None}
    values |= {"expires_in": None, "args": None, "agent": False, **options}
    assert cmd_consent_grant(home.settings, argparse.Namespace(**values)) == 0


def decisions(home: GatewayHome) -> list[dict[str, Any]]:
    events = AuditLog(home.engine, SystemClock()).events()
    return [e.to_json() for e in events if e.event_type == "mcp.permission.decision"]


def test_an_allow_always_is_recorded_as_made_at_the_terminal_for_no_call(home: GatewayHome) -> None:
    grant(home, "run_pytest", always=True)

    (stored,) = ConsentStore(home.engine).list_grants("alice")
    assert stored.decision is GrantDecision.ALLOW
    (event,) = decisions(home)
    assert (event["run_id"], event["user"], event["workspace"], event["tool_name"], event["args_hash"]) == (
        None, "alice", "default", "run_pytest", None,
    )  # fmt: skip
    assert event["code"] is None
    assert event["detail"] == {
        "decision": "ALLOW_ALWAYS",
        "risk_tier": "medium",
        "origin": "policy",
        "server_id": "mcp-write-gateway",
        "channel": "cli",
        "grant_id": stored.id,
        "expires_at": stored.expires_at,
        "decided_by": "cli:" + approver_name().removeprefix("approvals:"),
    }


def test_a_deny_for_arguments_names_their_hash_and_has_no_reason(home: GatewayHome) -> None:
    grant(home, "Bash", deny=True, agent=True, args='{"command": "rm -rf /"}')

    (stored,) = ConsentStore(home.engine).list_grants("alice")
    assert stored.decision is GrantDecision.DENY
    (event,) = decisions(home)
    assert (event["run_id"], event["tool_name"], event["args_hash"]) == (
        None,
        "Bash",
        args_hash({"command": "rm -rf /"}),
    )
    assert event["detail"] == {
        "decision": "DENY_ALWAYS",
        "risk_tier": "high",
        "origin": "policy",
        "server_id": AGENT_SERVER_ID,
        "channel": "cli",
        "grant_id": stored.id,
        "expires_at": None,
        "decided_by": stored.granted_by,
    }
