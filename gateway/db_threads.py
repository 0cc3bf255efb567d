"""Database work off the event loop (issue 12, item 1).

The stores are synchronous (SQLAlchemy Core), and a database call can wait for seconds: a
lock another gateway or a psql session holds, a PostgreSQL server that stopped answering.
On the event loop that wait would freeze everything else the gateway does at the same
time: answering `ping`, copying a run's output under its cap, killing a run at its time
limit. So every database call made while serving goes through `in_db_thread`, which runs
it on one of a few worker threads and leaves the loop free.

The threads are few on purpose (`DB_THREADS`, fewer than SQLAlchemy's pool holds): when
the database is stuck, calls queue here, each bounded by the database's own timeouts
(SQLite's busy timeout, PostgreSQL's lock and statement timeouts, gateway/db.py), instead
of piling up connections. Database work is never abandoned half done nor skipped because
its call is being cancelled: the call sees the cancellation once the work is finished.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import ParamSpec, TypeVar

import anyio
import anyio.to_thread
from anyio.lowlevel import RunVar

DB_THREADS = 4
"""Worker threads for database work, per event loop."""

_P = ParamSpec("_P")
_T = TypeVar("_T")

_limiter: RunVar[anyio.CapacityLimiter] = RunVar("gateway_db_threads")


async def in_db_thread(work: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """`work(*args, **kwargs)` on a database worker thread; its result, or what it raised.

    Shielded from cancellation, as the synchronous call it replaces was: work that records
    what happened (a person's decision, a run's end) is written even when the call is being
    cancelled, and the cancellation reaches the caller at its next checkpoint.
    """
    with anyio.CancelScope(shield=True):
        result = await anyio.to_thread.run_sync(partial(work, *args, **kwargs), limiter=_threads())
    return result


def _threads() -> anyio.CapacityLimiter:
    try:
        return _limiter.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(DB_THREADS)
        _limiter.set(limiter)
        return limiter
