"""gateway/logs.py and gateway/db/errors.py: the rate limit, one line per record, how a database failure is described."""

from __future__ import annotations

import io
import logging
import sqlite3
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError, SQLAlchemyError

from gateway.db.errors import storage_errors
from gateway.errors import Reason, StorageUnavailableError
from gateway.logs import (
    CAUSE_CHARS,
    MESSAGE_CHARS,
    GatewayLogHandler,
    RateLimit,
    describe_cause,
    one_line,
)


def _record(
    msg: str, *args: object, name: str = "gateway.audit", created: float = 1000.0, level: int = logging.ERROR
) -> logging.LogRecord:
    record = logging.LogRecord(name, level, __file__, 1, msg, args, None)
    record.created = created
    return record


def _shown(limit: RateLimit, record: logging.LogRecord) -> str | None:
    return record.getMessage() if limit.filter(record) else None


def test_the_first_of_a_kind_is_shown_then_one_per_window_with_a_count() -> None:
    limit = RateLimit(every_s=60)
    assert _shown(limit, _record("run %s: failed", "a", created=1000)) == "run a: failed"
    for t in range(1001, 1060):
        assert _shown(limit, _record("run %s: failed", "b", created=t)) is None  # same template, other run
    shown = _shown(limit, _record("run %s: failed", "c", created=1060))
    assert shown is not None
    assert shown.startswith("run c: failed (and 59 more like this since ")
    assert _shown(limit, _record("run %s: failed", "d", created=1061)) is None  # a new window began at 1060


@pytest.mark.parametrize(
    ("other", "why"),
    [
        (_record("run %s: failed", "x", name="gateway.budget"), "another logger"),
        (_record("run %s: other", "x"), "another template"),
        (_record("run %s: failed", "x", level=logging.DEBUG), "debug is never limited (-v asked for it)"),
    ],
)
def test_kinds_are_limited_separately(other: logging.LogRecord, why: str) -> None:
    limit = RateLimit(every_s=60)
    assert limit.filter(_record("run %s: failed", "a"))
    assert limit.filter(other), why


def test_a_rate_key_separates_causes_of_one_template() -> None:
    limit = RateLimit(every_s=60)
    locked, io_error = _record("%s: %s", "audit", "locked"), _record("%s: %s", "audit", "disk I/O error")
    locked.rate_key = ("audit", "locked")
    io_error.rate_key = ("audit", "io")
    assert limit.filter(locked)
    assert limit.filter(io_error)


def test_the_kinds_remembered_are_bounded() -> None:
    limit = RateLimit(every_s=60, max_kinds=3)
    for n in range(10):
        assert limit.filter(_record(f"unique {n}"))  # an f-string template is a kind of its own
    assert not limit.filter(_record("unique 9"))
    assert limit.filter(_record("unique 0")), "forgotten, so shown again: memory stays bounded"


def test_what_is_still_hidden_is_written_when_the_handler_closes() -> None:
    stream = io.StringIO()
    handler = GatewayLogHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    for n in range(5):
        handler.handle(_record("run %s: failed", n, created=1000 + n))
    assert stream.getvalue() == "ERROR gateway.audit: run 0: failed\n"
    handler.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[1].startswith("ERROR gateway.audit: 4 more like this since ")
    assert lines[1].endswith("were not shown (at most one a minute); the last: run 4: failed")
    handler.close()
    assert len(stream.getvalue().splitlines()) == 2, "counted once"


def test_an_sdk_record_loses_its_traceback_for_the_exception_class() -> None:
    try:
        raise ValueError("input_value='the-token'")
    except ValueError:
        record = logging.LogRecord(
            "mcp.server.runner", logging.ERROR, __file__, 1, "handler for %r raised", ("x",), sys.exc_info()
        )
    one_line(record)
    assert record.getMessage() == "handler for 'x' raised (ValueError)"
    assert record.exc_info is None
    formatted = logging.Formatter().format(record)
    assert "Traceback" not in formatted and "the-token" not in formatted


def test_the_gateways_own_tracebacks_stay() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("gateway.server", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    one_line(record)
    assert "Traceback" in logging.Formatter().format(record)


def test_a_message_is_one_bounded_line() -> None:
    record = _record("name %s", "a\nFAKE ERROR line\r" + "x" * (2 * MESSAGE_CHARS))
    one_line(record)
    message = record.getMessage()
    assert "\n" not in message and "\r" not in message
    assert message.startswith("name a\\nFAKE ERROR line\\r")
    assert len(message) < MESSAGE_CHARS + 50


def _sqlite_error(tmp_path: Path, statement: str) -> SQLAlchemyError:
    engine = create_engine(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        with engine.begin() as connection:
            connection.execute(text(statement), {"secret": "the-token"})
    except SQLAlchemyError as exc:
        return exc
    finally:
        engine.dispose()
    raise AssertionError("the statement did not fail")


def test_a_driver_error_is_its_class_and_message_never_the_sql_or_parameters(tmp_path: Path) -> None:
    exc = _sqlite_error(tmp_path, "INSERT INTO nowhere VALUES (:secret)")
    assert describe_cause(exc) == "sqlite3.OperationalError: no such table: nowhere"
    assert "the-token" in str(exc), "str() of it would have leaked the parameters"


def test_a_cause_is_bounded_and_one_line() -> None:
    exc = OperationalError("SELECT 1", {}, sqlite3.OperationalError("disk\nI/O error " + "y" * 500))
    cause = describe_cause(exc)
    assert len(cause) <= CAUSE_CHARS
    assert cause.startswith("sqlite3.OperationalError: disk I/O error yyy")


def test_a_url_with_a_password_is_not_repeated() -> None:
    exc = OperationalError("SELECT 1", {}, ConnectionError("could not reach postgresql://gw:hunter2@db/gw"))
    assert describe_cause(exc) == "ConnectionError: could not reach postgresql://***@db/gw"


def test_storage_errors_logs_once_and_raises_the_reason_it_was_given(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = logging.getLogger("gateway.test")
    driver_error = _sqlite_error(tmp_path, "SELECT * FROM nowhere")
    with (
        pytest.raises(StorageUnavailableError) as caught,
        storage_errors("runs could not be read", log=log, run_id="r1"),
    ):
        raise driver_error
    assert caplog.messages == ["run r1: runs could not be read: sqlite3.OperationalError: no such table: nowhere"]
    assert caught.value.reason == Reason.DATABASE_UNAVAILABLE
    assert caught.value.code == -32603
    assert caught.value.__cause__ is driver_error
    assert "nowhere" not in caught.value.public_message(), "the driver's words stay in the log"


def test_storage_errors_without_a_log_only_translates(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    driver_error = _sqlite_error(tmp_path, "SELECT * FROM nowhere")
    with (
        pytest.raises(StorageUnavailableError) as caught,
        storage_errors("quiet", log=None, reason=Reason.AUDIT_UNAVAILABLE, detail="the audit log could not be written"),
    ):
        raise driver_error
    assert caplog.messages == []
    assert caught.value.reason == Reason.AUDIT_UNAVAILABLE
    assert caught.value.public_message() == "Internal error: the audit log could not be written"


def test_the_innermost_storage_error_is_the_one_logged_and_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = logging.getLogger("gateway.test")
    driver_error = _sqlite_error(tmp_path, "SELECT * FROM nowhere")
    with (
        pytest.raises(StorageUnavailableError) as caught,
        storage_errors("outer", log=log),
        storage_errors("inner", log=log, detail="the inner store failed"),
    ):
        raise driver_error
    assert caplog.messages == ["inner: sqlite3.OperationalError: no such table: nowhere"]
    assert caught.value.detail == "the inner store failed"


def test_a_record_whose_arguments_do_not_fit_never_makes_the_filter_raise() -> None:
    limit = RateLimit(every_s=60)
    assert limit.filter(_record("two %s %s", "one", created=1000))
    assert not limit.filter(_record("two %s %s", "one", created=1001))
    shown = _record("two %s %s", "one", created=1070)
    assert limit.filter(shown)
    assert shown.getMessage().startswith("two %s %s (and 1 more like this since ")
