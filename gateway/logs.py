"""What reaches stderr, and how often (docs/operations.md, "Logs").

Every failure of the gateway's own is logged with its cause, and no input can make the log grow
faster than the calls. The handler `serve` (and every command) logs through applies, in order:

- a rate limit per kind of record (logger, message template, and the `rate_key` a caller adds):
  the first is shown, the others within `EVERY_S` are counted, and the next one after that is
  shown with "(and K more like this since HH:MM:SS)". What is still counted when the process
  ends is written then, so a burst is never silent. Debug records (`-v`) are not limited.
- one line per record shown: a message never spans lines (a newline in it is escaped, so no
  input can forge a log line), and a record from the MCP SDK (`mcp.*`, whose errors are client
  mistakes: malformed params, messages it drops) loses its traceback for the exception's class
  name, since pydantic's text echoes the client's input, tokens included.

`describe_cause` is the one way a database failure is put into words (gateway/db/errors.py logs it): the driver's exception
class and its first line, at most `CAUSE_CHARS` characters; never the SQL, its parameters or the
URL (which may hold a password).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TextIO

from sqlalchemy.exc import StatementError

EVERY_S = 60.0
"""At most one line per kind of record per minute (after the first)."""
MAX_KINDS = 1024
"""Kinds remembered; the least recently seen is forgotten first (its next record is shown again)."""
MESSAGE_CHARS = 2000
CAUSE_CHARS = 200
LAST_CHARS = 500
SDK_LOGGER = "mcp"

RATE_KEY = "rate_key"
"""The record attribute a caller sets to tell kinds of record with one template apart."""
_CREDENTIALS = re.compile(r"://[^/\s@]*@")

RateKey = tuple[str, str, object]


def describe_cause(exc: BaseException) -> str:
    """`module.Class: first line of the message` of the driver's error behind `exc`, bounded."""
    cause: BaseException = exc
    if isinstance(exc, StatementError):
        if exc.orig is None:
            return type(exc).__name__  # its text is the SQL statement and its parameters
        cause = exc.orig
    # args[0], not str(): a SQLAlchemy error's str() appends a documentation link
    text = str(cause.args[0]) if cause.args and isinstance(cause.args[0], str) else ""
    line = _CREDENTIALS.sub("://***@", " ".join(text.split()))
    kind = type(cause).__qualname__
    module = type(cause).__module__
    name = kind if module in ("builtins", "") else f"{module.rsplit('.', 1)[-1]}.{kind}"
    described = f"{name}: {line}" if line else name
    return described if len(described) <= CAUSE_CHARS else described[: CAUSE_CHARS - 3] + "..."


def one_line(record: logging.LogRecord) -> None:
    """Make `record` a single bounded line (an SDK record loses its traceback); changes it in place."""
    if record.name == SDK_LOGGER or record.name.startswith(SDK_LOGGER + "."):
        if record.exc_info and record.exc_info[0] is not None:
            record.msg = f"{record.getMessage()} ({record.exc_info[0].__name__})"
            record.args = None
        record.exc_info = None
        record.exc_text = None
        record.stack_info = None
    try:
        message = record.getMessage()
    except (TypeError, ValueError):
        return  # logging reports its own formatting errors; leave the record as it is
    flat = message.replace("\r", "\\r").replace("\n", "\\n")
    if len(flat) > MESSAGE_CHARS:
        flat = flat[:MESSAGE_CHARS] + f"... ({len(flat) - MESSAGE_CHARS} more characters)"
    if flat != message:
        record.msg, record.args = flat, None


@dataclass(slots=True)
class _Kind:
    shown_at: float
    hidden: int = 0
    hidden_since: float = 0.0
    level: int = logging.INFO
    last: str = ""


class RateLimit(logging.Filter):
    """Shows the first record of each kind, then at most one per `every_s` (by the records' own times)."""

    def __init__(self, every_s: float = EVERY_S, max_kinds: int = MAX_KINDS) -> None:
        super().__init__()
        self._every_s = every_s
        self._max_kinds = max_kinds
        self._kinds: OrderedDict[RateKey, _Kind] = OrderedDict()
        self._lock = threading.Lock()  # handlers filter outside their own lock; database work may log from threads

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.INFO:
            return True
        with self._lock:
            return self._admit(record)

    def _admit(self, record: logging.LogRecord) -> bool:
        key: RateKey = (record.name, str(record.msg), getattr(record, RATE_KEY, None))
        now = record.created
        kind = self._kinds.get(key)
        if kind is not None and now - kind.shown_at < self._every_s:
            if kind.hidden == 0:
                kind.hidden_since = now
            kind.hidden += 1
            kind.level = max(kind.level, record.levelno)
            kind.last = _message(record)[:LAST_CHARS]
            self._kinds.move_to_end(key)
            return False
        if kind is not None and kind.hidden:
            record.msg = f"{_message(record)} (and {kind.hidden} more like this since {_clock(kind.hidden_since)})"
            record.args = None
        self._kinds[key] = _Kind(shown_at=now)
        self._kinds.move_to_end(key)
        while len(self._kinds) > self._max_kinds:
            self._kinds.popitem(last=False)
        return True

    def take_hidden(self, now: float) -> list[logging.LogRecord]:
        """A summary record for each kind with records still hidden; they count as shown."""
        summaries = []
        with self._lock:
            hidden = [(name, kind) for (name, _, _), kind in self._kinds.items() if kind.hidden]
            for name, kind in hidden:
                summaries.append(
                    logging.makeLogRecord(
                        {
                            "name": name,
                            "levelno": kind.level,
                            "levelname": logging.getLevelName(kind.level),
                            "msg": "%d more like this since %s were not shown (at most one a minute); the last: %s",
                            "args": (kind.hidden, _clock(kind.hidden_since), kind.last),
                            "created": now,
                        }
                    )
                )
                kind.hidden = 0
        return summaries


def _message(record: logging.LogRecord) -> str:
    try:
        return record.getMessage()
    except (TypeError, ValueError):  # arguments that do not fit the template: a filter must not raise
        return str(record.msg)


def _clock(created: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(created))


class GatewayLogHandler(logging.StreamHandler[TextIO]):
    """A stream handler that writes one bounded line per record, rate-limited, and the remainder on close."""

    def __init__(self, stream: TextIO, every_s: float = EVERY_S) -> None:
        super().__init__(stream)
        self.rate_limit = RateLimit(every_s)
        self.addFilter(self.rate_limit)

    def emit(self, record: logging.LogRecord) -> None:
        one_line(record)  # after the rate limit, which keys on the template this may rewrite
        super().emit(record)

    def close(self) -> None:
        self.acquire()
        try:
            for summary in self.rate_limit.take_hidden(time.time()):
                self.emit(summary)
        finally:
            self.release()
        super().close()
