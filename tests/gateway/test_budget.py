"""gateway/budget.py: the pure `evaluate` at every boundary, and the ledger on a real SQLite file."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import Engine

from gateway.budget import BudgetLedger, Charge, Usage, evaluate, usage_of
from gateway.errors import BudgetExceededError
from gateway.policy import BudgetPolicy
from tests.fakes import T0, FakeClock

LIMITS = BudgetPolicy(window_s=100, attempts_total=3, elapsed_ms_total=1000)
ROOMY = BudgetPolicy(window_s=100, attempts_total=10, elapsed_ms_total=1000)
"""LIMITS with attempts to spare, so that only elapsed time can run out."""


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


def test_usage_of_counts_and_sums() -> None:
    assert usage_of([]) == Usage(0, 0)
    assert usage_of(charges((1, 5), (2, 7))) == Usage(2, 12)


# --- BudgetLedger --------------------------------------------------------------------------


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def ledger(engine: Engine, clock: FakeClock) -> BudgetLedger:
    return BudgetLedger(engine, clock)


def test_ledger_reserves_until_exhausted_then_the_window_slides(ledger: BudgetLedger, clock: FakeClock) -> None:
    for second in (0, 10, 20):
        clock.set(T0 + second)
        ledger.reserve("alice", f"run{second}", LIMITS)
    clock.set(T0 + 30)

    with pytest.raises(BudgetExceededError) as caught:
        ledger.reserve("alice", "run30", LIMITS)
    assert (caught.value.reason, caught.value.retry_after_s) == ("attempts_exhausted", 70)

    clock.set(T0 + 99.999)  # the first attempt is still inside the window
    with pytest.raises(BudgetExceededError):
        ledger.reserve("alice", "run99", LIMITS)

    clock.set(T0 + 100)  # exactly window_s later, the first attempt has left
    ledger.reserve("alice", "run100", LIMITS)
    assert ledger.usage("alice", LIMITS) == Usage(3, 0)
    with pytest.raises(BudgetExceededError):
        ledger.reserve("alice", "run100b", LIMITS)


def test_ledger_refusal_takes_nothing(ledger: BudgetLedger) -> None:
    limits = BudgetPolicy(window_s=100, attempts_total=1, elapsed_ms_total=1000)
    ledger.reserve("alice", "r1", limits)

    for _ in range(3):
        with pytest.raises(BudgetExceededError):
            ledger.reserve("alice", "again", limits)

    assert ledger.usage("alice", limits) == Usage(1, 0)


def test_ledger_budgets_are_per_user(ledger: BudgetLedger) -> None:
    limits = BudgetPolicy(window_s=100, attempts_total=1, elapsed_ms_total=1000)
    ledger.reserve("alice", "r1", limits)

    ledger.reserve("bob", "r2", limits)

    assert ledger.usage("alice", limits) == Usage(1, 0)
    assert ledger.usage("bob", limits) == Usage(1, 0)
    assert ledger.usage("carol", limits) == Usage(0, 0)


def test_charge_adds_elapsed_time(ledger: BudgetLedger, clock: FakeClock) -> None:
    first = ledger.reserve("alice", "r1", LIMITS)
    second = ledger.reserve("alice", "r2", LIMITS)
    assert first != second

    ledger.charge(first, 250)
    ledger.charge(first, 100)
    ledger.charge(second, 400)
    ledger.charge(second, -50)  # a clock step backwards never refunds

    assert ledger.usage("alice", LIMITS) == Usage(2, 750)


def test_charged_elapsed_time_exhausts_the_budget(ledger: BudgetLedger, clock: FakeClock) -> None:
    ledger.charge(ledger.reserve("alice", "r1", LIMITS), 1000)
    clock.advance(40)

    with pytest.raises(BudgetExceededError) as caught:
        ledger.reserve("alice", "r2", LIMITS)
    assert (caught.value.reason, caught.value.retry_after_s) == ("elapsed_exhausted", 60)

    clock.advance(60)
    ledger.reserve("alice", "r3", LIMITS)
    assert ledger.usage("alice", LIMITS) == Usage(1, 0)


def test_check_decides_like_reserve_without_taking(ledger: BudgetLedger) -> None:
    limits = BudgetPolicy(window_s=100, attempts_total=1, elapsed_ms_total=1000)
    ledger.check("alice", limits)
    ledger.check("alice", limits)
    assert ledger.usage("alice", limits) == Usage(0, 0)

    ledger.reserve("alice", "r1", limits)

    with pytest.raises(BudgetExceededError, match="attempts_exhausted"):
        ledger.check("alice", limits)


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
            ledger.reserve("alice", f"run{i}", limits)
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
