"""Database work off the event loop (decision 51), at the cost of one thread hop (decisions 63, 64).

The stores are synchronous (SQLAlchemy Core), and a database call can wait for seconds: a
lock another gateway or a psql session holds, a PostgreSQL server that stopped answering.
On the event loop that wait would freeze everything else the gateway does at the same
time: answering `ping`, copying a run's output under its cap, killing a run at its time
limit. So every database call made while serving goes through `in_db_thread`, which runs
it on one of a few worker threads and leaves the loop free.

The threads are few on purpose (`DB_THREADS` per process, fewer than SQLAlchemy's pool
holds): when the database is stuck, calls queue here instead of piling up connections. Both
waits are bounded (decision 67): work that has not started within the start bound
(`MCP_GATEWAY_DB_WAIT_S`, default 10 s) is not started at all and its caller gets
StorageUnavailableError (`database_unavailable`), and work that started is bounded by the
database's own timeouts (SQLite's busy timeout, PostgreSQL's lock and statement timeouts,
gateway/db/__init__.py). Without the first bound, 60 calls behind a held lock were answered after up to
40 s, and with a holder that never let go each waited `ceil(N/4) x 10 s`. Work that started is
never abandoned half done nor skipped because its call is being cancelled: the call sees the
cancellation once the work is finished. A SQLAlchemy or driver error that escapes the work is
translated here as any store does (gateway/db/errors.py), so no database failure reaches a
client as `internal_error`.

The gateway's lease is not renewed here but on a thread and a connection of its own
(gateway/liveness.py `LeaseKeeper`): however long calls queue, the lease does not wait behind them.

A hop is the gateway's dearest step after the database itself: on this project's 2-CPU VM,
anyio's `to_thread.run_sync` cost 220-370 us of CPU per hop, a sixth of a cheap call
(decision 64). Most of that is the way back: the worker wakes the loop through its
self-pipe, and the loop's iteration and anyio's bookkeeping follow. Here the calling thread
first waits for the work itself, up to `LOOP_WAIT_S`, on a lock the worker releases; most
database work (a call's authentication and audit append) ends within it, and the loop
carries on as if the work had been a plain call. Only longer work makes the caller yield to
the loop, which then runs everything else until the worker hands the result back. The loop
is therefore never held more than `LOOP_WAIT_S` by any database work, however long it waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, ParamSpec, TypeVar

import anyio

from gateway.db.errors import storage_errors
from gateway.errors import Reason, StorageUnavailableError
from gateway.logs import RATE_KEY

log = logging.getLogger("gateway.db")

DB_THREADS = 4
"""Worker threads for database work, per process."""

LOOP_WAIT_S = 0.005
"""How long the event loop's thread waits for database work before yielding to the loop."""

START_WAIT_ENV = "MCP_GATEWAY_DB_WAIT_S"
"""Seconds database work may wait for a database thread before it is refused; default DEFAULT_START_WAIT_S."""
DEFAULT_START_WAIT_S = 10.0
_start_wait_s = DEFAULT_START_WAIT_S


def start_wait_from(environ: Mapping[str, str]) -> float:
    """The start bound `environ` asks for (START_WAIT_ENV), or the default with a warning when it is not a number
    of seconds between 0 and 600."""
    text = environ.get(START_WAIT_ENV, "").strip()
    if not text:
        return DEFAULT_START_WAIT_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds <= 600:
        log.warning("%s must be seconds between 0 and 600; using %s", START_WAIT_ENV, DEFAULT_START_WAIT_S)
        return DEFAULT_START_WAIT_S
    return seconds


def set_start_wait(seconds: float) -> None:
    """Set the start bound for this process (`serve` does, from its environment)."""
    global _start_wait_s  # noqa: PLW0603
    _start_wait_s = seconds


def _not_started(waited_s: float) -> StorageUnavailableError:
    log.error(
        "database work waited %.1f s for a database thread (all %d busy: the database is locked or slow) and was "
        "refused (database_unavailable); the bound is %s",
        waited_s,
        DB_THREADS,
        START_WAIT_ENV,
        extra={RATE_KEY: ("not_started",)},
    )
    return StorageUnavailableError(
        Reason.DATABASE_UNAVAILABLE, "the gateway's database is busy or locked: the call could not start; nothing ran"
    )


_P = ParamSpec("_P")
_T = TypeVar("_T")


class _Job:
    """One piece of database work, its outcome, and how its caller is told."""

    __slots__ = (
        "context",
        "done",
        "dropped",
        "error",
        "guard",
        "loop",
        "queued_at",
        "result",
        "settled",
        "started",
        "waiter",
        "work",
    )

    def __init__(self, work: Callable[[], Any], loop: asyncio.AbstractEventLoop) -> None:
        self.work = work
        self.context = contextvars.copy_context()
        self.loop = loop
        self.queued_at = time.monotonic()
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = False
        self.started = False
        self.dropped = False
        """Set by a caller whose start bound passed first: the worker then skips the work."""
        self.waiter: asyncio.Future[None] | None = None
        """Set by a caller that stopped waiting on `settled`: the worker then wakes it through the loop."""
        self.guard = threading.Lock()
        self.settled = threading.Lock()
        self.settled.acquire()  # released by the worker when the caller waits on the thread

    def run(self) -> None:
        """On a worker thread."""
        with self.guard:
            if self.dropped:
                return  # its caller was refused already: nobody waits for it
            self.started = True
        try:
            with storage_errors("database work failed", log=log):
                self.result = self.context.run(self.work)
        except BaseException as exc:  # handed to the caller, who raises it
            self.error = exc
        with self.guard:
            self.done = True
            waiter = self.waiter
        if waiter is None:
            self.settled.release()
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
            self.loop.call_soon_threadsafe(_wake, waiter)

    async def outcome(self, start_wait_s: float) -> Any:
        """On the event loop's thread: wait (on the thread, then on the loop), then return or raise.

        StorageUnavailableError when no thread took the work within `start_wait_s` of its queueing
        (it then never runs)."""
        if not self.settled.acquire(timeout=LOOP_WAIT_S):
            with self.guard:
                if not self.done:
                    self.waiter = self.loop.create_future()
            if self.waiter is not None:
                with anyio.CancelScope(shield=True):
                    with anyio.move_on_after(self.queued_at + start_wait_s - time.monotonic()):
                        await asyncio.shield(self.waiter)
                    if not self.waiter.done():
                        with self.guard:
                            self.dropped = not self.started
                        if self.dropped:
                            raise _not_started(time.monotonic() - self.queued_at)
                        await self.waiter  # it started: the database's own timeouts bound it
        if self.error is not None:
            error, self.error = self.error, None
            try:
                raise error
            finally:
                del error
        return self.result


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class _Worker:
    """A database thread's mailbox: the job it is given, and the eventfd it waits on for it.

    An eventfd rather than a lock: `os.eventfd_write` lets go of the GIL for its system call, so
    a worker the kernel runs at once on the caller's CPU can take the GIL and start, where a
    lock's release wakes it while the caller, now off the CPU, still holds the GIL. Side by
    side with 8 gateways on PostgreSQL: 2-5% more calls/s, a tenth fewer context switches."""

    __slots__ = ("job", "wake")

    def __init__(self) -> None:
        self.job: _Job | None = None
        self.wake = os.eventfd(0, os.EFD_CLOEXEC)


class _Workers:
    """Up to `DB_THREADS` daemon threads, started as work needs them and kept.

    The thread that went idle last takes the next job, as anyio's do: one call after another
    lands on the same thread, whose caches (and CPU) are warm. Work that finds every thread
    busy waits in `_backlog`, taken in order by the thread that finishes first.
    """

    def __init__(self, size: int) -> None:
        self.pid = os.getpid()
        self._size = size
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._backlog: deque[_Job] = deque()
        self._started = 0

    def put(self, job: _Job) -> None:
        with self._lock:
            if self._idle:
                worker = self._idle.pop()
            elif self._started < self._size:
                self._started += 1
                worker = None
            else:
                self._backlog.append(job)
                return
        if worker is None:
            worker = _Worker()
            worker.job = job
            os.eventfd_write(worker.wake, 1)
            threading.Thread(
                target=self._serve, args=(worker,), name=f"gateway-db-{self._started}", daemon=True
            ).start()
        else:
            worker.job = job
            os.eventfd_write(worker.wake, 1)

    def _serve(self, worker: _Worker) -> None:
        while True:
            os.eventfd_read(worker.wake)
            job, worker.job = worker.job, None
            while job is not None:
                job.run()
                with self._lock:
                    job = self._backlog.popleft() if self._backlog else None
                    if job is None:
                        self._idle.append(worker)


_workers = _Workers(DB_THREADS)


def _here() -> _Workers:
    """This process's workers: a forked child has none of its parent's threads, so it starts its own.
    (Checked here rather than by an at-fork hook, which would also run in every sandbox child.)"""
    global _workers  # noqa: PLW0603
    if _workers.pid != os.getpid():
        _workers = _Workers(DB_THREADS)
    return _workers


async def in_db_thread(work: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """`work(*args, **kwargs)` on a database worker thread; its result, or what it raised.

    Shielded from cancellation, as the synchronous call it replaces was: work that records
    what happened (a person's decision, a run's end) is written even when the call is being
    cancelled, and the cancellation reaches the caller at its next checkpoint. Work that ends
    within `LOOP_WAIT_S` returns without a trip through the event loop (the module's docstring).
    Work no thread took within the start bound is never run: StorageUnavailableError
    (`database_unavailable`), as is a SQLAlchemy or driver error the work let out.
    """
    job = _Job(partial(work, *args, **kwargs), asyncio.get_running_loop())
    _here().put(job)
    result: _T = await job.outcome(_start_wait_s)
    return result
