"""The SQLite file a gateway writes must stay the file on disk (issue 12, item 2).

A SQLite connection keeps writing to the file it opened. After `rm gateway.db*` (or a file
moved over it, or a fresh `init` in its place) a serving gateway would go on appending to an
unlinked inode: answered calls whose audit events nobody will ever read, and a chain that a
later `init` restarts from genesis. So the file's identity (st_dev, st_ino) is recorded when
the engine first connects, and before every transaction the path is stat'ed again (about a
microsecond): a missing or different file refuses the transaction, the call fails closed with
-32603 and nothing more runs, and one line on stderr (at most once a minute) tells the operator.

The `-wal` file is watched the same way, per connection: while a connection is open SQLite
never unlinks its own WAL, so a WAL that vanished or changed under an open connection was
deleted by someone else, and the events committed to it but not yet checkpointed are no longer
what another process reads. (A connection that finds no WAL yet records none, and checks once
it has seen one.) On PostgreSQL there is no file to watch.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.exc import SQLAlchemyError

log = logging.getLogger("gateway.db")

LOG_EVERY_S = 60.0
_WAL_KEY = "mcp-write-gateway/wal-identity"


class DatabaseFileChangedError(SQLAlchemyError):
    """The database file at the engine's path is not the one its connections write to.

    A SQLAlchemyError, so every database path already maps it to -32603 (`audit_unavailable`,
    `database_unavailable`) and runs nothing."""


def _identity(path: str) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_dev, stat.st_ino)


def sqlite_file_of(engine: Engine) -> str | None:
    """The absolute path of the engine's database file; None for an in-memory or URI database."""
    database = engine.url.database
    if not database or database == ":memory:" or database.startswith("file:") or engine.url.query.get("uri"):
        return None
    return os.path.abspath(database)


class FileGuard:
    """Refuses transactions once the database file (or an open connection's WAL) was deleted or replaced."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._identity: tuple[int, int] | None = None
        self._lock = threading.Lock()
        self._logged_at: float | None = None

    def on_connect(self, _dbapi_connection: Any, _record: Any) -> None:
        with self._lock:
            if self._identity is None:
                self._identity = _identity(self.path)

    def on_begin(self, connection: Any) -> None:
        expected = self._identity
        if expected is None:
            return  # never connected to a file (cannot happen before a transaction): nothing to compare
        if _identity(self.path) != expected:
            self._refuse("was deleted or replaced")
        wal = _identity(self.path + "-wal")
        seen = connection.info.get(_WAL_KEY)
        if seen is None:
            if wal is not None:
                connection.info[_WAL_KEY] = wal
        elif wal != seen:
            self._refuse("lost its write-ahead log (-wal deleted or replaced)")

    def _refuse(self, what: str) -> None:
        now = time.monotonic()
        with self._lock:
            due = self._logged_at is None or now - self._logged_at >= LOG_EVERY_S
            if due:
                self._logged_at = now
        if due:
            log.error(
                "the database file at %s %s while this gateway was using it: nothing more will run; "
                "restart the gateway (after a deletion, `mcp-gateway init` would start a new audit chain, "
                "not continue this one)",
                self.path,
                what,
            )
        raise DatabaseFileChangedError(f"the database file at {self.path} {what}")


def guard_file(engine: Engine) -> FileGuard | None:
    """Watch a SQLite engine's file (call before any other `begin` listener, so the check comes first)."""
    path = sqlite_file_of(engine)
    if path is None:
        return None
    guard = FileGuard(path)
    event.listen(engine, "connect", guard.on_connect)
    event.listen(engine, "begin", guard.on_begin)
    return guard
