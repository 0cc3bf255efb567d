"""The one place a database failure becomes a refusal (docs/error-codes.md: fail closed): `storage_errors`.

Every store wraps its database work in `with storage_errors(...)`, and gateway/db/threads.py wraps
all database work done while serving in it once more: a SQLAlchemyError (or a driver's own error)
raised inside (DatabaseFileChangedError and DatabaseFileUnwritableError from gateway/db/file_guard.py
included) is logged once with its cause (`describe_cause`: never the SQL, its parameters or the
URL), then raised again as `StorageUnavailableError` from it, -32603 with the reason it carries.
Callers branch on that class, never on the driver's exceptions or the reason's text.
"""

from __future__ import annotations

import logging
import sqlite3
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.exc import SQLAlchemyError

from gateway.errors import Reason, StorageUnavailableError
from gateway.logs import RATE_KEY, describe_cause

DATABASE_FAILED = "the gateway's database failed; nothing more ran"
"""The client's detail when the caller names nothing more precise."""


@contextmanager
def storage_errors(
    what: str,
    *,
    log: logging.Logger | None,
    run_id: str | None = None,
    reason: Reason = Reason.DATABASE_UNAVAILABLE,
    detail: str = DATABASE_FAILED,
) -> Iterator[None]:
    """Turn a SQLAlchemyError raised inside into StorageUnavailableError(reason, detail), from it.

    `what` failed, for `run_id`: one ERROR line on `log` with the cause, rate-limited per `what`
    and cause class (gateway/logs.py). `log=None` translates without a line, for a caller that
    says it itself once per outage (the sweep). A StorageUnavailableError from an inner
    `storage_errors` passes unchanged: the innermost, most precise one is logged and answered.
    """
    try:
        yield
    except _storage_errors() as exc:
        if log is not None:
            subject = what if run_id is None else f"run {run_id}: {what}"
            cause = type(getattr(exc, "orig", None) or exc).__name__
            # No traceback: it would hold the SQL and its parameters.
            log.error("%s: %s", subject, describe_cause(exc), extra={RATE_KEY: (what, cause)})  # noqa: TRY400
        raise StorageUnavailableError(reason, detail) from exc


def _storage_errors() -> tuple[type[Exception], ...]:
    """SQLAlchemy's errors, and the drivers' own, which reach here when a connection is made outside a
    SQLAlchemy Connection (the pool's connect, gateway/db/__init__.py `autocommit_cursor`): the drivers loaded."""
    psycopg = sys.modules.get("psycopg")  # loaded only on PostgreSQL: never imported here for SQLite
    return (SQLAlchemyError, sqlite3.Error) if psycopg is None else (SQLAlchemyError, sqlite3.Error, psycopg.Error)


def cause_name(exc: StorageUnavailableError) -> str:
    """The driver's exception class behind `exc` (for a one-line message that must not hold its text)."""
    return type(exc.__cause__ or exc).__name__
