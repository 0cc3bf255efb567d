"""gateway/db/file_guard.py: a transaction on a SQLite file that was deleted or replaced is refused."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError

from gateway.db import make_engine, sqlite_read_cursor, sqlite_write_cursor
from gateway.db.file_guard import DatabaseFileChangedError, sqlite_file_of


def _engine_on(path: Path) -> Engine:
    engine = make_engine(f"sqlite:///{path}")
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE t (x INTEGER)"))
    return engine


def test_the_same_file_is_used_freely(tmp_path: Path) -> None:
    engine = _engine_on(tmp_path / "a.db")
    for _ in range(3):
        with engine.begin() as connection:
            connection.execute(text("INSERT INTO t VALUES (1)"))


@pytest.mark.parametrize("replace", [False, True])
def test_a_deleted_or_replaced_file_refuses_every_transaction_and_logs_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, replace: bool
) -> None:
    path = tmp_path / "a.db"
    engine = _engine_on(path)
    for name in ("a.db", "a.db-wal", "a.db-shm"):
        (tmp_path / name).unlink(missing_ok=True)
    if replace:
        _engine_on(path).dispose()  # another database at the same path
    with caplog.at_level(logging.ERROR, logger="gateway.db"):
        for _ in range(3):
            with pytest.raises(DatabaseFileChangedError), engine.connect() as connection:
                connection.execute(text("SELECT 1"))
    (record,) = caplog.records
    assert str(path) in record.getMessage() and "restart the gateway" in record.getMessage()


def test_only_a_file_database_is_watched() -> None:
    assert sqlite_file_of(make_engine("sqlite://")) is None
    assert sqlite_file_of(make_engine("sqlite:///:memory:")) is None


def _remove_files(path: Path, replace: bool) -> None:
    """The database and its side files deleted; with `replace`, a new database made at the same path."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    if replace:
        _engine_on(path).dispose()


def _read(engine: Engine) -> None:
    with sqlite_read_cursor(engine) as cursor:
        cursor.execute("SELECT count(*) FROM t")


def _write(engine: Engine, *statements: str) -> None:
    with sqlite_write_cursor(engine) as cursor:
        for statement in statements:
            cursor.execute(statement)


def _write_then_fail(engine: Engine, statement: str) -> None:
    with sqlite_write_cursor(engine) as cursor:
        cursor.execute(statement)
        raise RuntimeError("the block failed after its statement")


@pytest.mark.parametrize("replace", [False, True])
def test_the_driver_cursor_for_a_call_s_read_is_refused_as_a_transaction_is(tmp_path: Path, replace: bool) -> None:
    # A call's authentication reads through `sqlite_read_cursor`, outside SQLAlchemy's transactions
    # (decision 92): the guard must still stand before it.
    path = tmp_path / "a.db"
    engine = _engine_on(path)
    with sqlite_read_cursor(engine) as cursor:
        assert cursor.execute("SELECT count(*) FROM t").fetchone() == (0,)
    _remove_files(path, replace)
    for _ in range(2):
        with pytest.raises(DatabaseFileChangedError):
            _read(engine)


@pytest.mark.parametrize("replace", [False, True])
def test_the_driver_cursor_for_a_refusal_s_append_is_refused_as_a_transaction_is(tmp_path: Path, replace: bool) -> None:
    # A refused call's append and card run in `sqlite_write_cursor`, outside SQLAlchemy's transactions
    # (decision 100): the guard stands before it as before `engine.begin()`, and nothing is written.
    path = tmp_path / "a.db"
    engine = _engine_on(path)
    _write(engine, "INSERT INTO t VALUES (1)")
    _remove_files(path, replace)
    for _ in range(2):
        with pytest.raises(DatabaseFileChangedError):
            _write(engine, "INSERT INTO t VALUES (2)")
    engine.dispose()
    if replace:
        check = sqlite3.connect(path)
        assert check.execute("SELECT count(*) FROM t").fetchone() == (0,)  # the new file got nothing
        check.close()


def test_the_write_cursor_commits_its_block_or_nothing_of_it(tmp_path: Path) -> None:
    path = tmp_path / "a.db"
    engine = _engine_on(path)
    _write(engine, "INSERT INTO t VALUES (1)")
    with pytest.raises(RuntimeError):
        _write_then_fail(engine, "INSERT INTO t VALUES (2)")
    with pytest.raises(OperationalError):  # a driver error: SQLAlchemy's, as through SQLAlchemy
        _write(engine, "INSERT INTO t VALUES (3)", "INSERT INTO no_such_table VALUES (4)")
    with sqlite_read_cursor(engine) as cursor:
        assert cursor.execute("SELECT x FROM t ORDER BY x").fetchall() == [(1,)]
    # Each block took the write lock at its start (BEGIN IMMEDIATE) and let it go: another writer gets it.
    other = sqlite3.connect(path, isolation_level=None, timeout=0.05)
    other.execute("BEGIN IMMEDIATE")
    other.execute("ROLLBACK")
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with engine.connect() as connection:
            connection.connection.driver_connection.execute("PRAGMA busy_timeout = 50")  # type: ignore[union-attr]
        with pytest.raises(OperationalError):
            _write(engine, "INSERT INTO t VALUES (5)")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        other.close()
        engine.dispose()


def test_a_locked_file_at_begin_is_sqlalchemy_s_operational_error(tmp_path: Path) -> None:
    # BEGIN IMMEDIATE runs on the driver's connection (decision 92); a lock it cannot take still comes out
    # as SQLAlchemy's error, which every caller (a command, `storage_errors`) names as before.
    path = tmp_path / "a.db"
    engine = _engine_on(path)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with engine.connect() as connection:
            driver: Any = connection.connection.driver_connection
            driver.execute("PRAGMA busy_timeout = 50")  # on the driver: no autobegin
            with pytest.raises(OperationalError) as caught:
                connection.begin()
        assert isinstance(caught.value.orig, sqlite3.OperationalError)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        engine.dispose()
