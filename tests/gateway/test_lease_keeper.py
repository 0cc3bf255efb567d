"""gateway/liveness.py `LeaseKeeper` (decision 67): the lease is renewed whatever the calls' database work does.

Before, the renewal was one more job in the database threads' queue: with 80 calls queued behind a
locked row, a live gateway's lease ran out. The keeper renews on a thread and an engine of its own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from sqlalchemy import Engine, select

from gateway import db
from gateway.clock import SystemClock
from gateway.db.threads import DB_THREADS, in_db_thread
from gateway.liveness import LeaseKeeper, SessionStore, this_process


def _alive_until(engine: Engine) -> float | None:
    with engine.connect() as connection:
        value = connection.execute(select(db.gateway_sessions.c.alive_until)).scalar()
    return None if value is None else float(value)


def _wait_for(condition: Callable[[], bool], timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def test_the_lease_is_renewed_while_every_database_thread_is_held(tmp_path: Path) -> None:
    engine = db.make_engine(f"sqlite:///{tmp_path / 'g.db'}")
    db.migrate(engine)
    release = threading.Event()

    async def hold_every_thread() -> None:
        async with anyio.create_task_group() as group:
            for _ in range(DB_THREADS + 4):  # every thread busy, and more work queued behind them
                group.start_soon(in_db_thread, release.wait, 10)

    holder = threading.Thread(target=anyio.run, args=(hold_every_thread,), daemon=True)
    holder.start()
    keeper = LeaseKeeper(db.separate_engine(engine), "s1", this_process(), SystemClock(), period_s=0.1, lease_s=0.3)
    try:
        keeper.start()
        assert _wait_for(lambda: _alive_until(engine) is not None)
        first = _alive_until(engine)
        assert _wait_for(lambda: (_alive_until(engine) or 0) > (first or 0) + 0.2)
    finally:
        keeper.stop()
        release.set()
        holder.join(15)
        engine.dispose()


def test_a_failing_renewal_is_logged_once_and_retried(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """No table to renew in (as a database that is down): one ERROR line, the thread goes on; once the
    table is there the lease is renewed and one line says so."""
    engine = db.make_engine(f"sqlite:///{tmp_path / 'g.db'}")
    keeper = LeaseKeeper(db.separate_engine(engine), "s1", this_process(), SystemClock(), period_s=0.1, lease_s=1)
    try:
        keeper.start()
        assert _wait_for(lambda: any("could not be renewed" in r.getMessage() for r in caplog.records))
        time.sleep(0.5)  # several more failed attempts
        db.migrate(engine)
        assert _wait_for(lambda: SessionStore(engine).fetch(["s1"]) != {})
        assert _wait_for(lambda: any("renewed again" in r.getMessage() for r in caplog.records))
    finally:
        keeper.stop()
        engine.dispose()
    assert sum("could not be renewed" in r.getMessage() for r in caplog.records) == 1
    assert "Traceback" not in caplog.text
