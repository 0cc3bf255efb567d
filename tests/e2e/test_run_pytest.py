"""A permitted run_pytest over real stdio: consent by elicitation, counts, artifacts, audit, reads."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from gateway.budget import BudgetLedger
from gateway.clock import SystemClock
from gateway.policy import BudgetPolicy
from sandbox.guarantees import Guarantee
from tests.harness import SAMPLE_PROJECT, GatewayHome, StdioSession

SessionFactory = Callable[..., StdioSession]
ELICITATION: dict[str, Any] = {"elicitation": {"form": {}}}


def answer(decision: str | None) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def respond(message: dict[str, Any]) -> dict[str, Any]:
        assert message["method"] == "elicitation/create"
        if decision is None:
            return {"action": "decline"}
        return {"action": "accept", "content": {"decision": decision}}

    return respond


def bare_pytest_counts() -> dict[str, int]:
    """The sample suite's counts from pytest run directly, for comparison."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests",
            "--junitxml=/dev/stdout",
            "-o",
            "junit_family=xunit2",
        ],
        cwd=SAMPLE_PROJECT,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    import xml.etree.ElementTree as ET

    xml = out.stdout[out.stdout.index("<?xml") : out.stdout.index("</testsuites>") + len("</testsuites>")]
    suite = ET.fromstring(xml).find("testsuite")  # noqa: S314
    assert suite is not None
    tests, failed, errors, skipped = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
    return {"passed": tests - failed - errors - skipped, "failed": failed, "errors": errors, "skipped": skipped}


def test_allowed_run_matches_bare_pytest_and_leaves_a_full_trail(
    gateway: GatewayHome, open_session: SessionFactory
) -> None:
    session = open_session(gateway, capabilities=ELICITATION)
    session.responder = answer("allow_once")
    token = gateway.token("alice")
    response = session.call_tool("run_pytest", {"test_path": "tests"}, token)
    result = response["result"]
    assert result["isError"] is False
    structured = result["structuredContent"]
    expected = bare_pytest_counts()
    assert {k: structured[k] for k in expected} == expected
    assert structured["exit_code"] == 0 and structured["duration_ms"] > 0
    run_id = structured["run_id"]
    assert result["_meta"]["mcp-write-gateway/run_id"] == run_id
    assert any(c["type"] == "resource_link" and run_id in c["uri"] for c in result["content"])
    prompt = session.unsolicited[-1]["params"]
    assert "run_pytest" in prompt["message"] and "alice" in prompt["message"]
    # No allow_always in band by default (consent.channels, decision 43).
    assert prompt["requestedSchema"]["properties"]["decision"]["enum"] == [
        "allow_once", "allow_session", "deny_once", "deny_always"
    ]  # fmt: skip

    folder = gateway.home / "artifacts" / run_id
    assert sorted(p.name for p in folder.iterdir()) == ["evidence.json", "junit.xml", "stderr.txt", "stdout.txt"]
    evidence = json.loads((folder / "evidence.json").read_text())
    assert evidence["governance"]["attempts_total"] == 1
    assert evidence["governance"]["policy_timeout_s"] == 300
    assert evidence["sandbox"]["exit_code"] == 0 and evidence["sandbox"]["killed_by"] is None

    kinds = [e["event_type"] for e in gateway.events_of(run_id)]
    assert kinds == ["MCP_TOOL_CALL", "mcp.permission.decision", "TOOL_STARTED", "SANDBOX_EXEC", "TOOL_FINISHED"]
    decision = gateway.events_of(run_id)[1]["detail"]
    assert decision == {
        "decision": "ALLOW_ONCE",
        "origin": "user_prompt",
        "risk_tier": "medium",
        "server_id": "mcp-write-gateway",
        "channel": "elicitation",
    }

    # The read tools see the run; a viewer of the same workspace too.
    viewer = gateway.token("vic")
    listed = session.call_tool("list_artifacts", {}, viewer)["result"]["structuredContent"]["runs"]
    assert [r["run_id"] for r in listed] == [run_id]
    got = session.call_tool("get_evidence", {"run_id": run_id}, viewer)["result"]["structuredContent"]
    assert got["sandbox"]["exit_code"] == 0
    content = session.call_tool("get_artifact_content", {"run_id": run_id, "name": "stdout.txt"}, viewer)["result"]
    assert "passed" in content["content"][0]["text"]


def test_deny_and_decline_refuse_with_32008_and_nothing_runs(
    gateway: GatewayHome, open_session: SessionFactory
) -> None:
    session = open_session(gateway, capabilities=ELICITATION)
    for decision, expected in (("deny_once", "DENY_ONCE"), (None, "DENY_ONCE")):
        session.responder = answer(decision)
        response = session.call_tool("run_pytest", {"test_path": "tests"}, gateway.token("alice"))
        assert response["error"]["code"] == -32008
        assert "retrying will not help" in response["error"]["message"]
        run_id = response["error"]["data"]["run_id"]
        events = gateway.events_of(run_id)
        assert [e["event_type"] for e in events] == ["MCP_TOOL_CALL", "mcp.permission.decision", "POLICY_BLOCKED"]
        assert events[1]["detail"]["decision"] == expected
    assert not any((gateway.home / "artifacts").iterdir())


def test_a_client_that_fails_to_show_the_prompt_is_denied(gateway: GatewayHome, open_session: SessionFactory) -> None:
    session = open_session(gateway, capabilities=ELICITATION)
    token = gateway.token("alice")
    session.send(
        {
            "jsonrpc": "2.0",
            "id": 600,
            "method": "tools/call",
            "params": {"name": "run_pytest", "arguments": {"test_path": "tests"}, "auth": {"token": token}},
        }
    )
    prompt = session.read_message()
    session.send({"jsonrpc": "2.0", "id": prompt["id"], "error": {"code": -32603, "message": "no UI"}})
    response = session.wait_response(600)
    assert response["error"]["code"] == -32008
    assert not any((gateway.home / "artifacts").iterdir())


def test_timeout_kills_the_run_and_answers_32007(gateway: GatewayHome, open_session: SessionFactory) -> None:
    (gateway.workspace / "tests" / "test_slow.py").write_text("import time\n\ndef test_sleeps():\n    time.sleep(30)\n")
    session = open_session(gateway, capabilities=ELICITATION)
    session.responder = answer("allow_once")
    response = session.call_tool(
        "run_pytest", {"test_path": "tests/test_slow.py", "timeout_s": 2}, gateway.token("alice")
    )
    assert response["error"]["code"] == -32007, response
    run_id = response["error"]["data"]["run_id"]
    events = gateway.events_of(run_id)
    kinds = [e["event_type"] for e in events]
    assert kinds == ["MCP_TOOL_CALL", "mcp.permission.decision", "TOOL_STARTED", "SANDBOX_EXEC", "TOOL_FINISHED"]
    assert events[3]["detail"]["killed_by"] == "timeout"
    assert events[4]["code"] == -32007
    assert 2000 <= events[3]["detail"]["duration_ms"] < 10000


@pytest.fixture
def two_tenants(make_gateway: Callable[..., GatewayHome], tmp_path: Path) -> GatewayHome:
    """alice works in `default`, bob in `other`; root is an ADMIN."""
    other_root = tmp_path / "other-ws"
    other_root.mkdir()
    gateway = make_gateway({"workspaces": {"other": str(other_root)}})
    gateway.add_user("alice", "USER", ("default",))
    gateway.add_user("bob", "USER", ("other",))
    gateway.add_user("root", "ADMIN", ("other",))
    return gateway


def test_another_tenants_run_is_not_found(two_tenants: GatewayHome, open_session: SessionFactory) -> None:
    gateway = two_tenants
    session = open_session(gateway, capabilities=ELICITATION)
    session.responder = answer("allow_once")
    run_id = session.call_tool("run_pytest", {"test_path": "tests"}, gateway.token("alice"))["result"][
        "structuredContent"
    ]["run_id"]
    bob = gateway.token("bob")
    for name, arguments in (
        ("get_evidence", {"run_id": run_id}),
        ("get_artifact_content", {"run_id": run_id, "name": "stdout.txt"}),
    ):
        foreign = session.call_tool(name, arguments, bob)
        missing = session.call_tool(name, {**arguments, "run_id": "0" * 32}, bob)
        assert foreign["error"]["code"] == missing["error"]["code"] == -32602
        assert foreign["error"]["data"]["reason"] == missing["error"]["data"]["reason"] == "run_not_found"
    assert session.call_tool("list_artifacts", {}, bob)["result"]["structuredContent"]["runs"] == []
    admin_view = session.call_tool("get_evidence", {"run_id": run_id}, gateway.token("root"))
    assert "result" in admin_view, "ADMIN reads every workspace"


def test_artifact_names_cannot_escape_the_run_folder(gateway: GatewayHome, open_session: SessionFactory) -> None:
    session = open_session(gateway, capabilities=ELICITATION)
    session.responder = answer("allow_once")
    token = gateway.token("alice")
    run_id = session.call_tool("run_pytest", {"test_path": "tests"}, token)["result"]["structuredContent"]["run_id"]
    for name in ("../../signing.key", "..", ".hidden", "/etc/passwd", "stdout.txt/../../gateway.db"):
        response = session.call_tool("get_artifact_content", {"run_id": run_id, "name": name}, token)
        assert response["error"]["code"] == -32602, (name, response)


def test_listing_spans_the_callers_workspaces(
    make_gateway: Callable[..., GatewayHome], open_session: SessionFactory, tmp_path: Any
) -> None:
    other_root = tmp_path / "second"
    other_root.mkdir()
    gateway = make_gateway({"workspaces": {"second": str(other_root)}})
    gateway.add_user("alice", "USER", ("default", "second"))
    gateway.add_user("carol", "USER", ("second",))
    gateway.add_user("root", "ADMIN", ())
    session = open_session(gateway, capabilities=ELICITATION)
    session.responder = answer("allow_once")
    run_id = session.call_tool("run_pytest", {"test_path": "tests"}, gateway.token("alice"))["result"][
        "structuredContent"
    ]["run_id"]

    def listed(token: str, **arguments: Any) -> list[str]:
        return [
            r["run_id"]
            for r in session.call_tool("list_artifacts", arguments, token)["result"]["structuredContent"]["runs"]
        ]

    assert listed(gateway.token("alice")) == [run_id]
    assert listed(gateway.token("alice"), workspace="second") == []
    assert listed(gateway.token("carol")) == []
    assert listed(gateway.token("root")) == [run_id], "ADMIN reads every workspace"
    assert listed(gateway.token("alice", workspace="second")) == [], "a token limited to one workspace sees only it"


def _slow_suite(gateway: GatewayHome) -> str:
    """A suite that sleeps; the sandbox lets it write nowhere we can see, so it is found by its argv."""
    (gateway.workspace / "tests" / "test_slow.py").write_text("import time\n\ndef test_sleeps():\n    time.sleep(60)\n")
    (gateway.workspace / "tests" / "test_slow.py").chmod(0o644)
    return str(gateway.workspace)


def _wait_for(workspace: str, timeout: float = 20) -> int:
    """The pid of the pytest this test's gateway started in `workspace` (matched by its argv)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for process in psutil.process_iter(["cmdline"]):
            cmdline = process.info["cmdline"] or []
            if f"--rootdir={workspace}" in cmdline and "./tests/test_slow.py" in cmdline:  # the path follows ./
                time.sleep(0.3)  # let the session reach the sleeping test
                return int(process.pid)
        time.sleep(0.05)
    raise AssertionError("the suite never started")


def _gone(pid: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def _start_slow_call(gateway: GatewayHome, open_session: SessionFactory) -> tuple[StdioSession, int]:
    marker = _slow_suite(gateway)
    session = open_session(gateway, capabilities=ELICITATION)
    session.send(
        {
            "jsonrpc": "2.0",
            "id": 500,
            "method": "tools/call",
            "params": {
                "name": "run_pytest",
                "arguments": {"test_path": "tests/test_slow.py"},
                "auth": {"token": gateway.token("alice")},
            },
        }
    )
    prompt = session.read_message()
    assert prompt["method"] == "elicitation/create"
    session.send(
        {"jsonrpc": "2.0", "id": prompt["id"], "result": {"action": "accept", "content": {"decision": "allow_once"}}}
    )
    return session, _wait_for(marker)


def test_client_going_away_kills_the_run(gateway: GatewayHome, open_session: SessionFactory) -> None:
    session, pid = _start_slow_call(gateway, open_session)
    time.sleep(0.5)
    assert session.close() == 0
    assert _gone(pid), "the test process outlived its client"
    events = gateway.audit_events()
    assert events[-1]["event_type"] == "TOOL_FINISHED"
    assert events[-1]["detail"] == {"status": "cancelled"}
    usage = BudgetLedger(gateway.engine, SystemClock()).usage("alice", BudgetPolicy())
    assert usage.attempts == 1
    assert usage.elapsed_ms >= 500, "a cancelled run is still charged the time it took"


def test_cancellation_kills_the_run(gateway: GatewayHome, open_session: SessionFactory) -> None:
    session, pid = _start_slow_call(gateway, open_session)
    session.send(
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 500, "reason": "user"}}
    )
    assert _gone(pid), "the test process outlived the cancellation"
    assert "result" in session.call_tool("list_artifacts", {}, gateway.token("alice")), "the server goes on"


def test_resource_links_read_back_through_the_same_checks(
    two_tenants: GatewayHome, open_session: SessionFactory
) -> None:
    gateway = two_tenants
    session = open_session(gateway, capabilities=ELICITATION)
    session.responder = answer("allow_once")
    result = session.call_tool("run_pytest", {"test_path": "tests"}, gateway.token("alice"))["result"]
    links = {c["name"]: c["uri"] for c in result["content"] if c["type"] == "resource_link"}
    assert set(links) == {"evidence.json", "junit.xml", "stdout.txt", "stderr.txt"}
    read = session.request("resources/read", {"uri": links["evidence.json"], "auth": {"token": gateway.token("alice")}})
    contents = read["result"]["contents"][0]
    assert contents["mimeType"] == "application/json"
    assert json.loads(contents["text"])["sandbox"]["exit_code"] == 0
    foreign = session.request("resources/read", {"uri": links["stdout.txt"], "auth": {"token": gateway.token("bob")}})
    assert foreign["error"]["code"] == -32602 and foreign["error"]["data"]["reason"] == "run_not_found"
    anonymous = session.request("resources/read", {"uri": links["stdout.txt"]})
    assert anonymous["error"]["code"] == -32001
    escape = session.request(
        "resources/read",
        {"uri": links["stdout.txt"] + "/../../../signing.key", "auth": {"token": gateway.token("alice")}},
    )
    assert escape["error"]["code"] == -32602
    assert session.request("resources/read", {"uri": "file:///etc/passwd"})["error"]["code"] == -32602


PLUGIN_PROBE = """
def test_the_timeout_plugin_is_loaded(request):
    assert request.config.pluginmanager.has_plugin("timeout")
"""


@pytest.mark.parametrize(("plugins", "passed"), [([], 0), (["timeout"], 1)], ids=["none-listed", "timeout-listed"])
def test_only_the_plugins_the_policy_lists_are_loaded(
    make_gateway: Callable[..., GatewayHome], open_session: SessionFactory, plugins: list[str], passed: int
) -> None:
    # pytest-timeout is installed in the gateway's venv (a test extra): autoloading would load it.
    gateway = make_gateway({"sandbox": {"pytest_plugins": plugins}})
    gateway.add_user("alice", "USER")
    (gateway.workspace / "tests" / "test_plugin_probe.py").write_text(PLUGIN_PROBE)
    session = open_session(gateway, capabilities=ELICITATION)
    session.responder = answer("allow_once")
    response = session.call_tool("run_pytest", {"test_path": "tests/test_plugin_probe.py"}, gateway.token("alice"))
    structured = response["result"]["structuredContent"]
    assert (structured["passed"], structured["failed"]) == (passed, 1 - passed), response


APPLIED = {
    "native": [
        "cgroup", "network_namespace", "ipc_namespace", "scratch_tmpfs", "rlimits", "uid_drop", "landlock",
        "pid_namespace", "seccomp",
    ],
    "bubblewrap": [
        "cgroup", "network_namespace", "ipc_namespace", "scratch_tmpfs", "rlimits", "uid_drop", "mount_tree",
        "pid_namespace", "seccomp",
    ],
}  # fmt: skip


@pytest.mark.parametrize("backend", ["native", "bubblewrap"])
def test_each_backend_gives_bare_pytests_counts_and_names_its_layers(
    make_gateway: Callable[..., GatewayHome], open_session: SessionFactory, backend: str
) -> None:
    gateway = make_gateway({"sandbox": {"backend": backend, "require": [g.value for g in Guarantee]}})
    gateway.add_user("alice", "USER")
    session = open_session(gateway, capabilities=ELICITATION)
    session.responder = answer("allow_once")
    response = session.call_tool("run_pytest", {"test_path": "tests"}, gateway.token("alice"))
    structured = response["result"]["structuredContent"]
    expected = bare_pytest_counts()
    assert {k: structured[k] for k in expected} == expected
    run_id = structured["run_id"]
    evidence = json.loads((gateway.home / "artifacts" / run_id / "evidence.json").read_text())
    sandbox = evidence["sandbox"]
    assert sandbox["layers"] == APPLIED[backend]
    assert sandbox["confinement"]["backend"] == backend
    # every guarantee listed; the proxy's is required of a proxied run only (decision 89), and this one is offline
    assert sandbox["confinement"]["required"] == sorted(g.value for g in Guarantee if g != "network_through_proxy")
    assert sandbox["confinement"]["rootless"] is False
    kept = sandbox["confinement"]["guarantees"]
    assert set(kept) == {g.value for g in Guarantee}  # as root on this host: every guarantee, each by its layers
    assert kept["own_identity"] == ["uid_drop"] and kept["memory_total"] == ["cgroup"]
    assert kept["file_grants"] == ["landlock" if backend == "native" else "mount_tree"]
    assert sandbox["limits"]["scratch_bytes"] == 256 * 1024 * 1024
    assert 0 < sandbox["peak_memory_kb"] <= 1024 * 1024
    assert sandbox["oom_kills"] == 0 and sandbox["survivors_killed"] == 0
    exec_event = next(e for e in gateway.events_of(run_id) if e["event_type"] == "SANDBOX_EXEC")
    assert exec_event["detail"]["layers"] == sandbox["layers"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=["TERM", "HUP", "INT"])
def test_a_signalled_gateway_kills_its_runs_before_it_exits(
    gateway: GatewayHome, open_session: SessionFactory, signum: int
) -> None:
    # MCP clients often stop their servers with a signal, not by closing stdin: the run must not outlive it.
    session, pid = _start_slow_call(gateway, open_session)
    session.process.send_signal(signum)
    assert session.process.wait(timeout=20) == 0
    assert _gone(pid), "the test process outlived its gateway"
    events = gateway.audit_events()
    assert events[-1]["event_type"] == "TOOL_FINISHED"
    assert events[-1]["detail"] == {"status": "cancelled"}
    assert "stopping" in session.stderr_text()
