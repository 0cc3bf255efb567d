"""Which gateways are alive, across processes and hosts (decision 50): a lease per serving process.

Each `serve` process records a row in `gateway_sessions` under the session id its consent
questions and runs carry, and renews its lease (`alive_until`) every sweep period on a thread and
a connection of its own (`LeaseKeeper`), never in the queue calls' database work waits in: 80
calls queued behind a locked row once kept a live gateway from renewing, and another gateway then
closed its question as abandoned (decision 67). It sets `closed_at` when it stops cleanly. Another process judges it
gone when its lease ran out or it closed, and, on the same kernel and in the same pid
namespace, at once when its pid no longer is the process that registered (its start time
differs, or no such pid): a `kill -9` is seen within a poll, not a lease. Across hosts the
lease alone decides, compared with the judge's clock: clocks must agree to well within a lease
(decision 50).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine, delete, insert, select, update

from gateway import db
from gateway.clock import Clock
from gateway.db.errors import cause_name, storage_errors
from gateway.errors import StorageUnavailableError

log = logging.getLogger("gateway.liveness")


@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    """Where a gateway runs: enough to tell, on the same machine, whether its process still exists."""

    host: str
    boot_id: str
    """The kernel's boot id ("" where unknown): pids mean the same only under the same one."""
    pid_namespace: str
    """The pid namespace ("" where unknown): a pid means the same process only within it."""
    pid: int
    pid_started: str
    """The process's start time in clock ticks since boot ("" where unknown): a reused pid has another."""


@dataclass(frozen=True, slots=True)
class SessionRecord:
    session_id: str
    identity: ProcessIdentity
    started_at: float
    alive_until: float
    closed_at: float | None


StartTimeProbe = Callable[[int], str | None]
"""The start time of a pid on this machine, None when there is no such process."""


def start_time_of(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (after the command name, which may hold spaces and parentheses)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None


def this_process() -> ProcessIdentity:
    boot_id = pid_namespace = ""
    with contextlib.suppress(OSError):
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    with contextlib.suppress(OSError):
        pid_namespace = str(os.stat("/proc/self/ns/pid").st_ino)
    pid = os.getpid()
    return ProcessIdentity(socket.gethostname()[:255], boot_id, pid_namespace, pid, start_time_of(pid) or "")


def is_gone(session: SessionRecord, now: float, here: ProcessIdentity, probe: StartTimeProbe = start_time_of) -> bool:
    """Whether the gateway of `session` can no longer act: it closed, its lease ran out, or (seen from
    the same kernel and pid namespace) its process is not there any more."""
    if session.closed_at is not None or session.alive_until <= now:
        return True
    return is_dead_here(session, here, probe)


def is_dead_here(session: SessionRecord, here: ProcessIdentity, probe: StartTimeProbe = start_time_of) -> bool:
    """Whether `session`'s process is known dead (decision 69): seen from the same kernel and pid
    namespace, its pid is no longer the process that registered. A lease that ran out proves no death."""
    theirs = session.identity
    return _same_pids(theirs, here) and probe(theirs.pid) != theirs.pid_started


def is_alive_here(session: SessionRecord, here: ProcessIdentity, probe: StartTimeProbe = start_time_of) -> bool:
    """Whether `session`'s process is known alive: on the same kernel and pid namespace, its pid is still it."""
    theirs = session.identity
    return _same_pids(theirs, here) and probe(theirs.pid) == theirs.pid_started


def _same_pids(theirs: ProcessIdentity, here: ProcessIdentity) -> bool:
    comparable = bool(theirs.boot_id and theirs.pid_namespace and theirs.pid_started)
    return comparable and (theirs.boot_id, theirs.pid_namespace) == (here.boot_id, here.pid_namespace)


class SessionStore:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._read = db.reader(engine)

    def renew(self, session_id: str, identity: ProcessIdentity, now: float, alive_until: float) -> float | None:
        """Record (or extend) this gateway's lease; returns the lease it had (None: first registration)."""
        s = db.gateway_sessions
        with storage_errors("this gateway's lease could not be renewed", log=None), self._engine.begin() as connection:
            before = connection.execute(select(s.c.alive_until).where(s.c.session_id == session_id)).scalar()
            if before is not None:
                connection.execute(update(s).where(s.c.session_id == session_id).values(alive_until=alive_until))
                return float(before)
            connection.execute(
                insert(s).values(
                    session_id=session_id,
                    host=identity.host,
                    boot_id=identity.boot_id,
                    pid_namespace=identity.pid_namespace,
                    pid=identity.pid,
                    pid_started=identity.pid_started,
                    started_at=now,
                    alive_until=alive_until,
                )
            )
        return None

    def close(self, session_id: str, now: float) -> None:
        """A clean stop: nothing of this session is waited on any more."""
        s = db.gateway_sessions
        with storage_errors("this gateway's stop could not be recorded", log=None), self._engine.begin() as connection:
            connection.execute(update(s).where(s.c.session_id == session_id).values(closed_at=now))

    def fetch(self, session_ids: Iterable[str]) -> dict[str, SessionRecord]:
        wanted = sorted(set(session_ids))
        if not wanted:
            return {}
        s = db.gateway_sessions
        with storage_errors("gateway sessions could not be read", log=None), self._read.connect() as connection:
            rows = connection.execute(select(s).where(s.c.session_id.in_(wanted))).all()
        return {row.session_id: _session(row) for row in rows}

    def purge(self, before: float) -> int:
        """Forget sessions whose lease ended before `before` (their runs and questions are closed by then)."""
        s = db.gateway_sessions
        with storage_errors("old gateway sessions could not be deleted", log=None), self._engine.begin() as connection:
            return int(connection.execute(delete(s).where(s.c.alive_until < before)).rowcount)


def _session(row: object) -> SessionRecord:
    m = row._mapping  # type: ignore[attr-defined]
    identity = ProcessIdentity(m["host"], m["boot_id"], m["pid_namespace"], int(m["pid"]), m["pid_started"])
    closed = m["closed_at"]
    return SessionRecord(
        m["session_id"],
        identity,
        float(m["started_at"]),
        float(m["alive_until"]),
        None if closed is None else float(closed),
    )


class LeaseKeeper:
    """Renews one session's lease every `period_s`, to `lease_s` ahead, on a daemon thread of its own
    through an engine of its own (one connection): neither call traffic nor the database threads'
    queue can delay it, and on PostgreSQL no lock a call waits for is one it needs (it touches only
    its own `gateway_sessions` row). On SQLite a writer holding the file's lock (BEGIN IMMEDIATE)
    holds it back too, as it holds back every other gateway's writes, closures included; it renews
    as soon as the lock goes. A failed renewal is logged once (and once when it works again) and
    retried the next period: nothing here can end the gateway.
    """

    def __init__(
        self,
        engine: Engine,
        session_id: str,
        identity: ProcessIdentity,
        clock: Clock,
        *,
        period_s: float,
        lease_s: float,
    ) -> None:
        self._engine = engine
        self._store = SessionStore(engine)
        self._session_id = session_id
        self._identity = identity
        self._clock = clock
        self._period_s = period_s
        self._lease_s = lease_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep, name="gateway-lease", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop renewing (a renewal under way finishes; its engine is disposed by the thread)."""
        self._stop.set()

    def renew_once(self) -> None:
        now = self._clock.now()
        before = self._store.renew(self._session_id, self._identity, now, now + self._lease_s)
        if before is not None and before <= now:
            log.warning(
                "this gateway's lease had run out %.0f s ago (the database was unreachable?): other gateways may "
                "have closed its runs and questions as abandoned",
                now - before,
            )

    def _keep(self) -> None:
        failing = False
        try:
            while not self._stop.is_set():
                try:
                    self.renew_once()
                except StorageUnavailableError as exc:
                    if not failing:
                        log.error(  # noqa: TRY400  (no traceback: the URL may hold a password)
                            "this gateway's lease could not be renewed (%s); it retries every %s s",
                            cause_name(exc),
                            self._period_s,
                        )
                    failing = True
                except Exception:
                    if not failing:
                        log.exception(
                            "this gateway's lease could not be renewed; it retries every %s s", self._period_s
                        )
                    failing = True
                else:
                    if failing:
                        log.warning("this gateway's lease is renewed again")
                    failing = False
                self._stop.wait(self._period_s)
        finally:
            with contextlib.suppress(Exception):
                self._engine.dispose()
