"""A client that stops reading stdout, and database files SQLite can no longer write.

Before the fix a client that closed its end of stdout left the gateway cancelling its calls, then
waiting for more input, then exiting 1 with a 68-line traceback; a `-shm` made immutable (or
truncated) killed it with SIGBUS and no log line. Now each case ends the gateway within a few
seconds, with exit status 1, no traceback and one line on stderr saying why and what to do.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import subprocess
import termios
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.harness import GatewayHome, StdioSession

ELICITATION: dict[str, Any] = {"elicitation": {"form": {}}}
CLIENT_LINE = "the client stopped reading stdout"
DISK_LINE = "the gateway stops, as SQLite would fail or crash (SIGBUS)"
PROMPT_EXIT_S = 5.0


class Client(StdioSession):
    """A client that can stop reading the gateway's stdout while it stays alive (its pump parks)."""

    def __init__(self, gateway: GatewayHome) -> None:
        self._reading = threading.Event()
        self._reading.set()
        self._parked = threading.Event()
        self._buffer = b""
        super().__init__(gateway)

    def _pump(self) -> None:
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        while self._reading.is_set():
            ready, _, _ = select.select([fd], [], [], 0.05)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                self._lines.put(b"")
                break
            *lines, self._buffer = (self._buffer + chunk).split(b"\n")
            for line in lines:
                self._lines.put(line + b"\n")
        self._parked.set()

    def stop_reading(self) -> None:
        self._reading.clear()
        assert self._parked.wait(5), "the pump did not park"

    def close_stdout(self) -> None:
        self.stop_reading()
        assert self.process.stdout is not None
        self.process.stdout.close()

    def unread_bytes(self) -> int:
        assert self.process.stdout is not None
        return int.from_bytes(fcntl.ioctl(self.process.stdout.fileno(), termios.FIONREAD, bytes(4)), "little")

    def exit_status_within(self, seconds: float) -> tuple[int, float]:
        started = time.monotonic()
        status = self.process.wait(timeout=seconds)
        return status, time.monotonic() - started

    def close(self) -> int:
        if self.process.stdout is not None and not self.process.stdout.closed:
            self.stop_reading()
        if self.process.stdin is not None and not self.process.stdin.closed:
            with contextlib.suppress(BrokenPipeError):  # the gateway may be gone already
                self.process.stdin.close()
        return super().close()


@pytest.fixture
def clients() -> Iterator[Callable[[GatewayHome], Client]]:
    started: list[Client] = []

    def start(gateway: GatewayHome) -> Client:
        client = Client(gateway)
        started.append(client)
        assert "result" in client.initialize(ELICITATION)
        return client

    yield start
    for client in started:
        client.close()


def _start_slow_run(gateway: GatewayHome, client: Client) -> int:
    """A run_pytest call in flight (consent given in-band); returns the pid of its pytest."""
    test_file = gateway.workspace / "tests" / "test_slow.py"
    test_file.write_text("import time\n\ndef test_sleeps():\n    time.sleep(60)\n")
    test_file.chmod(0o644)
    client.send_call("run_pytest", {"test_path": "tests/test_slow.py"}, gateway.token("alice"))
    prompt = client.read_message()
    assert prompt["method"] == "elicitation/create", prompt
    answer = {"action": "accept", "content": {"decision": "allow_once"}}
    client.send({"jsonrpc": "2.0", "id": prompt["id"], "result": answer})
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for process in psutil.process_iter(["cmdline"]):
            cmdline = process.info["cmdline"] or []
            if f"--rootdir={gateway.workspace}" in cmdline and "./tests/test_slow.py" in cmdline:
                return int(process.pid)
        time.sleep(0.05)
    raise AssertionError("the run never started")


def _gone(pid: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.05)
    return False


def _assert_stopped_and_told(client: Client, line: str, seconds: float) -> str:
    """Exit status 1 within a few seconds, no traceback, exactly one line containing `line`; returns it."""
    status, _ = client.exit_status_within(seconds)
    stderr = client.stderr_text()
    assert status == 1, (status, stderr)
    assert "Traceback" not in stderr and "Fatal Python error" not in stderr, stderr
    told = [text for text in stderr.splitlines() if line in text]
    assert len(told) == 1, stderr
    return told[0]


def _assert_audit_verifies(gateway: GatewayHome) -> None:
    verify = gateway.cli("audit", "verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert gateway.chain_ok()


def _assert_run_cancelled(gateway: GatewayHome, run_pid: int) -> None:
    assert _gone(run_pid), "the run outlived its gateway"
    events = gateway.audit_events()
    runs = {e["run_id"] for e in events if e["event_type"] == "MCP_TOOL_CALL" and "run_pytest" in json.dumps(e)}
    assert len(runs) == 1, runs
    finished = [e["detail"] for e in events if e["event_type"] == "TOOL_FINISHED" and e["run_id"] in runs]
    assert finished == [{"status": "cancelled"}], finished


def _fill_the_pipe(client: Client) -> None:
    """Send pings until the gateway's answers fill the pipe the client no longer reads."""
    batch = b"".join(
        json.dumps({"jsonrpc": "2.0", "id": f"fill-{n}", "method": "ping"}).encode() + b"\n" for n in range(500)
    )
    deadline = time.monotonic() + 15
    while client.unread_bytes() < 60_000:
        assert time.monotonic() < deadline, f"only {client.unread_bytes()} bytes unread"
        client.send_raw(batch)
        time.sleep(0.05)


@pytest.mark.parametrize(
    "how",
    ["closes stdout, then sends a call", "closes stdout and sends nothing", "stops reading until the pipe is full"],
)
def test_a_client_that_stops_reading_ends_the_gateway_at_once(
    gateway: GatewayHome, clients: Callable[[GatewayHome], Client], how: str
) -> None:
    client = clients(gateway)
    run_pid = _start_slow_run(gateway, client)
    if how == "stops reading until the pipe is full":
        client.stop_reading()
        _fill_the_pipe(client)  # the gateway's writer now waits on the pipe; the gateway still serves
        assert client.process.poll() is None, "a client that is slow to read is not a client that is gone"
        client.close_stdout()
    else:
        client.close_stdout()
        if how == "closes stdout, then sends a call":
            client.send_call("list_artifacts", {}, gateway.token("alice"))
    told = _assert_stopped_and_told(client, CLIENT_LINE, PROMPT_EXIT_S)
    assert "EPIPE" in told and "calls in flight were cancelled" in told
    _assert_run_cancelled(gateway, run_pid)
    _assert_audit_verifies(gateway)


def _chattr(flag: str, path: Path) -> None:
    subprocess.run(["chattr", flag, str(path)], check=True, capture_output=True)


SIDE_FILE_FAULTS = {
    "-shm immutable": ("gateway.db-shm", "+i", "immutable"),
    "-shm append-only": ("gateway.db-shm", "+a", "append-only"),
    "-wal immutable": ("gateway.db-wal", "+i", "immutable"),
    "database immutable": ("gateway.db", "+i", "immutable"),
    "-shm truncated": ("gateway.db-shm", "truncate", "truncated while in use"),
}


@pytest.mark.parametrize("fault", list(SIDE_FILE_FAULTS))
def test_a_database_file_sqlite_cannot_write_stops_the_gateway_with_a_line(
    gateway: GatewayHome, clients: Callable[[GatewayHome], Client], fault: str
) -> None:
    name, action, why = SIDE_FILE_FAULTS[fault]
    path = gateway.home / name
    client = clients(gateway)
    assert "result" in client.call_tool("list_artifacts", {}, gateway.token("alice"))
    run_pid = _start_slow_run(gateway, client)
    artifacts_before = set((gateway.home / "artifacts").iterdir())
    try:
        if action == "truncate":
            os.truncate(path, 0)
        else:
            _chattr(action, path)
        client.send_call("list_artifacts", {}, gateway.token("alice"))
        client.send_call("run_pytest", {"test_path": "tests"}, gateway.token("alice"))
        told = _assert_stopped_and_told(client, DISK_LINE, PROMPT_EXIT_S)
    finally:
        if action != "truncate":
            _chattr(action.replace("+", "-"), path)
    assert f"{path} cannot be written ({why})" in told
    assert "start the gateway again" in told
    assert _gone(run_pid), "the run outlived its gateway"
    assert set((gateway.home / "artifacts").iterdir()) == artifacts_before, "nothing ran after the fault"
    _assert_audit_verifies(gateway)


def test_a_gateway_started_on_an_immutable_shm_refuses_to_serve(
    gateway: GatewayHome, clients: Callable[[GatewayHome], Client]
) -> None:
    client = clients(gateway)
    assert "result" in client.call_tool("list_artifacts", {}, gateway.token("alice"))
    shm = gateway.home / "gateway.db-shm"
    assert shm.exists(), "the -shm stays while a gateway holds the database open"
    _chattr("+i", shm)
    try:
        started = time.monotonic()
        second = subprocess.run(gateway.cli_argv("serve"), input=b"", capture_output=True, timeout=20, check=False)
        elapsed = time.monotonic() - started
    finally:
        _chattr("-i", shm)
    stderr = second.stderr.decode()
    assert second.returncode == 1, stderr
    assert "Traceback" not in stderr and "Fatal Python error" not in stderr, stderr
    told = [line for line in stderr.splitlines() if DISK_LINE in line]
    assert len(told) == 1 and f"{shm} cannot be written (immutable)" in told[0], stderr
    assert "serving on stdio" not in stderr
    assert elapsed < 10
    assert "result" in client.request("ping"), "the first gateway is untouched by the second's refusal"
    _assert_audit_verifies(gateway)
