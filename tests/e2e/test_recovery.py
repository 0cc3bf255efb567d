"""What nobody else will close is closed by a live gateway (decision 50), through real `serve` processes.

A run whose end could not be written (the SANDBOX_EXEC insert fails: a trigger stands in for a
disk or database failure) is closed by its own gateway's sweep once the finish grace after its
deadline has passed; a consent question whose gateway was killed (`kill -9` during the
out-of-band wait) is hidden from approvers, cannot be decided, and is closed by another live
gateway's sweep or by the next gateway's start. Each closure leaves its audit events and one
line on stderr. The sweep period is `MCP_GATEWAY_SWEEP_S` in the serve processes' environment.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pexpect
import pytest
from sqlalchemy import select, text

from gateway import db
from gateway.clock import SystemClock
from gateway.consent.store import ConsentStore
from gateway.recovery import SWEEP_ENV, Pace
from tests.e2e.test_run_pytest import ELICITATION, answer
from tests.harness import GatewayHome, StdioSession

SessionFactory = Callable[..., StdioSession]
PERIOD_S = 0.5
SWEEPING = {SWEEP_ENV: str(PERIOD_S)}
RUN_TIMEOUT_S = 4


@pytest.fixture
def home(db_url: str, make_gateway: Callable[..., GatewayHome]) -> GatewayHome:
    """On SQLite and on PostgreSQL (`db_url`): `make_gateway` builds on the test's database."""
    gateway = make_gateway({"consent": {"timeout_s": 60}})
    gateway.add_user("alice", "USER")
    return gateway


def lose_sandbox_exec(gateway: GatewayHome) -> None:
    """From now on the SANDBOX_EXEC insert fails, as a full disk or a failing database would make it."""
    with gateway.engine.begin() as connection:
        if connection.dialect.name == "sqlite":
            connection.execute(
                text(
                    "CREATE TRIGGER lose_sandbox_exec BEFORE INSERT ON audit_events "
                    "WHEN NEW.event_type = 'SANDBOX_EXEC' BEGIN SELECT RAISE(ABORT, 'disk failure'); END"
                )
            )
        else:
            connection.execute(
                text(
                    "CREATE FUNCTION lose_sandbox_exec() RETURNS trigger AS $$ BEGIN "
                    "IF NEW.event_type = 'SANDBOX_EXEC' THEN RAISE EXCEPTION 'disk failure'; END IF; "
                    "RETURN NEW; END $$ LANGUAGE plpgsql"
                )
            )
            connection.execute(
                text(
                    "CREATE TRIGGER lose_sandbox_exec BEFORE INSERT ON audit_events "
                    "FOR EACH ROW EXECUTE FUNCTION lose_sandbox_exec()"
                )
            )


def run_row(gateway: GatewayHome, run_id: str) -> dict[str, Any]:
    with gateway.engine.connect() as connection:
        return dict(connection.execute(select(db.runs).where(db.runs.c.run_id == run_id)).one()._mapping)


def question(gateway: GatewayHome) -> dict[str, Any] | None:
    with gateway.engine.connect() as connection:
        row = connection.execute(select(db.consent_requests)).first()
    return None if row is None else dict(row._mapping)


def status_of_question(gateway: GatewayHome) -> str | None:
    row = question(gateway)
    return None if row is None else str(row["status"])


def charged_ms(gateway: GatewayHome, run_id: str) -> int:
    with gateway.engine.connect() as connection:
        charges = db.budget_charges
        return int(connection.execute(select(charges.c.elapsed_ms).where(charges.c.run_id == run_id)).scalar_one())


def wait_until(condition: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    return condition()


def lines_naming(session: StdioSession, identifier: str) -> list[str]:
    return [line for line in session.stderr_text().splitlines() if identifier in line]


def test_a_run_whose_end_could_not_be_written_is_closed_by_its_own_gateways_sweep(
    home: GatewayHome, open_session: SessionFactory
) -> None:
    session = open_session(home, capabilities=ELICITATION, env=SWEEPING)
    session.responder = answer("allow_once")
    lose_sandbox_exec(home)

    response = session.call_tool("run_pytest", {"test_path": "tests", "timeout_s": RUN_TIMEOUT_S}, home.token("alice"))

    assert response["error"]["code"] == -32603, response
    run_id = response["error"]["data"]["run_id"]
    row = run_row(home, run_id)
    assert row["status"] == "running", "the run ran, but its end was lost"
    closes_at = row["deadline"] + Pace(PERIOD_S).finish_grace_s
    # The sweep closes the row, then records TOOL_FINISHED in its own transaction: wait for both.
    assert wait_until(
        lambda: (
            run_row(home, run_id)["status"] == "abandoned"
            and any(e["event_type"] == "TOOL_FINISHED" for e in home.events_of(run_id))
        ),
        timeout=25,
    ), session.stderr_text()
    assert time.time() >= closes_at - 0.5, "closed before its own gateway's finish grace ran out"
    events = home.events_of(run_id)
    kinds = [e["event_type"] for e in events]
    assert "TOOL_STARTED" in kinds and "SANDBOX_EXEC" not in kinds
    assert [e["detail"] for e in events if e["event_type"] == "TOOL_FINISHED"] == [
        {"status": "abandoned", "reason": "end_not_recorded"}
    ]
    assert 0 < charged_ms(home, run_id) <= RUN_TIMEOUT_S * 1000, "what ran is charged (at most its reservation)"
    assert wait_until(lambda: lines_naming(session, f"run {run_id}"), 5)
    time.sleep(3 * PERIOD_S)  # later sweeps find nothing more to close, or to log
    closures = [line for line in lines_naming(session, run_id) if "closed as abandoned" in line]
    assert len(closures) == 1, session.stderr_text()
    assert home.chain_ok()


def test_a_killed_gateways_question_cannot_be_decided_and_a_live_gateway_closes_it(
    home: GatewayHome, open_session: SessionFactory
) -> None:
    survivor = open_session(home, env=SWEEPING)
    asker = open_session(home, env=SWEEPING)  # declares no elicitation: the question waits for an approver
    asker.send_call("run_pytest", {"test_path": "tests"}, home.token("alice"))
    waiting = wait_until(lambda: question(home), timeout=15)
    assert waiting and waiting["status"] == "pending", waiting

    os.kill(asker.process.pid, signal.SIGKILL)
    asker.process.wait(timeout=10)

    def closed_and_logged() -> bool:
        """The question is closed first, then its events are committed: both, or not yet."""
        logged = any(e["event_type"] == "POLICY_BLOCKED" for e in home.events_of(waiting["id"]))
        return status_of_question(home) == "abandoned" and logged

    closed = wait_until(closed_and_logged, timeout=10)
    assert closed, (question(home), survivor.stderr_text())
    with home.engine.connect() as connection:
        card = connection.execute(select(db.tool_calls).where(db.tool_calls.c.run_id == waiting["id"])).one()
    assert (card.status, card.code, card.reason) == ("error", -32008, "consent_no_answer")  # the console's card too
    store = ConsentStore(home.engine)
    assert not store.decide(waiting["id"], "ALLOW_ONCE", "approvals:test", SystemClock().now())
    assert store.fetch_pending(SystemClock().now()) == []
    events = home.events_of(waiting["id"])
    decisions = [e["detail"] for e in events if e["event_type"] == "mcp.permission.decision"]
    assert len(decisions) == 1
    assert decisions[0]["decision"] == "DENY_ONCE" and decisions[0]["origin"] == "no_answer"
    assert decisions[0]["no_answer"] == "gateway_lost"
    assert [e["detail"] for e in events if e["event_type"] == "POLICY_BLOCKED"] == [
        {"status": "abandoned", "reason": "gateway_lost"}
    ]
    assert wait_until(lambda: lines_naming(survivor, waiting["id"]), 5), "logged once its charge is settled"
    assert charged_ms(home, waiting["id"]) == 0, "it waited for consent: nothing ran, its reservation is given back"
    time.sleep(3 * PERIOD_S)
    assert len(lines_naming(survivor, waiting["id"])) == 1, survivor.stderr_text()
    verify = home.cli("audit", "verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_with_no_gateway_left_the_approver_is_not_shown_the_question_and_the_next_gateway_closes_it(
    home: GatewayHome, open_session: SessionFactory
) -> None:
    asker = open_session(home, env=SWEEPING)
    asker.send_call("run_pytest", {"test_path": "tests"}, home.token("alice"))
    waiting = wait_until(lambda: question(home), timeout=15)
    assert waiting and waiting["status"] == "pending", waiting
    os.kill(asker.process.pid, signal.SIGKILL)
    asker.process.wait(timeout=10)

    # At once, on this machine: the approver sees that the asking process is gone.
    argv = home.cli_argv("approvals")
    approver = pexpect.spawn(argv[0], argv[1:], encoding="utf-8", timeout=30, dimensions=(50, 200))
    try:
        approver.expect("waiting for consent requests")
        assert approver.expect(["consent request", pexpect.TIMEOUT], timeout=2) == 1, approver.before
    finally:
        approver.terminate(force=True)
    # Anywhere, once the asker's lease has run out: the database refuses the decision.
    with home.engine.connect() as connection:
        lease = connection.execute(select(db.gateway_sessions.c.alive_until)).scalars().all()
    time.sleep(max(0.0, max(lease) - time.time()) + 0.1)
    store = ConsentStore(home.engine)
    assert not store.decide(waiting["id"], "ALLOW_ONCE", "approvals:test", SystemClock().now())
    assert status_of_question(home) == "pending", "nothing has closed it yet"

    successor = open_session(home, env=SWEEPING)

    assert wait_until(lambda: status_of_question(home) == "abandoned", timeout=10), successor.stderr_text()
    # The question is marked first; its decision and terminal event are written just after.
    assert wait_until(lambda: len(home.events_of(waiting["id"])) == 3, timeout=10), home.events_of(waiting["id"])
    events = home.events_of(waiting["id"])
    assert [e["event_type"] for e in events] == ["MCP_TOOL_CALL", "mcp.permission.decision", "POLICY_BLOCKED"]
    assert len(lines_naming(successor, waiting["id"])) == 1, successor.stderr_text()
    assert home.chain_ok()
