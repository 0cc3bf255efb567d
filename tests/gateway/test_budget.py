"""gateway/budget.py: the pure `evaluate` at every boundary, and the ledger on real SQLite and PostgreSQL."""

from __future__ import annotations

import multiprocessing
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, select

from gateway import db
from gateway.budget import BudgetLedger, Charge, Usage, evaluate, has_room, reservation_ms, spent_ms
from gateway.clock import SystemClock
from gateway.db import make_engine, migrate
from gateway.errors import BudgetExceededError
from gateway.policy import BudgetPolicy
from gateway.users import UserStore
from tests.budget_racer import race
from tests.fakes import T0, FakeClock

LIMITS = BudgetPolicy(window_s=100, attempts_total=3, elapsed_ms_total=1000)
ROOMY = BudgetPolicy(window_s=100, attempts_total=10, elapsed_ms_total=1000)
"""LIMITS with attempts to spare, so that only elapsed time can run out."""
PLENTY = BudgetPolicy(window_s=100, attempts_total=10, elapsed_ms_total=10**9)


def charges(*ages_and_elapsed: tuple[float, int]) -> list[Charge]:
    """Charges given as (seconds before T0, elapsed_ms)."""
    return [Charge(T0 - age, elapsed) for age, elapsed in ages_and_elapsed]


# --- evaluate ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("window", "limits"),
    [
        pytest.param([], LIMITS, id="nothing-yet"),
        pytest.param(charges((90, 0), (10, 0)), LIMITS, id="one-attempt-left"),
        pytest.param(charges((90, 500), (10, 499)), LIMITS, id="one-ms-left"),
        pytest.param(charges((1, 10**6)), BudgetPolicy(100, 3, 10**6 + 1), id="big-elapsed-under-limit"),
    ],
)
def test_evaluate_allows_under_the_limits(window: list[Charge], limits: BudgetPolicy) -> None:
    evaluate(window, limits, T0)  # no exception: one more attempt fits


@pytest.mark.parametrize(
    ("window", "limits", "reason", "retry_after_s"),
    [
        pytest.param(charges((90, 0), (50, 0), (10, 0)), LIMITS, "attempts_exhausted", 10, id="attempts-at-limit"),
        pytest.param(
            charges((10, 0), (90, 0), (50, 0)), LIMITS, "attempts_exhausted", 10, id="attempts-unordered-input"
        ),
        pytest.param(
            charges((95, 0), (90, 0), (50, 0), (20, 0), (10, 0)),
            LIMITS,
            "attempts_exhausted",
            50,
            id="attempts-over-limit-waits-for-enough-to-leave",
        ),
        pytest.param(charges((89.5, 0), (50, 0), (10, 0)), LIMITS, "attempts_exhausted", 11, id="retry-rounds-up"),
        pytest.param(charges((99.99, 0), (50, 0), (10, 0)), LIMITS, "attempts_exhausted", 1, id="retry-is-at-least-1"),
        pytest.param(charges((100, 0), (50, 0), (10, 0)), LIMITS, "attempts_exhausted", 1, id="retry-never-0"),
        pytest.param([], BudgetPolicy(100, 0, 1000), "attempts_exhausted", 100, id="zero-attempts"),
        pytest.param(
            charges((50, 0)), BudgetPolicy(100, 0, 1000), "attempts_exhausted", 100, id="zero-attempts-with-history"
        ),
        pytest.param(charges((80, 600), (30, 400)), LIMITS, "elapsed_exhausted", 20, id="elapsed-exactly-at-limit"),
        pytest.param(
            charges((80, 300), (60, 500), (30, 900)),
            ROOMY,
            "elapsed_exhausted",
            40,
            id="elapsed-over-limit-waits-for-enough-to-leave",
        ),
        pytest.param(charges((30, 5000)), LIMITS, "elapsed_exhausted", 70, id="one-long-run"),
        pytest.param([], BudgetPolicy(100, 3, 0), "elapsed_exhausted", 100, id="zero-elapsed"),
        pytest.param(
            charges((90, 2000), (50, 0), (10, 0)),
            LIMITS,
            "attempts_exhausted",
            10,
            id="attempts-checked-before-elapsed",
        ),
    ],
)
def test_evaluate_refuses_at_the_limits(
    window: list[Charge], limits: BudgetPolicy, reason: str, retry_after_s: int
) -> None:
    with pytest.raises(BudgetExceededError) as caught:
        evaluate(window, limits, T0)

    assert caught.value.code == -32005
    assert caught.value.reason == reason
    assert caught.value.retry_after_s == retry_after_s
    assert caught.value.data == {"retry_after_s": retry_after_s}


def test_evaluate_retry_after_is_when_room_appears() -> None:
    window = charges((80, 300), (60, 500), (30, 900))
    with pytest.raises(BudgetExceededError) as caught:
        evaluate(window, ROOMY, T0)
    later = T0 + caught.value.retry_after_s

    def inside(now: float) -> list[Charge]:
        """What the ledger passes at `now`: the charges still in the window."""
        return [c for c in window if c.ts > now - ROOMY.window_s]

    evaluate(inside(later), ROOMY, later)
    with pytest.raises(BudgetExceededError):
        evaluate(inside(later - 1), ROOMY, later - 1)


def test_an_elapsed_refusal_says_what_to_do() -> None:
    with pytest.raises(BudgetExceededError) as caught:
        evaluate(charges((30, 5000)), LIMITS, T0)

    message = caught.value.public_message()
    assert "retry after 70 s" in message and "shorter timeout_s" in message


@pytest.mark.parametrize("limits", [LIMITS, ROOMY, BudgetPolicy(100, 0, 1000), BudgetPolicy(100, 3, 0)])
@pytest.mark.parametrize("attempts", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("last_ms", [0, 998, 999, 1000, 1001])
def test_has_room_is_exactly_when_evaluate_admits(limits: BudgetPolicy, attempts: int, last_ms: int) -> None:
    """The ledger reads a window's charges one by one only when its count and sum leave no room (decision 87):
    the two must never disagree, at every boundary of both limits."""
    window = charges(*[(10.0 + age, 0) for age in range(attempts - 1)], *([(5.0, last_ms)] if attempts else []))
    usage = Usage(len(window), sum(c.elapsed_ms for c in window))
    try:
        evaluate(window, limits, T0)
    except BudgetExceededError:
        admitted = False
    else:
        admitted = True
    assert has_room(usage, limits) is admitted


# --- reservations: the worst case first, the time spent after ---------------------------------


@pytest.mark.parametrize(("timeout_s", "reserved"), [(1, 1000), (3, 3000), (300, 300_000), (0, 0), (-5, 0)])
def test_a_call_reserves_its_whole_time_limit(timeout_s: int, reserved: int) -> None:
    assert reservation_ms(timeout_s) == reserved


@pytest.mark.parametrize(
    ("run_ms", "started_at", "now", "spent"),
    [
        pytest.param(1234, T0, T0 + 50, 1234, id="finished-run-its-own-duration"),
        pytest.param(0, None, T0, 0, id="sandbox-failed-to-start"),
        pytest.param(None, T0, T0 + 2.5, 2500, id="stopped-from-outside-time-so-far"),
        pytest.param(None, T0, T0 - 1, 0, id="clock-stepped-back"),
        pytest.param(None, None, T0 + 99, 0, id="nothing-ran"),
        pytest.param(-7, None, T0, 0, id="negative-duration"),
    ],
)
def test_what_a_reservation_settles_at(run_ms: int | None, started_at: float | None, now: float, spent: int) -> None:
    assert spent_ms(run_ms, started_at, now) == spent


def admitted_together(calls: int, timeout_s: int, limits: BudgetPolicy) -> list[int]:
    """Reservations of `calls` concurrent calls, decided one after the other as the ledger's lock orders them."""
    window: list[Charge] = []
    for _ in range(calls):
        try:
            evaluate(window, limits, T0)
        except BudgetExceededError:
            continue
        window.append(Charge(T0, reservation_ms(timeout_s)))
    return [c.elapsed_ms for c in window]


@pytest.mark.parametrize(
    ("elapsed_ms_total", "timeout_s", "calls", "admitted"),
    [
        pytest.param(2000, 3, 4, 1, id="issue-four-3s-runs-budget-2s"),
        pytest.param(2000, 4, 16, 1, id="sixteen-4s-runs"),
        pytest.param(2000, 1, 10, 2, id="1s-runs-fill-then-stop"),
        pytest.param(2001, 1, 10, 3, id="one-ms-left-admits-one-more"),
        pytest.param(10_000, 3, 50, 4, id="bigger-budget"),
        pytest.param(0, 1, 5, 0, id="zero-budget"),
        pytest.param(10**9, 1, 20, 20, id="roomy"),
    ],
)
def test_concurrent_calls_cannot_start_more_than_the_budget_plus_one_run(
    elapsed_ms_total: int, timeout_s: int, calls: int, admitted: int
) -> None:
    limits = BudgetPolicy(window_s=3600, attempts_total=1000, elapsed_ms_total=elapsed_ms_total)

    reserved = admitted_together(calls, timeout_s, limits)

    assert len(reserved) == admitted
    assert sum(reserved) <= elapsed_ms_total + timeout_s * 1000


def test_a_run_in_progress_counts_at_its_worst_case() -> None:
    """The window as `reserve` sees it while one 3 s run is under way with a 2 s budget."""
    limits = BudgetPolicy(window_s=3600, attempts_total=1000, elapsed_ms_total=2000)
    with pytest.raises(BudgetExceededError) as caught:
        evaluate([Charge(T0 - 1, reservation_ms(3))], limits, T0)
    assert caught.value.reason == "elapsed_exhausted"
    evaluate([Charge(T0 - 1, 1999)], limits, T0)  # once settled below the budget, there is room again


# --- BudgetLedger --------------------------------------------------------------------------


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def alice(engine: Engine, clock: FakeClock) -> str:
    """The caller's row: `reserve` locks it (PostgreSQL), and the gateway reserves only for a user it has read."""
    UserStore(engine, clock).add("alice", "USER", ("default",))
    return "alice"


@pytest.fixture
def ledger(engine: Engine, clock: FakeClock, alice: str) -> BudgetLedger:
    return BudgetLedger(engine, clock)


def test_ledger_reserves_until_exhausted_then_the_window_slides(ledger: BudgetLedger, clock: FakeClock) -> None:
    for second in (0, 10, 20):
        clock.set(T0 + second)
        ledger.reserve("alice", f"run{second}", LIMITS, 0)
    clock.set(T0 + 30)

    with pytest.raises(BudgetExceededError) as caught:
        ledger.reserve("alice", "run30", LIMITS, 0)
    assert (caught.value.reason, caught.value.retry_after_s) == ("attempts_exhausted", 70)

    clock.set(T0 + 99.999)  # the first attempt is still inside the window
    with pytest.raises(BudgetExceededError):
        ledger.reserve("alice", "run99", LIMITS, 0)

    clock.set(T0 + 100)  # exactly window_s later, the first attempt has left
    ledger.reserve("alice", "run100", LIMITS, 0)
    assert ledger.usage("alice", LIMITS) == Usage(3, 0)
    with pytest.raises(BudgetExceededError):
        ledger.reserve("alice", "run100b", LIMITS, 0)


def test_ledger_refusal_takes_nothing(ledger: BudgetLedger) -> None:
    limits = BudgetPolicy(window_s=100, attempts_total=1, elapsed_ms_total=1000)
    ledger.reserve("alice", "r1", limits, 0)

    for _ in range(3):
        with pytest.raises(BudgetExceededError):
            ledger.reserve("alice", "again", limits, 0)

    assert ledger.usage("alice", limits) == Usage(1, 0)


def test_ledger_budgets_are_per_user(ledger: BudgetLedger) -> None:
    limits = BudgetPolicy(window_s=100, attempts_total=1, elapsed_ms_total=1000)
    ledger.reserve("alice", "r1", limits, 0)

    ledger.reserve("bob", "r2", limits, 0)

    assert ledger.usage("alice", limits) == Usage(1, 0)
    assert ledger.usage("bob", limits) == Usage(1, 0)
    assert ledger.usage("carol", limits) == Usage(0, 0)


def test_settle_sets_the_reservation_to_the_time_spent(ledger: BudgetLedger) -> None:
    first = ledger.reserve("alice", "r1", PLENTY, 3000)
    second = ledger.reserve("alice", "r2", PLENTY, 3000)
    assert first != second
    assert ledger.usage("alice", PLENTY) == Usage(2, 6000), "a reservation counts at its worst case"

    ledger.settle(first, 250)
    assert ledger.usage("alice", PLENTY) == Usage(2, 3250)
    ledger.settle(first, 100)  # set, not added: settling twice leaves the last value
    ledger.settle(second, 3100)  # a run that went over its limit (the kill's grace) is charged what it took
    assert ledger.usage("alice", PLENTY) == Usage(2, 3200)
    ledger.settle(second, -50)  # a clock step backwards never goes below nothing
    assert ledger.usage("alice", PLENTY) == Usage(2, 100)


def test_release_gives_the_attempt_and_its_reservation_back(ledger: BudgetLedger) -> None:
    charge = ledger.reserve("alice", "r1", PLENTY, 5000)

    ledger.release(charge)

    assert ledger.usage("alice", PLENTY) == Usage(0, 0)


def test_settled_elapsed_time_exhausts_the_budget(ledger: BudgetLedger, clock: FakeClock) -> None:
    ledger.settle(ledger.reserve("alice", "r1", LIMITS, 300_000), 1000)
    clock.advance(40)

    with pytest.raises(BudgetExceededError) as caught:
        ledger.reserve("alice", "r2", LIMITS, 0)
    assert (caught.value.reason, caught.value.retry_after_s) == ("elapsed_exhausted", 60)

    clock.advance(60)
    ledger.reserve("alice", "r3", LIMITS, 0)
    assert ledger.usage("alice", LIMITS) == Usage(1, 0)


def test_check_decides_like_reserve_without_taking(ledger: BudgetLedger) -> None:
    limits = BudgetPolicy(window_s=100, attempts_total=1, elapsed_ms_total=1000)
    ledger.check("alice", limits)
    ledger.check("alice", limits)
    assert ledger.usage("alice", limits) == Usage(0, 0)

    ledger.reserve("alice", "r1", limits, 0)

    with pytest.raises(BudgetExceededError, match="attempts_exhausted"):
        ledger.check("alice", limits)


@pytest.mark.usefixtures("alice")
def test_concurrent_reservations_never_overspend(engine: Engine, clock: FakeClock) -> None:
    limits = BudgetPolicy(window_s=3600, attempts_total=5, elapsed_ms_total=10**9)
    threads_n = 8
    start = threading.Barrier(threads_n)
    outcomes: list[str] = []
    lock = threading.Lock()

    def attempt(i: int) -> None:
        ledger = BudgetLedger(engine, clock)
        start.wait(timeout=10)
        try:
            ledger.reserve("alice", f"run{i}", limits, 0)
            outcome = "reserved"
        except BudgetExceededError as exc:
            outcome = exc.reason
        except Exception as exc:  # any other failure shows in the assertion below
            outcome = f"unexpected {type(exc).__name__}: {exc}"
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert sorted(outcomes) == ["attempts_exhausted"] * 3 + ["reserved"] * 5
    assert BudgetLedger(engine, clock).usage("alice", limits) == Usage(5, 0)


@pytest.mark.usefixtures("alice")
def test_concurrent_reservations_never_take_more_time_than_the_budget(engine: Engine, clock: FakeClock) -> None:
    limits = BudgetPolicy(window_s=3600, attempts_total=1000, elapsed_ms_total=2000)
    threads_n = 8
    start = threading.Barrier(threads_n)
    outcomes: list[str] = []
    lock = threading.Lock()

    def attempt(i: int) -> None:
        ledger = BudgetLedger(engine, clock)
        start.wait(timeout=10)
        try:
            ledger.reserve("alice", f"run{i}", limits, 3000)
            outcome = "reserved"
        except BudgetExceededError as exc:
            outcome = exc.reason
        except Exception as exc:
            outcome = f"unexpected {type(exc).__name__}: {exc}"
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert sorted(outcomes) == ["elapsed_exhausted"] * 7 + ["reserved"]
    assert BudgetLedger(engine, clock).usage("alice", limits) == Usage(1, 3000)


@pytest.mark.usefixtures("alice")
def test_a_reservation_that_waited_for_the_lock_is_stamped_after_the_wait(engine: Engine, clock: FakeClock) -> None:
    """A reservation queued behind another gateway's is stamped when it gets the lock, not when
    it started waiting. Stamped before, its charge would leave the window before those taken ahead
    of it, and the refusal's retry_after_s could be past the window (16 gateways on SQLite: 3601 s
    of a 3600 s window)."""
    waited = BudgetPolicy(window_s=60, attempts_total=1, elapsed_ms_total=10**9)
    ledger = BudgetLedger(engine, clock)
    charged: list[int] = []
    with engine.begin() as holder:  # another gateway's reservation, holding the user's lock (SQLite: the write lock)
        holder.execute(select(db.users.c.id).where(db.users.c.name == "alice").with_for_update())
        waiting = threading.Thread(target=lambda: charged.append(ledger.reserve("alice", "late", waited, 0)))
        waiting.start()
        time.sleep(0.5)  # time to reach the lock: if it has not, it is stamped after the wait anyway
        clock.advance(30)
    waiting.join(timeout=30)
    assert len(charged) == 1
    with engine.connect() as connection:
        stamped = connection.execute(select(db.budget_charges.c.ts).where(db.budget_charges.c.id == charged[0]))
        assert stamped.scalar_one() == T0 + 30
    clock.advance(59)
    with pytest.raises(BudgetExceededError) as refused:
        ledger.reserve("alice", "next", waited, 0)
    assert refused.value.retry_after_s == 1, "room appears when the charge leaves the window, never later"


def test_reservations_from_racing_processes_admit_one_3s_run_into_a_2s_budget(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/race.db"
    engine = make_engine(url)
    migrate(engine)
    UserStore(engine, SystemClock()).add("alice", "USER", ("default",))
    context = multiprocessing.get_context("spawn")  # never a fork of pytest's process: its threads and connections
    processes_n = 6
    results = context.Queue()
    racers = context.Process(target=race, args=(url, processes_n, results))  # forks the six (tests/budget_racer.py)
    racers.start()
    outcomes = sorted(results.get(timeout=120) for _ in range(processes_n))
    racers.join(timeout=30)

    assert outcomes == ["elapsed_exhausted"] * (processes_n - 1) + ["reserved"]
    assert BudgetLedger(engine, SystemClock()).usage("alice", BudgetPolicy()) == Usage(1, 3000)
    engine.dispose()


def test_a_refund_makes_room_for_the_next_call(ledger: BudgetLedger) -> None:
    limits = BudgetPolicy(window_s=3600, attempts_total=1000, elapsed_ms_total=2000)
    running = ledger.reserve("alice", "r1", limits, 3000)
    with pytest.raises(BudgetExceededError):
        ledger.reserve("alice", "r2", limits, 3000)
    with pytest.raises(BudgetExceededError):
        ledger.check("alice", limits)  # `policy explain` answers as `reserve` does, in-flight runs included

    ledger.settle(running, 400)  # the run ended after 0.4 s

    ledger.check("alice", limits)
    ledger.reserve("alice", "r3", limits, 3000)
