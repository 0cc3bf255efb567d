"""The statuses of a run, spelled once (gateway/runs.py RunStatus) and stored as before: SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, select

from gateway import db
from gateway.errors import Reason
from gateway.runs import RunRecord, RunStatus, RunStore

SPELLINGS = (
    "running", "ok", "error", "timeout", "output_limit", "memory_limit", "failed", "failed_to_start", "cancelled",
    "abandoned",
)  # fmt: skip
"""As the `runs` table, TOOL_FINISHED's `status` and list_artifacts spell them."""


def test_the_statuses_are_spelled_as_stored() -> None:
    assert tuple(RunStatus) == SPELLINGS


@pytest.mark.parametrize("reason", [Reason.TIMEOUT, Reason.OUTPUT_LIMIT, Reason.MEMORY_LIMIT])
def test_a_run_stopped_for_a_limit_is_stored_as_the_reason_it_was_refused_with(reason: Reason) -> None:
    assert str(RunStatus(reason)) == str(reason)


@pytest.fixture
def runs(engine: Engine, tmp_path: Path) -> RunStore:
    store = RunStore(engine, tmp_path / "artifacts")
    store.insert(RunRecord("r1", "alice", "default", "run_pytest", 0.0, RunStatus.RUNNING, None, 60.0))
    return store


def stored(engine: Engine) -> str:
    with engine.connect() as connection:
        status: str = connection.execute(select(db.runs.c.status).where(db.runs.c.run_id == "r1")).scalar_one()
    return status


def test_a_running_run_is_closed_as_abandoned_once_and_its_late_end_leaves_that(runs: RunStore, engine: Engine) -> None:
    assert stored(engine) == "running"
    assert [run.run_id for run in runs.fetch_running()] == ["r1"]
    assert runs.close("r1")
    assert not runs.close("r1"), "a second sweep finds it closed"
    assert stored(engine) == "abandoned"
    assert runs.fetch_running() == []
    assert not runs.finish("r1", RunStatus.OK, 0), "the sweep's closure stays"
    assert stored(engine) == "abandoned"
    runs.reopen("r1")
    assert stored(engine) == "running"
    assert runs.finish("r1", RunStatus.TIMEOUT, None)
    record = runs.fetch("r1")
    assert record is not None and record.status == "timeout" and type(record.status) is str
