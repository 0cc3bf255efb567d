"""`serve` on each kind of stdio a host gives it: sockets (a Node host's children get socketpairs) and
a file for its answers, besides the pipes every other test uses (gateway/transport.py's `Wire`)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.harness import LEGACY, GatewayHome

HELLO = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "tests", "version": "1"}},
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def serve_argv(gateway: GatewayHome) -> list[str]:
    return [
        sys.executable, "-m", "gateway",
        "--home", str(gateway.home), "--db", gateway.url, "--policy", str(gateway.policy_path), "serve",
    ]  # fmt: skip


def environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "MCP_GATEWAY_TOKEN"}


def call(request_id: int, name: str, token: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    params = {"name": name, "arguments": arguments or {}, "auth": {"token": token}}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def line(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode() + b"\n"


def read_answers(sock: socket.socket, count: int) -> list[dict[str, Any]]:
    received = b""
    while received.count(b"\n") < count:
        chunk = sock.recv(1 << 16)
        assert chunk, f"serve closed its stdout after {len(received.splitlines())} of {count} answers"
        received += chunk
    return [json.loads(part) for part in received.splitlines()]


def test_serve_answers_over_socketpairs_as_a_node_host_gives_them(gateway: GatewayHome, tmp_path: Path) -> None:
    client_in, serve_in = socket.socketpair()
    client_out, serve_out = socket.socketpair()
    client_out.settimeout(60)
    with (tmp_path / "stderr.log").open("wb") as stderr:
        process = subprocess.Popen(
            serve_argv(gateway), stdin=serve_in.fileno(), stdout=serve_out.fileno(), stderr=stderr, env=environment()
        )
    serve_in.close()
    serve_out.close()
    try:
        refused = call(3, "run_pytest", gateway.token("vic"), {"test_path": "tests"})
        too_large = b'{"jsonrpc":"2.0","id":4,"method":"ping","params":{"x":"' + b"y" * (2 << 20) + b'"}}\n'
        # In pieces, a request split across reads, and one larger than every socket buffer.
        client_in.sendall(line(HELLO) + line(INITIALIZED) + line(call(2, "list_artifacts", gateway.token("alice")))[:7])
        client_in.sendall(line(call(2, "list_artifacts", gateway.token("alice")))[7:] + line(refused) + too_large)
        client_in.sendall(b"{broken\n" + line({"jsonrpc": "2.0", "id": 5, "method": "ping"}))
        answers = read_answers(client_out, 6)
        by_id = {a.get("id"): a for a in answers if a.get("id") is not None}
        assert by_id[1]["result"]["serverInfo"]["name"] == "mcp-write-gateway"
        assert by_id[2]["result"]["isError"] is False
        assert by_id[3]["error"]["code"] == -32003
        assert by_id[5]["result"] == {}
        nameless = sorted(a["error"]["message"] for a in answers if a.get("id") is None)
        assert nameless == ["Parse error", "Request too large (over 1048576 bytes)"]
        client_in.shutdown(socket.SHUT_WR)  # the end of stdin ends serving
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
        client_in.close()
        client_out.close()
    assert gateway.events_of(by_id[3]["error"]["data"]["run_id"])[-1]["event_type"] == "POLICY_BLOCKED"


def test_serve_writes_its_answers_to_a_file(gateway: GatewayHome, tmp_path: Path) -> None:
    """stdout a regular file (a worker thread writes it); stdin a pipe, closed once every answer is in."""
    answers, log = tmp_path / "answers.jsonl", tmp_path / "stderr.log"
    with answers.open("wb") as stdout, log.open("wb") as stderr:
        process = subprocess.Popen(
            serve_argv(gateway), stdin=subprocess.PIPE, stdout=stdout, stderr=stderr, env=environment()
        )
    assert process.stdin is not None
    process.stdin.write(
        line(HELLO)
        + line(INITIALIZED)
        + line(call(2, "list_artifacts", gateway.token("alice")))
        + b"[1, 2]\n"
        + line(call(3, "run_pytest", gateway.token("vic"), {"test_path": "tests"}))
    )
    process.stdin.flush()
    deadline = time.monotonic() + 60
    while len(answers.read_bytes().splitlines()) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    process.stdin.close()
    assert process.wait(timeout=60) == 0, log.read_text(errors="replace")
    lines = answers.read_bytes().splitlines()
    by_id = {message.get("id"): message for message in map(json.loads, lines)}
    assert by_id[1]["result"]["serverInfo"]["name"] == "mcp-write-gateway"
    assert by_id[2]["result"]["isError"] is False
    assert by_id[None]["error"]["code"] == -32600
    assert by_id[3]["error"]["code"] == -32003
    assert len(lines) == 4
