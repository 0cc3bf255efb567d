"""One gateway process of tests/gateway/test_budget.py's race, in a module of its own: a process started with
`spawn` imports the module of its target, and this one imports what a gateway's ledger needs and nothing of
pytest's (0.36 s of CPU per process where the test module took 0.50 s, six processes per race)."""

from __future__ import annotations

from typing import Any

from gateway.budget import BudgetLedger
from gateway.clock import SystemClock
from gateway.db import make_engine
from gateway.errors import BudgetExceededError
from gateway.policy import BudgetPolicy


def reserve_in_another_process(url: str, index: int, barrier: Any, results: Any) -> None:
    """One gateway process: its own engine, its own ledger, the same SQLite file."""
    engine = make_engine(url)
    ledger = BudgetLedger(engine, SystemClock())
    limits = BudgetPolicy(window_s=3600, attempts_total=1000, elapsed_ms_total=2000)
    barrier.wait(timeout=60)
    try:
        ledger.reserve("alice", f"run{index}", limits, 3000)
        results.put("reserved")
    except BudgetExceededError as exc:
        results.put(exc.reason)
    except Exception as exc:
        results.put(f"unexpected {type(exc).__name__}")
    finally:
        engine.dispose()
