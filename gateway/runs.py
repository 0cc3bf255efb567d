"""Runs and their artifact folders (docs/operations.md, "The state folder"): who ran what, in which workspace."""

from __future__ import annotations

import errno
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from sqlalchemy import ColumnElement, Connection, Engine, String, any_, bindparam, select, update
from sqlalchemy.dialects.postgresql import ARRAY

from gateway import db
from gateway.db.errors import storage_errors
from gateway.errors import InternalError, Reason
from gateway.logs import RATE_KEY

log = logging.getLogger("gateway.runs")


@dataclass(frozen=True, slots=True)
class RunRecord:
    run_id: str
    user: str
    workspace: str
    tool_name: str
    created_at: float
    status: str
    """A RunStatus, as stored (a record written by an older gateway keeps its own spelling)."""
    exit_code: int | None
    deadline: float | None = None
    """When no process of the run can be alive any more (sandbox watchdog); None for older records."""
    session_id: str | None = None
    """The gateway session running it (gateway/liveness.py); None for records older than migration 0006."""


class RunStatus(StrEnum):
    """What the `runs` table records of a run; a run that ended by itself, or that a sweep closed, has the
    same `status` in its TOOL_FINISHED."""

    RUNNING = "running"
    """Inserted before anything runs; every other status is how it ended."""
    OK = "ok"
    """The tool ran and reported success."""
    ERROR = "error"
    """The tool ran and reported failure (failing tests, a non-zero exit)."""
    # The sandbox stopped the run for a limit: the status is the reason the call was refused with.
    TIMEOUT = Reason.TIMEOUT
    OUTPUT_LIMIT = Reason.OUTPUT_LIMIT
    MEMORY_LIMIT = Reason.MEMORY_LIMIT
    FAILED = "failed"
    """The gateway failed during the run (its artifacts or events could not be written)."""
    FAILED_TO_START = "failed_to_start"
    """The sandbox could not start it: nothing ran (`sandbox_start_failed`)."""
    CANCELLED = "cancelled"
    """The client cancelled the call while it ran."""
    ABANDONED = "abandoned"
    """Nobody recorded its end: its gateway died, or could not write it (gateway/recovery.py)."""


STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO})
"""The errors of a disk that is full, over quota, read-only or failing (or a file over RLIMIT_FSIZE)."""


@contextmanager
def artifact_errors(run_id: str) -> Iterator[None]:
    """Turn a storage failure writing `run_id`'s artifacts (its folder, output, junit.xml, evidence.json)
    into -32603 `artifacts_unavailable`, with one ERROR line naming the cause
    (docs/operations.md, "A disk that fills during a run").

    Without it a disk filling during a run was answered `internal_error` with a traceback. Other
    OSErrors are not the disk's and stay unexpected."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in STORAGE_ERRNOS:
            raise
        cause = errno.errorcode.get(exc.errno or 0, "OSError")
        log.error(  # noqa: TRY400  (the cause is the whole story: no traceback)
            "run %s: its artifacts could not be written (artifacts_unavailable): %s %s",
            run_id,
            cause,
            exc.strerror,
            extra={RATE_KEY: ("artifacts", cause)},
        )
        raise InternalError(
            Reason.ARTIFACTS_UNAVAILABLE,
            f"the run's artifacts could not be written ({exc.strerror}): the gateway's disk is full or failing",
        ) from exc


class RunStore:
    def __init__(self, engine: Engine, artifacts_dir: Path) -> None:
        self._engine = engine
        self._read = db.single_reads(engine)
        self._list_all = select(db.runs).order_by(db.runs.c.created_at.desc()).limit(bindparam("limit"))
        self._list_visible = self._list_all.where(_in_workspaces(db.on_postgres(engine)))
        self.artifacts_dir = artifacts_dir
        self.owner: str | None = None
        """The serving gateway's session, recorded with each run it inserts (None outside `serve`)."""

    def folder(self, run_id: str) -> Path:
        return self.artifacts_dir / run_id

    def insert(self, record: RunRecord) -> None:
        with (
            storage_errors("the run could not be recorded", log=log, run_id=record.run_id),
            self._engine.begin() as connection,
        ):
            self.insert_on(connection, record)

    def insert_on(self, connection: Connection, record: RunRecord) -> None:
        """`insert` in the caller's open transaction (its TOOL_STARTED's: gateway/call_trail.py `CallTrail.log_with`)."""
        connection.execute(
            _INSERT,
            {
                "run_id": record.run_id,
                "user_name": record.user,
                "workspace": record.workspace,
                "tool_name": record.tool_name,
                "created_at": record.created_at,
                "status": record.status,
                "exit_code": record.exit_code,
                "deadline": record.deadline,
                "session_id": record.session_id or self.owner,
            },
        )

    def fetch_running(self) -> list[RunRecord]:
        """Runs still `running`: gateway/recovery.py closes those whose gateway is dead, or past their deadline."""
        query = select(db.runs).where(db.runs.c.status == RunStatus.RUNNING)
        with storage_errors("runs could not be read", log=None), self._read.connect() as connection:
            return [_record(row) for row in connection.execute(query)]

    def close(self, run_id: str) -> bool:
        """Mark a `running` record `abandoned`; False when someone else closed or finished it first.

        Conditional on the status, so of several gateways sweeping at once exactly one closes it
        and writes its terminal event.
        """
        with storage_errors("a run could not be closed", log=None), self._engine.begin() as connection:
            changed = connection.execute(
                update(db.runs)
                .where(db.runs.c.run_id == run_id, db.runs.c.status == RunStatus.RUNNING)
                .values(status=RunStatus.ABANDONED)
            ).rowcount
        return bool(changed)

    def reopen(self, run_id: str) -> None:
        """Undo `close` when its terminal event could not be written, so that a later sweep closes it again."""
        with storage_errors("a run could not be reopened", log=None), self._engine.begin() as connection:
            connection.execute(
                update(db.runs)
                .where(db.runs.c.run_id == run_id, db.runs.c.status == RunStatus.ABANDONED)
                .values(status=RunStatus.RUNNING)
            )

    def finish(self, run_id: str, status: str, exit_code: int | None) -> bool:
        """Record how the run ended (a RunStatus); False when it was closed as `abandoned` already (that record stays)."""
        with (
            storage_errors("the run's end could not be recorded", log=log, run_id=run_id),
            self._engine.begin() as connection,
        ):
            return finish_on(connection, run_id, status, exit_code)

    def fetch(self, run_id: str) -> RunRecord | None:
        with storage_errors("runs could not be read", log=log), self._read.connect() as connection:
            row = connection.execute(select(db.runs).where(db.runs.c.run_id == run_id)).one_or_none()
        return None if row is None else _record(row)

    def list(self, workspaces: tuple[str, ...] | None, limit: int) -> list[RunRecord]:
        """Newest first; `workspaces=None` means every workspace (ADMIN)."""
        query = self._list_all if workspaces is None else self._list_visible
        params = {"limit": limit, "workspaces": list(workspaces or ())}
        with storage_errors("runs could not be read", log=log), self._read.connect() as connection:
            return [_record(row) for row in connection.execute(query, params)]


_INSERT = db.runs.insert()
_FINISH = (
    update(db.runs)
    .where(db.runs.c.run_id == bindparam("id"), db.runs.c.status != RunStatus.ABANDONED)
    .values(status=bindparam("new_status"), exit_code=bindparam("new_exit_code"))
)


def finish_on(connection: Connection, run_id: str, status: str, exit_code: int | None) -> bool:
    """`RunStore.finish` in the caller's open transaction (with the run's execution event: gateway/pipeline.py)."""
    changed = connection.execute(_FINISH, {"id": run_id, "new_status": status, "new_exit_code": exit_code}).rowcount
    return bool(changed)


def _in_workspaces(postgres: bool) -> ColumnElement[bool]:
    """`workspace` among the `workspaces` parameter. On PostgreSQL one array parameter (`= ANY`): an
    expanding IN is rendered anew at every execution there, a visible cost of every `list_artifacts`."""
    if postgres:
        return db.runs.c.workspace == any_(bindparam("workspaces", type_=ARRAY(String)))
    return db.runs.c.workspace.in_(bindparam("workspaces", expanding=True))


def _record(row: object) -> RunRecord:
    r = row._mapping  # type: ignore[attr-defined]
    return RunRecord(
        r["run_id"],
        r["user_name"],
        r["workspace"],
        r["tool_name"],
        float(r["created_at"]),
        r["status"],
        r["exit_code"],
        None if r["deadline"] is None else float(r["deadline"]),
        r["session_id"],
    )
