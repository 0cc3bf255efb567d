"""Many calls in flight while another connection holds the lock they need (decision 67): the
scenario behind tests/e2e/test_database_saturation.py (a short hold) and bench/db_stall.py (60 s).

One `serve`, `calls` tools/call lines written to its stdin at once while another connection holds
the lock every call's first audit append waits for (SQLite: `BEGIN IMMEDIATE` on the file;
PostgreSQL: the `audit_head` row, `FOR UPDATE`) for `hold_s` seconds. Meanwhile the gateway's
lease (`gateway_sessions.alive_until`) is read every half second from yet another connection.
`Stall` holds what a test or the bench checks: how long each call took to be answered and with
what, how the lease moved, and how many calls have more than one decision or terminal event.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
from sqlalchemy import make_url, select

from gateway import db
from tests.harness import GatewayHome, StdioSession

SQLITE_BUSY_S = 10.0
"""SQLite's busy timeout and PostgreSQL's lock_timeout (gateway/db/__init__.py): how long a started statement waits."""


@dataclass
class Stall:
    answers: dict[int, tuple[float, str]] = field(default_factory=dict)
    """Request id -> (seconds from sending to its answer, `ok` or the refusal's `code reason`)."""
    lease: list[tuple[float, float]] = field(default_factory=list)
    """(seconds since the hold began, alive_until) read during and just after the hold."""
    hold_s: float = 0.0
    doubled: int = 0
    """Calls with more than one decision, or more than one terminal event."""
    stderr: str = ""

    def slowest(self) -> float:
        return max(elapsed for elapsed, _ in self.answers.values())

    def outcomes(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for _, outcome in self.answers.values():
            counts[outcome] = counts.get(outcome, 0) + 1
        return counts

    def lease_moved_during_hold(self) -> bool:
        during = [alive for at, alive in self.lease if at < self.hold_s]
        return len(set(during)) > 1

    def lease_moved_after_hold(self) -> bool:
        before = max((alive for at, alive in self.lease if at < self.hold_s), default=0.0)
        return any(alive > before for at, alive in self.lease if at >= self.hold_s)


@contextmanager
def held_lock(url: str) -> Iterator[None]:
    """Hold the lock the calls' audit appends need, from a connection of its own with no timeout of the
    gateway's (PostgreSQL would end an idle transaction of a gateway's connection after 60 s)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        file = sqlite3.connect(str(parsed.database), isolation_level=None, timeout=30)
        try:
            file.execute("BEGIN IMMEDIATE")
            yield
            file.execute("ROLLBACK")
        finally:
            file.close()
        return
    plain = parsed.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(plain) as server:
        server.execute("SELECT last_id FROM audit_head WHERE id = 1 FOR UPDATE")
        yield
        server.rollback()


def _alive_until(gateway: GatewayHome) -> float | None:
    with db.reader(gateway.engine).connect() as connection:
        row = connection.execute(select(db.gateway_sessions.c.alive_until)).first()
    return None if row is None else float(row.alive_until)


def _outcome(response: dict[str, Any]) -> str:
    if "error" in response:
        error = response["error"]
        return f"{error['code']} {(error.get('data') or {}).get('reason')}"
    return "error result" if response["result"].get("isError") else "ok"


def run_stall(gateway: GatewayHome, session: StdioSession, *, calls: int, hold_s: float, answer_by_s: float) -> Stall:
    """The scenario (module docstring); `answer_by_s` bounds how long it waits for the answers."""
    token = gateway.token("alice", ttl_s=3600)
    deadline = time.monotonic() + 120
    while _alive_until(gateway) is None:  # the lease keeper's first renewal registers the session
        assert time.monotonic() < deadline, "the gateway never registered its session"
        time.sleep(0.1)
    stall = Stall(hold_s=hold_s)
    ids = list(range(10_000, 10_000 + calls))
    lines = b"".join(
        json.dumps(
            {
                "jsonrpc": "2.0",
                "id": request_id,
                "method": "tools/call",
                "params": {"name": "list_artifacts", "arguments": {}, "auth": {"token": token}},
            }
        ).encode()
        + b"\n"
        for request_id in ids
    )
    with held_lock(gateway.url):
        began = time.monotonic()
        session.send_raw(lines)  # every call at once, as a pipe of `calls` lines
        next_lease = began
        while time.monotonic() - began < hold_s:
            session.pump(0.05)
            for request_id, response in session.answered().items():
                if request_id in ids and request_id not in stall.answers:
                    stall.answers[request_id] = (time.monotonic() - began, _outcome(response))
            if time.monotonic() >= next_lease:
                alive = _alive_until(gateway)
                stall.lease.append((time.monotonic() - began, alive or 0.0))
                next_lease += 0.5
    # After the hold: the answers still missing (none, when the bound holds), and the lease once more.
    for request_id in ids:
        if request_id not in stall.answers:
            remaining = max(began + answer_by_s - time.monotonic(), 0.1)
            response = session.wait_response(request_id, timeout=remaining)
            stall.answers[request_id] = (time.monotonic() - began, _outcome(response))
        else:
            session.wait_response(request_id, timeout=1)
    settle = time.monotonic() + 15
    while time.monotonic() < settle and not stall.lease_moved_after_hold():
        stall.lease.append((time.monotonic() - began, _alive_until(gateway) or 0.0))
        time.sleep(0.5)
    stall.doubled = doubled_ends(gateway)
    stall.stderr = session.stderr_text()
    return stall


def doubled_ends(gateway: GatewayHome) -> int:
    """Calls with two decisions or two terminal events in the audit log."""
    seen: dict[tuple[str, str], int] = {}
    for event in gateway.audit_events():
        kind = {"mcp.permission.decision": "decision", "POLICY_BLOCKED": "end", "TOOL_FINISHED": "end"}.get(
            event["event_type"]
        )
        if kind is not None and event["run_id"]:
            seen[(event["run_id"], kind)] = seen.get((event["run_id"], kind), 0) + 1
    return sum(1 for count in seen.values() if count > 1)
