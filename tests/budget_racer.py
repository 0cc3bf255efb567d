"""The gateway processes of tests/gateway/test_budget.py's race, in a module of its own: the test spawns one process
that imports this module (what a gateway's ledger needs and nothing of pytest's) and forks the racers from it.
Each racer is a process of its own with its own engine, as a gateway is, started by a fork of an interpreter
with no thread and no connection: a spawned racer imported it all again, 0.36 s of CPU each, six per race."""

from __future__ import annotations

import multiprocessing
from typing import Any

from gateway.budget import BudgetLedger
from gateway.clock import SystemClock
from gateway.db import make_engine
from gateway.errors import BudgetExceededError
from gateway.policy import BudgetPolicy


def race(url: str, processes_n: int, results: Any) -> None:
    """`processes_n` gateway processes forked from this one, released at once, each putting its outcome in `results`."""
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(processes_n)
    processes = [
        context.Process(target=reserve_in_another_process, args=(url, i, barrier, results)) for i in range(processes_n)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=90)


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
