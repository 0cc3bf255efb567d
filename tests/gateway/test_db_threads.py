"""gateway/db/threads.py: database work on a few threads, the loop never held longer than LOOP_WAIT_S."""

from __future__ import annotations

import contextvars
import itertools
import os
import signal
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from sqlalchemy.exc import OperationalError

from gateway.db import threads as db_threads
from gateway.db.threads import DB_THREADS, LOOP_WAIT_S, in_db_thread, start_wait_from
from gateway.errors import Reason, StorageUnavailableError

REQUEST = contextvars.ContextVar("request", default="none")


def test_the_result_or_the_error_comes_back_from_another_thread() -> None:
    async def main() -> tuple[int, int, int]:
        here = threading.get_ident()
        where = await in_db_thread(threading.get_ident)
        total = await in_db_thread(sum, [1, 2, 3])
        return here, where, total

    here, where, total = anyio.run(main)
    assert where != here
    assert total == 6

    def broken(name: str) -> None:
        raise LookupError(f"no user {name}")

    async def fails() -> None:
        await in_db_thread(broken, "vic")

    with pytest.raises(LookupError, match="no user vic") as raised:
        anyio.run(fails)
    assert "broken" in {frame.name for frame in raised.traceback}, "the work's own frames stay in the traceback"


def test_the_work_sees_the_callers_context() -> None:
    async def main() -> str:
        REQUEST.set("call 7")
        return await in_db_thread(REQUEST.get)

    assert anyio.run(main) == "call 7"


def test_long_work_leaves_the_loop_free() -> None:
    """A database wait (here 0.4 s) must not stop the loop: it answers pings and ends runs meanwhile."""
    ticks: list[float] = []

    async def ticker() -> None:
        while True:
            ticks.append(time.monotonic())
            await anyio.sleep(0.01)

    async def main() -> tuple[float, float]:
        async with anyio.create_task_group() as group:
            group.start_soon(ticker)
            await anyio.sleep(0.05)
            began = time.monotonic()
            await in_db_thread(time.sleep, 0.4)
            ended = time.monotonic()
            group.cancel_scope.cancel()
        return began, ended

    began, ended = anyio.run(main)
    during = [t for t in ticks if began <= t <= ended]
    assert len(during) >= 15, f"the loop ran {len(during)} times in {ended - began:.2f} s"
    gaps = [b - a for a, b in itertools.pairwise(during)]
    assert max(gaps) < LOOP_WAIT_S + 0.1, gaps


def test_quick_work_returns_without_a_trip_through_the_loop() -> None:
    """Work that ends within LOOP_WAIT_S comes back before any other task runs: the hop's way back
    through the loop (a self-pipe write, a wake-up, an iteration) is skipped. Asserted over 50
    tries, since a busy machine may not run the thread within LOOP_WAIT_S every time."""

    async def main() -> int:
        skipped = 0
        for _ in range(50):
            others: list[int] = []

            async def other(seen: list[int] = others) -> None:
                seen.append(1)

            async with anyio.create_task_group() as group:
                group.start_soon(other)  # runs at this task's next trip through the loop
                await in_db_thread(int, "5")
                skipped += not others
        return skipped

    assert anyio.run(main) >= 25


def test_at_most_db_threads_at_once_and_none_lost() -> None:
    lock = threading.Lock()
    running = [0]
    most = [0]

    def work(index: int) -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return index * index

    results: dict[int, int] = {}

    async def one(index: int) -> None:
        results[index] = await in_db_thread(work, index)

    async def main() -> None:
        async with anyio.create_task_group() as group:
            for index in range(3 * DB_THREADS):
                group.start_soon(one, index)

    anyio.run(main)
    assert most[0] == DB_THREADS
    assert results == {i: i * i for i in range(3 * DB_THREADS)}


def test_a_cancelled_call_still_finishes_its_work_then_sees_the_cancellation() -> None:
    written: list[str] = []
    after: list[Any] = []

    def record() -> str:
        time.sleep(0.2)
        written.append("decision")
        return "stored"

    async def main() -> bool:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as group:
                group.start_soon(_cancel_after, scope, 0.05)
                after.append(await in_db_thread(record))
                await anyio.sleep(5)  # the next checkpoint: cancelled here
                after.append("not reached")
        return scope.cancelled_caught

    assert anyio.run(main)
    assert written == ["decision"]
    assert after == ["stored"]


async def _cancel_after(scope: anyio.CancelScope, delay_s: float) -> None:
    await anyio.sleep(delay_s)
    scope.cancel()


def test_a_forked_child_starts_threads_of_its_own() -> None:
    """After fork only the forking thread exists: the child's first job must not wait for the
    parent's workers."""

    async def answer() -> int:
        return await in_db_thread(int, "7")

    assert anyio.run(answer) == 7  # the parent's workers are started
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Python 3.12+: fork with threads running
        pid = os.fork()
    if pid == 0:  # pragma: no cover  (the child)
        code = 1
        try:
            signal.alarm(10)  # a hang ends the child
            code = 0 if anyio.run(answer) == 7 else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 20
    while (done := os.waitpid(pid, os.WNOHANG)) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child's database work never ran")
        time.sleep(0.02)
    assert os.waitstatus_to_exitcode(done[1]) == 0


@pytest.fixture
def start_wait_s() -> Iterator[float]:
    """A start bound of 0.5 s for the test, the default again after it."""
    db_threads.set_start_wait(0.5)
    yield 0.5
    db_threads.set_start_wait(db_threads.DEFAULT_START_WAIT_S)


def test_work_no_thread_takes_within_the_bound_is_refused_and_never_runs(start_wait_s: float) -> None:
    """With every thread held (a lock another connection holds), work queued behind them
    waited without bound: 60 calls, the last answered after 40 s. Now it is refused at the bound,
    `database_unavailable`, and skipped when a thread comes free; the held work still finishes."""
    release = threading.Event()
    ran: list[int] = []

    def held(index: int) -> int:
        release.wait(10)
        return index

    def queued(index: int) -> None:
        ran.append(index)

    outcomes: dict[int, object] = {}

    async def call(index: int, work: Any) -> None:
        started = time.monotonic()
        try:
            outcomes[index] = await in_db_thread(work, index)
        except StorageUnavailableError as exc:
            outcomes[index] = (exc.reason, round(time.monotonic() - started, 1))

    async def main() -> None:
        with anyio.fail_after(30):
            await calls()

    async def calls() -> None:
        async with anyio.create_task_group() as group:
            for index in range(DB_THREADS):
                group.start_soon(call, index, held)
            await anyio.sleep(0.1)  # every thread has its held work
            for index in range(DB_THREADS, 3 * DB_THREADS):
                group.start_soon(call, index, queued)
            while len(outcomes) < 2 * DB_THREADS:  # every queued call answered (refused, or not) while held
                await anyio.sleep(0.01)
            release.set()

    anyio.run(main)
    assert {outcomes[i] for i in range(DB_THREADS)} == set(range(DB_THREADS))
    refused = [outcomes[i] for i in range(DB_THREADS, 3 * DB_THREADS)]
    assert all(isinstance(o, tuple) and o[0] == Reason.DATABASE_UNAVAILABLE for o in refused), refused
    assert all(start_wait_s - 0.05 <= o[1] <= start_wait_s + 0.5 for o in refused if isinstance(o, tuple)), refused
    time.sleep(0.3)  # the threads, free now, pass over the refused work
    assert ran == []


def test_work_that_started_is_bounded_by_the_database_not_the_start_bound(start_wait_s: float) -> None:
    """Variant: the bound is on starting. Work that runs past it (a statement waiting for a lock, which
    the database's own timeout ends) is waited for and its result returned."""

    def slow() -> str:
        time.sleep(start_wait_s + 0.5)
        return "written"

    async def main() -> str:
        return await in_db_thread(slow)

    assert anyio.run(main) == "written"


def test_a_database_error_the_work_lets_out_is_a_storage_refusal() -> None:
    """A SQLAlchemy or driver error that no store translated (a connection
    opened outside `storage_errors`) reaches the caller as `database_unavailable`, not internal_error."""
    import sqlite3

    def from_sqlalchemy() -> None:
        raise OperationalError("SELECT 1", {}, sqlite3.OperationalError("unable to open database file"))

    def from_the_driver() -> None:
        raise sqlite3.OperationalError("disk I/O error")

    for work in (from_sqlalchemy, from_the_driver):

        async def main(work: Any = work) -> None:
            await in_db_thread(work)

        with pytest.raises(StorageUnavailableError) as raised:
            anyio.run(main)
        assert raised.value.reason == Reason.DATABASE_UNAVAILABLE


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("", 10.0), ("2.5", 2.5), ("600", 600.0), ("0", 10.0), ("-1", 10.0), ("601", 10.0), ("soon", 10.0), ("nan", 10.0)],
)
def test_the_start_bound_from_the_environment(value: str, seconds: float) -> None:
    assert start_wait_from({"MCP_GATEWAY_DB_WAIT_S": value}) == seconds
