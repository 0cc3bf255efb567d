"""How a periodic task of a serving gateway fails (decision 68): logged once, retried, never fatal.

A background task (the sweep, the lease renewal, the scratch folder sweep) runs in ticks. A tick
that raises must not end the gateway and its calls with it, and a cause that lasts must not
fill the log: `FailureStreak` logs the first failure of a streak, again when the cause
changes, and once when a tick works again. Callers catch `Exception`, never `BaseException`:
cancellation (a stop) still passes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from sqlalchemy.exc import SQLAlchemyError

from gateway.db.errors import cause_name
from gateway.errors import StorageUnavailableError
from gateway.logs import RATE_KEY, describe_cause
from gateway.start_failures import describe_start_failure
from sandbox.errors import SandboxStartError


@dataclass(slots=True)
class FailureStreak:
    """The failures in a row of one periodic task, named `what` in its log lines."""

    what: str
    retry_s: float
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("gateway.recovery"))
    cause: str | None = None
    """What the last tick failed of (None: it worked)."""

    def failed(self, exc: Exception) -> None:
        cause, said = _cause(exc)
        if cause == self.cause:
            return  # logged when the streak began, or when its cause last changed
        self.cause = cause
        # Its own kind for the log's rate limit (gateway/logs.py): this streak's lines are few already.
        kind = {RATE_KEY: (self.what, cause)}
        if isinstance(exc, StorageUnavailableError | SandboxStartError | SQLAlchemyError):
            # Expected kinds, without a traceback (it would hold SQL and its parameters), the driver's
            # text cut to its first line (gateway/logs.py): a database URL may hold a password.
            self.log.error("%s failed (%s); it retries every %s s", self.what, said, self.retry_s, extra=kind)
        else:
            self.log.error(
                "%s failed unexpectedly (%s); it retries every %s s",
                self.what,
                said,
                self.retry_s,
                exc_info=exc,
                extra=kind,
            )

    def worked(self) -> None:
        if self.cause is not None:
            self.log.warning("%s works again", self.what, extra={RATE_KEY: (self.what, None)})
        self.cause = None


def _cause(exc: Exception) -> tuple[str, str]:
    """What failed, to tell one streak from the next, and how the log line says it."""
    if isinstance(exc, StorageUnavailableError):
        return cause_name(exc), cause_name(exc)
    if isinstance(exc, SandboxStartError):
        return exc.reason, describe_start_failure(exc.reason)
    if isinstance(exc, SQLAlchemyError):
        return type(getattr(exc, "orig", None) or exc).__name__, describe_cause(exc)
    return type(exc).__name__, type(exc).__name__
