"""mcp-server-git (PyPI, installed by the test extra) behind the gateway, on a real repository (docs/upstreams.md).

A server no one here wrote: `git__git_commit` asks a person; after Deny nothing is sent to it; after Allow it
commits in its copy of the workspace, the call is audited with the result's hash, and the commit lands in the
workspace's own `.git`: git's data (objects, refs, logs, index) and nothing else of it (sandbox/git_data.py,
decision 83), so the developer's own git finds the commit and `fsck --strict` passes.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.harness import FORM_ELICITATION, GatewayHome, StdioSession

SessionFactory = Callable[..., StdioSession]
GatewayFactory = Callable[..., GatewayHome]

SERVER = Path(sys.executable).parent / "mcp-server-git"
IDENTITY = {
    "GIT_AUTHOR_NAME": "agent",
    "GIT_AUTHOR_EMAIL": "agent@example.invalid",
    "GIT_COMMITTER_NAME": "agent",
    "GIT_COMMITTER_EMAIL": "agent@example.invalid",
    # The server's uid (a pool uid, or a user namespace's) does not own the repository: git's
    # ownership check would refuse it. The confinement, not git, keeps the server in the workspace.
    "GIT_CONFIG_COUNT": "1",
    "GIT_CONFIG_KEY_0": "safe.directory",
    "GIT_CONFIG_VALUE_0": "*",
    "GIT_CONFIG_NOSYSTEM": "1",  # /etc is not readable by the server: git would fail on /etc/gitconfig
}

pytestmark = pytest.mark.skipif(
    not SERVER.exists() or shutil.which("git") is None, reason="mcp-server-git (the test extra) and git are needed"
)


def git(workspace: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(workspace), *args],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(workspace.parent), **IDENTITY},
    )
    return done.stdout


@pytest.fixture
def repository(make_gateway: GatewayFactory) -> GatewayHome:
    gw = make_gateway()
    workspace = gw.workspace
    git(workspace, "init", "-q", "-b", "main")
    git(workspace, "add", "-A")
    git(workspace, "commit", "-q", "-m", "the sample project")
    (workspace / "NOTES.md").write_text("staged by the test\n")
    git(workspace, "add", "NOTES.md")
    gw.write_policy(
        {
            "tools": {"allowlist": ["run_pytest", "git__git_status", "git__git_commit"]},
            # git takes a temporary file's name from /dev/urandom, which a run may not read by default.
            "sandbox": {"allowed_paths": ["/dev/urandom"]},
            "upstreams": {
                "git": {
                    "command": [str(SERVER), "--repository", "{workspace}"],
                    "workspace": "write",
                    "tools": ["git_status", "git_commit"],
                    "env": IDENTITY,
                    "timeout_s": 60,
                }
            },
        }
    )
    gw.add_user("alice", "USER")
    return gw


def answer(decision: str, asked: list[str]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def respond(message: dict[str, Any]) -> dict[str, Any]:
        asked.append(message["params"]["message"])
        return {"action": "accept", "content": {"decision": decision}}

    return respond


def test_git_commit_asks_commits_after_allow_and_nothing_after_deny(
    repository: GatewayHome, open_session: SessionFactory
) -> None:
    workspace = repository.workspace
    session = open_session(repository, capabilities=FORM_ELICITATION)
    token = repository.token("alice")
    listed = {
        t["name"] for t in session.request("tools/list", {"auth": {"token": token}}, timeout=120)["result"]["tools"]
    }
    assert {"git__git_status", "git__git_commit"} <= listed
    before = git(workspace, "rev-parse", "HEAD")

    asked: list[str] = []
    session.responder = answer("deny_once", asked)
    denied = session.call_tool(
        "git__git_commit", {"repo_path": str(workspace), "message": "denied"}, token, timeout=120
    )
    assert denied["error"]["code"] == -32008
    assert len(asked) == 1
    assert git(workspace, "rev-parse", "HEAD") == before

    session.responder = answer("allow_once", asked)
    committed = session.call_tool(
        "git__git_commit", {"repo_path": str(workspace), "message": "from the agent"}, token, timeout=120
    )
    assert "result" in committed, committed
    assert committed["result"]["isError"] is False, (committed["result"], session.stderr_text()[-3000:])
    assert len(asked) == 2
    run_id = committed["result"]["_meta"]["mcp-write-gateway/run_id"]
    events = repository.events_of(run_id)
    assert [e["event_type"] for e in events][-2:] == ["UPSTREAM_CALL", "TOOL_FINISHED"]
    called = events[-2]["detail"]
    assert (called["upstream"], called["tool"], called["is_error"]) == ("git", "git_commit", False)
    assert len(called["result_sha256"]) == 64
    # The server committed in its copy; its sync brought git's data into the workspace's own `.git`.
    assert called["changes"]["refused"] == [], called["changes"]
    assert git(workspace, "rev-parse", "HEAD^") == before
    assert git(workspace, "log", "-1", "--format=%s%n%an").splitlines() == ["from the agent", "agent"]
    assert "NOTES.md" in git(workspace, "show", "--name-only", "--format=", "HEAD")
    git(workspace, "fsck", "--strict")
    assert git(workspace, "status", "--porcelain") == ""
