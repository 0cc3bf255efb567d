"""The same gateway on PostgreSQL: migrations, refusals, a run, the audit chain, atomic budget.

Each test has a new PostgreSQL database of its own (`db_url`, tests/pg_cluster.py): the suite's
throwaway cluster, or the server MCP_GATEWAY_TEST_PG_URL names.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from gateway.budget import BudgetLedger
from gateway.calls import CallStore
from gateway.clock import SystemClock
from gateway.db import make_engine
from gateway.errors import BudgetExceededError
from gateway.policy import BudgetPolicy
from tests.e2e.test_run_pytest import ELICITATION, answer
from tests.harness import GatewayHome, StdioSession
from tests.pg_cluster import on_postgres_only
from tests.refusals import assert_blocked_trail, refusal

pytestmark = on_postgres_only


@pytest.fixture
def pg_gateway(db_url: str, make_gateway: Callable[..., GatewayHome]) -> GatewayHome:
    """On the test's own PostgreSQL database (`make_gateway` builds on `db_url`)."""
    gateway = make_gateway()
    gateway.add_user("alice", "USER")
    gateway.add_user("vic", "VIEWER")
    return gateway


def test_refusals_a_run_and_the_chain_on_postgres(
    pg_gateway: GatewayHome, open_session: Callable[..., StdioSession]
) -> None:
    session = open_session(pg_gateway, capabilities=ELICITATION)
    run_id = refusal(session.call_tool("run_pytest", {"test_path": "tests"}, pg_gateway.token("vic")), -32003)
    assert_blocked_trail(pg_gateway, run_id, -32003)
    token = pg_gateway.token("alice")
    assert pg_gateway.cli("token", "revoke", token).returncode == 0
    refusal(session.call_tool("list_artifacts", {}, token), -32001, "token_revoked")
    assert pg_gateway.cli("token", "revoke", token).returncode == 0, "revoking twice is fine"
    session.responder = answer("allow_once")
    result = session.call_tool("run_pytest", {"test_path": "tests"}, pg_gateway.token("alice"))["result"]
    assert result["structuredContent"]["passed"] > 0
    verify = pg_gateway.cli("audit", "verify")
    assert verify.returncode == 0, verify.stdout
    # The web console's cards, written and moved in the calls' audit transactions (gateway/calls.py).
    cards = CallStore(pg_gateway.engine)
    refused = cards.fetch(run_id)
    assert refused is not None and (refused.status, refused.code) == ("error", -32003)
    ran = cards.fetch(result["_meta"]["mcp-write-gateway/run_id"])
    assert ran is not None and ran.status == "done" and ran.code is None and ran.result is not None


def test_budget_reservations_are_atomic_on_postgres(pg_gateway: GatewayHome) -> None:
    ledger = BudgetLedger(pg_gateway.engine, SystemClock())
    limits = BudgetPolicy(window_s=600, attempts_total=5, elapsed_ms_total=10**9)
    granted: list[int] = []
    refused: list[BudgetExceededError] = []
    barrier = threading.Barrier(10)

    def reserve(i: int) -> None:
        barrier.wait()
        try:
            granted.append(ledger.reserve("alice", f"run{i}", limits, 0))
        except BudgetExceededError as exc:
            refused.append(exc)

    threads = [threading.Thread(target=reserve, args=(i,)) for i in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(granted) == 5
    assert len(refused) == 5


def test_elapsed_reservations_are_atomic_on_postgres(pg_gateway: GatewayHome) -> None:
    """The budget reserves the worst case (decision 31): 16 racing 3 s calls on a 2 s budget; one reservation, one run, whatever the race."""
    limits = BudgetPolicy(window_s=600, attempts_total=1000, elapsed_ms_total=2000)
    granted: list[int] = []
    refused: list[str] = []
    barrier = threading.Barrier(16)

    def reserve(i: int) -> None:
        engine = make_engine(pg_gateway.url)  # one engine per "gateway"
        barrier.wait()
        try:
            granted.append(BudgetLedger(engine, SystemClock()).reserve("alice", f"run{i}", limits, 3000))
        except BudgetExceededError as exc:
            refused.append(exc.reason)
        finally:
            engine.dispose()

    threads = [threading.Thread(target=reserve, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(granted) == 1
    assert refused == ["elapsed_exhausted"] * 15
