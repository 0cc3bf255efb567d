"""Stage 6 of the pipeline (docs/architecture.md): a per-user budget over a sliding window.

A write call reserves, before it runs, one attempt and its worst case: its whole time
limit (so concurrent calls cannot both take the last attempt, nor together start more run
time than the window has). The reservation is one transaction that first locks the user's
row, then reads the window, decides with the pure `evaluate`, and inserts the charge at
the worst case. The window is read as its count and sum first (`has_room`): only when
they leave no room are its charges read one by one, for `evaluate`'s refusal and its
retry time, so a call's cost does not grow with the calls already in the window (decision 87). Every way out of the call then settles that row with a single UPDATE that
sets it to the time actually spent (`spent_ms`: the run's duration, the time until it was
stopped, 0 when nothing ran); an `input_required` round deletes it. A settlement the
database refuses leaves the worst case charged: over-charging is the safe side.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import ColumnElement, Connection, Engine, bindparam, delete, func, select, update

from gateway import db
from gateway.clock import Clock
from gateway.db.errors import storage_errors
from gateway.errors import BudgetExceededError, Reason
from gateway.policy import BudgetPolicy

log = logging.getLogger("gateway.budget")


@dataclass(frozen=True, slots=True)
class Charge:
    ts: float
    elapsed_ms: int


@dataclass(frozen=True, slots=True)
class Usage:
    attempts: int
    elapsed_ms: int


def reservation_ms(timeout_s: int) -> int:
    """The worst case a call reserves: its whole time limit (the run is killed there)."""
    return max(0, timeout_s) * 1000


def spent_ms(run_ms: int | None, started_at: float | None, now: float) -> int:
    """What a reservation settles at when the call ends.

    `run_ms`: the finished run's own duration; `started_at`: when a run that was stopped from
    outside (cancelled, the gateway failed) started; neither: nothing ran, nothing is spent.
    """
    if run_ms is not None:
        return max(0, run_ms)
    if started_at is not None:
        return max(0, int((now - started_at) * 1000))
    return 0


def has_room(usage: Usage, limits: BudgetPolicy) -> bool:
    """Whether one more attempt fits the window's `usage`: exactly when `evaluate` would not raise."""
    return usage.attempts < limits.attempts_total and usage.elapsed_ms < limits.elapsed_ms_total


def evaluate(charges: Sequence[Charge], limits: BudgetPolicy, now: float) -> None:
    """Raise BudgetExceededError if one more attempt would not fit. `charges` are in the window."""
    ordered = sorted(charges, key=lambda c: c.ts)
    if len(ordered) >= limits.attempts_total:
        # Room appears when enough of the oldest attempts leave the window; with a budget
        # of zero attempts it never does, and the answer is "not within this window".
        retry = (
            _retry_after(ordered[len(ordered) - limits.attempts_total].ts, limits, now)
            if limits.attempts_total
            else limits.window_s
        )
        raise BudgetExceededError(
            Reason.ATTEMPTS_EXHAUSTED, retry, f"attempts over the window's budget; retry after {retry} s"
        )
    total = sum(c.elapsed_ms for c in ordered)
    if total >= limits.elapsed_ms_total:
        remaining = total
        leaving_ts = ordered[-1].ts if ordered else now
        for charge in ordered:
            remaining -= charge.elapsed_ms
            if remaining < limits.elapsed_ms_total:
                leaving_ts = charge.ts
                break
        retry = _retry_after(leaving_ts, limits, now)
        raise BudgetExceededError(
            Reason.ELAPSED_EXHAUSTED,
            retry,
            f"run time over the window's budget; retry after {retry} s (sooner if a run in progress ends early: "
            "until it ends it holds its whole timeout_s), or ask for a shorter timeout_s",
        )


def _retry_after(leaving_ts: float, limits: BudgetPolicy, now: float) -> int:
    return max(1, math.ceil(leaving_ts + limits.window_s - now))


class BudgetLedger:
    def __init__(self, engine: Engine, clock: Clock) -> None:
        self._engine = engine
        self._read = db.reader(engine)
        self._clock = clock

    def reserve(self, user: str, run_id: str, limits: BudgetPolicy, worst_case_ms: int) -> int:
        """Take one attempt and `worst_case_ms` for `run_id`, or raise BudgetExceededError. Returns the charge's id.

        The caller must later `settle` (or `release`) the charge; until then it counts at the worst case.
        """
        with (
            storage_errors(
                "the budget could not be read (database_unavailable)",
                log=log,
                run_id=run_id,
                detail="the budget could not be read",
            ),
            self._engine.begin() as connection,
        ):
            # The row lock serialises reservations of one user across gateways (PostgreSQL);
            # SQLite's BEGIN IMMEDIATE already serialises every writer.
            connection.execute(select(db.users.c.id).where(db.users.c.name == user).with_for_update())
            # The clock is read once the lock is held, not before waiting for it: a reservation that
            # queued behind others is stamped after theirs, so no charge leaves the window before
            # those taken ahead of it, and retry_after_s is never past the window.
            now = self._clock.now()
            if not has_room(_usage_on(connection, user, limits, now), limits):
                evaluate(_charges_on(connection, user, limits, now), limits, now)  # raises, with its retry time
            return int(
                connection.execute(
                    db.budget_charges.insert()
                    .values(user_name=user, ts=now, elapsed_ms=max(0, worst_case_ms), run_id=run_id)
                    .returning(db.budget_charges.c.id)
                ).scalar_one()
            )

    def check(self, user: str, limits: BudgetPolicy) -> None:
        """The same decision as `reserve`, without taking anything (for `policy explain`)."""
        now = self._clock.now()
        with self._read.connect() as connection:
            if not has_room(_usage_on(connection, user, limits, now), limits):
                evaluate(_charges_on(connection, user, limits, now), limits, now)

    def release(self, charge_id: int) -> None:
        """Give back a reserved attempt that ran nothing and is to be retried (an `input_required` round)."""
        with (
            storage_errors("a budget reservation could not be released", log=log),
            self._engine.begin() as connection,
        ):
            connection.execute(delete(db.budget_charges).where(db.budget_charges.c.id == charge_id))

    def settle(self, charge_id: int, elapsed_ms: int) -> None:
        """Set a reservation to the time actually spent (a refund down from the worst case, or more if it ran over)."""
        with (
            storage_errors("a budget reservation could not be settled", log=log),
            self._engine.begin() as connection,
        ):
            settle_on(connection, charge_id, elapsed_ms)

    def settle_unrun(self, run_id: str) -> None:
        """A call that ran nothing and will never run (its gateway died while it waited for consent):
        its reservation, still at the worst case, settles at 0. Its attempt stays counted."""
        with (
            storage_errors("a budget reservation could not be settled", log=log, run_id=run_id),
            self._engine.begin() as connection,
        ):
            connection.execute(
                update(db.budget_charges).where(db.budget_charges.c.run_id == run_id).values(elapsed_ms=0)
            )

    def settle_lost(self, run_id: str, elapsed_ms: int) -> None:
        """A run whose gateway died while it ran (its processes died with it): its reservation, still at
        the worst case, settles at `elapsed_ms`, what ran until the death was seen; never raised."""
        c = db.budget_charges
        with (
            storage_errors("a budget reservation could not be settled", log=log, run_id=run_id),
            self._engine.begin() as connection,
        ):
            connection.execute(
                update(c).where(c.c.run_id == run_id, c.c.elapsed_ms > elapsed_ms).values(elapsed_ms=max(0, elapsed_ms))
            )

    def usage(self, user: str, limits: BudgetPolicy) -> Usage:
        now = self._clock.now()
        with storage_errors("the budget could not be read", log=log), self._read.connect() as connection:
            return _usage_on(connection, user, limits, now)

    def usage_on(self, connection: Connection, user: str, limits: BudgetPolicy) -> Usage:
        """`usage` in the caller's open transaction (after its `settle_on`: the usage that settlement left)."""
        return _usage_on(connection, user, limits, self._clock.now())


_SETTLE = (
    update(db.budget_charges).where(db.budget_charges.c.id == bindparam("charge")).values(elapsed_ms=bindparam("ms"))
)


def settle_on(connection: Connection, charge_id: int, elapsed_ms: int) -> None:
    """`BudgetLedger.settle` in the caller's open transaction (with the run's execution event: gateway/pipeline.py)."""
    connection.execute(_SETTLE, {"charge": charge_id, "ms": max(0, elapsed_ms)})


def _in_window(user: str, limits: BudgetPolicy, now: float) -> tuple[ColumnElement[bool], ...]:
    return db.budget_charges.c.user_name == user, db.budget_charges.c.ts > now - limits.window_s


def _usage_on(connection: Connection, user: str, limits: BudgetPolicy, now: float) -> Usage:
    charges = db.budget_charges.c
    row = connection.execute(
        select(func.count(), func.coalesce(func.sum(charges.elapsed_ms), 0)).where(*_in_window(user, limits, now))
    ).one()
    return Usage(int(row[0]), int(row[1]))


def _charges_on(connection: Connection, user: str, limits: BudgetPolicy, now: float) -> list[Charge]:
    charges = db.budget_charges.c
    rows = connection.execute(select(charges.ts, charges.elapsed_ms).where(*_in_window(user, limits, now))).all()
    return [Charge(float(r.ts), int(r.elapsed_ms)) for r in rows]
