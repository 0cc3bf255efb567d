"""What each console page reads, and who may see it: a Viewer sees their workspaces (ADMIN: all);
another workspace's card, run or question is answered as if it did not exist (404)."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from sqlalchemy import and_, select

from gateway import db
from gateway.audit import GENESIS, AuditEvent, ChainReport, _from_row
from gateway.calls import PAGE_MAX, CallQuery, CardStatus
from gateway.clock import iso_utc, parse_iso
from gateway.consent.store import Grant
from gateway.policy import Policy
from gateway.rbac import ADMIN_ROLE, Permission, has_permission
from gateway.services import Stores
from gateway.tick_failures import FailureStreak
from gateway.users import UserError, UserRecord, check_user_name
from gateway.visible import visible as shown_text

log = logging.getLogger("gateway.console")

PAGE = 50
USER_NAME_CHARS = 64
"""The longest user name the tables hold."""
TEXT_LIMIT = 262_144
"""At most this much of an artifact is shown on a run's page (the rest is named, with its size)."""


@dataclass(frozen=True, slots=True)
class Viewer:
    name: str
    role: str
    workspaces: tuple[str, ...]
    sees_all: bool
    may_decide: bool
    csrf: str

    def sees(self, workspace: str | None) -> bool:
        return self.sees_all or (workspace is not None and workspace in self.workspaces)

    @property
    def scope(self) -> tuple[str, ...] | None:
        """The workspaces a query is limited to; None: every one."""
        return None if self.sees_all else self.workspaces


def viewer_of(record: UserRecord, policy: Policy, csrf: str) -> Viewer:
    return Viewer(
        name=record.name,
        role=record.role,
        workspaces=record.workspaces,
        sees_all=record.role == ADMIN_ROLE,
        may_decide=has_permission(policy.roles, record.role, Permission.CONSENT_DECIDE),
        csrf=csrf,
    )


def grant_state(grant: Grant, now: float) -> str:
    if grant.revoked_at is not None:
        return "revoked"
    if grant.expires_at is not None and grant.expires_at <= now:
        return "expired"
    return "active"


@dataclass(frozen=True, slots=True)
class AuditFilter:
    user: str | None = None
    tool: str | None = None
    event_type: str | None = None
    code: int | None = None
    since: str | None = None
    until: str | None = None
    before: int | None = None

    @classmethod
    def of(cls, query: Mapping[str, str]) -> AuditFilter:
        """The filter a page's query string asks for; a value that cannot be one is left out."""

        def text(name: str) -> str | None:
            value = query.get(name, "").strip()
            return value[:128] or None

        def number(name: str) -> int | None:
            value = query.get(name, "").strip()
            return int(value) if value.lstrip("-").isdigit() and len(value) < 19 else None

        def when(name: str) -> str | None:
            value = text(name)
            if value is None:
                return None
            try:
                return iso_utc(parse_iso(value))
            except ValueError:
                return None

        return cls(
            text("user"),
            text("tool"),
            text("event_type"),
            number("code"),
            when("since"),
            when("until"),
            number("before"),
        )

    def query_string(self, **changes: object) -> dict[str, str]:
        values: dict[str, object] = {
            "user": self.user,
            "tool": self.tool,
            "event_type": self.event_type,
            "code": self.code,
            "since": self.since,
            "until": self.until,
            "before": self.before,
        }
        values.update(changes)
        return {k: str(v) for k, v in values.items() if v is not None}


CALL_FILTERS = ("tool", "upstream", "user", "outcome", "before", "limit")
"""What `/calls` and `/api/calls` take in their query string (`call_query_of`)."""
_CALL_TOOL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_UPSTREAM = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]|_(?!_)){0,63}")
_CURSOR = re.compile(r"[1-9][0-9]{0,17}")


class FilterError(ValueError):
    """A filter or paging value of the query string that cannot be one: the page answers 400 with it."""


def call_query_of(items: Iterable[tuple[str, str]], extra: Collection[str] = ()) -> CallQuery:
    """The cards a page's query string asks for (`CALL_FILTERS`; `extra`: other keys its route reads
    itself). An empty value is no filter (an empty form field); anything else that cannot be a value
    of its key, a key given twice, or an unknown key raises FilterError naming the key and what it takes."""
    given: dict[str, str] = {}
    for key, value in items:
        if key in extra:
            continue
        if key not in CALL_FILTERS:
            raise FilterError(f"unknown parameter '{shown_text(key[:80])}': the list takes {', '.join(CALL_FILTERS)}")
        if key in given:
            raise FilterError(f"{key} is given twice: give it once")
        given[key] = value
    values = {key: value for key, value in given.items() if value != ""}

    def checked(key: str, pattern: re.Pattern[str], what: str) -> str | None:
        value = values.get(key)
        if value is not None and pattern.fullmatch(value) is None:
            raise FilterError(f"{key} must be {what}, not '{shown_text(value[:80])}'")
        return value

    user = values.get("user")
    if user is not None:
        try:
            check_user_name(user)
        except UserError:
            raise FilterError(f"user must be a user name, not '{shown_text(user[:80])}'") from None
        if len(user) > USER_NAME_CHARS:
            raise FilterError(f"user must be a user name of at most {USER_NAME_CHARS} characters")
    outcome = values.get("outcome")
    if outcome is not None and outcome not in set(CardStatus):
        raise FilterError(f"outcome must be one of {', '.join(CardStatus)}, not '{shown_text(outcome[:80])}'")
    before = checked("before", _CURSOR, "a card cursor (a positive whole number)")
    limit = checked("limit", _CURSOR, f"a whole number from 1 to {PAGE_MAX}")
    if limit is not None and int(limit) > PAGE_MAX:
        raise FilterError(f"limit must be a whole number from 1 to {PAGE_MAX}, not {limit}")
    return CallQuery(
        tool=checked("tool", _CALL_TOOL, "a tool name (letters, digits, _ . -; at most 128)"),
        upstream=checked("upstream", _UPSTREAM, "an upstream's name (letters, digits, - and single _; at most 64)"),
        user=user,
        status=None if outcome is None else CardStatus(outcome),
        before=None if before is None else int(before),
        limit=PAGE if limit is None else int(limit),
    )


def call_query_string(query: CallQuery, **changes: object) -> str:
    """The query string that asks for `query` (with `changes`), its keys in `CALL_FILTERS` order; the
    default page size left out."""
    values: dict[str, object] = {
        "tool": query.tool,
        "upstream": query.upstream,
        "user": query.user,
        "outcome": query.status,
        "before": query.before,
        "limit": None if query.limit == PAGE else query.limit,
    }
    values.update(changes)
    return urlencode({k: str(v) for k, v in values.items() if v is not None})


def audit_query(f: AuditFilter, viewer: Viewer, descending: bool = True) -> Any:
    e = db.audit_events
    conditions = []
    if f.user is not None:
        conditions.append(e.c.user_name == f.user)
    if f.tool is not None:
        conditions.append(e.c.tool_name == f.tool)
    if f.event_type is not None:
        conditions.append(e.c.event_type == f.event_type)
    if f.code is not None:
        conditions.append(e.c.code == f.code)
    if f.since is not None:
        conditions.append(e.c.ts >= f.since)
    if f.until is not None:
        conditions.append(e.c.ts <= f.until)
    if f.before is not None and descending:
        conditions.append(e.c.id < f.before)
    if viewer.scope is not None:
        conditions.append(e.c.workspace.in_(viewer.scope))
    query = select(e).where(and_(*conditions)) if conditions else select(e)
    return query.order_by(e.c.id.desc() if descending else e.c.id)


def fetch_audit_page(stores: Stores, f: AuditFilter, viewer: Viewer) -> list[AuditEvent]:
    """One page, newest first, keyset-paginated on the event id (`before`), never OFFSET."""
    with db.reader(stores.engine).connect() as connection:
        rows = connection.execute(audit_query(f, viewer).limit(PAGE))
        return [_from_row(r._mapping) for r in rows]


def export_audit(stores: Stores, f: AuditFilter, viewer: Viewer) -> Iterator[str]:
    """The filtered set as JSON Lines, oldest first, read in batches. Data, not a page: every value as
    stored, with every character past ASCII written as a JSON escape, so nothing in it (a bidi control,
    a C1 control) is live in the terminal or editor that opens the file."""
    with db.reader(stores.engine).connect() as connection:
        rows = connection.execute(audit_query(f, viewer, descending=False).execution_options(yield_per=1000))
        for row in rows:
            yield json.dumps(_from_row(row._mapping).to_json(), ensure_ascii=True) + "\n"


@dataclass
class ChainWatch:
    """The hash chain's verification, kept current in the background: a page shows the last result at
    once (a full check of 100,000 events takes longer than a page may). Every `every_s` the events
    appended since the last verified point are checked from it; every `full_every_s`, and whenever
    that finds a break, the whole chain again (an old event edited in place is found then)."""

    stores: Stores
    every_s: float = 2.0
    full_every_s: float = 60.0
    report: ChainReport | None = None
    checked_at: float | None = None
    _thread: threading.Thread | None = None
    _stopping: threading.Event = field(default_factory=threading.Event)

    def stop(self, timeout_s: float = 30.0) -> None:
        """End the checks, waiting for the current one: for a caller that outlives its database (a test)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="chain-watch", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        verified, last_full = GENESIS, 0.0
        trouble = FailureStreak("the audit chain check", self.every_s, log=log)  # logged once, retried
        while not self._stopping.is_set():
            now = time.monotonic()
            try:
                if now - last_full >= self.full_every_s:
                    verified, last_full = GENESIS, now
                report, head = self.stores.audit.verify_after(verified)
                if not report.ok and verified != GENESIS:
                    report, head = self.stores.audit.verify_after(GENESIS)
                verified = head if report.ok else GENESIS
            except Exception as exc:  # a database error: shown as not verified, retried
                trouble.failed(exc)
                report = ChainReport(False, 0, None, "the log could not be read")
                verified = GENESIS
            else:
                trouble.worked()
            self.report, self.checked_at = report, time.time()
            if self._stopping.wait(self.every_s):
                return


def fetch_runs(stores: Stores, viewer: Viewer) -> list[Any]:
    return stores.runs.list(viewer.scope, PAGE)


def run_files(folder: Path) -> dict[str, str]:
    """The run's text artifacts, each at most TEXT_LIMIT characters (a longer one says how long it is)."""
    files: dict[str, str] = {}
    for name in ("evidence.json", "stdout.txt", "stderr.txt", "junit.xml"):
        path = folder / name
        try:
            with path.open("rb") as handle:
                data = handle.read(TEXT_LIMIT + 1)
                size = path.stat().st_size
        except OSError:
            continue
        text = data[:TEXT_LIMIT].decode("utf-8", errors="replace")
        if size > TEXT_LIMIT:
            text += f"\n[{size - TEXT_LIMIT} more bytes of {size} not shown]"
        files[name] = text
    return files
