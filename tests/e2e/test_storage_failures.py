"""Every storage failure is its documented reason (docs/error-codes.md) with one log line, never a traceback.

Before: with the PostgreSQL server stopped, 249 of 253 calls were answered `-32603 internal_error`
with a traceback: `gateway/db/__init__.py` `autocommit_cursor` (a call's authentication and audit appends)
opened its connection outside the error mapping, and the driver's own error went through. A disk
filling while a run's artifacts were copied was `internal_error` with a traceback too.

PostgreSQL stopped: a cluster of the test's own (tests/pg_cluster.py `own_cluster`; the suite's is
shared), with a gateway whose pool is warm and one started while the server is down (its pool
empty); then the server comes back and both answer again. The full disk: the gateway's own
RLIMIT_FSIZE (its run sets its own), so the run's junit.xml cannot be copied: EFBIG, as ENOSPC would.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable

from gateway.db import make_engine
from gateway.runs import RunStore
from tests.e2e.test_run_pytest import ELICITATION, answer
from tests.harness import GatewayHome, StdioSession
from tests.pg_cluster import on_both_engines, own_cluster

SessionFactory = Callable[..., StdioSession]
STORAGE_REASONS = {"database_unavailable", "audit_unavailable"}


def _refused_for_storage(session: StdioSession, token: str, calls: int) -> set[str]:
    reasons = set()
    for _ in range(calls):
        response = session.call_tool("list_artifacts", {}, token, timeout=60)
        assert response.get("error", {}).get("code") == -32603, response
        reasons.add(response["error"]["data"]["reason"])
    return reasons


def _storage_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "ERROR" in line and "_unavailable)" in line]


def test_postgres_stopped_is_database_unavailable_with_a_warm_pool_and_an_empty_one(
    make_gateway: Callable[..., GatewayHome], open_session: SessionFactory
) -> None:
    with own_cluster() as cluster:
        gateway = make_gateway(db_url=cluster.url)
        gateway.add_user("alice", "USER")
        token = gateway.token("alice", ttl_s=3600)
        gateway.engine.dispose()  # the harness's own connections: not in the way of the stop
        warm = open_session(gateway)
        assert "result" in warm.call_tool("list_artifacts", {}, token)  # its pool holds a connection now

        cluster.stop()
        empty = open_session(gateway)  # starts with the server down: its pool never connected
        for session in (warm, empty):
            assert _refused_for_storage(session, token, 12) <= STORAGE_REASONS
            time.sleep(1.2)  # past the idle ping's second: a pooled connection is pinged, and found dead
            assert _refused_for_storage(session, token, 3) <= STORAGE_REASONS
            stderr = session.stderr_text()
            assert "Traceback" not in stderr, stderr
            assert "internal_error" not in stderr, stderr
            assert 1 <= len(_storage_lines(stderr)) <= 2, stderr  # one per place that failed, not per call

        cluster.start()
        for session in (warm, empty):
            deadline = time.monotonic() + 60
            while "result" not in session.call_tool("list_artifacts", {}, token, timeout=60):
                assert time.monotonic() < deadline, "the gateway did not come back with the server"
                time.sleep(0.5)
        assert gateway.chain_ok()
        for session in (warm, empty):
            session.close()
        make_engine(cluster.url).dispose()


BIG_FAILURE = "def test_big():\n    raise AssertionError('x' * 3_000_000)\n"
"""A failure whose message makes pytest's junit.xml about 6 MB."""
FILE_LIMIT = 2 * 1024 * 1024


@on_both_engines
def test_a_full_disk_while_artifacts_are_copied_is_artifacts_unavailable(
    gateway: GatewayHome, open_session: SessionFactory
) -> None:
    (gateway.workspace / "tests" / "test_big.py").write_text(BIG_FAILURE)
    (gateway.workspace / "tests" / "test_big.py").chmod(0o644)
    session = open_session(gateway, capabilities=ELICITATION)
    session.responder = answer("allow_once")
    # The gateway's files (its SQLite database and WAL included) may grow to 2 MB, the junit.xml copy not.
    # The hard limit stays unlimited: the run sets its own (sandbox/backends/rlimits.py).
    resource.prlimit(session.process.pid, resource.RLIMIT_FSIZE, (FILE_LIMIT, resource.RLIM_INFINITY))

    response = session.call_tool("run_pytest", {"test_path": "tests/test_big.py"}, gateway.token("alice"), timeout=120)

    error = response.get("error")
    assert error is not None and error["code"] == -32603, response
    assert error["data"]["reason"] == "artifacts_unavailable", response
    assert "disk" in error["message"]
    run_id = error["data"]["run_id"]
    kinds = [e["event_type"] for e in gateway.events_of(run_id)]
    assert kinds[-1] == "TOOL_FINISHED" and kinds.count("TOOL_FINISHED") == 1, kinds
    assert gateway.events_of(run_id)[-1]["detail"] == {"status": "error", "reason": "artifacts_unavailable"}
    record = RunStore(gateway.engine, gateway.home / "artifacts").fetch(run_id)
    assert record is not None and record.status == "failed"
    stderr = session.stderr_text()
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if "artifacts could not be written" in line]
    assert len(lines) == 1 and "EFBIG" in lines[0], stderr
    # The gateway goes on: a call that writes no big file is answered as ever.
    assert "result" in session.call_tool("list_artifacts", {}, gateway.token("alice"))
    assert gateway.chain_ok()
