"""gateway/tick_failures.py: a periodic task's failures logged once per streak and cause (decision 68).

Also the console's chain check, a thread that ticks every few seconds: a database that cannot be
read for a while gives one line, and one more when the check works again (real SQLite and PostgreSQL).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError

from gateway.console.views import ChainWatch
from gateway.errors import Reason, StorageUnavailableError
from gateway.services import open_stores
from gateway.settings import Settings
from gateway.tick_failures import FailureStreak
from sandbox.errors import SandboxStartError
from tests.fakes import FakeClock


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records]


def test_a_streak_is_logged_once_again_when_its_cause_changes_and_once_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    streak = FailureStreak("the sweep", 30.0)
    with caplog.at_level(logging.WARNING, logger="gateway.recovery"):
        for _ in range(5):
            streak.failed(KeyError("x"))
        assert len(caplog.records) == 1 and caplog.records[0].exc_info is not None, "unexpected: with its traceback"
        for _ in range(3):
            streak.failed(SandboxStartError("scratch_root_unsafe:/tmp/x is a link"))
        streak.failed(KeyError("x"))
        streak.worked()
        streak.worked()
        streak.failed(KeyError("x"))
    said = lines(caplog)
    assert [line.split(" (")[0] for line in said] == [
        "the sweep failed unexpectedly",
        "the sweep failed",
        "the sweep failed unexpectedly",
        "the sweep works again",
        "the sweep failed unexpectedly",
    ], said
    assert "step scratch_root_unsafe" in said[1] and "fix:" in said[1]
    assert all("retries every 30.0 s" in line for line in said if "failed" in line)


def test_a_database_failure_is_one_line_without_traceback_or_password(caplog: pytest.LogCaptureFixture) -> None:
    streak = FailureStreak("the sweep", 30.0)
    driver = OperationalError("SELECT secret_column", {"p": "s3cret"}, Exception("postgresql://u:pw@host/db gone"))
    storage = StorageUnavailableError(Reason.DATABASE_UNAVAILABLE, "x")
    storage.__cause__ = driver
    with caplog.at_level(logging.WARNING, logger="gateway.recovery"):
        streak.failed(driver)
        streak.failed(driver)
        streak.worked()
        streak.failed(storage)
    said = lines(caplog)
    assert len(said) == 3 and all(record.exc_info is None for record in caplog.records), said
    assert not any("pw@" in line or "s3cret" in line or "secret_column" in line for line in said), said


def test_the_consoles_chain_check_logs_an_unreadable_log_once_and_its_recovery_once(
    engine: Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stores = open_stores(Settings(tmp_path, "unused", tmp_path / "policy.yaml"), FakeClock(), engine=engine)
    watch = ChainWatch(stores, every_s=0.02)
    with caplog.at_level(logging.WARNING, logger="gateway.console"), _stopped(watch):
        watch.start()
        assert _waited(lambda: watch.report is not None and watch.report.ok)
        with engine.begin() as connection:
            connection.execute(text("ALTER TABLE audit_events RENAME TO audit_events_away"))
        try:
            assert _waited(lambda: watch.report is not None and not watch.report.ok)
            time.sleep(0.3)  # many more ticks, each failing
        finally:
            with engine.begin() as connection:
                connection.execute(text("ALTER TABLE audit_events_away RENAME TO audit_events"))
        assert _waited(lambda: watch.report is not None and watch.report.ok)
        assert _waited(lambda: any("works again" in line for line in lines(caplog)))
    said = [line for line in lines(caplog) if "the audit chain check" in line]
    assert len(said) == 2 and "failed" in said[0] and "works again" in said[1], said


@contextlib.contextmanager
def _stopped(watch: ChainWatch) -> Iterator[None]:
    try:
        yield
    finally:
        watch.stop()  # and its last check ends before the database goes


def _waited(condition: object, timeout: float = 20) -> bool:
    assert callable(condition)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return bool(condition())
