"""Runs and their artifact folders (spec section 5): who ran what, in which workspace."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine, select, update

from gateway import db

ARTIFACT_FILES = ("stdout.txt", "stderr.txt", "junit.xml", "evidence.json")


@dataclass(frozen=True, slots=True)
class RunRecord:
    run_id: str
    user: str
    workspace: str
    tool_name: str
    created_at: float
    status: str
    exit_code: int | None
    deadline: float | None = None
    """When no process of the run can be alive any more (sandbox watchdog); None for older records."""


ABANDONED = "abandoned"
"""The status of a run whose gateway died before it could record the end (closed by the next one to start)."""


class RunStore:
    def __init__(self, engine: Engine, artifacts_dir: Path) -> None:
        self._engine = engine
        self._read = db.reader(engine)
        self.artifacts_dir = artifacts_dir

    def folder(self, run_id: str) -> Path:
        return self.artifacts_dir / run_id

    def insert(self, record: RunRecord) -> None:
        with self._engine.begin() as connection:
            connection.execute(
                db.runs.insert().values(
                    run_id=record.run_id,
                    user_name=record.user,
                    workspace=record.workspace,
                    tool_name=record.tool_name,
                    created_at=record.created_at,
                    status=record.status,
                    exit_code=record.exit_code,
                    deadline=record.deadline,
                )
            )

    def close_abandoned(self, now: float) -> list[RunRecord]:
        """Mark `abandoned` every run still `running` past its deadline; return those this call closed.

        Past the deadline the sandbox's watchdog has ended the run whatever happened to its
        gateway, so the record can only be stale. The update is conditional on the status, so two
        gateways starting at once close each record once.
        """
        closed = []
        with self._engine.begin() as connection:
            stale = connection.execute(
                select(db.runs).where(db.runs.c.status == "running", db.runs.c.deadline < now)
            ).all()
            for row in stale:
                changed = connection.execute(
                    update(db.runs)
                    .where(db.runs.c.run_id == row.run_id, db.runs.c.status == "running")
                    .values(status=ABANDONED)
                ).rowcount
                if changed:
                    closed.append(_record(row))
        return closed

    def finish(self, run_id: str, status: str, exit_code: int | None) -> None:
        with self._engine.begin() as connection:
            connection.execute(
                update(db.runs).where(db.runs.c.run_id == run_id).values(status=status, exit_code=exit_code)
            )

    def fetch(self, run_id: str) -> RunRecord | None:
        with self._read.connect() as connection:
            row = connection.execute(select(db.runs).where(db.runs.c.run_id == run_id)).one_or_none()
        return None if row is None else _record(row)

    def list(self, workspaces: tuple[str, ...] | None, limit: int) -> list[RunRecord]:
        """Newest first; `workspaces=None` means every workspace (ADMIN)."""
        query = select(db.runs).order_by(db.runs.c.created_at.desc()).limit(limit)
        if workspaces is not None:
            query = query.where(db.runs.c.workspace.in_(workspaces))
        with self._read.connect() as connection:
            return [_record(row) for row in connection.execute(query)]


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
    )
