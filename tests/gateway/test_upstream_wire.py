"""gateway/upstreams/wire.py: an upstream server's pipes as messages, over real pipes: lines bounded, floods dropped."""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

import anyio
import mcp_types as types
import pytest

from gateway.upstreams.connection import LOG_CHARS, logged_line
from gateway.upstreams.wire import NOTIFICATION_BURST, Bucket, Wire, session_streams
from sandbox.pipes import PipeReceiveStream, PipeSendStream


def test_the_bucket_allows_its_burst_then_its_rate() -> None:
    now = [100.0]
    bucket = Bucket(rate=2.0, burst=3.0, clock=lambda: now[0])
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    now[0] += 0.5  # one more token at 2 a second
    assert [bucket.take(), bucket.take()] == [True, False]
    now[0] += 60  # never more than the burst
    assert sum(bucket.take() for _ in range(10)) == 3


def line(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode() + b"\n"


NOTIFICATION = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "x"}}
RESPONSE = {"jsonrpc": "2.0", "id": 1, "result": {}}


def received(wire: Wire, written: bytes) -> list[Any]:
    """What the session's read stream gets of `written` (the server's stdout), through real pipes."""
    out: list[Any] = []

    async def main() -> None:
        server_out, gateway_in = os.pipe()
        gateway_out, server_in = os.pipe()
        stdout = PipeReceiveStream(server_out)
        stdin = PipeSendStream(server_in)
        writer = PipeSendStream(gateway_in)

        async def write() -> None:
            with contextlib.suppress(anyio.BrokenResourceError, OSError):  # the reader stopped: the pipe broke
                await writer.send(written)
            await writer.aclose()

        async with session_streams(wire, stdin, stdout) as (read, _write), anyio.create_task_group() as group:
            group.start_soon(write)
            with anyio.fail_after(20):
                async for message in read:
                    out.append(message)
            await stdout.aclose()  # as the connection's end does: the writer's pipe breaks
        os.close(gateway_out)
        await stdin.aclose()

    anyio.run(main)
    return out


def test_notifications_past_the_burst_are_dropped_and_a_response_still_passes(caplog: pytest.LogCaptureFixture) -> None:
    wire = Wire("up", line_cap=1 << 20, bucket=Bucket(rate=0.001, burst=NOTIFICATION_BURST))
    messages = received(wire, line(NOTIFICATION) * 1000 + line(RESPONSE))
    kinds = [type(m.message).__name__ for m in messages]
    assert kinds.count("JSONRPCNotification") == NOTIFICATION_BURST
    assert kinds[-1] == "JSONRPCResponse"
    assert wire.dropped == 1000 - NOTIFICATION_BURST
    assert sum("notifications over" in r.message for r in caplog.records) == 1  # logged once


def test_a_line_over_the_cap_ends_the_connection() -> None:
    wire = Wire("up", line_cap=1000)
    big = {"jsonrpc": "2.0", "id": 2, "result": {"content": [{"type": "text", "text": "x" * 5000}]}}
    messages = received(wire, line(RESPONSE) + line(big) + line(RESPONSE))
    assert [type(m.message) for m in messages] == [types.JSONRPCResponse]  # nothing after the long line
    assert wire.over_limit is True


def test_a_line_over_the_cap_without_its_end_ends_the_connection_too() -> None:
    wire = Wire("up", line_cap=1000)
    assert received(wire, b"{" + b" " * 500_000) == []
    assert wire.over_limit is True


def test_a_line_that_is_no_message_is_ignored() -> None:
    wire = Wire("up", line_cap=1000)
    messages = received(wire, b"not json\n" + line(RESPONSE))
    assert [type(m.message) for m in messages] == [types.JSONRPCResponse]


def test_list_changed_is_told_as_it_is_read() -> None:
    told: list[int] = []
    wire = Wire("up", line_cap=1000)
    wire.on_list_changed = lambda: told.append(1)
    changed = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
    received(wire, line(changed) + line(RESPONSE))
    assert told == [1]


@pytest.mark.parametrize(
    ("level", "data", "line"),
    [
        ("info", "started", "upstream up logs (info, its own words, unchecked): started"),
        ("error", "two\nlines", "upstream up logs (error, its own words, unchecked): two\\u000alines"),
        ("warning", "\x1b[2J\u202egone", "upstream up logs (warning, its own words, unchecked): \\u001b[2J\\u202egone"),
        ("debug", {"n": 1, "ok": True}, 'upstream up logs (debug, its own words, unchecked): {"n": 1, "ok": true}'),
        ("info\nINFO gateway: forged", "x", "upstream up logs (info\\u000aINFO gatewa, its own words, unchecked): x"),
    ],
)
def test_a_servers_log_message_is_one_escaped_line_of_the_gateways_log(level: str, data: object, line: str) -> None:
    assert logged_line("up", level, data) == line


def test_a_long_log_message_is_cut_and_says_so() -> None:
    line = logged_line("up", "info", "y" * (LOG_CHARS + 1))
    assert line.endswith("y" * LOG_CHARS + " [cut]")
    assert logged_line("up", "info", "y" * LOG_CHARS).endswith("y" * LOG_CHARS)
