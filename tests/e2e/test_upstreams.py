"""Upstream MCP servers over real stdio (docs/upstreams.md): a real MCP server started confined, listed, called, refused, audited.

The server is tests/upstreams/server.py, copied beside the policy with this interpreter on its `#!` line
(the program is pinned at load, outside the workspace, readable by the run through sandbox.allowed_paths).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from gateway.audit import AuditLog
from gateway.clock import SystemClock
from tests.deadlines import scaled
from tests.harness import FORM_ELICITATION, GatewayHome, StdioSession, deep_merge, reachable_by_everyone

SessionFactory = Callable[..., StdioSession]
GatewayFactory = Callable[..., GatewayHome]

SERVER = Path(__file__).resolve().parents[1] / "upstreams" / "server.py"
OFFERED = (
    "echo", "note", "env_digest", "sleep", "crash", "big", "progress", "sample", "flood", "roots", "ask", "change",
    "connect", "read", "fork", "cancelled",
)  # fmt: skip
SECRET = "upstream-secret-value-7d1f"


def install_server(gateway: GatewayHome) -> None:
    folder = gateway.policy_path.parent / "bin"
    folder.mkdir(exist_ok=True)
    script = folder / "upstream"
    script.write_text(f"#!{sys.executable}\n" + SERVER.read_text())
    script.chmod(0o755)
    reachable_by_everyone(folder)


def upstream_policy(**upstream: Any) -> dict[str, Any]:
    offered = [f"up__{tool}" for tool in OFFERED if tool != "note"]
    return {
        "tools": {"allowlist": ["run_pytest", "list_artifacts", *offered]},
        "sandbox": {"allowed_paths": ["bin"], "max_output_bytes": 200_000},
        "upstreams": {
            "up": {
                "command": ["bin/upstream"],
                "trust": "untrusted",
                "tools": list(OFFERED),
                "timeout_s": 20,
                "env": {"UP_SECRET": "${UP_TEST_SECRET}", "UP_PLAIN": "plain"},
                "max_output_bytes": 50_000,
                **upstream,
            }
        },
    }


@pytest.fixture
def upstream_gateway(make_gateway: GatewayFactory) -> GatewayHome:
    gw = make_gateway()
    install_server(gw)
    gw.write_policy(upstream_policy())
    gw.add_user("alice", "USER")
    gw.add_user("victor", "VIEWER")
    return gw


def allow(decision: str = "allow_once", asked: list[str] | None = None) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def respond(message: dict[str, Any]) -> dict[str, Any]:
        assert message["method"] == "elicitation/create"
        if asked is not None:
            asked.append(message["params"]["message"])
        return {"action": "accept", "content": {"decision": decision}}

    return respond


def session_on(gateway: GatewayHome, open_session: SessionFactory) -> StdioSession:
    session = open_session(gateway, capabilities=FORM_ELICITATION, env={"UP_TEST_SECRET": SECRET})
    session.responder = allow("allow_session")
    return session


def kinds(gateway: GatewayHome, run_id: str) -> list[str]:
    return [e["event_type"] for e in gateway.events_of(run_id)]


def refusal(response: dict[str, Any]) -> tuple[int, str]:
    error = response["error"]
    return error["code"], error["data"]["reason"]


def run_id_of(response: dict[str, Any]) -> str:
    if "error" in response:
        return str(response["error"]["data"]["run_id"])
    return str(response["result"]["_meta"]["mcp-write-gateway/run_id"])


def test_an_upstream_tool_is_listed_called_and_audited(
    upstream_gateway: GatewayHome, open_session: SessionFactory
) -> None:
    session = session_on(upstream_gateway, open_session)
    token = upstream_gateway.token("alice")
    listed = {t["name"]: t for t in session.request("tools/list", {"auth": {"token": token}})["result"]["tools"]}
    assert {f"up__{tool}" for tool in OFFERED if tool != "note"} <= set(listed)
    assert "up__note" not in listed  # offered by the upstream, not allowlisted
    echo = listed["up__echo"]
    assert echo["description"] == "Echo the text back"
    assert echo["inputSchema"]["required"] == ["text"]
    assert echo["annotations"]["readOnlyHint"] is True
    assert "mcp-write-gateway/declaration" in echo["_meta"]

    response = session.call_tool("up__echo", {"text": "héllo"}, token)

    result = response["result"]
    assert result["content"] == [{"type": "text", "text": "héllo"}]
    assert result["structuredContent"] == {"echo": "héllo"}
    assert result["isError"] is False
    run_id = run_id_of(response)
    assert kinds(upstream_gateway, run_id) == [
        "MCP_TOOL_CALL", "mcp.permission.decision", "TOOL_STARTED", "UPSTREAM_CALL", "TOOL_FINISHED",
    ]  # fmt: skip
    called = upstream_gateway.events_of(run_id)[3]
    document = {"content": result["content"], "isError": False, "structuredContent": result["structuredContent"]}
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert called["detail"]["result_sha256"] == hashlib.sha256(canonical.encode()).hexdigest()
    assert (called["detail"]["upstream"], called["detail"]["tool"], called["detail"]["is_error"]) == (
        "up",
        "echo",
        False,
    )
    assert called["detail"]["duration_ms"] >= 0
    assert "héllo" not in json.dumps(upstream_gateway.events_of(run_id))  # never the content
    assert upstream_gateway.chain_ok()


def peak_rss_kib(pid: int) -> int:
    """The process's peak resident set (VmHWM), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmHWM for pid {pid}")


HUNDRED_MB = 100_000_000


def test_an_answer_over_the_cap_is_refused_and_100_mb_never_reaches_the_gateways_memory(
    upstream_gateway: GatewayHome, open_session: SessionFactory
) -> None:
    upstream_gateway.write_policy(upstream_policy(memory_limit_mb=1024))  # room for the server to make its 100 MB
    session = session_on(upstream_gateway, open_session)
    token = upstream_gateway.token("alice")

    under = session.call_tool("up__big", {"bytes": 10_000}, token)
    assert len(under["result"]["content"][0]["text"]) == 10_000
    over = session.call_tool("up__big", {"bytes": 60_000}, token)  # over max_output_bytes, under the line cap
    assert refusal(over) == (-32006, "output_limit")
    (server,) = servers_of(upstream_gateway)
    before = peak_rss_kib(session.process.pid)

    huge = session.call_tool("up__big", {"bytes": HUNDRED_MB}, token, timeout=120)  # over the line cap: stopped

    assert refusal(huge) == (-32006, "output_limit")
    assert "nothing of it is passed on" in huge["error"]["message"]
    called = upstream_gateway.events_of(run_id_of(huge))[-2]
    assert (called["event_type"], called["detail"]["ended"]) == ("UPSTREAM_CALL", "output_limit"), called
    grown_kib = peak_rss_kib(session.process.pid) - before
    # The gateway reads at most the line cap (max_output_bytes + 64 KiB) of it: its peak grew by far less
    # than a tenth of the answer (measured: 124 to 176 KiB over a peak of 109 MiB; the answer is 95 MiB).
    assert grown_kib < HUNDRED_MB // 10 // 1024, f"the gateway's peak RSS grew by {grown_kib} KiB"
    assert session.call_tool("up__echo", {"text": "ok"}, token)["result"]["content"][0]["text"] == "ok"
    (restarted,) = servers_of(upstream_gateway)
    assert restarted.pid != server.pid, "the server that wrote past the line cap was stopped, another started"


def test_an_env_reference_reaches_the_server_and_no_log_or_event(
    upstream_gateway: GatewayHome, open_session: SessionFactory
) -> None:
    session = session_on(upstream_gateway, open_session)
    token = upstream_gateway.token("alice")

    secret = session.call_tool("up__env_digest", {"name": "UP_SECRET"}, token)
    plain = session.call_tool("up__env_digest", {"name": "UP_PLAIN"}, token)
    gateway_token = session.call_tool("up__env_digest", {"name": "MCP_GATEWAY_TOKEN"}, token)

    assert secret["result"]["content"][0]["text"] == hashlib.sha256(SECRET.encode()).hexdigest()
    assert plain["result"]["content"][0]["text"] == hashlib.sha256(b"plain").hexdigest()
    assert gateway_token["result"]["content"][0]["text"] == "absent"
    session.close()
    assert SECRET not in session.stderr_text()
    assert SECRET not in json.dumps(upstream_gateway.audit_events())


def test_sampling_is_refused_and_roots_are_the_workspace(
    upstream_gateway: GatewayHome, open_session: SessionFactory
) -> None:
    session = session_on(upstream_gateway, open_session)
    token = upstream_gateway.token("alice")
    sampled = session.call_tool("up__sample", {}, token)
    assert sampled["result"]["content"][0]["text"].startswith("refused")
    roots = session.call_tool("up__roots", {}, token)
    assert roots["result"]["content"][0]["text"] == upstream_gateway.workspace.as_uri()
    assert not [m for m in session.unsolicited if m["method"] == "sampling/createMessage"]


def test_progress_is_relayed_and_a_flood_is_dropped(
    upstream_gateway: GatewayHome, open_session: SessionFactory
) -> None:
    session = session_on(upstream_gateway, open_session)
    token = upstream_gateway.token("alice")
    session.request(
        "tools/call",
        {"name": "up__progress", "arguments": {}, "auth": {"token": token}, "_meta": {"progressToken": "p1"}},
    )
    said = [m["params"].get("message", "") for m in session.unsolicited if m["method"] == "notifications/progress"]
    assert any("step" in message for message in said), said

    flooded = session.call_tool("up__flood", {"count": 5000}, token, timeout=120)
    assert flooded["result"]["content"][0]["text"] == "flooded"
    assert session.call_tool("up__echo", {"text": "alive"}, token)["result"]["content"][0]["text"] == "alive"
    session.close()
    assert session.stderr_text().count("notifications over") == 1


def servers_of(gateway: GatewayHome) -> list[psutil.Process]:
    """The live processes running this gateway's copy of the test server (its path is on their command line)."""
    script = str(gateway.policy_path.parent / "bin" / "upstream")
    found = []
    for process in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if script in (process.info["cmdline"] or []) and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
    return found


def test_a_read_only_server_cannot_write_and_none_is_left_when_the_gateway_stops(
    upstream_gateway: GatewayHome, open_session: SessionFactory
) -> None:
    upstream_gateway.write_policy(
        deep_merge(upstream_policy(), {"tools": {"allowlist": ["run_pytest", "up__note", "up__echo"]}})
    )
    session = session_on(upstream_gateway, open_session)
    token = upstream_gateway.token("alice")
    written = session.call_tool("up__note", {"name": "note.txt", "text": "x"}, token)
    assert written["result"]["isError"] is True
    assert written["result"]["content"][0]["text"].startswith("not written")
    assert not (upstream_gateway.workspace / "note.txt").exists()
    assert len(servers_of(upstream_gateway)) == 1  # one server per gateway and upstream, whatever the calls

    session.close()

    assert servers_of(upstream_gateway) == []


def test_a_writing_server_changes_the_workspace_but_never_a_protected_path(
    upstream_gateway: GatewayHome, open_session: SessionFactory
) -> None:
    upstream_gateway.write_policy(
        deep_merge(upstream_policy(workspace="write"), {"tools": {"allowlist": ["run_pytest", "up__note", "up__echo"]}})
    )
    session = session_on(upstream_gateway, open_session)
    token = upstream_gateway.token("alice")

    written = session.call_tool("up__note", {"name": "note.txt", "text": "from upstream"}, token)
    protected = session.call_tool("up__note", {"name": ".envrc", "text": "export X=1"}, token)

    assert written["result"]["content"][0]["text"] == "written"
    assert (upstream_gateway.workspace / "note.txt").read_text() == "from upstream"
    changes = upstream_gateway.events_of(run_id_of(written))[3]["detail"]["changes"]
    assert [(f["path"], f["action"]) for f in changes["files"]] == [("note.txt", "added")]
    assert changes["applied"] is True
    assert not (upstream_gateway.workspace / ".envrc").exists()
    refused = upstream_gateway.events_of(run_id_of(protected))[3]["detail"]["changes"]["refused"]
    assert [r["path"] for r in refused] == [".envrc"]


def test_policy_check_prints_the_program_and_explain_the_forwarding(upstream_gateway: GatewayHome) -> None:
    checked = upstream_gateway.cli("policy", "check")
    assert checked.returncode == 0, checked.stderr
    program = upstream_gateway.policy_path.parent / "bin" / "upstream"
    assert f"upstream up: program {program}, sha256 " in checked.stdout
    as_json = json.loads(upstream_gateway.cli("policy", "check", "--format", "json").stdout)
    assert as_json["upstreams"]["up"]["interpreter"]["path"] == sys.executable
    # The upstream's tools are known once its server listed them: a dry run starts no server.
    explained = upstream_gateway.cli("policy", "explain", "--user", "alice", "--tool", "up__echo")
    assert explained.returncode == 3
    assert "unavailable" in explained.stdout or "unknown tool" in explained.stdout


def test_elicitation_is_relayed_labelled_only_when_the_policy_says_so(
    upstream_gateway: GatewayHome, open_session: SessionFactory
) -> None:
    session = session_on(upstream_gateway, open_session)
    token = upstream_gateway.token("alice")
    refused = session.call_tool("up__ask", {}, token)
    assert refused["result"]["content"][0]["text"].startswith("refused")
    session.close()

    upstream_gateway.write_policy(upstream_policy(relay_elicitation=True))
    session = session_on(upstream_gateway, open_session)
    relayed: list[str] = []

    def respond(message: dict[str, Any]) -> dict[str, Any]:
        text = message["params"]["message"]
        if text.startswith("[upstream up asks"):
            relayed.append(text)
            return {"action": "accept", "content": {"ok": True}}
        return {"action": "accept", "content": {"decision": "allow_once"}}

    session.responder = respond
    answered = session.call_tool("up__ask", {}, token)
    assert answered["result"]["content"][0]["text"] == "answered: accept {'ok': True}"
    assert relayed == ["[upstream up asks, in its own words, unchecked] Proceed?"]


def test_a_hostile_server_reaches_no_network_no_state_and_leaves_no_process(
    upstream_gateway: GatewayHome, open_session: SessionFactory
) -> None:
    session = session_on(upstream_gateway, open_session)
    token = upstream_gateway.token("alice")
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        connected = session.call_tool("up__connect", {"port": port}, token)
    assert connected["result"]["content"][0]["text"].startswith("not connected")
    for secret in (upstream_gateway.home / "gateway.db", upstream_gateway.home / "signing.key", Path("/etc/shadow")):
        assert secret.is_file()  # there to be read, by anyone but the server
        read = session.call_tool("up__read", {"path": str(secret)}, token)
        assert read["result"]["content"][0]["text"].startswith("not read"), secret
    assert session.call_tool("up__read", {"path": str(upstream_gateway.workspace / "pyproject.toml")}, token)["result"][
        "content"
    ][0]["text"].startswith("read ")
    assert session.call_tool("up__fork", {}, token)["result"]["content"][0]["text"] == "forked"
    assert len(servers_of(upstream_gateway)) == 2  # the server and the child it left

    session.close()

    assert servers_of(upstream_gateway) == []


def test_a_call_cancelled_by_the_client_is_cancelled_at_the_server(
    upstream_gateway: GatewayHome, open_session: SessionFactory
) -> None:
    session = session_on(upstream_gateway, open_session)
    token = upstream_gateway.token("alice")
    request_id = session.send_call("up__sleep", {"seconds": 60}, token)
    log = AuditLog(upstream_gateway.engine, SystemClock())
    deadline = time.monotonic() + scaled(60)
    while not [e for e in log.events() if e.event_type == "TOOL_STARTED" and e.tool_name == "up__sleep"]:
        assert time.monotonic() < deadline, "the call never started"
        session.pump(0.2)
    time.sleep(1)  # forwarded right after TOOL_STARTED
    session.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": request_id}})

    counted = ""
    while counted != "cancelled 1":
        assert time.monotonic() < deadline, counted
        counted = session.call_tool("up__cancelled", {}, token)["result"]["content"][0]["text"]
    (started,) = [e for e in log.events() if e.event_type == "TOOL_STARTED" and e.tool_name == "up__sleep"]
    ended = [e.event_type for e in log.events(run_id=started.run_id)]
    assert ended[-1] == "TOOL_FINISHED"
    assert request_id not in session.answered()  # a cancelled request gets no answer
