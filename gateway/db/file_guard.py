"""The SQLite file a gateway writes must stay the file on disk (decision 45).

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

The files must also stay writable (docs/operations.md, "The database's side files"). SQLite
memory-maps the `-shm` index: once that file is made immutable (`chattr +i`) or truncated under an
open connection, the next access to the mapping kills the process with SIGBUS, with no log line and no audit event for the calls
in flight. So before every connection's first statement and every transaction the guard reads
the immutable and append-only attributes of the database, `-wal` and `-shm` (a statx each), and
checks that `-shm` has not shrunk under the connection. A file found unwritable refuses the
transaction (-32603, nothing runs), is logged once, and calls `on_unwritable`: `serve` then stops
the gateway, since one more touch of the mapping could kill it. An unwritable `-wal` or database
file does not crash SQLite but refuses writes or checkpoints from then on, so it stops the gateway
the same way. (A change in the microseconds between the check and SQLite's access still kills
the process; `serve` enables `faulthandler`, so that death at least names the signal.)
"""

from __future__ import annotations

import functools
import logging
import os
import struct
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, cast

from sqlalchemy import Engine, event
from sqlalchemy.exc import SQLAlchemyError

log = logging.getLogger("gateway.db")

LOG_EVERY_S = 60.0
_WAL_KEY = "mcp-write-gateway/wal-identity"
SIDE_FILES = ("", "-wal", "-shm")
"""Suffixes of the files SQLite writes in WAL mode: the database, its log and the log's index."""

_AT_FDCWD = -100
_STATX_SIZE = 256  # struct statx: stx_attributes at offset 8, stx_attributes_mask at 0x38
_STATX_ATTR_IMMUTABLE = 0x10
_STATX_ATTR_APPEND = 0x20
_TRUNCATED = "truncated while in use"


class DatabaseFileChangedError(SQLAlchemyError):
    """The database file at the engine's path is not the one its connections write to.

    A SQLAlchemyError, so every database path already maps it to -32603 (`audit_unavailable`,
    `database_unavailable`) and runs nothing."""


class DatabaseFileUnwritableError(SQLAlchemyError):
    """The database, its `-wal` or its `-shm` cannot be written (immutable, append-only, `-shm` truncated).

    A SQLAlchemyError too, so the call that found it fails with -32603 and runs nothing."""


def write_blocker(path: str) -> str | None:
    """Why `path` cannot be written whatever its permissions ("immutable", "append-only"), or None.

    None too when the file is missing or the system cannot say. Read with statx(2) by path: opening
    and closing a descriptor of a file SQLite has open would drop this process's POSIX locks on it."""
    found = _statx(os.fsencode(path))
    if found is None:
        return None
    attributes, supported = struct.unpack_from("Q", found, 8)[0], struct.unpack_from("Q", found, 0x38)[0]
    if attributes & supported & _STATX_ATTR_IMMUTABLE:
        return "immutable"
    if attributes & supported & _STATX_ATTR_APPEND:
        return "append-only"
    return None


def _statx(path: bytes) -> bytes | None:
    """The raw `struct statx` of `path`, or None (not Linux, no glibc wrapper, or the call failed)."""
    function = _statx_function()
    if function is None:
        return None
    import ctypes  # noqa: PLC0415  (only once a database is opened: keeps `--help` fast, decision 48)

    buffer = ctypes.create_string_buffer(_STATX_SIZE)
    if function(_AT_FDCWD, path, 0, 0, buffer) != 0:
        return None
    return buffer.raw


@functools.cache
def _statx_function() -> Callable[..., int] | None:
    """glibc's statx(2) wrapper (Linux, glibc 2.28+), or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # noqa: PLC0415  (see _statx)

    try:
        function = ctypes.CDLL(None, use_errno=True).statx
    except (AttributeError, OSError):
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_char_p)
    function.restype = ctypes.c_int
    return cast("Callable[..., int]", function)


def _size(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except OSError:
        return None


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
        self._told_unwritable = False
        self._open = 0  # connections of this engine open now: while any is, SQLite maps the -shm
        self._shm_size = 0  # the largest -shm seen while one was open; it never shrinks under one
        self.on_unwritable: Callable[[], None] | None = None
        """Called (from whichever thread found it) each time a file is found unwritable; `serve` stops."""

    def on_connect(self, _dbapi_connection: Any, _record: Any) -> None:
        # Before SQLite's first statement on this connection maps the -shm (gateway/db/__init__.py registers
        # this listener ahead of the pragmas).
        self.check_writable()
        self._check_shm_size()
        with self._lock:
            self._open += 1
            if self._identity is None:
                self._identity = _identity(self.path)

    def on_close(self, _dbapi_connection: Any, _record: Any = None) -> None:
        with self._lock:
            self._open = max(0, self._open - 1)
            if self._open == 0:
                self._shm_size = 0  # the last close may remove the -shm; a new one starts small

    def on_begin(self, connection: Any) -> None:
        expected = self._identity
        if expected is None:
            return  # never connected to a file (cannot happen before a transaction): nothing to compare
        if _identity(self.path) != expected:
            self._refuse("was deleted or replaced")
        self.check_writable()
        self._check_shm_size()
        wal = _identity(self.path + "-wal")
        seen = connection.info.get(_WAL_KEY)
        if seen is None:
            if wal is not None:
                connection.info[_WAL_KEY] = wal
        elif wal != seen:
            self._refuse("lost its write-ahead log (-wal deleted or replaced)")

    def check_writable(self) -> None:
        """Raise DatabaseFileUnwritableError if the database, `-wal` or `-shm` has an attribute that forbids writes."""
        for suffix in SIDE_FILES:
            blocker = write_blocker(self.path + suffix)
            if blocker is not None:
                self._unwritable(suffix, blocker)

    def _check_shm_size(self) -> None:
        # SQLite itself shrinks the -shm only when no connection has it open; a smaller one under
        # an open connection was truncated by someone else, and touching the mapping past its new
        # end raises SIGBUS.
        size = _size(self.path + "-shm")
        with self._lock:
            shrunk = self._open > 0 and size is not None and size < self._shm_size
            if self._open > 0 and size is not None:
                self._shm_size = max(self._shm_size, size)
        if shrunk:
            self._unwritable("-shm", _TRUNCATED)

    def _unwritable(self, suffix: str, why: str) -> None:
        path = self.path + suffix
        with self._lock:
            told, self._told_unwritable = self._told_unwritable, True
        if not told:
            remedy = (
                "make sure nothing truncates it"
                if suffix == "-shm" and why == _TRUNCATED
                else f"run `chattr -i -a {path}`"
            )
            log.error(
                "%s cannot be written (%s): the gateway stops, as SQLite would fail or crash (SIGBUS) on its next "
                "write; %s and start the gateway again",
                path,
                why,
                remedy,
            )
        if self.on_unwritable is not None:
            self.on_unwritable()
        raise DatabaseFileUnwritableError(f"{path} cannot be written ({why})")

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


_guards: weakref.WeakKeyDictionary[Engine, FileGuard] = weakref.WeakKeyDictionary()


def guard_file(engine: Engine) -> FileGuard | None:
    """Watch a SQLite engine's file (call before any other `connect` or `begin` listener, so the check comes first)."""
    path = sqlite_file_of(engine)
    if path is None:
        return None
    guard = FileGuard(path)
    event.listen(engine, "connect", guard.on_connect)
    event.listen(engine, "close", guard.on_close)
    event.listen(engine, "close_detached", guard.on_close)
    event.listen(engine, "begin", guard.on_begin)
    _guards[engine] = guard
    return guard


def guard_of(engine: Engine) -> FileGuard | None:
    """The guard `guard_file` put on `engine`, or None (PostgreSQL, in-memory SQLite)."""
    return _guards.get(engine)
