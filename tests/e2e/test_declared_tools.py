"""Declared tools over real stdio (docs/declared-tools.md): `node --test` read-only, a Python program, every refusal, the trail."""

from __future__ import annotations

import json
import os
import shutil
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.audit import AuditLog
from gateway.clock import SystemClock
from tests.deadlines import scaled
from tests.harness import FORM_ELICITATION, GatewayHome, StdioSession, reachable_by_everyone

SessionFactory = Callable[..., StdioSession]
GatewayFactory = Callable[..., GatewayHome]

PROGRAM = f"""\
#!{sys.executable}
import json, os, sys, time
args = sys.argv[1:]
if "--sleep" in args:
    time.sleep(int(args[args.index("--sleep") + 1]))
if "--flood" in args:  # until the sandbox stops it, at most 64 MiB
    for _ in range(1024):
        sys.stdout.write("x" * 65536)
        sys.stdout.flush()
        time.sleep(0.01)
written = []
if "--touch" in args:  # the workspace and the program's own folder: neither may be written
    for target in ("written.txt", os.path.join(os.path.dirname(sys.argv[0]), "written.txt")):
        try:
            open(target, "w").close()
            written.append(target)
        except OSError:
            pass
print(json.dumps({{"argv": args, "cwd": os.getcwd(), "written": written}}))
print("to stderr", file=sys.stderr)
sys.exit(int(args[args.index("--code") + 1]) if "--code" in args else 0)
"""
NODE_TEST = """\
const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
test('adds', () => { assert.strictEqual(1 + 1, 2); });
test('cannot write the workspace', () => {
  assert.throws(() => fs.writeFileSync('written-by-node.txt', 'x'));
});
"""


HOG = f"""\
#!{sys.executable}
import os, time
for _ in range(4):  # 4 x 60 MiB, each under the per-process limit, together over the tool's 128 MiB
    if os.fork() == 0:
        block = b"x" * (60 << 20)
        time.sleep(5)
        os._exit(0)
time.sleep(6)
"""


def answer(decision: str, asked: list[str] | None = None) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def respond(message: dict[str, Any]) -> dict[str, Any]:
        assert message["method"] == "elicitation/create"
        if asked is not None:
            asked.append(message["params"]["message"])
        return {"action": "accept", "content": {"decision": decision}}

    return respond


def program_folder(gateway: GatewayHome) -> Path:
    """A folder beside the policy (outside the workspace) holding the Python program, readable by the run."""
    folder = gateway.policy_path.parent / "bin"
    folder.mkdir(exist_ok=True)
    for name in ("pytool", "other"):
        script = folder / name
        script.write_text(PROGRAM)
        script.chmod(0o755)
    reachable_by_everyone(folder)
    return folder


def pytool(command: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "description": "Run the test program",
        "command": command or ["bin/pytool", "--", "{path}"],
        "arguments": {
            "path": {"type": "path", "default": "."},
            "code": {"type": "integer", "min": 0, "max": 9, "flag": "--code"},
            "sleep": {"type": "integer", "min": 0, "max": 60, "flag": "--sleep"},
            "flood": {"type": "boolean", "flag": "--flood"},
            "touch": {"type": "boolean", "flag": "--touch"},
            "word": {"type": "string", "pattern": ".+", "max_length": 40, "flag": "--word"},
        },
        "annotations": {"destructiveHint": False, "idempotentHint": True, "openWorldHint": False},
        **extra,
    }


def declared_policy(tools: dict[str, Any], **sandbox: Any) -> dict[str, Any]:
    return {
        "tools": {"allowlist": ["run_pytest", *tools], "declared": tools},
        "sandbox": {"allowed_paths": ["bin"], "max_output_bytes": 200_000, **sandbox},
    }


@pytest.fixture
def declared(make_gateway: GatewayFactory) -> GatewayHome:
    gw = make_gateway()
    program_folder(gw)
    gw.write_policy(declared_policy({"pytool": pytool(), "other": pytool(["bin/other", "{path}"])}))
    gw.add_user("alice", "USER")
    return gw


def kinds(gateway: GatewayHome, run_id: str) -> list[str]:
    return [e["event_type"] for e in gateway.events_of(run_id)]


def test_a_python_program_runs_confined_with_its_arguments_whole(
    declared: GatewayHome, open_session: SessionFactory
) -> None:
    session = open_session(declared, capabilities=FORM_ELICITATION)
    asked: list[str] = []
    session.responder = answer("allow_once", asked)
    listed = {
        t["name"]: t
        for t in session.request("tools/list", {"auth": {"token": declared.token("alice")}})["result"]["tools"]
    }
    assert listed["pytool"]["inputSchema"]["properties"]["code"] == {
        "type": "integer", "minimum": 0, "maximum": 9,
    }  # fmt: skip
    assert listed["pytool"]["annotations"]["title"] == "Run the test program"
    assert "mcp-write-gateway/declaration" in listed["pytool"]["_meta"]

    response = session.call_tool("pytool", {"path": "tests", "word": "ünï code=x", "code": 3}, declared.token("alice"))

    result = response["result"]
    assert result["isError"] is True  # exit code 3
    structured = result["structuredContent"]
    assert structured["exit_code"] == 3
    assert structured["duration_ms"] > 0
    printed = json.loads(result["content"][0]["text"].splitlines()[0])
    assert printed["argv"] == ["--code", "3", "--word", "ünï code=x", "--", "./tests"]
    assert printed["cwd"] == str(declared.workspace)
    assert "stderr:\nto stderr" in result["content"][0]["text"]
    assert len(asked) == 1
    run_id = structured["run_id"]
    assert kinds(declared, run_id) == [
        "MCP_TOOL_CALL", "mcp.permission.decision", "TOOL_STARTED", "SANDBOX_EXEC", "TOOL_FINISHED",
    ]  # fmt: skip
    finished = declared.events_of(run_id)[-1]
    assert finished["detail"] == {"status": "error", "exit_code": 3, "duration_ms": structured["duration_ms"]}
    assert {"stdout.txt", "stderr.txt", "evidence.json"} <= {
        p.name for p in (declared.home / "artifacts" / run_id).iterdir()
    }
    evidence = json.loads((declared.home / "artifacts" / run_id / "evidence.json").read_text())
    assert evidence["sandbox"]["exit_code"] == 3
    assert declared.chain_ok()


def refusal(response: dict[str, Any]) -> tuple[int, str]:
    error = response["error"]
    return error["code"], error["data"]["reason"]


def test_every_refusal_reaches_a_declared_tool(declared: GatewayHome, open_session: SessionFactory) -> None:
    session = open_session(declared, capabilities=FORM_ELICITATION)
    session.responder = answer("allow_once")
    token = declared.token("alice")

    assert refusal(session.call_tool("pytool", {"code": "three"}, token)) == (-32602, "invalid_arguments")
    assert refusal(session.call_tool("pytool", {"word": "-rf"}, token)) == (-32602, "invalid_arguments")
    assert refusal(session.call_tool("pytool", {"extra": 1}, token)) == (-32602, "invalid_arguments")
    assert refusal(session.call_tool("pytool", {"path": "../x"}, token)) == (-32004, "path_outside_workspace")
    assert refusal(session.call_tool("pytool", {"timeout_s": 301}, token)) == (-32004, "timeout_over_policy")
    timed_out = session.call_tool("pytool", {"sleep": 30, "timeout_s": 1}, token, timeout=120)
    assert refusal(timed_out) == (-32007, "timeout")
    flooded = session.call_tool("pytool", {"flood": True}, token, timeout=120)
    assert refusal(flooded) == (-32006, "output_limit")
    assert kinds(declared, flooded["error"]["data"]["run_id"])[-2:] == ["SANDBOX_EXEC", "TOOL_FINISHED"]

    session.responder = answer("deny_once")
    denied = session.call_tool("pytool", {}, token)
    assert refusal(denied) == (-32008, "consent_denied")
    assert kinds(declared, denied["error"]["data"]["run_id"])[-1] == "POLICY_BLOCKED"

    # The program replaced after the policy was loaded: refused before anything is asked or run.
    other = declared.policy_path.parent / "bin" / "other"
    replacement = other.with_name("other.new")
    replacement.write_text(other.read_text())
    replacement.chmod(0o755)
    replacement.replace(other)
    replaced = session.call_tool("other", {}, token)
    assert refusal(replaced) == (-32004, "program_changed")
    assert str(other) in replaced["error"]["message"]
    assert kinds(declared, replaced["error"]["data"]["run_id"]) == ["MCP_TOOL_CALL", "POLICY_BLOCKED"]


def test_a_declared_tool_is_charged_to_the_budget(make_gateway: GatewayFactory, open_session: SessionFactory) -> None:
    gw = make_gateway()
    program_folder(gw)
    gw.write_policy({**declared_policy({"pytool": pytool()}), "budget": {"attempts_total": 0}})
    gw.add_user("alice", "USER")
    session = open_session(gw, capabilities=FORM_ELICITATION)
    response = session.call_tool("pytool", {}, gw.token("alice"))
    assert refusal(response) == (-32005, "attempts_exhausted")


def test_a_memory_limit_over_the_tools_own_stops_the_run(
    make_gateway: GatewayFactory, open_session: SessionFactory
) -> None:
    gw = make_gateway()
    folder = program_folder(gw)
    hog = folder / "hog"
    hog.write_text(HOG)
    hog.chmod(0o755)
    reachable_by_everyone(folder)
    gw.write_policy(
        declared_policy({"hog": {"description": "Eat memory", "command": ["bin/hog"], "memory_limit_mb": 128}})
    )
    gw.add_user("alice", "USER")
    session = open_session(gw, capabilities=FORM_ELICITATION)
    session.responder = answer("allow_once")
    response = session.call_tool("hog", {}, gw.token("alice"), timeout=120)
    assert refusal(response) == (-32006, "memory_limit"), response
    assert "128 MiB" in response["error"]["message"]  # the tool's own limit, not the sandbox's 1024
    event = gw.events_of(response["error"]["data"]["run_id"])[-2]
    assert event["event_type"] == "SANDBOX_EXEC"
    assert event["detail"]["peak_memory_kb"] <= 128 * 1024


def test_editing_the_template_asks_again(make_gateway: GatewayFactory, open_session: SessionFactory) -> None:
    gw = make_gateway()
    program_folder(gw)
    gw.write_policy(declared_policy({"pytool": pytool()}))
    gw.add_user("alice", "USER")
    granted = gw.cli("consent", "grant", "alice", "pytool", "--always")
    assert granted.returncode == 0, granted.stderr
    denied = gw.cli("consent", "grant", "alice", "pytool", "--deny", "--args", '{"path": "tests/../secret"}')
    assert denied.returncode == 0, denied.stderr
    listed = json.loads(gw.cli("consent", "list", "--format", "json").stdout)["decisions"]
    assert sorted(d["scope"] for d in listed) == ["any-args", "path:path=secret"]  # the declared path, normalised

    session = open_session(gw, capabilities=FORM_ELICITATION)
    asked: list[str] = []
    session.responder = answer("deny_once", asked)
    ran = session.call_tool("pytool", {"path": "tests"}, gw.token("alice"))
    assert "result" in ran, ran
    assert ran["result"]["structuredContent"]["exit_code"] == 0
    assert asked == []  # the stored Allow always answered
    whole = session.call_tool("pytool", {}, gw.token("alice"))  # the default ".": the denied folder is in it
    assert refusal(whole) == (-32008, "consent_denied_always")
    session.close()

    gw.write_policy(declared_policy({"pytool": pytool(["bin/pytool", "--code", "0", "--", "{path}"])}))
    session = open_session(gw, capabilities=FORM_ELICITATION)
    session.responder = answer("deny_once", asked)
    again = session.call_tool("pytool", {"path": "tests"}, gw.token("alice"))
    assert refusal(again) == (-32008, "consent_denied")
    assert len(asked) == 1  # the grant was for another definition: the person was asked


def test_policy_check_prints_the_program_and_explain_the_argv(declared: GatewayHome) -> None:
    checked = declared.cli("policy", "check")
    assert checked.returncode == 0, checked.stderr
    program = declared.policy_path.parent / "bin" / "pytool"
    assert f"declared tool pytool: program {program}, sha256 " in checked.stdout
    assert f"interpreter {sys.executable}" in checked.stdout
    as_json = json.loads(declared.cli("policy", "check", "--format", "json").stdout)
    pinned = as_json["declared"]["pytool"]
    assert (pinned["path"], pinned["real"], pinned["size"]) == (str(program), str(program), len(PROGRAM))
    assert pinned["interpreter"]["path"] == sys.executable

    explained = declared.cli(
        "policy", "explain", "--user", "alice", "--tool", "pytool", "--args", json.dumps({"path": "tests", "code": 1})
    )
    assert explained.returncode == 0, explained.stderr
    assert f"would run (workspace: read_only): {program} --code 1 -- ./tests" in explained.stdout


NODE = shutil.which("node")


def test_node_test_runs_read_only(make_gateway: GatewayFactory, open_session: SessionFactory) -> None:
    if NODE is None:
        if os.geteuid() != 0:
            pytest.skip("node is not installed, and only root can install it: `make nodejs`")
        pytest.fail("node is not installed: run `make nodejs` (Node.js from the project's Makefile)")
    gw = make_gateway()
    project = gw.workspace / "jsproject" / "test"
    project.mkdir(parents=True)
    (project / "math.test.js").write_text(textwrap.dedent(NODE_TEST))
    reachable_by_everyone(gw.workspace)
    node_test = {
        "description": "Run the workspace's Node.js tests",
        "command": ["node", "--test", "{path}"],
        "arguments": {"path": {"type": "path", "default": "jsproject/test/math.test.js"}},
        "annotations": {"readOnlyHint": True, "destructiveHint": False, "openWorldHint": False},
        "timeout_s": 120,
    }
    # node reads OpenSSL's configuration at start: the one file outside /usr it needs.
    sandbox = {"allowed_paths": ["/etc/ssl/openssl.cnf"]}
    gw.write_policy({"tools": {"allowlist": ["node_test"], "declared": {"node_test": node_test}}, "sandbox": sandbox})
    gw.add_user("alice", "USER")
    session = open_session(gw, capabilities=FORM_ELICITATION)
    session.responder = answer("allow_once")

    response = session.call_tool("node_test", {}, gw.token("alice"), timeout=180)

    result = response.get("result")
    assert result is not None, response
    text = result["content"][0]["text"]
    assert result["isError"] is False, text
    assert result["structuredContent"]["exit_code"] == 0
    assert "# pass 2" in text
    assert not (gw.workspace / "written-by-node.txt").exists()


def test_a_declared_run_sends_progress_before_its_result(declared: GatewayHome, open_session: SessionFactory) -> None:
    session = open_session(declared, capabilities=FORM_ELICITATION)
    session.responder = answer("allow_once")
    params = {
        "name": "pytool",
        "arguments": {"sleep": 2},
        "auth": {"token": declared.token("alice")},
        "_meta": {"progressToken": "p1"},
    }
    response = session.request("tools/call", params, timeout=120)
    assert response["result"]["structuredContent"]["exit_code"] == 0
    notes = [
        m["params"]["message"]
        for m in session.unsolicited
        if m.get("method") == "notifications/progress" and m["params"].get("progressToken") == "p1"
    ]
    assert "Running pytool" in notes, notes


def test_a_cancelled_declared_run_is_stopped(declared: GatewayHome, open_session: SessionFactory) -> None:
    session = open_session(declared, capabilities=FORM_ELICITATION)
    session.responder = answer("allow_once")
    request_id = session.send_call("pytool", {"sleep": 60}, declared.token("alice"))
    log = AuditLog(declared.engine, SystemClock())

    def started() -> list[str]:
        return [str(e.run_id) for e in log.events() if e.event_type == "TOOL_STARTED" and e.tool_name == "pytool"]

    deadline = time.monotonic() + scaled(60)
    while not started():
        assert time.monotonic() < deadline
        session.pump(0.2)
    (run_id,) = started()
    time.sleep(0.5)  # the sandbox has spawned it by now, or does so while the cancellation arrives
    session.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": request_id}})
    while kinds(declared, run_id)[-1] != "TOOL_FINISHED":
        assert time.monotonic() < deadline, kinds(declared, run_id)
        session.pump(0.2)
    assert declared.events_of(run_id)[-1]["detail"]["status"] == "cancelled"
    assert time.monotonic() < deadline  # well before the program's 60 s


@pytest.mark.parametrize("backend", ["native", "bubblewrap"])
def test_each_backend_runs_the_pinned_program_and_no_more(
    make_gateway: GatewayFactory, open_session: SessionFactory, backend: str
) -> None:
    gw = make_gateway()
    program_folder(gw)
    gw.write_policy(declared_policy({"pytool": pytool()}, backend=backend))
    gw.add_user("alice", "USER")
    session = open_session(gw, capabilities=FORM_ELICITATION)
    session.responder = answer("allow_once")
    response = session.call_tool("pytool", {"path": "tests", "touch": True}, gw.token("alice"), timeout=120)
    result = response["result"]
    assert result["isError"] is False, result["content"][0]["text"]
    assert json.loads(result["content"][0]["text"].splitlines()[0])["written"] == []
    assert not (gw.workspace / "written.txt").exists()
    run_id = result["structuredContent"]["run_id"]
    evidence = json.loads((gw.home / "artifacts" / run_id / "evidence.json").read_text())
    assert evidence["sandbox"]["confinement"]["backend"] == backend
    assert "file_grants" in evidence["sandbox"]["confinement"]["guarantees"]
