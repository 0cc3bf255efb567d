"""Preflight over real stdio (decision 54): a path the run's uid cannot reach is refused before the
budget and consent, named with its fix; a sandbox that cannot start says which step and what to do."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import GatewayHome, StdioSession, reachable_by_everyone, venv_beside

SessionFactory = Callable[..., StdioSession]
ELICITATION: dict[str, Any] = {"elicitation": {"form": {}}}

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the run's own uid exists only when the gateway is root")


@pytest.fixture
def locked() -> Iterator[Path]:
    """A 0700 folder owned by root (like /root), outside pytest's temp folder."""
    folder = Path(tempfile.mkdtemp(prefix="mcp-gw-locked-"))
    folder.chmod(0o700)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def no_consent_asked(asked: list[dict[str, Any]]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def respond(message: dict[str, Any]) -> dict[str, Any]:
        asked.append(message)
        return {"action": "accept", "content": {"decision": "allow_once"}}

    return respond


def charges(gateway: GatewayHome) -> int:
    with sqlite3.connect(gateway.home / "gateway.db") as db:
        count: int = db.execute("select count(*) from budget_charges").fetchone()[0]
    return count


def refused_before_the_budget(
    gateway: GatewayHome, open_session: SessionFactory, named: str
) -> tuple[dict[str, Any], StdioSession]:
    session = open_session(gateway, capabilities=ELICITATION)
    asked: list[dict[str, Any]] = []
    session.responder = no_consent_asked(asked)
    response = session.call_tool("run_pytest", {"test_path": "tests"}, gateway.token("alice"))
    error = response["error"]
    assert error["code"] == -32006 and error["data"]["reason"] == "run_path_unreachable", error
    assert named in error["message"] and "fix: chmod o+x" in error["message"], error["message"]
    run_id = error["data"]["run_id"]
    assert asked == []  # no person was asked
    assert charges(gateway) == 0  # no budget attempt taken
    assert not (gateway.home / "artifacts" / run_id).exists()  # no run folder
    kinds = [e["event_type"] for e in gateway.events_of(run_id)]
    assert kinds == ["MCP_TOOL_CALL", "POLICY_BLOCKED"]
    assert gateway.events_of(run_id)[-1]["detail"] == {"blocked_reason": "run_path_unreachable"}
    return error, session


def test_a_workspace_under_a_0700_folder_is_refused_before_consent_and_the_budget(
    make_gateway: Callable[..., GatewayHome], open_session: SessionFactory, locked: Path
) -> None:
    gateway = make_gateway()
    gateway.add_user("alice")
    workspace = locked / "workspace"
    shutil.copytree(gateway.workspace, workspace)
    reachable_by_everyone(workspace)  # stops at the temp dir: `locked` itself stays 0700
    locked.chmod(0o700)
    gateway.write_policy({"workspaces": {"default": str(workspace)}})

    error, session = refused_before_the_budget(gateway, open_session, str(workspace))
    assert f"{locked} is 0700, owned by root: the run's uid 61000 cannot search it" in error["message"]
    warnings = [line for line in session.stderr_text().splitlines() if "cannot reach workspace" in line]
    assert len(warnings) == 1 and str(locked) in warnings[0], session.stderr_text()

    explained = gateway.cli(
        "policy", "explain", "--user", "alice", "--tool", "run_pytest", "--args", json.dumps({"test_path": "tests"})
    )
    lines = explained.stdout.splitlines()
    assert any(line.startswith("preflight") and "-32006 run_path_unreachable" in line for line in lines), lines
    assert not any(line.startswith(("budget", "consent")) for line in lines)
    assert lines[-1] == "result: refused with -32006"

    checked = gateway.cli("policy", "check")
    assert checked.returncode == 0, checked.stderr
    assert f"cannot reach workspace 'default' {workspace}" in checked.stderr and str(locked) in checked.stderr


def test_an_allowed_path_the_run_cannot_reach_is_refused_before_consent_and_the_budget(
    make_gateway: Callable[..., GatewayHome], open_session: SessionFactory, locked: Path
) -> None:
    data = locked / "data"
    data.mkdir(mode=0o755)
    gateway = make_gateway({"sandbox": {"allowed_paths": [str(data)]}})
    gateway.add_user("alice")
    error, session = refused_before_the_budget(gateway, open_session, str(data))
    assert "sandbox.allowed_paths entry" in error["message"]
    assert any("cannot reach sandbox.allowed_paths entry" in line for line in session.stderr_text().splitlines())


def test_a_sandbox_that_cannot_start_names_the_step_and_the_fix(
    gateway: GatewayHome, open_session: SessionFactory
) -> None:
    """The interpreter's folder turns 0700 after `serve` started (its preflight passed): the run's exec fails."""
    folder = Path(tempfile.mkdtemp(prefix="mcp-gw-venv-"))
    try:
        folder.chmod(0o755)
        python = venv_beside(folder)
        session = open_session(gateway, capabilities=ELICITATION, python=str(python))
        assert "cannot reach the interpreter" not in session.stderr_text()
        session.responder = lambda _message: {"action": "accept", "content": {"decision": "allow_once"}}
        folder.chmod(0o700)
        response = session.call_tool("run_pytest", {"test_path": "tests"}, gateway.token("alice"))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    error = response["error"]
    assert error["code"] == -32006 and error["data"]["reason"] == "sandbox_start_failed", error
    assert error["data"]["step"] == "spawn_failed"
    assert "the interpreter could not be started as the run's uid" in error["message"]
    assert "fix: run `mcp-gateway policy check`" in error["message"]
    run_id = error["data"]["run_id"]
    logged = [line for line in session.stderr_text().splitlines() if "could not start" in line]
    assert len(logged) == 1 and run_id in logged[0] and "spawn_failed" in logged[0], session.stderr_text()
    finished = gateway.events_of(run_id)[-1]
    assert finished["detail"] == {"status": "error", "reason": "sandbox_start_failed"}
