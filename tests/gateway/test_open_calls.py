"""The sweep closes every call a dead gateway left open, exactly once (decision 69): SQLite and PostgreSQL.

Each kind of open call a gateway can leave (waiting before anything ran, its tool running with or
without a run record, its run still on, its out-of-band question still pending) against each kind
of gateway (dead here, alive, alive with its lease out, gone or live on another host, unknown):
the sweep (gateway/recovery.py `sweep_once`, on real stores) writes one terminal event per call a
dead gateway left, and touches nothing else; sweeps after it, and two at once, write no second one.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, insert, select

from gateway import db
from gateway.audit import EventDraft, EventType
from gateway.budget import BudgetLedger
from gateway.calls import CardStatus, Moved, Opened
from gateway.consent.store import PendingRequest
from gateway.liveness import ProcessIdentity
from gateway.policy import BudgetPolicy
from gateway.recovery import Pace, sweep_once
from gateway.runs import RunRecord
from gateway.services import Stores, open_stores
from gateway.settings import Settings
from tests.fakes import FakeClock

HERE = ProcessIdentity("host-a", "boot-1", "ns-1", 100, "5000")
ELSEWHERE = ProcessIdentity("host-b", "boot-2", "ns-2", 7, "42")
PACE = Pace(10.0)
LIMIT_MS = 60_000
BUDGET = BudgetPolicy(attempts_total=100, elapsed_ms_total=100 * LIMIT_MS)
ALIVE_PIDS = {1: "11", 2: "22"}  # pid 1 is `alive`, pid 2 `lease_out_alive`; every other pid is dead


def identity(pid: int) -> ProcessIdentity:
    return ProcessIdentity("host-a", "boot-1", "ns-1", pid, str(pid * 11))


SESSIONS: dict[str, tuple[ProcessIdentity, float]] = {
    # name: (identity, lease left in seconds)
    "dead": (identity(3), 60.0),
    "alive": (identity(1), 60.0),
    "lease_out_alive": (identity(2), -5.0),
    "elsewhere_gone": (ELSEWHERE, -5.0),
    "elsewhere_live": (ProcessIdentity("host-c", "boot-3", "ns-3", 9, "99"), 60.0),
}


@pytest.fixture
def stores(engine: Engine, tmp_path: Path) -> Stores:
    clock = FakeClock()
    made = open_stores(Settings(tmp_path, "unused", tmp_path / "policy.yaml"), clock, engine=engine)
    now = clock.now()
    with engine.begin() as connection:
        for name, (who, lease) in SESSIONS.items():
            connection.execute(
                insert(db.gateway_sessions).values(
                    session_id=name,
                    host=who.host,
                    boot_id=who.boot_id,
                    pid_namespace=who.pid_namespace,
                    pid=who.pid,
                    pid_started=who.pid_started,
                    started_at=now - 100,
                    alive_until=now + lease,
                )
            )
    made.users.add("alice", "USER", ("default",))
    return made


def open_call(stores: Stores, run_id: str, session: str | None, status: str = "pending") -> None:
    """The entry event and the card's first row, one commit, and the budget reservation, as a call makes them."""
    now = stores.clock.now()
    card = Opened(
        run_id, "alice", "default", "mcp-write-gateway", "run_pytest", {}, CardStatus.PENDING, now, session_id=session
    )
    stores.audit.append(EventDraft(EventType.MCP_TOOL_CALL, run_id=run_id, user="alice"), along=[card])
    stores.budget.reserve("alice", run_id, BUDGET, LIMIT_MS)
    if status == "running":
        stores.audit.append(
            EventDraft(EventType.TOOL_STARTED, run_id=run_id, user="alice"),
            along=[Moved(run_id, CardStatus.RUNNING, now)],
        )


def with_run(stores: Stores, run_id: str, session: str, status: str) -> None:
    now = stores.clock.now()
    stores.runs.insert(RunRecord(run_id, "alice", "default", "run_pytest", now - 2, status, None, now + 65, session))
    if status != "running":
        stores.budget.settle(_charge_id(stores, run_id), 1234)  # the run ended and its gateway settled it


def with_question(stores: Stores, run_id: str, session: str) -> None:
    now = stores.clock.now()
    stores.consent_store.insert_request(
        PendingRequest(
            run_id,
            now,
            now + 300,
            session,
            "alice",
            "default",
            "mcp-write-gateway",
            "run_pytest",
            "h",
            "{}",
            "high",
            True,
        )
    )


def _charge_id(stores: Stores, run_id: str) -> int:
    with stores.engine.connect() as connection:
        charges = db.budget_charges
        return int(connection.execute(select(charges.c.id).where(charges.c.run_id == run_id)).scalar_one())


def charged(stores: Stores, run_id: str) -> int:
    with stores.engine.connect() as connection:
        charges = db.budget_charges
        return int(connection.execute(select(charges.c.elapsed_ms).where(charges.c.run_id == run_id)).scalar_one())


def trail(stores: Stores, run_id: str) -> list[tuple[str, Any]]:
    return [(e.event_type, e.detail) for e in stores.audit.events(run_id=run_id)]


def card(stores: Stores, run_id: str) -> tuple[str, str | None]:
    with stores.engine.connect() as connection:
        t = db.tool_calls
        row = connection.execute(select(t.c.status, t.c.reason).where(t.c.run_id == run_id)).one()
    return row.status, row.reason


def sweep(stores: Stores) -> None:
    sweep_once(stores, PACE, HERE, ALIVE_PIDS.get)


ABANDONED = {"status": "abandoned", "reason": "gateway_lost"}


def test_every_call_a_dead_gateway_left_gets_one_terminal_event_and_nothing_else_is_touched(stores: Stores) -> None:
    open_call(stores, "waiting", "dead")  # at an in-band question, the budget or the sandbox's start
    open_call(stores, "ended_unlogged", "dead", "running")  # its run ended; its gateway died before TOOL_FINISHED
    with_run(stores, "ended_unlogged", "dead", "passed")
    open_call(stores, "running", "dead", "running")  # its run was on when its gateway died
    with_run(stores, "running", "dead", "running")
    open_call(stores, "asked", "dead")  # its out-of-band question still pending
    with_question(stores, "asked", "dead")
    open_call(stores, "elsewhere", "elsewhere_gone")  # another host's gateway whose lease ran out
    for kept in ("alive", "lease_out_alive", "elsewhere_live"):
        open_call(stores, kept, kept)
    open_call(stores, "unknown", "nobody_knows_it")
    open_call(stores, "before_0009", None)

    sweep(stores)

    blocked, finished = (EventType.POLICY_BLOCKED, ABANDONED), (EventType.TOOL_FINISHED, ABANDONED)
    assert trail(stores, "waiting")[1:] == [blocked]
    assert card(stores, "waiting") == ("error", "gateway_lost")
    assert charged(stores, "waiting") == 0, "nothing ran"
    assert trail(stores, "ended_unlogged")[2:] == [finished]
    assert charged(stores, "ended_unlogged") == 1234, "its gateway settled the run's charge: kept"
    assert trail(stores, "running")[2:] == [finished], "closed by the run's closure, once"
    assert card(stores, "running") == ("error", "gateway_lost")
    assert charged(stores, "running") < LIMIT_MS, "charged what ran, not the time limit"
    asked = trail(stores, "asked")[1:]
    assert [kind for kind, _ in asked] == [EventType.PERMISSION_DECISION, EventType.POLICY_BLOCKED]
    assert trail(stores, "elsewhere")[1:] == [blocked]
    for kept in ("alive", "lease_out_alive", "elsewhere_live", "unknown", "before_0009"):
        assert len(trail(stores, kept)) == 1 and card(stores, kept) == ("pending", None), kept
        assert charged(stores, kept) == LIMIT_MS, kept

    before = {run_id: trail(stores, run_id) for run_id in ("waiting", "ended_unlogged", "running", "asked")}
    sweep(stores)
    assert {run_id: trail(stores, run_id) for run_id in before} == before, "a later sweep writes nothing more"
    assert stores.audit.verify().ok


def test_two_sweeps_at_once_close_each_call_once(stores: Stores) -> None:
    for index in range(20):
        open_call(stores, f"call-{index}", "dead", "running" if index % 2 else "pending")
    failures: list[BaseException] = []

    def sweeper() -> None:
        try:
            sweep(stores)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=sweeper) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert failures == []
    for index in range(20):
        ends = [kind for kind, _ in trail(stores, f"call-{index}")[1:] if kind != EventType.TOOL_STARTED]
        assert len(ends) == 1, (index, ends)
    assert stores.audit.verify().ok


class _LedgerFailingFor(BudgetLedger):
    """The real ledger, but settling one call's charge fails as a bug would (not a database error)."""

    def __init__(self, stores: Stores, failing: str) -> None:
        super().__init__(stores.engine, stores.clock)
        self._failing = failing

    def settle_unrun(self, run_id: str) -> None:
        if run_id == self._failing:
            raise RuntimeError("a bug")
        super().settle_unrun(run_id)


def test_one_closure_failing_keeps_no_other_from_closing_and_the_sweep_says_so(stores: Stores) -> None:
    for run_id in ("first", "poison", "last"):
        open_call(stores, run_id, "dead")
    failing = dataclasses.replace(stores, budget=_LedgerFailingFor(stores, "poison"))
    with pytest.raises(RuntimeError):
        sweep(failing)
    assert [charged(stores, run_id) for run_id in ("first", "poison", "last")] == [0, LIMIT_MS, 0]
    assert all(card(stores, run_id) == ("error", "gateway_lost") for run_id in ("first", "last"))
    sweep(stores)  # the next tick: nothing fails, nothing is closed twice
    assert all(len(trail(stores, run_id)) == 2 for run_id in ("first", "poison", "last"))
