"""A client that writes and does not read holds the gateway to a bounded backlog.

Before the fix the gateway read every line it was sent and kept each answer it could not write:
20,000 pings unread took its RSS from 101 to 358 MB, never given back. Now it stops reading while
more than `MAX_OUTBOUND_BACKLOG` messages wait to be written; once the client reads, every answer
arrives, in order.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import psutil
import pytest

from tests.harness import LEGACY, GatewayHome

PINGS = 20_000
RSS_GROWTH_BOUND = 48 * 1024 * 1024
"""Far under the ~250 MB the old code grew by for 20,000 unread answers; generous for a busy machine."""


class RawClient:
    """`serve` on pipes, or on socketpairs as a Node host gives them, that the test reads only when it
    chooses to (the harness's session reads at once)."""

    def __init__(self, gateway: GatewayHome, kind: str) -> None:
        env = {k: v for k, v in os.environ.items() if k != "MCP_GATEWAY_TOKEN"}
        self.stderr = (gateway.root / "serve-backlog.log").open("wb")
        self._sockets: tuple[socket.socket, socket.socket] | None = None
        if kind == "pipe":
            self.process = subprocess.Popen(
                gateway.cli_argv("serve"), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, env=env
            )
            assert self.process.stdin is not None and self.process.stdout is not None
            self.stdout_fd = self.process.stdout.fileno()
        else:
            client_in, serve_in = socket.socketpair()
            client_out, serve_out = socket.socketpair()
            self.process = subprocess.Popen(
                gateway.cli_argv("serve"),
                stdin=serve_in.fileno(),
                stdout=serve_out.fileno(),
                stderr=self.stderr,
                env=env,
            )
            serve_in.close()
            serve_out.close()
            self._sockets = (client_in, client_out)
            self.stdout_fd = client_out.fileno()
        self._buffer = b""

    def write(self, data: bytes) -> None:
        """Blocks while the gateway reads nothing and the pipe or socket buffer is full."""
        if self._sockets is not None:
            self._sockets[0].sendall(data)
        else:
            assert self.process.stdin is not None
            self.process.stdin.write(data)
            self.process.stdin.flush()

    def end_input(self) -> None:
        if self._sockets is not None:
            self._sockets[0].shutdown(socket.SHUT_WR)
        elif self.process.stdin is not None:
            self.process.stdin.close()

    def send(self, message: dict[str, object]) -> None:
        self.write(json.dumps(message).encode() + b"\n")

    def read_line(self, deadline: float) -> bytes:
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            assert left > 0, "no answer in time"
            ready, _, _ = select.select([self.stdout_fd], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(self.stdout_fd, 65536)
                assert chunk, "the gateway closed its stdout"
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def rss(self) -> int:
        return int(psutil.Process(self.process.pid).memory_info().rss)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.end_input()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()
        for end in self._sockets or ():
            end.close()
        self.stderr.close()


@pytest.fixture(params=["pipe", "socketpair"])
def raw_client(gateway: GatewayHome, request: pytest.FixtureRequest) -> Iterator[RawClient]:
    client = RawClient(gateway, request.param)
    try:
        yield client
    finally:
        if client.process.poll() is None:
            client.process.kill()  # a writer thread still blocked on stdin then ends with EPIPE
        client.close()


def test_a_client_that_writes_and_does_not_read_keeps_the_gateway_bounded_and_loses_no_answer(
    raw_client: RawClient,
) -> None:
    client = raw_client
    client.send({
        "jsonrpc": "2.0", "id": "init", "method": "initialize",
        "params": {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "tests", "version": "1"}},
    })  # fmt: skip
    assert b'"result"' in client.read_line(time.monotonic() + 60)
    client.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    time.sleep(0.5)  # let start-up allocations settle before the baseline
    baseline = client.rss()

    batch_size = 500
    batches = [
        b"".join(
            json.dumps({"jsonrpc": "2.0", "id": n, "method": "ping"}).encode() + b"\n"
            for n in range(start, start + batch_size)
        )
        for start in range(0, PINGS, batch_size)
    ]
    written = threading.Event()
    failed: list[OSError] = []

    def write_all() -> None:
        try:
            for batch in batches:
                client.write(batch)
        except OSError as exc:  # reported by the test below, not lost in a thread
            failed.append(exc)
        finally:
            written.set()

    writer = threading.Thread(target=write_all, daemon=True)
    writer.start()
    peak = baseline
    watch_until = time.monotonic() + 8
    while time.monotonic() < watch_until:
        peak = max(peak, client.rss())
        time.sleep(0.1)
    assert not written.is_set(), "the gateway read all 20,000 pings while none of their answers was read"
    assert peak - baseline < RSS_GROWTH_BOUND, f"RSS grew {(peak - baseline) >> 20} MiB with answers unread"

    deadline = time.monotonic() + 180
    ids: list[object] = []
    while len(ids) < PINGS:
        answer = json.loads(client.read_line(deadline))
        assert answer.get("result") == {}, answer
        ids.append(answer["id"])
    assert ids == list(range(PINGS)), "every answer, once each, in the order asked"
    assert written.wait(30) and not failed, failed
    peak = max(peak, client.rss())
    assert peak - baseline < RSS_GROWTH_BOUND, f"RSS grew {(peak - baseline) >> 20} MiB"
    client.end_input()
    assert client.process.wait(timeout=30) == 0
