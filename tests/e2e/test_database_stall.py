"""A database lock someone else holds does not freeze the gateway (decisions 49, 51).

Before the fix every database call ran on the event loop that also answers `ping` and ends runs
at their time limit. With another connection holding the write lock, a call that had to write
(its audit events) froze the loop: `ping` waited for the lock, and a run's 3 s limit went by
unenforced until the sandbox's watchdog ended it 2 s late (and the gateway saw its end later
still). Now database work runs on worker threads (gateway/db/threads.py): the loop answers and
enforces while the call that needs the database waits, and that wait is bounded by the
database's own timeouts.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import text

from gateway.db import make_engine
from tests.e2e.test_run_pytest import ELICITATION
from tests.harness import GatewayHome, StdioSession
from tests.pg_cluster import on_postgres_only

SessionFactory = Callable[..., StdioSession]
LIMIT_S = 3
RUN_ID = 500


def _start_slow_run(gateway: GatewayHome, session: StdioSession) -> None:
    """A run_pytest call (time limit LIMIT_S) of a test that sleeps a minute, allowed and started."""
    slow = gateway.workspace / "tests" / "test_slow.py"
    slow.write_text("import time\n\ndef test_sleeps():\n    time.sleep(60)\n")
    slow.chmod(0o644)
    arguments = {"test_path": "tests/test_slow.py", "timeout_s": LIMIT_S}
    params = {"name": "run_pytest", "arguments": arguments, "auth": {"token": gateway.token("alice")}}
    session.send({"jsonrpc": "2.0", "id": RUN_ID, "method": "tools/call", "params": params})
    prompt = session.read_message()
    assert prompt["method"] == "elicitation/create", prompt
    result = {"action": "accept", "content": {"decision": "allow_once"}}
    session.send({"jsonrpc": "2.0", "id": prompt["id"], "result": result})
    deadline = time.monotonic() + 30
    while not any(e["event_type"] == "TOOL_STARTED" for e in gateway.audit_events()):
        assert time.monotonic() < deadline, "the run never started"
        time.sleep(0.05)


def _ping_times(session: StdioSession, during_s: float, until_answered: int | None = None) -> list[float]:
    """Round-trip times of pings sent every 0.25 s for `during_s` seconds (or until the request
    `until_answered` has its answer: that answer stays for `wait_response`)."""
    times: list[float] = []
    end = time.monotonic() + during_s
    while time.monotonic() < end and until_answered not in session._pending:
        started = time.monotonic()
        response = session.request("ping", None, timeout=60)
        times.append(time.monotonic() - started)
        assert response.get("result") == {}, response
        time.sleep(0.25)
    return times


@contextmanager
def _sqlite_write_lock(gateway: GatewayHome) -> Iterator[None]:
    """Hold SQLite's write lock from another connection (as a stuck gateway or an sqlite3 shell would)."""
    connection = sqlite3.connect(gateway.home / "gateway.db", isolation_level=None, timeout=30)
    try:
        connection.execute("BEGIN IMMEDIATE")
        yield
        connection.execute("ROLLBACK")
    finally:
        connection.close()


@contextmanager
def _postgres_audit_lock(url: str) -> Iterator[None]:
    """Hold the audit chain's row lock from another connection (as a stuck gateway or psql would)."""
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            transaction = connection.begin()
            connection.execute(text("SELECT last_id FROM audit_head WHERE id = 1 FOR UPDATE"))
            yield
            transaction.rollback()
    finally:
        engine.dispose()


def _send_a_call_that_writes(session: StdioSession) -> None:
    """A refused call (no token): it still writes its two events, so it waits for the lock."""
    session.send({"jsonrpc": "2.0", "id": 700, "method": "tools/call", "params": {"name": "list_artifacts"}})


def _lock_while_calling(session: StdioSession, lock: Any, hold_s: float) -> list[float]:
    """With the lock held `hold_s` seconds: a call that must write is sent and pings are timed."""
    with lock:
        _send_a_call_that_writes(session)
        return _ping_times(session, hold_s)


def _assert_the_run_ended_at_its_limit(gateway: GatewayHome, session: StdioSession) -> None:
    response = session.wait_response(RUN_ID, timeout=60)
    assert response["error"]["code"] == -32007, response
    run_id = response["error"]["data"]["run_id"]
    (executed,) = [e for e in gateway.events_of(run_id) if e["event_type"] == "SANDBOX_EXEC"]
    assert executed["detail"]["killed_by"] == "timeout", executed
    # Killed at the limit by the gateway, not 2 s later by the watchdog, nor when the lock went.
    assert LIMIT_S * 1000 <= executed["detail"]["duration_ms"] < LIMIT_S * 1000 + 1200, executed


def test_a_held_lock_freezes_neither_ping_nor_a_runs_time_limit(
    gateway: GatewayHome, open_session: SessionFactory
) -> None:
    session = open_session(gateway, capabilities=ELICITATION)
    _start_slow_run(gateway, session)
    times = _lock_while_calling(session, _sqlite_write_lock(gateway), hold_s=6)
    assert max(times) < 0.5, f"pings waited for the database: {times}"
    refused = session.wait_response(700, timeout=30)
    assert refused["error"]["code"] == -32001, refused  # answered once the lock went, events written
    kinds = [e["event_type"] for e in gateway.events_of(refused["error"]["data"]["run_id"])]
    assert kinds == ["MCP_TOOL_CALL", "POLICY_BLOCKED"]
    _assert_the_run_ended_at_its_limit(gateway, session)
    assert gateway.chain_ok()


def test_no_database_wait_is_unbounded(gateway: GatewayHome, open_session: SessionFactory) -> None:
    """Variant: the lock outlasts SQLite's busy timeout (10 s): the waiting call fails closed at it,
    pings stay fast all along, the run still ends at its limit, and the gateway recovers."""
    session = open_session(gateway, capabilities=ELICITATION)
    _start_slow_run(gateway, session)
    with _sqlite_write_lock(gateway):
        sent = time.monotonic()
        _send_a_call_that_writes(session)
        times = _ping_times(session, 14, until_answered=700)
        answered_after = time.monotonic() - sent
    assert max(times) < 0.5, f"pings waited for the database: {times}"
    response = session.wait_response(700, timeout=1)
    assert response["error"]["code"] == -32603, response
    assert response["error"]["data"]["reason"] in ("audit_unavailable", "database_unavailable"), response
    assert 9.5 <= answered_after < 12, "the wait is bounded by the busy timeout (10 s)"
    _assert_the_run_ended_at_its_limit(gateway, session)
    assert "result" in session.call_tool("list_artifacts", {}, gateway.token("alice"))
    assert gateway.chain_ok()


@on_postgres_only
def test_a_held_audit_lock_on_postgres_freezes_nothing(
    db_url: str, make_gateway: Callable[..., GatewayHome], open_session: SessionFactory
) -> None:
    gateway = make_gateway()
    gateway.add_user("alice", "USER")
    session = open_session(gateway, capabilities=ELICITATION)
    _start_slow_run(gateway, session)
    times = _lock_while_calling(session, _postgres_audit_lock(db_url), hold_s=6)
    assert max(times) < 0.5, f"pings waited for the database: {times}"
    assert session.wait_response(700, timeout=30)["error"]["code"] == -32001
    _assert_the_run_ended_at_its_limit(gateway, session)
    assert gateway.chain_ok()
